"""Clusters of several device types: each record names its device type, the best is kept
per type (best.json, snapshot, summary, cache), finalists are re-timed on a device of the
type they were picked on, and a spec may restrict a sweep to some types."""

import json
from dataclasses import replace

import pyarrow.parquet as pq
import pytest
from conftest import simulate_spec, sweep_cli
from fake_runtime import FakeRuntime
from test_driver import make

from actors.simulate import SimulatedBackend, draws
from storage.records import Best, TrialOutcome, TrialRecord, Where
from sweep.engines.ray.placement import placement
from sweep.results.tally import Tally
from sweep.run.retiming import retime
from sweep.spec import SpecError, load_spec

DEVICES = {"SIM-A": 1, "SIM-B": 2}


def record(index: int, latency: float, device: str) -> TrialRecord:
    return TrialRecord.from_outcome(
        index, {"A": index}, TrialOutcome("ok", "skipped", latency_ms=latency),
        where=Where(device, "n", "w"), attempt=1, started_at=0.0, finished_at=0.0)


def test_the_tally_keeps_the_best_and_the_leaders_of_each_device_type():
    tally = Tally(total=6)
    tally.add([record(0, 3.0, "A"), record(1, 1.0, "B"), record(2, 2.0, "A"),
               record(3, 0.5, "B"), record(4, 2.5, "A")])
    assert tally.devices == ["A", "B"]
    assert tally.by_device["A"].index == 2 and tally.by_device["B"].index == 3
    assert tally.best is not None and tally.best.index == 3
    assert [b.index for b in tally.leaders(2, "A")] == [2, 4]
    assert [b.index for b in tally.leaders(3)] == [3, 1, 2]  # all types together
    tally.set_best({"B": Best(1, {"A": 1}, 0.9, "B"), "A": Best(2, {"A": 2}, 0.7, "A")})
    assert tally.best == Best(2, {"A": 2}, 0.7, "A")  # the fastest re-timed winner


def test_workers_start_as_their_kind_and_retiming_goes_to_a_device_of_the_type():
    rt = FakeRuntime()
    driver, _, _ = make(12, rt, workers=3, kinds=["A", "A", "B"])
    assert driver.run() == "complete"
    assert sorted(rt.kinds.values()) == ["A", "A", "B"]
    retime(driver.pool, [{"A": 0}], 1, lambda: False, device="B")
    worker, _, _ = rt.retimed[-1]
    assert rt.kinds[worker] == "B"


def test_retiming_on_a_type_whose_workers_are_gone_starts_one_of_that_type():
    rt = FakeRuntime()
    driver, _, _ = make(6, rt, workers=2, kinds=["A", "B"])
    assert driver.run() == "complete"
    for slot in [s for s in driver.pool.slots if s.kind == "B"]:
        rt.kill(slot.name)
        driver.pool.slots.remove(slot)
    retime(driver.pool, [{"A": 0}], 1, lambda: False, device="B")
    worker, _, _ = rt.retimed[-1]
    assert rt.kinds[worker] == "B" and worker not in ("w1", "w2")


def test_a_sweep_over_two_device_types_keeps_a_best_for_each(runtime_args, tmp_path):
    # 3 s of trials in all: every worker is up long before they are done.
    spec = simulate_spec(tmp_path / "s.yaml", space={"A": list(range(300))},
                         run={"finalists": 3},
                         simulate={"devices": DEVICES, "trial_ms": 10, "seed": 3})
    out = tmp_path / "run"
    assert sweep_cli("run", spec, "--out", out, *runtime_args) == 0
    rows = pq.read_table(out / "trials.parquet").to_pylist()
    assert {r["device"] for r in rows} == set(DEVICES)
    for r in rows:  # each type has latencies of its own
        assert r["latency_ms"] == SimulatedBackend(
            trial_ms=10, fail_rate=0, crash_rate=0, hang_rate=0, seed=3,
            device=r["device"]).latency_ms({"A": r["index"]})
    best = json.loads((out / "best.json").read_text())
    assert set(best["by_device"]) == set(DEVICES)
    for device, mine in best["by_device"].items():
        ok = sorted((r for r in rows if r["device"] == device), key=lambda r: r["latency_ms"])
        finalists = [f for f in best["finalists"] if f["device"] == device]
        assert [f["index"] for f in finalists] == [r["index"] for r in ok[:3]]
        # Simulated timings carry no noise: a finalist re-timed on a device of another
        # type would come back with that type's latency, not its own.
        assert all(f["latency_ms"] == f["sweep_latency_ms"] for f in finalists)
        assert mine["index"] == ok[0]["index"] and mine["latency_ms"] == ok[0]["latency_ms"]
    fastest = min(best["by_device"].items(), key=lambda kv: kv[1]["latency_ms"])
    assert (best["device"], best["index"]) == (fastest[0], fastest[1]["index"])
    snapshot = json.loads((out / "snapshot.json").read_text())["snapshot"]
    assert {d: b["index"] for d, b in snapshot["by_device"].items()} == \
        {d: b["index"] for d, b in best["by_device"].items()}


def test_the_summary_and_the_cache_name_the_best_of_each_type(ray_local, tmp_path, capsys):
    spec = simulate_spec(tmp_path / "s.yaml", space={"A": list(range(300))},
                         simulate={"devices": DEVICES, "trial_ms": 10})
    assert sweep_cli("run", spec, "--out", tmp_path / "run") == 0
    summary = capsys.readouterr().out
    assert sum(line.startswith("  best: #") for line in summary.splitlines()) == 2
    assert "on SIM-A" in summary and "on SIM-B" in summary
    assert sweep_cli("best", spec) == 0
    listed = capsys.readouterr().out
    assert "SIM-A" in listed and "SIM-B" in listed


def test_a_spec_restricted_to_one_type_runs_only_there(ray_local, tmp_path):
    spec = simulate_spec(tmp_path / "s.yaml", space={"A": list(range(20))},
                         run={"accelerator_types": ["SIM-B"]},
                         simulate={"devices": DEVICES})
    assert sweep_cli("run", spec, "--out", tmp_path / "run") == 0
    rows = pq.read_table(tmp_path / "run" / "trials.parquet").to_pylist()
    assert {r["device"] for r in rows} == {"SIM-B"} and len(rows) == 20


def test_a_restriction_to_types_the_cluster_lacks_is_one_line(ray_local, tmp_path, capsys):
    spec = simulate_spec(tmp_path / "s.yaml", run={"accelerator_types": ["H100"]},
                         simulate={"devices": DEVICES})
    assert sweep_cli("run", spec, "--out", tmp_path / "run") == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: {spec}: run.accelerator_types: the cluster has no simulated "
                   "device of type H100 (it has: SIM-A x1, SIM-B x2)")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("section", "value", "message"), [
    ("run", {"accelerator_types": "H100"},
     "run.accelerator_types: expected null or a list of accelerator type names"),
    ("simulate", {"devices": {"SIM-A": 0}},
     "simulate.devices: expected a mapping of device type names to worker counts >= 1"),
    ("simulate", {"resources": {"sim_gpu": -1}},
     "simulate.resources: expected a mapping of Ray resource names to amounts > 0"),
])
def test_device_type_keys_are_checked(tmp_path, capsys, section, value, message):
    spec = simulate_spec(tmp_path / "s.yaml", **{section: value})
    assert sweep_cli("run", spec, "--out", tmp_path / "run") == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_same_config_fails_alike_on_every_type_but_times_differently():
    config = {"A": 5}
    a, b = (SimulatedBackend(trial_ms=1, fail_rate=0.5, crash_rate=0, hang_rate=0, seed=1,
                             device=d) for d in ("SIM-A", "SIM-B"))
    assert a.run_trial(config).status == b.run_trial(config).status == \
        ("compile_error" if draws(1, config)[0] < 0.5 else "ok")
    untyped = SimulatedBackend(trial_ms=1, fail_rate=0, crash_rate=0, hang_rate=0, seed=1)
    assert untyped.latency_ms(config) == 0.5 + draws(1, config)[1]  # unchanged without types
    assert a.latency_ms(config) != b.latency_ms(config)


def test_a_cap_on_workers_keeps_every_device_type(tmp_path):
    spec = load_spec(simulate_spec(tmp_path / "s.yaml",
                                   run={"workers": 3},
                                   simulate={"devices": {"SIM-A": 4, "SIM-B": 1, "SIM-C": 2}}))
    assert placement(spec, "simulate").kinds == ("SIM-A", "SIM-B", "SIM-C")
    uncapped = replace(spec, run=replace(spec.run, workers=None))
    assert placement(uncapped, "simulate").kinds == ("SIM-A",) * 4 + ("SIM-B",) + ("SIM-C",) * 2


def test_types_cannot_be_chosen_for_a_backend_without_them(tmp_path):
    spec = load_spec(simulate_spec(tmp_path / "s.yaml", run={"accelerator_types": ["H100"]}))
    with pytest.raises(SpecError, match=r"simulate\.devices, and it names none"):
        placement(spec, "simulate")
    with pytest.raises(SpecError, match="chooses GPU types, but this run's backend is interpret"):
        placement(spec, "interpret")
