"""What a sweep leaves its Python caller: the result of a run or resume (or of load()), its
best configs, and its trial table as pyarrow or pandas."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweep.spec import SpecError

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class BestConfig:
    """A best config: from a run (its index in the run's table) or from the cache."""

    config: dict[str, Any]
    latency_ms: float
    device: str
    index: int | None = None  # None: a cache entry's, whose run may be gone

    def triton_config(self) -> Any:
        """As a triton.Config (launch options as its keywords)."""
        from sweep.tuned import triton_config

        return triton_config(self.config)


@dataclass(frozen=True)
class ProblemBest:
    """One problem of a sweep over `problems:` (the kernel's defaults merged in), its best
    (None: no config succeeded for it), each device type's, and the finalists that chose it."""
    problem: dict[str, Any]
    best: BestConfig | None
    by_device: dict[str, BestConfig] = field(default_factory=dict)
    finalists: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class SweepResult:
    """What a run left behind. state: "complete", "interrupted" (stopped, by a signal,
    --max-trials or the time budget: resumable), "failed", "cached" (nothing ran: the
    best-config cache held the best of a complete run of this sweep; run_dir is that
    run's, if it is still there), or, from load(), "running" (a run going on, or one
    killed: resume it)."""

    state: str
    run_dir: Path | None
    best: BestConfig | None
    # What the `sweep` command would have exited with (run and resume; None from load())
    exit_code: int | None = None
    by_device: dict[str, BestConfig] = field(default_factory=dict)
    finalists: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    total: int = 0
    done: int = 0
    elapsed_s: float = 0.0
    # A sweep over problems: each one's best, in order (`best` and the rest are the first's)
    by_problem: list[ProblemBest] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.state in ("complete", "cached")

    def table(self) -> pa.Table:
        """The trial table: one row per config, in index order."""
        from storage.readback import ReadBackError
        from storage.table import read_parquet

        if self.run_dir is None:
            raise FileNotFoundError("this result has no run directory")
        try:  # read through the descriptor checked: a FIFO there never blocks
            return read_parquet(self.run_dir / "trials.parquet")
        except ReadBackError as e:
            raise SpecError(str(e)) from None

    def to_pandas(self) -> Any:
        """The trial table as a pandas DataFrame (pandas is not a dependency of the sweep:
        ModuleNotFoundError naming the package to install, where it is missing)."""
        try:
            importlib.import_module("pandas")
        except ModuleNotFoundError:
            raise ModuleNotFoundError("SweepResult.to_pandas() needs pandas, which is not "
                                      "installed: pip install pandas (or use .table(), a "
                                      "pyarrow Table)", name="pandas") from None
        return self.table().to_pandas()

