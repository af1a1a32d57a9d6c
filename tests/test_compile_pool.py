"""The compile pool's plumbing with real processes (Triton's interpreter stands in for the
GPU compiler here; tests/test_gpu.py covers real compiles): results come back by key, and
a compile process that dies is replaced without losing the pool."""

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from actors.compile_pool import CompileJob, CompilePool
from actors.compiles import Compiled
from actors.protocol import CompileLimit

PROBLEM = {"M": 64, "N": 64, "K": 64, "dtype": "float16"}
CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4}


def result(pool: CompilePool, key: int) -> Compiled:
    """Wait for `key` as a worker's runner does: take, else wait without the pool's lock."""
    while True:
        got = pool.take([key])
        if got is not None:
            return got[1]
        with pool._lock:
            if not pool._in_flight(key):
                raise KeyError(f"config {key} was never submitted")
        pool.wait(0.05)


def wait_ready(pool: CompilePool) -> None:
    while not all(p.ready for p in pool._procs):
        pool.take(())
        pool.wait(0.05)


def tests_on_path(monkeypatch) -> None:
    """This directory on the compile processes' path (its stand-in kernels), and Triton's
    interpreter for what they compile."""
    tests_dir = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def pool():
    """A matmul pool of two, started once (its fork server imports torch and Triton: a
    second or more) for the tests that only submit to it and take from it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        pool = CompilePool(2, CompileJob("matmul", PROBLEM), CompileLimit(60))
        yield pool
        pool.close()


@pytest.fixture
def own_pool(monkeypatch):
    """A matmul pool of two of this test's own, for a test that kills its processes."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pool = CompilePool(2, CompileJob("matmul", PROBLEM), CompileLimit(60))
    yield pool
    pool.close()


def test_results_come_back_for_every_submitted_key(pool):
    for key in range(5):
        pool.submit(key, {**CONFIG, "BLOCK_N": 16 * (key + 1)})
    results = {key: result(pool, key) for key in reversed(range(5))}
    assert all(r.ok and r.compile_ms is not None for r in results.values()), results
    with pytest.raises(KeyError):
        result(pool, 99)


def test_a_killed_compile_process_is_replaced(own_pool):
    pool = own_pool
    pool.submit(0, CONFIG)
    assert result(pool, 0).ok
    victim = pool._procs[0].child.process.pid
    os.killpg(victim, signal.SIGKILL)
    pool._procs[0].child.process.wait()  # dead before the next task is handed to it
    for key in range(1, 4):
        pool.submit(key, CONFIG)
    results = [result(pool, key) for key in range(1, 4)]
    assert all(r.ok for r in results), results
    assert victim not in {p.child.process.pid for p in pool._procs}
    assert pool.size == 2


def test_configs_compile_while_nobody_takes_from_the_pool(own_pool):
    # Its worker may be timing a config, or compiling one itself before any process was
    # up: the pool's processes get their configs all the same.
    pool = own_pool
    for key in range(3):
        pool.submit(key, {**CONFIG, "BLOCK_N": 16 * (key + 1)})
    with pool._news:  # no take, no wait: only the pool's own pumping reads the replies
        assert pool._news.wait_for(lambda: all(k in pool._done for k in range(3)), 300)
    assert all(pool._done[k].ok for k in range(3))


def test_a_missed_binary_restarts_the_processes_on_real_arguments_losing_no_config(own_pool):
    # Compiled before it, and not taken, is compiled again; running then, started again.
    pool = own_pool
    wait_ready(pool)
    pool.submit(1, {**CONFIG, "BLOCK_N": 16})
    with pool._news:  # compiled with the stand-ins, not taken yet
        assert pool._news.wait_for(lambda: 1 in pool._done, 300)
        stale = pool._done[1]
    before = {p.child.process.pid for p in pool._procs}
    pool.submit(0, CONFIG)  # handed out at once: the restart may cut its compile short
    pool.missed()
    pool.missed()  # said once: there is nothing further to fall back to
    assert pool._spec["stand_ins"] is False  # what each process now starts with
    assert before.isdisjoint(p.child.process.pid for p in pool._procs)
    assert result(pool, 0).ok
    again = result(pool, 1)
    assert again.ok and again is not stale  # its binary was no launch's: compiled again
    assert pool.notices() == ["compile processes compile with real arguments from now on: "
                              "a launch loaded another binary than theirs"]


@pytest.fixture(scope="module")
def gated_pool():
    """A pool of two whose "kernel" compiles wait at a gate (tests/gated_kernel.py), started
    once: each test gates its compiles in a directory of its own."""
    with pytest.MonkeyPatch.context() as patch:
        tests_on_path(patch)
        pool = CompilePool(2, CompileJob("gated_kernel:KERNEL", {}), CompileLimit(20))
        wait_ready(pool)
        yield pool
        pool.close()


def wait_in_other_thread(pool: CompilePool, gate: Path) -> tuple[threading.Thread, dict]:
    """Submit a config whose compile waits at the gate; a thread waits in result()."""
    pool.submit(1, {"GATE": str(gate), "ROLE": "wait"})
    got: dict[int, object] = {}
    waiting = threading.Thread(target=lambda: got.update({1: result(pool, 1)}))
    waiting.start()
    while not (gate / "waiting").exists():  # config 1 is compiling, result() waits
        waiting.join(0.01)
    return waiting, got


def test_a_batch_queued_behind_a_waiting_one_starts_compiling_at_once(gated_pool, tmp_path):
    # The worker's running batch waits in result() while the next batch submits from
    # another thread; config 1's compile finishes only once config 2's has run.
    waiting, got = wait_in_other_thread(gated_pool, tmp_path)
    gated_pool.submit(2, {"GATE": str(tmp_path), "ROLE": "open"})
    waiting.join(30)
    assert got[1].ok, got[1]
    assert result(gated_pool, 2).ok


def test_hinted_configs_compile_on_idle_processes_and_count_when_submitted(gated_pool,
                                                                            tmp_path):
    waiting, got = wait_in_other_thread(gated_pool, tmp_path)
    gated_pool.hint(2, {"GATE": str(tmp_path), "ROLE": "open"})  # only a hint opens it
    waiting.join(30)
    assert got[1].ok, got[1]
    gated_pool.submit(2, {"GATE": str(tmp_path), "ROLE": "open"})
    assert result(gated_pool, 2).ok
    with pytest.raises(KeyError):
        result(gated_pool, 2)  # handed out once, not compiled again


# --- kernels whose import leaves the fork server unfit to fork from ----------------------
def until_up(pool: CompilePool, seconds: float = 120) -> None:
    """Until a process is up, or the pool is down (then notices say why)."""
    deadline = time.monotonic() + seconds
    while not pool.started() and pool._down is None:
        assert time.monotonic() < deadline, "no compile process came up"
        pool.wait(0.05)


def test_a_kernel_asking_for_the_gpu_at_import_keeps_its_compile_processes_forked(
        monkeypatch):
    # torch.cuda.is_available() at import (Liger-Kernel) initialised CUDA in the fork
    # server, and every fork died at start-up, until the pool raised in its worker.
    tests_on_path(monkeypatch)
    pool = CompilePool(2, CompileJob("fork_unsafe_kernel:KERNEL", PROBLEM), CompileLimit(60))
    try:
        pool.submit(0, CONFIG)
        assert result(pool, 0).ok
        assert all(p is not None and p.forked for p in pool._procs)
        assert pool.notices() == []
    finally:
        pool.close()


def test_forks_that_cannot_start_give_way_to_processes_of_their_own_and_say_why(monkeypatch):
    tests_on_path(monkeypatch)
    pool = CompilePool(2, CompileJob("fork_unsafe_kernel:KERNEL_INIT", PROBLEM),
                       CompileLimit(60))
    try:
        for key in range(3):
            pool.submit(key, {**CONFIG, "BLOCK_N": 16 * (key + 1)})
        assert all(result(pool, key).ok for key in range(3))
        assert not any(p is not None and p.forked for p in pool._procs)
        said = pool.notices()
        assert len(said) == 1 and "Cannot re-initialize CUDA in forked subprocess" in said[0]
        assert "each starts on its own" in said[0]
        assert pool.notices() == []  # said once
    finally:
        pool.close()


@pytest.mark.slow  # four processes importing torch; forks giving way to processes stays default
def test_processes_that_cannot_start_at_all_leave_the_pool_down_not_raising(monkeypatch):
    tests_on_path(monkeypatch)
    pool = CompilePool(2, CompileJob("fork_unsafe_kernel:KERNEL_BROKEN", PROBLEM),
                       CompileLimit(60))
    try:
        pool.submit(0, CONFIG)
        until_up(pool)
        assert not pool.started()
        said = " ".join(pool.notices())
        assert "cannot start (RuntimeError: No CUDA GPUs are available)" in said
        assert "compiles each config itself" in said
        assert pool.withdraw(0)  # the worker takes its config back and compiles it itself
        pool.hint(1, CONFIG)
        assert pool.take([0, 1]) is None
    finally:
        pool.close()


def test_the_compile_times_of_a_pool_nobody_takes_from_are_there_to_learn_a_limit_from(pool):
    # The early pool (sweep/engines/prestart.py) compiles while Ray starts; the workers then find
    # those binaries in Triton's cache (compiles of a few ms), so only the early pool's
    # own times say how long this kernel's compiles take.
    for key in range(3):
        pool.submit(key, {**CONFIG, "BLOCK_N": 16 * (key + 1)})
    deadline = time.monotonic() + 120
    while len(pool.finished_ms()) < 3:
        assert time.monotonic() < deadline, "the compiles never ended"
        pool.wait(0.05)
    assert all(ms > 0 for ms in pool.finished_ms())


def adaptive_gated_pool(fixed_s: float, adaptive: bool) -> CompilePool:
    pool = CompilePool(2, CompileJob("gated_kernel:KERNEL", {}), CompileLimit(fixed_s),
                       adaptive=adaptive)
    wait_ready(pool)
    return pool


def gated_pool_of_low_floor(monkeypatch, fixed_s: float, adaptive: bool) -> CompilePool:
    """A gated pool whose learnt limit may be as low as 0.5 s (the rule runs in this
    process), so that peers of 0.1 s teach one a gated compile soon runs past."""
    from actors import compile_limit

    tests_on_path(monkeypatch)
    monkeypatch.setattr(compile_limit, "FLOOR_S", 0.5)
    return adaptive_gated_pool(fixed_s, adaptive)


def run_peers_beside_a_gated_compile(pool: CompilePool, gate: Path) -> Compiled:
    """A compile that waits at a gate nobody opens, begun first; then MIN_COMPILES peers
    (each a real compile's time, see gated_kernel.PEER_S) on the other process."""
    from actors.compile_limit import MIN_COMPILES

    pool.submit(0, {"GATE": str(gate), "ROLE": "wait"})
    for key in range(1, MIN_COMPILES + 1):
        pool.submit(key, {"GATE": str(gate), "ROLE": "peer", "n": key})
    peers = [result(pool, key) for key in range(1, MIN_COMPILES + 1)]
    assert all(p.ok and p.compile_ms is not None and p.compile_ms >= 100 for p in peers), peers
    return result(pool, 0)


def test_a_pool_learns_the_limit_from_its_first_compiles_and_stops_one_already_running(
        monkeypatch, tmp_path):
    # The gated compile began before any limit was learnt, under a fixed one it would never
    # reach (its gate gives up at 60 s); the pool learns FACTOR x its peers' median from
    # their replies alone (no trial record, no driver) and stops it there.
    pool = gated_pool_of_low_floor(monkeypatch, 120.0, adaptive=True)
    try:
        got = run_peers_beside_a_gated_compile(pool, tmp_path)
    finally:
        pool.close()
    assert got.timed_out and not got.ok, got
    assert pool.limit.median_s is not None and pool.limit.fixed_s == 120.0
    assert got.error == pool.limit.why()
    assert got.error.startswith(f"compile took longer than {pool.limit.seconds:g} s, ")
    assert "x this run's median compile of" in got.error
    assert got.error.endswith("(run.compile_timeout_s: auto); sweep resume DIR --retry "
                              "timeout gives it the full 120 s")
    assert got.compile_ms is not None and got.compile_ms < 120_000


def test_a_config_at_least_as_heavy_as_one_a_learnt_limit_stopped_is_not_compiled(
        monkeypatch, tmp_path):
    # The gated compile is stopped by the learnt limit: the same config again (as heavy in
    # every parameter) ends at once, uncompiled, as a hint it is not compiled either; a
    # config of other parameters still compiles.
    pool = gated_pool_of_low_floor(monkeypatch, 120.0, adaptive=True)
    try:
        stopped = run_peers_beside_a_gated_compile(pool, tmp_path)
        assert stopped.timed_out, stopped
        pool.hint(20, {"GATE": str(tmp_path), "ROLE": "wait"})
        assert not pool._hints
        pool.submit(21, {"GATE": str(tmp_path), "ROLE": "wait"})
        ruled_out = pool.take([21])
        pool.submit(22, {"GATE": str(tmp_path), "ROLE": "peer", "n": 0})
        peer = result(pool, 22)
    finally:
        pool.close()
    assert ruled_out is not None, "a config the rule stops waits for nothing"
    got = ruled_out[1]
    assert got.timed_out and not got.ok and got.compile_ms is None, got
    assert got.error == ("not compiled: at least as heavy in every parameter as trial 0, "
                         "whose " + stopped.error.replace("gives it", "gives this config"))
    assert peer.ok, peer


def test_a_pool_without_the_adaptive_limit_keeps_the_fixed_one_as_a_retry_does(
        monkeypatch, tmp_path):
    # sweep resume --retry timeout sends compile_limit_auto False: the same peers teach
    # nothing, and the gated compile is stopped by the fixed limit, saying so.
    pool = gated_pool_of_low_floor(monkeypatch, 3.0, adaptive=False)
    try:
        got = run_peers_beside_a_gated_compile(pool, tmp_path)
    finally:
        pool.close()
    assert got.timed_out, got
    assert got.error == "compile took longer than 3 s (run.compile_timeout_s)"
    assert pool.limit == CompileLimit(3.0)


def test_a_limit_the_driver_sends_stops_a_compile_already_running_at_the_tighter_limit(
        monkeypatch, tmp_path):
    # A pool that has learnt nothing yet (no compile has ended) gets the driver's limit,
    # learnt from other workers or an earlier session: the compile running since before
    # stops at it.
    tests_on_path(monkeypatch)
    pool = adaptive_gated_pool(120.0, adaptive=True)
    try:
        pool.submit(0, {"GATE": str(tmp_path), "ROLE": "wait"})
        while not (tmp_path / "waiting").exists():
            pool.wait(0.05)
        sent = CompileLimit(0.5, median_s=0.05, fixed_s=120.0)
        pool.set_limit(sent)
        got = result(pool, 0)
    finally:
        pool.close()
    assert got.timed_out and got.error == sent.why(), got


@pytest.mark.parametrize("retry", [frozenset(), frozenset({"timeout"})])
def test_a_new_runs_worker_pools_learn_the_limit_and_a_retrys_keep_the_fixed_one(
        monkeypatch, retry):
    # The settings every runtime hands its workers (local, Ray, and the early pool's)
    # carry whether pools learn: run.compile_timeout_s auto does, `sweep resume --retry`
    # does not (what a limit stopped gets the fixed limit).
    from dataclasses import replace

    from actors.protocol import WorkerSettings
    from actors.worker import make_compiler
    from sweep.run.assembly import _compile_limit, worker_settings
    from sweep.spec import load_spec

    spec = load_spec(Path(__file__).parent.parent / "configs" / "quickstart.yaml",
                     import_kernel=False)
    limit = _compile_limit(spec, None, retry)
    assert worker_settings(spec, "cuda").compile_limit_auto
    tests_on_path(monkeypatch)
    settings = WorkerSettings(
        backend="cuda", kernel="gated_kernel:KERNEL", problem={}, trial_timing=(1, 1),
        finalist_timing=(1, 1), tolerance=None, seed=0, simulate={}, compile_workers=1)
    pool = make_compiler(replace(settings, compile_timeout_s=limit.fixed_s,
                                 compile_limit_auto=limit.adaptive))
    assert isinstance(pool, CompilePool)
    try:
        assert pool._learner.adaptive == (not retry)
        assert pool.limit == CompileLimit(spec.run.trial_timeout_s)
    finally:
        pool.close()


@pytest.fixture
def prepared(monkeypatch, tmp_path):
    """A fork server started before any pool (as sweep/engines/prestart.py starts one):
    (address, key) for pools to adopt."""
    import json
    import secrets

    from actors import child
    from actors.compile_pool import FORK_SAFE_ENV

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    address, key = str(tmp_path / "forks"), secrets.token_hex(child.KEY_BYTES)
    server = child.start_detached(
        "actors.child:serve_prepared", address, key, "actors.compile_process:prepare",
        json.dumps({"kernel": "matmul", "kernel_path": ""}),
        env={**os.environ, **FORK_SAFE_ENV})
    yield address, key, server
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()


def test_pools_that_adopt_a_prepared_fork_server_compile_from_its_forks(prepared):
    address, key, server = prepared
    pools = [CompilePool(1, CompileJob("matmul", PROBLEM), CompileLimit(60),
                         forks=(address, key, server.pid)) for _ in range(2)]
    try:
        for n, pool in enumerate(pools):
            assert pool._server.process is None  # no server (no imports) of its own
            pool.submit(n, {**CONFIG, "BLOCK_N": 16 * (n + 1)})
        assert all(result(pool, n).ok for n, pool in enumerate(pools))
        for pool in pools:  # each pool's process descends from the prepared server
            pid = pool._procs[0].child.process.pid
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            grandparent = int(Path(f"/proc/{parent}/stat").read_text()
                              .rsplit(")", 1)[1].split()[1])
            assert grandparent == server.pid
    finally:
        for pool in pools:
            pool.close()


def test_a_pool_whose_prepared_server_is_gone_starts_a_server_of_its_own(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gone = subprocess.Popen(["true"])
    gone.wait()
    pool = CompilePool(1, CompileJob("matmul", PROBLEM), CompileLimit(60),
                       forks=(str(tmp_path / "nobody"), "00" * 16, gone.pid))
    try:
        assert pool._server.process is not None
        pool.submit(0, CONFIG)
        assert result(pool, 0).ok
    finally:
        pool.close()


def test_a_kernel_configs_problems_compile_one_after_another_to_share_its_binary(
        monkeypatch, tmp_path):
    # In a sweep over problems a kernel config's problems mostly share one binary: a
    # second process compiling it at the same time would pay the whole compile again.
    tests_on_path(monkeypatch)
    pool = CompilePool(3, CompileJob("gated_kernel:KERNEL", {}, problem_keys=("P", "dtype")),
                       CompileLimit(20))
    try:
        wait_ready(pool)
        gate = str(tmp_path)
        wait = {"GATE": gate, "ROLE": "wait", "dtype": "float16"}
        pool.submit(0, {**wait, "P": 1})  # waits until 3 opens
        pool.submit(1, {**wait, "P": 2})  # 0's binary: waits for it
        pool.submit(2, {**wait, "P": 1, "dtype": "float32"})  # another dtype, another binary
        while not (tmp_path / "waiting").exists():
            pool.wait(0.01)
        pool.take(())
        with pool._lock:  # a process is idle, and 1 waits for 0's binary all the same
            assert sorted(p.task[0] for p in pool._procs if p is not None and p.task) == \
                [0, 2]
        pool.submit(3, {**wait, "ROLE": "open", "P": 1, "BLOCK": 2})  # a binary of its own
        assert all(result(pool, key).ok for key in range(4))
        # Two compiles of one binary that both took a compile's time: its problems do not
        # share it after all (a constexpr size), and it is held back no more.
        peer = {"GATE": gate, "ROLE": "peer", "dtype": "float16"}
        pool.submit(4, {**peer, "P": 1})
        assert result(pool, 4).ok
        pool.submit(5, {**peer, "P": 2})
        assert result(pool, 5).ok
        with pool._lock:
            assert pool._binaries[5] in pool._unshared
            assert pool._binaries[0] not in pool._unshared  # 1 took a cache hit's time
    finally:
        pool.close()
