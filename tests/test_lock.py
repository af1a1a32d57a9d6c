"""One process at a time owns a run directory: real processes, real flock(2)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from storage.lock import LOCK_NAME, RunDirBusy, RunDirLock

ROOT = Path(__file__).resolve().parent.parent


def python(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


HOLD = """
    import sys
    from pathlib import Path
    from storage.lock import RunDirLock
    lock = RunDirLock.acquire(Path(sys.argv[1]), "sweep run spec.yaml --out here")
    print("locked", flush=True)
    sys.stdin.read()  # hold until the test closes stdin
"""


def test_a_second_holder_is_refused_with_the_holder_named(tmp_path):
    holder = python(HOLD, str(tmp_path))
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(RunDirBusy) as busy:
            RunDirLock.acquire(tmp_path, "sweep resume here")
        message = str(busy.value)
        assert f"pid {holder.pid} on " in message
        assert "sweep run spec.yaml --out here" in message and "\n" not in message
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    RunDirLock.acquire(tmp_path, "sweep resume here").release()  # free once it ended


def test_a_holder_killed_with_sigkill_leaves_no_stale_lock(tmp_path):
    holder = python(HOLD, str(tmp_path))
    assert holder.stdout.readline() == "locked\n"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    lock = RunDirLock.acquire(tmp_path, "after the kill")
    assert not lock.created  # the file stays; the lock on it went with its process
    lock.release(remove=True)
    assert (tmp_path / LOCK_NAME).exists()


def test_a_users_file_or_link_of_the_lock_files_name_is_neither_followed_nor_removed(
        tmp_path):
    target = tmp_path / "precious"
    target.write_text("user data")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LOCK_NAME).symlink_to(target)
    with pytest.raises(OSError):
        RunDirLock.acquire(tmp_path / "run", "sweep run")
    assert target.read_text() == "user data" and (tmp_path / "run" / LOCK_NAME).is_symlink()


def test_processes_racing_for_one_directory_never_hold_it_together(tmp_path):
    # Each process takes and gives back the lock many times, removing the lock file on
    # release (the case where a late opener could lock a deleted file). While it holds
    # the lock it creates a marker with O_EXCL: two holders at once would collide.
    racer = """
        import os, sys
        from pathlib import Path
        from storage.lock import RunDirBusy, RunDirLock
        directory = Path(sys.argv[1])
        go = directory.parent / "go"
        while not go.exists():
            pass
        held = 0
        while held < 150:
            try:
                lock = RunDirLock.acquire(directory, "racer")
            except RunDirBusy:
                continue
            marker = os.open(directory.parent / "owner", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(marker)
            os.unlink(directory.parent / "owner")
            lock.release(remove=True)
            held += 1
        print("done", held, flush=True)
    """
    directory = tmp_path / "run"
    directory.mkdir()
    racers = [python(racer, str(directory)) for _ in range(4)]
    (tmp_path / "go").touch()
    for proc in racers:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out == "done 150\n"


def test_giving_a_lock_back_never_raises_even_on_a_filesystem_gone_read_only(tmp_path):
    from conftest import read_only_view

    (tmp_path / "run").mkdir()
    lock = RunDirLock.acquire(tmp_path / "run", "sweep run")
    with read_only_view(tmp_path / "run", tmp_path / "ro") as view:
        lock.directory = view  # as if the filesystem went read-only under the run
        lock.release(remove=True)  # the unlink fails (EROFS): given back all the same
    assert lock.fd == -1
    RunDirLock.acquire(tmp_path / "run", "the next sweep").release()
