"""Triton's one-time cost of a process's first compile, paid beside its other start-up.

Before its first compile, a cache hit included, Triton hashes its own sources and library
(triton.runtime.cache.triton_key, cached for the process): 0.35 s on this project's 2-core
machine, about 0.6 s on an H200 host, where each of 15 fresh compile processes paid it
before its first answer (benchmarks/results/heavy_compiles_race_runs/matmul_warm.tar.gz:
each first compile of a warm cache 0.6 s, the rest milliseconds). Hashing reads files and
releases the GIL, so a thread does it while the process imports torch and the kernel.
"""

from __future__ import annotations

import contextlib
import threading

_KEYING: list[threading.Thread] = []  # this process's, once started


def key_triton() -> threading.Thread:
    """Start hashing Triton's sources on a thread, once a process (a spare begun ahead
    starts it, and the launcher or fork server it becomes asks again); join it before
    forking."""
    if _KEYING:
        return _KEYING[0]

    def key() -> None:
        with contextlib.suppress(Exception):  # a Triton without it: the compile hashes
            from triton.runtime import cache

            cache.triton_key()

    thread = threading.Thread(target=key, name="triton-key", daemon=True)
    thread.start()
    _KEYING.append(thread)
    return thread
