"""The report in headless Chromium: every chart drawn with its series and markers, hover
and zoom work, nothing logged to the console, and log text cannot run as script.

Runs under CI always (CI installs Chromium and Playwright and must fail loudly if it
cannot); elsewhere it is skipped only when Chromium is missing.
Screenshots are kept in ``artifacts/browser/``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from sapper.checks.engine import run_checklist
from sapper.cli.analyze_cmd import detectors_for
from sapper.logs import read_log
from sapper.logs.analysis import analyze_log
from sapper.plan.load import load_plan
from sapper.report.html import build_report_data, write_report

from .test_html import PLAN

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("SAPPER_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "browser"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _require_browser() -> Any:
    """Skip only outside CI when Chromium is absent; everything else is a failure."""
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        if not os.environ.get("CI"):
            pytest.skip(f"chromium is not installed ({CHROMIUM})")
        pytest.fail(f"chromium not found at {CHROMIUM} (CI must install it: see .ci/run)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[dev]'")
    return sync_playwright


@pytest.fixture(scope="module")
def browser():
    sync_playwright = _require_browser()
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def _open(browser, path: Path, name: str):
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    problems: list[str] = []

    def console(msg: Any) -> None:
        if msg.type in ("error", "warning"):
            problems.append(f"console {msg.type}: {msg.text}")

    def request(req: Any) -> None:
        if not req.url.startswith(("file:", "data:", "about:")):
            problems.append(f"network request: {req.url}")

    page.on("console", console)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", request)
    page.goto(path.as_uri())
    page.wait_for_function("window.sapperReport && window.sapperReport.ready", timeout=10_000)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    return page, problems


def _check_charts(page, data: dict[str, Any]) -> None:
    drawn = page.evaluate("window.sapperReport.charts")
    assert set(drawn) == {c["id"] for c in data["charts"]}
    for chart in data["charts"]:
        got = drawn[chart["id"]]
        assert got["rendered"] is True, chart["id"]
        assert page.get_attribute(f"#chart-{chart['id']}", "data-rendered") == "1"
        assert [s["name"] for s in got["series"]] == [s["name"] for s in chart["series"]]
        for series in got["series"]:
            assert series["drawn"] > 0, (chart["id"], series["name"])
        if chart["series"]:
            assert got["markers"] == len(chart["markers"]), chart["id"]
            assert got["lines"] == [line["name"] for line in chart["lines"]]
            assert got["bands"] == sum(len(b["ranges"]) for b in chart["bands"])
    cards = page.locator("#finding-list li.finding")
    assert cards.count() == len(data["findings"])


def test_megatron_report_with_plan(browser, examples: Path, tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(PLAN)
    loaded = load_plan(plan_file)
    analysis = analyze_log(read_log(examples / "megatron-gpt345m-fp16.log"),
                           detectors_for(loaded.plan))
    data = build_report_data(analysis, plan=loaded.plan, checklist=run_checklist(loaded),
                             expected_tokens_per_s=None)
    out = tmp_path / "megatron.html"
    write_report(out, data)
    page, problems = _open(browser, out, "megatron-with-plan")
    _check_charts(page, data)
    assert page.locator("#checklist-table tbody tr").count() >= 7
    assert page.is_visible("#checklist-section")

    # hover shows the values under the cursor on every chart's crosshair
    canvas = page.locator("#chart-loss canvas")
    box = canvas.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    tooltip = page.locator("#tooltip")
    assert tooltip.is_visible() and "train loss" in tooltip.inner_text()

    # drag to zoom: every chart follows; double-click resets
    full = page.evaluate("window.sapperReport.fullRange")
    page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + 40)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + 60, steps=5)
    page.mouse.up()
    zoomed = page.evaluate("window.sapperReport.charts")
    assert zoomed["loss"]["view"][1] - zoomed["loss"]["view"][0] < (full[1] - full[0]) * 0.5
    assert zoomed["lr"]["view"] == zoomed["loss"]["view"]
    page.mouse.dblclick(box["x"] + box["width"] * 0.5, box["y"] + 50)
    assert page.evaluate("window.sapperReport.charts.loss.view") == full

    # a finding's link zooms the curves to its step
    page.locator("#finding-list li.finding .step a").first.click()
    view = page.evaluate("window.sapperReport.charts.loss.view")
    first_step = data["findings"][0]["step"]
    assert view[0] <= first_step <= view[1]
    page.wait_for_timeout(800)  # let the smooth scroll settle before the picture
    page.screenshot(path=str(ARTIFACTS / "megatron-zoomed.png"))
    assert problems == []


def test_hf_report_without_plan(browser, examples: Path, tmp_path: Path) -> None:
    analysis = analyze_log(read_log(examples / "hf-llama-sft"), detectors_for(None))
    data = build_report_data(analysis)
    out = tmp_path / "hf.html"
    write_report(out, data)
    page, problems = _open(browser, out, "hf-llama-sft")
    _check_charts(page, data)
    assert page.get_attribute("#chart-memory", "data-empty") == "1"
    assert not page.is_visible("#checklist-section")
    assert problems == []


def test_log_text_cannot_run_as_script(browser, tmp_path: Path) -> None:
    evil = '</script><script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
    path = tmp_path / "metrics.csv"
    rows = ["step,loss," + evil.replace(",", ";")]
    rows += [f"{s},{9.0 if s == 60 else 2.0},1" for s in range(1, 101)]
    path.write_text("\n".join(rows) + "\n")
    log = read_log(path)
    log.notes.append(evil)
    data = build_report_data(analyze_log(log, detectors_for(None)), title=evil)
    out = tmp_path / "evil.html"
    write_report(out, data)
    page, problems = _open(browser, out, "escaped-log-text")
    assert page.evaluate("window.__pwned") is None
    assert evil in page.locator("#note-list").inner_text()
    assert page.title() == evil
    _check_charts(page, data)
    assert problems == []
