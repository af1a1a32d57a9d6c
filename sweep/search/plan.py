"""A new run's search decisions that must not change on resume: its batch size (from this
cluster's size) and its warm start (from the cache as it is now), kept in run.json."""

from __future__ import annotations

from sweep.search.strategies import SearchPlan, batch_size, first_sample, searches
from sweep.search.warm_start import warm_start
from sweep.spec import Spec
from sweep.spec.search_options import SearchOptions
from sweep.spec.space import Space


def plan_search(spec: Spec, space: Space, backend: str, workers: int,
                compile_workers: int) -> tuple[SearchPlan | None, str]:
    """The plan (None: exhaustive, nothing to decide) and the line that says it."""
    options = spec.search
    if options.exhaustive:
        return None, ""
    batch = batch_size(options, workers, compile_workers)
    small = [n for n in space.sizes if not searches(options, n)]
    if len(small) == len(space.sizes):  # a warm start would only reorder them
        return SearchPlan(batch), too_small(options, space.sizes)
    warm = warm_start(spec, space, backend)
    what = f"batches of {batch}" if options.strategy == "guided" else \
        f"a first rung of {options.sample:g} of the space"
    line = f"search: {options.strategy}, {what}" + (
        f"; warm start: {len(warm.indices)} configs from {warm.source}" if warm else "") + (
        f"; {len(small)} of {len(space.sizes)} problems have too few configs to search: "
        "each of those runs them all" if small else "")
    return SearchPlan(batch, tuple(warm.indices) if warm else (),
                      warm.source if warm else None), line


def too_small(options: SearchOptions, sizes: tuple[int, ...]) -> str:
    """The note of a run whose every space is too small to search (strategies.searches)."""
    first, n = first_sample(options), max(sizes)
    # Halving's rungs still narrow what it screened, now the whole space, to the finalists.
    how = "exhaustive" if options.strategy == "guided" else "its first rung: the whole space"
    if len(sizes) == 1:
        return (f"search: {options.strategy}'s budget, {options.budget_configs(n)} of {n} "
                f"configs, ends within its first sample of {first}: a seeded sample's best "
                f"at most, so all {n} run instead ({how})")
    return (f"search: {options.strategy}'s budget ends within its first sample of {first} "
            f"configs in each of the {len(sizes)} problems (at most {n} configs each): a "
            f"seeded sample's best at most, so every config runs instead ({how})")
