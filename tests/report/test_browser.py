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
from sapper.logs import read_log
from sapper.logs.analysis import analyze_log
from sapper.pipeline.logs import detectors_for
from sapper.plan.load import load_plan
from sapper.report.html import build_report_data, write_report
from sapper.rules.registry import all_rules

from .test_html import PLAN, SHAPES, _restarted, shaped_log

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


#: Counts the pixels of the plot area drawn in a colour (within a tolerance), or, with
#: ``null``, the strongly coloured ones (series, NaN marks and markers; not the grey grid).
_PIXELS = """([id, hex]) => {
  const u = window.sapperReport.plot(id), b = u.bbox;
  // a copy read back, so the page's own canvas is not flagged for repeated readbacks
  const copy = document.createElement("canvas");
  copy.width = b.width; copy.height = b.height;
  const g = copy.getContext("2d", {willReadFrequently: true});
  g.drawImage(u.ctx.canvas, b.left, b.top, b.width, b.height, 0, 0, b.width, b.height);
  const px = g.getImageData(0, 0, b.width, b.height).data;
  const want = hex && [1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16));
  let n = 0;
  for (let i = 0; i < px.length; i += 4) {
    const [r, g, bl, a] = [px[i], px[i + 1], px[i + 2], px[i + 3]];
    if (a < 128) continue;
    const off = want && Math.abs(r - want[0]) + Math.abs(g - want[1]) + Math.abs(bl - want[2]);
    if (want) { if (off < 60) n++; }
    else if (Math.max(r, g, bl) - Math.min(r, g, bl) > 80) n++;
  }
  return n;
}"""


def pixels(page, chart: str, color: str | None = None) -> int:
    return page.evaluate(_PIXELS, [chart, color])


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
            assert pixels(page, chart["id"]) > 0, chart["id"]
            for axis in ("xTicks", "yTicks"):  # labelled axes, at any range
                assert len(got[axis]) >= 2 and "N/A" not in got[axis], (chart["id"], axis)
    cards = page.locator("#finding-list li.finding")
    assert cards.count() == len(data["findings"])
    assert page.evaluate("window.sapperReport.errors") == []


def _over(page, chart: str) -> dict[str, float]:
    """The box of a chart's plot area (uPlot's event overlay)."""
    return page.locator(f"#chart-{chart} .u-over").bounding_box()


def _step_width(page, chart: str) -> float:
    """Steps per CSS pixel in the chart: the tolerance of a synced cursor."""
    view = page.evaluate(f"window.sapperReport.charts[{chart!r}].view")
    return (view[1] - view[0]) / _over(page, chart)["width"]


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

    # hover shows the values under the cursor; every other chart's cursor moves to the
    # same step (uPlot's cursor sync)
    box = _over(page, "loss")
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    tooltip = page.locator("#tooltip")
    assert tooltip.is_visible() and "train loss" in tooltip.inner_text()
    charts = page.evaluate("window.sapperReport.charts")
    step = charts["loss"]["cursorStep"]
    full = page.evaluate("window.sapperReport.fullRange")
    assert step == pytest.approx((full[0] + full[1]) / 2, abs=2 * _step_width(page, "loss"))
    for cid in ("grad_norm", "lr", "throughput", "loss_scale"):
        assert charts[cid]["cursorStep"] == pytest.approx(step, abs=_step_width(page, cid)), cid
        cursor = page.locator(f"#chart-{cid} .u-cursor-x")
        assert "u-off" not in (cursor.get_attribute("class") or ""), cid
        left = cursor.bounding_box()["x"] - _over(page, cid)["x"]
        assert left == pytest.approx(box["width"] * 0.5, abs=2), cid
    page.screenshot(path=str(ARTIFACTS / "megatron-synced-cursor.png"))
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] - 60)  # off the chart
    assert not tooltip.is_visible()
    assert page.evaluate("window.sapperReport.charts.grad_norm.cursorStep") is None

    # a finding marker: hover reads it (title and fix), click jumps to its card
    marker = next(i for i in data["charts"][0]["markers"])
    f = data["findings"][marker]
    x = page.evaluate(f"window.sapperReport.plot('loss').valToPos({f['step']}, 'x')")
    page.mouse.move(box["x"] + x, box["y"] + 20)
    text = tooltip.inner_text()
    assert f["title"] in text and "Fix: " + f["fix"][:30] in text
    page.mouse.click(box["x"] + x, box["y"] + 20)
    page.wait_for_function(f"document.getElementById('finding-{marker}')"
                           ".classList.contains('flash')", timeout=2000)

    # drag to zoom on one chart: every chart follows; double-click on another resets all
    page.wait_for_timeout(900)  # the smooth scroll to the card ends
    page.evaluate("window.scrollTo({top: 0, behavior: 'instant'})")
    gbox = _over(page, "grad_norm")
    page.mouse.move(gbox["x"] + gbox["width"] * 0.3, gbox["y"] + 40)
    page.mouse.down()
    page.mouse.move(gbox["x"] + gbox["width"] * 0.6, gbox["y"] + 60, steps=5)
    page.mouse.up()
    zoomed = page.evaluate("window.sapperReport.charts")
    view = zoomed["grad_norm"]["view"]
    assert view[1] - view[0] < (full[1] - full[0]) * 0.5
    for cid in ("loss", "lr", "memory", "throughput", "loss_scale"):
        assert zoomed[cid]["view"] == view, cid
    assert all(full[0] <= s <= full[1] for s in zoomed["loss"]["markerSteps"])
    assert all(view[0] <= s <= view[1] for s in zoomed["loss"]["markerSteps"])
    page.screenshot(path=str(ARTIFACTS / "megatron-zoom-synced.png"))
    lbox = _over(page, "lr")
    page.mouse.dblclick(lbox["x"] + lbox["width"] * 0.5, lbox["y"] + 50)
    after = page.evaluate("window.sapperReport.charts")
    assert all(after[c["id"]]["view"] == full for c in data["charts"] if c["series"])

    # a finding's link zooms the curves to its step
    page.locator("#finding-list li.finding .step a").first.click()
    view = page.evaluate("window.sapperReport.charts.loss.view")
    first_step = data["findings"][0]["step"]
    assert view[0] <= first_step <= view[1]
    assert page.evaluate("window.sapperReport.charts.loss_scale.view") == view
    page.wait_for_timeout(800)  # let the smooth scroll settle before the picture
    page.screenshot(path=str(ARTIFACTS / "megatron-zoomed.png"))

    # log scale toggles redraw the chart, zoom kept
    page.locator("#chart-grad_norm .chart-head button").first.click()
    assert page.evaluate("window.sapperReport.charts.grad_norm.log") is False
    assert page.evaluate("window.sapperReport.charts.grad_norm.view") == view
    assert pixels(page, "grad_norm") > 0
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
    assert not page.is_visible("#diagnosis-section")  # no diagnosis given
    assert problems == []


def test_the_diagnosis_is_a_timeline_marked_on_the_curves(browser, tmp_path: Path) -> None:
    """A planted fp16 overflow: the cause heads the page, its evidence is listed in time
    order, and the charts carry its span and a mark per item of evidence."""
    from sapper.diagnose.diagnosis import diagnose

    fault = Path(__file__).resolve().parents[1] / "fixtures" / "diagnose" / "overflow.jsonl"
    analysis = analyze_log(read_log(fault), detectors_for(None))
    data = build_report_data(analysis, diagnosis=diagnose([analysis]).to_json())
    out = tmp_path / "overflow.html"
    write_report(out, data)
    page, problems = _open(browser, out, "diagnosis-overflow")
    _check_charts(page, data)
    assert page.is_visible("#diagnosis-section")
    assert page.get_attribute("#diagnosis-cause", "data-cause") == "fp16-overflow"
    cause = data["diagnosis"]["causes"][0]
    codes = page.locator("#diagnosis-timeline li").evaluate_all(
        "items => items.map(li => li.dataset.code)")
    assert codes == [e["code"] for e in cause["evidence"]]
    got = page.evaluate("window.sapperReport.diagnosis")
    assert got["cause"] == "fp16-overflow" and got["span"][0] == cause["first_step"]
    drawn = page.evaluate("window.sapperReport.charts")
    assert all(drawn[c["id"]]["evidence"] > 0 for c in data["charts"] if c["series"])
    assert problems == []


@pytest.mark.parametrize("shape", SHAPES)
def test_pathological_series_are_drawn(browser, tmp_path: Path, shape: str) -> None:
    """Constant (on a log scale too), single-point, all-NaN, ±inf and 1e-30..1e30 series:
    every chart draws pixels of every series (or its NaN marks), without an error."""
    data = build_report_data(analyze_log(shaped_log(shape), []))
    out = tmp_path / f"{shape}.html"
    write_report(out, data)
    page, problems = _open(browser, out, f"shape-{shape}")
    _check_charts(page, data)
    drawn = page.evaluate("window.sapperReport.charts")
    for chart in data["charts"]:
        got = drawn[chart["id"]]
        for series in got["series"]:
            if series["points"]:
                assert pixels(page, chart["id"], series["color"]) > 0, (chart["id"], series)
            else:  # nothing finite: the red NaN/Inf marks along the top
                assert series["nonfinite"] > 0
                assert pixels(page, chart["id"]) > 0, chart["id"]
    if shape == "constant":
        assert drawn["grad_norm"]["log"] and drawn["loss_scale"]["log"]
    assert problems == []


def test_attempts_and_named_eval_sets(browser, tmp_path: Path) -> None:
    log = _restarted()
    for rec in log.records:
        if rec.step % 100 == 0:
            rec.extra["eval_losses"] = {"wiki": 2.2, "code": 1.7}
            rec.extra["grad_norm_layers"] = {f"layers.{i}": 0.1 * (i + 1) for i in range(8)}
    analysis = analyze_log(log, [])
    rule = next(r for r in all_rules() if r.code == "R002")
    analysis.findings.append(rule.finding("loss spike in the replay", step=1200, attempt=2))
    data = build_report_data(analysis)
    out = tmp_path / "attempts.html"
    write_report(out, data)
    page, problems = _open(browser, out, "attempts-and-eval-sets")
    _check_charts(page, data)
    loss = page.evaluate("window.sapperReport.charts.loss")
    names = [s["name"] for s in loss["series"]]
    assert names[:2] == ["train loss · attempt 1", "train loss · attempt 2 (from step 1100)"]
    one, two = loss["series"][:2]
    assert one["group"] == two["group"] == "loss" and one["color"] != two["color"]
    assert pixels(page, "loss", one["color"]) > 0 and pixels(page, "loss", two["color"]) > 0
    evals = [s for s in loss["series"] if s["name"].startswith("eval loss (")]
    assert sorted(s["name"] for s in evals) == [
        "eval loss (code) · attempt 1", "eval loss (code) · attempt 2 (from step 1100)",
        "eval loss (wiki) · attempt 1", "eval loss (wiki) · attempt 2 (from step 1100)",
    ]
    for s in evals:
        assert s["kind"] == "points" and s["drawn"] > 0
    assert pixels(page, "loss", evals[0]["color"]) > 0
    legend = page.locator("#chart-loss .legend").inner_text()
    assert "attempt 2 (from step 1100)" in legend
    assert len(page.evaluate("window.sapperReport.charts.grad_norm_layers.series")) == 10
    assert "2 attempts" in page.locator("#source").inner_text()
    # the finding of attempt 2 is marked where it fired and says which attempt
    assert loss["markerSteps"] == [1200]
    box = _over(page, "loss")
    x = page.evaluate("window.sapperReport.plot('loss').valToPos(1200, 'x')")
    page.mouse.move(box["x"] + x, box["y"] + 30)
    assert "R002 warning (step 1,200, attempt 2)" in page.locator("#tooltip").inner_text()
    assert "step 1,200, attempt 2" in page.locator("#finding-list").inner_text()
    # hiding a series in the legend takes its pixels off the chart
    page.locator("#chart-loss .legend span").nth(1).click()
    assert pixels(page, "loss", two["color"]) == 0
    assert problems == []
def test_log_text_cannot_run_as_script(browser, tmp_path: Path) -> None:
    evil = '</script><script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
    path = tmp_path / "metrics.csv"
    rows = ["step,loss," + evil.replace(",", ";")]
    rows += [f"{s},{9.0 if s == 60 else 2.0},1" for s in range(1, 101)]
    path.write_text("\n".join(rows) + "\n")
    log = read_log(path)
    log.notes.append(evil)
    for rec in log.records[::10]:  # eval set and layer names are log text too
        rec.extra["eval_losses"] = {evil: 2.5}
        rec.extra["grad_norm_layers"] = {evil: 0.5}
    data = build_report_data(analyze_log(log, detectors_for(None)), title=evil)
    out = tmp_path / "evil.html"
    write_report(out, data)
    page, problems = _open(browser, out, "escaped-log-text")
    assert page.evaluate("window.__pwned") is None
    assert evil in page.locator("#note-list").inner_text()
    assert f"eval loss ({evil})" in page.locator("#chart-loss .legend").inner_text()
    assert evil in page.locator("#chart-grad_norm_layers .legend").inner_text()
    assert page.title() == evil
    _check_charts(page, data)
    assert problems == []


def test_checkpoint_section_draws_each_layer(browser, examples: Path, tmp_path: Path) -> None:
    """``--checkpoint``: a section of its own on a layer axis, one dot per layer in each
    chart, a NaN layer marked, the checkpoint's findings as cards."""
    import shutil as sh

    import torch

    from sapper.checkpoint import inspect_paths

    ckpt = Path(sh.copytree(
        Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints" / "deepspeed"
        / "zero1-fp32-dp1", tmp_path / "ds",
    ))  # fmt: skip
    module = next((ckpt / "global_step3").glob("mp_rank_*_model_states.pt"))
    states = torch.load(module, weights_only=True)
    states["module"]["model.layers.1.mlp.up_proj.weight"][0, 0] = float("nan")
    torch.save(states, module)
    analysis = analyze_log(read_log(examples / "sapper-gpt2-healthy.jsonl"), detectors_for(None))
    data = build_report_data(analysis, checkpoint=inspect_paths([ckpt]))
    out = tmp_path / "ckpt.html"
    write_report(out, data)
    page, problems = _open(browser, out, "checkpoint-layers")
    assert page.is_visible("#checkpoint-section") and page.is_visible("#toc-checkpoint")
    drawn = page.evaluate("window.sapperReport.checkpoint")
    assert drawn == {"layers": 2, "charts": 2, "findings": len(data["checkpoint"]["findings"])}
    assert page.locator("#checkpoint-charts .layer-chart").count() == 2
    for metric in ("rms", "max_update"):
        chart = page.locator(f'#checkpoint-charts .layer-chart[data-metric="{metric}"]')
        assert chart.locator("circle").count() == 2 and chart.locator("polyline").count() == 1
        assert chart.locator("rect").count() == 1  # layer 1 holds the NaN
    codes = page.eval_on_selector_all(
        "#checkpoint-findings li", "els => els.map(e => e.dataset.code)"
    )
    assert "K001" in codes
    assert problems == []
    assert page.text_content("#counts .count.error") == "1 error"  # the checkpoint's K001
