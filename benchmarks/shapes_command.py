"""Running a command for benchmarks/shapes.py: the child's environment (this checkout on
PYTHONPATH, its own empty caches), its time limit and stop (SIGINT, then SIGKILL to its
process group), and `sweep run` as a user runs it, read back from the run directory it
leaves ((a)'s and (b)'s timings, picks and trial rows).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STOP_GRACE_S = 20.0  # after SIGINT, before SIGKILL, for a command past its limit

Config = dict[str, Any]


def key_of(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True)


# --- subprocesses ------------------------------------------------------------------------

def child_env(triton_cache: Path, sweep_cache: Path | None = None,
              interpret: bool = False) -> dict[str, str]:
    """The caller's environment with this checkout first on PYTHONPATH (`python -m sweep`
    from an uninstalled checkout needs it: sweep/command.py drops the current directory
    from sys.path before it imports actors) and the given caches."""
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *path]),
           "TRITON_CACHE_DIR": str(triton_cache), "RAY_USAGE_STATS_ENABLED": "0"}
    if sweep_cache is not None:
        env["SWEEP_CACHE_DIR"] = str(sweep_cache)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return env


def text_of(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def run_child(cmd: Sequence[str], env: Mapping[str, str], timeout_s: float,
              cwd: Path = ROOT) -> dict[str, Any]:
    """One command in a process group of its own, timed launch to exit. Past timeout_s
    it gets SIGINT (a sweep then stops cleanly, writing what it has), and SIGKILL to the
    group STOP_GRACE_S later, so no worker of it is left holding the GPU."""
    launched = time.time()
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=dict(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired as e:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            rest_out, rest_err = proc.communicate()
            out = text_of(e.stdout) + text_of(rest_out)
            err = text_of(e.stderr) + text_of(rest_err)
    exited = time.time()
    return {"rc": proc.returncode, "timed_out": timed_out, "limit_s": timeout_s,
            "command_s": exited - launched, "launched_at": launched,
            "stdout": text_of(out), "stderr": text_of(err)}


def tail(text: str, chars: int = 3000) -> str:
    return text if len(text) <= chars else "…" + text[-chars:]


# --- (a), (b): sweep run -----------------------------------------------------------------

def sweep_command(spec_path: Path, out: Path, triton_cache: Path, sweep_cache: Path,
                  timeout_s: float) -> dict[str, Any]:
    """`python -m sweep run SPEC --out OUT` as a user runs it: its wall clock, phases,
    picks (each problem's) and trial rows."""
    got = run_child([sys.executable, "-m", "sweep", "run", str(spec_path), "--out", str(out)],
                    child_env(triton_cache, sweep_cache), timeout_s)
    result: dict[str, Any] = {k: got[k] for k in ("rc", "timed_out", "limit_s", "command_s")}
    result["summary"] = tail(got["stdout"])
    result["stderr"] = tail(got["stderr"])
    if (out / "snapshot.json").exists():
        snap = json.loads((out / "snapshot.json").read_text())["snapshot"]
        result["state"] = snap.get("state")
        result["counts"] = snap.get("counts")
        phases = {k: v - got["launched_at"] for k, v in (snap.get("timeline") or {}).items()}
        if snap.get("written_at"):
            phases["table_written"] = snap["written_at"] - got["launched_at"]
        phases["exit"] = got["command_s"]
        result["phases_s"] = dict(sorted(phases.items(), key=lambda kv: kv[1]))
    if (out / "best.json").exists():
        best = json.loads((out / "best.json").read_text())
        result["best"] = {k: best.get(k) for k in ("index", "config", "latency_ms", "device",
                                                    "partial")}
        result["finalists"] = best.get("finalists")
        result["baseline"] = best.get("baseline")
        if best.get("by_problem"):
            result["by_problem"] = [
                {k: p.get(k) for k in ("problem", "first_index", "configs", "config", "index",
                                       "latency_ms", "device", "finalists", "baseline")}
                for p in best["by_problem"]]
    if (out / "trials.parquet").exists():
        import pyarrow.parquet as pq

        rows = pq.read_table(out / "trials.parquet").to_pylist()
        result["trials"] = len(rows)
        result["rows"] = [{"index": r["index"], "status": r["status"],
                           "latency_ms": r["latency_ms"], "config": r["config"],
                           "compile_ms": r["compile_ms"],
                           "started_at": r["started_at"].timestamp() if r["started_at"] else None,
                           "finished_at": (r["finished_at"].timestamp()
                                           if r["finished_at"] else None)}
                          for r in rows]
    return result


def picks_of_one_run(a: Mapping[str, Any], sizes: int) -> list[Config | None]:
    """(a)'s pick for each problem (None where it has none)."""
    by_problem = a.get("by_problem") or []
    picks: list[Config | None] = [None] * sizes
    for p, entry in enumerate(by_problem[:sizes]):
        picks[p] = entry.get("config")
    return picks


def table_tops(rows: Sequence[Mapping[str, Any]], first: int, count: int,
               top: int) -> list[Config]:
    """The `top` fastest ok configs of a trial table among indices first..first+count-1."""
    ok = [r for r in rows if r["status"] == "ok" and r["latency_ms"] is not None
          and first <= r["index"] < first + count]
    ok.sort(key=lambda r: r["latency_ms"])
    return [json.loads(r["config"]) for r in ok[:top]]
