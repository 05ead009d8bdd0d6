"""`python -m reinforge.cli ...`: the `reinforge` command."""

import sys

from reinforge.cli import main

if __name__ == "__main__":
    sys.exit(main())
