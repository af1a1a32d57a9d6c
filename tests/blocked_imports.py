"""Packages made not installed, for real, in a process of its own and its children: the
sitecustomize this writes, on PYTHONPATH, makes each import of them fail as a missing
package's would (ModuleNotFoundError)."""

from __future__ import annotations

import os
from pathlib import Path

SITECUSTOMIZE = '''
import importlib.abc, os, sys

class _NotInstalled(importlib.abc.MetaPathFinder):
    blocked = set(os.environ["SWEEP_TEST_NOT_INSTALLED"].split(","))

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
'''


def without(packages: list[str], where: Path) -> dict[str, str]:
    """The environment of a process (and its children) in which `packages` cannot be
    imported; where: a folder for the sitecustomize."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(where), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "SWEEP_TEST_NOT_INSTALLED": ",".join(packages)}
