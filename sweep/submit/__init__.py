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
import math
import os
import secrets
import time
from pathlib import Path

from actors.backends import CHOICES
from sweep import EXIT_FAILED
from sweep.console import Output
from sweep.run.stop import StopController
from sweep.submit.dashboard import (
    DEFAULT_DASHBOARD,
    HOW_TO_INSTALL,
    PROBE_TIMEOUT_S,
    check_jobs_client,
    connect,
    dashboard_url,
    jobs_client,
    probe,
)
from sweep.submit.entrypoint import GCS_MARK, RUN_DIR_MARK, head_path, job_entrypoint
from sweep.submit.errors import SubmitError, one_line
from sweep.submit.job import STOP_WAIT_VAR, Job
from sweep.submit.working_dir import EXCLUDES, MAX_SHIPPED_BYTES, check_size, shipped_path

# The names `sweep.submit` has always offered, the pieces' included.
__all__ = ["DEFAULT_DASHBOARD", "DEFAULT_RUNS", "EXCLUDES", "GCS_MARK", "HOW_TO_INSTALL",
           "MAX_SHIPPED_BYTES", "PROBE_TIMEOUT_S", "RUN_DIR_MARK", "STOP_MARGIN_S",
           "STOP_WAIT_VAR", "Job", "SubmitError", "add_arguments", "dashboard_url", "submit"]

# Seconds past run.drain_s the job's supervisor waits before it SIGKILLs a stopped sweep:
# cancelling, the table, best.json and the snapshot (seconds on a large space) come after.
STOP_MARGIN_S = 60
DEFAULT_RUNS = "sweep-runs"  # under the head's home


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", type=Path, metavar="SPEC",
                   help="the spec, a file in (or under) the current directory, which is "
                        "shipped to the cluster with the user's kernel modules")
    p.add_argument("--address",
                   help="the head's dashboard, http://HEAD:8265 (default: "
                        "RAY_API_SERVER_ADDRESS, else RAY_ADDRESS, else "
                        f"{DEFAULT_DASHBOARD})")
    p.add_argument("--out", help="run directory on the head node, absolute or ~/... "
                                 f"(default: ~/{DEFAULT_RUNS}/NAME-UTCSTAMP there)")
    p.add_argument("--backend", choices=CHOICES,
                   help="how trials run (default: the spec's run.backend)")
    p.add_argument("--max-trials", type=int, metavar="N",
                   help="run at most N trials in this job, then stop resumably")
    p.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="stop the job's sweep resumably once it has run this long")
    p.add_argument("--force", action="store_true",
                   help="tune even when the head's best-config cache holds a complete "
                        "run's best")


def submit(args: argparse.Namespace, stop: StopController, io: Output) -> int:
    """The command. Raises SpecError (exit 2) for what is wrong before submitting."""
    from sweep.spec import SpecError

    try:
        return _submit(args, stop, io)
    except SubmitError as e:
        raise SpecError(str(e)) from None


def _submit(args: argparse.Namespace, stop: StopController, io: Output) -> int:
    from sweep.spec import load_spec

    here = Path(os.path.abspath(os.getcwd()))
    # What the file alone decides, as `sweep run` checks it before Ray starts; the kernel
    # module is imported on the head, where the sweep runs.
    spec = load_spec(args.spec, backend=args.backend, import_kernel=False)
    spec.expand()
    spec_rel = shipped_path(args.spec, here)
    check_size(here)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_dir = head_path(args.out) if args.out is not None \
        else f"~/{DEFAULT_RUNS}/{spec.name}-{stamp}"
    check_jobs_client()
    url, where = dashboard_url(args.address)
    probe(url, where)
    client = connect(jobs_client(), url, where)

    grace = math.ceil(spec.run.drain_s) + STOP_MARGIN_S
    job = Job(client=client, url=url, grace_s=grace, io=io,
              submission_id=f"sweep-{stamp}-{secrets.token_hex(3)}")
    entrypoint = job_entrypoint(spec_rel, out_dir, args.backend, args.max_trials,
                             args.time_budget, args.force)
    runtime_env = {"working_dir": str(here), "excludes": EXCLUDES,
                   "env_vars": {STOP_WAIT_VAR: str(grace)}}
    with job.signals(stop):
        if job.signalled:  # stopped during start-up: nothing is submitted
            io.note("stopped before submitting; nothing was submitted")
            return 128 + job.signalled[0]
        io.note(f"sweep submit: shipping {here} to {url} as job {job.submission_id}")
        try:
            client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env,
                              submission_id=job.submission_id,
                              metadata={"sweep": spec.name, "spec": spec_rel})
        except (ValueError, OSError) as e:  # the package too large, the dashboard gone
            raise SubmitError(f"submitting to {url} failed: {one_line(e)}") from None
        except RuntimeError as e:  # the server refused it
            io.note(f"error: submitting to {url} failed: {one_line(e)}")
            return EXIT_FAILED
        io.note("sweep submit: Ctrl+C stops the sweep (it drains, writes its table and "
                 "can be resumed); a second Ctrl+C stops waiting and leaves the job to it")
        return job.follow()

