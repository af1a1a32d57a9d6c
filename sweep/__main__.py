"""`python -m sweep`: the same command as `sweep`."""

import sys

from sweep.cli import main

sys.exit(main())
