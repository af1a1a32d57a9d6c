"""A real multi-node Ray cluster on this machine, for tests.

Each node is its own `ray start --block` process in its own session (so its own process
group), with its own temp dir under one root (/tmp/mn-ray-*), its own custom resources
and, where the kernel lets us, its own hostname (a UTS namespace via `unshare --uts`, so
that the trial table's `node` column, the worker's hostname, tells the nodes apart).

Readiness is polled from the GCS itself over plain gRPC (no ray.init, and none of Ray's C++
clients in the test process: those end their process when the GCS stays away too long).
Tests kill a node's raylet or the head's GCS server by pid; `ray start --block` then ends
the rest of that node within a second or so, as it does when a machine loses its raylet.

Teardown is by pid only: every node's process group, then any process left whose
session, command line or open files name the cluster's root directory; it then checks
/proc that nothing is left. Never `ray stop`, which would end other people's clusters.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
# Environment every process of these clusters, and every driver joining them, gets.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's minimum is 75 MiB; the default 30% of RAM
PORTS_PER_CLUSTER = 10  # base: GCS; +1 the head's Ray Client server; +2.. agents' HTTP


class ClusterError(RuntimeError):
    pass


# --- /proc ---------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[str, int, int] | None:
    """(comm, ppid, session id) of a live process, None if it is gone (or a zombie)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return comm, int(fields[1]), int(fields[3])


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def _opens_under(pid: int, root: str) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(root):
                return True
    return False


def descendants(pid: int) -> list[int]:
    """Live processes under pid (not pid itself), parents before children."""
    children: dict[int, list[int]] = {}
    for p in _pids():
        st = _stat(p)
        if st is not None:
            children.setdefault(st[1], []).append(p)
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        found.append(p)
        todo += children.get(p, [])
    return found


def processes_of(root: Path, sessions: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """Live processes that belong to a cluster under root: in one of its nodes' sessions,
    or whose command line or open files name root."""
    prefix, me = str(root), os.getpid()
    found = []
    for p in _pids():
        st = _stat(p)
        if st is None or p == me:
            continue
        if st[2] in sessions or prefix in _cmdline(p) or _opens_under(p, prefix):
            found.append(p)
    return found


def _uts_namespaces_work() -> bool:
    try:
        done = subprocess.run(["unshare", "--uts", "hostname", "mn-probe"],
                              capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


# --- GCS queries over plain gRPC --------------------------------------------------------------
@dataclass(frozen=True)
class NodeState:
    node_id: str
    alive: bool
    head: bool
    hostname: str
    temp_dir: str
    resources: dict[str, float]


def gcs_nodes(address: str, timeout_s: float = 2.0) -> list[NodeState]:
    """Every node the GCS at address knows (alive or dead); raises if it does not answer."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        reply = stub.GetAllNodeInfo(gcs_service_pb2.GetAllNodeInfoRequest(),
                                    timeout=timeout_s)
    return [NodeState(n.node_id.hex(), n.state == 0, n.is_head_node,
                      n.node_manager_hostname, n.temp_dir, dict(n.resources_total))
            for n in reply.node_info_list]


# --- nodes and clusters -------------------------------------------------------------------------
@dataclass
class Node:
    name: str
    head: bool
    resources: dict[str, float]
    temp_dir: Path
    log: Path
    proc: subprocess.Popen
    hostname: str | None

    @property
    def session(self) -> int:
        """Its session (and process group) id: the `ray start` process's pid."""
        return self.proc.pid

    def pid_of(self, comm: str, timeout_s: float = 30.0) -> int:
        """The pid of this node's process named comm (e.g. raylet, gcs_server), found in
        the process tree under its `ray start --block` process."""
        deadline = time.monotonic() + timeout_s
        while True:
            for p in descendants(self.proc.pid):
                st = _stat(p)
                if st is not None and st[0] == comm:
                    return p
            if self.proc.poll() is not None:
                raise ClusterError(f"{self.name}: `ray start` exited "
                                   f"({self.proc.returncode}); {self.tail()}")
            if time.monotonic() >= deadline:
                raise ClusterError(f"{self.name}: no {comm} process within {timeout_s:g} s")
            time.sleep(0.05)

    @property
    def raylet_pid(self) -> int:
        return self.pid_of("raylet")

    @property
    def gcs_pid(self) -> int:
        if not self.head:
            raise ClusterError(f"{self.name} is not the head: it has no GCS server")
        return self.pid_of("gcs_server")

    def pids(self) -> list[int]:
        return [self.proc.pid, *descendants(self.proc.pid)]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole node: its process group and anything under it."""
        targets = self.pids()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.session, sig)
        for p in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, sig)

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class Cluster:
    """A head and worker nodes on 127.0.0.1. port: the GCS port; the PORTS_PER_CLUSTER
    ports from it are this cluster's. Every other port (raylets, object managers, workers,
    agents' gRPC) is chosen by Ray or the kernel, so clusters never collide on them."""

    port: int
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="mn-ray-",
                                                                       dir="/tmp")))
    nodes: list[Node] = field(default_factory=list)
    own_hostnames: bool = field(default_factory=_uts_namespaces_work)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def workers(self) -> list[Node]:
        return self.nodes[1:]

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def _start(self, name: str, args: list[str], resources: dict[str, float],
               num_cpus: int, head: bool) -> Node:
        k = len(self.nodes)
        if k + 2 >= PORTS_PER_CLUSTER:
            raise ClusterError(f"at most {PORTS_PER_CLUSTER - 2} nodes per cluster")
        temp_dir = self.root / name
        temp_dir.mkdir(parents=True)
        log = self.root / f"{name}.log"
        hostname = f"mn-{name}" if self.own_hostnames else None
        command = [RAY, "start", "--block", *args, "--num-cpus", str(num_cpus),
                   "--resources", json.dumps(resources), "--temp-dir", str(temp_dir),
                   "--node-ip-address", "127.0.0.1",
                   "--dashboard-agent-listen-port", str(self.port + 2 + k),
                   "--object-store-memory", str(OBJECT_STORE_BYTES),
                   "--disable-usage-stats", "--log-style", "record"]
        if hostname:
            # A hostname of its own: set in a new UTS namespace, then exec Ray there.
            command = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                       hostname, *command]
        with open(log, "wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, **RAY_ENV}, cwd=self.root)
        node = Node(name, head, resources, temp_dir, log, proc, hostname)
        self.nodes.append(node)
        return node

    def start_head(self, resources: dict[str, float] | None = None,
                   num_cpus: int = 1) -> Node:
        if self.nodes:
            raise ClusterError("the head is started first, once")
        return self._start("head", ["--head", "--port", str(self.port),
                                    "--ray-client-server-port", str(self.port + 1),
                                    "--include-dashboard", "false"],
                           resources or {}, num_cpus, head=True)

    def add_worker(self, name: str, resources: dict[str, float], num_cpus: int = 1) -> Node:
        return self._start(name, ["--address", self.address], resources, num_cpus,
                           head=False)

    def states(self) -> dict[str, NodeState]:
        """What the GCS says of each of our nodes, by node name (matched by temp dir)."""
        by_dir = {str(n.temp_dir): n.name for n in self.nodes}
        return {by_dir[s.temp_dir]: s for s in gcs_nodes(self.address)
                if s.temp_dir in by_dir}

    def wait_alive(self, timeout_s: float = 180.0) -> dict[str, NodeState]:
        """Until the GCS reports every node alive with its resources registered."""
        deadline = time.monotonic() + timeout_s
        last: object = None
        while True:
            for n in self.nodes:
                if not n.alive():
                    raise ClusterError(f"{n.name}: `ray start` exited "
                                       f"({n.proc.returncode}): {n.tail()}")
            try:
                states = self.states()
                if len(states) == len(self.nodes) and all(
                        s.alive and all(s.resources.get(r, 0) == v
                                        for r, v in self.node(name).resources.items() if v)
                        for name, s in states.items()):
                    return states
                last = states
            except Exception as e:  # the GCS is not up yet: grpc raises until it is
                last = e
            if time.monotonic() >= deadline:
                raise ClusterError(f"not all of {[n.name for n in self.nodes]} alive "
                                   f"within {timeout_s:g} s; last: {last!r}")
            time.sleep(0.1)

    def wait_dead(self, name: str, timeout_s: float = 30.0) -> float:
        """Until the GCS reports the node dead; returns how long that took."""
        t0 = time.monotonic()
        while True:
            state = self.states().get(name)
            if state is not None and not state.alive:
                return time.monotonic() - t0
            if time.monotonic() - t0 >= timeout_s:
                raise ClusterError(f"the GCS did not mark {name} dead within {timeout_s:g} s")
            time.sleep(0.1)

    def wait_gone(self, name: str, timeout_s: float = 30.0) -> float:
        """Until every process of the node has ended (after its raylet or GCS was killed,
        `ray start --block` ends the rest, and its workers follow their raylet); returns
        how long that took."""
        node, t0 = self.node(name), time.monotonic()
        while True:
            node.proc.poll()
            left = processes_of(node.temp_dir, {node.session})
            if node.proc.returncode is not None and not left:
                return time.monotonic() - t0
            if time.monotonic() - t0 >= timeout_s:
                raise ClusterError(f"{name}: processes still running {timeout_s:g} s later: "
                                   + "; ".join(f"{p} {_cmdline(p)[:100]}" for p in left))
            time.sleep(0.05)

    def leftovers(self) -> list[int]:
        return processes_of(self.root, {n.session for n in self.nodes})

    def shutdown(self, timeout_s: float = 15.0) -> None:
        """SIGKILL every process of every node, by pid; then check nothing is left."""
        for n in self.nodes:
            n.kill(signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        for n in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                n.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        left = self.leftovers()
        while left and time.monotonic() < deadline:
            for p in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, signal.SIGKILL)
            time.sleep(0.1)
            left = self.leftovers()
        if left:
            raise ClusterError("processes left behind: " +
                               "; ".join(f"{p}: {_cmdline(p)[:200]}" for p in left))
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def cluster(port: int, workers: dict[str, dict[str, float]], *,
            head_resources: dict[str, float] | None = None, num_cpus: int = 1,
            timeout_s: float = 180.0) -> Iterator[Cluster]:
    """A head and the named worker nodes (name -> custom resources), all alive; torn down
    by pid afterwards, however the block ends. timeout_s: long, since the wait ends as soon
    as they are up, and three Ray nodes start slowly on a loaded machine."""
    c = Cluster(port)
    try:
        c.start_head(head_resources, num_cpus=num_cpus)
        for name, resources in workers.items():
            c.add_worker(name, resources, num_cpus=num_cpus)
        c.wait_alive(timeout_s)
        yield c
    finally:
        c.shutdown()


if __name__ == "__main__":  # measure: python tests/ray_nodes.py [PORT]
    t0 = time.monotonic()
    with cluster(int(sys.argv[1]) if len(sys.argv) > 1 else 6470,
                 {"w1": {"sim_gpu": 2}, "w2": {"sim_gpu": 2}},
                 head_resources={"sim_gpu": 0}) as c:
        up = time.monotonic() - t0
        print(f"head + {len(c.workers)} workers alive in {up:.2f} s at {c.address}")
        for name, s in c.states().items():
            print(f"  {name}: {s.hostname} {s.node_id[:12]} raylet pid "
                  f"{c.node(name).raylet_pid} {s.resources}")
        print(f"  head gcs_server pid {c.head.gcs_pid}")
        t1 = time.monotonic()
    print(f"torn down in {time.monotonic() - t1:.2f} s, nothing left under {c.root}")


def listening(port: int) -> bool:
    """Whether something accepts connections on this loopback port."""
    try:
        socket.create_connection(("127.0.0.1", port), 1).close()
        return True
    except OSError:
        return False


def await_head(proc: subprocess.Popen, root: Path, port: int, timeout: float = 180) -> None:
    """Until the `ray start --head --block` in proc has recorded its cluster under root
    and its GCS port answers: the head is up (its log under root/head.log otherwise)."""
    record = root / "ray" / "ray_current_cluster"
    deadline = time.monotonic() + timeout
    while not (record.exists() and listening(port)):
        assert proc.poll() is None, (root / "head.log").read_text()[-2000:]
        assert time.monotonic() < deadline, f"the head did not start within {timeout:g} s"
        time.sleep(0.1)
