"""What a person reads about a run: the end-of-run summary and `sweep report DIR`."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from rich.console import Console

from sweep import EXIT_OK
from sweep.tally import Tally


def say(console: Console, text: str) -> None:
    """Plain text: no markup, no highlighting, no wrapping (lines are grep-able)."""
    console.print(text, highlight=False, markup=False, soft_wrap=True)


def report(path: Path, top: int, out: Console) -> int:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from sweep.rundir import RunDir
    from sweep.spec import SpecError

    run = RunDir(path)
    if not run.trials.exists():
        raise SpecError(f"{path}: no trials.parquet (resume the run to rebuild it)")
    try:
        table = pq.read_table(run.trials)
        meta = table.schema.metadata or {}
        state = meta.get(b"state", b"?").decode(errors="replace")
        counts = {d["values"]: d["counts"]
                  for d in pc.value_counts(table["status"]).to_pylist()}
        ok = table.filter(pc.equal(table["status"], "ok")).sort_by("latency_ms")
    except (OSError, KeyError, ValueError, TypeError, pa.ArrowException) as e:
        raise SpecError(f"{run.trials}: unreadable ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:200] if str(e) else ''}); "
                        f"resume the run to rebuild it") from None
    say(out, f"{path}: {state}, {table.num_rows} trials · "
             + " · ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for row in ok.slice(0, top).to_pylist():
        say(out, f"  #{row['index']:<6} {row['latency_ms']:.4g} ms "
                 f"[{row['latency_p20_ms']:.4g}, {row['latency_p80_ms']:.4g}]  {row['config']}")
    return EXIT_OK


def cached_best(spec_path: Path, out: Console) -> int:
    from storage.cache import cache_dir, lookup
    from sweep.spec import load_spec

    spec = load_spec(spec_path)
    entries = lookup(spec.kernel, spec.kernel_source, spec.problem)
    if not entries:
        say(out, f"no cached best for {spec.kernel} {json.dumps(dict(spec.problem))} "
                 f"in {cache_dir()}")
        return EXIT_OK
    for e in sorted(entries, key=lambda e: (e.backend, e.device)):
        say(out, f"{e.device} ({e.backend}): {json.dumps(dict(e.config), sort_keys=True)} "
                 f"{e.latency_ms:.4g} ms{' (partial)' if e.partial else ''} from {e.run_dir}")
    return EXIT_OK


def resume_command(path: Path) -> str:
    return f"sweep resume {shlex.quote(str(path))}"


def print_summary(out: Console, name: str, path: Path, state: str, tally: Tally,
                  elapsed_s: float, resume_options: str = "") -> None:
    counts = " · ".join(f"{k} {v}" for k, v in sorted(tally.counts.items())) or "none"
    say(out, f"sweep {name}: {state} — {tally.done} of {tally.total} trials in "
             f"{elapsed_s:.1f} s ({counts})")
    if tally.best:
        partial = "" if state == "complete" else " (partial)"
        # On a cluster of several device types, the best of each (the fastest first).
        bests = sorted(tally.by_device.values(), key=lambda b: (b.latency_ms, b.index)) \
            if len(tally.by_device) > 1 else [tally.best]
        for b in bests:
            say(out, f"  best: #{b.index} {json.dumps(b.config, sort_keys=True)} "
                     f"{b.latency_ms:.4g} ms on {b.device}{partial}")
    else:
        say(out, "  best: none (no trial succeeded)")
    say(out, f"  results: {path}/trials.parquet")
    if state != "complete":
        say(out, f"  resume with: {resume_command(path)}{resume_options}")


