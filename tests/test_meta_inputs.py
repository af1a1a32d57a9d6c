"""A make_inputs run on the meta device (actors/meta_inputs.py) gives each tensor the dtype,
shape, strides and offset a real run gives it: what a compile specialises on."""

import torch

from actors.meta_inputs import on_meta
from sweep_kernels import load_kernel


def geometry(value):
    if isinstance(value, torch.Tensor):
        return value.dtype, tuple(value.shape), value.stride(), value.storage_offset()
    return value


def many_ops(problem, device, seed):
    """What make_inputs in the field do: draws with a generator on the device asked for,
    arithmetic with Python numbers, casts, layouts, views, *_like, in-place draws."""
    g = torch.Generator(device=device).manual_seed(seed)
    rows, cols = problem["rows"], problem["cols"]
    x = torch.randn(rows, cols, generator=g, device=device).to(torch.float16)
    w = (1 + 0.1 * torch.randn(cols, generator=g, device=device)).to(torch.float16)
    noise = torch.randn_like(x) * 3 - 1
    noise.normal_(generator=g)
    return (
        x, w, noise, torch.empty_like(x), torch.zeros_like(x, dtype=torch.int32),
        torch.empty(rows, dtype=torch.float32, device=x.device),
        (x.t() * 2).contiguous(), x.t() * 2, x[:, 1:], x[:, 1:] + 1,
        torch.where(x > 0, x, 0.5), x.float().exp(), w[None, :] * x,
        torch.randint(0, 7, (5, 3), generator=g, device=device) // 3,
        torch.randint(9, (4,), device=device, dtype=torch.int32),
        torch.rand((4, 4), device=device) < 0.5, torch.randn(size=(3, 2), device=device),
        torch.arange(10, device=device), torch.cat([x, x]), x.sum(0), rows * 2,
    )


def test_tensors_made_on_the_meta_device_have_the_real_ones_geometry():
    problem = {"rows": 64, "cols": 48}
    with on_meta():
        made = many_ops(problem, "cpu", 0)
    real = many_ops(problem, "cpu", 0)
    assert all(t.is_meta for t in made if isinstance(t, torch.Tensor))
    assert [geometry(t) for t in made] == [geometry(t) for t in real]


def test_the_projects_kernels_inputs_are_made_on_the_meta_device_alike():
    for name in ("matmul", "softmax"):
        kernel = load_kernel(name)
        problem = {**kernel.problem_defaults}
        if "M" in problem:  # small enough to make for real here
            problem.update(M=96, N=80, K=64)
        else:
            problem.update(rows=96, cols=80)
        with on_meta():
            made = kernel.arguments(kernel.make_inputs(problem, "cpu", 0), problem)[0]
        real = kernel.arguments(kernel.make_inputs(problem, "cpu", 0), problem)[0]
        assert [geometry(a) for a in made] == [geometry(a) for a in real], name


def test_a_tensor_moved_to_another_device_stays_on_the_meta_device():
    with on_meta():
        x = torch.empty(4, 4, device="cpu")
        moved = [x.to("cpu"), x.to(device="cuda"), x.cuda(), x.cpu(), x.pin_memory()]
    assert all(t.is_meta and t.shape == (4, 4) for t in moved)


def awkward(problem, device, seed):
    """Promotion against 0-d tensors, layouts asked for, copies of views, numpy sizes."""
    import numpy as np

    x = torch.randn(64, 48, device=device, dtype=torch.float16)
    v = x[:, :32].t()
    return (x * torch.tensor(0.5), x + torch.ones((), dtype=torch.bfloat16),
            x / x.float().norm(), x.t().clone(memory_format=torch.contiguous_format),
            torch.empty_like(x.t(), memory_format=torch.contiguous_format),
            torch.empty_like(v), v.clone(), v + 1, torch.randn(np.int64(5), device=device),
            torch.randn(65, device=device)[1:].clone())


def test_promotion_layouts_and_copies_of_views_come_out_as_torch_makes_them():
    with on_meta():
        made = awkward({}, "cpu", 0)
    assert [geometry(t) for t in made] == [geometry(t) for t in awkward({}, "cpu", 0)]


def test_the_stand_ins_of_a_view_are_laid_out_as_the_launchs_copy_of_it():
    # A launch runs on a copy of the draw (ProblemInputs): a view in it reaches the kernel
    # dense and aligned, and a compile for the view itself would be no launch's binary.
    import dataclasses

    from actors.compile_target import stand_ins
    from actors.triton_backend import ProblemInputs

    base = load_kernel("softmax")

    def views(problem, device, seed):
        x = torch.randn(problem["rows"], problem["cols"] + 3, device=device)
        return (x[:, 1:],)  # strides (cols + 3, 1), offset 1: a copy has (cols + 2, 1), 0

    kernel = dataclasses.replace(base, make_inputs=views)
    problem = {**base.problem_defaults, "rows": 8, "cols": 16}
    launched = ProblemInputs(kernel, problem, "cpu", 0).fresh()[0]
    compiled = stand_ins(kernel, problem, 0)[0]
    assert [geometry(a._tensor) if hasattr(a, "_tensor") else a for a in compiled] == \
        [geometry(a) for a in launched]
    assert geometry(launched[0])[2:] == ((18, 1), 0)
