"""The boot folder `sweep capture` and `sweep exec` put first on a child program's
PYTHONPATH: its sitecustomize.py starts the capture or loads a run's answers (a package
only so that an install ships it)."""

from __future__ import annotations

import os
from pathlib import Path

FOLDER = Path(__file__).resolve().parent


def python_path(existing: str) -> str:
    """A child program's PYTHONPATH: this folder first (its sitecustomize runs as Python
    starts), then the path it had, then this project's root where no install puts `sweep`
    on the child's own path (a checkout run in place)."""
    path = [str(FOLDER), *[p for p in existing.split(os.pathsep) if p]]
    root = FOLDER.parents[2]
    if root.name not in ("site-packages", "dist-packages") and str(root) not in path:
        path.append(str(root))
    return os.pathsep.join(path)
