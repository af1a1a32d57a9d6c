"""`sweep report` on real runs: the quickstart's real kernels under Triton's interpreter
(its torch reference timed among the finalists, its work per launch recorded), a run read
while it is still going, the HTML report opened in a real headless Chromium, the PNGs."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, simulate_spec, sweep_cli, sweep_in

QUICKSTART = ROOT / "configs" / "quickstart.yaml"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """A complete quickstart run, its HTML report and PNGs."""
    where = tmp_path_factory.mktemp("report")
    with pytest.MonkeyPatch.context() as m:
        m.setenv("SWEEP_CACHE_DIR", str(where / "cache"))
        assert sweep_cli("run", QUICKSTART, "--out", where / "run") == 0
        assert sweep_cli("report", where / "run", "--html", where / "report.html",
                         "--plot", where / "plots") == 0
    return where


def test_under_the_interpreter_the_finalists_are_listed_not_re_timed_and_the_report_says_so(
        quickstart, capsys):
    # Its timings say nothing of a GPU's: the one pass's fastest is the answer, and
    # neither the finalists nor torch are timed again (half the run's time, before).
    best = json.loads((quickstart / "run" / "best.json").read_text())
    rows = pq.read_table(quickstart / "run" / "trials.parquet").to_pylist()
    ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: (r["latency_ms"],
                                                                        r["index"]))
    assert best["index"] == ok[0]["index"] and best["latency_ms"] == ok[0]["latency_ms"]
    assert [f["index"] for f in best["finalists"]] == [r["index"] for r in ok[:5]]
    assert all(f["retimed"] is False and f["latency_ms"] == f["sweep_latency_ms"]
               for f in best["finalists"])
    assert best["baseline"] == {} and best["partial"] is False
    assert sweep_cli("report", quickstart / "run") == 0
    out = capsys.readouterr().out
    assert f"winner: #{best['index']} " in out and "torch" not in out
    assert "not re-timed under the interpreter" in out and "re-timed ms" not in out
    assert sweep_cli("report", quickstart / "run", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["retimed"] is False and all(r["retimed_ms"] is None for r in doc["top"])


def test_the_kernels_work_per_launch_is_recorded_for_throughput(quickstart, capsys):
    meta = pq.read_schema(quickstart / "run" / "trials.parquet").metadata
    work = json.loads(meta[b"spec"])["work"]
    n = 128  # the quickstart's M = N = K
    assert work == {"flops": 2.0 * n**3, "bytes_moved": 3 * n * n * 2}  # float16
    assert sweep_cli("report", quickstart / "run", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    winner = doc["top"][0]
    assert winner["winner"] and winner["index"] == doc["winner"]
    assert winner["tflops"] == pytest.approx(2.0 * n**3 / (winner["latency_ms"] * 1e-3) / 1e12)


def test_the_html_report_fetches_nothing_and_holds_every_trial(quickstart):
    page = (quickstart / "report.html").read_text()
    rows = pq.read_table(quickstart / "run" / "trials.parquet").num_rows
    lowered = page.lower()
    # Nothing fetched when it is opened: no external script, style, image or font.
    for fetch in ("<script src", "<link", "<img", "@import", "url(http"):
        assert fetch not in lowered
    data = json.loads(page.split('id="sweep-data">', 1)[1].split("</script>", 1)[0])
    assert data["trials"]["index"] == list(range(rows))


def test_the_plots_are_written_as_png_files(quickstart):
    names = sorted(p.name for p in (quickstart / "plots").iterdir())
    assert names == ["effects.png", "heatmap.png", "latency.png", "timeline.png"]
    for name in names:
        data = (quickstart / "plots" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000


def _chromium():
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser and driver:
        return browser, driver
    if os.environ.get("SWEEP_REQUIRE_BROWSER"):
        pytest.fail("chromium and chromedriver are needed (apt-get install chromium "
                    "chromium-driver)")
    pytest.skip("no chromium/chromedriver here (.ci/run installs them)")


def _redrawn() -> tuple[type[Exception], ...]:
    """A row read while the page redraws the table (its filter is debounced) is stale: a
    wait reads it again rather than fail."""
    try:
        from selenium.common.exceptions import StaleElementReferenceException
    except ImportError:
        return ()
    return (StaleElementReferenceException,)


REDRAWN = _redrawn()


@pytest.fixture(scope="module")
def browser():
    binary, driver_path = _chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(arg)
    # performance: the DevTools network events, to see what the page fetches
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    yield driver
    driver.quit()


def test_the_html_report_renders_in_chromium_and_sorts_the_winner_first(quickstart, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    best = json.loads((quickstart / "run" / "best.json").read_text())
    table = pq.read_table(quickstart / "run" / "trials.parquet").to_pylist()
    browser.get((quickstart / "report.html").as_uri())
    WebDriverWait(browser, 30, ignored_exceptions=REDRAWN).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")) == 4)
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert errors == []
    fetched = _requests(browser)
    assert fetched and all(url.startswith(("file:", "data:")) for url in fetched), fetched

    def shown():
        return [int(r.get_attribute("data-index"))
                for r in browser.find_elements(By.CSS_SELECTOR, "#trials tbody tr")]

    assert shown() == [r["index"] for r in table]  # every trial, in index order
    latency = browser.find_element(By.XPATH, "//table[@id='trials']//th[.='rank']")
    latency.click()
    order = shown()
    assert order[0] == best["index"]
    ok = sorted((r for r in table if r["status"] == "ok"), key=lambda r: r["latency_ms"])
    assert sorted(order[:len(ok)]) == sorted(r["index"] for r in ok)  # failures last
    latency.click()  # descending: the winner is the last that worked
    assert shown()[len(ok) - 1] == best["index"]

    Select(browser.find_element(By.ID, "status-filter")).select_by_value("compile_error")
    assert shown() == [r["index"] for r in table if r["status"] == "compile_error"]
    Select(browser.find_element(By.ID, "status-filter")).select_by_value("")
    browser.find_element(By.ID, "filter").send_keys("power of 2")  # the errors' text
    failed = [r["index"] for r in table if "power of 2" in (r["error"] or "")]
    assert failed and len(failed) < len(table)
    WebDriverWait(browser, 10, ignored_exceptions=REDRAWN).until(lambda d: shown() == failed)

    # The heatmap follows the parameters picked, either way round: rows BLOCK_M, columns
    # BLOCK_K (the record holds them the other way), each cell the best latency there.
    Select(browser.find_element(By.ID, "heat-x")).select_by_value("BLOCK_K")
    Select(browser.find_element(By.ID, "heat-y")).select_by_value("BLOCK_M")
    title = browser.find_element(By.CSS_SELECTOR, "#plot-heatmap .gtitle").text
    assert title == "Best latency (ms) by BLOCK_K and BLOCK_M"
    z = browser.execute_script("return document.getElementById('plot-heatmap').data[0].z")
    expected = [[min((r["latency_ms"] for r in table if r["status"] == "ok" and
                      (r["BLOCK_M"], r["BLOCK_K"]) == (m, k)), default=None)
                 for k in (16, 32, 48)] for m in (32, 64)]
    assert z == expected
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def _column(browser, key):
    """The trial table's column of this key, counted from 1 (as XPath's td[n])."""
    return browser.execute_script(
        "return [...document.querySelectorAll('#trials th')]"
        f".findIndex(th => th.dataset.key === {json.dumps(key)}) + 1")


def _requests(browser):
    """The URLs the page asked for, from the DevTools log."""
    events = (json.loads(e["message"])["message"] for e in browser.get_log("performance"))
    return [e["params"]["request"]["url"] for e in events
            if e["method"] == "Network.requestWillBeSent"]


def test_text_from_a_run_stays_text_in_the_html_report(tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from test_analysis import write_run

    from sweep.report.analysis import analyse
    from sweep.report.html import write_html

    # An error text that would end the data's <script> early, or comment the rest out,
    # and markup in a run's name.
    hostile = '</script><!--<script><img src=x onerror="document.title=1">'
    path = write_run(tmp_path, name="@@DATA@@ <b>bold</b>", errors={2: hostile})
    write_html(analyse(path), tmp_path / "r.html")
    browser.get((tmp_path / "r.html").as_uri())
    WebDriverWait(browser, 30, ignored_exceptions=REDRAWN).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")) == 4)
    assert browser.find_element(By.TAG_NAME, "h1").text == "sweep report: @@DATA@@ <b>bold</b>"
    rows = browser.find_elements(By.CSS_SELECTOR, "#trials tbody tr")
    assert [int(r.get_attribute("data-index")) for r in rows] == list(range(6))
    assert rows[2].find_element(By.XPATH, f"td[{_column(browser, 'error')}]") \
        .get_attribute("title") == hostile
    assert browser.title == "sweep report: @@DATA@@ <b>bold</b>"  # no onerror ran
    fetched = _requests(browser)
    assert (tmp_path / "x").as_uri() not in fetched  # the <img src=x> never became one
    assert all(url.startswith(("file:", "data:")) for url in fetched), fetched
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def _checkpointed(table):
    return table.exists() and pq.read_metadata(table).num_rows > 0  # replaced atomically


def test_a_run_still_going_is_reported_from_its_checkpoint(tmp_path):
    # 200 s of trials, stopped below once read: it cannot end before a checkpoint holds
    # trials, however far a busy machine spaces its checkpoints (each waits 20 times as
    # long as the last write took, and the first may hold none).
    spec = simulate_spec(tmp_path / "s.yaml", space={"A": list(range(4000))},
                         run={"snapshot_every_s": 0.2},
                         simulate={"workers": 1, "trial_ms": 50})
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sweep", "run", str(spec), "--out", str(out)], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    try:
        deadline = time.monotonic() + 180  # a hang guard, past the second checkpoint
        while not _checkpointed(out / "trials.parquet"):  # a checkpoint with trials in it
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.1)
        # Held still while it is read: the run cannot end first, however slow this is.
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            report = sweep_in("report", out, "--json")
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert report.returncode == 0, report.stderr
        doc = json.loads(report.stdout)
        assert doc["state"] == "running" and 0 < doc["done"] < doc["total"] == 4000
        assert doc["partial"] is True
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, proc.stderr
    stopped = sweep_in("report", out)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith(f"{out}: interrupted")
    assert "(partial: not a complete run's settled pick)" in stopped.stdout


# --- a run under the interpreter, written through the run's own writers ------------------
# Latencies as the interpreter's are (hundreds of ms and more) and a tiny work per launch:
# the numbers that read as 1.1e+03 ms and 1.615e-05 TFLOP/s before.
INTERPRETED_SPACE = {"BLOCK_M": [16, 32], "num_warps": [1, 2], "rows": [1, 2]}
INTERPRETED_WORK = {"flops": 34020.0, "bytes_moved": 794.64}


def write_interpreter_run(tmp_path, *, backend="interpret", error="boom"):
    """A complete run of 8 configs (BLOCK_M, num_warps, rows): #7 failed with `error`, the
    rest worked, #0 fastest at 2.1 ms, then 694.2 ms and 1100.3 ms and slower."""
    import dataclasses

    from storage.best_file import write_best
    from storage.records import Best, TrialRecord
    from sweep.run import rundir
    from sweep.run.rundir import RunDir, RunLog
    from sweep.spec import load_spec

    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = load_spec(simulate_spec(tmp_path / "s.yaml", space=INTERPRETED_SPACE))
    spec = dataclasses.replace(spec, work=INTERPRETED_WORK, name="interpreted")
    space = spec.expand()
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    rundir.create(run, spec, len(space), backend)
    device = "cpu-interpreter" if backend == "interpret" else "simulated"
    latencies = [2.1, 694.2, 1100.3, 1500.0, 2000.0, 2500.0, 12345.6, None]
    records = [
        TrialRecord(index=i, config=space.config(i), status="ok" if ms else "runtime_error",
                    latency_ms=ms, latency_p20_ms=ms and ms * 0.99,
                    latency_p80_ms=ms and ms * 1.01, validation="passed" if ms else "skipped",
                    error=None if ms else error, compile_ms=None, device=device, node="n1",
                    worker="w1", attempt=1, started_at=100.0 + 20 * i,
                    finished_at=100.0 + 20 * i + (ms or 1) / 1000)
        for i, ms in enumerate(latencies)]
    with RunLog.open(run, spec.fingerprint) as log:
        log.commit(records, [], [None] * len(records))
    rundir.write_trials(run, spec, space, "complete")
    best = Best(0, space.config(0), 2.1, device)
    write_best(run.best, best, fingerprint=spec.fingerprint, partial=False, finalists=[],
               by_device={device: best}, baseline={})
    return run.path


def test_under_the_interpreter_the_heatmap_defaults_to_parameters_that_are_not_launch_options(
        tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from sweep.report.analysis import analyse
    from sweep.report.html import render
    from sweep.report.plots import _heatmap

    a = analyse(write_interpreter_run(tmp_path / "interpreted"))
    assert a.interpreted
    # The first pair is BLOCK_M by num_warps, which changes nothing under the interpreter.
    assert (a.heatmaps[0].x, a.heatmaps[0].y) == ("BLOCK_M", "num_warps")
    m = a.default_heatmap()
    assert (m.x, m.y) == ("BLOCK_M", "rows")
    page = render(a, "")
    data = json.loads(page.split('id="sweep-data">', 1)[1].split("</script>", 1)[0])
    assert data["heatmap"] == ["BLOCK_M", "rows"]  # the page's default pick
    ax = _heatmap(a).axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("BLOCK_M", "rows")
    # On a GPU (here: simulated) num_warps matters: the first pair stays the default.
    compiled = analyse(write_interpreter_run(tmp_path / "compiled", backend="simulate"))
    assert not compiled.interpreted
    m = compiled.default_heatmap()
    assert (m.x, m.y) == ("BLOCK_M", "num_warps")


def _open(browser, page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(page.as_uri())
    WebDriverWait(browser, 30, ignored_exceptions=REDRAWN).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")) == 4)


def test_the_interpreters_heatmap_opens_on_parameters_that_are_not_launch_options(
        tmp_path, browser):
    from selenium.webdriver.common.by import By

    from sweep.report.analysis import analyse
    from sweep.report.html import write_html

    write_html(analyse(write_interpreter_run(tmp_path)), tmp_path / "r.html")
    _open(browser, tmp_path / "r.html")
    picked = [browser.find_element(By.ID, i).get_attribute("value") for i in ("heat-x", "heat-y")]
    assert picked == ["BLOCK_M", "rows"]
    title = browser.find_element(By.CSS_SELECTOR, "#plot-heatmap .gtitle").text
    assert title == "Best latency (ms) by BLOCK_M and rows"


def test_the_trial_table_takes_the_windows_width_and_scrolls_only_where_it_does_not_fit(
        tmp_path, browser):
    from test_analysis import write_run

    from sweep.report.analysis import analyse
    from sweep.report.html import write_html

    long = "RuntimeError: " + "a long message about what went wrong in the kernel " * 4
    path = write_run(tmp_path, errors={2: long, 4: long},
                     devices={i: "NVIDIA H200 NVL with a long device name" for i in range(6)})
    write_html(analyse(path), tmp_path / "r.html")
    widths = "const w = document.getElementById('trials-wrap'); " \
             "return [w.clientWidth, w.scrollWidth, window.innerWidth];"
    try:
        browser.set_window_size(2600, 1000)
        _open(browser, tmp_path / "r.html")
        client, scroll, window = browser.execute_script(widths)
        assert client > window - 80 and scroll <= client, (client, scroll, window)
        browser.set_window_size(1000, 1000)  # too narrow for its columns: it scrolls
        client, scroll, window = browser.execute_script(widths)
        assert client <= window and scroll > client, (client, scroll, window)
    finally:
        browser.set_window_size(1400, 1000)


def test_the_latency_histogram_counts_whole_trials(quickstart, browser):
    _open(browser, quickstart / "report.html")
    ticks = browser.execute_script(
        "return [...document.querySelectorAll('#plot-latency .ytick text')]"
        ".map(t => t.textContent)")
    assert ticks and all(t.isdigit() for t in ticks), ticks
    assert len(ticks) >= 2
    ms = browser.execute_script(
        "return [...document.querySelectorAll('#plot-latency .xtick text')]"
        ".map(t => t.textContent)")
    assert ms and all(t.replace(".", "", 1).isdigit() for t in ms), ms  # no 2k, no 1e+3


def test_the_trial_tables_rate_column_says_its_one_unit_and_numbers_have_no_exponent(
        quickstart, browser):
    import re

    from selenium.webdriver.common.by import By

    from sweep.numbers import significant

    page = (quickstart / "report.html").read_text()
    data = json.loads(page.split('id="sweep-data">', 1)[1].split("</script>", 1)[0])
    rate = data["rate"]
    assert rate["key"] == "tflops" and rate["name"].endswith("FLOP/s")
    _open(browser, quickstart / "report.html")
    heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#trials th")]
    assert rate["name"] in heads
    column = heads.index(rate["name"]) + 1
    cells = {int(row.get_attribute("data-index")):
             row.find_element(By.XPATH, f"td[{column}]").text
             for row in browser.find_elements(By.CSS_SELECTOR, "#trials tbody tr")}
    tflops = dict(zip(data["trials"]["index"], data["trials"]["tflops"]))
    expected = {i: "" if v is None else significant(v * rate["factor"], 3)
                for i, v in tflops.items()}
    assert cells == expected and any(cells.values())
    # The largest value of the column reads between 1 and 1000 in its unit.
    assert 1 <= max(v * rate["factor"] for v in tflops.values() if v) < 1000
    table = browser.find_element(By.ID, "trials").text
    assert re.search(r"\d[eE][-+]\d", table) is None


def test_with_one_tuned_parameter_the_report_has_no_heatmap_panel(tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    spec = simulate_spec(tmp_path / "s.yaml", space={"A": [1, 2, 4], "B": [0]})
    assert sweep_cli("run", spec, "--out", tmp_path / "run") == 0
    assert sweep_cli("report", tmp_path / "run", "--html", tmp_path / "r.html") == 0
    browser.get((tmp_path / "r.html").as_uri())
    WebDriverWait(browser, 30, ignored_exceptions=REDRAWN).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")) == 3)
    assert browser.find_elements(By.ID, "plot-heatmap") == []
    assert browser.find_elements(By.ID, "heat-x") == []
    assert "No two parameters" not in browser.find_element(By.TAG_NAME, "body").text
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_each_latency_column_of_the_trial_table_holds_one_kind_of_timing(tmp_path, browser):
    from selenium.webdriver.common.by import By
    from test_analysis import write_run

    from sweep.report.analysis import analyse
    from sweep.report.html import write_html

    write_html(analyse(write_run(tmp_path)), tmp_path / "r.html")
    _open(browser, tmp_path / "r.html")
    heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#trials th")]
    assert "latency ms" not in heads  # a column of re-timed and one-pass values mixed
    assert {"rank", "one pass ms", "one pass p20–p80", "re-timed ms"} <= set(heads)
    cells = {int(row.get_attribute("data-index")): [
        row.find_element(By.XPATH, f"td[{_column(browser, key)}]").text
        for key in ("rank", "latency_ms", "retimed_ms")]
        for row in browser.find_elements(By.CSS_SELECTOR, "#trials tbody tr")}
    assert cells[5] == ["1", "2.8", "2.1"]  # the winner: one pass 2.8, re-timed 2.1
    assert cells[0][1:] == ["4", ""]  # not a finalist: its one pass, no re-timing


def test_at_1400_px_the_error_column_is_in_sight_and_no_title_runs_under_the_toolbar(
        quickstart, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    assert browser.execute_script("return window.innerWidth") <= 1400
    _open(browser, quickstart / "report.html")
    # The longest parameter's name: the effect plot's longest title.
    Select(browser.find_element(By.ID, "effect-param")).select_by_value("num_stages")
    boxes = browser.execute_script("""
        const box = e => { const b = e.getBoundingClientRect();
                           return [b.left, b.top, b.right, b.bottom]; };
        return [...document.querySelectorAll('.js-plotly-plot')].map(p =>
            [p.id, box(p.querySelector('.gtitle')), box(p.querySelector('.modebar'))]);""")
    assert len(boxes) == 4
    for plot, (l1, t1, r1, b1), (l2, t2, r2, b2) in boxes:
        assert r2 > l2 and b2 > t2, plot  # the mode bar is laid out, if hidden till hovered
        assert r1 <= l2 or r2 <= l1 or b1 <= t2 or b2 <= t1, (plot, (l1, t1, r1, b1),
                                                               (l2, t2, r2, b2))
    right, width = browser.execute_script(
        "return [document.querySelector('#trials th[data-key=error]')"
        ".getBoundingClientRect().right, document.documentElement.clientWidth]")
    assert right <= width, (right, width)


# --- a large run: the table a page at a time -------------------------------------------
LARGE = 20_000  # trials
PAGE = 100  # rows the page's table holds at a time
ODD = 19_990  # the one trial whose error a filter finds, far past the first page
ODD_ERROR = 'RuntimeError: the odd one <img src=x onerror="document.title=1"> out'


def write_large_run(tmp_path, n=LARGE):
    """A complete run of n configs (BLOCK by num_warps), through the run's own writers:
    every 10th failed to compile, #ODD failed at run time with ODD_ERROR, the rest worked
    in an order unlike their indices' (2.001 to 22 ms), and #n-7 fastest, at 1 ms."""
    import dataclasses

    from storage.best_file import write_best
    from storage.records import Best, TrialRecord
    from sweep.run import rundir
    from sweep.run.rundir import RunDir, RunLog
    from sweep.spec import load_spec

    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = load_spec(simulate_spec(tmp_path / "s.yaml", space={
        "BLOCK": list(range(n // 4)), "num_warps": [1, 2, 4, 8]}))
    spec = dataclasses.replace(spec, work=INTERPRETED_WORK, name="large")
    space = spec.expand()
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    rundir.create(run, spec, len(space), "simulate")

    def outcome(i):
        if i == n - 7:
            return "ok", 1.0, None
        if i == ODD:
            return "runtime_error", None, ODD_ERROR
        if i % 10 == 3:
            return "compile_error", None, f"out of resources: shared memory {65536 + i} > 65536"
        return "ok", 2.0 + ((i * 7919) % n + 1) / 1000, None

    records = []
    for i in range(n):
        status, ms, error = outcome(i)
        start = 100.0 + i // 4 * 0.03
        records.append(TrialRecord(
            index=i, config=space.config(i), status=status, latency_ms=ms,
            latency_p20_ms=ms and ms * 0.99, latency_p80_ms=ms and ms * 1.01,
            validation="passed" if ms else "skipped", error=error, compile_ms=None,
            device="simulated", node="n1", worker=f"w{i % 4}", attempt=1, started_at=start,
            finished_at=start + (ms or 1) / 1000))
    with RunLog.open(run, spec.fingerprint) as log:
        log.commit(records, [], [None] * len(records))
    rundir.write_trials(run, spec, space, "complete")
    best = Best(n - 7, space.config(n - 7), 1.0, "simulated")
    write_best(run.best, best, fingerprint=spec.fingerprint, partial=False, finalists=[],
               by_device={"simulated": best}, baseline={})
    return run.path


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    from sweep.report.analysis import analyse

    return analyse(write_large_run(tmp_path_factory.mktemp("large")))


def _data(page):
    return json.loads(page.split('id="sweep-data">', 1)[1].split("</script>", 1)[0])


def test_a_large_reports_page_carries_its_trials_as_compact_columns_not_rows(large):
    from sweep.report.html import render

    page = render(large, "")  # plotly.js aside
    # No markup per trial: the table is drawn in the page, a page of rows at a time.
    assert page.count("<tr") < 50
    # One array per field, not an object per trial (whose field names alone took more
    # than 250 bytes a trial): a trial, its timeline's spans with it, takes < 300 bytes.
    assert len(page.encode()) / LARGE < 300
    trials = _data(page)["trials"]
    assert trials["index"] == list(range(LARGE))
    # A field of few strings: each written once, a small number per trial.
    assert trials["status"]["values"] == ["ok", "compile_error", "runtime_error"]
    assert [trials["status"]["values"][c] for c in trials["status"]["codes"]] == [
        t["status"] for t in large.trials]


def test_a_timeline_of_many_trials_draws_few_bars_that_cover_every_trial(large):
    import bisect

    from sweep.report.page_data import MAX_BARS, drawable

    bars = drawable(large.spans)
    assert len(large.spans) > MAX_BARS >= len(bars)
    covering: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for b in bars:
        covering.setdefault((b.worker, b.kind), []).append((b.start_s, b.end_s))
    for spans in covering.values():
        spans.sort()
    for s in large.spans:  # every trial lies within a bar of its status on its worker
        if s.kind == "waiting":
            continue
        spans = covering[(s.worker, s.kind)]
        k = bisect.bisect_right(spans, (s.start_s, float("inf"))) - 1
        assert k >= 0 and spans[k][0] <= s.start_s and s.end_s <= spans[k][1], s
    # The one run-time failure among thousands of successes is a bar of its own.
    assert [b.index for b in bars if b.kind == "runtime_error"] == [ODD]
    # A small run's timeline is drawn as it is.
    assert drawable(large.spans[:100]) == large.spans[:100]


@pytest.mark.slow  # Chromium again; the default tier's Chromium tests draw the quickstart's report
def test_a_large_reports_table_shows_a_page_at_a_time_and_sorts_and_filters_every_trial(
        large, tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from sweep.report.html import write_html

    # With its timeline: 40,000 spans, drawn as the few bars a plot can tell apart.
    write_html(large, tmp_path / "r.html")
    _open(browser, tmp_path / "r.html")

    def shown():
        return browser.execute_script(
            "return [...document.querySelectorAll('#trials tbody tr')]"
            ".map(r => Number(r.dataset.index))")

    def page_says():
        return browser.find_element(By.ID, "page").text

    def wait(until):
        WebDriverWait(browser, 10, ignored_exceptions=REDRAWN).until(lambda d: until())

    pages = LARGE // PAGE
    assert shown() == list(range(PAGE))  # the first page, in index order
    assert page_says() == f"page 1 of {pages}"
    previous, following = (browser.find_element(By.ID, i) for i in ("prev-page", "next-page"))
    assert not previous.is_enabled() and following.is_enabled()
    following.click()
    assert shown() == list(range(PAGE, 2 * PAGE)) and page_says() == f"page 2 of {pages}"
    previous.click()
    assert shown() == list(range(PAGE))

    # Sorting orders every trial, not the page: the fastest come from all over the run,
    # the winner (#LARGE-7, on the last page by index) first, starred.
    browser.find_element(By.XPATH, "//table[@id='trials']//th[.='rank']").click()
    ranked = [r.index for r in large.ranked]
    assert ranked[0] == LARGE - 7
    assert shown() == ranked[:PAGE] and page_says() == f"page 1 of {pages}"
    first = browser.find_element(By.CSS_SELECTOR, "#trials tbody tr")
    assert first.get_attribute("class") == "winner"
    assert first.find_element(By.TAG_NAME, "td").text == f"★ {LARGE - 7}"
    following.click()
    assert shown() == ranked[PAGE:2 * PAGE]

    # The status filter over every trial; the page goes back to the first.
    Select(browser.find_element(By.ID, "status-filter")).select_by_value("compile_error")
    failed = [t["index"] for t in large.trials if t["status"] == "compile_error"]
    assert shown() == failed[:PAGE]  # no latency: in index order
    assert page_says() == f"page 1 of {-(-len(failed) // PAGE)}"
    following.click()
    assert shown() == failed[PAGE:2 * PAGE]

    # The text filter finds the one trial whose error says so, near the run's end, and
    # its markup stays text.
    Select(browser.find_element(By.ID, "status-filter")).select_by_value("")
    browser.find_element(By.ID, "filter").send_keys("odd one <img")
    wait(lambda: shown() == [ODD])
    assert page_says() == "page 1 of 1" and not following.is_enabled()
    error = browser.find_element(By.XPATH, "//table[@id='trials']//tbody//td"
                                 f"[{_column(browser, 'error')}]")
    assert error.get_attribute("title") == ODD_ERROR and error.text == ODD_ERROR
    assert browser.title == "sweep report: large"  # no onerror ran
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
