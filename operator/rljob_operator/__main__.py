"""`python -m rljob_operator [flags]` runs the operator; `python -m rljob_operator render FILE` prints the
children an RLJob file renders to (process/main.py)."""

import sys

from rljob_operator.process.main import main

if __name__ == "__main__":
    sys.exit(main())
