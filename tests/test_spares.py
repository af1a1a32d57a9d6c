"""Interpreters started ahead of the processes they become (actors/spares.py): a spare of
the asked-for environment becomes the process, keeping what it printed while it waited;
one of another environment, or one that died, is passed over; one not taken ends."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from actors import child, spares

BECOMES = "tests_spare_target:become"


@pytest.fixture
def env(tmp_path: Path):
    """An environment whose module, imported ahead, says so, and which, once a spare
    becomes it, writes its pid and its arguments."""
    (tmp_path / "tests_spare_target.py").write_text(textwrap.dedent("""
        import os, sys
        print("imported ahead", file=sys.stderr, flush=True)

        def ahead():
            print("called ahead", file=sys.stderr, flush=True)

        def become(path, word):
            print("became", word, file=sys.stderr, flush=True)
            with open(path, "w") as f:
                f.write(f"{os.getpid()} {word}")
        """))
    path = os.pathsep.join([str(tmp_path), *sys.path[1:]])
    yield {**os.environ, "PYTHONPATH": path}
    spares.end()


def test_a_spare_of_the_same_environment_becomes_the_process_keeping_what_it_printed(
        tmp_path, env):
    spares.start([env], imports=("tests_spare_target:ahead",))
    spare = spares._SPARES[0][1]
    log = tmp_path / "log"
    process = spares.become(BECOMES, str(tmp_path / "out"), "hello", env=env, out=str(log))
    assert process is spare
    assert process.wait(timeout=60) == 0
    assert (tmp_path / "out").read_text() == f"{spare.pid} hello"
    assert log.read_text().splitlines() == ["imported ahead", "called ahead", "became hello"]
    assert spares.become(BECOMES, "x", "y", env=env, out=str(log)) is None  # taken once


def test_no_spare_is_taken_for_another_environment_and_end_ends_the_untaken(tmp_path, env):
    spares.start([env], imports=("tests_spare_target",))
    spare = spares._SPARES[0][1]
    other = {**env, "CUDA_VISIBLE_DEVICES": "1"}
    assert spares.become(BECOMES, "x", "y", env=other, out=str(tmp_path / "log")) is None
    assert child.alive(spare.pid)
    spares.end()
    assert spare.returncode is not None and not child.alive(spare.pid)


def test_a_spare_that_died_is_passed_over(tmp_path, env):
    spares.start([env, env], imports=())
    first, second = (process for _, process in spares._SPARES)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=60)
    log = tmp_path / "log"
    process = spares.become(BECOMES, str(tmp_path / "out"), "again", env=env, out=str(log))
    assert process is second  # the dead one was dropped, the next alive one taken
    assert process.wait(timeout=60) == 0
    assert (tmp_path / "out").read_text() == f"{second.pid} again"
    assert spares.become(BECOMES, "x", "y", env=env, out=str(log)) is None
