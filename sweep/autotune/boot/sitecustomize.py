"""Python imports this at start-up in a program run by `sweep capture` or `sweep exec` (this
folder first on its PYTHONPATH): it runs the next sitecustomize on the path (the one the
environment had), then, under SWEEP_AUTOTUNE_CAPTURE, starts the capture, and under
SWEEP_AUTOTUNE_USE loads the run's answers. With neither set it imports nothing more: a
program that inherits the path from such a child starts as fast as without it.
"""

from __future__ import annotations

import importlib
import os
import sys


def _chain() -> None:
    """Import the sitecustomize this one stands in front of, as Python would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = list(sys.path)
    own = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in path if os.path.abspath(p or os.curdir) != here]
    try:
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as e:
        if e.name != "sitecustomize":
            raise
        if own is not None:
            sys.modules["sitecustomize"] = own
    except Exception as e:  # as Python says it of a sitecustomize that fails, and goes on
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                         f"{type(e).__name__}: {e}\n")
    finally:
        sys.path[:] = path


def _start(variable: str, module: str, function: str, what: str) -> None:
    if not os.environ.get(variable):
        return
    try:
        start = getattr(importlib.import_module(module), function)
    except ImportError as e:
        sys.stderr.write(f"{what}: cannot import {module} in {sys.executable} ({e}); the "
                         "program runs without it\n")
        return
    start()


_chain()
_start("SWEEP_AUTOTUNE_CAPTURE", "sweep.autotune.capture", "start_from_environment",
       "sweep capture")
_start("SWEEP_AUTOTUNE_USE", "sweep.autotune.use", "use_from_environment", "sweep exec")
