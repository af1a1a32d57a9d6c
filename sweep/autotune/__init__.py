"""The kernels a program already has: capture its `@triton.autotune` calls (capture.py),
tune them in one sweep (a capture is a spec), and load the answers back into the unchanged
program (use.py).

    import sweep.autotune
    sweep.autotune.use("runs/my-program")   # before the program's first kernel call
"""

from __future__ import annotations
