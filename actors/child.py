"""Processes a worker owns (compile processes, the kernel launcher): started, wired and
killed the same way.

Each is a plain `python -c` subprocess rather than multiprocessing's spawn, which would
re-import the Ray worker's main script. It gets its own session, so a kill of its process
group reaches the compilers it runs (Triton runs ptxas as a child), and it asks Linux to
kill it when the worker dies (PR_SET_PDEATHSIG); where that is unavailable, the closed pipe
ends it at its next read. Messages go both ways over pipes as multiprocessing
Connections: pickles, but only between processes of the same worker.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import IO, Protocol

STDERR_FD = 2


class Process(Protocol):
    @property
    def pid(self) -> int: ...

    def kill(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class Child:
    process: Process
    replies: Connection
    requests: Connection

    def exit_text(self) -> str:
        """How the process ended, for an error message: 'killed by SIGSEGV', 'exit code 1'."""
        code = self.process.wait(timeout=5)
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"


def _python(code: str, *args: str, pass_fds: tuple[int, ...] = (),
            env: dict[str, str] | None = None, stderr: IO[bytes] | int | None = None,
            stdout: IO[bytes] | int | None = None, stdin: int | None = None
            ) -> subprocess.Popen:
    # `-c` puts the current directory first on sys.path, where a user's folder could
    # shadow this project's packages: take it off. Then, before the entry's imports (a
    # second or more with torch), the child asks to die with this process, and ends if
    # this process died before it asked: else a kill of this one meanwhile leaves it.
    # What it prints (a kernel's module while imported, say) goes where its stderr goes:
    # this process's stdout holds the run's summary.
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.path[:1] = [p for p in sys.path[:1] if p]; "
         f"from actors.child import die_with_parent; die_with_parent({os.getpid()}); "
         + code, *args], pass_fds=pass_fds, start_new_session=True, env=env, stderr=stderr,
        stdout=stdout or stderr or STDERR_FD, stdin=stdin)


def start_spare(entry: str, *args: str, env: dict[str, str]) -> subprocess.Popen:
    """Run entry ("module:function") as function(*args) in a process of its own session
    with a pipe to its stdin, what it prints dropped (actors/spares.py)."""
    module, _, function = entry.partition(":")
    return _python(f"from {module} import {function}; {function}(*sys.argv[1:])", *args,
                   env=env, stderr=subprocess.DEVNULL, stdin=subprocess.PIPE)


def start_detached(entry: str, *args: str, env: dict[str, str],
                   stderr: IO[bytes] | None = None,
                   stdout: IO[bytes] | None = None) -> subprocess.Popen:
    """Run entry ("module:function") as function(*args) in a new process of its own
    session, with no pipes: it talks through whatever its arguments name."""
    module, _, function = entry.partition(":")
    return _python(f"from {module} import {function}; {function}(*sys.argv[1:])", *args,
                   env=env, stderr=stderr, stdout=stdout)


def start(entry: str, payload: str, *, stderr: IO[bytes] | None = None,
          env: dict[str, str] | None = None) -> Child:
    """Run `entry` ("module:function") in a new process; it is called as
    function(read_fd, write_fd, payload) and talks over the two pipes (see connect)."""
    module, _, function = entry.partition(":")
    child_reads, parent_writes = os.pipe()
    parent_reads, child_writes = os.pipe()
    process = _python(f"from {module} import {function}; "
                      f"{function}(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])",
                      str(child_reads), str(child_writes), payload,
                      pass_fds=(child_reads, child_writes), env=env, stderr=stderr)
    os.close(child_reads)
    os.close(child_writes)
    return Child(process, Connection(parent_reads, writable=False),
                 Connection(parent_writes, readable=False))


class Foreign:
    """A process that is not this process's child (forked by a ForkServer, or started
    before its worker, see sweep/engines/prestart.py): watched and killed by pid. Its pid may
    come later (a fork server answers once it has prepared)."""

    def __init__(self, pid: Callable[[], int | None]) -> None:
        self._pid = pid

    @property
    def pid(self) -> int:
        return self._pid() or 0

    def kill(self) -> None:
        pid = self._pid()
        if pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        pid = self._pid()
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while pid and alive(pid):
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(pid), timeout or 0)
            time.sleep(0.005)
        return 0  # gone; its exit status went to its own parent


KEY_BYTES = 16  # what an adopter of a prepared server sends first
# For a prepared server to listen: it does so before any import, or, where a spare
# interpreter became it (actors/spares.py), after the spare's imports of torch and
# Triton (seconds); it listens as long as it lives.
ADOPT_WAIT_S = 60.0


class ForkServer:
    """A process that imports what its children need once (`prepare`, "module:function"
    called with the payload), then forks each child on request: a compile process then
    costs a fork, not a Python start and an `import torch` (on a 2-core machine, 15
    processes came up in 1.8 s instead of 12.4 s). The server must never touch CUDA, which
    does not survive a fork; its children may. Requests are queued at once; the server
    answers them once it has prepared, so asking never waits for its imports."""

    def __init__(self, prepare: str, payload: str, stderr: IO[bytes] | None = None,
                 env: dict[str, str] | None = None) -> None:
        """stderr: where it and its children write theirs (default: this process's); env:
        their environment (default: this process's)."""
        module, _, function = prepare.partition(":")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.process: subprocess.Popen | None = _python(
            f"from {module} import {function}; from actors.child import _fork_serve; "
            f"{function}(sys.argv[2]); _fork_serve(int(sys.argv[1]))",
            str(theirs.fileno()), payload, pass_fds=(theirs.fileno(),), stderr=stderr,
            env=env)
        theirs.close()
        self._attach(ours)

    def _attach(self, sock: socket.socket) -> None:
        self._socket = sock
        self._asked = 0
        self._pids: list[int] = []
        self._gone = False  # the server died or was closed: no more pids will come

    @classmethod
    def adopt(cls, address: str, key_hex: str, pid: int) -> ForkServer | None:
        """A server of its own, forked by a prepared one (serve_prepared, process pid)
        that started before this process: its imports are done or under way already.
        None if that one cannot be reached (gone, or on another machine)."""
        deadline = time.monotonic() + ADOPT_WAIT_S
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(address)
                sock.sendall(bytes.fromhex(key_hex))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()  # not listening yet: it has only just started
                if not alive(pid) or time.monotonic() > deadline:
                    return None
                time.sleep(0.02)
            except (OSError, ValueError):
                sock.close()
                return None
        server = cls.__new__(cls)
        server.process = None
        server._attach(sock)
        return server

    def start(self, entry: str, payload: str) -> Child:
        """As start(), forked by the server. If the server is gone, the child's pipes are
        closed at once, which its owner sees as a child that died while starting."""
        child_reads, parent_writes = os.pipe()
        parent_reads, child_writes = os.pipe()
        number = -1
        try:
            message = f"{entry}\0{payload}".encode()
            socket.send_fds(self._socket, [len(message).to_bytes(8, "little") + message],
                            [child_reads, child_writes])
            number, self._asked = self._asked, self._asked + 1
        except OSError:
            self._gone = True
        finally:
            os.close(child_reads)
            os.close(child_writes)
        return Child(Foreign(lambda: self.pid_of(number)), Connection(parent_reads, writable=False),
                     Connection(parent_writes, readable=False))

    def pid_of(self, number: int) -> int | None:
        """The pid of the number-th child asked for; waits for the server to answer."""
        while number >= len(self._pids) and number >= 0 and not self._gone:
            try:
                self._pids.append(int.from_bytes(_read_exactly(self._socket, 8), "little"))
            except TimeoutError:
                raise  # only settle() sets a timeout
            except OSError:
                self._gone = True
        return self._pids[number] if 0 <= number < len(self._pids) else None

    def settle(self, timeout_s: float) -> None:
        """Learn the pid of every child asked for so far, waiting up to timeout_s (a
        server still importing has forked none of them yet)."""
        self._socket.settimeout(timeout_s)
        try:
            self.pid_of(self._asked - 1)
        except TimeoutError:
            pass
        finally:
            if not self._gone:
                self._socket.settimeout(None)

    def close(self) -> None:
        """An adopted server ends at its socket's end, its own children with it."""
        self._gone = True
        self._socket.close()
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.kill()
        self.process.wait(timeout=5)


def serve_prepared(address: str, key_hex: str, prepare: str, payload: str) -> None:
    """A fork server started before the processes that will use it (sweep/engines/
    prestart.py): it listens at address at once, imports (prepare(payload)) while they
    start, then forks, for each that connects with the key, a server of its own (with the
    imports done) that serves it as ForkServer's does until its socket ends. A worker that
    adopts it starts its compile processes with no imports of its own to wait for."""
    die_with_parent()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)  # adopters queue here while the imports run
    module, _, function = prepare.partition(":")
    getattr(__import__(module, fromlist=[function]), function)(payload)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its servers are reaped by the kernel
    key = bytes.fromhex(key_hex)
    while True:
        connection, _ = listener.accept()
        try:
            connection.settimeout(5)
            given = _read_exactly(connection, KEY_BYTES)
            connection.settimeout(None)
        except OSError:
            connection.close()
            continue
        if not hmac.compare_digest(given, key):
            connection.close()
            continue
        if os.fork() == 0:
            listener.close()
            _fork_serve(connection.detach())
            os._exit(0)
        connection.close()


def alive(pid: int) -> bool:
    """Whether the process runs; one that has exited but is not yet reaped by its parent
    (a zombie, which signals still reach) is not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        pass  # gone, or no /proc (then ask the kernel)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("the fork server is gone")
        data += chunk
    return data


def _fork_serve(sock_fd: int) -> None:
    """The server's loop: one fork per request, the child's pid sent back."""
    die_with_parent()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    sock = socket.socket(fileno=sock_fd)
    while True:
        try:
            head, fds, _, _ = socket.recv_fds(sock, 8, 2)
        except OSError:
            return
        if not head:
            return  # the worker is gone
        message = _read_exactly(sock, int.from_bytes(head, "little")).decode()
        entry, _, payload = message.partition("\0")
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                sock.close()
                os.setsid()  # its own group, so a kill reaches the compilers it runs
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                module, _, function = entry.partition(":")
                target = getattr(__import__(module, fromlist=[function]), function)
                target(fds[0], fds[1], payload)
            except BaseException:  # a child that fails says why, as a Python process would
                code = 1
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        for fd in fds:
            os.close(fd)
        sock.sendall(pid.to_bytes(8, "little"))


def error_line(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def connect(read_fd: int, write_fd: int) -> tuple[Connection, Connection]:
    """In the child: (inbox, outbox), after arranging to die with the parent."""
    die_with_parent()
    return Connection(read_fd, writable=False), Connection(write_fd, readable=False)


def die_with_parent(parent: int | None = None) -> None:
    """Asks Linux to kill this process when its parent dies; parent: the pid it was
    started by, which if already gone (this process was handed to init) ends it now."""
    # The signal is sent when the thread that started this process ends: workers start
    # their children from threads that live as long as the worker (its constructor's and
    # Ray's task threads).
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1: PDEATHSIG
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def kill(child: Child) -> None:
    kill_process(child.process)
    child.replies.close()
    child.requests.close()


def kill_process(process: Process) -> None:
    """SIGKILL to the process and its group (the compilers it runs), and wait for it."""
    pid = process.pid
    if pid > 0:  # 0 would mean our own process group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    process.kill()
    process.wait(timeout=5)
