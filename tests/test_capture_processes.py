"""`sweep capture` around a program of several Python processes: a launcher that calls no
kernel (as torchrun) and its children. One process at a time writes the capture (the first
to call a kernel holds the folder's lock for its life), so ranks never overwrite each other
and a launcher exiting last never wipes what its children captured; processes one after
another each add to it."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from conftest import sweep_proc

from storage.capture import read_capture

PROGRAMS = Path(__file__).parent / "programs"
ROOT = Path(__file__).resolve().parents[1]


def _capture(tmp_path: Path, *args: str):
    app = tmp_path / "app"
    app.mkdir()
    for name in ("launcher_app.py", "autotuned_kernels.py"):
        shutil.copy(PROGRAMS / name, app)
    env = {"TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = sweep_proc("capture", "--out", tmp_path / "cap", "--", sys.executable,
                      "launcher_app.py", *args, cwd=app,
                      env={**{k: v for k, v in os.environ.items()
                              if k != "AUTOTUNED_APP_CPU_BENCH"}, **env})
    return done, tmp_path / "cap"


def test_steps_one_after_another_each_add_their_calls_and_the_launcher_wipes_none(tmp_path):
    done, cap = _capture(tmp_path, "24", "48")
    assert done.returncode == 0, done.stderr
    labels = sorted(c.label for c in read_capture(cap).calls)
    assert labels == ["N=24; float32", "N=48; float32"]
    assert "captured 2 calls of 1 kernel" in done.stdout + done.stderr


def test_ranks_at_once_leave_one_whole_capture_of_each_key(tmp_path):
    done, cap = _capture(tmp_path, "--together", "32", "32", "32")
    assert done.returncode == 0, done.stderr
    calls = read_capture(cap).calls
    assert [c.label for c in calls] == ["N=32; float32"]
    assert (cap / "spec.yaml").exists()


def test_the_python_capture_refuses_an_earlier_capture_unless_forced(tmp_path):
    import pytest

    import sweep.autotune
    from storage.capture import Capture, write_capture

    write_capture(tmp_path, Capture(program=("python", "old.py"), calls=(), exit_code=0))
    with pytest.raises(ValueError, match="holds an earlier capture"), \
            sweep.autotune.capture(tmp_path):
        pass
    assert read_capture(tmp_path).program == ("python", "old.py")  # untouched
    with sweep.autotune.capture(tmp_path, force=True):
        pass
    assert read_capture(tmp_path).program != ("python", "old.py")
