"""Calls tests/programs/inplace_kernels.py's kernels once each, then prints the configs its
autotuners launched."""

import inplace_kernels as k
import torch
import triton

torch.manual_seed(0)
x, out = torch.randn(40), torch.ones(40)
k.double[lambda META: (triton.cdiv(40, META["BLOCK"]),)](x, 40)
k.accumulate[lambda META: (triton.cdiv(40, META["BLOCK"]),)](x, out, 40)
print("launched", k.double.best_config.kwargs["BLOCK"], k.accumulate.best_config.kwargs["BLOCK"])
