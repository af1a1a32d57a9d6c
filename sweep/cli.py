"""`sweep run`, `sweep resume`, `sweep report`, `sweep best`, `sweep submit`, `sweep capture`,
`sweep exec`.

Exit codes: 0 complete (or stopped by --max-trials or --time-budget), 1 internal failure
(a full disk among them), 2 bad input, 3 complete but no config succeeded, 130 stopped by
SIGINT, 143 stopped by SIGTERM. Progress goes to stderr, the summary to stdout.

The installed command starts in sweep/command.py; this module is also what an in-process
caller (tests) runs, and it changes nothing of the process by being imported.
"""

from __future__ import annotations

import argparse
import errno
import re
import shlex
import sys
import textwrap
import time
from pathlib import Path
from typing import NoReturn

from actors.backends import CHOICES
from sweep import EXIT_BAD_INPUT, EXIT_FAILED, SweepFailed
from sweep.console import Output
from sweep.run.stop import StopController

_DEFAULT = Path()  # --html given without a path

EXAMPLES = """examples:
  sweep run configs/quickstart.yaml            tune a kernel; the run goes under runs/
  sweep run my.yaml --out runs/mm --backend interpret --max-trials 20
  sweep resume runs/mm                         continue a stopped run where it stopped
  sweep report runs/mm --html                  the fastest configs, and a page of plots
  sweep best runs/mm                           the best config, as JSON and triton.Config
  sweep submit my.yaml --address http://HEAD:8265   run it on a Ray cluster as a job
  sweep capture --out caps/app -- python app.py   record an existing program's autotuned calls
  sweep exec runs/prog -- python prog.py       run a program with a run's tuned configs

Exit codes: 0 done (or stopped by --max-trials / --time-budget), 1 internal failure,
2 bad input, 3 no config succeeded, 130/143 stopped by SIGINT/SIGTERM (resumable);
sweep capture, sweep exec: the program's own (2 for their own bad input)."""


class _Parser(argparse.ArgumentParser):
    """argparse, its mistakes said in one line (exit 2), not after a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"error: {_one_line(message)} (sweep {self._command()}"
                                  "--help says more)\n")

    def _command(self) -> str:
        words = self.prog.split()[1:]  # "sweep run" -> ["run"]
        return " ".join(words) + " " if words else ""


def _one_line(message: str) -> str:
    """argparse's message, as the rest of the command says a mistake: "--backend: expected
    one of auto, cuda, ...; got 'cdua'"."""
    m = re.fullmatch(r"argument (\S+?)(?:/\S+)?: invalid choice: (.+?) \(choose from (.+)\)",
                     message)
    if m:
        what = "command" if m[1] == "COMMAND" else m[1]
        return f"{what}: expected one of {m[3].replace(chr(39), '')}; got {m[2]}"
    m = re.fullmatch(r"argument (\S+?)(?:/\S+)?: invalid (int|float) value: (.+)", message)
    if m:
        return f"{m[1]}: expected {'an integer' if m[2] == 'int' else 'a number'}; got {m[3]}"
    m = re.fullmatch(r"argument (\S+?)(?:/\S+)?: (.+)", message)
    if m:
        return f"{m[1]}: {m[2]}"
    if message.startswith("the following arguments are required: COMMAND"):
        return f"a command is required: one of {', '.join(COMMANDS)}"
    return message


COMMANDS = ("run", "resume", "best", "report", "submit", "capture", "exec")  # as added


def _wrapped(text: str) -> str:
    """A description wrapped as argparse wraps help (a raw formatter keeps the examples)."""
    return textwrap.fill(text, 79)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triton-sweep")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="sweep", formatter_class=argparse.RawDescriptionHelpFormatter,
                description=_wrapped(
                    "Resumable, distributed autotuning sweeps of Triton kernels: run every "
                    "config of a spec's search space, keep each trial's result on disk, "
                    "and report the fastest."),
                epilog=EXAMPLES)
    p.add_argument("--version", action="version", version=f"sweep {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           title="commands")
    _run_args(sub.add_parser("run", help="start a sweep from a spec", description=_wrapped(
        "Start a sweep: check SPEC, then run each config of its space on the workers and "
        "record every trial in a run directory (resumable)."),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  sweep run configs/quickstart.yaml --out runs/qs"))
    _resume_args(sub.add_parser("resume", help="continue a stopped run in place",
                                description=_wrapped(
        "Continue a stopped or killed run in its directory: the configs not yet run, "
        "and nothing twice.")))
    _best_args(sub.add_parser("best", help="a run's best config, or the cached best for a "
                                           "spec's kernel and problem: as JSON and a "
                                           "triton.Config line"))
    _report_args(sub.add_parser("report", help="summarise a run directory", description=_wrapped(
        "What a run found: the fastest configs, the failures by kind, throughput; as "
        "text, JSON, an HTML page or PNG plots.")))
    from sweep.submit import add_arguments

    add_arguments(sub.add_parser("submit", help="run a sweep on a Ray cluster as a Ray Job",
                                 description="Run a sweep on a Ray cluster as a Ray Job, "
                                             "from a machine outside it (needs "
                                             "triton-sweep[cluster])."))
    from sweep.capture_cmd import add_arguments as capture_arguments

    capture_arguments(sub.add_parser(
        "capture", usage="sweep capture --out DIR [--no-tune] [--save-floats] "
                         "[--max-bytes N] [--force] -- PROGRAM ARGS...",
        help="run a program unchanged and record its calls into "
                        "@triton.autotune kernels, as a spec that tunes them all",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=_wrapped(
            "Run PROGRAM unchanged and record each call into a @triton.autotune kernel "
            "whose key is new: the kernel, its configs, the grid of each, and the call's "
            "arguments (integer and boolean tensors saved whole, floating-point ones by "
            "shape). DIR/spec.yaml then tunes them all in one sweep. The program's exit "
            "code is the command's; what it captured is kept."),
        epilog="example:\n  sweep capture --out caps/app -- python app.py --steps 1\n"
               "  sweep run caps/app/spec.yaml --out runs/app"))
    _exec_args(sub.add_parser(
        "exec", help="run a program with a run's tuned configs loaded (no code change)",
        usage="sweep exec [-h] [--nearest] RUN_DIR -- PROGRAM [ARGS ...]",
        description=_wrapped(
            "Run PROGRAM, unchanged, with the tuned configs of RUN_DIR (a run of a "
            "capture's spec) filled into its autotuned kernels before their first call; "
            "a key the run did not tune is left to Triton's own autotune. The program's "
            "exit code is passed on.")))
    return p


def _exec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                   help="the run directory of `sweep run` over a capture's spec")
    p.add_argument("--nearest", action="store_true",
                   help="a key the run did not tune takes the config of the nearest tuned "
                        "key of its kernel (sizes by log2 ratio, the dtypes alike) instead "
                        "of Triton's autotune")


def _split_program(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`sweep exec|capture ... -- PROGRAM ARGS`: the words after the first `--` are the
    program's, options of its own among them (None: no `--`)."""
    if argv[:1] in (["exec"], ["capture"]) and "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    return argv, None


def _run_args(run: argparse.ArgumentParser) -> None:
    run.add_argument("spec", type=Path, metavar="SPEC",
                     help="the spec: a YAML file naming the kernel, problem and space")
    run.add_argument("--out", type=Path, metavar="DIR",
                     help="run directory, new or empty (default: a new one under runs/)")
    _cluster_args(run)
    run.add_argument("--backend", choices=CHOICES,
                     help="how trials run (default: the spec's run.backend, else auto: "
                          "cuda on a GPU, else Triton's CPU interpreter)")
    run.add_argument("--force", action="store_true",
                     help="tune even when the best-config cache holds a complete run's best "
                          "for this kernel, problem and device; with --out DIR holding a "
                          "run, move that run aside and start anew")


def _resume_args(resume: argparse.ArgumentParser) -> None:
    resume.add_argument("dir", type=Path, metavar="DIR", help="the run directory")
    resume.add_argument("--retry", metavar="STATUS[,STATUS]",
                        help="run the configs recorded with these statuses again (e.g. "
                             "timeout), compiles limited by run.trial_timeout_s alone; "
                             "pruned: every config a search left out")
    _cluster_args(resume)


def _best_args(best: argparse.ArgumentParser) -> None:
    best.add_argument("target", type=Path, metavar="DIR|SPEC",
                      help="a run directory, or a spec (its best from the best-config cache)")
    shown = best.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="only JSON (one document)")
    shown.add_argument("--python", type=Path, metavar="PATH",
                       help="write the run's bests as a self-contained Python module, a "
                            "dispatch table (config_for(problem)), at PATH (-: stdout); "
                            "only a module this command wrote is replaced")


def _report_args(report: argparse.ArgumentParser) -> None:
    report.add_argument("dir", type=Path, metavar="DIR", help="the run directory")
    report.add_argument("--top", type=int, default=5, metavar="K",
                        help="how many of the fastest to list (default: 5)")
    report.add_argument("--json", action="store_true",
                        help="the report as one JSON document, for scripts")
    report.add_argument("--html", type=Path, nargs="?", const=_DEFAULT, metavar="PATH",
                        help="also write a self-contained HTML report (default: "
                             "DIR/report.html; needs triton-sweep[report])")
    report.add_argument("--plot", type=Path, metavar="DIR",
                        help="also write the report's plots as PNG files into DIR (needs "
                             "triton-sweep[report])")


def _cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runtime", choices=("auto", "local", "ray"),
                   help="where workers run: local (processes of this machine, no Ray), ray "
                        "(needs triton-sweep[ray]), or auto (the default, and "
                        "run.runtime's): Ray where --address, RAY_ADDRESS or a `ray start` "
                        "head on this machine names a cluster, else local")
    p.add_argument("--address", metavar="ADDR",
                   help="Ray cluster to join (default: RAY_ADDRESS, else one `ray start` "
                        "began on this machine); `local` starts a private Ray instance")
    p.add_argument("--max-trials", type=int, metavar="N",
                   help="run at most N trials in this invocation, then stop resumably "
                        "(default: no limit)")
    p.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="stop resumably (as a signal would) once the command has run this "
                        "long (default: no limit)")
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
    words, program = _split_program(list(sys.argv[1:] if argv is None else argv))
    args = _parser().parse_args(words)
    if program is not None or args.command == "exec":
        args.program = program
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
        if args.command == "capture":
            from sweep.capture_cmd import run_capture

            return run_capture(args, io)
        if args.command == "best":
            from sweep.best import show_best

            return show_best(args.target, args.json, io.out, args.python)
        if args.command == "exec":
            from sweep.exec_cmd import exec_program

            return exec_program(args.run_dir, args.program, args.nearest)
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
                observer.close(lambda: stop.requested)
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
