"""What every recorded benchmark result carries (date, machine, versions), and where it
is written: benchmarks/results/NAME-DATE.json, the file BENCHMARKS.md cites."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from sweep.run.rundir import versions


def header(name: str) -> dict[str, Any]:
    return {"benchmark": name, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"cpu": platform.processor() or platform.machine(),
                        "cores": os.cpu_count(), "system": platform.platform()},
            "versions": versions()}


def write(result: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result['benchmark']}-{result['date'][:10]}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path
