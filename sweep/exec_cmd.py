"""`sweep exec RUN_DIR [--nearest] -- PROGRAM ARGS...`: run a program, unchanged, with a
run's tuned configs loaded into its autotuned kernels (sweep/autotune/use.py), through the
boot folder put first on its PYTHONPATH and SWEEP_AUTOTUNE_USE: every Python process it
starts loads the same run.

The run is checked first (one line, exit 2, nothing run). The program's exit code is passed
on (128 + N where signal N ended it). A SIGTERM or SIGHUP sent to this command is passed to
the program; a Ctrl+C reaches the program from the terminal, and this command waits for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from sweep.autotune.boot import python_path
from sweep.spec import SpecError

PASSED_ON = (signal.SIGTERM, signal.SIGHUP)


def program_environment(run_dir: Path, nearest: bool,
                        base: dict[str, str] | None = None) -> dict[str, str]:
    """The program's environment: this one, with the boot folder first on PYTHONPATH and
    the run named (SWEEP_AUTOTUNE_NEAREST only where asked: one set outside is dropped)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = python_path(env.get("PYTHONPATH", ""))
    env["SWEEP_AUTOTUNE_USE"] = str(run_dir.resolve())
    env.pop("SWEEP_AUTOTUNE_NEAREST", None)
    if nearest:
        env["SWEEP_AUTOTUNE_NEAREST"] = "1"
    return env


def exec_program(run_dir: Path, program: Sequence[str] | None, nearest: bool) -> int:
    """Check the run, then run the program with it loaded; its exit code."""
    from sweep.autotune.use import load

    if not program:
        raise SpecError("sweep exec: expected the program after --: sweep exec RUN_DIR -- "
                        "python my_program.py ARGS")
    loaded = load(run_dir)  # the refusals the program would meet as it starts, said here
    kernels = len(loaded.table)
    said = (f"sweep exec: {loaded.keys} tuned key{'s' * (loaded.keys != 1)} of {kernels} "
            f"kernel{'s' * (kernels != 1)} from {run_dir}"
            f"{' (a partial run)' if loaded.partial else ''}; any other key is "
            f"{'given the nearest tuned one' if nearest else 'left to Triton'}\n")
    return _run(list(program), program_environment(run_dir, nearest), said)


def _run(program: list[str], env: dict[str, str], said: str = "") -> int:
    """The program's exit code, the signals meant for this command passed to it meanwhile
    (one that comes while it starts, once it has). SIGINT is ignored while it runs: the
    terminal sends it to the program as well (and ignored before it starts, the program
    would inherit that)."""
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def pass_on(signum: int, _frame: FrameType | None) -> None:
        if child is None:
            pending.append(signum)
        else:
            child.send_signal(signum)

    before = {s: signal.signal(s, pass_on) for s in PASSED_ON}
    try:
        try:
            child = subprocess.Popen(program, env=env)
        except OSError as e:
            raise SpecError(f"sweep exec: {program[0]}: cannot run it "
                            f"({e.strerror or type(e).__name__})") from None
        sys.stderr.write(said)  # once the program runs: what it runs with
        before[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
        for signum in pending:
            child.send_signal(signum)
        code = child.wait()
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code
