"""The report's numbers (sweep/report/analysis.py) against a table worked out by hand: a run
directory written through the run's own writers, whose every figure is computed below
from the six trials it holds."""

import dataclasses
import json

import pytest
from conftest import simulate_spec, sweep_cli

from storage.best_file import read_best, write_best
from storage.records import Best, TrialRecord
from storage.snapshot import Snapshot, write_snapshot
from sweep.report.analysis import analyse
from sweep.run import rundir
from sweep.run.rundir import RunDir, RunLog
from sweep.spec import load_spec

NODE = "n1"
OOR = "CompilationError: out of resources: shared memory {} > 65536"
# index: (status, one-pass latency with p20/p80, worker, started, finished, error)
TRIALS = {
    0: ("ok", (4.0, 3.9, 4.2), "w1", 100.0, 101.0, None),
    1: ("ok", (2.0, 1.9, 2.1), "w2", 100.0, 100.5, None),
    2: ("compile_error", None, "w1", 101.5, 101.6, OOR.format(98304)),
    3: ("ok", (3.0, 2.9, 3.1), "w2", 100.5, 101.5, None),
    # a second session: the workers take the same names again
    4: ("compile_error", None, "w1", 200.0, 200.2, OOR.format(131072)),
    5: ("ok", (2.8, 2.7, 2.9), "w1", 200.5, 201.0, None),
}
SESSIONS = [[90.0, 150.0], [190.0, 210.0]]
# The side-by-side re-timing reorders the sweep's one pass: #5 beats #1.
RETIMED = {1: (2.2, 2.1, 2.3), 5: (2.1, 2.0, 2.2), 3: (3.3, 3.2, 3.4)}
BASELINE = {"latency_ms": 4.2, "latency_p20_ms": 4.1, "latency_p80_ms": 4.3, "of": "baseline"}
WORK = {"flops": 2e9, "bytes_moved": 4e6}


def write_run(tmp_path, *, finished=True, name="sim", errors=None, devices=None,
              finalists=RETIMED, winner=(5, 2.1)):
    """errors, devices: a trial's error text or device type instead of the table's."""
    spec = load_spec(simulate_spec(tmp_path / "s.yaml", space={"A": [1, 2, 4],
                                                               "B": ["x", "y"]}))
    spec = dataclasses.replace(spec, work=WORK, name=name)
    errors, devices = errors or {}, devices or {}
    space = spec.expand()
    assert [space.config(i) for i in range(6)] == [
        {"A": a, "B": b} for a in (1, 2, 4) for b in ("x", "y")]
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    rundir.create(run, spec, len(space), "simulate")
    records = [
        TrialRecord(index=i, config=space.config(i), status=status,
                    latency_ms=t[0] if t else None, latency_p20_ms=t[1] if t else None,
                    latency_p80_ms=t[2] if t else None,
                    validation="skipped", error=errors.get(i, error), compile_ms=None,
                    device=devices.get(i, "simulated"),
                    node=NODE, worker=worker, attempt=1, started_at=start, finished_at=end)
        for i, (status, t, worker, start, end, error) in TRIALS.items()]
    with RunLog.open(run, spec.fingerprint) as log:
        log.commit(records, [], [None] * len(records))
    state = "complete" if finished else "running"
    rundir.write_trials(run, spec, space, state)
    best = Best(winner[0], space.config(winner[0]), winner[1],
                devices.get(winner[0], "simulated"))
    retimed = [{"index": i, "config": space.config(i), "device": "simulated",
                "sweep_latency_ms": TRIALS[i][1][0], "latency_ms": m,
                "latency_p20_ms": lo, "latency_p80_ms": hi}
               for i, (m, lo, hi) in finalists.items()]
    by_device = {"simulated": Best(5, space.config(5), 2.1, "simulated"), best.device: best}
    if finished:
        write_best(run.best, best, fingerprint=spec.fingerprint, partial=False,
                   finalists=retimed, by_device=by_device, baseline={"simulated": BASELINE})
        write_snapshot(run.snapshot, Snapshot(
            "complete", spec.fingerprint, 6, 6, {"ok": 4, "compile_error": 2}, best,
            finalists=retimed, by_device=by_device, baseline={"simulated": BASELINE},
            sessions=SESSIONS, timeline={"trials_done": 201.0, "finalists_done": 203.5}))
    else:  # still going: no re-timing yet, and the best so far is the one pass's
        so_far = Best(1, space.config(1), 2.0, "simulated")
        write_snapshot(run.snapshot, Snapshot(
            "running", spec.fingerprint, 6, 6, {"ok": 4, "compile_error": 2}, so_far,
            by_device={"simulated": so_far}, sessions=SESSIONS))
    return run.path


def test_every_figure_matches_the_table_worked_out_by_hand(tmp_path):
    a = analyse(write_run(tmp_path))
    assert (a.state, a.total, a.done, a.counts) == \
        ("complete", 6, 6, {"compile_error": 2, "ok": 4})
    assert a.parameters == ["A", "B"] and a.sessions == 2

    # Both compile errors differ in a number only: one cause, the lower index its example.
    [group] = a.errors
    assert (group.status, group.count, group.index, group.example) == \
        ("compile_error", 2, 2, OOR.format(98304))

    # The finalists by their re-timing (5, 1, 3), then the rest by the one pass (0).
    assert [(r.rank, r.index) for r in a.ranked] == [(1, 5), (2, 1), (3, 3), (4, 0)]
    assert a.winner == 5 and a.partial is False
    assert [r.winner for r in a.ranked] == [True, False, False, False]
    first, last = a.ranked[0], a.ranked[-1]
    assert (first.retimed_ms, first.retimed_p20_ms, first.retimed_p80_ms) == (2.1, 2.0, 2.2)
    assert (first.latency_ms, first.latency_p20_ms, first.latency_p80_ms) == (2.8, 2.7, 2.9)
    assert last.retimed_ms is None and last.best_ms == 4.0
    # 2e9 flops in 2.1 ms, 4e6 bytes in 2.1 ms; the one pass's 4.0 ms where not re-timed
    assert first.tflops == pytest.approx(2e9 / 2.1e-3 / 1e12)
    assert first.gbps == pytest.approx(4e6 / 2.1e-3 / 1e9)
    assert last.tflops == pytest.approx(0.5)

    [torch] = a.baseline
    assert (torch.device, torch.of, torch.latency_ms, torch.best_ms) == \
        ("simulated", "baseline", 4.2, 2.1)
    assert torch.speedup == pytest.approx(2.0)

    effects = {e.parameter: [(v.value, v.trials, v.ok, v.median_ms, v.best_ms)
                             for v in e.values] for e in a.effects}
    assert effects == {
        "A": [(1, 2, 2, 3.0, 2.0), (2, 2, 1, 3.0, 3.0), (4, 2, 1, 2.8, 2.8)],
        "B": [("x", 3, 1, 4.0, 4.0), ("y", 3, 3, 2.8, 2.0)],  # median, not mean
    }
    [heat] = a.heatmaps
    assert (heat.x, heat.y, heat.x_values, heat.y_values) == ("A", "B", [1, 2, 4], ["x", "y"])
    assert heat.best_ms == [[4.0, None, None], [2.0, 3.0, 2.8]]

    # Time zero is the first session's start (90 s). Session 1: both workers began 10 s in;
    # w1 ran #0 (1.0 s), waited 0.5 s, ran #2 (0.1 s); w2 ran #1 and #3 back to back.
    # Session 2 (from 190 s): w1 began 10 s in, ran #4 (0.2 s), waited 0.3 s, ran #5
    # (0.5 s). The time between the sessions is nobody's wait.
    assert [w.worker for w in a.workers] == ["s1 n1/w1", "s1 n1/w2", "s2 n1/w1"]
    assert [w.trials for w in a.workers] == [2, 2, 2]
    assert [w.starting_s for w in a.workers] == [10.0, 10.0, 10.0]
    uses = [(w.busy_s, w.waiting_s, w.busy_fraction) for w in a.workers]
    assert uses == [pytest.approx(u) for u in [(1.1, 0.5, 1.1 / 1.6), (1.5, 0.0, 1.0),
                                               (0.7, 0.3, 0.7)]]
    waits = [(s.worker, s.start_s, s.end_s) for s in a.spans if s.kind == "waiting"]
    assert [w[0] for w in waits] == ["s1 n1/w1", "s2 n1/w1"]
    assert [w[1:] for w in waits] == [pytest.approx((11.0, 11.5)),
                                      pytest.approx((110.2, 110.5))]
    starting = [(s.worker, s.start_s, s.end_s) for s in a.spans if s.kind == "starting"]
    assert starting == [("s1 n1/w1", 0.0, 10.0), ("s1 n1/w2", 0.0, 10.0),
                        ("s2 n1/w1", 100.0, 110.0)]
    # The last session re-timed its finalists from 201 s to 203.5 s.
    [retiming] = [s for s in a.spans if s.kind == "re-timing"]
    assert (retiming.worker, retiming.start_s, retiming.end_s) == ("s2 finalists", 111.0, 113.5)
    assert sorted(s.index for s in a.spans if s.index is not None) == list(range(6))

    # The HTML table's rows: every trial, in index order, with the ranking's columns.
    assert [t["index"] for t in a.trials] == list(range(6))
    assert [t["rank"] for t in a.trials] == [4, 2, None, 3, None, 1]
    assert a.trials[5]["winner"] and a.trials[5]["retimed_ms"] == 2.1
    assert a.trials[0]["started_s"] == 10.0 and a.trials[5]["finished_s"] == pytest.approx(111)


def test_a_run_still_going_is_read_from_its_checkpoint_and_snapshot(tmp_path):
    a = analyse(write_run(tmp_path, finished=False))
    # No re-timing yet: the one pass ranks, and the snapshot's best so far is the winner.
    assert a.state == "running" and a.partial is True
    assert [r.index for r in a.ranked] == [1, 5, 3, 0] and a.winner == 1
    assert a.baseline == [] and all(r.retimed_ms is None for r in a.ranked)


def test_report_prints_the_winner_the_failures_and_the_parameters(tmp_path, capsys):
    path = write_run(tmp_path)
    assert sweep_cli("report", path, "--top", "2") == 0
    out = capsys.readouterr().out
    assert "winner: #5 " in out and "2.1 [2–2.2] ms re-timed side by side" in out
    assert "torch baseline on simulated: 4.2 ms" in out and "is 2× faster" in out
    assert "compile_error ×2  e.g. #2: " + OOR.format(98304) in out
    assert "A  1: 2/2 · 3 / 2   2: 1/2 · 3 / 3   4: 1/2 · 2.8 / 2.8" in out
    lines = out.splitlines()
    top = lines[lines.index(next(x for x in lines if x.startswith("top 2 of 4"))) + 2:][:2]
    assert top[0].split()[:3] == ["★", "1", "#5"] and top[1].split()[:2] == ["2", "#1"]


def test_report_json_is_the_analysis(tmp_path, capsys):
    path = write_run(tmp_path)
    assert sweep_cli("report", path, "--json", "--top", "3") == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["index"] for r in doc["top"]] == [5, 1, 3]
    assert doc["winner"] == 5 and doc["baseline"][0]["speedup"] == pytest.approx(2.0)
    assert doc["errors"][0]["count"] == 2 and doc["counts"] == {"compile_error": 2, "ok": 4}
    assert "spans" not in doc and "trials" not in doc


def test_best_json_from_before_the_baseline_is_still_read(tmp_path):
    path = write_run(tmp_path)
    best = path / "best.json"
    doc = json.loads(best.read_text())
    fingerprint = doc["fingerprint"]
    del doc["baseline"], doc["by_device"]
    best.write_text(json.dumps(doc))
    found = read_best(best, fingerprint)
    assert found is not None and found.choice.baseline == {}
    assert (found.choice.best.index, found.choice.best.config) == (doc["index"], doc["config"])
    assert found.choice.finalists == doc["finalists"]
    # Before by_device, the head was its one device's best.
    assert found.choice.by_device == {doc["device"]: found.choice.best}
    doc["surprise"] = 1
    best.write_text(json.dumps(doc))
    assert read_best(best, fingerprint) is None


@pytest.mark.parametrize(("speedup", "text"), [
    (2.0, "is 2× faster"), (1.004, "matches it (within 0.5%)"),
    (0.996, "matches it (within 0.5%)"), (0.5, "is 2× slower")])
def test_the_comparison_with_torch_reads_both_ways(speedup, text):
    from sweep.report.text import speedup_text

    assert speedup_text(speedup) == text


def test_a_device_types_best_settled_by_its_one_pass_can_win_and_ranks_first(tmp_path):
    # #1 ran alone on another device type: nothing to re-time it against, so its one pass
    # (2.0 ms) is its type's best, and the fastest of the types' bests (best.json's pick).
    path = write_run(tmp_path, devices={1: "other"}, finalists={5: (2.1, 2.0, 2.2),
                                                                3: (3.3, 3.2, 3.4)},
                     winner=(1, 2.0))
    a = analyse(path)
    assert a.winner == 1
    assert [(r.rank, r.index, r.winner) for r in a.ranked] == \
        [(1, 1, True), (2, 5, False), (3, 3, False), (4, 0, False)]


def test_a_best_json_that_parses_but_is_damaged_leaves_the_snapshots_account(tmp_path):
    path = write_run(tmp_path)
    doc = json.loads((path / "best.json").read_text())
    doc["finalists"] = None
    (path / "best.json").write_text(json.dumps(doc))
    a = analyse(path)  # no traceback: the snapshot holds the same pick
    assert a.winner == 5 and [r.index for r in a.ranked] == [5, 1, 3, 0]
    assert a.ranked[0].retimed_ms == 2.1 and a.baseline[0].speedup == pytest.approx(2.0)


def test_while_a_resumed_run_goes_the_earlier_best_json_is_not_its_pick(tmp_path):
    path = write_run(tmp_path)
    snap = json.loads((path / "snapshot.json").read_text())["snapshot"]
    write_snapshot(path / "snapshot.json", Snapshot(
        "running", snap["fingerprint"], 6, 6, snap["counts"],
        Best(1, {"A": 1, "B": "y"}, 2.0, "simulated")))
    a = analyse(path)
    assert a.partial is True and a.winner == 1 and a.ranked[0].retimed_ms is None


@pytest.mark.parametrize(("args", "message"), [
    (["--top", "-1"], "--top: expected 0 or more, got -1"),
    ([], "no such run directory"),
])
def test_bad_report_arguments_are_one_line(tmp_path, capsys, args, message):
    target = write_run(tmp_path) if args else tmp_path / "nowhere"
    assert sweep_cli("report", target, *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
