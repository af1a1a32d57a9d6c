"""Stop and resume latency of the real `sweep` command, on this machine.

(a) SIGINT to snapshot: a simulate sweep with trials in flight (4 simulated GPUs, 100 ms
    trials) gets SIGINT; we time from the signal until snapshot.json on disk says
    `interrupted` (table and best.json are written before it).
(b) Resume of a 1,000,000-trial simulated run with 990,000 trials done: the time from
    launching `sweep resume` until the first new trial is durable in the journal (the run
    is going again), Ray's start-up included. Three cases: no table at all (a SIGKILL
    before the run's first table checkpoint: the whole journal is parsed); after a clean
    stop (the table covers everything); after a SIGKILL of a run that had a table
    (read the table, then the journal's tail).
    The journal of finished trials is written through the project's own journal writer
    with the simulate backend's outcomes, exactly the bytes a run would have appended;
    running a million trials first would only add minutes to the benchmark.

Usage: python benchmarks/stop_resume.py [--repeats 5] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from actors.simulate import SimulatedBackend  # noqa: E402
from benchmarks import record  # noqa: E402
from storage.journal import Journal, append_records  # noqa: E402
from storage.records import TrialRecord, Where  # noqa: E402
from sweep.spec import load_spec  # noqa: E402

# The benchmark's own Ray head listens on loopback only, without Ray 2.60's token auth.
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def sweep(*args: object, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sweep", *map(str, args)], cwd=ROOT,
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, **kw)


def poll(condition, timeout: float = 120.0, every: float = 0.002) -> float:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(every)
    return time.monotonic()


def snapshot_state(path: Path) -> str | None:
    try:
        return json.loads(path.read_text())["snapshot"]["state"]
    except (OSError, ValueError, KeyError):
        return None


def sigint_to_snapshot(tmp: Path, repeats: int) -> dict:
    spec = tmp / "inflight.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "inflight", "kernel": "matmul", "space": {"A": list(range(100_000))},
        "run": {"backend": "simulate", "snapshot_every_s": 30},
        "simulate": {"workers": 4, "trial_ms": 100}}))
    samples = []
    for i in range(repeats):
        out = tmp / f"inflight-{i}"
        proc = sweep("run", spec, "--out", out)
        journal = out / "journal.jsonl"
        # wait until trials are flowing, then a little more so some are mid-flight
        poll(lambda j=journal: j.exists() and j.stat().st_size > 20_000)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        t1 = poll(lambda o=out: snapshot_state(o / "snapshot.json") == "interrupted")
        proc.wait(60)
        samples.append(t1 - t0)
    return {"repeats": repeats, "seconds": samples, "median_s": statistics.median(samples),
            "max_s": max(samples), "trial_ms": 100, "workers": 4}


def build_million(tmp: Path) -> tuple[Path, Path]:
    spec = tmp / "million.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "million", "kernel": "matmul",
        "space": {k: list(range(10)) for k in "ABCDEF"},
        "run": {"backend": "simulate"},
        "simulate": {"workers": 4, "trial_ms": 1, "fail_rate": 0.02}}))
    out = tmp / "million"
    assert sweep("run", spec, "--out", out, "--max-trials", "1").wait(120) == 0
    (out / "journal.jsonl").unlink()
    (out / "trials.parquet").unlink()
    loaded = load_spec(spec)
    space, run = loaded.expand(), loaded.fingerprint
    backend = SimulatedBackend(trial_ms=0, fail_rate=0.02, crash_rate=0, hang_rate=0, seed=0)
    with Journal(out / "journal.jsonl") as journal:
        chunk = []
        for index in range(len(space) - 10_000):
            config = space.config(index)
            now = time.time()
            chunk.append(TrialRecord.from_outcome(
                index, config, backend.run_trial(config), where=Where("simulated", "bench", "w1"),
                attempt=1, started_at=now, finished_at=now))
            if len(chunk) == 50_000:
                append_records(journal, chunk, run)
                chunk = []
        append_records(journal, chunk, run)
    return spec, out


def time_resume(out: Path, address: str | None = None) -> dict:
    journal = out / "journal.jsonl"
    size = journal.stat().st_size
    t0 = time.monotonic()
    proc = sweep("resume", out, "--max-trials", "200", *(["--address", address] if address else []))
    t1 = poll(lambda: journal.stat().st_size > size, every=0.001)
    code = proc.wait(300)
    t2 = time.monotonic()
    return {"to_first_new_trial_s": t1 - t0, "whole_command_s": t2 - t0, "exit_code": code}


RAY_BASELINE = """
import time, ray
t = time.monotonic()
ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
@ray.remote(num_cpus=0)
class A:
    def f(self): return 1
actors = [A.remote() for _ in range(4)]
ray.get([a.f.remote() for a in actors])
print(time.monotonic() - t)
"""


def ray_start_baseline() -> float:
    """Starting a local Ray instance and 4 actors, nothing of ours: the floor under a
    resume that starts its own Ray."""
    out = subprocess.run([sys.executable, "-c", RAY_BASELINE], capture_output=True, text=True,
                         env=ENV, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def kill_mid_run(out: Path, address: str | None = None) -> None:
    """Resume, let a few hundred trials land, then SIGKILL the whole process group."""
    journal = out / "journal.jsonl"
    size = journal.stat().st_size
    proc = sweep("resume", out, *(["--address", address] if address else []))
    poll(lambda: journal.stat().st_size > size + 50_000)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        result = record.header("stop_resume")
        result["sigint_to_snapshot"] = sigint_to_snapshot(tmp, args.repeats)
        print(json.dumps(result["sigint_to_snapshot"]), flush=True)
        _, out = build_million(tmp)
        journal_mb = (out / "journal.jsonl").stat().st_size / 1e6
        no_table = time_resume(out)  # no trials.parquet yet: the whole journal is parsed
        print(json.dumps(no_table), flush=True)
        after_stop = time_resume(out)  # the previous resume stopped cleanly and wrote it
        print(json.dumps(after_stop), flush=True)
        # On a cluster Ray is already up: resume against a running instance.
        ray_cli = str(Path(sys.executable).parent / "ray")
        subprocess.run([ray_cli, "start", "--head", "--node-ip-address", "127.0.0.1",
                        "--port", "6391", "--num-cpus", "2",
                        "--include-dashboard", "false", "--disable-usage-stats"],
                       env=ENV, check=True, capture_output=True)
        try:
            address = "127.0.0.1:6391"
            time_resume(out, address)  # warms the cluster's worker pool, as a live one is
            running_stop = time_resume(out, address)
            kill_mid_run(out, address)
            running_kill = time_resume(out, address)
        finally:
            subprocess.run([ray_cli, "stop", "--force"], env=ENV, capture_output=True)
        print(json.dumps({"running_ray": [running_stop, running_kill]}), flush=True)
        kill_mid_run(out)  # a local Ray instance dies with the process group
        after_kill = time_resume(out)
        print(json.dumps(after_kill), flush=True)
        baseline = [ray_start_baseline() for _ in range(3)]
        print(json.dumps({"ray_start_and_4_actors_s": baseline}), flush=True)
        result["resume_million"] = {"trials": 1_000_000, "done_before": 990_000,
                                    "journal_mb": round(journal_mb, 1),
                                    "local_ray": {"no_table": no_table,
                                                  "after_clean_stop": after_stop,
                                                  "after_sigkill": after_kill},
                                    "running_ray": {"after_clean_stop": running_stop,
                                                    "after_sigkill": running_kill},
                                    "baseline_ray_start_and_4_actors_s": baseline}
    print(f"written {record.write(result, args.out)}")


if __name__ == "__main__":
    main()
