"""``python -m privopt`` (and ``torchrun ... -m privopt train``): the command line."""

import sys

from privopt.cli import main

if __name__ == "__main__":
    sys.exit(main())
