"""`sweep run`, `sweep resume`, `sweep report`, `sweep best`, `sweep submit`.

Exit codes: 0 complete (or stopped by --max-trials or --time-budget), 1 internal failure
(a full disk among them), 2 bad input, 3 complete but no config succeeded, 130 stopped by
SIGINT, 143 stopped by SIGTERM. Progress goes to stderr, the summary to stdout.

The installed command starts in sweep/command.py; this module is also what an in-process
caller (tests) runs, and it changes nothing of the process by being imported.
"""

from __future__ import annotations

import argparse
import errno
import shlex
import sys
import time
from pathlib import Path

from actors.backends import CHOICES
from sweep import EXIT_BAD_INPUT, EXIT_FAILED, SweepFailed
from sweep.console import Output
from sweep.run.stop import StopController

_DEFAULT = Path()  # --html given without a path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sweep", description=(__doc__ or "").splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start a sweep from a spec")
    run.add_argument("spec", type=Path)
    run.add_argument("--out", type=Path, help="run directory (default: a new one under runs/)")
    _cluster_args(run)
    run.add_argument("--backend", choices=CHOICES)
    run.add_argument("--force", action="store_true",
                     help="tune even when the best-config cache holds a complete run's best "
                          "for this kernel, problem and device")
    resume = sub.add_parser("resume", help="continue a stopped run in place")
    resume.add_argument("dir", type=Path)
    resume.add_argument("--retry", metavar="STATUS[,STATUS]",
                        help="run the configs recorded with these statuses again (e.g. "
                             "timeout), compiles limited by run.trial_timeout_s alone; "
                             "pruned: every config a search left out")
    _cluster_args(resume)
    best = sub.add_parser("best", help="a run's best config, or the cached best for a spec's "
                                       "kernel and problem: as JSON and a triton.Config line")
    best.add_argument("target", type=Path, metavar="DIR|SPEC")
    shown = best.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="only JSON (one document)")
    shown.add_argument("--python", type=Path, metavar="PATH",
                       help="write the run's bests as a self-contained Python module, a "
                            "dispatch table (config_for(problem)), at PATH (-: stdout); "
                            "only a module this command wrote is replaced")
    report = sub.add_parser("report", help="summarise a run directory")
    report.add_argument("dir", type=Path)
    report.add_argument("--top", type=int, default=5, help="how many of the fastest to list")
    report.add_argument("--json", action="store_true",
                        help="the report as one JSON document, for scripts")
    report.add_argument("--html", type=Path, nargs="?", const=_DEFAULT, metavar="PATH",
                        help="also write a self-contained HTML report (default: DIR/report.html)")
    report.add_argument("--plot", type=Path, metavar="DIR",
                        help="also write the report's plots as PNG files into DIR")
    from sweep.submit import add_arguments

    add_arguments(sub.add_parser("submit", help="run a sweep on a Ray cluster as a Ray Job"))
    return p


def _cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runtime", choices=("auto", "local", "ray"),
                   help="where workers run: local (processes of this machine, no Ray), ray, "
                        "or auto (the default, and run.runtime's): Ray where --address, "
                        "RAY_ADDRESS or a `ray start` head on this machine names a cluster, "
                        "else local")
    p.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS, else one "
                                     "`ray start` began on this machine); `local` starts a "
                                     "private Ray instance")
    p.add_argument("--max-trials", type=int, metavar="N",
                   help="run at most N trials in this invocation, then stop resumably")
    p.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="stop resumably (as a signal would) once the command has run this "
                        "long")
    p.add_argument("--trials-jsonl", type=Path, metavar="PATH",
                   help="append each finished trial to PATH as a JSON line, as it finishes")
    p.add_argument("--cache-partial", action="store_true",
                   help="write an interrupted run's best to the best-config cache "
                        "(marked partial); by default only a complete run's best goes there")


def main(argv: list[str] | None = None, *, stop: StopController | None = None,
         started: float | None = None) -> int:
    """The command's arguments (argv None: sys.argv). stop: handlers the caller installed
    and keeps (the command's own, from its first moment); without it, handlers are
    installed for this call only. started: when the command began (time.monotonic())."""
    args = _parser().parse_args(argv)
    own = stop is None
    stop = stop or StopController()
    stop.install()  # again: Ray's import may have replaced them
    try:
        return _main(args, stop, Output.standard(),
                     started if started is not None else time.monotonic(),
                     own_process=not own)
    finally:
        if own:
            stop.restore()


def _main(args: argparse.Namespace, stop: StopController, io: Output, started: float,
          own_process: bool = False) -> int:
    from storage.journal import JournalError
    from storage.lock import RunDirBusy
    from sweep.spec import SpecError

    command = shlex.join(["sweep", *(sys.argv[1:] if sys.argv[1:2] == [args.command]
                                     else [args.command])])
    try:
        if args.command == "report":
            from sweep.report.command import report

            html = args.dir / "report.html" if args.html is _DEFAULT else args.html
            return report(args.dir, args.top, io.out, as_json=args.json, html=html,
                          plot=args.plot)
        if args.command == "best":
            from sweep.best import show_best

            return show_best(args.target, args.json, io.out, args.python)
        from sweep.api import check_limits

        check_limits(args.max_trials, args.time_budget)
        if args.command == "submit":
            from sweep.submit import submit

            return submit(args, stop, io)
        from sweep.api import invoke, observers
        from sweep.run.request import Request, retry_statuses

        watching = observers(None, args.trials_jsonl,
                             lambda message: io.note(f"warning: {message}"), "--trials-jsonl")
        request = Request(
            address=args.address, runtime=args.runtime, max_trials=args.max_trials,
            time_budget_s=args.time_budget,
            cache_partial=args.cache_partial, force=getattr(args, "force", False),
            observers=tuple(watching))
        try:
            if args.command == "run":
                code, _ = invoke("run", args.spec, request, stop, io, started,
                                 out_dir=args.out, backend=args.backend, label=command,
                                 shut_down=not own_process)
            else:
                code, _ = invoke("resume", args.dir, request, stop, io, started,
                                 retry=retry_statuses(args.retry), label=command,
                                 shut_down=not own_process)
        finally:
            for observer in watching:
                observer.close()
        return code
    except (SpecError, JournalError, RunDirBusy) as e:
        # JournalError: a run directory damaged beyond its torn last line; touch nothing.
        io.note(f"error: {e}")
        return EXIT_BAD_INPUT
    except SweepFailed as e:
        io.note(f"error: {e}")
        return EXIT_FAILED
    except OSError as e:
        if e.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        io.note(f"error: {_too_many_files(e, args)}")
        return EXIT_FAILED


def _too_many_files(e: OSError, args: argparse.Namespace) -> str:
    """The one line for a process, or a system, out of file descriptors: the cause and
    what to do. The journal is written in whole groups and every other file atomically,
    so nothing is left damaged; a run goes on with sweep resume."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    what = (f"this process may open {soft} files (`ulimit -n`); raise it, e.g. `ulimit -n "
            "4096`,") if e.errno == errno.EMFILE else "the system's open files are used up;"
    run = getattr(args, "out", None) or getattr(args, "dir", None)
    then = f" then: sweep resume {shlex.quote(str(run))}" if args.command in ("run", "resume") \
        and run is not None and (Path(run) / "run.json").exists() else " and run it again"
    return f"too many open files: {what}{then}"
