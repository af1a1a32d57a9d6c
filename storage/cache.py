"""The best-config cache: the winner of each finished sweep, keyed by what it was tuned for
(kernel and its source, problem, backend, device), for later runs and tools to look up.

An interrupted sweep's best is a guess: it is written here only when the user asks
(`--cache-partial`), and then marked `partial`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from storage.atomic import write_bytes_atomically
from storage.records import canonical_json


def cache_dir() -> Path:
    root = os.environ.get("SWEEP_CACHE_DIR") or Path.home() / ".cache" / "triton-sweep"
    return Path(root) / "best"


@dataclass(frozen=True)
class CacheEntry:
    kernel: str
    kernel_source: str
    problem: Mapping[str, Any]
    backend: str
    device: str
    config: Mapping[str, Any]
    latency_ms: float
    fingerprint: str
    run_dir: str
    partial: bool
    written_at: float

    @property
    def key(self) -> str:
        return entry_key(self.kernel, self.kernel_source, self.problem, self.backend,
                         self.device)


def entry_key(kernel: str, kernel_source: str, problem: Mapping[str, Any], backend: str,
              device: str) -> str:
    what = {"kernel": kernel, "source": kernel_source, "problem": dict(problem),
            "backend": backend, "device": device}
    return hashlib.sha256(canonical_json(what).encode()).hexdigest()[:24]


def store(entry: CacheEntry, root: Path | None = None) -> Path:
    root = root or cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{entry.key}.json"
    write_bytes_atomically(path, (json.dumps(asdict(entry), indent=2) + "\n").encode())
    return path


def lookup(kernel: str, kernel_source: str, problem: Mapping[str, Any],
           root: Path | None = None) -> list[CacheEntry]:
    """Every cached best for this kernel and problem, on any backend and device."""
    root = root or cache_dir()
    found = []
    for path in sorted(root.glob("*.json")) if root.is_dir() else []:
        try:
            entry = CacheEntry(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            continue  # a damaged entry is a cache miss, never an error
        if (entry.kernel, entry.kernel_source, dict(entry.problem)) == \
                (kernel, kernel_source, dict(problem)):
            found.append(entry)
    return found
