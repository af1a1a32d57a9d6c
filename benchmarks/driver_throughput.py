"""How many trials a second the driver moves, and how it scales with workers, with the
simulate backend against an already running local Ray cluster (so Ray's start-up is out).

trial_ms 0: pure driver cost per trial (queue, Ray streaming, journal group commit).
trial_ms 20: simulated GPUs; ideal throughput is workers * 50 trials/s, and the ratio
of measured to ideal is the parallel efficiency the driver allows at that worker count.
The time is from the first dispatch to the table written (snapshot.json records both);
the whole command's time (joining the running cluster included) is recorded beside it.
Since 2026-12-01 a worker gets work as soon as it is up rather than once all are, so the
first dispatch comes earlier and the span includes the other workers' start-up.

Scale (since the cluster issue): 8 and 16 workers, trial_ms 0, a run of 20,000 trials and
one of 1,000,000; the sustained rate is (large - small) / (its span - small's span), so
that start-up and the fixed costs cancel, and the large run's peak resident memory (the
driver process, from getrusage) is recorded.

As a user sees it (since the embedded runtime): the whole command's wall time of a
100,000-config run less that of a 100-config run, over 99,900, with 8 simulated workers at
trial_ms 0, on the local runtime and on a private Ray instance (started by each command,
as `sweep run` without a cluster did before), 3 pairs each, in turns.

Usage: python benchmarks/driver_throughput.py [--out benchmarks/results] [--name NAME]
       [--only scale|user] [--large N]
(--name: the result's name, e.g. for a baseline run from another checkout)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import record  # noqa: E402

ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
ADDRESS = "127.0.0.1:6392"


def one(tmp: Path, workers: int, trial_ms: float, trials: int, tag: str = "",
        runtime: str = "joined") -> dict:
    """runtime: joined (the head start_head began), local, or ray (a private instance)."""
    name = f"w{workers}-t{trial_ms:g}-n{trials}{tag}"
    spec = tmp / f"{name}.yaml"
    # A product of two lists: a million-entry list would take PyYAML longer than the run.
    a = min(trials, 1000)
    assert trials % a == 0
    spec.write_text(yaml.safe_dump({
        "name": name, "kernel": "matmul",
        "space": {"A": list(range(a)), "B": list(range(trials // a))},
        "run": {"backend": "simulate", "finalists": 0},
        "simulate": {"workers": workers, "trial_ms": trial_ms}}))
    out = tmp / name
    t0 = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    where = {"joined": ["--runtime", "ray", "--address", ADDRESS],
             "local": ["--runtime", "local"], "ray": ["--runtime", "ray"]}[runtime]
    env = {k: v for k, v in ENV.items() if k != "RAY_ADDRESS"}
    with WorkerCpu() as workers_cpu:
        proc = subprocess.run([sys.executable, "-m", "sweep", "run", spec, "--out", out,
                               *where], cwd=ROOT, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    command_s = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    snap = json.loads((out / "snapshot.json").read_text())["snapshot"]
    seconds = snap["written_at"] - snap["first_dispatch_at"]
    rate = trials / seconds
    ideal = workers * 1000 / trial_ms if trial_ms else None
    # The largest resident set of any run so far: runs go from small to large.
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    driver_cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"runtime": runtime, "workers": workers, "trial_ms": trial_ms, "trials": trials,
            "seconds": seconds,
            "command_s": command_s, "peak_rss_mb_so_far": peak_mb,
            "driver_cpu_s": driver_cpu, "workers_cpu_s": workers_cpu.seconds,
            "trials_per_s": rate, "efficiency": rate / ideal if ideal else None}


def sustained(small: dict, large: dict) -> dict:
    """The rate with start-up and fixed costs cancelled, and the CPU each trial costs the
    driver process and the workers' processes."""
    trials = large["trials"] - small["trials"]
    return {"workers": large["workers"], "trials": [small["trials"], large["trials"]],
            "trials_per_s": trials / (large["seconds"] - small["seconds"]),
            "command_trials_per_s": trials / (large["command_s"] - small["command_s"]),
            "driver_cpu_us_per_trial":
                1e6 * (large["driver_cpu_s"] - small["driver_cpu_s"]) / trials,
            "workers_cpu_us_per_trial":
                1e6 * (large["workers_cpu_s"] - small["workers_cpu_s"]) / trials,
            "large_peak_rss_mb": large["peak_rss_mb_so_far"]}


class WorkerCpu:
    """CPU seconds the TrialWorker processes spent while the block ran, from /proc, read
    every 0.2 s (a process that ends loses at most its last 0.2 s)."""

    def __enter__(self) -> WorkerCpu:
        self._seen: dict[int, list[int]] = {}  # pid -> [ticks first seen, ticks last]
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._done.wait(0.2):
            for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
                try:
                    line = Path(f"/proc/{pid}/cmdline").read_bytes()
                    if b"TrialWorker" not in line and b"worker_host" not in line:
                        continue
                    stat = Path(f"/proc/{pid}/stat").read_text()
                except OSError:
                    continue
                fields = stat[stat.rindex(")") + 2:].split()
                ticks = int(fields[11]) + int(fields[12])
                self._seen.setdefault(pid, [ticks, ticks])[1] = ticks

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.seconds = sum(b - a for a, b in self._seen.values()) / os.sysconf("SC_CLK_TCK")


def start_head(tmp: Path) -> subprocess.Popen:
    """A head node of our own (`ray start --block` in its own session, ended by signal):
    never `ray stop`, which would end every Ray cluster on the machine."""
    ray_cli = str(Path(sys.executable).parent / "ray")
    head = subprocess.Popen(
        [ray_cli, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port",
         ADDRESS.split(":")[1], "--num-cpus", "2", "--include-dashboard", "false",
         "--disable-usage-stats", "--temp-dir", str(tmp / "ray")],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", int(ADDRESS.split(":")[1])), 1).close()
            return head
        except OSError:
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the head node did not start") from None
            time.sleep(0.2)


def stop_head(head: subprocess.Popen) -> None:
    os.killpg(head.pid, signal.SIGTERM)  # `ray start --block` stops its node's processes
    try:
        head.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--name", default="driver_throughput")
    ap.add_argument("--only", choices=("scale", "user"),
                    help="just the scale runs, or just the whole-command ones")
    ap.add_argument("--large", type=int, default=1_000_000,
                    help="trials of the scale section's large run (a multiple of 1000)")
    args = ap.parse_args()
    runs, scale, user = [], [], []
    if args.only == "user":
        with tempfile.TemporaryDirectory() as tmp_name:
            user = as_a_user(Path(tmp_name), runs)
        result = {**record.header(args.name), "commit": commit(), "runs": runs, "user": user}
        print(f"written {record.write(result, args.out)}")
        return
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        head = start_head(tmp)
        try:
            one(tmp, 2, 0, 200, "-warm")  # warm the cluster's worker pool, as a live cluster is
            if args.only is None:
                for workers in (1, 2, 4, 8):
                    runs.append(one(tmp, workers, 0, 20_000))
                    print(json.dumps(runs[-1]), flush=True)
                for workers in (1, 2, 4, 8, 16):
                    runs.append(one(tmp, workers, 20, 250 * workers))
                    print(json.dumps(runs[-1]), flush=True)
            for workers in (8, 16):
                small = one(tmp, workers, 0, 20_000, "-scale")
                large = one(tmp, workers, 0, args.large, "-scale")
                runs += [small, large]
                scale.append(sustained(small, large))
                print(json.dumps(scale[-1]), flush=True)
        finally:
            stop_head(head)
    result = {**record.header(args.name), "commit": commit(), "runs": runs, "scale": scale}
    print(f"written {record.write(result, args.out)}")


def as_a_user(tmp: Path, runs: list[dict], pairs: int = 3) -> list[dict]:
    """(wall of 100,000 trials - wall of 100) / 99,900 per runtime, in turns."""
    out = []
    for k in range(pairs):
        for runtime in ("local", "ray"):
            small = one(tmp, 8, 0, 100, f"-{runtime}-{k}", runtime)
            large = one(tmp, 8, 0, 100_000, f"-{runtime}-{k}", runtime)
            runs += [small, large]
            out.append({"runtime": runtime, "pair": k,
                        "small_command_s": small["command_s"],
                        "large_command_s": large["command_s"],
                        "trials_per_s": 99_900 / (large["command_s"] - small["command_s"])})
            print(json.dumps(out[-1]), flush=True)
    return out


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           text=True, capture_output=True).stdout.strip()
    return done.stdout.strip() + ("+changes" if dirty else "")


if __name__ == "__main__":
    main()
