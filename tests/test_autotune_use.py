"""A run's tuned configs loaded back into an unchanged program: `sweep.autotune.use(RUN)`
and `sweep exec RUN -- PROGRAM` (issue 35, item 4).

The programs run under Triton's CPU interpreter, in processes of their own (TRITON_INTERPRET
must be set before a kernel is defined). There, Triton's own autotune cannot benchmark (its
benchmarker finds no driver and raises): a call that succeeds never reached it. The run
directories are made by hand as `sweep run` over a capture leaves them: capture.json through
storage/capture.py's writer, best.json through storage/snapshot.py's.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import sweep_in, sweep_proc

from storage.best_file import problem_doc, write_best
from storage.capture import Arg, Call, Capture, CapturedConfig, TensorArg, write_capture
from storage.records import Best
from storage.snapshot import checksum
from sweep.autotune.use import load, nearest_key

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ROOT / "tests" / "programs"
PROGRAM = PROGRAMS / "use_program.py"
KERNEL = "use_kernels:add_one"
DEVICE = "cpu-interpreter"
# use_kernels.add_one's configs, as the capture records them.
CONFIGS = (CapturedConfig({"BLOCK": 16}, num_warps=1, num_stages=1),
           CapturedConfig({"BLOCK": 32}, num_warps=2, num_stages=1),
           CapturedConfig({"BLOCK": 64}, num_warps=4, num_stages=1))
# The program given use(); argv: RUN_DIR, nearest (0 or 1), then the program's words.
DRIVER = """
import sys
import sweep.autotune
loaded = sweep.autotune.use(sys.argv[1], nearest=sys.argv[2] == "1")
print(repr(loaded), file=sys.stderr)
import use_program
sys.exit(use_program.main(sys.argv[3:]))
"""


def call(n: int, dtype: str = "float32") -> Call:
    """The capture's record of add_one called on n elements."""
    tensor = TensorArg(dtype, (n,), (1,), n)
    return Call(kernel=KERNEL, source="", key_names=("N",),
                key=(n, f"torch.{dtype}", f"torch.{dtype}"), label=f"N={n}; {dtype}",
                configs=tuple(replace(c, grid=(-(-n // c.kwargs["BLOCK"]),)) for c in CONFIGS),
                args=(Arg("x_ptr", tensor), Arg("y_ptr", tensor), Arg("N", value=n)),
                outputs=("y_ptr",))


def make_run(where: Path, tuned: Sequence[tuple[Call, int | None]], *, partial: bool = False,
             kernel: str | None = None, configs: Sequence[dict] | None = None) -> Path:
    """A run of a capture of the calls given: each problem's best is the config of the
    index given (None: no config succeeded). configs: the tuned configs instead (a list
    changed since the capture)."""
    capture = where / "capture"
    capture.mkdir()
    write_capture(capture, Capture(program=("python", "use_program.py"),
                                   calls=tuple(c for c, _ in tuned), exit_code=0))
    run = where / "run"
    run.mkdir()
    spec = {"name": "capture-use_program",
            "kernel": kernel or f"capture:{(capture / 'capture.json').resolve()}",
            "validation": {"rtol": 0.01, "atol": 0.01},
            "problems": [{"kernel": c.kernel, "key": c.label,
                          "configs": [x.as_spec() for x in c.configs]} for c, _ in tuned]}
    (run / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    fingerprint = "f" * 64
    meta = {"fingerprint": fingerprint, "declared": "d" * 64, "name": spec["name"],
            "total": len(CONFIGS) * len(tuned), "backend": "interpret",
            "created_at": time.time(), "versions": {}}
    (run / "run.json").write_text(json.dumps({**meta, "sha256": checksum(meta)}))
    problems, bests = [], []
    for p, (c, index) in enumerate(tuned):
        config = (configs[p] if configs else c.configs[index].as_spec()) \
            if index is not None else None
        best = Best(index=len(CONFIGS) * p + index, config=config, latency_ms=0.01,
                    device=DEVICE) if index is not None and config is not None else None
        bests.append(best)
        problems.append(problem_doc({"kernel": c.kernel, "key": c.label}, len(CONFIGS) * p,
                                    len(CONFIGS), best, {DEVICE: best} if best else {},
                                    [], {}))
    head = bests[0]
    write_best(run / "best.json", head, fingerprint=fingerprint, partial=partial,
               by_device={DEVICE: head} if head else {}, by_problem=problems)
    return run


def environment(**extra: str) -> dict[str, str]:
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(paths),
           **extra}
    for name in ("SWEEP_AUTOTUNE_USE", "SWEEP_AUTOTUNE_NEAREST"):
        if name not in extra:
            env.pop(name, None)
    return env


def with_use(run: Path, *words: str, nearest: bool = False) -> subprocess.CompletedProcess:
    """The program run with `sweep.autotune.use(run)` before it (its one line)."""
    return subprocess.run([sys.executable, "-c", DRIVER, str(run), "1" if nearest else "0",
                           *words], cwd=PROGRAMS, env=environment(), capture_output=True,
                          text=True, timeout=300)


def launched(stdout: str) -> dict[int, dict]:
    """N -> the config each of the program's launches ran."""
    return {line["N"]: line["config"] for line in map(json.loads, stdout.splitlines())}


def imported(path: Path) -> set[str]:
    """The modules a file imports."""
    return {name for node in ast.walk(ast.parse(path.read_text()))
            for name in ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) else [])}


def spec_form(index: int) -> dict:
    return CONFIGS[index].as_spec()


def test_a_tuned_key_launches_its_tuned_config_and_triton_tunes_nothing(tmp_path):
    run = make_run(tmp_path, [(call(40), 1), (call(100), 2), (call(8), 0)])
    done = with_use(run, "40", "100", "8", "40")
    # Under the interpreter Triton's benchmarker raises: every call passed it by.
    assert done.returncode == 0, done.stderr
    assert launched(done.stdout) == {40: spec_form(1), 100: spec_form(2), 8: spec_form(0)}
    assert "use_kernels:add_one (3 keys)" in done.stderr


def test_a_key_the_run_did_not_tune_falls_back_to_tritons_autotune(tmp_path):
    run = make_run(tmp_path, [(call(40), 1), (call(64), None)])
    done = with_use(run, "40", "64")
    assert launched(done.stdout) == {40: spec_form(1)}
    # N=64 (no config succeeded there) went to Triton's autotune, which cannot time a
    # config under the interpreter and says so as Triton does.
    assert done.returncode != 0
    assert "active drivers" in done.stderr


def test_nearest_takes_the_config_of_the_nearest_tuned_key(tmp_path):
    run = make_run(tmp_path, [(call(16), 0), (call(128), 2)])
    done = with_use(run, "100", "20", "128", nearest=True)
    assert done.returncode == 0, done.stderr
    assert launched(done.stdout) == {100: spec_form(2), 20: spec_form(0), 128: spec_form(2)}
    # Another dtype is no near key: Triton's own autotune (which raises here).
    other = with_use(run, "100:half", nearest=True)
    assert other.returncode != 0 and "active drivers" in other.stderr


def test_nearest_is_by_log2_size_ratio_among_keys_alike_but_in_sizes():
    f32 = ("torch.float32", "torch.float32")
    tuned = {(16, *f32): "a", (128, *f32): "b", (100, "torch.float16", "torch.float16"): "c"}
    assert nearest_key((100, *f32), tuned) == (128, *f32)
    assert nearest_key((40, *f32), tuned) == (16, *f32)  # 40/16 is nearer than 128/40
    assert nearest_key((100, "torch.float16", "torch.float16"), {(16, *f32): "a"}) is None
    assert nearest_key((100, *f32, 1), tuned) is None  # another length
    # Equally far (32 -> 16 and 64): the larger, as the cache's nearest breaks ties.
    assert nearest_key((32, *f32), {(16, *f32): "a", (64, *f32): "b"}) == (64, *f32)


def test_a_tuned_config_not_in_the_kernels_list_is_launched_as_the_run_tuned_it(tmp_path):
    """A spec may add configs to a kernel's captured list (or tune a space): the one that
    won is made as triton.autotune makes a config, not left to Triton's autotune."""
    added = {"BLOCK": 128, "num_warps": 8, "num_stages": 1, "num_ctas": 1}
    run = make_run(tmp_path, [(call(40), 1), (call(100), 0)], configs=[spec_form(1), added])
    done = with_use(run, "40", "40", "100")
    assert done.returncode == 0, done.stderr
    assert launched(done.stdout) == {40: spec_form(1), 100: added}
    assert "warning" not in done.stderr


def test_load_says_what_it_loaded_and_leaves_untuned_keys_out(tmp_path):
    run = make_run(tmp_path, [(call(40), 1), (call(64), None), (call(8, "float16"), 2)],
                   partial=True)
    loaded = load(run)
    assert loaded.kernels == (KERNEL,)
    assert loaded.table == {KERNEL: {(40, "torch.float32", "torch.float32"): spec_form(1),
                                     (8, "torch.float16", "torch.float16"): spec_form(2)}}
    assert loaded.labels[KERNEL] == {(40, "torch.float32", "torch.float32"): "N=40; float32",
                                     (8, "torch.float16", "torch.float16"): "N=8; float16"}
    assert loaded.keys == 2 and loaded.partial
    assert repr(loaded) == f"Loaded({str(run)!r}: {KERNEL} (2 keys), partial run)"


def test_sweep_exec_loads_the_run_into_a_program_that_never_imports_sweep(tmp_path):
    assert imported(PROGRAM) == {"json", "sys", "torch", "use_kernels"}
    assert imported(PROGRAMS / "use_kernels.py") == {"triton", "triton.language"}
    run = make_run(tmp_path, [(call(40), 1), (call(128), 2)])
    done = sweep_proc("exec", run, "--", sys.executable, PROGRAM, "40", "128", "exit=7",
                      env=environment())
    assert done.returncode == 7, done.stderr  # the program's own exit code, passed on
    assert launched(done.stdout) == {40: spec_form(1), 128: spec_form(2)}
    near = sweep_proc("exec", run, "--nearest", "--", sys.executable, PROGRAM, "100",
                      env=environment())
    assert near.returncode == 0, near.stderr
    assert launched(near.stdout) == {100: spec_form(2)}


def test_a_program_killed_by_a_signal_is_128_plus_the_signal(tmp_path):
    run = make_run(tmp_path, [(call(40), 1)])
    done = sweep_in("exec", run, "--", sys.executable, "-c",
                    "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert done.returncode == 128 + 15, done.stderr


def test_a_sigterm_to_sweep_exec_reaches_the_program(tmp_path):
    run = make_run(tmp_path, [(call(40), 1)])
    program = ("import signal, sys\n"
               "signal.signal(signal.SIGTERM, lambda *_: sys.exit(5))\n"
               "print('ready', flush=True)\n"
               "signal.pause()\n")
    proc = subprocess.Popen([sys.executable, "-m", "sweep", "exec", str(run), "--",
                             sys.executable, "-c", program], cwd=ROOT, env=environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 5  # the program's handler ran, and its code came back
    finally:  # the command and the program, should either be left
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def test_a_program_that_cannot_be_started_is_one_line_exit_2(tmp_path):
    run = make_run(tmp_path, [(call(40), 1)])
    done = sweep_in("exec", run, "--", str(tmp_path / "no-such-program"))
    assert done.returncode == 2
    assert done.stderr == f"error: sweep exec: {tmp_path / 'no-such-program'}: cannot run " \
                          "it (No such file or directory)\n"
    no_program = sweep_in("exec", run, "--")
    assert no_program.returncode == 2 and no_program.stderr.count("\n") == 1


def bad_runs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Folders that are no run of a capture, with what the one line says of each."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    of_kernel = make_run(tmp_path / "a", [(call(40), 1)], kernel="matmul")
    damaged = make_run(tmp_path / "b", [(call(40), 1)])
    (tmp_path / "b" / "capture" / "capture.json").write_text('{"format": 1, "calls": 3}')
    no_best = make_run(tmp_path / "c", [(call(40), 1)])
    (no_best / "best.json").write_text("{")
    recaptured = make_run(tmp_path / "d", [(call(40), 1)])
    write_capture(tmp_path / "d" / "capture", Capture(program=(), calls=(call(41),)))
    return {"missing": (tmp_path / "nothing", "no such run directory"),
            "file": (tmp_path / "file", "not a run directory"),
            "empty": (tmp_path / "empty", "not a sweep run directory (no run.json)"),
            "not a capture": (of_kernel, "kernel: expected capture:PATH"),
            "capture damaged": (damaged, "capture.json: capture.program: expected a value"),
            "best.json damaged": (no_best, "best.json: missing or damaged"),
            "captured again": (recaptured, "is no call of")}


@pytest.mark.parametrize("case", ["missing", "file", "empty", "not a capture",
                                  "capture damaged", "best.json damaged", "captured again"])
def test_sweep_exec_refuses_what_is_no_run_of_a_capture_in_one_line(tmp_path, case):
    for sub in "abcd":
        (tmp_path / sub).mkdir()
    run, said = bad_runs(tmp_path)[case]
    marker = tmp_path / "ran"
    done = sweep_in("exec", run, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert said in done.stderr
    assert not marker.exists()  # the program never ran


def test_the_environment_variable_alone_refuses_a_bad_run_before_the_program(tmp_path):
    marker = tmp_path / "ran"
    boot = ROOT / "sweep" / "autotune" / "boot"
    env = environment(SWEEP_AUTOTUNE_USE=str(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join([str(boot), env["PYTHONPATH"]])
    done = subprocess.run([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == f"error: SWEEP_AUTOTUNE_USE: {tmp_path}: not a sweep run " \
                          "directory (no run.json)\n"
    assert not marker.exists()


def test_importing_sweep_autotune_imports_nothing_heavy_and_use_is_callable_either_way(
        tmp_path):
    run = make_run(tmp_path, [(call(40), 1)])
    code = f"""
import sys
import sweep.autotune
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("triton", "torch", "storage")
               or m.startswith("sweep.") and m != "sweep.autotune")
assert not heavy, heavy
import sweep.autotune.use  # now the package's `use` is the module: called, it is use()
print(repr(sweep.autotune.use({str(run)!r})))
from sweep.autotune import Loaded, use
print(isinstance(use({str(run)!r}, nearest=True), Loaded))
"""
    done = subprocess.run([sys.executable, "-c", code], env=environment(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"Loaded({str(run)!r}: {KERNEL} (1 key))", "True"]
