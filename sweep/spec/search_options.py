"""The spec's `search` section: which strategy, with which options (docs/spec.md, "Search").
The strategies themselves are sweep/search/strategies.py's."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

STRATEGIES = ("exhaustive", "halving", "guided")

# Options that mean something to one strategy only: set for another, they are a mistake.
OPTIONS_OF = {"budget": ("guided",), "patience": ("guided",), "improvement": ("guided",),
              "batch": ("guided",), "sample": ("halving",), "eta": ("halving",),
              "seed": ("guided", "halving"), "warm_start": ("guided", "halving")}


@dataclass(frozen=True)
class SearchOptions:
    """The spec's `search` section (docs/spec.md, "Search")."""

    strategy: str = "exhaustive"  # exhaustive | halving | guided
    seed: int = 0
    # guided: at most this fraction of the space; it stops sooner once the batches of the
    # last `patience` of the space (at least two) improved the best by less than
    # `improvement` (relative)
    budget: float = 0.2
    patience: float = 0.06
    improvement: float = 0.005
    batch: int | None = None  # guided: configs per batch; None: sized to the cluster
    # halving: the first rung screens this fraction of the space; each rung promotes
    # 1/eta of the one before to the careful timing, down to run.finalists
    sample: float = 0.25
    eta: int = 3
    warm_start: int = 8  # configs first taken from the nearest cached sweep (0: none)

    @property
    def exhaustive(self) -> bool:
        return self.strategy == "exhaustive"

    def budget_configs(self, total: int) -> int | None:
        """The configs this strategy's budget allows of a space of `total` (None: all),
        before sweep/search/strategies.py's rule for a space too small to search."""
        if self.strategy == "guided":
            return math.ceil(self.budget * total)
        if self.strategy == "halving":
            return math.ceil(self.sample * total)
        return None

    def own(self) -> dict[str, object]:
        """The options that apply to this strategy: a spec may give no others."""
        return {k: v for k, v in asdict(self).items()
                if self.strategy in OPTIONS_OF.get(k, (self.strategy,))}
