"""A newcomer's mistakes that are not one line of the spec, each said in one line with exit
2: a kernel module that fails to import (wherever a spec's kernel is imported), a kernel
attribute that is not there, a resume after the kernel changed, an --out folder of the
user's own files, argparse's own errors, and what a summary says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from blocked_imports import without
from conftest import simulate_spec, sweep_cli, sweep_in, sweep_proc

# A user's kernel: the built-in softmax under a module of the user's, small enough for the
# interpreter.
GOOD_KERNEL = "from sweep_kernels.softmax import KERNEL  # noqa: F401\n"
SPEC = ("kernel: {module}:KERNEL\n"
        "problem: {{rows: 4, cols: 64, dtype: float32}}\n"
        "space: {{BLOCK_N: [64], ROWS_PER_PROGRAM: [1, 2]}}\n"
        "run: {{backend: interpret, runtime: local}}\n")

BROKEN = [  # (the module's text, the one line's end)
    ("import math\n\n\n\n\nx = math.floor(\n",
     "brokenkernel.py:6: SyntaxError: '(' was never closed"),
    (GOOD_KERNEL + "y = undefined_name\n",
     "brokenkernel.py:2: NameError: name 'undefined_name' is not defined"),
    (GOOD_KERNEL + "import no_such_module_of_anyone\n",
     "brokenkernel.py:2: ModuleNotFoundError: No module named 'no_such_module_of_anyone'"),
]


def user_spec(where: Path, module: str, text: str) -> Path:
    (where / f"{module}.py").write_text(text)
    spec = where / "spec.yaml"
    spec.write_text(SPEC.format(module=module))
    return spec


def one_error_line(done) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    # (A notice that the kernel's import is under way may come first: torch takes seconds.)
    lines = [line for line in done.stderr.strip().splitlines()
             if not line.endswith("(the spec's kernel) to check the spec against it")]
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize(("text", "says"), BROKEN, ids=["syntax", "name", "import"])
def test_a_kernel_module_that_fails_to_import_is_one_line_naming_its_file_and_line(
        tmp_path, text, says):
    spec = user_spec(tmp_path, "brokenkernel", text)
    line = one_error_line(sweep_proc("run", "spec.yaml", cwd=tmp_path))
    assert line == f"error: {spec.name}: kernel: importing brokenkernel failed: {says}"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_sweep_best_of_a_spec_whose_kernel_fails_to_import_is_one_line(tmp_path,
                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    user_spec(tmp_path, "brokenbest", BROKEN[1][0])
    line = one_error_line(sweep_in("best", "spec.yaml"))
    assert line.endswith("kernel: importing brokenbest failed: brokenbest.py:2: NameError: "
                         "name 'undefined_name' is not defined")


def test_resume_after_the_kernel_module_broke_is_one_line(tmp_path):
    user_spec(tmp_path, "brokenlater", GOOD_KERNEL)
    done = sweep_proc("run", "spec.yaml", "--out", "run", "--max-trials", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (tmp_path / "brokenlater.py").write_text(BROKEN[0][0])
    line = one_error_line(sweep_proc("resume", "run", cwd=tmp_path))
    assert line.endswith("kernel: importing brokenlater failed: brokenlater.py:6: "
                         "SyntaxError: '(' was never closed")


def test_a_kernel_attribute_that_is_not_there_is_said_so_with_the_records_the_module_has(
        tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "addkernel.py").write_text(GOOD_KERNEL + "OTHER = KERNEL\nhelper = 1\n")
    (tmp_path / "spec.yaml").write_text(SPEC.format(module="addkernel").replace(
        "addkernel:KERNEL", "addkernel:KERNL"))
    line = one_error_line(sweep_in("run", tmp_path / "spec.yaml", "--out", tmp_path / "o"))
    assert line.endswith("kernel: module addkernel has no attribute 'KERNL' (its Kernel "
                         "records: KERNEL, OTHER)")
    (tmp_path / "spec.yaml").write_text(SPEC.format(module="addkernel").replace(
        "addkernel:KERNEL", "addkernel:helper"))
    line = one_error_line(sweep_in("run", tmp_path / "spec.yaml", "--out", tmp_path / "o"))
    assert line.endswith("kernel: addkernel:helper is a int, not a sweep_kernels.Kernel "
                         "record (its Kernel records: KERNEL, OTHER)")


# A user's kernel whose problem default for rows comes from the environment: the problem
# changes with its source unchanged.
ROWS_FROM_ENV = ("import dataclasses, os\n"
                 "from sweep_kernels.softmax import KERNEL as SOFTMAX\n"
                 "KERNEL = dataclasses.replace(SOFTMAX, problem_defaults={\n"
                 "    **SOFTMAX.problem_defaults, 'rows': int(os.environ.get('ROWS', '4'))})\n")


def test_resume_after_the_kernel_changed_says_which_part_changed_and_names_force(tmp_path):
    user_spec(tmp_path, "changing", ROWS_FROM_ENV)
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec.read_text().replace("rows: 4, ", ""))
    done = sweep_proc("run", "spec.yaml", "--out", "run", "--max-trials", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    line = one_error_line(sweep_proc("resume", "run", cwd=tmp_path, env={"ROWS": "8"}))
    run = tmp_path / "run"
    assert line.startswith(f"error: {run}: the problem (with the kernel's defaults) has "
                           "changed since this run started (fingerprint ")
    assert line.endswith(f"`sweep run SPEC --out {run} --force` starts anew there (moving "
                         "this run aside), or sweep run elsewhere")
    with (tmp_path / "changing.py").open("a") as f:
        f.write("# an edit\n")
    line = one_error_line(sweep_proc("resume", "run", cwd=tmp_path))
    assert "the kernel's source has changed since this run started" in line


def test_to_pandas_without_pandas_names_the_package_to_install(tmp_path):
    run = tmp_path / "run"
    assert sweep_cli("run", simulate_spec(tmp_path / "sim.yaml"), "--out", run,
                     "--runtime", "local") == 0
    script = ("import sys\nfrom sweep import api\nr = api.load(sys.argv[1])\n"
              "assert r.table().num_rows > 0\n"
              "try:\n    r.to_pandas()\nexcept ModuleNotFoundError as e:\n"
              "    print(e.name, '|', e)\n")
    env = {**os.environ, **without(["pandas"], tmp_path / "site")}
    got = subprocess.run([sys.executable, "-c", script, str(run)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == ("pandas | SweepResult.to_pandas() needs pandas, which is "
                                  "not installed: pip install pandas (or use .table(), a "
                                  "pyarrow Table)")


def test_out_into_a_folder_of_the_users_files_is_refused_and_leaves_them_alone(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("precious")
    (folder / "data").mkdir()
    done = sweep_in("run", simulate_spec(tmp_path / "sim.yaml"), "--out", folder,
                    "--runtime", "local")
    assert one_error_line(done) == (f"error: --out {folder}: not a run directory and not "
                                    "empty (it holds data, notes.txt); choose a new or empty "
                                    "folder for the run")
    assert sorted(p.name for p in folder.iterdir()) == ["data", "notes.txt"]
    assert (folder / "notes.txt").read_text() == "precious"
    assert not any(p.name.startswith("mine.replaced") for p in tmp_path.iterdir())


def test_out_into_an_existing_empty_folder_runs_there(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    assert sweep_cli("run", simulate_spec(tmp_path / "sim.yaml"), "--out", folder,
                     "--runtime", "local") == 0
    assert (folder / "run.json").exists()


def test_version_prints_the_installed_version():
    from importlib.metadata import version

    done = sweep_in("--version")
    expected = (0, f"sweep {version('triton-sweep')}\n", "")
    assert (done.returncode, done.stdout, done.stderr) == expected


@pytest.mark.parametrize(("args", "says"), [
    (["run", "x.yaml", "--backend", "cdua"],
     "error: --backend: expected one of auto, cuda, interpret, simulate, replay; got 'cdua' "
     "(sweep run --help says more)"),
    (["report", "d", "--top", "many"],
     "error: --top: expected an integer; got 'many' (sweep report --help says more)"),
    (["resume", "d", "--time-budget", "soon"],
     "error: --time-budget: expected a number; got 'soon' (sweep resume --help says more)"),
    ([], "error: a command is required: one of run, resume, best, report, submit, capture, "
         "exec (sweep --help says more)"),
    (["runn"], "error: command: expected one of run, resume, best, report, submit, capture, "
               "exec; got 'runn' (sweep --help says more)"),
    (["run"], "error: the following arguments are required: SPEC "
              "(sweep run --help says more)"),
], ids=["choice", "int", "float", "no-command", "command", "required"])
def test_a_usage_mistake_is_one_line_without_the_usage_block(args, says):
    done = sweep_proc(*args)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", says + "\n")


def test_help_describes_the_tool_each_argument_and_gives_examples():
    top = sweep_in("--help")
    assert top.returncode == 0
    assert "Resumable, distributed autotuning sweeps of Triton kernels" in top.stdout
    assert "--version" in top.stdout and "examples:" in top.stdout
    assert "sweep run configs/quickstart.yaml" in top.stdout
    for command in ("run", "resume", "report", "best", "submit", "capture", "exec"):
        shown = sweep_in(command, "--help")
        assert shown.returncode == 0
        lines = shown.stdout.split("options:")[1].splitlines()
        # Every argument has its help: no option line stands alone, without text.
        bare = [line for i, line in enumerate(lines) if line.startswith("  -")
                and len(line.split("  ")) < 3 and not lines[i + 1].startswith(" " * 10)]
        assert not bare, (command, bare)
        assert "positional arguments:" in shown.stdout
    assert "(default: 5)" in " ".join(sweep_in("report", "--help").stdout.split())
    assert "(default: a new one under runs/)" in " ".join(sweep_in("run", "--help").stdout.split())


def summary_of(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(("sweep ", "  "))]


def test_a_resumed_sessions_summary_tells_the_runs_count_from_this_sessions(tmp_path):
    spec, run = simulate_spec(tmp_path / "sim.yaml"), tmp_path / "run"
    first = sweep_in("run", spec, "--out", run, "--runtime", "local", "--max-trials", "12")
    assert first.returncode == 0, first.stderr
    head = summary_of(first.stdout)[0]
    assert " — 12 of 40 trials in " in head and "this session" not in head
    again = sweep_in("resume", run, "--runtime", "local")
    assert again.returncode == 0, again.stderr
    head = summary_of(again.stdout)[0]
    assert " — 40 of 40 trials done (28 in this session, " in head, head
    assert f"  next: sweep report {run} (the fastest, the failures), sweep best {run} (the " \
           "best as a triton.Config)" in again.stdout


def test_an_interrupted_run_in_which_nothing_ran_says_none_ran():
    from io import StringIO

    from rich.console import Console

    from sweep.results.summary import Summary, print_summary
    from sweep.results.tally import Tally

    out = StringIO()
    print_summary(Console(file=out, width=200),
                  Summary("sim", Path("/runs/sim"), "interrupted", Tally(total=40), 0.4))
    lines = out.getvalue().splitlines()
    assert lines[0] == "sweep sim: interrupted — 0 of 40 trials in 0.4 s (none)"
    assert lines[1] == "  best: none (no trial ran)"
    assert not any("next:" in line for line in lines)  # nothing to report on yet


def test_out_holding_only_what_a_start_cut_short_leaves_is_taken_for_a_new_run(tmp_path):
    folder = tmp_path / "cut"
    folder.mkdir()
    (folder / "workers.log").write_text("")
    (folder / ".spec.yaml.k3j2x9.tmp").write_text("half")
    assert sweep_cli("run", simulate_spec(tmp_path / "sim.yaml"), "--out", folder,
                     "--runtime", "local") == 0
    assert (folder / "run.json").exists()


def without_ray(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a `sweep` (and its workers) on a machine without Ray: nothing
    inherited names a cluster, and Ray's records go to a folder of the test's own."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    (tmp_path / "raytmp").mkdir(exist_ok=True)
    return {**env, **without(["ray"], tmp_path / "site"), "RAY_TMPDIR": str(tmp_path / "raytmp"),
            **extra}


def sweep_without_ray(tmp_path: Path, *args: str | Path, **extra: str):
    return subprocess.run([sys.executable, "-m", "sweep", *map(str, args)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env=without_ray(tmp_path, **extra))


NEEDS_RAY = ("needs Ray, which is not installed; pip install 'triton-sweep[ray]', or "
             "--runtime local to run on this machine without it")


@pytest.mark.parametrize(("args", "env", "why"), [
    (["--runtime", "ray"], {}, "--runtime ray"),
    (["--address", "10.0.0.1:6379"], {}, "--address 10.0.0.1:6379"),
    ([], {"RAY_ADDRESS": "10.0.0.1:6379"}, "RAY_ADDRESS=10.0.0.1:6379"),
], ids=["runtime", "address", "RAY_ADDRESS"])
def test_asking_for_ray_without_ray_installed_says_what_to_install(tmp_path, args, env, why):
    spec = simulate_spec(tmp_path / "sim.yaml")
    done = sweep_without_ray(tmp_path, "run", spec, "--out", "run", *args, **env)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: {why}: {NEEDS_RAY}\n")
    assert not (tmp_path / "run").exists()


def test_a_ray_head_found_on_this_machine_without_ray_installed_says_what_to_install(
        tmp_path):
    import socket

    spec = simulate_spec(tmp_path / "sim.yaml")
    with socket.socket() as head:  # something listening where `ray start` recorded a head
        head.bind(("127.0.0.1", 0))
        head.listen()
        (tmp_path / "raytmp" / "ray").mkdir(parents=True)
        (tmp_path / "raytmp" / "ray" / "ray_current_cluster").write_text(
            f"127.0.0.1:{head.getsockname()[1]}")
        done = sweep_without_ray(tmp_path, "run", spec, "--out", "run")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("error: --runtime auto found a Ray head on this machine (`ray "
                           f"start`); joining it: {NEEDS_RAY}\n")


def test_sweep_submit_without_ray_installed_says_to_install_the_cluster_extra(tmp_path):
    spec = simulate_spec(tmp_path / "sim.yaml")
    done = sweep_without_ray(tmp_path, "submit", spec.name, "--address", "http://127.0.0.1:9")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("error: sweep submit needs Ray's job client, which ray[default] "
                           "provides (ray is missing): pip install 'triton-sweep[cluster]' "
                           "(from a clone: pip install -e '.[cluster]')\n")


def test_a_local_run_of_a_real_kernel_needs_no_ray(tmp_path):
    user_spec(tmp_path, "mykernel", GOOD_KERNEL)
    done = sweep_without_ray(tmp_path, "run", "spec.yaml", "--out", "run", "--runtime", "auto")
    assert done.returncode == 0, done.stderr
    assert "complete — 2 of 2 trials" in done.stdout
    report = sweep_without_ray(tmp_path, "report", "run")
    assert report.returncode == 0, report.stderr
