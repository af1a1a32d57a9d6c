"""`sweep submit` against a real local Ray cluster with its dashboard (one `ray start
--head`, shared by the module): a job that completes, a Ctrl+C that drains the sweep and a
`sweep resume` that completes it, a double Ctrl+C that leaves the job running, and bad
input refused with one line before anything is submitted.

The cluster runs with its own HOME, so the default run directory (`~/sweep-runs/...` on
the head) lands in the test's temporary directory; every process it starts is stopped by
pid at the end."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import simulate_spec

try:
    import aiohttp  # noqa: F401
    import requests  # noqa: F401
    from ray.job_submission import JobSubmissionClient
except ImportError:  # only where ray[default] is not installed at all
    pytest.skip("sweep submit needs ray[default] (pip install -e '.[cluster]')",
                allow_module_level=True)

from sweep.submit import STOP_MARGIN_S, STOP_WAIT_VAR

pytestmark = pytest.mark.slow  # own Ray clusters: the slow tier

CORE_PORTS = range(6430, 6450)  # this module's own ports, away from Ray's defaults
DASHBOARD_PORTS = range(8271, 8280)
# Variables that would point a process at some other cluster.
FOREIGN = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")


@dataclass
class Head:
    url: str  # the dashboard
    gcs: str
    home: Path  # the cluster's HOME
    env: dict[str, str]  # for the sweep commands run here
    client: JobSubmissionClient

    def submission_ids(self) -> set[str]:
        return {j.submission_id for j in self.client.list_jobs() if j.submission_id}


def _free_ports(candidates: range, n: int) -> list[int]:
    found = []
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        found.append(port)
        if len(found) == n:
            return found
    pytest.fail(f"fewer than {n} free ports in {candidates}")


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process, from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                table[int(entry.name)] = (int(fields[1]), int(fields[2]))
            except (OSError, IndexError, ValueError):
                continue
    return table


def _stop_instance(group: int) -> None:
    """Every process of the Ray instance that `ray start` (the leader of process group
    `group`) began, and their descendants (workers, the jobs' drivers), by pid: SIGTERM,
    then SIGKILL for what is left after 3 s (a raylet or GCS
    shutting down gracefully takes longer, and this cluster is thrown away)."""
    table = _process_table()
    chosen = {pid for pid, (_, pgid) in table.items() if pgid == group}
    while more := {pid for pid, (ppid, _) in table.items() if ppid in chosen} - chosen:
        chosen |= more
    chosen.discard(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in chosen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            chosen = {pid for pid in chosen if Path(f"/proc/{pid}").exists()
                      and not _zombie(pid)}
            if not chosen:
                return
            time.sleep(0.1)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    temp = Path(tempfile.mkdtemp(prefix="submit-ray-", dir="/tmp"))
    home = temp / "home"
    home.mkdir()
    (gcs, client_server, node_manager, object_manager, agent_grpc, agent_http, metrics,
     runtime_env_agent) = _free_ports(CORE_PORTS, 8)
    [dashboard] = _free_ports(DASHBOARD_PORTS, 1)
    base = {k: v for k, v in os.environ.items() if k not in FOREIGN}
    base.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    ray = Path(sys.executable).with_name("ray")
    started = subprocess.Popen(
        [str(ray), "start", "--head", "--port", str(gcs), "--num-cpus", "2",
         "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
         "--dashboard-port", str(dashboard), "--temp-dir", str(temp / "ray"),
         "--ray-client-server-port", str(client_server),
         "--node-manager-port", str(node_manager),
         "--object-manager-port", str(object_manager),
         "--dashboard-agent-grpc-port", str(agent_grpc),
         "--dashboard-agent-listen-port", str(agent_http),
         "--metrics-export-port", str(metrics),
         "--runtime-env-agent-port", str(runtime_env_agent), "--disable-usage-stats"],
        env={**base, "HOME": str(home)}, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log, _ = started.communicate(timeout=120)
        assert started.returncode == 0, log
        url = f"http://127.0.0.1:{dashboard}"
        deadline = time.monotonic() + 60
        while True:  # the dashboard's HTTP server may come up after `ray start` returns
            try:
                # Ray's client prefers RAY_ADDRESS (which tests/conftest.py sets) to the
                # address it is given, but RAY_API_SERVER_ADDRESS to both.
                with pytest.MonkeyPatch.context() as env:
                    env.setenv("RAY_API_SERVER_ADDRESS", url)
                    client = JobSubmissionClient(url)
                break
            except ConnectionError:
                assert time.monotonic() < deadline, f"no dashboard at {url}:\n{log}"
                time.sleep(0.2)
        yield Head(url=url, gcs=f"127.0.0.1:{gcs}", home=home, env=base, client=client)
    finally:
        _stop_instance(started.pid)
        shutil.rmtree(temp, ignore_errors=True)


class Output:
    """A command's merged stdout and stderr, read line by line on a thread, so that a test
    can wait for a line with a deadline."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float = 90) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no line matching {pattern!r} within {timeout} s:\n{self.text}")
            if line is None:
                pytest.fail(f"the command ended (exit {self.proc.wait()}) before a line "
                            f"matching {pattern!r}:\n{self.text}")
            self.lines.append(line)
            if m := re.search(pattern, line):
                return m

    def finish(self, timeout: float = 90) -> tuple[int, str]:
        code = self.proc.wait(timeout=timeout)
        while (line := self._queue.get(timeout=10)) is not None:
            self.lines.append(line)
        return code, self.text

    @property
    def text(self) -> str:
        return "".join(self.lines)


def submit(head: Head, cwd: Path, *args: object, env: dict | None = None) -> Output:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sweep", "submit", *map(str, args), "--address", head.url],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**head.env, **(env or {})})
    return Output(proc)


def job_id(text: str) -> str:
    m = re.search(r"as job (\S+)", text)
    assert m, text
    return m.group(1)


def run_dir_named(text: str) -> Path:
    found = re.findall(r"^  run directory \(on the head node\): (.+)$", text, re.MULTILINE)
    assert found, text
    return Path(found[-1])


def indexes(run: Path) -> list[int]:
    return sorted(pq.read_table(run / "trials.parquet", columns=["index"])
                  .column("index").to_pylist())


def wait_until_ended(head: Head, job: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while not (status := head.client.get_job_status(job)).is_terminal():
        assert time.monotonic() < deadline, f"job {job} still {status}"
        time.sleep(0.2)
    return str(status.value)


def work_dir(tmp_path: Path) -> Path:
    """What a user submits from: a directory holding the spec (and nothing else)."""
    work = tmp_path / "work"
    work.mkdir()
    return work


def slow_spec(work: Path) -> Path:
    """A sweep that cannot finish before a test stops it: 6 trials of 5 s on 2 workers."""
    return simulate_spec(work / "spec.yaml", space={"A": list(range(6))},
                         run={"finalists": 0, "drain_s": 20, "trial_timeout_s": 60},
                         simulate={"workers": 2, "trial_ms": 5000})


def test_a_submitted_sweep_completes_and_names_its_run_directory(head, tmp_path):
    work = work_dir(tmp_path)
    simulate_spec(work / "spec.yaml", space={"A": list(range(20)), "B": list(range(10))},
                  run={"finalists": 0}, simulate={"workers": 2, "trial_ms": 1})
    code, text = submit(head, work, "spec.yaml").finish()
    assert code == 0, text
    job = job_id(text)
    assert f"job {job} SUCCEEDED" in text
    run = run_dir_named(text)
    # The default run directory: under the head's home (this cluster's HOME), not in the
    # job's working_dir copy.
    assert run.parent == head.home / "sweep-runs" and run.name.startswith("sim-"), text
    assert f"sweep resume {run}" in text
    assert indexes(run) == list(range(200))
    assert json.loads((run / "snapshot.json").read_text())["snapshot"]["state"] == "complete"
    # The supervisor gives a stopped sweep its drain and the final writes.
    env_vars = head.client.get_job_info(job).runtime_env["env_vars"]
    assert env_vars[STOP_WAIT_VAR] == str(3 + STOP_MARGIN_S)  # run.drain_s: 3, the default


def test_ctrl_c_drains_the_job_and_a_resume_completes_it(head, tmp_path):
    work = work_dir(tmp_path)
    # A trial takes longer than Ray's default 3 s between SIGTERM and SIGKILL: the sweep
    # stops while each worker's next trial has seconds to go, which the drain awaits.
    # Without the longer grace `sweep submit` gives the job, the sweep would be killed
    # mid-drain and its snapshot left `running`.
    slow_spec(work)
    out = tmp_path / "run"
    proc = submit(head, work, "spec.yaml", "--out", out)
    proc.wait_for(r"^progress: \d+/6 done")  # trials are running on the cluster
    job = job_id(proc.text)
    proc.proc.send_signal(signal.SIGINT)
    code, text = proc.finish()
    assert code == 130, text
    assert f"SIGINT: asked job {job} to stop" in text
    assert "draining in-flight trials" in text
    assert re.search(r"^sweep sim: interrupted — [2-5] of 6 trials", text, re.MULTILINE), text
    assert f"job {job} STOPPED" in text
    assert head.client.get_job_status(job) == "STOPPED"
    assert run_dir_named(text) == out
    assert f"sweep resume {out}" in text
    assert json.loads((out / "snapshot.json").read_text())["snapshot"]["state"] \
        == "interrupted"

    resumed = subprocess.run([sys.executable, "-m", "sweep", "resume", str(out)], cwd=work,
                             capture_output=True, text=True, timeout=120,
                             env={**head.env, "RAY_ADDRESS": head.gcs})
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert indexes(out) == list(range(6))
    assert json.loads((out / "snapshot.json").read_text())["snapshot"]["state"] == "complete"


def test_a_second_ctrl_c_stops_waiting_and_leaves_the_job_running(head, tmp_path):
    work = work_dir(tmp_path)
    slow_spec(work)  # its drain takes seconds
    out = tmp_path / "run"
    proc = submit(head, work, "spec.yaml", "--out", out)
    proc.wait_for(r"^progress: \d+/6 done")
    job = job_id(proc.text)
    proc.proc.send_signal(signal.SIGINT)
    proc.wait_for(rf"^SIGINT: asked job {job} to stop")
    proc.proc.send_signal(signal.SIGINT)
    code, text = proc.finish(timeout=30)
    # The job is still draining (its running trials have seconds to go): leaving it
    # stopped it neither a second time nor by force.
    assert head.client.get_job_status(job) == "RUNNING", text
    assert code == 130, text
    assert f"ray job logs -f {job} --address {head.url}" in text
    assert f"ray job stop {job} --address {head.url}" in text
    assert f"sweep resume {out}" in text
    assert f"job {job} STOPPED" not in text

    head.client.stop_job(job)  # as the printed command does: it is stopping already
    assert wait_until_ended(head, job) == "STOPPED"
    # Left to itself, the sweep drained and wrote its run as a local one does.
    assert json.loads((out / "snapshot.json").read_text())["snapshot"]["state"] \
        == "interrupted"


@pytest.mark.parametrize("case", ["unreachable", "missing spec", "bad spec", "relative out",
                                  "no ray[default]", "too large", "too large via a symlink"])
def test_bad_input_is_one_line_and_submits_nothing(head, tmp_path, case):
    work = work_dir(tmp_path)
    simulate_spec(work / "spec.yaml")
    args: list[object] = ["spec.yaml"]
    env = {}
    address = head.url
    if case == "unreachable":
        [port] = _free_ports(range(DASHBOARD_PORTS.stop - 1, DASHBOARD_PORTS.start, -1), 1)
        address = f"http://127.0.0.1:{port}"
        expected = (f"error: --address: no Ray dashboard at http://127.0.0.1:{port} "
                    "(Connection refused); the head node must run the dashboard (ray start "
                    "--head --dashboard-host 0.0.0.0 ...) and its port be reachable from "
                    "here (ray dashboard CLUSTER.yaml forwards it)")
    elif case == "missing spec":
        args = ["nope.yaml"]
        expected = "error: nope.yaml: cannot read (No such file or directory)"
    elif case == "bad spec":
        (work / "spec.yaml").write_text("kernel: matmul\nspace: {A: [1]}\nrun: {drain_s: -1}\n")
        expected = "error: spec.yaml: run.drain_s: expected a number >= 0, got -1"
    elif case == "relative out":
        args += ["--out", "runs/x"]
        expected = ("error: --out: 'runs/x' is relative: it would land in the job's "
                    "temporary copy of this directory, which Ray deletes; give an absolute "
                    "path on the head node (or a shared filesystem), or ~/...")
    elif case == "too large":  # Ray would pack it for minutes before refusing it
        with open(work / "data.bin", "wb") as f:
            f.truncate(101 << 20)  # sparse: its size, not its blocks, is what would ship
        expected = (f"error: {work}: holds more than 100 MiB to ship as the job's working "
                    "directory, more than Ray accepts (the largest: data.bin, 101.0 MiB); run "
                    "sweep submit from a directory with just your spec and kernel modules (or "
                    "list the rest in .gitignore)")
    elif case == "too large via a symlink":  # Ray packs the target, from outside the directory
        big = sparse(tmp_path / "elsewhere" / "big.bin", 150 << 20)
        (work / "big.bin").symlink_to(big)
        expected = (f"error: {work}: holds more than 100 MiB to ship as the job's working "
                    "directory, more than Ray accepts (the largest: big.bin, 150.0 MiB, a "
                    f"symlink to {big}, which Ray follows); run sweep submit from a directory "
                    "with just your spec and kernel modules (or list the rest in .gitignore)")
    else:  # an aiohttp that cannot be imported stands in for a plain `pip install ray`
        shadow = tmp_path / "shadow" / "aiohttp"
        shadow.mkdir(parents=True)
        (shadow / "__init__.py").write_text(
            "raise ImportError('No module named aiohttp', name='aiohttp')\n")
        env["PYTHONPATH"] = str(shadow.parent)
        expected = ("error: sweep submit needs Ray's job client, which ray[default] provides "
                    "(aiohttp is missing): pip install 'triton-sweep[cluster]' (from a clone: "
                    "pip install -e '.[cluster]')")
    before = head.submission_ids()
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "sweep", "submit", *map(str, args), "--address", address],
        cwd=work, capture_output=True, text=True, timeout=60, env={**head.env, **env})
    assert time.monotonic() - t0 < 30  # refused before any upload; room for a busy start-up
    assert (proc.returncode, proc.stderr.strip(), proc.stdout) == (2, expected, "")
    assert head.submission_ids() == before


def test_the_jobs_command_carries_the_time_budget_and_force():
    import shlex

    from sweep.submit import job_entrypoint

    command = shlex.split(job_entrypoint("s.yaml", "~/runs/x", "simulate", 5, 30.0, True))
    tail = command[command.index("run"):]
    # On the cluster it was submitted to, whatever the spec's run.runtime says.
    assert tail == ["run", "s.yaml", "--out", "$out", "--runtime", "ray", "--backend",
                    "simulate", "--max-trials", "5", "--time-budget", "30.0", "--force"]
    plain = shlex.split(job_entrypoint("s.yaml", "~/runs/x", None, None))
    assert plain[plain.index("run"):] == ["run", "s.yaml", "--out", "$out", "--runtime", "ray"]


def test_a_sweep_the_cache_answers_on_the_head_names_no_run_directory(capsys):
    # The entrypoint names the run directory it will give `sweep run` before the sweep
    # starts; a sweep answered from the cache makes none, so none may be named.
    from sweep.console import Output
    from sweep.submit import GCS_MARK, RUN_DIR_MARK, Job

    job = Job(client=None, url="http://127.0.0.1:8265", grace_s=63, io=Output.standard(),
              submission_id="raysubmit_1")
    log = (f"{RUN_DIR_MARK}/home/u/sweep-runs/tiny-20261201T120000Z\n"
           f"{GCS_MARK}127.0.0.1:6379\n"
           "sweep tiny: cached — this sweep of softmax completed on cpu-interpreter before; "
           "the best any sweep found there is from /home/u/sweep-runs/tiny-1 (2026-12-01)\n"
           "  best: {\"BLOCK_N\": 64} 1.2 ms\n"
           "  nothing was run; pass --force to tune again\n")
    job._scan(log[:70])  # as chunks arrive, cut anywhere
    job._scan(log[70:])
    shown = capsys.readouterr().out
    assert "tiny-20261201T120000Z" not in shown and RUN_DIR_MARK not in shown
    assert shown.endswith("nothing was run; pass --force to tune again\n")
    job._where()
    assert "run directory" not in capsys.readouterr().out
    assert job.results_dir is None and job.gcs == "127.0.0.1:6379"


def sparse(path: Path, size: int) -> Path:
    """A file of `size` bytes that takes no disk: its size, not its blocks, is what ships."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


@pytest.fixture(params=["plain directory", "git checkout"])
def shipped(request, tmp_path) -> Path:
    """A directory to submit from, with a spec: outside git, where every file ships, or a
    checkout, where what git lists does (a symlink is one entry there, never followed)."""
    work = work_dir(tmp_path)
    simulate_spec(work / "spec.yaml")
    if request.param == "git checkout":
        subprocess.run(["git", "init", "-q", str(work)], check=True)
    return work


def test_the_size_check_counts_what_a_symlink_brings_in(shipped, tmp_path):
    from sweep.submit import SubmitError, check_size

    check_size(shipped)  # the spec alone
    big = sparse(tmp_path / "elsewhere" / "big.bin", 150 << 20)
    (shipped / "big.bin").symlink_to(big)
    with pytest.raises(SubmitError) as refused:
        check_size(shipped)
    assert str(refused.value).startswith(
        f"{shipped}: holds more than 100 MiB to ship as the job's working directory, more "
        f"than Ray accepts (the largest: big.bin, 150.0 MiB, a symlink to {big}, which Ray "
        "follows); ")
    (shipped / "big.bin").unlink()
    # A link to a directory ships all of it: Ray's packing descends into it.
    (shipped / "data").symlink_to(big.parent, target_is_directory=True)
    with pytest.raises(SubmitError) as refused:
        check_size(shipped)
    assert (f"(the largest: data/big.bin, 150.0 MiB, under the symlink data -> {big.parent}, "
            "which Ray follows); ") in str(refused.value)


def test_a_symlink_to_a_directory_that_holds_it_is_refused(shipped, tmp_path):
    # Ray's packing goes round such a link, packing a copy of everything at each turn.
    from sweep.submit import SubmitError, check_size

    (shipped / "kernels").mkdir()
    (shipped / "kernels" / "k.py").write_text("")
    (shipped / "kernels" / "up").symlink_to("..", target_is_directory=True)
    with pytest.raises(SubmitError) as refused:
        check_size(shipped)
    assert str(refused.value) == (
        f"{shipped}/kernels/up: a symlink to .., which holds it: Ray's packing of the job's "
        "working directory would go round it, a copy of everything at each turn; remove it "
        "or list it in .gitignore")


def test_a_dangling_or_ignored_symlink_ships_nothing(shipped, tmp_path):
    from sweep.submit import check_size

    big = sparse(tmp_path / "elsewhere" / "big.bin", 150 << 20)
    (shipped / "gone").symlink_to(tmp_path / "nowhere")
    (shipped / "runs").symlink_to(big.parent, target_is_directory=True)  # in EXCLUDES
    check_size(shipped)
