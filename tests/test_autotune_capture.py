"""Capture (issue 35): a program's calls into its `@triton.autotune` kernels recorded one per
(kernel, key), in Python (`sweep.autotune.capture`) and by `sweep capture` around the
unchanged program, on the CPU interpreter: tests/programs/autotuned_app.py and its kernels
(a fused add + RMS norm writing two outputs, a gather by an int64 index)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import sweep_in, sweep_proc

import sweep.autotune
from storage.capture import read_blob, read_capture
from sweep.autotune.capture import spec_text

PROGRAMS = Path(__file__).parent / "programs"
BOOT = Path(__file__).resolve().parents[1] / "sweep" / "autotune" / "boot"
INDEX = [7, 2, 2, 9, 0]  # the app's index tensor
LABELS = ["N=24; float32", "N=48; float32", "D=16; float32/int64", "D=40; float32/int64"]


@pytest.fixture
def kernels(monkeypatch):
    """The app's kernels module, imported anew (fresh tuners, empty caches) for the CPU
    interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("AUTOTUNED_APP_CPU_BENCH", raising=False)
    monkeypatch.syspath_prepend(str(PROGRAMS))
    for name in ("autotuned_kernels", "autotuned_app"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import autotuned_app
    import autotuned_kernels

    yield types.SimpleNamespace(k=autotuned_kernels, app=autotuned_app)
    for name in ("autotuned_kernels", "autotuned_app"):
        sys.modules.pop(name, None)


@pytest.fixture
def app_dir(tmp_path) -> Path:
    """The app and its kernels, copied where a program of the user's would be."""
    where = tmp_path / "app"
    where.mkdir()
    for name in ("autotuned_app.py", "autotuned_kernels.py"):
        shutil.copy(PROGRAMS / name, where)
    return where


def by_label(capture):
    return {c.label: c for c in capture.calls}


def arg(call, name):
    return next(a for a in call.args if a.name == name)


def test_each_kernel_and_key_is_recorded_once(kernels, tmp_path):
    with sweep.autotune.capture(tmp_path / "cap") as recorder:
        kernels.app.main([])
        kernels.app.main([])  # the same keys again: nothing new
    calls = recorder.capture.calls
    assert [c.label for c in calls] == LABELS
    assert [c.kernel for c in calls] == ["autotuned_kernels:add_norm"] * 2 + \
        ["autotuned_kernels:gather_rows"] * 2
    norm = calls[0]
    assert norm.key == (24, *["torch.float32"] * 5) and norm.key_names == ("N",)
    assert norm.source == hashlib.sha256((PROGRAMS / "autotuned_kernels.py").read_bytes()) \
        .hexdigest()
    assert [a.name for a in norm.args] == ["x_ptr", "r_ptr", "w_ptr", "sum_ptr", "out_ptr",
                                          "N", "eps"]
    assert (arg(norm, "N").value, arg(norm, "eps").value) == (24, 1e-6)
    assert [c.as_spec() for c in norm.configs] == [
        {"BLOCK": 16, "num_warps": 1, "num_stages": 3, "num_ctas": 1},
        {"BLOCK": 32, "num_warps": 2, "num_stages": 3, "num_ctas": 1},
        {"BLOCK": 64, "num_warps": 4, "num_stages": 2, "num_ctas": 1}]
    assert {c.device for c in calls} == {"cpu"} and recorder.capture.skipped == ()


def test_capture_json_reads_back_as_recorded(kernels, tmp_path):
    with sweep.autotune.capture(tmp_path / "cap") as recorder:
        kernels.app.main([])
    assert read_capture(tmp_path / "cap") == recorder.capture
    assert recorder.capture.exit_code == 0 and recorder.capture.versions["triton"]


def test_the_index_tensor_is_saved_exactly_and_floats_by_geometry(kernels, tmp_path):
    with sweep.autotune.capture(tmp_path / "cap") as recorder:
        kernels.app.main([])
    gather = by_label(recorder.capture)["D=16; float32/int64"]
    index = arg(gather, "index_ptr").tensor
    assert (index.dtype, index.shape, index.strides, index.storage) == ("int64", (5,), (1,), 5)
    import torch

    assert read_blob(tmp_path / "cap", index.blob, 40) == \
        torch.tensor(INDEX, dtype=torch.int64).numpy().tobytes()
    table = arg(gather, "table_ptr").tensor
    assert (table.dtype, table.shape, table.strides, table.storage, table.blob) == \
        ("float32", (10, 16), (16, 1), 160, "")
    assert all(a.tensor.blob == "" for c in recorder.capture.calls for a in c.args
               if a.tensor is not None and a.tensor.dtype == "float32")


def test_a_saved_tensor_is_recorded_as_its_contiguous_bytes_a_remade_one_with_its_strides(
        kernels, tmp_path):
    import torch

    big = torch.arange(400, dtype=torch.float32).reshape(10, 40)
    table, index = big[:, 8:24], torch.tensor(INDEX)  # a view: strides (40, 1), offset 8
    for save_floats, cap in ((False, tmp_path / "geometry"), (True, tmp_path / "whole")):
        with sweep.autotune.capture(cap, save_floats=save_floats) as recorder:
            kernels.k.gather(table, index)
        kept = arg(recorder.capture.calls[0], "table_ptr").tensor
        if save_floats:
            assert (kept.strides, kept.storage) == ((16, 1), 160)
            assert read_blob(cap, kept.blob, 640) == table.contiguous().numpy().tobytes()
        else:
            assert (kept.strides, kept.storage, kept.blob) == ((40, 1), 392, "")
        kernels.k.gather_rows.cache.clear()


def test_outputs_are_the_tensors_one_launch_wrote(kernels, tmp_path):
    with sweep.autotune.capture(tmp_path / "cap") as recorder:
        kernels.app.main([])
    calls = by_label(recorder.capture)
    assert calls["N=48; float32"].outputs == ("sum_ptr", "out_ptr")
    assert calls["D=40; float32/int64"].outputs == ("out_ptr",)


def test_a_grid_function_is_evaluated_for_each_config_heuristics_included(kernels, tmp_path):
    with sweep.autotune.capture(tmp_path / "cap") as recorder:
        kernels.app.main([])
    calls = by_label(recorder.capture)
    # 5 rows; D=40 in blocks of 8, 16, 32 (the kernel's EVEN_D comes from a heuristic:
    # without it the kernel's arguments could not be bound for the grid function).
    assert [c.grid for c in calls["D=40; float32/int64"].configs] == [(5, 5), (5, 3), (5, 2)]
    assert [c.grid for c in calls["N=24; float32"].configs] == [(3,)] * 3  # a tuple as given


def test_no_tune_runs_the_first_config_and_puts_the_tuner_back(kernels, tmp_path):
    tuner = kernels.k.add_norm
    benched = []
    own = tuner.__dict__["do_bench"] = lambda *a, **k: benched.append(a) or [1.0] * 3
    with sweep.autotune.capture(tmp_path / "cap", no_tune=True):
        kernels.app.main([])
    assert len(tuner.cache) == 2 and all(c is tuner.configs[0] for c in tuner.cache.values())
    assert benched == [] and tuner.__dict__["do_bench"] is own
    assert "do_bench" not in kernels.k.gather_rows.__dict__


def test_under_the_interpreter_no_tune_is_implied_and_said_once(kernels, tmp_path, capsys):
    with sweep.autotune.capture(tmp_path / "cap") as recorder:
        kernels.app.main([])  # Triton's own tuning would raise here: no active driver
    assert recorder.no_tune
    err = capsys.readouterr().err
    assert err.count("TRITON_INTERPRET=1: Triton cannot benchmark") == 1


def test_a_call_over_the_size_limit_is_not_captured_and_said(kernels, tmp_path, capsys):
    # Each gather call saves its 40-byte index: the second passes 50 bytes.
    with sweep.autotune.capture(tmp_path / "cap", max_bytes=50) as recorder:
        kernels.app.main([])
    line = ("sweep capture: autotuned_kernels:gather_rows (D=40; float32/int64): its saved "
            "tensors would pass the 50-byte limit (--max-bytes); not captured")
    assert line in capsys.readouterr().err.splitlines()
    assert [c.label for c in recorder.capture.calls] == LABELS[:3]
    assert recorder.capture.skipped == (line.removeprefix("sweep capture: "),)


def test_a_tuner_no_module_attribute_holds_is_skipped_once_with_its_line(kernels, tmp_path,
                                                                       capsys):
    import torch

    with sweep.autotune.capture(tmp_path / "cap") as recorder:
        unheld = kernels.k.make_unheld()
        for _ in range(2):
            unheld[(2,)](torch.ones(20), 20)
    said = [line for line in capsys.readouterr().err.splitlines() if "double" in line]
    assert said == ["sweep capture: autotuned_kernels.make_unheld.<locals>.double: no "
                    "attribute of its module holds its autotuner (made in a function?): a "
                    "worker could not import it; not captured"]
    assert recorder.capture.calls == () and len(recorder.capture.skipped) == 1
    assert read_capture(tmp_path / "cap").skipped == recorder.capture.skipped


@pytest.fixture
def fake_tuner(monkeypatch):
    """An object shaped as Triton's Autotuner is (what the listener reads of one), held by
    a module's attribute: for calls no real kernel could take."""
    import triton

    module = types.ModuleType("labelled_kernels")

    def scale(x, N, BLOCK):  # stands in for the JIT function under the tuner
        pass

    scale.__module__ = module.__name__
    module.scale = types.SimpleNamespace(
        fn=types.SimpleNamespace(fn=scale), arg_names=["x", "N", "BLOCK"], keys=["N"],
        configs=[triton.Config({"BLOCK": 8})], cache={}, reset_to_zero=[], restore_value=[])
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module.scale


def test_a_second_key_with_the_same_label_is_numbered(fake_tuner, tmp_path):
    with sweep.autotune.capture(tmp_path / "cap") as recorder:
        for n in (4, "4", 4):  # 4 and "4": two keys, one label
            recorder.around(fake_tuner, (1.5, n), {"grid": (1,), "warmup": False},
                            lambda: None)
    assert [c.label for c in recorder.capture.calls] == ["N=4", "N=4 #2"]


def test_an_argument_neither_tensor_nor_scalar_is_not_captured_and_said(fake_tuner, tmp_path,
                                                                       capsys):
    ran = []
    with sweep.autotune.capture(tmp_path / "cap") as recorder:
        recorder.around(fake_tuner, ([1.5], 4), {"grid": (1,), "warmup": False},
                        lambda: ran.append(True))
    line = ("sweep capture: labelled_kernels:scale (N=4): argument x is a builtins.list, "
            "neither a tensor nor a scalar capture.json can hold; not captured")
    assert line in capsys.readouterr().err.splitlines()
    assert ran == [True] and recorder.capture.calls == ()  # the call itself went on
    from triton.runtime.autotuner import Autotuner

    assert not hasattr(Autotuner.run, "__wrapped__")  # the listener is gone with the block


def test_the_spec_names_each_call_a_problem_with_its_kernels_configs(kernels, tmp_path):
    with sweep.autotune.capture(tmp_path / "cap") as recorder:
        kernels.app.main([])
    spec = yaml.safe_load((tmp_path / "cap" / "spec.yaml").read_text())
    assert spec["kernel"] == "capture:capture.json"
    assert spec["validation"] == {"rtol": 0.01, "atol": 0.01}
    assert [(p["kernel"], p["key"]) for p in spec["problems"]] == \
        [(c.kernel, c.label) for c in recorder.capture.calls]
    assert spec["problems"][2]["configs"][1] == \
        {"BLOCK_D": 16, "num_warps": 2, "num_stages": 3, "num_ctas": 1}
    # A bfloat16 output loosens the tolerances (the kernels' float32 made bfloat16 here).
    first = recorder.capture.calls[0]
    bf16 = replace(first, args=tuple(
        replace(a, tensor=replace(a.tensor, dtype="bfloat16")) if a.tensor else a
        for a in first.args))
    text = spec_text(tmp_path, replace(recorder.capture, calls=(bf16,)))
    assert yaml.safe_load(text)["validation"] == {"rtol": 0.02, "atol": 0.02}


def test_sweep_capture_runs_the_program_unchanged_and_records_its_calls(app_dir, tmp_path):
    env = {"TRITON_INTERPRET": "1", "AUTOTUNED_APP_CPU_BENCH": "1"}
    alone = subprocess.run([sys.executable, "autotuned_app.py"], cwd=app_dir, text=True,
                           capture_output=True, env={**__import__("os").environ, **env})
    cap = tmp_path / "cap"
    done = sweep_proc("capture", "--out", cap, "--", sys.executable, "autotuned_app.py",
                      cwd=app_dir, env=env)
    assert done.returncode == 0, done.stderr
    # Its checksum: the same but for float rounding (Triton's tuning picks whichever
    # config the clock favours; the capture runs the first).
    ran, said = (float(out.splitlines()[0].removeprefix("checksum ")) for out in
                 (alone.stdout, done.stdout))
    assert abs(ran - said) < 1e-3 and ran != 0
    assert done.stdout.splitlines()[1] == (
        f"captured 4 calls of 2 kernels in {cap}; tune them: sweep run {cap}/spec.yaml "
        "--out RUN")
    capture = read_capture(cap)
    assert [c.label for c in capture.calls] == LABELS
    assert capture.program == (sys.executable, "autotuned_app.py") and capture.exit_code == 0
    assert yaml.safe_load((cap / "spec.yaml").read_text())["name"] == "capture-autotuned_app"


def test_the_programs_exit_code_is_passed_on_and_its_capture_kept(app_dir, tmp_path,
                                                                monkeypatch):
    monkeypatch.chdir(app_dir)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cap = tmp_path / "cap"
    done = sweep_in("capture", "--out", cap, "--", sys.executable, "autotuned_app.py",
                    "--exit", "3")
    assert done.returncode == 3
    assert done.stderr.splitlines()[-1] == (
        f"sweep capture: {sys.executable} autotuned_app.py --exit 3 exited with 3; captured "
        f"4 calls of 2 kernels in {cap} (kept)")
    capture = read_capture(cap)
    assert capture.exit_code == 3 and len(capture.calls) == 4


def test_the_options_reach_the_program(app_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(app_dir)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cap = tmp_path / "cap"
    # Floats saved too: the first call's 1,248 bytes fit in 2,000, the second's do not.
    done = sweep_in("capture", "--out", cap, "--save-floats", "--max-bytes", "2000", "--",
                    sys.executable, "autotuned_app.py")
    assert done.returncode == 0, done.stderr
    capture = read_capture(cap)
    assert all(a.tensor.blob for a in capture.calls[0].args if a.tensor is not None)
    assert capture.skipped[0] == ("autotuned_kernels:add_norm (N=48; float32): its saved "
                                  "tensors would pass the 2000-byte limit (--max-bytes); not "
                                  "captured")


def test_a_program_killed_by_a_signal_exits_as_a_shell_says(tmp_path):
    done = sweep_in("capture", "--out", tmp_path / "cap", "--", sys.executable, "-c",
                    "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert done.returncode == 143
    assert done.stderr.splitlines()[-1].endswith("exited with 143; captured 0 calls of 0 "
                                                 f"kernels in {tmp_path / 'cap'} (kept)")


def test_max_bytes_must_be_a_whole_number(tmp_path):
    done = sweep_in("capture", "--out", tmp_path / "cap", "--max-bytes", "lots", "--",
                    sys.executable, "-c", "pass")
    assert (done.returncode, done.stderr) == (2, "error: --max-bytes: expected a whole "
                                                 "number of bytes; got 'lots' (sweep capture "
                                                 "--help says more)\n")
    assert not (tmp_path / "cap").exists()


def test_a_program_that_calls_no_autotuned_kernel_is_said_so(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cap = tmp_path / "cap"
    done = sweep_in("capture", "--out", cap, "--", sys.executable, "-c", "pass")
    assert done.returncode == 0
    assert done.stderr.splitlines()[-1] == (
        f"sweep capture: {sys.executable} -c pass made no call into an autotuned kernel that "
        f"could be captured; nothing captured in {cap}")
    assert read_capture(cap).calls == () and not (cap / "spec.yaml").exists()


def test_a_folder_that_is_not_a_capture_is_refused_untouched(tmp_path):
    cap = tmp_path / "cap"
    cap.mkdir()
    (cap / "notes.txt").write_text("mine")
    ran = tmp_path / "ran"
    done = sweep_in("capture", "--out", cap, "--", sys.executable, "-c",
                    f"open({str(ran)!r}, 'w')")
    assert done.returncode == 2 and not ran.exists()
    assert done.stderr == (f"error: --out {cap}: not empty and not a capture (it holds "
                           "notes.txt); choose a new or empty folder\n")
    assert [p.name for p in cap.iterdir()] == ["notes.txt"]


def test_an_earlier_capture_is_refused_and_with_force_moved_aside(kernels, tmp_path):
    cap = tmp_path / "cap"
    with sweep.autotune.capture(cap):
        kernels.app.main([])
    before = (cap / "capture.json").read_bytes()
    done = sweep_in("capture", "--out", cap, "--", sys.executable, "-c", "pass")
    assert done.returncode == 2 and "holds an earlier capture; capture anew there with " \
        "--force" in done.stderr
    assert (cap / "capture.json").read_bytes() == before
    done = sweep_in("capture", "--out", cap, "--force", "--", sys.executable, "-c", "pass")
    assert done.returncode == 0, done.stderr
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("cap.replaced-")]
    assert len(aside) == 1 and (aside[0] / "capture.json").read_bytes() == before
    assert read_capture(cap).calls == ()


@pytest.mark.parametrize("argv, said", [
    ([], "error: no program given: sweep capture --out DIR -- PROGRAM ARGS..."),
    (["--", "no-such-program-here"], "error: cannot run no-such-program-here (No such file "
                                     "or directory)"),
])
def test_a_program_that_cannot_run_is_one_line(tmp_path, argv, said):
    done = sweep_in("capture", "--out", tmp_path / "cap", *argv)
    assert (done.returncode, done.stderr) == (2, said + "\n")
    assert not (tmp_path / "cap").exists()


def test_the_boot_file_imports_nothing_heavy_without_its_variables(tmp_path):
    behind = tmp_path / "behind"
    behind.mkdir()
    (behind / "sitecustomize.py").write_text("import builtins\nbuiltins.BEHIND = True\n")
    env = {k: v for k, v in __import__("os").environ.items()
           if not k.startswith("SWEEP_AUTOTUNE_")}
    env["PYTHONPATH"] = f"{BOOT}:{behind}"
    shown = subprocess.run(
        [sys.executable, "-c", "import builtins, sys; print(getattr(builtins, 'BEHIND', "
         "False), sorted(m for m in ('torch', 'triton', 'sweep') if m in sys.modules))"],
        env=env, capture_output=True, text=True, check=True)
    assert shown.stdout == "True []\n"  # the next sitecustomize ran; nothing heavy came
