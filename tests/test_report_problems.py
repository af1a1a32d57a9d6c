"""`sweep report` on a sweep over problems (`problems:`): one real run under Triton's
interpreter, three sizes of one matmul. Each problem gets its own row, winner, ranking and
parameter effects in the text, the JSON and the HTML report, and the winner's config
across sizes is plotted (plotly in the page, problems.png for --plot). Every figure is
checked against the run's own best.json (by_problem), not against numbers written here."""

import json
import shutil

import pyarrow.parquet as pq
import pytest
from conftest import SHAPES, sweep_cli, sweep_in, write_spec

from sweep.numbers import significant

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """A complete run over three problems, its HTML report and PNGs."""
    where = tmp_path_factory.mktemp("problems")
    spec = write_spec(where / "shapes.yaml", **SHAPES)
    with pytest.MonkeyPatch.context() as m:
        m.setenv("SWEEP_CACHE_DIR", str(where / "cache"))
        assert sweep_cli("run", spec, "--out", where / "run") == 0
        html = plot = ()
        try:
            import plotly  # noqa: F401

            html = ("--html", where / "report.html")
        except ImportError:
            pass
        try:
            import matplotlib  # noqa: F401

            plot = ("--plot", where / "plots")
        except ImportError:
            pass
        if html or plot:
            assert sweep_cli("report", where / "run", *html, *plot) == 0
    return where


def _best(shapes):
    return json.loads((shapes / "run" / "best.json").read_text())


def _label(bp):
    return f"M={bp['problem']['M']}"  # M is the one problem key that varies


def _data(page):
    return json.loads(page.split('id="sweep-data">', 1)[1].split("</script>", 1)[0])


def test_the_text_report_names_each_problem_and_its_winner(shapes):
    best = _best(shapes)
    report = sweep_in("report", shapes / "run")
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    assert lines[1].startswith("problems (3, by M;")
    assert not any(line.startswith("winner:") for line in lines)  # no one headline winner
    top = lines.index(next(line for line in lines if line.startswith("top 5 of each")))
    for bp in best["by_problem"]:
        # The problems table: a row each, its winner the one pass's fastest (the
        # interpreter's finalists are not re-timed).
        [row] = [line for line in lines[:top] if line.startswith(f"  {_label(bp)} ")]
        assert f"#{bp['index']} " in row
        assert f"  {significant(bp['latency_ms'])}  " in row
        assert row.endswith(json.dumps(bp["config"], sort_keys=True))
        assert f"{bp['configs']}/{bp['configs']}" in row  # every config worked
        # Its top: ★ on its own winner, first of its rows.
        [first] = [line for line in lines[top:] if line.startswith(f"  {_label(bp)} ")]
        assert f"★ 1   #{bp['index']} " in first
    assert sum("★" in line for line in lines[top + 1:]) == len(best["by_problem"])
    # The winner's BLOCK_M follows M here (BLOCK_M <= M); said in one line.
    changing = [line for line in lines if "winning values that differ by problem" in line]
    blocks = " → ".join(str(bp["config"]["BLOCK_M"]) for bp in best["by_problem"])
    if len({bp["config"]["BLOCK_M"] for bp in best["by_problem"]}) > 1:
        assert changing and f"BLOCK_M {blocks}" in changing[0]
    # Parameter effects within each problem: M=16 never ran BLOCK_M=32.
    effects = lines.index(next(line for line in lines if line.startswith("parameters, per")))
    assert lines[effects + 1].split()[:4] == ["BLOCK_M", "M=16", "16:", "2/2"]
    assert lines[effects + 1].endswith("32: 0/0")
    assert lines[effects + 2].split()[:4] == ["M=32", "16:", "2/2", "·"]


def test_the_json_report_has_each_problems_winner_and_ranking(shapes):
    best = _best(shapes)
    report = sweep_in("report", shapes / "run", "--json", "--top", "3")
    assert report.returncode == 0, report.stderr
    doc = json.loads(report.stdout)
    assert doc["problem_keys"] == ["M"]
    # The head is the first problem's, as best.json's is; no rate from the base problem's work.
    assert doc["winner"] == best["index"] == best["by_problem"][0]["index"]
    assert doc["work"] == {} and all(r["tflops"] is None for r in doc["top"])
    assert [p["label"] for p in doc["problems"]] == [_label(bp) for bp in best["by_problem"]]
    for p, bp in zip(doc["problems"], best["by_problem"]):
        assert p["problem"] == bp["problem"]
        # None re-timed under the interpreter: its winner is the one pass's fastest.
        assert (p["winner"], p["configs"], p["first_index"], p["finalists"]) == \
            (bp["index"], bp["configs"], bp["first_index"], 0)
        assert bp["finalists"] and all(f["retimed"] is False for f in bp["finalists"])
        assert p["chosen"]["config"] == bp["config"]
        assert p["chosen"]["retimed_ms"] is None
        assert p["chosen"]["latency_ms"] == pytest.approx(bp["latency_ms"])
        assert p["chosen"]["device"] == bp["device"]
        # Its ranking holds its own trials only, ranked from 1, its winner first.
        mine = range(bp["first_index"], bp["first_index"] + bp["configs"])
        assert [r["rank"] for r in p["top"]] == list(range(1, min(3, bp["configs"]) + 1))
        assert p["top"][0]["index"] == bp["index"] and all(r["index"] in mine for r in p["top"])
        assert [b["device"] for b in p["baseline"]] == list(bp["baseline"])
        # Its effects count its trials only.
        for e in p["effects"]:
            assert sum(v["trials"] for v in e["values"]) == bp["configs"]


def test_the_html_report_plots_the_winner_across_problems(shapes):
    pytest.importorskip("plotly")
    best = _best(shapes)
    page = (shapes / "report.html").read_text()
    for fetch in ("<script src", "<link", "<img", "@import", "url(http"):
        assert fetch not in page.lower()  # self-contained, as a sweep of one's
    assert "<h2>Problems</h2>" in page and "id='plot-problems'" in page
    assert "id='problem-pick'" in page
    data = _data(page)
    winners = [p["winner"] for p in data["problems"]]
    assert [p["label"] for p in data["problems"]] == [_label(bp) for bp in best["by_problem"]]
    assert [(w["index"], w["config"]) for w in winners] == \
        [(bp["index"], bp["config"]) for bp in best["by_problem"]]
    assert [w["best_ms"] for w in winners] == \
        pytest.approx([bp["latency_ms"] for bp in best["by_problem"]])
    configs = [bp["config"] for bp in best["by_problem"]]
    assert data["winner_changes"] == [k for k in SHAPES["space"]
                                      if len({c[k] for c in configs}) > 1]
    assert data["problem_keys"] == ["M"]
    # The trial table has the problem's column, and each trial its problem.
    table = pq.read_table(shapes / "run" / "trials.parquet").to_pylist()
    assert data["trials"]["M"] == [r["M"] for r in table]
    at = [next(k for k, bp in enumerate(best["by_problem"]) if bp["problem"]["M"] == r["M"])
          for r in table]
    assert data["trials"]["problem_at"] == at


def test_plot_writes_problems_png_beside_the_others(shapes):
    pytest.importorskip("matplotlib")
    names = sorted(p.name for p in (shapes / "plots").iterdir())
    assert names == ["effects.png", "heatmap.png", "latency.png", "problems.png",
                     "timeline.png"]
    for name in names:
        data = (shapes / "plots" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000


def test_the_winners_are_read_from_the_snapshot_where_best_json_is_lost(shapes, tmp_path):
    best = _best(shapes)
    copy = tmp_path / "run"
    shutil.copytree(shapes / "run", copy)
    (copy / "best.json").unlink()
    doc = json.loads(sweep_in("report", copy, "--json").stdout)
    assert [(p["winner"], p["finalists"]) for p in doc["problems"]] == \
        [(bp["index"], 0) for bp in best["by_problem"]]  # none re-timed (the interpreter)


def test_the_page_draws_each_problems_plots_in_chromium(shapes):
    pytest.importorskip("plotly")
    from test_report import REDRAWN, _chromium

    binary, driver_path = _chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(driver_path), options=options)
    best = _best(shapes)
    try:
        browser.get((shapes / "report.html").as_uri())
        WebDriverWait(browser, 30, ignored_exceptions=REDRAWN).until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")) == 5)
        assert [e for e in browser.get_log("browser")
                if e["level"] in ("SEVERE", "WARNING")] == []
        plotted = browser.execute_script(
            "return document.getElementById('plot-problems').data"
            ".map(t => [t.name, t.x, t.y])")
        labels = [_label(bp) for bp in best["by_problem"]]
        assert plotted[-1][:2] == ["winner ms", labels]
        assert plotted[-1][2] == pytest.approx([bp["latency_ms"] for bp in best["by_problem"]])
        assert ["BLOCK_M", labels, [bp["config"]["BLOCK_M"] for bp in best["by_problem"]]] \
            in plotted
        # The problem picked: the heatmap's cells are that problem's best latencies.
        Select(browser.find_element(By.ID, "problem-pick")).select_by_index(2)
        title = browser.find_element(By.CSS_SELECTOR, "#plot-heatmap .gtitle").text
        assert title.endswith(f"— {labels[2]}")
        table = pq.read_table(shapes / "run" / "trials.parquet").to_pylist()
        z = browser.execute_script("return document.getElementById('plot-heatmap').data[0].z")
        assert z == [[min(r["latency_ms"] for r in table if r["M"] == 64 and
                          (r["BLOCK_M"], r["BLOCK_N"]) == (m, n)) for m in (16, 32)]
                     for n in (16, 32)]
        # Latency sorts problem by problem, each winner first of its problem and starred.
        browser.find_element(By.XPATH, "//table[@id='trials']//th[.='rank']").click()
        rows = browser.find_elements(By.CSS_SELECTOR, "#trials tbody tr")
        order = [int(r.get_attribute("data-index")) for r in rows]
        problems = best["by_problem"]
        assert [order[sum(bp["configs"] for bp in problems[:k])]
                for k in range(len(problems))] == [bp["index"] for bp in problems]
        assert [int(r.get_attribute("data-index")) for r in rows
                if r.get_attribute("class") == "winner"] == \
            [bp["index"] for bp in best["by_problem"]]
        assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        browser.quit()


def test_the_report_of_many_problems_reads_each_problems_values_a_bounded_number_of_times(
        tmp_path, monkeypatch):
    from sweep.report import analysis

    problems = 300
    spec = write_spec(tmp_path / "many.yaml", name="many", kernel="matmul",
                      problem={"N": 64}, problems=[{"M": m} for m in range(1, problems + 1)],
                      space={"A": [1, 2]}, run={"backend": "simulate", "finalists": 0},
                      simulate={"workers": 2, "trial_ms": 0})
    assert sweep_in("run", spec, "--out", tmp_path / "run", "--runtime", "local").returncode == 0
    calls = 0
    key = analysis._key

    def counted(value):
        nonlocal calls
        calls += 1
        return key(value)

    monkeypatch.setattr(analysis, "_key", counted)
    report = analysis.analyse(tmp_path / "run")
    assert len(report.problems) == problems
    # a pass over the problems per key and one over the rows: not problems x problems
    assert calls <= 4 * (problems + 2 * problems), calls
