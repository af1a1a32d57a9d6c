"""The user-kernel example in README.md works as written: its module and its spec, saved
side by side under the names README gives them, run by the installed command from that
directory — a directory that also holds folders named like this project's packages, which
must not replace them (in the driver, in Ray's workers, or in the processes those start)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from conftest import ROOT, user_folders

EXPECTED = [(64, "ok", "passed"), (128, "ok", "passed"), (96, "compile_error", "skipped")]
SPEC = "add.yaml"  # the name README gives the spec
# README's commands, on the interpreter even where a GPU is (the launch-code check runs there).
RUN = ["run", SPEC, "--out", "run", "--backend", "interpret"]


def readme_section(title: str) -> str:
    """README's section under the heading that ends with `title`, up to the next heading."""
    readme = (ROOT / "README.md").read_text()
    start = re.search(rf"^#+ .*{re.escape(title)}\n", readme, re.M)
    assert start, f"README.md has no heading {title!r}"
    rest = readme[start.end():]
    end = re.search(r"^#+ ", rest, re.M)
    return rest[:end.start()] if end else rest


def saved_as(section: str, language: str) -> tuple[str, str]:
    """A code block of the section and the file name the text before it gives it."""
    found = re.search(rf"`([\w.]+)`:\n\n```{language}\n(.*?)```", section, re.S)
    assert found, f"no {language} block introduced by its file name"
    return found.group(1), found.group(2)


def users_directory(tmp_path: Path, decoys: bool = True) -> Path:
    section = readme_section("Your own kernel")
    for language in ("python", "yaml"):
        name, text = saved_as(section, language)
        (tmp_path / name).write_text(text)
    assert (tmp_path / "addkernel.py").exists() and (tmp_path / SPEC).exists()
    return user_folders(tmp_path) if decoys else tmp_path


def run(command: list[str], cwd: Path) -> list[tuple]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300,
                            env=env)
    assert result.returncode == 0, result.stderr
    rows = pq.read_table(cwd / "run" / "trials.parquet").to_pylist()
    return [(r["BLOCK"], r["status"], r["validation"]) for r in rows]


def test_readme_kernel_example_sweeps_from_the_users_directory(tmp_path):
    here = users_directory(tmp_path)
    sweep = str(Path(sys.executable).parent / "sweep")  # the installed command, as README says
    assert run([sweep, *RUN], here) == EXPECTED


# After README's launch-code snippet: its add() must compute x + y, with the tuned BLOCK
# for the problem the sweep tuned, and the fallback for one it did not.
CHECK = """
import json, sys
import sweep.tuned
used = []
real = sweep.tuned.tuned_config
def spy(*args, **kwargs):
    used.append(real(*args, nearest=nearest, **kwargs))
    return used[-1]
tuned_config = spy
# The size tuned; one that was not, from the nearest tuned; with nearest=False, the default.
for n, nearest in ((1000, True), (999, True), (999, False)):
    x, y = torch.randn(n), torch.randn(n)
    assert torch.allclose(add(x, y), x + y)
print(json.dumps(used))
"""


def test_readme_launch_code_uses_the_tuned_config_with_a_fallback(tmp_path):
    # (No decoy folders here: the user's own program imports what its directory holds.)
    here = users_directory(tmp_path, decoys=False)
    section = readme_section("Using the result").split("**In your launch code.**", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    sweep = str(Path(sys.executable).parent / "sweep")
    run([sweep, *RUN], here)
    best = json.loads((here / "run" / "best.json").read_text())["config"]
    assert best["BLOCK"] in (64, 128)
    done = subprocess.run([sys.executable, "-c", snippet + CHECK], cwd=here,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [best, best, {"BLOCK": 1024}]
