"""Which device type each worker asks for: shared by the engines (sweep/engines/local_engine.py,
sweep/engines/ray/placement.py), which differ only in how they count the devices."""

from __future__ import annotations

from sweep.spec import Spec, SpecError


def kinds_for(spec: Spec, available: dict[str, int], cap: int | None, what: str
           ) -> tuple[str, ...]:
    """A device type per worker: every type the spec allows, a worker per device of it,
    at most `cap` in all, taken from the types in turn (a cap keeps every type)."""
    allowed = spec.run.accelerator_types
    if allowed is not None:
        missing = [t for t in allowed if t not in available]
        if len(missing) == len(allowed):
            has = ", ".join(f"{t or 'unlabelled'} x{n}" for t, n in sorted(available.items()))
            raise SpecError(f"{spec.path}: run.accelerator_types: the cluster has no "
                            f"{what} of type {', '.join(allowed)} (it has: {has or 'none'})")
    counts = {t: n for t, n in sorted(available.items()) if allowed is None or t in allowed}
    kinds = [t for k in range(max(counts.values(), default=0)) for t, n in counts.items()
             if k < n]
    return tuple(sorted(kinds[:cap] if cap else kinds))
