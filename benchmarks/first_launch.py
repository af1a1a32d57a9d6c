"""How long a process's first launch of a cached Triton kernel takes, and what it imports."""
import json, sys, time
t = time.time()
import torch, triton  # noqa
imported = time.time() - t
from sweep_kernels.matmul import KERNEL
problem = {"M": 1024, "N": 1024, "K": 1024, "dtype": "float16"}
inputs = KERNEL.make_inputs(problem, "cuda", 0)
args, _ = KERNEL.launch_args(inputs, problem)
configs = [{"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3},
           {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}]
out = {"import_s": imported}
for n, c in enumerate(configs):
    before = set(sys.modules)
    t = time.time()
    KERNEL.fn[KERNEL.grid(problem, c)](*args, **c)
    torch.cuda.synchronize()
    out[f"launch{n}_s"] = time.time() - t
    new = sorted(set(sys.modules) - before)
    out[f"launch{n}_new_modules"] = len(new)
    out[f"launch{n}_top"] = sorted({m.split(".")[0] + "." + m.split(".")[1] if "." in m else m for m in new})[:60]
print(json.dumps(out))
