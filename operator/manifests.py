"""`kubeinfer manifests` / `python -m kubeinfer.operator.manifests [--write]`: the install as plain YAML (the work
is :mod:`kubeinfer.operator.install.manifests`; the command keeps its name, which deploy/kubeinfer.yaml quotes)."""

from kubeinfer.operator.install.manifests import main

if __name__ == "__main__":
    main()
