"""`sweep capture --out DIR -- PROGRAM ARGS...`: run a program unchanged, as a child of its
own, with the capture started in it (the boot folder first on its PYTHONPATH, the capture's
variables set), then write its last word (the program as given, its exit code) and say what
was captured and what to run next. The program's exit code is the command's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from storage.capture import DEFAULT_MAX_BYTES, Capture, CaptureError
from sweep import EXIT_BAD_INPUT, EXIT_FAILED
from sweep.autotune.boot import python_path
from sweep.autotune.capture import (
    ENV_CAPTURE,
    ENV_MAX_BYTES,
    ENV_NO_TUNE,
    ENV_SAVE_FLOATS,
    SPEC,
    finish,
    folder_holds,
)
from sweep.console import Output

USAGE = "sweep capture --out DIR -- PROGRAM ARGS..."


def _byte_count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of bytes; got {text!r}")
    return int(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="the capture's folder, new or empty: capture.json, blobs/ and "
                        "spec.yaml (what `sweep run DIR/spec.yaml` tunes)")
    p.add_argument("--no-tune", action="store_true",
                   help="run each kernel's first config for a new key instead of Triton's "
                        "own tuning: the capture costs one launch a key (implied under "
                        "TRITON_INTERPRET=1)")
    p.add_argument("--save-floats", action="store_true",
                   help="save floating-point tensors whole too (integer and boolean ones "
                        "always are); by default they are re-made from a seed when tuned")
    p.add_argument("--max-bytes", type=_byte_count, default=DEFAULT_MAX_BYTES, metavar="N",
                   help="the most bytes of tensors saved over the capture; a call that "
                        f"would pass it is not captured, said in one line (default: "
                        f"{DEFAULT_MAX_BYTES})")
    p.add_argument("--force", action="store_true",
                   help="with --out DIR holding an earlier capture, move it aside and "
                        "capture anew")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- PROGRAM ARGS",
                   help="the program and its arguments, as you run it (after --)")


def run_capture(args: argparse.Namespace, io: Output) -> int:
    program = list(args.program)
    if program[:1] == ["--"]:
        program = program[1:]
    if not program:
        io.note(f"error: no program given: {USAGE}")
        return EXIT_BAD_INPUT
    directory: Path = args.out
    problem = _make_room(directory, args.force, io)
    if problem:
        io.note(f"error: --out {directory}: {problem}")
        return EXIT_BAD_INPUT
    created = not directory.exists()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        io.note(f"error: --out {directory}: cannot create it ({e.strerror or e})")
        return EXIT_BAD_INPUT
    shown = shlex.join(program)
    env = _child_env(directory.absolute(), args.no_tune, args.save_floats, args.max_bytes)
    try:
        child = subprocess.Popen(program, env=env)
    except OSError as e:
        if created:
            with contextlib.suppress(OSError):
                directory.rmdir()
        io.note(f"error: cannot run {shown} ({e.strerror or e})")
        return EXIT_BAD_INPUT
    with _signals_to(child):
        code = child.wait()
    code = 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell says
    try:
        done = finish(directory, tuple(program), code)
    except CaptureError as e:
        io.note(f"error: {e}")
        return code or EXIT_FAILED
    _summary(io, shown, directory, done, code)
    return code


def _make_room(directory: Path, force: bool, io: Output) -> str | None:
    """None where the capture may go into directory (an earlier one moved aside with
    --force); else what is wrong, and nothing there is touched."""
    held, names = folder_holds(directory)
    if held == "other":
        if not directory.is_dir():
            return "exists and is not a folder"
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3
                                        else "")
        return (f"not empty and not a capture (it holds {shown}); choose a new or empty "
                "folder")
    if held == "capture":
        if not force:
            return ("holds an earlier capture; capture anew there with --force (which "
                    "moves it aside), or choose another folder")
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside, n = directory.with_name(f"{directory.name}.replaced-{stamp}"), 1
        while aside.exists():
            n += 1
            aside = directory.with_name(f"{directory.name}.replaced-{stamp}-{n}")
        directory.rename(aside)
        io.note(f"{directory} held a capture: moved it to {aside}, whole")
    return None


def _child_env(directory: Path, no_tune: bool, save_floats: bool,
               max_bytes: int) -> dict[str, str]:
    """The program's environment: the boot folder first on its path, this project last
    (where no install puts it on the child's own path), the capture's variables."""
    env = dict(os.environ)
    env["PYTHONPATH"] = python_path(env.get("PYTHONPATH", ""))
    env[ENV_CAPTURE] = str(directory)
    env[ENV_MAX_BYTES] = str(max_bytes)
    for name, on in ((ENV_NO_TUNE, no_tune), (ENV_SAVE_FLOATS, save_floats)):
        if on:
            env[name] = "1"
        else:
            env.pop(name, None)
    return env


@contextlib.contextmanager
def _signals_to(child: subprocess.Popen[Any]) -> Iterator[None]:
    """While the program runs, a Ctrl+C is its own to act on (the terminal sends it to
    both), and a SIGTERM to this command is passed on to it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
                signal.SIGTERM: signal.signal(signal.SIGTERM, forward)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _summary(io: Output, shown: str, directory: Path, done: Capture | None,
             code: int) -> None:
    calls = done.calls if done is not None else ()
    kernels = len({c.kernel for c in calls})
    what = f"captured {_count(len(calls), 'call')} of {_count(kernels, 'kernel')}"
    if code != 0:
        io.note(f"sweep capture: {shown} exited with {code}; {what} in {directory} (kept)")
        return
    if not calls:
        skipped = f" ({_count(len(done.skipped), 'call')} not captured, said above)" \
            if done is not None and done.skipped else ""
        io.note(f"sweep capture: {shown} made no call into an autotuned kernel that could "
                f"be captured{skipped}; nothing captured in {directory}")
        return
    skipped = f", {len(done.skipped)} not captured (said above)" if done and done.skipped \
        else ""
    io.result(f"{what} in {directory}{skipped}; tune them: sweep run "
              f"{shlex.quote(str(directory / SPEC))} --out RUN")
