"""The built-in matmul as a package would ship it whose import sets up the GPU runtime, as
Liger-Kernel does (its ops/utils.py calls torch.cuda.is_available() at import). Once CUDA
is initialised, a forked process cannot use it: torch marks every child forked after that
moment (a pthread_atfork hook, "poison fork") and its first CUDA call raises. The CPU has
no such rule, so this module keeps torch's: its import marks the processes forked after
it (os.register_at_fork), and make_inputs refuses in a marked one, with torch's words.

KERNEL behaves like torch.cuda.is_available(), which asks NVML instead, leaving fork
alone, when PYTORCH_NVML_BASED_CUDA_CHECK=1 was set before the import; KERNEL_INIT like
torch.cuda.get_device_capability(), which always initialises CUDA; KERNEL_BROKEN's inputs
cannot be made in any compile process, forked or not (CUDA_VISIBLE_DEVICES naming no GPU).
"""

import os
from dataclasses import replace

from sweep_kernels.matmul import KERNEL as MATMUL

ASKED_NVML = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1"
_forked = False


def _mark() -> None:
    global _forked
    _forked = True


os.register_at_fork(after_in_child=_mark)
REFUSAL = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
           "multiprocessing, you must use the 'spawn' start method")


def _guarded(poisons: bool):
    def make_inputs(problem, device, seed):
        if _forked and poisons:
            raise RuntimeError(REFUSAL)
        return MATMUL.make_inputs(problem, device, seed)

    return make_inputs


def _never(problem, device, seed):
    raise RuntimeError("No CUDA GPUs are available")


KERNEL = replace(MATMUL, make_inputs=_guarded(poisons=not ASKED_NVML))
KERNEL_INIT = replace(MATMUL, make_inputs=_guarded(poisons=True))
KERNEL_BROKEN = replace(MATMUL, make_inputs=_never)
