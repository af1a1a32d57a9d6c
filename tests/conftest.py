"""Shared fixtures: one local Ray instance per test session (2 CPUs), and helpers that run
the real `sweep` CLI, in-process or as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="session")
def private_cache(tmp_path_factory):
    """Keep the best-config cache of test runs out of the user's home."""
    os.environ["SWEEP_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray instance (2 CPUs) shared by the in-process tests."""
    import ray

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield ray
    ray.shutdown()


def write_spec(path: Path, **doc) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def simulate_spec(path: Path, *, space: dict | None = None, simulate: dict | None = None,
                  run: dict | None = None, **extra) -> Path:
    """A simulate-backend spec; outcomes and latencies are deterministic in (seed, config)."""
    return write_spec(
        path, name="sim", kernel="matmul",
        space=space or {"A": list(range(8)), "B": list(range(5))},
        run={"backend": "simulate", "snapshot_every_s": 0.5, **(run or {})},
        simulate={"workers": 2, "trial_ms": 1, **(simulate or {})}, **extra)


def sweep_cli(*args: str | Path) -> int:
    """The CLI in this process (sharing the session's Ray); pytest's own signal handlers
    are given back afterwards."""
    from sweep.cli import STOP, main

    try:
        return main([str(a) for a in args])
    finally:
        STOP.restore()


def sweep_proc(*args: str | Path, cwd: Path = ROOT, timeout: float = 120,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: its own process, its own local Ray instance."""
    full_env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
    return subprocess.run([sys.executable, "-m", "sweep.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=full_env)
