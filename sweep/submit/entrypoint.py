"""The job's entrypoint: the shell text the head runs, which expands the run directory
there, names it for this command, and becomes `sweep run` so that a stop reaches it."""

from __future__ import annotations

import re
import shlex

from sweep.submit.errors import SubmitError

# Lines the entrypoint prints before the sweep starts (see entrypoint).
RUN_DIR_MARK = "sweep submit: run directory (on the head node): "
GCS_MARK = "sweep submit: cluster address (on the head node): "

_TILDE = re.compile(r"~[A-Za-z0-9._-]*")


def head_path(out: str) -> str:
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


def job_entrypoint(spec_rel: str, out_dir: str, backend: str | None, max_trials: int | None,
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

