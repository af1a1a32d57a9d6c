"""Search strategies (sweep/search/strategies.py): which configs run, the `pruned` rows of the rest,
and a search stopped and resumed deciding exactly as one left alone."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from conftest import ROOT, simulate_spec, sweep_cli, sweep_in, write_spec
from test_stop_resume import has_records, start, stderr_of, wait_until

from storage.cache import distance
from sweep.report.analysis import analyse
from sweep.search.strategies import Guided, Halving, Search, rungs
from sweep.search.warm_start import indices_of
from sweep.spec import load_spec
from sweep.spec.search_options import SearchOptions

SPACE = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128],
         "BLOCK_K": [16, 32, 64], "num_warps": [2, 4, 8], "num_stages": [2, 3, 4]}
# No warm start: a test's second run would start from its first run's cached best.
GUIDED = {"strategy": "guided", "seed": 5, "budget": 0.3, "batch": 12, "warm_start": 0}
COMPARED = ("index", "config", "status", "latency_ms", "validation", "error")
# The runs here are the CLI in this process on the local runtime: what is checked is the
# search's decisions, the same on either runtime (test_stop_resume.py runs both).
LOCAL = ("--runtime", "local")


def rows_of(out: Path) -> list[dict]:
    return pq.read_table(out / "trials.parquet").to_pylist()


def compared(rows: list[dict]) -> list[dict]:
    return [{k: r[k] for k in COMPARED} for r in rows]


def replay_600(tmp_path: Path, search: dict) -> Path:
    """configs/replay-600.yaml (the recorded H200 table) with a search, played fast."""
    doc = yaml.safe_load((ROOT / "configs" / "replay-600.yaml").read_text())
    doc["replay"].update(table=str(ROOT / "benchmarks/tables/matmul600-h200.parquet"),
                         workers=2, compile_slots=4, time_scale=0.005)
    return write_spec(tmp_path / "replay.yaml", **{**doc, "search": search})


def offline(spec_path: Path, table: Path, batch: int) -> set[int]:
    """The configs a guided search runs, decided from the recorded table alone."""
    spec = load_spec(spec_path, import_kernel=False)
    space = spec.expand()
    recorded = {r["config"]: r for r in pq.read_table(table).to_pylist()}
    truth = {i: recorded[space.config_json(i)]["latency_ms"] for i in range(len(space))}
    search = Search(Guided(space, spec.search, batch), {})
    queue = search.advance()
    while queue:
        for i in queue:
            search.known[i] = truth[i]
        queue = search.advance()
    assert search.settled()
    return set(search.known)


@pytest.fixture(scope="module")
def guided(tmp_path_factory) -> tuple[Path, Path]:
    """The guided search of SPACE left alone, run once for the module (spec, run
    directory): tests that read it use it as it is, tests that alter it copy it first."""
    tmp = tmp_path_factory.mktemp("guided")
    with pytest.MonkeyPatch.context() as patch:  # the module's own best-config cache
        patch.setenv("SWEEP_CACHE_DIR", str(tmp / "cache"))
        spec = simulate_spec(tmp / "s.yaml", space=SPACE, search=GUIDED)
        assert sweep_cli("run", spec, "--out", tmp / "run", *LOCAL) == 0
    return spec, tmp / "run"


def copy_of(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def test_every_config_has_a_row_and_those_not_run_are_pruned_with_no_latency(guided,
                                                                             tmp_path):
    out = copy_of(guided[1], tmp_path)  # resumed below
    rows = rows_of(out)
    assert [r["index"] for r in rows] == list(range(432))
    pruned = [r for r in rows if r["status"] == "pruned"]
    ran = [r for r in rows if r["status"] != "pruned"]
    assert len(ran) <= round(0.3 * 432) and len(pruned) == 432 - len(ran) > 0
    for r in pruned:
        assert (r["latency_ms"], r["latency_p20_ms"], r["validation"], r["worker"],
                r["compile_ms"]) == (None, None, "skipped", "", None)
    assert all(r["latency_ms"] is not None and r["worker"] for r in ran)
    snap = json.loads((out / "snapshot.json").read_text())["snapshot"]
    assert snap["state"] == "complete" and snap["counts"]["pruned"] == len(pruned)
    best = json.loads((out / "best.json").read_text())
    assert best["index"] in {r["index"] for r in ran} and best["partial"] is False
    # The report counts the pruned, and takes them for neither trials nor failures.
    a = analyse(out)
    assert a.counts["pruned"] == len(pruned) and a.errors == []
    assert all(sum(v.trials for v in e.values) == len(ran) for e in a.effects)
    assert sum(w.trials for w in a.workers) == len(ran)
    report = sweep_in("report", out)
    assert f"{len(ran)} of 432 configs run, {len(pruned)} pruned by the search" in report.stdout
    # A complete search run again runs nothing, and keeps its rows.
    result = sweep_in("resume", out, *LOCAL)
    assert result.returncode == 0 and "already complete" in result.stdout, result.stderr
    assert compared(rows_of(out)) == compared(rows)


def test_a_guided_search_resumed_in_pieces_decides_as_one_left_alone(guided, tmp_path):
    spec, whole = guided
    pieces = tmp_path / "pieces"
    journal = pieces / "journal.jsonl"

    def state() -> str:
        return json.loads((pieces / "snapshot.json").read_text())["snapshot"]["state"]

    # Batches are 12: the first piece stops inside batch 1 (17), the next runs the rest of
    # that batch alone (to 24, its end), the last resumes from there to the end.
    assert sweep_cli("run", spec, "--out", pieces, *LOCAL, "--max-trials", "17") == 0
    assert len(journal.read_text().splitlines()) == 17 and state() != "complete"
    assert sweep_cli("resume", pieces, *LOCAL, "--max-trials", "7") == 0
    assert len(journal.read_text().splitlines()) == 24 and state() != "complete"
    assert sweep_cli("resume", pieces, *LOCAL) == 0
    assert state() == "complete"
    assert compared(rows_of(pieces)) == compared(rows_of(whole))
    # exactly once: no config ran twice across the pieces
    journaled = [json.loads(line)["index"] for line in journal.read_text().splitlines()]
    assert sorted(journaled) == list(range(432))


@pytest.mark.slow  # real signals; the resume rule itself is checked in pieces above
def test_a_search_stopped_by_signals_resumes_to_the_same_rows(tmp_path):
    spec = simulate_spec(tmp_path / "s.yaml", space=SPACE, search=GUIDED,
                         simulate={"trial_ms": 40})
    whole, out = tmp_path / "whole", tmp_path / "stopped" / "run"
    assert sweep_cli("run", spec, "--out", whole, *LOCAL) == 0
    journal = out / "journal.jsonl"
    for sig, args in ((signal.SIGINT, ["run", spec, "--out", out]),
                      (signal.SIGKILL, ["resume", out])):
        grown = (journal.stat().st_size if journal.exists() else 0) + 1000
        proc = start(args, out, list(LOCAL))
        # a few more trials journaled: the signal lands mid-search
        wait_until(lambda n=grown: has_records(out) and journal.stat().st_size > n, proc)
        os.killpg(proc.pid, sig)
        proc.communicate(timeout=60)
        assert proc.returncode == (130 if sig == signal.SIGINT else -sig), stderr_of(out)
    result = sweep_in("resume", out, *LOCAL)
    assert result.returncode == 0 and "complete —" in result.stdout, result.stderr
    assert compared(rows_of(out)) == compared(rows_of(whole))


def test_a_replayed_gpu_table_searched_in_pieces_makes_the_offline_replays_decisions(
        tmp_path):
    spec = replay_600(tmp_path, {"strategy": "guided", "seed": 2, "batch": 16,
                                 "warm_start": 0})
    whole, pieces = tmp_path / "whole", tmp_path / "pieces"
    assert sweep_cli("run", spec, "--out", whole, *LOCAL) == 0
    # stopped inside a batch (of 16), then resumed to the end
    assert sweep_cli("run", spec, "--out", pieces, *LOCAL, "--max-trials", "40") == 0
    assert json.loads((pieces / "snapshot.json").read_text())["snapshot"]["state"] != "complete"
    assert sweep_cli("resume", pieces, *LOCAL) == 0
    assert json.loads((pieces / "snapshot.json").read_text())["snapshot"]["state"] == "complete"
    rows = rows_of(whole)
    assert compared(rows_of(pieces)) == compared(rows)
    ran = {r["index"] for r in rows if r["status"] != "pruned"}
    assert ran == offline(spec, ROOT / "benchmarks/tables/matmul600-h200.parquet", 16)
    recorded = {r["config"]: r for r in pq.read_table(
        ROOT / "benchmarks/tables/matmul600-h200.parquet").to_pylist()}
    for r in rows:
        if r["status"] != "pruned":
            assert (r["status"], r["latency_ms"]) == \
                (recorded[r["config"]]["status"], recorded[r["config"]]["latency_ms"])


def test_halving_screens_a_sample_and_picks_among_it(tmp_path):
    search = {"strategy": "halving", "seed": 1, "sample": 0.25, "eta": 2}
    spec = simulate_spec(tmp_path / "s.yaml", space=SPACE, search=search,
                         simulate={"workers": 2})
    out = tmp_path / "run"
    result = sweep_in("run", spec, "--out", out, *LOCAL)
    assert result.returncode == 0, result.stderr
    rows = rows_of(out)
    ran = {r["index"] for r in rows if r["status"] != "pruned"}
    assert len(ran) == 108  # a quarter of 432
    assert "rung 1: re-timing the 54 fastest" in result.stderr
    best = json.loads((out / "best.json").read_text())
    assert best["index"] in ran and len(best["finalists"]) == 5
    assert rungs(len(ran), 2, 5) == [54, 27, 14, 7]  # all 108 worked; then 5 finalists
    # The sample is the seed's: another seed screens others.
    space = load_spec(spec).expand()
    other = Halving(space, SearchOptions("halving", seed=2, sample=0.25)).propose({}, [], set())
    assert other is not None and set(other) != ran


def test_retry_pruned_runs_every_config_the_search_left_out(guided, tmp_path):
    out = copy_of(guided[1], tmp_path)
    before = {r["index"]: r for r in rows_of(out)}
    assert sweep_cli("resume", out, *LOCAL, "--retry", "pruned") == 0
    after = rows_of(out)
    assert all(r["status"] == "ok" for r in after)
    for r in after:  # what ran before is kept as it was
        if before[r["index"]]["status"] != "pruned":
            assert r["latency_ms"] == before[r["index"]]["latency_ms"]


def test_a_batch_is_decided_without_the_outcomes_of_the_batch_before_it(tmp_path):
    spec = load_spec(simulate_spec(tmp_path / "s.yaml", space=SPACE, search={
        **GUIDED, "budget": 1.0, "patience": 1.0}))
    space = spec.expand()

    def batches(latency) -> list[list[int]]:
        search = Search(Guided(space, spec.search, 12), {})
        queue = search.advance()
        while queue and len(search.batches) < 6:
            for i in queue:
                search.known[i] = latency(i)
            queue = search.advance()
        return search.batches

    a = batches(lambda i: 1.0 + (i % 7) / 10)
    assert a == batches(lambda i: 1.0 + (i % 7) / 10)  # deterministic
    # Batch 3's outcomes differ: batches up to 4 are the same, batch 5 is not.
    batch3 = set(a[3])
    b = batches(lambda i: (0.5 if i in batch3 else 1.0 + (i % 7) / 10))
    assert b[:5] == a[:5] and b[5] != a[5]
    assert len({i for batch in a for i in batch}) == sum(map(len, a))  # none twice


def test_a_guided_search_stops_once_batches_stop_improving(tmp_path):
    spec = load_spec(simulate_spec(tmp_path / "s.yaml", space=SPACE, search={
        "strategy": "guided", "budget": 1.0, "batch": 12, "patience": 0.1}))
    space = spec.expand()
    search = Search(Guided(space, spec.search, 12), {})
    queue = search.advance()
    while queue:
        for i in queue:  # nothing beats the first config
            search.known[i] = 1.0 if i != queue[0] or search.known else 0.5
        queue = search.advance()
    # the best came in batch 0; then ceil(0.1 * 432 / 12) = 4 batches without a gain
    assert search.settled() and len(search.batches) == 2 + 4


def test_search_options_are_checked_like_the_rest_of_the_spec(tmp_path):
    cases = [({"strategy": "random"}, "search.strategy: expected one of exhaustive, "
                                      "halving, guided"),
             ({"strategy": "guided", "eta": 3}, "search.eta: applies to strategy halving"),
             ({"strategy": "halving", "budget": 0.1}, "search.budget: applies to strategy "
                                                      "guided"),
             ({"strategy": "guided", "budget": 0}, "search.budget: expected a fraction"),
             ({"strategy": "guided", "speed": 1}, "search.speed: unknown key"),
             ({"strategy": "exhaustive", "warm_start": 3},
              "search.warm_start: applies to strategy guided and halving only"),
             (5, "search: expected a strategy (exhaustive, halving, guided) or a mapping")]
    for search, message in cases:
        spec = simulate_spec(tmp_path / "bad.yaml", search=search)
        result = sweep_in("run", spec, "--out", tmp_path / "never")
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
        assert not (tmp_path / "never").exists()
    plain = simulate_spec(tmp_path / "plain.yaml")
    short = simulate_spec(tmp_path / "short.yaml", search="guided")
    assert load_spec(short).search == SearchOptions("guided")
    # An exhaustive run keeps the fingerprint it had before search existed.
    assert load_spec(plain).fingerprint == load_spec(
        simulate_spec(tmp_path / "ex.yaml", search="exhaustive")).fingerprint
    assert load_spec(plain).fingerprint != load_spec(short).fingerprint


def test_warm_start_times_the_nearest_cached_sweeps_top_configs_first(tmp_path):
    warm = {**GUIDED, "warm_start": 8}
    first = simulate_spec(tmp_path / "a.yaml", space=SPACE, search=GUIDED,
                          problem={"M": 1024, "N": 1024, "K": 1024})
    assert sweep_cli("run", first, "--out", tmp_path / "a", *LOCAL) == 0
    top = sorted((r for r in rows_of(tmp_path / "a") if r["status"] == "ok"),
                 key=lambda r: r["latency_ms"])
    best = json.loads((tmp_path / "a" / "best.json").read_text())
    # A far problem is cached too: the nearer one is taken.
    far = simulate_spec(tmp_path / "c.yaml", space=SPACE, search=GUIDED,
                        problem={"M": 64, "N": 64, "K": 64})
    assert sweep_cli("run", far, "--out", tmp_path / "c", *LOCAL) == 0
    second = simulate_spec(tmp_path / "b.yaml", space=SPACE, search=warm,
                           problem={"M": 2048, "N": 1024, "K": 1024})
    out = tmp_path / "b"
    result = sweep_in("run", second, "--out", out, *LOCAL)
    assert result.returncode == 0, result.stderr
    assert f"warm start: 8 configs from {tmp_path / 'a'}" in result.stderr
    warm = json.loads((out / "run.json").read_text())["search"]["warm"]
    space = load_spec(second).expand()
    assert warm[0] == indices_of(space, [best["config"]])[0]
    assert set(warm) == set(indices_of(space, [json.loads(r["config"]) for r in top[:8]]))
    ran = {r["index"] for r in rows_of(out) if r["status"] != "pruned"}
    assert set(warm) <= ran


def test_the_nearest_problem_is_by_size_ratio_and_other_keys_count_as_far():
    assert distance({"M": 1024}, {"M": 2048}) == 1.0
    assert distance({"M": 1024, "dtype": "float16"}, {"M": 1024, "dtype": "float32"}) == 4.0
    assert distance({"M": 1024}, {"M": 1024, "K": 8}) == 4.0


def test_a_retry_on_a_searched_run_decides_its_pruned_rows_again(tmp_path):
    spec = simulate_spec(tmp_path / "s.yaml", space=SPACE, search=GUIDED,
                         simulate={"fail_rate": 0.2})
    out = tmp_path / "run"
    assert sweep_cli("run", spec, "--out", out, *LOCAL) == 0
    before = rows_of(out)
    assert sweep_cli("resume", out, *LOCAL, "--retry", "compile_error") == 0
    after = rows_of(out)
    # The simulated failures fail again, so the search decides as before: its pruned rows
    # stand (decided again, not written again), the failures have a second attempt.
    assert compared(after) == compared(before)
    assert {r["attempt"] for r in after if r["status"] == "compile_error"} == {2}
    assert {r["attempt"] for r in after if r["status"] != "compile_error"} == {1}
    lines = (out / "journal.jsonl").read_text().splitlines()
    failed = sum(r["status"] == "compile_error" for r in before)
    assert len(lines) == 432 + failed
    result = sweep_in("resume", out, *LOCAL)  # and then nothing
    assert "already complete" in result.stdout, result.stderr


def test_a_config_the_search_runs_supersedes_a_pruned_row_and_counts_once(guided, tmp_path):
    # As after a retry that changed an outcome and was stopped: the journal holds a pruned
    # row for a config the search now runs. Resumed, it runs once and counts once.
    out = copy_of(guided[1], tmp_path)
    whole = rows_of(out)
    lines = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    ran = next(line for line in lines if line["status"] == "ok")
    ran.update(status="pruned", latency_ms=None, latency_p20_ms=None, latency_p80_ms=None,
               device="", node="", worker="")
    (out / "journal.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    for artefact in ("trials.parquet", "snapshot.json", "best.json"):
        (out / artefact).unlink()
    result = sweep_in("resume", out, *LOCAL)
    assert result.returncode == 0 and "complete — " in result.stdout, result.stderr
    rows = rows_of(out)
    assert compared(rows) == compared(whole)
    assert rows[ran["index"]]["attempt"] == 2  # its run superseded the pruned row
    snap = json.loads((out / "snapshot.json").read_text())["snapshot"]
    assert snap["done"] == 432 and snap["counts"] == dict(Counter(r["status"] for r in whole))
