"""What benchmarks/third_party.py sweeps and what it must meet: each third-party kernel
(its module and spec under benchmarks/third_party/, its package, its sweep's time budget,
which of its package's launches is "its own"), the tiny problems --smoke puts in their
specs, and the targets judged on the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "benchmarks" / "third_party"  # the kernel modules and specs; sweeps run here

TARGET_COMMAND_S = 60.0
TARGET_SPEEDUP = 1.5


@dataclass(frozen=True)
class Case:
    name: str  # the kernel module in benchmarks/third_party/, and its log's name
    spec: str  # its spec there
    package: str  # the distribution it comes from
    budget_s: float  # --time-budget of its sweep
    own: str  # the package_launches entry that is "the package's own launch config"
    smoke: dict[str, Any] = field(default_factory=dict)  # spec keys replaced for --smoke


CASES = (
    Case("liger_rms", "liger-rms-324.yaml", "liger-kernel", 150, "liger", smoke={
        "problem": {"n_rows": 8, "n_cols": 64, "dtype": "float32"},
        "space": {"BLOCK_SIZE": [32, 64, 128], "BLOCK_ROW": [1, 4], "num_warps": [4],
                  "num_stages": [1]}}),
    Case("liger_layer_norm", "liger-layer-norm.yaml", "liger-kernel", 90, "liger", smoke={
        "problem": {"n_rows": 8, "n_cols": 64, "dtype": "float32"},
        "space": {"BLOCK_SIZE": [32, 64, 128], "num_warps": [1, 4], "num_stages": [1]}}),
    Case("fla_chunk_o", "fla-chunk-o.yaml", "fla-core", 120, "fla", smoke={
        "problem": {"B": 1, "T": 40, "H": 1, "HV": 2, "K": 32, "V": 48, "chunk_size": 16,
                    "dtype": "float32"},
        "fixed": {"H": 1, "HV": 2, "K": 32, "V": 48, "BT": 16},
        "space": {"BK": [16, 32], "BV": [16, 32, 64], "num_warps": [2],
                  "num_stages": [1, 2]}}),
)


def spec_for(case: Case, tmp: Path, smoke: bool) -> Path:
    """The case's spec; for --smoke, a copy under tmp with its tiny problem, on the
    interpreter backend."""
    if not smoke:
        return HERE / case.spec
    spec = yaml.safe_load((HERE / case.spec).read_text())
    spec.update(case.smoke)
    spec["name"] = f"{spec['name']}-smoke"
    spec["run"] = {**spec.get("run", {}), "backend": "interpret"}
    path = tmp / f"{case.name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def targets(cases: dict[str, Any]) -> dict[str, Any]:
    """The targets, judged on Liger RMSNorm's entry of the result's cases."""
    rms = cases.get("liger_rms", {})
    run, sweep = rms.get("run", {}), rms.get("sweep", {})
    speed = rms.get("compare", {}).get("speedup_of_pick", {}).get("pick", {})
    command_s = sweep.get("command_s")
    complete = run.get("state") == "complete" and run.get("trials") == 324
    deaths = run.get("deaths", {})
    died = len(deaths.get("attempts_died", [])) + len(deaths.get("stderr_died_running_trial",
                                                                 []))
    return {
        "liger_rms_command_s": {"value": command_s, "target": f"<= {TARGET_COMMAND_S:g} s, "
                                "all 324 trials", "complete": complete,
                                "met": bool(command_s is not None and complete
                                            and command_s <= TARGET_COMMAND_S)},
        "liger_rms_worker_deaths": {
            "attempts_died": len(deaths.get("attempts_died", [])),
            "stderr_died_running_trial": len(deaths.get("stderr_died_running_trial", [])),
            "target": 0, "met": bool(run) and died == 0},
        "liger_rms_pick_speedup": {
            "vs_liger": speed.get("liger"), "vs_liger_block": speed.get("liger_block"),
            "vs_liger_function": speed.get("liger_function"), "target": TARGET_SPEEDUP,
            "met": speed.get("liger") is not None and speed["liger"] >= TARGET_SPEEDUP,
            "met_vs_liger_block": speed.get("liger_block") is not None
            and speed["liger_block"] >= TARGET_SPEEDUP,
            "note": "liger: what Liger's rms_norm_forward launches for 65536x4096 (its "
                    "one-row kernel, _rms_norm_forward_kernel); liger_block: the block "
                    "kernel at Liger's settings (BLOCK_ROW 16), the comparison of "
                    "the comparison made when the issue was filed"},
    }
