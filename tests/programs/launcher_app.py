"""A launcher as torchrun is one: it calls no kernel itself and starts Python processes that
do, each with its own size (`N...`): `--together` starts them at once (ranks), else one
after another (a script's steps). Its exit code is the worst of theirs."""

from __future__ import annotations

import subprocess
import sys

STEP = ("import sys, torch, autotuned_kernels as k; n = int(sys.argv[1]); "
        "torch.manual_seed(n); s, y = k.fused_add_norm(torch.randn(2, n), "
        "torch.randn(2, n), torch.rand(n) + 0.5); print(n, float(y.abs().sum()))")


def main(argv: list[str]) -> int:
    sizes = [a for a in argv if a.isdigit()]
    commands = [[sys.executable, "-c", STEP, n] for n in sizes]
    if "--together" in argv:
        children = [subprocess.Popen(c) for c in commands]
        return max(child.wait() for child in children)
    return max(subprocess.run(c).returncode for c in commands)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
