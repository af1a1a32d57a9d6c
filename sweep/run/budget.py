"""The time budget (--time-budget, the API's time_budget_s): whether it is spent, read on
one clock from when the command or the call began.

`clock` is that clock, a module attribute so that a test can hold it: a test that needs a
trial done before the budget ends says when the budget is spent, instead of racing a
loaded machine's worker start-up against half a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# The command and the API read `started` on time.monotonic; a test's clock keeps its scale.
clock: Callable[[], float] = time.monotonic


@dataclass(frozen=True)
class TimeBudget:
    started: float  # when the command or call began, on `clock`
    seconds: float | None  # None: no budget

    def spent(self) -> bool:
        return self.seconds is not None and clock() >= self.started + self.seconds
