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
from conftest import ROOT, simulate_spec, sweep_cli

QUICKSTART = ROOT / "configs" / "quickstart.yaml"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory, ray_address):
    """A complete quickstart run, its HTML report and PNGs."""
    where = tmp_path_factory.mktemp("report")
    with pytest.MonkeyPatch.context() as m:
        m.setenv("SWEEP_CACHE_DIR", str(where / "cache"))
        assert sweep_cli("run", QUICKSTART, "--out", where / "run", "--address",
                         ray_address) == 0
        assert sweep_cli("report", where / "run", "--html", where / "report.html",
                         "--plot", where / "plots") == 0
    return where


def test_the_torch_baseline_is_timed_beside_the_finalists(quickstart, capsys):
    best = json.loads((quickstart / "run" / "best.json").read_text())
    torch = best["baseline"]["cpu-interpreter"]
    assert torch["of"] == "baseline"  # matmul's `a @ b`, not its float32 reference
    assert 0 < torch["latency_p20_ms"] <= torch["latency_ms"] <= torch["latency_p80_ms"]
    assert sweep_cli("report", quickstart / "run") == 0
    out = capsys.readouterr().out
    assert f"torch baseline on cpu-interpreter: {torch['latency_ms']:.4g} ms" in out
    assert f"winner: #{best['index']} " in out


def test_the_kernels_work_per_launch_is_recorded_for_throughput(quickstart, capsys):
    meta = pq.read_schema(quickstart / "run" / "trials.parquet").metadata
    work = json.loads(meta[b"spec"])["work"]
    n = 128  # the quickstart's M = N = K
    assert work == {"flops": 2.0 * n**3, "bytes_moved": 3 * n * n * 2}  # float16
    assert sweep_cli("report", quickstart / "run", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    winner = doc["top"][0]
    assert winner["winner"] and winner["index"] == doc["winner"]
    assert winner["tflops"] == pytest.approx(2.0 * n**3 / (winner["retimed_ms"] * 1e-3) / 1e12)


def test_the_html_report_fetches_nothing_and_holds_every_trial(quickstart):
    page = (quickstart / "report.html").read_text()
    rows = pq.read_table(quickstart / "run" / "trials.parquet").num_rows
    lowered = page.lower()
    # Nothing fetched when it is opened: no external script, style, image or font.
    for fetch in ("<script src", "<link", "<img", "@import", "url(http"):
        assert fetch not in lowered
    data = json.loads(page.split('id="sweep-data">', 1)[1].split("</script>", 1)[0])
    assert [t["index"] for t in data["trials"]] == list(range(rows))


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
    WebDriverWait(browser, 30).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")) == 4)
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert errors == []
    fetched = _requests(browser)
    assert fetched and all(url.startswith(("file:", "data:")) for url in fetched), fetched

    def shown():
        return [int(r.get_attribute("data-index"))
                for r in browser.find_elements(By.CSS_SELECTOR, "#trials tbody tr")]

    assert shown() == [r["index"] for r in table]  # every trial, in index order
    latency = browser.find_element(By.XPATH, "//table[@id='trials']//th[.='latency ms']")
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
    WebDriverWait(browser, 10).until(lambda d: shown() == failed)

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


def _requests(browser):
    """The URLs the page asked for, from the DevTools log."""
    events = (json.loads(e["message"])["message"] for e in browser.get_log("performance"))
    return [e["params"]["request"]["url"] for e in events
            if e["method"] == "Network.requestWillBeSent"]


def test_text_from_a_run_stays_text_in_the_html_report(tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from test_analysis import write_run

    from sweep.analysis import analyse
    from sweep.report_html import write_html

    # An error text that would end the data's <script> early, or comment the rest out,
    # and markup in a run's name.
    hostile = '</script><!--<script><img src=x onerror="document.title=1">'
    path = write_run(tmp_path, name="@@DATA@@ <b>bold</b>", errors={2: hostile})
    write_html(analyse(path), tmp_path / "r.html")
    browser.get((tmp_path / "r.html").as_uri())
    WebDriverWait(browser, 30).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")) == 4)
    assert browser.find_element(By.TAG_NAME, "h1").text == "sweep report: @@DATA@@ <b>bold</b>"
    rows = browser.find_elements(By.CSS_SELECTOR, "#trials tbody tr")
    assert [int(r.get_attribute("data-index")) for r in rows] == list(range(6))
    assert rows[2].find_element(By.XPATH, "td[last()]").get_attribute("title") == hostile
    assert browser.title == "sweep report: @@DATA@@ <b>bold</b>"  # no onerror ran
    fetched = _requests(browser)
    assert (tmp_path / "x").as_uri() not in fetched  # the <img src=x> never became one
    assert all(url.startswith(("file:", "data:")) for url in fetched), fetched
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def _checkpointed(table):
    return table.exists() and pq.read_metadata(table).num_rows > 0  # replaced atomically


def test_a_run_still_going_is_reported_from_its_checkpoint(tmp_path, ray_address):
    spec = simulate_spec(tmp_path / "s.yaml", space={"A": list(range(400))},
                         run={"snapshot_every_s": 0.2},
                         simulate={"workers": 1, "trial_ms": 50})
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sweep", "run", str(spec), "--out", str(out), "--address",
         ray_address], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    try:
        deadline = time.monotonic() + 120
        while not _checkpointed(out / "trials.parquet"):  # a checkpoint with trials in it
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.1)
        report = subprocess.run([sys.executable, "-m", "sweep", "report", str(out), "--json"],
                                cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert report.returncode == 0, report.stderr
        doc = json.loads(report.stdout)
        assert doc["state"] == "running" and 0 < doc["done"] < doc["total"] == 400
        assert doc["partial"] is True
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, proc.stderr
    stopped = subprocess.run([sys.executable, "-m", "sweep", "report", str(out)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith(f"{out}: interrupted")
    assert "(partial: not a complete run's settled pick)" in stopped.stdout
