"""A new run's search decisions that must not change on resume: its batch size (from this
cluster's size) and its warm start (from the cache as it is now), kept in run.json."""

from __future__ import annotations

from sweep.search.strategies import SearchPlan, batch_size
from sweep.search.warm_start import warm_start
from sweep.spec import Spec
from sweep.spec.space import Space


def plan_search(spec: Spec, space: Space, backend: str, workers: int,
                compile_workers: int) -> tuple[SearchPlan | None, str]:
    """The plan (None: exhaustive, nothing to decide) and the line that says it."""
    options = spec.search
    if options.exhaustive:
        return None, ""
    batch = batch_size(options, workers, compile_workers)
    warm = warm_start(spec, space, backend)
    what = f"batches of {batch}" if options.strategy == "guided" else \
        f"a first rung of {options.sample:g} of the space"
    line = f"search: {options.strategy}, {what}" + (
        f"; warm start: {len(warm.indices)} configs from {warm.source}" if warm else "")
    return SearchPlan(batch, tuple(warm.indices) if warm else (),
                      warm.source if warm else None), line
