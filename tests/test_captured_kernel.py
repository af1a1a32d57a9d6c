"""A capture as the kernel of a sweep (sweep_kernels/captured.py), from captures made by
hand here so that each rule is pinned apart from `sweep capture`: every (kernel, key) a
problem, launched on the call's own arguments (the index tensor as saved), validated against
the kernel's first config, one table with the kernel and key columns; a kernel that cannot
be imported or re-run fails its own rows and the others are tuned; a capture edited badly is
one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from conftest import sweep_proc

from storage.capture import (
    Arg,
    Call,
    Capture,
    CapturedConfig,
    TensorArg,
    save_blob,
    write_capture,
)

PROGRAMS = Path(__file__).parent / "programs"


def _call(directory: Path, kernel: str, n: int, seed: int, blocks=((16, 1), (32, 1), (64, 2)),
          index: np.ndarray | None = None) -> Call:
    rng = np.random.default_rng(seed)
    index = rng.permutation(n).astype(np.int64) if index is None else index
    digest = save_blob(directory, index.tobytes())
    configs = tuple(CapturedConfig({"BLOCK": b}, num_warps=w, num_stages=1,
                                   grid=(-(-n // b),)) for b, w in blocks)
    args = (Arg("x_ptr", TensorArg("float32", (n,), (1,), n)),
            Arg("y_ptr", TensorArg("float32", (n,), (1,), n)),
            Arg("idx_ptr", TensorArg("int64", (n,), (1,), n, blob=digest)), Arg("n", value=n))
    return Call(kernel=kernel, source="", key_names=("n",),
                key=(n, "torch.float32", "torch.float32", "torch.int64"),
                label=f"n={n}; float32/int64", configs=configs, args=args,
                outputs=("y_ptr",), root=str(PROGRAMS))


def _spec(directory: Path, calls: list[Call]) -> Path:
    write_capture(directory, Capture(program=("python", "app.py"), calls=tuple(calls),
                                     exit_code=0))
    problems = [{"kernel": c.kernel, "key": c.label} for c in calls]
    spec = directory / "spec.yaml"
    spec.write_text(json.dumps({
        "name": "hand", "kernel": "capture:capture.json", "problems": problems,
        "space": {"BLOCK": [16, 32, 64], "num_warps": [1, 2], "num_stages": [1]},
        "timing": {"warmup_ms": 1, "rep_ms": 3, "screen": "off"},
        "run": {"backend": "interpret", "workers": 1, "finalists": 0}}))
    return spec


def test_every_captured_call_is_a_problem_tuned_on_its_own_arguments(tmp_path):
    capture = tmp_path / "cap"
    capture.mkdir()
    spec = _spec(capture, [_call(capture, "hand_kernels:gather2", 40, 1),
                           _call(capture, "hand_kernels:gather2", 90, 2)])
    done = sweep_proc("run", spec, "--out", tmp_path / "run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    table = pq.read_table(tmp_path / "run" / "trials.parquet").to_pylist()
    assert [r["index"] for r in table] == list(range(12))
    assert {r["kernel"] for r in table} == {"hand_kernels:gather2"}
    assert [r["key"] for r in table] == ["n=40; float32/int64"] * 6 + ["n=90; float32/int64"] * 6
    # The configs the kernel has (its grid known) run and match the first config's output;
    # those it does not have (BLOCK 16 with 2 warps...) say why.
    ok = [(r["BLOCK"], r["num_warps"]) for r in table[:6] if r["status"] == "ok"]
    assert ok == [(16, 1), (32, 1), (64, 2)]
    assert all(r["validation"] == "passed" for r in table if r["status"] == "ok")
    assert all("grid is not known" in r["error"] for r in table if r["status"] != "ok")
    # The run's copy of the spec names the capture absolutely: resumable from anywhere.
    assert f"capture:{capture.resolve()}/capture.json" in (tmp_path / "run" /
                                                           "spec.yaml").read_text()


def test_a_config_that_writes_wrong_output_is_incorrect_against_the_first_config(tmp_path):
    """The reference is the kernel's first config on the same inputs: a capture whose
    second config launches too small a grid leaves output unwritten (the made-up values
    still there where the first config wrote its result), refused."""
    capture = tmp_path / "cap"
    capture.mkdir()
    call = _call(capture, "hand_kernels:gather2", 90, 3)
    short = CapturedConfig({"BLOCK": 32}, num_warps=1, num_stages=1, grid=(1,))
    call = Call(**{**call.__dict__, "configs": (call.configs[0], short)})
    spec = _spec(capture, [call])
    done = sweep_proc("run", spec, "--out", tmp_path / "run", cwd=tmp_path)
    rows = {(r["BLOCK"], r["num_warps"]): r
            for r in pq.read_table(tmp_path / "run" / "trials.parquet").to_pylist()}
    assert rows[(16, 1)]["status"] == "ok", done.stderr
    assert rows[(32, 1)]["status"] == "incorrect"
    assert "differs from the reference" in rows[(32, 1)]["error"]


def test_a_kernel_that_cannot_be_imported_fails_its_rows_and_the_others_are_tuned(tmp_path):
    capture = tmp_path / "cap"
    capture.mkdir()
    spec = _spec(capture, [_call(capture, "hand_kernels:gather2", 40, 1),
                           _call(capture, "gone_kernels:gather2", 40, 1)])
    done = sweep_proc("run", spec, "--out", tmp_path / "run", cwd=tmp_path)
    rows = pq.read_table(tmp_path / "run" / "trials.parquet").to_pylist()
    mine = [r for r in rows if r["kernel"] == "hand_kernels:gather2"]
    gone = [r for r in rows if r["kernel"] == "gone_kernels:gather2"]
    assert sum(r["status"] == "ok" for r in mine) == 3, done.stderr
    assert gone and all(r["status"] == "runtime_error" for r in gone)
    assert all("gone_kernels" in r["error"] for r in gone)


def test_a_pre_hook_that_cannot_be_re_run_fails_that_kernels_rows_saying_so(tmp_path):
    capture = tmp_path / "cap"
    capture.mkdir()
    spec = _spec(capture, [_call(capture, "hand_kernels:hooked", 40, 1,
                                 blocks=((16, 1), (32, 1))),
                           _call(capture, "hand_kernels:gather2", 40, 1)])
    sweep_proc("run", spec, "--out", tmp_path / "run", cwd=tmp_path)
    rows = pq.read_table(tmp_path / "run" / "trials.parquet").to_pylist()
    hooked = [r for r in rows if r["kernel"] == "hand_kernels:hooked"]
    assert hooked and all(r["status"] != "ok" for r in hooked)
    said = [(r["BLOCK"], r["num_warps"]) for r in hooked
            if "needs the program's state" in r["error"]]
    assert said == [(16, 1), (32, 1)]  # the configs it has; the others' grids are unknown
    assert sum(r["status"] == "ok" for r in rows if r["kernel"] == "hand_kernels:gather2") == 3


def test_a_capture_edited_badly_is_one_line_and_exit_2(tmp_path):
    capture = tmp_path / "cap"
    capture.mkdir()
    spec = _spec(capture, [_call(capture, "hand_kernels:gather2", 40, 1)])
    doc = json.loads((capture / "capture.json").read_text())
    doc["calls"][0]["configs"][1]["num_warps"] = "four"
    (capture / "capture.json").write_text(json.dumps(doc))
    done = sweep_proc("run", spec, "--out", tmp_path / "run", cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "calls[0].configs[1].num_warps: expected an integer" in \
        lines[0], done.stderr
    assert not (tmp_path / "run").exists()


def test_a_problem_the_capture_does_not_hold_is_one_line_and_exit_2(tmp_path):
    capture = tmp_path / "cap"
    capture.mkdir()
    spec = _spec(capture, [_call(capture, "hand_kernels:gather2", 40, 1)])
    doc = json.loads(spec.read_text())
    doc["problems"].append({"kernel": "hand_kernels:gather2", "key": "n=41"})
    spec.write_text(json.dumps(doc))
    done = sweep_proc("run", spec, "--out", tmp_path / "run", cwd=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "problems[1]: the capture holds no call of 'hand_kernels:gather2' with key " \
           "'n=41'" in done.stderr


def test_a_capture_compares_outputs_at_their_own_scale_a_torch_reference_absolutely():
    """Outputs summed in another order differ by rounding at the output's largest value:
    a capture's atol is a fraction of it (at least 1); a Kernel record's stays absolute."""
    import torch

    from sweep_kernels.captured import CapturedKernel
    from sweep_kernels.record import Kernel

    big = torch.tensor([4800.0, -3.0, float("nan")])
    captured = CapturedKernel(name="c", fn=None, problem_defaults={}, make_inputs=None,
                              reference=None, launch_args=None, grid=None)
    assert captured.atol_scale(big) == 4800.0
    assert captured.atol_scale(torch.tensor([0.25, -0.5])) == 1.0
    plain = Kernel(name="k", fn=None, problem_defaults={}, make_inputs=None, reference=None,
                   launch_args=None, grid=None)
    assert plain.atol_scale(big) == 1.0


def test_a_launch_finds_its_config_by_its_values_whatever_its_place_in_the_list():
    """One lookup per launch (it runs inside the timed region of short kernels): every
    config of the list is found from the launch's keywords, Triton's defaults filled in
    where a spec's config leaves them out, and a config not in the list is none."""
    import triton

    from sweep_kernels.captured import _Launcher

    configs = [triton.Config({"BLOCK": b}, num_warps=w, num_stages=1)
               for b in (16, 32, 64) for w in (1, 2)]
    tuner = type("Tuner", (), {"configs": configs})()
    launcher = _Launcher(tuner)
    for config in configs:
        keywords = {"x_ptr": object(), "n": 7, "BLOCK": config.kwargs["BLOCK"],
                    "num_warps": config.num_warps, "num_stages": 1}
        assert launcher._config(keywords) is config
    assert launcher._config({"BLOCK": 128, "num_warps": 1, "num_stages": 1}) is None


def test_a_capture_that_is_not_json_is_one_line_and_exit_2(tmp_path):
    capture = tmp_path / "cap"
    capture.mkdir()
    spec = _spec(capture, [_call(capture, "hand_kernels:gather2", 40, 1)])
    (capture / "capture.json").write_text('{"format": 1, "calls": [')
    done = sweep_proc("run", spec, "--out", tmp_path / "run", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "capture.json" in done.stderr
