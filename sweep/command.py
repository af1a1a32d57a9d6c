"""The installed `sweep` command and `python -m sweep`: what only a process of its own may do
to the interpreter, before the slower imports. The work itself is sweep/cli.py's.
"""

from __future__ import annotations

import time

# When the command began, for the time its summary reports: the user's time is the whole
# command, its imports and Ray's start included. (Not the process's age: a shell running
# `... && sweep run` as its last command may exec it in its own, older process.)
STARTED = time.monotonic()

from sweep.run.stop import StopController  # noqa: E402

# First thing, before the slower imports: a Ctrl+C or SIGTERM from here on is a clean
# stop. (One that lands while Python itself starts still ends the process the default way,
# with nothing written.) The command keeps these handlers to its end: a signal while
# Python shuts down must not turn a finished run into a KeyboardInterrupt.
STOP = StopController()
STOP.install()

import contextlib  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402


def _own_packages_first() -> None:
    """`python -m` puts the current directory first on sys.path, where a user's own folder
    named like one of this project's packages (storage/, actors/) would replace it; with an
    editable install even a place at the end would. So bind this project's top-level
    packages before the directory goes back, at the end: a user's "module:attr" kernel
    still resolves from it."""
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


_own_packages_first()


def _spares_ahead() -> None:
    """A GPU run's launchers and fork server import torch for seconds: their interpreters
    start now, before this process imports pyarrow and the rest of itself (about a second
    on an H200 host), and import it meanwhile (sweep/engines/prestart.py's ahead)."""
    from sweep.engines import prestart

    prestart.ahead(sys.argv[1:])


_spares_ahead()


class _NoPandas:
    """A finder that says pandas is not there (see _pyarrow_without_pandas)."""

    @staticmethod
    def find_spec(name: str, *args: object) -> None:
        if name == "pandas":
            raise ModuleNotFoundError("not now", name=name)


def _pyarrow_without_pandas() -> None:
    """pyarrow imports pandas, where it is installed, the first time it converts Python
    values (to tell a DataFrame from a list): a third of a second of the quickstart's CPU
    for nothing, since the command hands pyarrow no pandas object. Its first try is made
    here with pandas unimportable, so pyarrow takes it as absent and does not try again;
    an explicit to_pandas() still imports it (pyarrow tries again where pandas is asked
    for by name)."""
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    sys.meta_path.insert(0, _NoPandas)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(_NoPandas)


_pyarrow_without_pandas()


def _imports_frozen() -> None:
    """What is imported by now (pyarrow, numpy, this project's modules: some 27,000 tracked
    objects) lives as long as the command: frozen out of the collector's reach, it is
    not scanned by the full collections that the rest of the start-up's imports would
    otherwise trigger (one took 15-20 ms of a 0.4 s cached answer on the 2-core machine)."""
    import gc

    gc.freeze()


_imports_frozen()


def main() -> int:
    from sweep.cli import main as run_command

    code = run_command(None, stop=STOP, started=STARTED)
    # Everything is written and said: the command ends here, without the interpreter's
    # teardown (a second with torch imported) or Ray's exit hooks, which shut Ray down
    # (2-3.5 s; forever with a thread stuck inside ray.init or a lost head). A private
    # Ray instance's processes are ended; a cluster it joined sees its driver gone and
    # ends its workers; the local runtime's workers are gone already.
    from actors import spares

    spares.end()  # not waited for by the shutdown that follows: gone with it anyway
    private_ray = sys.modules.get("sweep.engines.ray.private")
    if private_ray is not None:
        private_ray.end_private_now()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone (`| head -1`)
            stream.flush()
    os._exit(code)
