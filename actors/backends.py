"""The backends a trial can run on, by name, with the traits the rest of the tool decides
by: one table, so that a decision (may the cache answer? does a worker hold a GPU?) reads
a trait rather than a list of names written out wherever it is made."""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"  # a spec's default: cuda where the workers find a GPU, else interpret


@dataclass(frozen=True)
class BackendTraits:
    name: str
    # Imports and launches the spec's kernel: what it measures is the kernel, so the
    # best-config cache answers and keeps it. The others measure this tool.
    kernel: bool = False
    gpu: bool = False  # each worker holds a GPU
    interpreted: bool = False  # Triton's interpreter on the CPU: launch options ignored
    compiles_ahead: bool = False  # compile slots work ahead of the device
    made_up_devices: bool = False  # devices and timings come from the spec or a table


BACKENDS: dict[str, BackendTraits] = {b.name: b for b in (
    BackendTraits("cuda", kernel=True, gpu=True, compiles_ahead=True),
    BackendTraits("interpret", kernel=True, interpreted=True),
    BackendTraits("simulate", made_up_devices=True),
    BackendTraits("replay", compiles_ahead=True, made_up_devices=True),
)}
CHOICES = (AUTO, *BACKENDS)  # what a spec's run.backend, --backend and the API accept


def traits(name: str) -> BackendTraits:
    """The traits of a backend that is resolved (not auto)."""
    return BACKENDS[name]


def resolve(requested: str, gpus: int) -> str:
    """The backend a request means where its workers find `gpus` GPUs: auto is cuda with
    a GPU, else interpret; any other is itself (whether it can run there is the caller's
    to say). The one place auto is decided."""
    if requested != AUTO:
        return requested
    return "cuda" if gpus else "interpret"


def may_use_gpu(name: str) -> bool:
    """Whether a requested backend (auto included) may run on GPUs."""
    return name == AUTO or BACKENDS[name].gpu


def may_interpret(name: str) -> bool:
    """Whether a requested backend (auto included) may run under the interpreter."""
    return name == AUTO or BACKENDS[name].interpreted
