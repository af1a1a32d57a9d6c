"""Run as Python starts in a program launched by `sweep exec` (this folder first on its
PYTHONPATH): SWEEP_AUTOTUNE_USE=RUN_DIR loads that run's tuned configs before the
program's first line. Nothing is imported unless the variable is set.

(The `use` branch only; the capture's branch and the chaining to another sitecustomize
on the path are the capture's.)
"""

import os

if os.environ.get("SWEEP_AUTOTUNE_USE"):
    from sweep.autotune.use import use_from_environment

    use_from_environment()
