"""Shared fixtures: one local Ray instance per test session (2 CPUs), and helpers that run
the real `sweep` CLI, in-process or as a subprocess."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

# Without a GPU every Triton kernel of the tests runs under the interpreter, which Triton
# picks when triton.language is first imported (its own @jit helpers, tl.zeros and tl.sum
# among them, are made then): a test that runs a kernel in this process must not find it
# imported for the compiler by an earlier module's import.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """A best-config cache of each test's own, out of the user's home: a run whose best is
    cached would otherwise answer another test's run from the cache."""
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray instance (2 CPUs) shared by the in-process tests."""
    import ray

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def ray_address(ray_local) -> str:
    """The shared instance's address, for CLI subprocesses to join (`--address`) instead
    of each starting a Ray of its own (seconds each on this machine)."""
    return ray_local.get_runtime_context().gcs_address


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.slow)])
def runtime_args(request) -> list[str]:
    """A test run on each runtime: the local one, and Ray (the session's instance joined,
    in the slow tier); the CLI's arguments that choose it."""
    if request.param == "local":
        return ["--runtime", "local"]
    return ["--address", request.getfixturevalue("ray_address")]


def user_folders(where: Path) -> Path:
    """Folders a user may well have, named like this project's packages (and a module
    named like a dependency): none may replace what the sweep imports."""
    for name in ("storage", "actors", "sweep_kernels"):
        (where / name).mkdir()
        (where / name / "__init__.py").write_text(f"raise ImportError('the user\'s {name}')\n")
    (where / "yaml.py").write_text("raise ImportError(\"the user's yaml\")\n")
    return where


# A sweep over three problems small enough for the interpreter (about 12 s a run).
SHAPES = dict(
    name="shapes", kernel="matmul", problem={"N": 64, "K": 64, "dtype": "float32"},
    problems=[{"M": 16}, {"M": 32}, {"M": 64}],
    space={"BLOCK_M": [16, 32], "BLOCK_N": [16, 32], "BLOCK_K": [16], "GROUP_M": [1]},
    constraints=["BLOCK_M <= M"], run={"backend": "interpret"})


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
    """The CLI in this process (sharing the session's Ray); it gives pytest's own signal
    handlers back afterwards."""
    from sweep.cli import main

    return main([str(a) for a in args])


def sweep_in(*args: str | Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process, its exit code and output captured as sweep_proc gives them:
    for tests of what the command says and writes, where a process of its own (a second
    or more of start-up) adds nothing. env: variables set for the call only."""
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        if env:
            patch = stack.enter_context(pytest.MonkeyPatch.context())
            for name, value in env.items():
                patch.setenv(name, value)
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            code = sweep_cli(*args)
        except SystemExit as e:  # argparse's usage errors
            code = e.code if isinstance(e.code, int) else 2
    return subprocess.CompletedProcess(["sweep", *map(str, args)], code, out.getvalue(),
                                       err.getvalue())


def sweep_proc(*args: str | Path, cwd: Path = ROOT, timeout: float = 120,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, in its own process (`python -m`, so the current directory
    comes first on sys.path); its own local Ray instance unless given --address."""
    full_env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
    return subprocess.run([sys.executable, "-m", "sweep", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=full_env)


@contextlib.contextmanager
def mounted(at: Path, *how: list[str]) -> Iterator[Path]:
    """Real filesystems for the tests that need one (a tmpfs that fills up, a read-only
    view): each `how` is the arguments of one `mount` call. Needs root; skipped where
    mounting is not allowed."""
    at.mkdir(exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a filesystem needs root")
    done = subprocess.run(["mount", *how[0], str(at)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")
    try:
        for more in how[1:]:
            subprocess.run(["mount", *more, str(at)], check=True, capture_output=True)
        yield at
    finally:
        if subprocess.run(["umount", str(at)]).returncode != 0:
            subprocess.run(["umount", "-l", str(at)], check=True)


def tmpfs(at: Path, size: str) -> contextlib.AbstractContextManager[Path]:
    """A small tmpfs at `at`: a real disk that fills up."""
    return mounted(at, ["-t", "tmpfs", "-o", f"size={size}", "tmpfs"])


def read_only_view(source: Path, at: Path) -> contextlib.AbstractContextManager[Path]:
    """`source` seen through a read-only bind mount at `at` (read-only even for root)."""
    return mounted(at, ["--bind", str(source)], ["-o", "remount,ro,bind"])
