"""Run a program with given configs pinned in its autotuned kernels, as Triton's own
autotune picked them in another run (benchmarks/autotune_steady.py's other arm):

    python pinned.py PICKS.json SCRIPT ARGS...

PICKS.json: a list of {"function", "key", "config"} (benchmarks/autotune_capture_keys.py's
triton_picks). Each autotuner whose function and key match gets that config in its cache
before its first call, so the program launches it without tuning."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sweep.autotune import hook  # noqa: E402


class Pinned:
    def __init__(self, picks: list[dict[str, Any]]) -> None:
        self.picks = picks
        self.seen: set[int] = set()

    def around(self, tuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               proceed: hook.Proceed) -> Any:
        if id(tuner) not in self.seen:
            self.seen.add(id(tuner))
            name = hook.base_function(tuner).__name__
            forms = {hook.config_form(c): c for c in tuner.configs}
            for pick in self.picks:
                live = forms.get(hook.config_form(pick["config"]))
                if pick["function"] == name and live is not None:
                    tuner.cache[tuple(pick["key"])] = live
        return proceed()


def main() -> None:
    picks = json.loads(Path(sys.argv[1]).read_text())
    hook.install(Pinned(picks))
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
