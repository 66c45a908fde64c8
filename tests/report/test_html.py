"""The HTML report's data: charts, decimation that keeps spikes, markers, escaping."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from sapper.checks.engine import run_checklist
from sapper.logs import read_log
from sapper.logs.analysis import analyze_log
from sapper.logs.base import Attempt, LogData
from sapper.pipeline.logs import detectors_for
from sapper.plan.load import load_plan
from sapper.report.html import _inline_script, build_report_data, render_report
from sapper.report.html_data import MAX_POINTS, decimate, mask_ranges
from sapper.rules.registry import all_rules
from sapper.runtime.records import StepRecord

from .conftest import page_data

PLAN = """\
name: gpt-345m
optimizer: {lr: 1.5e-4}
schedule: {type: cosine, warmup_steps: 300, total_steps: 3000, min_lr: 1.0e-5}
clipping: {max_norm: 1.0}
precision: {dtype: fp16, loss_scaling: {mode: dynamic}}
hardware: {gpu: A100-80GB, num_gpus: 8}
"""


def test_decimate_keeps_extremes_in_order() -> None:
    steps = np.arange(1_000_000)
    values = np.sin(steps / 5000.0)
    values[123_457] = 50.0
    values[777_777] = -40.0
    xs, ys = decimate(steps, values)
    assert len(xs) <= MAX_POINTS
    assert ys.max() == 50.0 and xs[ys.argmax()] == 123_457
    assert ys.min() == -40.0 and xs[ys.argmin()] == 777_777
    assert (np.diff(xs) > 0).all()
    short_x, _ = decimate(steps[:10], values[:10])
    assert list(short_x) == list(range(10))


def test_mask_ranges_merge_consecutive_records() -> None:
    all_steps = np.arange(0, 100, 10)
    assert mask_ranges(all_steps, np.array([20, 30, 40, 70, 90])) == [[20, 40], [70, 70], [90, 90]]
    assert mask_ranges(all_steps, np.array([], dtype=np.int64)) == []


def test_mask_ranges_of_a_restarted_log_follow_record_order() -> None:
    """Attempt 2 logs steps 30-50 again: ranges are runs over the records as logged."""
    all_steps = np.array([10, 20, 30, 40, 50, 30, 40, 50, 60])
    marked = np.array([40, 50, 30, 40])  # NaN at the end of attempt 1, the start of attempt 2
    assert mask_ranges(all_steps, marked) == [[40, 40]]  # one run: 40, 50 | 30, 40
    assert mask_ranges(all_steps, np.array([20, 60])) == [[20, 20], [60, 60]]


def test_report_of_a_restarted_log(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    steps = [*range(1, 121), *range(81, 201)]
    rows = [f"{s},{math.nan if s == 110 and i < 120 else 2.0 - s / 1000}" for i, s in
            enumerate(steps)]
    path.write_text("step,loss\n" + "\n".join(rows) + "\n")
    log = read_log(path)
    assert len(log.attempts) == 2
    back = page_data(render_report(build_report_data(analyze_log(log, detectors_for(None)))))
    assert back["notes"][0] == (
        "rolled back at step 120 (attempt 2 resumes from step 81) after a non-finite loss at "
        "step 110 (R001)"
    )


def _analysis(path: Path, plan=None):
    return analyze_log(read_log(path), detectors_for(plan))


def test_megatron_report_with_plan(examples: Path, tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(PLAN)
    loaded = load_plan(plan_file)
    analysis = _analysis(examples / "megatron-gpt345m-fp16.log", loaded.plan)
    data = build_report_data(analysis, plan=loaded.plan, checklist=run_checklist(loaded))
    charts = {c["id"]: c for c in data["charts"]}
    assert list(charts) == ["loss", "grad_norm", "lr", "memory", "throughput", "loss_scale"]
    assert [s["name"] for s in charts["loss"]["series"]] == ["train loss", "eval loss"]
    assert charts["loss"]["series"][0]["nonfinite"] == [[1830, 1830]]
    assert charts["grad_norm"]["lines"] == [{"name": "clip threshold (plan)", "y": 1.0}]
    lr_names = [s["name"] for s in charts["lr"]["series"]]
    assert lr_names[0] == "lr" and lr_names[1].startswith("declared schedule (cosine")
    schedule = charts["lr"]["series"][1]
    assert max(schedule["y"]) == pytest.approx(1.5e-4, rel=1e-3)
    assert charts["memory"]["lines"] == [{"name": "A100-80GB memory", "y": 80.0}]
    assert charts["throughput"]["unit"] == "samples/s"
    bands = charts["loss_scale"]["bands"][0]
    assert bands["name"] == "skipped steps" and [10, 20] in bands["ranges"]
    # every finding with a step is a marker on exactly one chart, on its topic's chart
    marked = [i for c in data["charts"] for i in c["markers"]]
    with_step = [i for i, f in enumerate(data["findings"]) if f.get("step") is not None]
    assert sorted(marked) == with_step
    by_code = {}
    for c in data["charts"]:
        for i in c["markers"]:
            by_code.setdefault(data["findings"][i]["code"], set()).add(c["id"])
    assert by_code["R030"] == {"loss_scale"} and by_code["R001"] == {"loss"}
    finding = data["findings"][0]
    assert finding["why"] and finding["signs"] and finding["defuse"]
    assert data["checklist"]["items"][0]["item"] == "precision"
    assert data["counts"]["error"] >= 2


def test_page_is_self_contained_and_round_trips(examples: Path) -> None:
    data = build_report_data(_analysis(examples / "hf-llama-sft"))
    page = render_report(data)
    # the only addresses in the page: the vendored library's own banner comment, and the
    # SVG namespace name the checkpoint charts are created in (a name, never fetched: the
    # browser test fails on any network request)
    assert re.findall(r"https?://[^\s\"')]+", page) == [
        "https://github.com/leeoniya/uPlot",
        "http://www.w3.org/2000/svg",
    ]
    assert "<link" not in page and " src=" not in page
    assert "default-src 'none'" in page
    assert page.count("<script") == 2  # the data block and the inlined plotting script
    back = page_data(page)
    assert [(f["code"], f.get("step"), f["message"]) for f in back["findings"]] == [
        (f["code"], f.get("step"), f["message"]) for f in data["findings"]
    ]
    nan_finding = next(f for f in back["findings"] if f["code"] == "R010")
    assert nan_finding["value"] == "nan"  # JSON has no NaN literal
    assert back["charts"][0]["series"][0]["y"][:3] == data["charts"][0]["series"][0]["y"][:3]


def test_text_from_logs_is_escaped(tmp_path: Path) -> None:
    evil = "</script><script>alert('pwned')</script><!--"
    path = tmp_path / "metrics.csv"
    rows = ["step,loss," + evil.replace(",", ";")]
    rows += [f"{s},{9.0 if s == 60 else 2.0},1" for s in range(1, 101)]
    path.write_text("\n".join(rows) + "\n")
    log = read_log(path)
    log.notes.append(evil)
    analysis = analyze_log(log, detectors_for(None))
    data = build_report_data(analysis, title=evil)
    page = render_report(data)
    assert page.count("<script") == 2
    assert "alert('pwned')</script>" not in page
    assert "&lt;/script&gt;" in page  # the title, HTML-escaped
    back = page_data(page)
    assert evil in back["notes"] and back["title"] == evil


def test_million_steps_stay_small() -> None:
    n = 200_000
    recs = [
        StepRecord(step=s, loss=3 + 1 / math.sqrt(s), grad_norm=9.0 if s == 150_001 else 0.5,
                   lr=1e-4, loss_scale=2.0**16, skipped=s % 5000 == 0)
        for s in range(1, n + 1)
    ]
    data = build_report_data(analyze_log(LogData("big.jsonl", "sapper", recs), []))
    page = render_report(data)
    assert len(page) < 1_500_000
    grad = next(c for c in data["charts"] if c["id"] == "grad_norm")["series"][0]
    assert len(grad["x"]) <= MAX_POINTS and 9.0 in grad["y"]
    assert data["decimated"] is True


def test_empty_charts_say_why(examples: Path) -> None:
    data = build_report_data(_analysis(examples / "hf-llama-sft"))
    charts = {c["id"]: c for c in data["charts"]}
    assert charts["memory"]["series"] == [] and "No memory" in charts["memory"]["empty"]
    assert "bf16" in charts["loss_scale"]["empty"]


def test_throughput_expected_from_the_plans_cost_model(examples: Path) -> None:
    plan = load_plan(Path(__file__).resolve().parents[2] / "examples/plans/healthy-llama-7b.yaml")
    data = build_report_data(
        analyze_log(read_log(examples / "sapper-gpt2-healthy.jsonl"), []), plan=plan.plan
    )
    throughput = next(c for c in data["charts"] if c["id"] == "throughput")
    (line,) = throughput["lines"]
    assert line["name"] == "predicted for the plan" and line["y"] > 0


# ---- series the page must still draw: the shapes that break naive charting -------------

#: Chart id → the StepRecord field drawn there (every chart type of the report).
CHART_FIELDS = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "lr": "lr",
    "memory": "memory_allocated_gib",
    "throughput": "tokens_per_s",
    "loss_scale": "loss_scale",
}


def shaped(shape: str, n: int = 200) -> list[float]:
    """Values of one pathological shape, ``n`` long (``single`` is one value)."""
    if shape == "constant":
        return [2.0] * n
    if shape == "single":
        return [2.0]
    if shape == "all_nan":
        return [math.nan] * n
    if shape == "with_inf":
        return [math.inf if i % 50 == 10 else -math.inf if i % 50 == 30 else 1.0 + i / n
                for i in range(n)]
    if shape == "huge_range":
        return [10.0 ** (-30 + 60 * i / (n - 1)) for i in range(n)]
    raise ValueError(shape)


SHAPES = ["constant", "single", "all_nan", "with_inf", "huge_range"]


def shaped_log(shape: str) -> LogData:
    """A log whose every charted metric (and per-layer norms, named eval sets) has the
    shape."""
    values = shaped(shape)
    recs = []
    for i, v in enumerate(values):
        rec = StepRecord(step=10 * (i + 1), **{f: v for f in CHART_FIELDS.values()})
        rec.extra["grad_norm_layers"] = {"layers.0": v, "layers.1": v / 2}
        rec.extra["eval_losses"] = {"wiki": v * 1.25}  # not on top of the train loss
        recs.append(rec)
    return LogData(f"{shape}.jsonl", "sapper", recs)


@pytest.mark.parametrize("shape", SHAPES)
def test_every_chart_keeps_pathological_series(shape: str) -> None:
    log = shaped_log(shape)
    data = page_data(render_report(build_report_data(analyze_log(log, []))))
    charts = {c["id"]: c for c in data["charts"]}
    assert set(CHART_FIELDS) | {"grad_norm_layers"} == set(charts)
    values = np.asarray(shaped(shape))
    steps = np.arange(1, len(values) + 1) * 10
    finite = np.isfinite(values)
    for cid in [*CHART_FIELDS, "grad_norm_layers"]:
        series = charts[cid]["series"][0]
        assert series["count"] == len(values), cid
        assert series["x"] == steps[finite].tolist(), cid
        assert all(isinstance(y, float) and math.isfinite(y) for y in series["y"]), cid
        if shape == "huge_range":
            assert min(series["y"]) == pytest.approx(1e-30, rel=1e-5, abs=0)
            assert max(series["y"]) == pytest.approx(1e30, rel=1e-5)
        covered = sum(b - a + 10 for a, b in series["nonfinite"]) // 10
        assert covered == int((~finite).sum()), cid
    assert charts["grad_norm"]["log"] and charts["loss_scale"]["log"]
    eval_set = next(s for s in charts["loss"]["series"] if s["name"] == "eval loss (wiki)")
    assert eval_set["kind"] == "points" and eval_set["count"] == len(values)


def _restarted(n1: int = 1500, resume: int = 1100, last: int = 3000) -> LogData:
    """A run that rolled back at step ``n1`` to ``resume`` and went on to ``last``."""
    first = [StepRecord(step=s, loss=2 + 1 / s, skipped=s == 1400) for s in range(1, n1 + 1)]
    second = [StepRecord(step=s, loss=1.9 + 1 / s, skipped=s == 1200)
              for s in range(resume, last + 1)]
    log = LogData("restarted.jsonl", "sapper", first + second)
    log.attempts = [
        Attempt(1, 0, n1, 1, n1),
        Attempt(2, n1, n1 + len(second), resume, last),
    ]
    return log


def test_attempts_are_separate_series() -> None:
    data = build_report_data(analyze_log(_restarted(), []))
    loss = next(c for c in data["charts"] if c["id"] == "loss")
    one, two = loss["series"]
    assert one["name"] == "train loss · attempt 1"
    assert two["name"] == "train loss · attempt 2 (from step 1100)"
    assert (one["group"], one["attempt"]) == ("loss", 1)
    assert (two["group"], two["attempt"]) == ("loss", 2)
    assert one["x"][0] == 1 and one["x"][-1] == 1500 and one["count"] == 1500
    assert two["x"][0] == 1100 and two["x"][-1] == 3000 and two["count"] == 1901
    assert (np.diff(one["x"]) > 0).all() and (np.diff(two["x"]) > 0).all()
    scale = next(c for c in data["charts"] if c["id"] == "loss_scale")
    assert scale["bands"][0]["ranges"] == [[1400, 1400], [1200, 1200]]
    assert [a["first_step"] for a in data["attempts"]] == [1, 1100]


def test_attempts_share_the_point_budget_and_keep_spikes() -> None:
    n = 300_000
    first = [StepRecord(step=s, grad_norm=50.0 if s == 123_457 else 1.0) for s in range(1, n)]
    second = [StepRecord(step=s, grad_norm=70.0 if s == 250_001 else 1.0)
              for s in range(200_000, n + 200_000)]
    log = LogData("big.jsonl", "sapper", first + second)
    log.attempts = [Attempt(1, 0, len(first), 1, n - 1),
                    Attempt(2, len(first), len(first) + len(second), 200_000, n + 199_999)]
    grad = next(c for c in build_report_data(analyze_log(log, []))["charts"]
                if c["id"] == "grad_norm")
    a, b = grad["series"]
    assert len(a["x"]) + len(b["x"]) <= MAX_POINTS + 2
    assert 50.0 in a["y"] and 70.0 in b["y"]


def test_named_eval_sets_and_hostile_values() -> None:
    recs = [StepRecord(step=s, loss=2.0) for s in range(1, 101)]
    for s in (20, 40, 60):
        recs[s - 1].extra["eval_losses"] = {"wiki": 2.5, "code": "1.5", "bad": "n/a",
                                            "flag": True, "nested": {"x": 1}}
    recs[79].extra["eval_losses"] = ["not", "a", "dict"]
    data = build_report_data(analyze_log(LogData("e.jsonl", "sapper", recs), []))
    loss = next(c for c in data["charts"] if c["id"] == "loss")
    named = {s["name"]: s for s in loss["series"] if s["key"].startswith("eval_losses.")}
    assert list(named) == ["eval loss (wiki)", "eval loss (code)"]
    assert named["eval loss (code)"]["x"] == [20, 40, 60]
    assert named["eval loss (code)"]["y"] == [1.5, 1.5, 1.5]
    assert all(s["kind"] == "points" for s in named.values())


def test_layer_chart_shows_the_largest_layers() -> None:
    recs = []
    for s in range(1, 51):
        layers = {f"layers.{i}": 0.1 * (i + 1) for i in range(12)}
        if s == 30:
            layers["layers.0"] = 99.0  # the spike: smallest layer otherwise
            layers["layers.3"] = math.nan
        recs.append(StepRecord(step=s, grad_norm=1.0, extra={"grad_norm_layers": layers}))
    data = build_report_data(analyze_log(LogData("l.jsonl", "sapper", recs), []))
    ids = [c["id"] for c in data["charts"]]
    assert ids[:3] == ["loss", "grad_norm", "grad_norm_layers"]
    chart = data["charts"][2]
    names = [s["name"] for s in chart["series"]]
    assert names == ["layers.3", "layers.0", "layers.11", "layers.10", "layers.9"]
    assert chart["log"] and "5 of 12 layers" in chart["unit"]
    assert chart["series"][0]["nonfinite"] == [[30, 30]]


def test_no_layer_chart_without_layer_norms(examples: Path) -> None:
    data = build_report_data(_analysis(examples / "hf-llama-sft"))
    assert "grad_norm_layers" not in [c["id"] for c in data["charts"]]


def test_vendored_uplot_is_inlined_with_its_license_and_shipped() -> None:
    root = Path(__file__).resolve().parents[2]
    vendor = root / "src/sapper/report/assets/vendor/uplot"
    version = (vendor / "VERSION").read_text().strip()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert f"(v{version})" in (vendor / "uPlot.iife.min.js").read_text()[:200]
    license_text = (vendor / "LICENSE").read_text()
    assert "MIT License" in license_text and "Leon Sorokin" in license_text
    page = render_report(build_report_data(analyze_log(_restarted(), [])))
    assert f"uPlot {version}" in page and "Permission is hereby granted" in page
    # every vendored file is package data (pyproject globs, relative to src/sapper)
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((root / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["sapper"]
    package = root / "src/sapper"
    shipped = {p for g in globs for p in package.glob(g)}
    assert {p for p in vendor.iterdir() if p.is_file()} <= shipped


def test_inlined_scripts_cannot_close_their_element() -> None:
    assert _inline_script('var a = "</SCRIPT>"; b = "</script";') == (
        'var a = "<\\/SCRIPT>"; b = "<\\/script";'
    )
    page = render_report(build_report_data(analyze_log(_restarted(), [])))
    body = page.split("<script>", 1)[1].rsplit("</script>", 1)[0]
    assert "</script" not in body.lower() and "<!--" not in body


def test_findings_are_marked_on_a_drawn_chart_when_their_topic_has_none() -> None:
    recs = [StepRecord(step=s, memory_allocated_gib=10.0 + s) for s in range(1, 41)]
    analysis = analyze_log(LogData("m.jsonl", "sapper", recs), [])
    rule = next(r for r in all_rules() if r.code == "R001")  # a loss rule, but no loss
    analysis.findings.append(rule.finding("loss is nan", step=20))
    charts = {c["id"]: c for c in build_report_data(analysis)["charts"]}
    assert charts["memory"]["markers"] == [0] and charts["loss"]["markers"] == []
