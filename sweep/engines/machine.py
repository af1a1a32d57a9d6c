"""What this machine has to run workers on (its GPUs by id, name and type, its CPUs), found
without Ray, without importing torch and without touching CUDA: the local runtime places
its workers by it, and a cached answer is decided by it in milliseconds."""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from actors.backends import may_use_gpu, resolve, traits


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def visible_gpus() -> list[str]:
    """The GPU ids workers are given (CUDA_VISIBLE_DEVICES where set, else the NVIDIA
    device files of this machine), as a local Ray instance would hand them out."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g for g in (x.strip() for x in listed.split(",")) if g and g != "-1"]
    try:
        count = sum(1 for name in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", name))
    except OSError:
        return []
    return [str(i) for i in range(count)]


@functools.cache
def smi_names() -> list[str] | None:
    """This machine's GPU names by index, as nvidia-smi gives them; None where it is absent
    or fails. It answers in milliseconds where torch takes seconds to import and start CUDA
    (3 s on an H200 box); both read the name from the driver ("NVIDIA H200" from either)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    names = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return names if done.returncode == 0 and names else None


def gpu_type(name: str) -> str:
    """A GPU's type from its name, as Ray labels a node by it: its model, without the
    vendor and the variant ("NVIDIA H200" -> H200, "NVIDIA A100-SXM4-80GB" -> A100)."""
    words = [w for w in name.split() if w.upper() not in ("NVIDIA", "TESLA", "GEFORCE")]
    return words[0].split("-")[0] if words else name


def gpus_by_id() -> dict[str, str]:
    """Each visible GPU's id and name ("" where nvidia-smi cannot name it, or where
    CUDA_VISIBLE_DEVICES lists ids nvidia-smi's order does not follow)."""
    names = smi_names() or []
    same = len(set(names)) == 1
    # nvidia-smi counts GPUs in PCI order, which CUDA's own order (and so
    # CUDA_VISIBLE_DEVICES) need not follow: GPUs of mixed names are named by index only
    # when nothing renumbers them.
    listed = "CUDA_VISIBLE_DEVICES" in os.environ
    out = {}
    for gpu in visible_gpus():
        if same:
            out[gpu] = names[0]
        elif not listed and gpu.isdigit() and int(gpu) < len(names):
            out[gpu] = names[int(gpu)]
        else:
            out[gpu] = ""
    return out


def local_devices(backend: str) -> list[str] | None:
    """The devices workers on this machine would run `backend` on, by name, once each:
    ["cpu-interpreter"], this machine's GPU names, or None where only a worker can tell
    (GPUs nvidia-smi cannot name)."""
    if not may_use_gpu(backend):
        return ["cpu-interpreter"] if traits(backend).interpreted else None
    gpus = gpus_by_id()
    if resolve(backend, len(gpus)) == "interpret":  # auto, with no GPU here
        return ["cpu-interpreter"]
    if not gpus:  # cuda asked of a machine without one: the engine will say so
        return None
    names = sorted(set(gpus.values()))
    return None if "" in names else names


def ray_address_file() -> Path:
    """Where `ray start --head` records the address of the cluster it began on this
    machine (Ray's own rule: $RAY_TMPDIR, else $TMPDIR on Linux, else /tmp; then ray/)."""
    root = os.environ.get("RAY_TMPDIR") or (
        os.environ.get("TMPDIR") if sys.platform.startswith("linux") else None) or "/tmp"
    return Path(root) / "ray" / "ray_current_cluster"


def ray_head_here(timeout_s: float = 3.0, path: Path | None = None) -> str | None:
    """The address `ray start --head` recorded on this machine (in `path`, default
    ray_address_file()), if this user started it and something listens there: a cluster
    that was killed leaves its record behind, and one another user started on a shared
    host is theirs."""
    path = path or ray_address_file()
    try:
        if path.stat().st_uid != os.getuid():
            return None
        found = path.read_text().strip()
    except OSError:
        return None
    host, _, port = found.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout_s):
            return found
    except (OSError, ValueError):
        return None
