"""The Python API (sweep.api): run and resume from a spec path or a mapping, the result
object, observers, signal handlers owned by the caller, the time budget, a run in which
nothing worked. In-process, on the local runtime; one run on the test session's Ray, and
two calls sharing a Ray of their own in a process of theirs (the slow tier)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, simulate_spec, sweep_cli

from sweep import api
from sweep.observers import ObserverWarning
from sweep.run import budget

SPACE = {"A": list(range(10)), "B": list(range(6))}


def sim_doc(**simulate) -> dict:
    return {"name": "api", "kernel": "matmul", "space": SPACE,
            "run": {"backend": "simulate", "snapshot_every_s": 0.5, "drain_s": 2,
                    "runtime": "local"},
            "simulate": {"workers": 2, "trial_ms": 1, **simulate}}


def journal_order(run_dir) -> list[int]:
    lines = (run_dir / "journal.jsonl").read_text().splitlines()
    return [json.loads(line)["index"] for line in lines if '"index"' in line]


def test_a_mapping_spec_runs_on_ray_and_its_result_holds_the_best_and_the_table(ray_local,
                                                                               tmp_path):
    # The default tier's run on a real local Ray (the session's, which the call joins).
    seen: list[dict] = []
    result = api.run(sim_doc(), out=tmp_path / "run", on_trial=seen.append, quiet=True,
                     runtime="ray")
    assert (result.state, result.exit_code, result.complete) == ("complete", 0, True)
    table = result.table()
    assert table.column("index").to_pylist() == list(range(60))
    best_json = json.loads((tmp_path / "run" / "best.json").read_text())
    assert result.best is not None
    assert (result.best.index, result.best.config, result.best.latency_ms) == \
        (best_json["index"], best_json["config"], best_json["latency_ms"])
    assert result.finalists == best_json["finalists"] and len(result.finalists) == 5
    assert result.counts == {"ok": 60} and (result.done, result.total) == (60, 60)
    assert len(result.to_pandas()) == 60
    # The observer saw every trial once, in the order the journal made them durable, as
    # plain JSON values.
    assert [r["index"] for r in seen] == journal_order(tmp_path / "run")
    assert sorted(r["index"] for r in seen) == list(range(60))
    assert json.loads(json.dumps(seen)) == seen
    assert api.load(tmp_path / "run") == \
        api.SweepResult(**{**vars(result), "exit_code": None, "elapsed_s": 0.0})



READ_LAST = "import sys; from sweep import api; api.load(sys.argv[1]).table()"


def test_a_script_that_reads_the_table_last_exits_cleanly(tmp_path):
    # Reading through a Python file left pyarrow releasing it on one of its threads as the
    # interpreter exited: SIGABRT about one script in two. Eight scripts: a return of the
    # abort fails this test all but once in 256.
    api.run(sim_doc(), out=tmp_path / "run", quiet=True, runtime="local")
    scripts = [subprocess.Popen([sys.executable, "-c", READ_LAST, str(tmp_path / "run")],
                                cwd=ROOT, stderr=subprocess.PIPE, text=True)
               for _ in range(8)]
    # A hang guard only: eight interpreters at once start slowly on a busy machine.
    ended = [(p.wait(180), p.stderr.read()[-500:]) for p in scripts if p.stderr]
    assert [rc for rc, _ in ended] == [0] * 8, ended
def test_an_observer_that_raises_is_warned_about_once_and_the_run_is_unchanged(tmp_path):
    calls = []

    def broken(record: dict) -> None:
        calls.append(record["index"])
        raise RuntimeError("observer bug")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = api.run(sim_doc(), out=tmp_path / "a", on_trial=broken, quiet=True)
    observed = [w for w in caught if issubclass(w.category, ObserverWarning)]
    assert len(observed) == 1 and "RuntimeError: observer bug" in str(observed[0].message)
    assert len(calls) == 1
    # Where warnings are errors (pytest's filterwarnings = error), the run goes on too.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        strict = api.run(sim_doc(), out=tmp_path / "c", on_trial=broken, quiet=True)
    assert strict.state == "complete" and len(calls) == 2
    plain = api.run(sim_doc(), out=tmp_path / "b", quiet=True)
    assert result.state == plain.state == "complete"
    columns = ["index", "status", "latency_ms", "config"]
    assert pq.read_table(tmp_path / "a" / "trials.parquet", columns=columns) == \
        pq.read_table(tmp_path / "b" / "trials.parquet", columns=columns)


def test_ctrl_c_in_a_notebook_stops_cleanly_raises_and_leaves_the_callers_handlers(tmp_path):
    def callers_sigint(signum, frame):  # a notebook kernel's own handler, say
        raise AssertionError("the sweep's handler should have taken this signal")

    def callers_sigterm(signum, frame):
        raise AssertionError("not sent")

    previous = signal.signal(signal.SIGINT, callers_sigint), \
        signal.signal(signal.SIGTERM, callers_sigterm)
    try:
        seen: list[int] = []

        def interrupt_at_ten(record: dict) -> None:
            seen.append(record["index"])
            if len(seen) == 10:
                os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl+C, mid-run

        with pytest.raises(KeyboardInterrupt):
            api.run(sim_doc(trial_ms=30), out=tmp_path / "run", on_trial=interrupt_at_ten,
                    quiet=True)
        assert signal.getsignal(signal.SIGINT) is callers_sigint
        assert signal.getsignal(signal.SIGTERM) is callers_sigterm
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
    stopped = api.load(tmp_path / "run")
    assert stopped.state == "interrupted" and 10 <= stopped.done < 60
    assert len(seen) == stopped.done
    resumed = api.resume(tmp_path / "run", quiet=True)
    assert resumed.state == "complete"
    rows = resumed.table().to_pylist()
    assert [r["index"] for r in rows] == list(range(60))
    assert sorted(journal_order(tmp_path / "run")) == list(range(60))  # none twice


def test_importing_the_package_changes_no_signal_handler_nor_sys_path():
    # (Ray's import adds a folder of its own to sys.path; the caller's entries must stay.)
    code = ("import signal, sys; before = (signal.getsignal(signal.SIGINT), "
            "signal.getsignal(signal.SIGTERM), list(sys.path)); "
            "import sweep.cli, sweep.api, sweep.tuned, sweep.run.session; "
            "after = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), "
            "[p for p in sys.path if p in before[2]]); "
            "assert after == before, (before, after)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


class BudgetClock:
    """The time budget's clock (sweep/run/budget.py), held by the test: it stands at the
    moment the test began until `spend` is called at the first trial observed, then runs on
    a budget's length ahead of time.monotonic. The budget is spent exactly there, with a
    trial done and the run underway, however slowly a loaded machine starts workers."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.stood_at = time.monotonic()  # before the call began: the budget is unspent
        self.ahead: float | None = None

    def __call__(self) -> float:
        return self.stood_at if self.ahead is None else time.monotonic() + self.ahead

    def spend(self, *args: object) -> None:
        self.ahead = self.budget_s


# 60 trials of 40 ms on two workers, one per batch: after the first trial is observed, the
# stop has over a second to land before the last trial could have been handed out.
BUDGETED = {"space": {"A": list(range(60))}, "simulate": {"trial_ms": 40}}


def test_a_time_budget_stops_the_run_resumably(tmp_path, monkeypatch):
    clock = BudgetClock(0.5)
    monkeypatch.setattr(budget, "clock", clock)
    doc = {**sim_doc(**BUDGETED["simulate"]), "space": BUDGETED["space"]}
    doc["run"]["finalists"] = 0
    result = api.run(doc, out=tmp_path / "run", time_budget_s=0.5, quiet=True,
                     runtime="local", on_trial=clock.spend)
    assert (result.state, result.exit_code) == ("interrupted", 0)
    assert 0 < result.done < 60
    assert json.loads((tmp_path / "run" / "best.json").read_text())["partial"] is True
    assert api.resume(tmp_path / "run", quiet=True, runtime="local").state == "complete"
    assert sorted(journal_order(tmp_path / "run")) == list(range(60))


def test_the_cli_time_budget_and_trials_jsonl(tmp_path, monkeypatch, capsys):
    from sweep.observers import TrialsJsonl

    spec = simulate_spec(tmp_path / "s.yaml", **BUDGETED, run={"drain_s": 2, "finalists": 0})
    stream = tmp_path / "trials.jsonl"
    clock, write = BudgetClock(0.5), TrialsJsonl.on_records
    with monkeypatch.context() as held:
        held.setattr(budget, "clock", clock)
        held.setattr(TrialsJsonl, "on_records",
                     lambda self, *args: (write(self, *args), clock.spend()))
        assert sweep_cli("run", spec, "--out", tmp_path / "run", "--time-budget", "0.5",
                         "--trials-jsonl", stream, "--runtime", "local") == 0
    assert "time budget of 0.5 s is spent" in capsys.readouterr().err
    first = [json.loads(line)["index"] for line in stream.read_text().splitlines()]
    assert 0 < len(first) < 60 and first == journal_order(tmp_path / "run")
    assert sweep_cli("resume", tmp_path / "run", "--trials-jsonl", stream,
                     "--runtime", "local") == 0
    every = [json.loads(line)["index"] for line in stream.read_text().splitlines()]
    assert sorted(every) == list(range(60))  # appended: each trial once
    for bad in ("0", "-1", "nan"):
        assert sweep_cli("run", spec, "--out", tmp_path / "x", "--time-budget", bad) == 2
        assert "--time-budget: expected a finite number of seconds > 0" in \
            capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("kernel: matmul\nspace: {A: [1]}\nrun: {workers: 0}\n")
    assert sweep_cli("run", broken, "--out", tmp_path / "x", "--trials-jsonl",
                     tmp_path / "x.jsonl") == 2
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.jsonl").exists()
    # Spent before any trial began (on the real clock: a loaded machine only spends it
    # sooner): like a stop then, nothing is written.
    early = api.run(sim_doc(), out=tmp_path / "y", time_budget_s=1e-6, quiet=True,
                    runtime="local")
    assert (early.state, early.run_dir, early.exit_code) == ("interrupted", None, 0)
    assert not (tmp_path / "y").exists()


def test_a_complete_run_where_nothing_worked_exits_3_with_its_commonest_errors(tmp_path, capsys):
    spec = simulate_spec(tmp_path / "s.yaml", simulate={"fail_rate": 1.0})
    assert sweep_cli("run", spec, "--out", tmp_path / "run") == 3
    out = capsys.readouterr().out
    assert "best: none" in out
    assert "40 × compile_error: simulated compile error (simulate.fail_rate) (e.g. #0)" in out
    assert sweep_cli("resume", tmp_path / "run") == 3  # already complete: the same answer
    result = api.resume(tmp_path / "run", quiet=True)
    assert (result.state, result.best, result.exit_code) == ("complete", None, 3)
    # retry as the CLI spells it: every config runs again (and fails again).
    again = api.resume(tmp_path / "run", retry="compile_error,timeout", quiet=True)
    assert (again.state, again.exit_code) == ("complete", 3)
    attempts = pq.read_table(tmp_path / "run" / "trials.parquet").column("attempt")
    assert set(attempts.to_pylist()) == {2}


def test_bad_input_raises_the_clis_one_line_error_naming_the_key(tmp_path):
    doc = sim_doc()
    doc["run"] = {**doc["run"], "workers": 0}
    with pytest.raises(api.SpecError) as e:
        api.run(doc, out=tmp_path / "run", quiet=True)
    assert str(e.value) == "spec: run.workers: expected an integer >= 1 or null, got 0"
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="on_trial: expected a callable"):
        api.run(sim_doc(), out=tmp_path / "run", on_trial="print", quiet=True)  # type: ignore


def test_a_second_ctrl_c_raises_at_once_and_loses_no_finished_trial(tmp_path):
    seen: list[int] = []

    def interrupt_twice(record: dict) -> None:
        seen.append(record["index"])
        if len(seen) == 10:
            # raise(3) delivers to this thread before it returns: two signals, not one
            # that the kernel merged (the process lives on, as a notebook's kernel must).
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        api.run(sim_doc(trial_ms=30), out=tmp_path / "run", on_trial=interrupt_twice,
                quiet=True)
    assert signal.getsignal(signal.SIGINT) is before
    assert api.load(tmp_path / "run").state == "interrupted"
    resumed = api.resume(tmp_path / "run", quiet=True)
    assert resumed.state == "complete"
    order = journal_order(tmp_path / "run")
    assert sorted(order) == list(range(60)) and set(seen) <= set(order[:len(seen)])


def test_a_stop_as_the_last_trial_ends_completes_without_caching_an_unchecked_best(
        tmp_path, capsys):
    from storage.cache import lookup

    doc = {**sim_doc(), "space": {"A": list(range(12))}}
    seen: list[int] = []

    def stop_at_the_last(record: dict) -> None:
        seen.append(record["index"])
        if len(seen) == 12:
            signal.raise_signal(signal.SIGINT)

    result = api.run(doc, out=tmp_path / "run", on_trial=stop_at_the_last)
    # Complete, with nothing to resume (no KeyboardInterrupt); the stop cut the finalists'
    # re-timing, and the exit code says it was stopped.
    assert (result.state, result.exit_code, result.finalists) == ("complete", 130, [])
    assert "the best-config cache does not take it" in capsys.readouterr().err
    assert lookup("matmul", "", {}) == []


def test_a_final_write_that_fails_alone_is_one_line_and_exit_1(tmp_path,
                                                               monkeypatch, capsys):
    import errno

    from sweep.run import rundir

    def full_disk(run, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(run.trials))

    monkeypatch.setattr(rundir, "write_artefacts", full_disk)
    spec = simulate_spec(tmp_path / "s.yaml", simulate={"fail_rate": 1.0})
    assert sweep_cli("run", spec, "--out", tmp_path / "run") == 1
    err = capsys.readouterr().err
    assert "No space left on device while writing the run directory" in err
    assert "Traceback" not in err


def test_a_call_on_another_thread_is_stopped_by_its_event(tmp_path):
    import threading

    asked = threading.Event()
    seen: list[int] = []
    results: list[api.SweepResult] = []

    def tell(record: dict) -> None:
        seen.append(record["index"])
        if len(seen) == 10:
            asked.set()  # as a notebook's "stop" button would, from anywhere

    before = signal.getsignal(signal.SIGINT)
    worker = threading.Thread(target=lambda: results.append(api.run(
        sim_doc(trial_ms=30), out=tmp_path / "run", on_trial=tell, stop=asked, quiet=True)))
    worker.start()
    worker.join(120)
    assert not worker.is_alive()
    (stopped,) = results
    assert (stopped.state, stopped.exit_code) == ("interrupted", 0)
    assert 10 <= stopped.done < 60
    assert signal.getsignal(signal.SIGINT) is before  # no handler from another thread
    assert api.resume(tmp_path / "run", quiet=True).state == "complete"
    assert sorted(journal_order(tmp_path / "run")) == list(range(60))


TWO_CALLS = r"""
import json, socket, sys, threading
from pathlib import Path

import ray

from sweep import api

out = Path(sys.argv[1])
WAIT = 120
B_CONFIGS = 100  # at 20 ms on 2 workers: a second of B's trials after A has ended


def doc(name, configs):
    return {"name": name, "kernel": "matmul", "space": {"A": list(range(configs))},
            "run": {"backend": "simulate", "snapshot_every_s": 0.5, "finalists": 2},
            "simulate": {"workers": 2, "trial_ms": 20}}


a_running, b_running = threading.Event(), threading.Event()
results, errors = {}, []


def wait(event, what):
    if not event.wait(WAIT):
        errors.append(f"no {what} within {WAIT} s")


def a_seen(record):
    if not a_running.is_set():
        a_running.set()  # A's Ray is up: B joins it
        wait(b_running, "trial of B")  # A returns only once B is under way


def b_seen(record):
    b_seen.count = getattr(b_seen, "count", 0) + 1
    if b_seen.count == 1:
        b_running.set()
        a.join(WAIT)  # B runs on after A has returned and its thread has ended
        if a.is_alive():
            errors.append(f"A did not return within {WAIT} s")
    if b_seen.count == B_CONFIGS:
        # B's workers would finish their trials on their own: Ray itself must still be
        # up (its processes die with the thread that started them: A's, ended a second
        # of B's trials ago).
        host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as e:
            errors.append(f"Ray's GCS is gone once A's thread has ended: {e}")


def call(name, configs, seen):
    try:
        results[name] = api.run(doc(name, configs), out=out / name, on_trial=seen,
                                address="local", quiet=True)  # a private Ray to share
    except BaseException as e:
        errors.append(f"{name}: {type(e).__name__}: {e}")


a = threading.Thread(target=call, args=("a", 20, a_seen))
a.start()
wait(a_running, "trial of A")
try:  # another cluster meanwhile: refused, since the calls share one
    api.run(doc("c", 5), out=out / "c", address="127.0.0.1:9", quiet=True)
    refused = None
except api.SpecError as e:
    refused = str(e)
b = threading.Thread(target=call, args=("b", B_CONFIGS, b_seen))
b.start()
a.join(WAIT)
b.join(WAIT)
print(json.dumps({
    "errors": errors, "refused": refused, "c_exists": (out / "c").exists(),
    **{name: {"state": r.state, "indices": r.table().column("index").to_pylist()}
       for name, r in results.items()}}))
"""


@pytest.mark.slow
def test_two_calls_on_two_threads_share_ray_and_both_complete(tmp_path):
    # A process of its own: an abort in Ray's core worker must fail this test, not end
    # pytest. The first call starts Ray (a private one, on its thread) and returns while
    # the second is still running on it.
    done = subprocess.run([sys.executable, "-c", TWO_CALLS, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["errors"] == [], said["errors"]
    assert said["a"] == {"state": "complete", "indices": list(range(20))}
    assert said["b"] == {"state": "complete", "indices": list(range(100))}
    assert said["refused"] == (
        "address: 127.0.0.1:9, but another sweep.api call of this process is running on "
        "the Ray it asked for as local; calls at the same time share one: give the same "
        "address, or wait for that call to end"), said["refused"]
    assert not said["c_exists"]


EVENT = "a threading.Event or None"
BAD_OPTIONS = [
    ("run", {"spec": 123}, "spec: expected a spec file's path (a str or os.PathLike) or a "
                           "mapping, got 123"),
    ("run", {"spec": None}, "spec: expected a spec file's path (a str or os.PathLike) or a "
                            "mapping, got None"),
    ("run", {"out": 123}, "out: expected a path (a str or os.PathLike) or None, got 123"),
    ("run", {"backend": 5}, "backend: expected one of auto, cuda, interpret, simulate, "
                            "replay or None, got 5"),
    ("run", {"backend": "gpu"}, "backend: expected one of auto, cuda, interpret, simulate, "
                                "replay or None, got 'gpu'"),
    ("run", {"address": 6379}, "address: expected a Ray address (a str) or None, got 6379"),
    ("run", {"max_trials": "5"}, "max_trials: expected an integer >= 1, got '5'"),
    ("run", {"time_budget_s": [1]}, "time_budget_s: expected a finite number of seconds > 0, "
                                    "got [1]"),
    ("run", {"cache_partial": "yes"}, "cache_partial: expected True or False, got 'yes'"),
    ("run", {"force": 1}, "force: expected True or False, got 1"),
    ("run", {"quiet": None}, "quiet: expected True or False, got None"),
    ("run", {"on_trial": "print"}, "on_trial: expected a callable or None, got 'print'"),
    ("run", {"trials_jsonl": 5}, "trials_jsonl: expected a path (a str or os.PathLike) or "
                                 "None, got 5"),
    ("run", {"stop": "x"}, f"stop: expected {EVENT}, got 'x'"),
    ("resume", {"run_dir": None}, "run_dir: expected a path (a str or os.PathLike), got None"),
    ("resume", {"retry": [5]}, "retry: expected statuses as \"timeout,crashed\" or a list of "
                               "strings, got [5]"),
    ("resume", {"retry": None}, "retry: expected statuses as \"timeout,crashed\" or a list of "
                                "strings, got None"),
    ("resume", {"retry": ["crashed", "nonsense"]}, None),  # the CLI's own message
    ("resume", {"address": b"127.0.0.1:6379"},
     "address: expected a Ray address (a str) or None, got b'127.0.0.1:6379'"),
    ("resume", {"max_trials": True}, "max_trials: expected an integer >= 1, got True"),
    ("resume", {"cache_partial": None}, "cache_partial: expected True or False, got None"),
    ("resume", {"quiet": "no"}, "quiet: expected True or False, got 'no'"),
    ("resume", {"trials_jsonl": ["a"]}, "trials_jsonl: expected a path (a str or "
                                        "os.PathLike) or None, got ['a']"),
    ("resume", {"stop": object}, f"stop: expected {EVENT}, got <class 'object'>"),
    ("load", {"run_dir": 5}, "run_dir: expected a path (a str or os.PathLike), got 5"),
]


@pytest.mark.parametrize(("function", "given", "says"), BAD_OPTIONS,
                         ids=[f"{f}-{'-'.join(g)}={g[next(iter(g))]!r}"
                              for f, g, _ in BAD_OPTIONS])
def test_a_wrong_option_is_a_spec_error_naming_it(tmp_path, function, given, says):
    jsonl = tmp_path / "trials.jsonl"
    if function == "run":
        kwargs = {"spec": sim_doc(), "out": tmp_path / "run", "quiet": True,
                  "trials_jsonl": jsonl, **given}
    elif function == "resume":
        kwargs = {"run_dir": tmp_path / "run", "quiet": True, "trials_jsonl": jsonl, **given}
    else:
        kwargs = dict(given)
    with pytest.raises(api.SpecError) as e:
        getattr(api, function)(**kwargs)
    line = str(e.value)
    assert "\n" not in line
    if says is None:
        assert line.startswith("retry: ") and "nonsense" in line, line
    else:
        assert line == says
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing opened or written


@pytest.mark.parametrize(("doc", "says"), [
    ({"space": {"A": {1, 2}}}, "spec: space.A: expected a list, got a set"),
    ({"run": {"backend": "simulate", "accelerator_types": frozenset({"H100"})}},
     "spec: run.accelerator_types: expected a list, got a frozenset"),
    ({"space": {1: [1, 2]}}, "spec: space: keys must be strings, got 1"),
    ({"space": {"A": [1, {2}]}}, "spec: space.A[1]: expected a list, got a set"),
    ({"problem": {"M": object()}}, "spec: problem.M: expected a string, number, boolean, "
                                   "null, list or mapping, got an object of type object"),
], ids=["set", "frozenset", "int key", "set in a list", "object"])
def test_a_mapping_spec_holding_what_yaml_cannot_names_its_key(tmp_path, doc, says):
    spec = {"name": "api", "kernel": "matmul", "space": {"A": [1, 2]}, **doc}
    with pytest.raises(api.SpecError) as e:
        api.run(spec, out=tmp_path / "run", quiet=True)
    assert str(e.value) == says
    assert not (tmp_path / "run").exists()
