"""The kernels a program already has: capture its `@triton.autotune` calls (capture.py),
tune them in one sweep (a capture is a spec), and load the answers back into the unchanged
program (use.py).

    import sweep.autotune
    with sweep.autotune.capture("captures/my-program"):   # or: sweep capture --out DIR -- ...
        run_my_program()
    sweep.autotune.use("runs/my-program")   # before the program's first kernel call

Importing this package imports neither torch nor Triton: each function does, when called.
"""

from __future__ import annotations

import os
import sys
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweep.autotune.use import Loaded, use

__all__ = ["Loaded", "capture", "use"]


def capture(out_dir: str | os.PathLike[str], *, no_tune: bool = False,
            save_floats: bool = False, max_bytes: int | None = None,
            force: bool = False) -> AbstractContextManager[Any]:
    """Record each call into an autotuned kernel made inside the `with` block whose (kernel,
    key) is new, into out_dir: capture.json (+ blobs/) and spec.yaml, for `sweep run
    out_dir/spec.yaml`. no_tune: a new key runs its first config, no benchmarking (implied
    under TRITON_INTERPRET=1). save_floats: floating-point tensors saved whole too (integer
    and boolean ones always are), up to max_bytes over the capture. An earlier capture in
    out_dir is refused unless force."""
    from storage.capture import DEFAULT_MAX_BYTES
    from sweep.autotune.capture import capture as open_capture

    return open_capture(out_dir, no_tune=no_tune, save_floats=save_floats,
                        max_bytes=DEFAULT_MAX_BYTES if max_bytes is None else max_bytes,
                        force=force)


def __getattr__(name: str) -> Any:
    if name in ("use", "Loaded"):
        # Not `from sweep.autotune import use`: that asks this package for `use` first.
        import sweep.autotune.use  # noqa: F401

        return getattr(sys.modules["sweep.autotune.use"], name)
    raise AttributeError(f"module 'sweep.autotune' has no attribute {name!r}")
