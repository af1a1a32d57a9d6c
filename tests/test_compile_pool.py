"""The compile pool's plumbing with real processes (Triton's interpreter stands in for the
GPU compiler here; tests/test_gpu.py covers real compiles): results come back by key, and
a compile process that dies is replaced without losing the pool."""

import os
import signal

import pytest

from actors.compile_pool import CompilePool

PROBLEM = {"M": 64, "N": 64, "K": 64, "dtype": "float16"}
CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4}


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pool = CompilePool(2, "matmul", PROBLEM, seed=0, timeout_s=60)
    yield pool
    pool.close()


def test_results_come_back_for_every_submitted_key(pool):
    for key in range(5):
        pool.submit(key, {**CONFIG, "BLOCK_N": 16 * (key + 1)})
    results = {key: pool.result(key) for key in reversed(range(5))}
    assert all(r.ok and r.compile_ms is not None for r in results.values()), results
    with pytest.raises(KeyError):
        pool.result(99)


def test_a_killed_compile_process_is_replaced(pool):
    pool.submit(0, CONFIG)
    assert pool.result(0).ok
    victim = pool._procs[0].process.pid
    os.killpg(victim, signal.SIGKILL)
    pool._procs[0].process.wait()  # dead before the next task is handed to it
    for key in range(1, 4):
        pool.submit(key, CONFIG)
    results = [pool.result(key) for key in range(1, 4)]
    assert all(r.ok for r in results), results
    assert victim not in {p.process.pid for p in pool._procs}
    assert pool.size == 2
