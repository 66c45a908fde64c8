"""The HTML report's data: charts, decimation that keeps spikes, markers, escaping."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from sapper.checks.engine import run_checklist
from sapper.cli.analyze_cmd import detectors_for
from sapper.logs import read_log
from sapper.logs.analysis import analyze_log
from sapper.logs.base import LogData
from sapper.plan.load import load_plan
from sapper.report.html import build_report_data, render_report
from sapper.report.html_data import MAX_POINTS, decimate, mask_ranges
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
    assert "http://" not in page and "https://" not in page
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
