"""`python -m sweep`: the same command as `sweep`."""

import sys

from sweep.command import main

sys.exit(main())
