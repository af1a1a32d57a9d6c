"""`sweep submit SPEC`: run a sweep on a Ray cluster as a Ray Job, from a machine outside it.

The job's entrypoint is `python -m sweep run SPEC --out DIR ...`, run by the head node's
Python in a copy of this directory (the job's runtime_env working_dir: the spec and any
kernel module of the user's own travel with it; .git, virtual environments, runs/ and
caches stay behind, as does whatever .gitignore names). This project itself, torch and
Triton must already be installed on every node (configs/cluster.yaml does that): the
working_dir carries only the user's files, and the entrypoint imports `sweep` from the
head's Python.

Where the run lives: on the head node's disk, or on a shared filesystem the head mounts.
Not in the working_dir copy: Ray unpacks it under its session directory and deletes it
when it is no longer used (or with the session), so a relative --out is refused and the
default is `~/sweep-runs/NAME-UTCSTAMP`, its `~` expanded by the shell that runs the
entrypoint on the head (this machine's home means nothing there). The entrypoint prints
the expanded directory first, so the end of this command can name it.

Stopping. Ctrl+C (or SIGTERM) asks Ray to stop the job; its supervisor sends the
entrypoint SIGTERM, which `sweep run` takes as a clean stop (drain, table, best.json,
snapshot `interrupted`). The supervisor SIGKILLs the entrypoint after
RAY_JOB_STOP_WAIT_TIME_S (default 3 s: ray/dashboard/modules/job/job_supervisor.py,
JobSupervisor.DEFAULT_RAY_JOB_STOP_WAIT_TIME_S and `stop_job_wait_time =
int(os.environ.get("RAY_JOB_STOP_WAIT_TIME_S", ...))` in JobSupervisor.run, Ray 2.60),
read from the supervisor actor's own environment, which is the job's runtime_env
(JobManager._get_supervisor_runtime_env). Three seconds is shorter than a drain, so the
job is submitted with that variable set to run.drain_s plus a margin for the final writes.
This command keeps following the logs until the job has ended, then names the run
directory and the resume command. A second Ctrl+C stops waiting and leaves the job to
finish its stop on its own (it is never stopped twice, nor killed), naming the `ray job`
commands to follow or stop it; exit 128 + the first signal (130 for Ctrl+C).

Exit codes: the sweep's own where it can be known (0 when the job succeeded, the
entrypoint's exit code when it failed; after a stop asked for here, 128 + the signal as a
local run gives, or 0 if the run had completed anyway); 1 otherwise; 2 bad input (spec,
arguments, no ray[default], no dashboard at the address), nothing submitted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fnmatch
import http.client
import importlib.util
import json
import logging
import math
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import FrameType
from typing import Any

from rich.console import Console

from sweep import EXIT_FAILED, EXIT_OK
from sweep.report.text import say
from sweep.run.stop import StopController

DEFAULT_DASHBOARD = "http://127.0.0.1:8265"
PROBE_TIMEOUT_S = 4.0
# What the job's working_dir leaves behind (gitignore syntax, on top of .gitignore's):
# version control, environments, run directories and caches are large and useless there.
EXCLUDES = [".git", ".venv", "venv", ".env", "env", "runs", "__pycache__", "*.pyc",
            ".mypy_cache", ".pytest_cache", ".ruff_cache", "*.egg-info", ".ipynb_checkpoints"]
# Seconds past run.drain_s the job's supervisor waits before it SIGKILLs a stopped sweep:
# cancelling, the table, best.json and the snapshot (seconds on a large space) come after.
STOP_MARGIN_S = 60
STOP_WAIT_VAR = "RAY_JOB_STOP_WAIT_TIME_S"
DEFAULT_RUNS = "sweep-runs"  # under the head's home
HOW_TO_INSTALL = "pip install -e '.[cluster]'"
# Lines the entrypoint prints before the sweep starts (see _entrypoint).
RUN_DIR_MARK = "sweep submit: run directory (on the head node): "
GCS_MARK = "sweep submit: cluster address (on the head node): "
_SUMMARY = re.compile(r"^sweep .*: (complete|interrupted|failed) — \d+ of \d+ trials")
_RESULTS = re.compile(r"^  results: (.+)/trials\.parquet$")
_CACHED = re.compile(r"^sweep .*: cached — ")  # answered from the cache: no run directory


class SubmitError(Exception):
    """Bad input found before anything was submitted: one line, exit 2."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", type=Path)
    p.add_argument("--address",
                   help="the head's dashboard, http://HEAD:8265 (default: "
                        "RAY_API_SERVER_ADDRESS, else RAY_ADDRESS, else "
                        f"{DEFAULT_DASHBOARD})")
    p.add_argument("--out", help="run directory on the head node, absolute or ~/... "
                                 f"(default: ~/{DEFAULT_RUNS}/NAME-UTCSTAMP there)")
    p.add_argument("--backend", choices=("auto", "cuda", "interpret", "simulate", "replay"))
    p.add_argument("--max-trials", type=int, metavar="N",
                   help="run at most N trials in this job, then stop resumably")
    p.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="stop the job's sweep resumably once it has run this long")
    p.add_argument("--force", action="store_true",
                   help="tune even when the head's best-config cache holds a complete "
                        "run's best")


def submit(args: argparse.Namespace, stop: StopController, out: Console,
           err: Console) -> int:
    """The command. Raises SpecError (exit 2) for what is wrong before submitting."""
    from sweep.spec import SpecError

    try:
        return _submit(args, stop, out, err)
    except SubmitError as e:
        raise SpecError(str(e)) from None


def _submit(args: argparse.Namespace, stop: StopController, out: Console,
            err: Console) -> int:
    from sweep.spec import load_spec

    here = Path(os.path.abspath(os.getcwd()))
    # What the file alone decides, as `sweep run` checks it before Ray starts; the kernel
    # module is imported on the head, where the sweep runs.
    spec = load_spec(args.spec, backend=args.backend, import_kernel=False)
    spec.expand()
    spec_rel = _shipped_path(args.spec, here)
    _check_size(here)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_dir = _head_path(args.out) if args.out is not None \
        else f"~/{DEFAULT_RUNS}/{spec.name}-{stamp}"
    _check_jobs_client()
    url, where = dashboard_url(args.address)
    _probe(url, where)
    client = _connect(_jobs_client(), url, where)

    grace = math.ceil(spec.run.drain_s) + STOP_MARGIN_S
    job = Job(client=client, url=url, grace_s=grace, out=out, err=err,
              submission_id=f"sweep-{stamp}-{secrets.token_hex(3)}")
    entrypoint = _entrypoint(spec_rel, out_dir, args.backend, args.max_trials,
                             args.time_budget, args.force)
    runtime_env = {"working_dir": str(here), "excludes": EXCLUDES,
                   "env_vars": {STOP_WAIT_VAR: str(grace)}}
    with job.signals(stop):
        if job.signalled:  # stopped during start-up: nothing is submitted
            say(err, "stopped before submitting; nothing was submitted")
            return 128 + job.signalled[0]
        say(err, f"sweep submit: shipping {here} to {url} as job {job.submission_id}")
        try:
            client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env,
                              submission_id=job.submission_id,
                              metadata={"sweep": spec.name, "spec": spec_rel})
        except (ValueError, OSError) as e:  # the package too large, the dashboard gone
            raise SubmitError(f"submitting to {url} failed: {_one_line(e)}") from None
        except RuntimeError as e:  # the server refused it
            say(err, f"error: submitting to {url} failed: {_one_line(e)}")
            return EXIT_FAILED
        say(err, "sweep submit: Ctrl+C stops the sweep (it drains, writes its table and "
                 "can be resumed); a second Ctrl+C stops waiting and leaves the job to it")
        return job.follow()


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


def _shipped_path(spec: Path, here: Path) -> str:
    """The spec's path inside the working_dir copy; it must be in what is shipped."""
    absolute = Path(os.path.abspath(spec))
    try:
        rel = absolute.relative_to(here)
    except ValueError:
        raise SubmitError(f"{spec}: not under the current directory {here}, which is what "
                          "travels to the cluster; run sweep submit from a directory that "
                          "holds the spec (and any kernel module of yours)") from None
    skipped = {p for p in EXCLUDES if "*" not in p}
    if any(part in skipped for part in rel.parts[:-1]):
        raise SubmitError(f"{spec}: lies in a directory that is not shipped to the cluster "
                          f"({', '.join(sorted(skipped))}); move it")
    return PurePosixPath(*rel.parts).as_posix()


MAX_SHIPPED_BYTES = 100 << 20  # what Ray's job upload takes (its GCS_STORAGE_MAX_SIZE)


@dataclass(frozen=True)
class _Packed:
    """A file Ray's packing reads: its path as shipped, its bytes, and the symlink it is
    reached through, if any (with that link's target)."""

    path: PurePosixPath
    size: int
    link: tuple[PurePosixPath, str] | None = None


def _excluded(rel: PurePosixPath) -> bool:
    return any(fnmatch.fnmatch(part, p) for part in rel.parts for p in EXCLUDES)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _listed(here: Path) -> list[PurePosixPath] | None:
    """What git would ship of a checkout (tracked, or untracked and not ignored), None
    outside one. A symlink is one entry, its target never looked into."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"],
                                cwd=here, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0:
        return None
    return [PurePosixPath(n) for n in listed.stdout.decode(errors="replace").split("\0") if n]


def _packed_files(here: Path) -> Iterator[_Packed]:
    """What the working_dir will carry, near enough, as Ray's packing reads it
    (ray/_private/runtime_env/packaging.py, _dir_travel and _zip_files, Ray 2.60): it
    follows symlinks, so a link to a file ships the file's bytes and a link to a directory
    ships everything under it, wherever either lies. In a git checkout the files git
    would list; elsewhere every file (.gitignore not applied: this errs towards counting
    too much). EXCLUDES too."""
    listed = _listed(here)
    if listed is None:
        yield from _walk(here, here, PurePosixPath(), None, frozenset())
        return
    for rel in listed:
        if _excluded(rel):
            continue
        path = here / rel
        try:
            is_link = path.is_symlink()
            target = os.readlink(path) if is_link else ""
        except OSError:
            continue
        link = (rel, target) if is_link else None
        if path.is_dir():  # a symlink to a directory, or a submodule: Ray descends into it
            # Its ancestors in the checkout, to tell a loop from a second way in.
            above = frozenset(filter(None, (_identity(here.joinpath(*rel.parts[:i]))
                                            for i in range(len(rel.parts)))))
            yield from _walk(here, path, rel, link, above)
        elif path.is_file():  # a dangling link, a FIFO or a device: Ray skips it
            with contextlib.suppress(OSError):
                yield _Packed(rel, path.stat().st_size, link)


def _walk(here: Path, top: Path, rel: PurePosixPath, link: tuple[PurePosixPath, str] | None,
          above: frozenset[tuple[int, int]]) -> Iterator[_Packed]:
    """Every file under top as Ray's packing reaches it, following symlinks. A directory
    reached again below itself (a link to `.` or `..`) has Ray pack a copy of it at each
    turn, until the system stops resolving the links (40 deep): refused."""
    stack = [(top, rel, link, above)]
    while stack:
        directory, rel, link, above = stack.pop()
        me = _identity(directory)
        if me is None:
            continue
        if me in above:
            how = f"a symlink to {link[1]}" if link else "a directory"
            raise SubmitError(f"{here / (link[0] if link else rel)}: {how}, which holds "
                              "it: Ray's packing of the job's working directory would go round "
                              "it, a copy of everything at each turn; remove it or list it "
                              "in .gitignore")
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            inner = rel / entry.name
            if _excluded(inner):
                continue
            try:
                is_link = entry.is_symlink()
                through = (inner, os.readlink(entry.path)) if is_link else link
                if entry.is_dir():  # follows a link, as Ray's Path.is_dir() does
                    stack.append((Path(entry.path), inner, through, above | {me}))
                elif entry.is_file():
                    yield _Packed(inner, entry.stat().st_size, through)
            except OSError:
                continue


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def _check_size(here: Path) -> None:
    """Ray packs the whole directory before it can refuse it (minutes for gigabytes, deaf
    to Ctrl+C meanwhile): refuse one that is surely too large at once, naming its largest
    file (and the symlink that brings it in, which a listing of the directory hides)."""
    total = 0
    largest: _Packed | None = None
    for packed in _packed_files(here):
        total += packed.size
        if largest is None or packed.size > largest.size:
            largest = packed
        if total > MAX_SHIPPED_BYTES:
            assert largest is not None
            what = f"{largest.path}, {_mib(largest.size)}"
            if largest.link is not None:
                name, target = largest.link
                what += (f", a symlink to {target}, which Ray follows" if name == largest.path
                         else f", under the symlink {name} -> {target}, which Ray follows")
            raise SubmitError(f"{here}: holds more than {MAX_SHIPPED_BYTES >> 20} MiB to ship "
                              "as the job's working directory, more than Ray accepts "
                              f"(the largest: {what}); run sweep submit from a directory "
                              "with just your spec and kernel modules (or list the rest "
                              "in .gitignore)")


_TILDE = re.compile(r"~[A-Za-z0-9._-]*")


def _head_path(out: str) -> str:
    """--out as the head will see it: absolute, or ~/... for the head's home. A relative
    path would land in the working_dir copy, which Ray deletes."""
    head = out.split("/", 1)[0]
    if out.startswith("/") or _TILDE.fullmatch(head):
        return out
    raise SubmitError(f"--out: {out!r} is relative: it would land in the job's temporary "
                      "copy of this directory, which Ray deletes; give an absolute path on "
                      "the head node (or a shared filesystem), or ~/...")


def _shell_word(path: str) -> str:
    """path quoted for the entrypoint's shell, a leading ~ or ~user left to expand."""
    head, sep, rest = path.partition("/")
    if _TILDE.fullmatch(head):
        return head + sep + (shlex.quote(rest) if rest else "")
    return shlex.quote(path)


def _entrypoint(spec_rel: str, out_dir: str, backend: str | None, max_trials: int | None,
                time_budget: float | None = None, force: bool = False) -> str:
    """`sh -c` text on the head: expand the run directory there, name it (and the
    cluster's GCS address, for the resume command) in the log, then become the sweep, so
    that the job's stop signal reaches `sweep run` itself. The spec goes by its path in
    the working_dir copy, the entrypoint's working directory."""
    extra = [*(["--backend", backend] if backend else []),
             *(["--max-trials", str(max_trials)] if max_trials is not None else []),
             *(["--time-budget", repr(time_budget)] if time_budget is not None else []),
             *(["--force"] if force else [])]
    return (f"out={_shell_word(out_dir)} && "
            f"printf '%s\\n' {shlex.quote(RUN_DIR_MARK)}\"$out\" "
            f"{shlex.quote(GCS_MARK)}\"$RAY_ADDRESS\" && "
            f"exec python -m sweep run {shlex.quote(spec_rel)} --out \"$out\" --runtime ray"
            + (f" {shlex.join(extra)}" if extra else ""))


def _check_jobs_client() -> None:
    """Whether ray[default]'s client libraries are there at all, before probing (which
    takes seconds on an address that does not answer); _jobs_client imports them."""
    for name in ("aiohttp", "requests", "pydantic"):
        if importlib.util.find_spec(name) is None:
            raise SubmitError(f"sweep submit needs Ray's job client, which ray[default] "
                              f"provides ({name} is missing): {HOW_TO_INSTALL}")


def _jobs_client() -> Any:
    """Ray's Jobs client, which needs ray[default] (aiohttp, requests, pydantic)."""
    try:
        import aiohttp  # noqa: F401
        import requests  # noqa: F401
        from ray.job_submission import JobSubmissionClient
    except ImportError as e:
        raise SubmitError(f"sweep submit needs Ray's job client, which ray[default] "
                          f"provides ({e.name or e} is missing): {HOW_TO_INSTALL}") from None
    # Ray's client logs each upload and websocket at INFO; this command says what matters.
    for name in ("ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk",
                 "ray._private.runtime_env.packaging"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return JobSubmissionClient


def dashboard_url(given: str | None) -> tuple[str, str]:
    """The dashboard's URL and where it came from: --address, else RAY_API_SERVER_ADDRESS,
    else RAY_ADDRESS (the variables Ray's own `ray job` reads, in its order), else the
    local default. HOST:PORT without a scheme is the dashboard's, except in RAY_ADDRESS,
    where Ray's convention makes it the GCS address `sweep run` joins: its head's dashboard
    is looked for on the default port. RAY_ADDRESS=auto or local names no address."""
    ray_address = os.environ.get("RAY_ADDRESS", "").strip()
    if ray_address.lower() in ("auto", "local"):
        ray_address = ""
    sources = (("--address", given),
               ("RAY_API_SERVER_ADDRESS", os.environ.get("RAY_API_SERVER_ADDRESS")),
               ("RAY_ADDRESS", ray_address))
    where, value = next(((w, v.strip()) for w, v in sources if v and v.strip()),
                        ("--address (default)", DEFAULT_DASHBOARD))
    scheme, sep, rest = value.partition("://")
    if not sep:
        scheme, rest = "http", value
    if where == "RAY_ADDRESS" and scheme.lower() in ("http", "ray") and (
            not sep or scheme.lower() == "ray"):
        # A GCS (HOST:6379) or Ray Client (ray://HOST:10001) address: Ray's CLI asks the
        # cluster for its dashboard; the head's default dashboard port is a fair guess,
        # which the probe then checks.
        host = rest.rsplit(":", 1)[0] if rest.rsplit(":", 1)[-1].isdigit() else rest
        scheme, rest = "http", f"{host}:{DEFAULT_DASHBOARD.rsplit(':', 1)[1]}"
        where = f"RAY_ADDRESS={value} (not the dashboard's; tried its default port)"
    if scheme.lower() not in ("http", "https") or not rest.strip("/"):
        raise SubmitError(f"{where}: expected the head's dashboard address, such as "
                          f"http://HEAD:8265, got {value!r}")
    return f"{scheme.lower()}://{rest.rstrip('/')}", where


def _probe(url: str, where: str) -> None:
    """Ray's client waits on an address that does not answer for minutes: ask the
    dashboard's version first, with a deadline. A 401/403 is a dashboard that wants a
    token, which Ray's client then sends; anything else must be the version JSON."""
    hint = ("the head node must run the dashboard (ray start --head --dashboard-host "
            "0.0.0.0 ...) and its port be reachable from here (ray dashboard CLUSTER.yaml "
            "forwards it)")
    try:
        with urllib.request.urlopen(f"{url}/api/version", timeout=PROBE_TIMEOUT_S) as r:
            body = r.read(4096)
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            return
        raise SubmitError(f"{where}: {url} answers, but not as a Ray dashboard (HTTP "
                          f"{e.code}); {hint}") from None
    except http.client.HTTPException:  # not HTTP at all: the GCS port, say
        raise SubmitError(f"{where}: {url} answers, but not as a Ray dashboard (not HTTP: "
                          "the GCS port? the dashboard's is 8265 by default); "
                          f"{hint}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        why = (f"no answer within {PROBE_TIMEOUT_S:g} s"
               if isinstance(reason, (TimeoutError, socket.timeout))
               else getattr(reason, "strerror", None) or _one_line(reason))
        raise SubmitError(f"{where}: no Ray dashboard at {url} ({why}); {hint}") from None
    try:
        json.loads(body)["ray_version"]
    except (ValueError, KeyError, TypeError):
        raise SubmitError(f"{where}: {url} answers, but not as a Ray dashboard; {hint}"
                          ) from None


def _connect(client_cls: Any, url: str, where: str) -> Any:
    from ray.exceptions import AuthenticationError

    # Ray's client prefers the environment's RAY_API_SERVER_ADDRESS / RAY_ADDRESS over
    # the address it is given: give it ours that way, for this call only.
    saved = os.environ.get("RAY_API_SERVER_ADDRESS")
    os.environ["RAY_API_SERVER_ADDRESS"] = url
    try:
        return client_cls(url)
    except AuthenticationError as e:
        raise SubmitError(f"{where}: the Ray dashboard at {url} refused this command "
                          f"({_one_line(e)}); the cluster uses token authentication: set "
                          "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH to a copy of the "
                          "head's ~/.ray/auth_token") from None
    except (ConnectionError, RuntimeError, OSError) as e:
        raise SubmitError(f"{where}: cannot use the Ray dashboard at {url} "
                          f"({_one_line(e)})") from None
    finally:
        if saved is None:
            os.environ.pop("RAY_API_SERVER_ADDRESS", None)
        else:
            os.environ["RAY_API_SERVER_ADDRESS"] = saved


@dataclass
class Job:
    """One submitted job: follow its logs to its end, stop it on the first signal, stop
    waiting on the second."""

    client: Any
    url: str
    grace_s: int
    out: Console
    err: Console
    submission_id: str
    signalled: list[int] = field(default_factory=list)
    stop_sent: bool = False
    run_dir: str | None = None  # as the entrypoint expanded it on the head
    gcs: str | None = None
    state: str | None = None  # the sweep's summary: complete, interrupted, failed
    results_dir: str | None = None  # named by the summary: the run exists
    no_module: bool = False  # the head's Python lacks this project
    cached: bool = False  # the cache answered: nothing ran, no run directory was made
    _info: Any = field(default=None, init=False, repr=False)  # the terminal JobDetails
    _partial: str = field(default="", init=False, repr=False)  # a log line cut mid-chunk
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)
    _wake: asyncio.Event | None = field(default=None, init=False, repr=False)

    # signals

    def signals(self, stop: StopController) -> _Handlers:
        return _Handlers(self, stop)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signalled.append(signum)
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    # following

    def follow(self) -> int:
        """Logs to stdout until the job ends (or a second signal); the exit code."""
        ended = asyncio.run(self._follow())
        if ended is None:  # lost the dashboard
            return EXIT_FAILED
        if not ended:
            self._detached()
            return 128 + self.signalled[0]
        return self._ended()

    async def _follow(self) -> bool | None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        tail = asyncio.create_task(self._tail())
        try:
            while True:
                if self.signalled and not self.stop_sent:
                    self._stop()
                if len(self.signalled) >= 2:
                    return False
                waiter = asyncio.create_task(self._wake.wait())
                done, _ = await asyncio.wait({tail, waiter},
                                             return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                self._wake.clear()
                if tail in done:
                    break
        finally:
            if not tail.done():
                tail.cancel()
                await asyncio.gather(tail, return_exceptions=True)
            self._loop = None
        self._flush_partial()
        failure = tail.exception()
        status = await asyncio.to_thread(self._final_status)
        if status is None:
            why = f" ({_one_line(failure)})" if failure else ""
            say(self.err, f"error: lost the job's logs at {self.url}{why}; the job may still "
                          "be running")
            self._commands()
            return None
        return True

    async def _tail(self) -> None:
        async for chunk in self.client.tail_job_logs(self.submission_id):
            self._scan(chunk)

    def _scan(self, chunk: str) -> None:
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line.rstrip("\r"))

    def _flush_partial(self) -> None:
        if self._partial:
            self._line(self._partial)
            self._partial = ""

    def _line(self, line: str) -> None:
        """One line of the job's log: shown, unless it is the entrypoint's note to this
        client (where the run directory would be: a sweep the cache answers makes none,
        so it is named only once the sweep's summary names it)."""
        if line.startswith(RUN_DIR_MARK):
            self.run_dir = self.run_dir or (None if self.cached else line[len(RUN_DIR_MARK):])
            return
        if line.startswith(GCS_MARK):
            self.gcs = self.gcs or line[len(GCS_MARK):] or None
            return
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        if _CACHED.match(line):
            self.run_dir = None
            self.cached = True
        elif m := _SUMMARY.match(line):
            self.state = m.group(1)
        elif m := _RESULTS.match(line):
            self.results_dir = m.group(1)
        elif "No module named sweep" in line:
            self.no_module = True

    def _stop(self) -> None:
        """Ask Ray once to stop the job (its supervisor SIGTERMs the sweep)."""
        self.stop_sent = True
        name = signal.Signals(self.signalled[0]).name
        try:
            self.client.stop_job(self.submission_id)
        except Exception as e:  # the dashboard gone: say how to stop it later
            say(self.err, f"\n{name}: could not ask {self.url} to stop job "
                          f"{self.submission_id} ({_one_line(e)}); stop it with: "
                          f"{self._ray_job('stop')}")
            return
        say(self.err, f"\n{name}: asked job {self.submission_id} to stop: the sweep finishes "
                      f"its in-flight trials and writes its table (Ray allows it "
                      f"{self.grace_s} s); Ctrl+C again to stop waiting (the job goes on)")

    def _final_status(self) -> Any:
        """The job's terminal status (the log stream ends just after it), or None when the
        dashboard cannot tell within a few seconds."""
        deadline = time.monotonic() + 10
        while True:
            try:
                info = self.client.get_job_info(self.submission_id)
                if info.status.is_terminal():
                    self._info = info
                    return info.status
            except Exception:  # the dashboard went away: retried until the deadline
                pass
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.2)

    # endings

    def _ray_job(self, what: str) -> str:
        follow = " -f" if what == "logs" else ""
        return (f"ray job {what}{follow} {shlex.quote(self.submission_id)} "
                f"--address {shlex.quote(self.url)}")

    def _commands(self) -> None:
        say(self.out, f"  follow it: {self._ray_job('logs')}")
        say(self.out, f"  stop it:   {self._ray_job('stop')}")
        self._where()

    def _where(self) -> None:
        path = self.results_dir or self.run_dir
        if path is None or self.cached:
            return
        say(self.out, f"  run directory (on the head node): {path}")
        address = f" --address {shlex.quote(self.gcs)}" if self.gcs else ""
        say(self.out, f"  resume on the head node: sweep resume {shlex.quote(path)}{address}")
        env = json.dumps({"env_vars": {STOP_WAIT_VAR: str(self.grace_s)}})
        say(self.out, f"  or from here, as a job: ray job submit --address "
                      f"{shlex.quote(self.url)} --working-dir . --runtime-env-json "
                      f"{shlex.quote(env)} -- python -m sweep resume {shlex.quote(path)}")

    def _detached(self) -> None:
        name = signal.Signals(self.signalled[1]).name
        say(self.out, f"\n{name} again: no longer waiting; job {self.submission_id} goes on "
                      "(it was asked to stop and is finishing its in-flight trials)")
        self._commands()

    def _ended(self) -> int:
        info = self._info
        status = str(info.status.value if hasattr(info.status, "value") else info.status)
        code = self._exit_code(info)
        exited = f" (the sweep exited {info.driver_exit_code})" \
            if info.driver_exit_code is not None else ""
        say(self.out, f"sweep submit: job {self.submission_id} {status}{exited}")
        if status == "FAILED" and info.driver_exit_code is None:
            say(self.err, f"error: {_one_line(RuntimeError(info.message or ''))}")
        if self.no_module:
            say(self.err, "error: the head node's Python cannot import this project; "
                          f"install it on every node ({HOW_TO_INSTALL})")
        if self.results_dir is not None:
            self._where()
        return code

    def _exit_code(self, info: Any) -> int:
        status = str(info.status.value if hasattr(info.status, "value") else info.status)
        if status == "SUCCEEDED":
            return EXIT_OK
        if status == "FAILED":
            return info.driver_exit_code if info.driver_exit_code is not None else EXIT_FAILED
        # STOPPED: Ray records no exit code; the sweep's summary says how it ended.
        if self.state == "complete":
            return EXIT_OK
        if self.signalled:
            return 128 + self.signalled[0]
        if self.state == "interrupted":  # `ray job stop` from elsewhere: its SIGTERM
            return 128 + signal.SIGTERM
        return EXIT_FAILED


class _Handlers:
    """Our SIGINT/SIGTERM handlers for the command's duration; a signal that reached the
    CLI's StopController before them (during start-up) counts as the first."""

    def __init__(self, job: Job, stop: StopController) -> None:
        self.job = job
        self.stop = stop
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> None:
        if self.stop.signum is not None:
            self.job.signalled.append(self.stop.signum)
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.previous[signum] = signal.signal(signum, self.job.on_signal)

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)
