"""`python -m kubeinfer.operator.chart [--check]`: writes the generated parts of charts/kubeinfer (the work is
:mod:`kubeinfer.operator.install.chart`; the command keeps its name, which the generated files' headers quote)."""

import sys

from kubeinfer.operator.install.chart import main

if __name__ == "__main__":
    sys.exit(main())
