"""`sweep run`, `sweep resume`, `sweep report`, `sweep best`, `sweep submit`.

Exit codes: 0 complete (or stopped by --max-trials), 1 internal failure (a full disk
among them), 2 bad input, 130 stopped by SIGINT, 143 stopped by SIGTERM. Progress goes to
stderr, the summary to stdout.
"""

from __future__ import annotations

import time

# When the command began, for the time its summary reports: the user's time is the whole
# command, its imports and Ray's start included. (Not the process's age: a shell running
# `... && sweep run` as its last command may exec it in its own, older process.)
STARTED = time.monotonic()

from sweep.stop import StopController  # noqa: E402

# First thing, before the slower imports below: a Ctrl+C or SIGTERM from here on is a clean
# stop. (One that lands while Python itself starts still ends the process the default way,
# with nothing written.)
STOP = StopController()
STOP.install()

import os  # noqa: E402
import sys  # noqa: E402


def _own_packages_first() -> str:
    """`python -m` puts the current directory first on sys.path, where a user's own folder
    named like one of this project's packages (storage/, actors/) would replace it; with an
    editable install even a place at the end would. So bind this project's top-level
    packages before the directory goes back, at the end: a user's "module:attr" kernel
    still resolves from it. Returns that directory."""
    try:
        here = os.getcwd()
    except OSError:  # the directory was deleted under us
        here = ""
    if sys.path and sys.path[0] in ("", here):  # Python's own entry, not PYTHONPATH's
        del sys.path[0]
    import actors  # noqa: F401
    import storage  # noqa: F401
    import sweep_kernels  # noqa: F401

    if here:
        sys.path.append(here)
    return here


_own_packages_first()

import argparse  # noqa: E402
import shlex  # noqa: E402
from pathlib import Path  # noqa: E402

from rich.console import Console  # noqa: E402

from sweep import EXIT_BAD_INPUT  # noqa: E402
from sweep.report import say  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sweep", description=(__doc__ or "").splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start a sweep from a spec")
    run.add_argument("spec", type=Path)
    run.add_argument("--out", type=Path, help="run directory (default: a new one under runs/)")
    _cluster_args(run)
    run.add_argument("--backend", choices=("auto", "cuda", "interpret", "simulate", "replay"))
    resume = sub.add_parser("resume", help="continue a stopped run in place")
    resume.add_argument("dir", type=Path)
    resume.add_argument("--retry", metavar="STATUS[,STATUS]",
                        help="run the configs recorded with these statuses again (e.g. "
                             "timeout), compiles limited by run.trial_timeout_s alone")
    _cluster_args(resume)
    best = sub.add_parser("best", help="the cached best configs for a spec's kernel and problem")
    best.add_argument("spec", type=Path)
    report = sub.add_parser("report", help="summarise a run directory")
    report.add_argument("dir", type=Path)
    report.add_argument("--top", type=int, default=5, help="how many of the fastest to list")
    from sweep.submit import add_arguments

    add_arguments(sub.add_parser("submit", help="run a sweep on a Ray cluster as a Ray Job"))
    return p


def _cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS, else one "
                                     "`ray start` began on this machine, else a private "
                                     "local instance; `local` for that one)")
    p.add_argument("--max-trials", type=int, metavar="N",
                   help="run at most N trials in this invocation, then stop resumably")
    p.add_argument("--cache-partial", action="store_true",
                   help="write an interrupted run's best to the best-config cache "
                        "(marked partial); by default only a complete run's best goes there")


def main(argv: list[str] | None = None) -> int:
    """The command (argv None: sys.argv) or an in-process call with its arguments."""
    args = _parser().parse_args(argv)
    stop = STOP
    # Again, for an in-process caller (tests) that restored the handlers after a former
    # call. The command itself keeps them to the end: a signal while Python shuts down
    # must not turn a finished run into a KeyboardInterrupt.
    stop.install()
    # An in-process caller's own process began long before this call.
    started = STARTED if argv is None else time.monotonic()
    code = _main(args, stop, Console(), Console(stderr=True), started)
    cluster = sys.modules.get("sweep.cluster")
    if argv is None and cluster is not None and cluster.abandoned():
        # The command ends here although a thread is stuck inside ray.init, on which
        # Ray's exit hooks would wait. (An in-process caller keeps its interpreter.)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _main(args: argparse.Namespace, stop: StopController, out: Console, err: Console,
          started: float) -> int:
    from storage.journal import JournalError
    from storage.lock import RunDirBusy
    from sweep.spec import SpecError

    command = shlex.join(["sweep", *(sys.argv[1:] if sys.argv[1:2] == [args.command]
                                     else [args.command])])
    try:
        if args.command == "report":
            from sweep.report import report

            return report(args.dir, args.top, out)
        if args.command == "best":
            from sweep.report import cached_best

            return cached_best(args.spec, out)
        if args.max_trials is not None and args.max_trials < 1:
            raise SpecError(f"--max-trials: expected an integer >= 1, got {args.max_trials}")
        if args.command == "submit":
            from sweep.submit import submit

            return submit(args, stop, out, err)
        from sweep.session import Session

        retry = _retry_statuses(args.retry) if args.command == "resume" else frozenset()
        session = (Session.start(args.spec, args.out, args.backend, command)
                   if args.command == "run" else Session.reopen(args.dir, err, command))
        session.retry = retry
        return session.execute(args.address, args.max_trials, args.cache_partial, stop, out,
                               err, started=started)
    except (SpecError, JournalError, RunDirBusy) as e:
        # JournalError: a run directory damaged beyond its torn last line; touch nothing.
        say(err, f"error: {e}")
        return EXIT_BAD_INPUT


def _retry_statuses(text: str | None) -> frozenset[str]:
    from storage.records import STATUSES
    from sweep.spec import SpecError

    if text is None:
        return frozenset()
    allowed = [s for s in STATUSES if s != "ok"]
    given = frozenset(t.strip() for t in text.split(","))
    if not given or not given <= set(allowed):
        raise SpecError(f"--retry: expected statuses from {', '.join(allowed)} "
                        f"(comma-separated), got {text!r}")
    return given


if __name__ == "__main__":
    sys.exit(main())
