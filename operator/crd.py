"""`python -m kubeinfer.operator.crd [--check]`: writes crds/ from the spec models (the work is
:mod:`kubeinfer.operator.install.crd`; the command keeps its name, which every generated CRD's header quotes)."""

import sys

from kubeinfer.operator.install.crd import main

if __name__ == "__main__":
    sys.exit(main())
