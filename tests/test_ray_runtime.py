"""The Ray runtime's own promises, on a real local Ray instance (the driver's rules on top
of it are tested without Ray in tests/test_driver.py)."""

from __future__ import annotations

import threading

import pytest

from sweep.engines.ray.runtime import RayRuntime, _Actor
from sweep.engines.runtime import Placement, RetimeAbandoned


@pytest.fixture
def stuck_worker(ray_local):
    """A worker whose re-timing never answers (a hung kernel, a stopped process)."""

    class Stuck:
        def retime(self, configs, rounds):
            threading.Event().wait()

    handle = ray_local.remote(num_cpus=0)(Stuck).remote()
    runtime = RayRuntime(settings=None, placement=Placement(workers=1), batches=2)  # type: ignore[arg-type]
    runtime._actors["w1"] = _Actor(handle, ready=None)
    yield runtime
    runtime.kill("w1")


def test_retiming_that_never_answers_is_given_up_after_its_timeout(stuck_worker):
    with pytest.raises(RetimeAbandoned, match=r"no answer within 0\.5 s"):
        stuck_worker.retime("w1", [{"A": 1}], 1, timeout_s=0.5, should_stop=lambda: False)


def test_retiming_is_given_up_at_once_when_a_stop_is_asked_for(stuck_worker):
    asked = iter([False, True])
    with pytest.raises(RetimeAbandoned, match="stopped while re-timing"):
        stuck_worker.retime("w1", [{"A": 1}], 1, timeout_s=600,
                            should_stop=lambda: next(asked))
