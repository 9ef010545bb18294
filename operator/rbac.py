"""`python -m kubeinfer.operator.rbac`: prints the operator's ClusterRole. `RULES`, which the chart renders,
are defined in :mod:`kubeinfer.operator.install.rbac`."""

from kubeinfer.operator.install.rbac import RULES, main

__all__ = ["RULES", "main"]

if __name__ == "__main__":
    main()
