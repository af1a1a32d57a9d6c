"""Numbers as a person reads them (sweep/numbers.py) in every view of a run: the text
report, the HTML report and its page's own script, the PNGs; the JSON stays numbers."""

import json
import re
import shutil
import subprocess

import pytest
from conftest import sweep_cli
from test_report import INTERPRETED_WORK, write_interpreter_run

from sweep.numbers import amount, ratio, scale, significant

EXPONENT = re.compile(r"\d[eE][-+]\d")


@pytest.mark.parametrize(("value", "digits", "text"), [
    (1100.3, 3, "1100"), (694.2, 3, "694"), (1100.3, 4, "1100"), (12345.6, 4, "12346"),
    (2.1, 4, "2.1"), (2.0, 4, "2"), (0.01234567, 4, "0.01235"), (0.0001273, 4, "0.0001273"),
    (9.211e-05, 4, "0.00009211"), (9.99996, 4, "10"), (999.96, 4, "1000"), (0.0, 4, "0"),
    (-3.14159, 3, "-3.14"), (1.5e-9, 4, "1.500e-09"),
])
def test_significant_digits_in_fixed_notation_keep_the_integer_part(value, digits, text):
    assert significant(value, digits) == text


@pytest.mark.parametrize(("value", "text"), [
    (4720.4, "4,720"), (1.614, "1.61"), (2.0, "2"), (47201.0, "47,201"), (0.5, "0.5")])
def test_ratios_have_no_exponent_and_group_thousands(value, text):
    assert ratio(value) == text


@pytest.mark.parametrize(("value", "unit", "text"), [
    (1.6154e7, "FLOP/s", "16.2 MFLOP/s"), (378_400.0, "B/s", "378 kB/s"),
    (1.234e12, "FLOP/s", "1.23 TFLOP/s"), (6.98e14, "FLOP/s", "698 TFLOP/s"),
    (999.96, "B/s", "1 kB/s"), (12.0, "B/s", "12 B/s"), (4194304.0, "FLOP", "4.19 MFLOP"),
])
def test_an_amount_takes_the_si_prefix_that_puts_it_between_1_and_1000(value, unit, text):
    assert amount(value, unit) == text


def test_a_column_takes_one_unit_from_its_largest_value():
    name, factor = scale([1.273e5, 9.211e4, None, 3.0e3], "B/s")
    assert (name, factor) == ("kB/s", pytest.approx(1e-3))
    assert scale([], "B/s") == ("B/s", 1.0)


@pytest.mark.parametrize(("speedup", "text"), [
    (1 / 4720.4, "is 4,720× slower"), (1.614, "is 1.61× faster")])
def test_the_comparison_with_torch_has_no_exponent(speedup, text):
    from sweep.report.text import speedup_text

    assert speedup_text(speedup) == text


def test_the_text_report_scales_rates_and_keeps_latencies_plain(tmp_path, capsys):
    path = write_interpreter_run(tmp_path)
    assert sweep_cli("report", path, "--top", "7") == 0
    out = capsys.readouterr().out
    assert EXPONENT.search(out) is None, out
    # 34,020 FLOP and 794.64 bytes in 2.1 ms
    assert "2.1 [2.079–2.121] ms on cpu-interpreter · 16.2 MFLOP/s · 378 kB/s" in out
    lines = out.splitlines()
    head = next(line for line in lines if "one pass ms [p20–p80]" in line)
    assert head.split()[-2:] == ["MFLOP/s", "config"]  # the column's one unit
    rows = [line.split() for line in lines[lines.index(head) + 1:][:7]]
    rates = [r[[t.startswith("{") for t in r].index(True) - 1] for r in rows]
    assert rates[:3] == ["16.2", "0.049", "0.0309"]
    assert rows[6][3:5] == ["12346", "[12222–12469]"]  # 12,345.6 ms


def test_the_json_report_keeps_its_numbers(tmp_path, capsys):
    path = write_interpreter_run(tmp_path)
    assert sweep_cli("report", path, "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    winner = doc["top"][0]
    assert winner["tflops"] == pytest.approx(INTERPRETED_WORK["flops"] / 2.1e-3 / 1e12)
    assert winner["gbps"] == pytest.approx(INTERPRETED_WORK["bytes_moved"] / 2.1e-3 / 1e9)


def _page(tmp_path):
    from sweep.report.analysis import analyse
    from sweep.report.html import render

    return render(analyse(write_interpreter_run(tmp_path)), "")


def _data(page):
    return json.loads(page.split('id="sweep-data">', 1)[1].split("</script>", 1)[0])


def test_the_html_reports_static_parts_scale_rates_and_say_the_columns_unit(tmp_path):
    page = _page(tmp_path)
    static = page.split("<script>", 1)[0] + page.split("</script>", 2)[1].split("<script")[0]
    assert "16.2 MFLOP/s · 378 kB/s" in static
    assert "<th>MFLOP/s</th>" in static and "<td>0.0309</td>" in static
    assert "bytes_moved 795 B · flops 34 kFLOP" in static
    assert EXPONENT.search(static.split("<h3>Spec as run</h3>")[0]) is None
    # The trial table's rate column: its unit from its values, for the page to apply.
    rate = _data(page)["rate"]
    assert (rate["key"], rate["name"]) == ("tflops", "MFLOP/s")
    assert rate["factor"] == pytest.approx(1e6)


def test_the_pages_own_formatting_writes_numbers_as_the_report_does(tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node here to run the page's script")
    page = _page(tmp_path)
    source = re.search(r"^const num = .*?^};$", page, re.S | re.M)
    assert source is not None
    values = [1100.3, 694.2, 12345.6, 2.1, 2.0, 0.01234567, 9.211e-05, 0.0001273, 9.99996,
              999.96, 0.0, -3.14159, 1.5e-9, 0.5, 123456789.0, 16.15, 0.049]
    script = (source.group(0) + f"\nconst vs = {json.dumps(values)};\n"
              "console.log(JSON.stringify([3, 4].map(d => vs.map(v => num(v, d)))));")
    done = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[significant(v, d) for v in values] for d in (3, 4)]
    # Every number the page formats goes through it: no toPrecision or toFixed elsewhere.
    script_text = page.split('id="sweep-data">', 1)[1]
    assert "toPrecision" not in script_text
    assert script_text.count("toFixed") == 1  # num's own


def test_the_png_heatmap_writes_cells_without_exponents(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from sweep.report.analysis import analyse
    from sweep.report.plots import _heatmap, _latency

    a = analyse(write_interpreter_run(tmp_path))
    figure = _heatmap(a)
    cells = [t.get_text() for t in figure.axes[0].texts]
    # BLOCK_M by rows (the interpreter's pick): the best of each pair of values
    assert sorted(cells) == sorted(["2.1", "694", "2000", "2500"])
    assert not [c for c in cells if EXPONENT.search(c)]
    figure.canvas.draw()
    ticks = [t.get_text() for ax in figure.axes for t in ax.get_yticklabels()]
    assert ticks and not [t for t in ticks if EXPONENT.search(t)]
    histogram = _latency(a)
    histogram.canvas.draw()
    counts = [t.get_text() for t in histogram.axes[0].get_yticklabels()]
    assert counts and all(re.fullmatch(r"\d+", c.replace("−", "-")) for c in counts), counts
