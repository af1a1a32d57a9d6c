"""The kernels a program already has: capture its `@triton.autotune` calls (capture.py),
tune them in one sweep (a capture is a spec), and load the answers back into the unchanged
program (use.py).

    import sweep.autotune
    sweep.autotune.use("runs/my-program")   # before the program's first kernel call

Importing this package imports nothing else: each name is imported where it is first used.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweep.autotune.use import Loaded, use

__all__ = ["Loaded", "use"]


def __getattr__(name: str) -> Any:
    if name in ("use", "Loaded"):
        # Not `from sweep.autotune import use`: that asks this package for `use` first.
        import sweep.autotune.use  # noqa: F401

        return getattr(sys.modules["sweep.autotune.use"], name)
    raise AttributeError(f"module 'sweep.autotune' has no attribute {name!r}")
