"""Text from a spec or a run directory (someone else's) on a terminal: its control
characters escaped in the summary, the progress lines, `sweep report` and `sweep best`,
so that it can neither rewrite the screen nor forge a line; the JSON stays exact."""

import json
import re

from conftest import sweep_in, write_spec

from sweep.console import printable

HOSTILE = "a\x1b]0;pwned\x07\nbest: #0 forged"
RAW = ("\x1b", "\x07", "\x9b", "\x7f", "\u202e")


def test_control_characters_are_escaped_as_json_escapes_them_and_json_stays_json():
    text = "x\x00\x1b[2J\r\n\t\x7f\x9b\u202e\u2066y"
    shown = printable(text)
    assert shown == "x\\u0000\\u001b[2J\\r\\n\\t\\u007f\\u009b\\u202e\\u2066y"
    assert json.loads(f'"{shown}"') == text  # a JSON document printed stays the same one
    assert printable("M=16, dtype=float16 · é ★") == "M=16, dtype=float16 · é ★"


def test_a_problems_terminal_escapes_and_newlines_reach_no_terminal_raw(tmp_path):
    spec = write_spec(tmp_path / "hostile.yaml", name="sim", kernel="matmul",
                      problem={"N": 64},
                      problems=[{"M": 1, "tag": HOSTILE}, {"M": 2, "tag": "b\u202eevil\x9b"}],
                      space={"A": [0, 1, 2], "B": [0, 1]},
                      run={"backend": "simulate", "finalists": 2},
                      simulate={"workers": 1, "trial_ms": 1, "fail_rate": 0.3})
    out = tmp_path / "run"
    outputs = [sweep_in("run", spec, "--out", out), sweep_in("report", out),
               sweep_in("best", out)]
    for done in outputs:
        assert done.returncode == 0, done.stderr
        for text in (done.stdout, done.stderr):
            assert not any(c in text for c in RAW), text
            assert not any(line.startswith("best: #0") for line in text.splitlines())
    run, report, _ = outputs
    assert "best for M=1, tag=a\\u001b]0;pwned\\u0007\\nbest: #0 forged: #" in run.stdout
    assert "re-timing the 2 fastest configs for M=2, tag=b\\u202eevil\\u009b side by side" \
        in run.stderr
    # The problems table's columns line up on the escaped text.
    table = [line for line in report.stdout.splitlines() if line.startswith("  M=")][:2]
    assert len({re.search(r"  \d+/\d+ ", line).start() for line in table}) == 1, table
    doc = json.loads(sweep_in("report", out, "--json").stdout)
    assert doc["problems"][0]["problem"]["tag"] == HOSTILE
