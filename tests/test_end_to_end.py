"""Real sweeps: the quickstart under Triton's interpreter as a user runs it (a process of
its own, in the slow tier), and simulate-backend sweeps whose results are known in
advance, on the local runtime."""

import json

import duckdb
import pandas as pd
import polars as pl
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, simulate_spec, sweep_cli, sweep_proc, user_folders

from actors.simulate import draws
from sweep.spec import load_spec

QUICKSTART = ROOT / "configs" / "quickstart.yaml"


@pytest.mark.slow  # the quickstart as a process; test_report's runs it in-process
def test_quickstart_runs_real_kernels_and_writes_the_run_directory(tmp_path):
    # `python -m` puts the current directory first on sys.path: a user's folders there must
    # not replace this project's packages.
    out = tmp_path / "qs"
    result = sweep_proc("run", QUICKSTART, "--out", out, "--runtime", "local",
                        cwd=user_folders(tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr
    assert "complete" in result.stdout and "best: #" in result.stdout

    space = load_spec(QUICKSTART).expand()
    table = pq.read_table(out / "trials.parquet")
    rows = table.to_pylist()
    assert [r["index"] for r in rows] == list(range(len(space)))
    for r in rows:  # each row is the config its index names
        assert json.loads(r["config"]) == space.config(r["index"])
        assert {k: r[k] for k in space.names} == space.config(r["index"])
    statuses = {r["index"]: r["status"] for r in rows}
    assert {statuses[r["index"]] for r in rows if r["BLOCK_K"] == 48} == {"compile_error"}
    assert {statuses[r["index"]] for r in rows if r["BLOCK_K"] != 48} == {"ok"}
    assert all(r["validation"] == "passed" for r in rows if r["status"] == "ok")
    assert {r["device"] for r in rows} == {"cpu-interpreter"}

    meta = table.schema.metadata
    assert json.loads(meta[b"versions"])["triton"]
    assert json.loads(meta[b"spec"])["kernel"] == "matmul"
    assert meta[b"fingerprint"].decode() == load_spec(QUICKSTART).fingerprint
    assert (out / "spec.yaml").read_text() == QUICKSTART.read_text()

    # the fastest five of the sweep are the finalists, not re-timed under the interpreter
    # (its timings say nothing of a GPU's): the one pass's fastest is the best
    best = json.loads((out / "best.json").read_text())
    ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: r["latency_ms"])
    fastest = ok[0]
    assert [f["index"] for f in best["finalists"]] == [r["index"] for r in ok[:5]]
    assert [f["sweep_latency_ms"] for f in best["finalists"]] == \
        [r["latency_ms"] for r in ok[:5]]
    chosen = min(best["finalists"], key=lambda f: f["latency_ms"])
    assert best["partial"] is False and best["index"] == chosen["index"]
    assert best["latency_ms"] == chosen["latency_ms"]
    assert best["config"] == json.loads(rows[chosen["index"]]["config"])
    snapshot = json.loads((out / "snapshot.json").read_text())["snapshot"]
    assert snapshot["state"] == "complete" and snapshot["done"] == len(space)

    # the table is plain Parquet for the usual readers
    assert len(pd.read_parquet(out / "trials.parquet")) == len(space)
    assert pl.read_parquet(out / "trials.parquet")["index"].to_list() == list(range(len(space)))
    query = f"select count(*), min(latency_ms) from '{out / 'trials.parquet'}' where status='ok'"
    assert duckdb.sql(query).fetchall() == [(len(ok), fastest["latency_ms"])]


def test_simulated_sweep_records_every_config_once_in_index_order(tmp_path):
    space = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64], "stages": [1, 2, 3],
             "layout": ["row", "col"]}
    spec = simulate_spec(tmp_path / "s.yaml", space=space,
                         constraints=["BLOCK_M * BLOCK_N <= 4096"],
                         simulate={"workers": 3, "fail_rate": 0.1, "trial_ms": 0.5, "seed": 7})
    assert sweep_cli("run", spec, "--out", tmp_path / "run") == 0
    expanded = load_spec(spec).expand()
    rows = pq.read_table(tmp_path / "run" / "trials.parquet").to_pylist()
    assert [r["index"] for r in rows] == list(range(len(expanded)))
    for r in rows:
        config = json.loads(r["config"])
        assert config == expanded.config(r["index"])
        fate, spread = draws(7, config)
        assert r["status"] == ("compile_error" if fate < 0.1 else "ok")
        if r["status"] == "ok":
            assert r["latency_ms"] == 0.5 * (0.5 + spread)
    journal = [json.loads(line)["index"]
               for line in (tmp_path / "run" / "journal.jsonl").read_text().splitlines()]
    assert sorted(journal) == list(range(len(expanded)))


def test_report_summarises_a_finished_run(tmp_path, capsys):
    spec = simulate_spec(tmp_path / "s.yaml")
    assert sweep_cli("run", spec, "--out", tmp_path / "run") == 0
    capsys.readouterr()
    assert sweep_cli("report", tmp_path / "run", "--top", "2") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{tmp_path / 'run'}: complete · sim (matmul on simulated) · "
                             "40 of 40 trials · ok 40")
    best = json.loads((tmp_path / "run" / "best.json").read_text())
    assert out[1].startswith(f"winner: #{best['index']} ")
    header = next(i for i, line in enumerate(out) if line.startswith("top 2 of 40"))
    ranks = [line.split()[:3] for line in out[header + 2:header + 4]]
    assert ranks[0] == ["★", "1", f"#{best['index']}"] and ranks[1][0] == "2"
