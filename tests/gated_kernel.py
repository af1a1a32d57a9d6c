"""A stand-in kernel for tests of the compile pool's concurrency: its "compile" (the only
thing the pool calls, fn.warmup) waits at a gate in a directory until another config's
compile opens it; a "peer" compile takes at least PEER_S (a real compile's time, not a
cache hit's), so a gated one outlasts its peers by construction. No Triton involved."""

import time
from pathlib import Path

from sweep_kernels import Kernel

PEER_S = 0.1


class GatedCompile:
    def warmup(self, *args, grid, GATE: str, ROLE: str, **config) -> None:
        gate = Path(GATE)
        if ROLE == "peer":
            time.sleep(PEER_S)  # a duration, not a wait for anything
            return
        if ROLE == "open":
            (gate / "open").touch()
            return
        (gate / "waiting").touch()
        deadline = time.monotonic() + 60
        while not (gate / "open").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("nobody opened the gate")
            time.sleep(0.01)


KERNEL = Kernel(name="gated", fn=GatedCompile(), problem_defaults={},
                make_inputs=lambda problem, device, seed: (),
                reference=lambda inputs, problem: None,
                launch_args=lambda inputs, problem: ((), None),
                grid=lambda problem, config: (1,))
