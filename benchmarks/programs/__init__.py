"""Programs with `@triton.autotune` kernels, run unchanged by benchmarks/autotune_capture.py
under plain python, `sweep capture` and `sweep exec`."""
