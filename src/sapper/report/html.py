"""The HTML run report: one self-contained file with the curves of seed §5.2.

Loss, gradient norm (with the clip threshold), learning rate (with the declared
schedule), memory (with the device limit) and throughput (with the expected rate), plus
the loss scale and skipped steps; every finding is marked on the curve of its topic at
the step where it fired, and listed with its why / early signs / how to defuse. With a
Plan, the pre-flight checklist is summarised too.

The file works offline and never touches the network: the stylesheet, the plotting
script (hand-written, canvas) and the data are inlined, and a Content-Security-Policy
forbids any fetch. Text from logs reaches the page only as JSON inside a
``<script type="application/json">`` block (with ``<``, ``>`` and ``&`` escaped) and is
put in the page with ``textContent``, so a log cannot inject markup.
"""

from __future__ import annotations

import html
import json
import math
import re
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from sapper.checks.engine import CheckReport
from sapper.errors import SapperError
from sapper.logs.analysis import Analysis
from sapper.logs.base import gc_paused
from sapper.plan.schema import Plan
from sapper.report.html_data import MAX_POINTS, ChartData, Columns, Series, mask_ranges
from sapper.rules.model import Finding
from sapper.rules.registry import all_rules
from sapper.runtime.records import StepRecord

__all__ = ["CHART_OF_CHECK", "build_report_data", "render_report", "write_report"]

#: Which chart a finding is marked on, by its rule's topic (``Rule.check``).
CHART_OF_CHECK: dict[str, str] = {
    "loss": "loss",
    "eval": "loss",
    "data": "loss",
    "accumulation": "grad_norm",
    "gradnorm": "grad_norm",
    "numerics": "grad_norm",
    "normalization": "grad_norm",
    "init": "grad_norm",
    "clipping": "grad_norm",
    "lr": "lr",
    "memory": "memory",
    "throughput": "throughput",
    "scaler": "loss_scale",
    "precision": "loss_scale",
}

_PLACEHOLDER = re.compile(r"__SAPPER_(TITLE|CSS|JS|DATA)__")

#: Samples of the declared LR schedule drawn next to the actual LR.
SCHEDULE_POINTS = 1500


def _schedule(plan: Plan, first: int, last: int) -> Series | None:
    """The declared LR schedule sampled over the logged steps (monitor's formula)."""
    from sapper.runtime.detectors.lr import expected_lr

    if plan.optimizer.lr is None:
        return None
    s = plan.schedule
    total = s.total_steps or (last if s.type.lower() not in ("constant", "none") else None)
    steps = np.unique(
        np.concatenate(
            [
                np.linspace(first, last, SCHEDULE_POINTS).round().astype(np.int64),
                np.asarray([min(max(first, s.warmup_steps), last)], dtype=np.int64),
            ]
        )
    )
    xs, ys = [], []
    for step in steps:
        value = expected_lr(
            int(step),
            kind=s.type,
            peak=plan.optimizer.lr,
            warmup=s.warmup_steps,
            total=total,
            min_lr=s.min_lr,
        )
        if value is not None:
            xs.append(int(step))
            ys.append(float(value))
    if not xs:
        return None
    name = f"declared schedule ({s.type}, warmup {s.warmup_steps})"
    return Series(name, "schedule", xs, ys, "reference", [], len(xs))


def _charts(
    records: Sequence[StepRecord],
    plan: Plan | None,
    expected_tokens_per_s: float | None,
) -> list[ChartData]:
    cols = Columns(records)
    steps = cols.steps

    def build(name: str, key: str, kind: str = "line") -> Series | None:
        return Series.build(name, key, *cols.get(key), steps, kind)

    def chart(cid: str, title: str, unit: str, *series: Series | None, **kw: Any) -> ChartData:
        return ChartData(cid, title, unit, [s for s in series if s is not None], **kw)

    loss = chart(
        "loss",
        "Loss",
        "training loss per logged step; eval loss as points",
        build("train loss", "loss"),
        build("eval loss", "eval_loss", "points"),
        empty="No loss in this log.",
    )

    grad = chart(
        "grad_norm",
        "Gradient norm",
        "global norm before clipping",
        build("grad norm", "grad_norm"),
        log_scale=True,
        empty="No gradient norm in this log.",
    )
    clip = cols.constant("clip_threshold")
    if clip is not None:
        grad.lines.append({"name": "clip threshold", "y": clip})
    elif cols.present("clip_threshold").any():
        grad.series.append(build("clip threshold", "clip_threshold"))
    elif plan is not None and plan.clipping.max_norm:
        grad.lines.append({"name": "clip threshold (plan)", "y": float(plan.clipping.max_norm)})

    lr = chart(
        "lr", "Learning rate", "first parameter group", build("lr", "lr"),
        empty="No learning rate in this log.",
    )
    if plan is not None and lr.series and len(steps):
        sched = _schedule(plan, int(steps.min()), int(steps.max()))
        if sched is not None:
            lr.series.append(sched)

    memory = chart(
        "memory",
        "Memory",
        "GiB per device",
        build("allocated", "memory_allocated_gib"),
        build("reserved", "memory_reserved_gib"),
        build("peak", "memory_peak_gib"),
        build("process RSS", "rss_gib"),
        empty="No memory readings in this log.",
    )
    limit = cols.last("memory_limit_gib")
    if limit is not None:
        memory.lines.append({"name": "device limit", "y": limit})
    elif plan is not None and plan.gpu is not None and memory.series:
        memory.lines.append({"name": f"{plan.gpu.name} memory", "y": float(plan.gpu.memory_gib)})

    throughput = _throughput(cols)
    if throughput.unit.startswith("tokens"):
        if expected_tokens_per_s:
            throughput.lines.append({"name": "expected", "y": float(expected_tokens_per_s)})
        elif plan is not None:
            predicted = _predicted_tokens_per_s(plan)
            if predicted is not None:
                throughput.lines.append({"name": "predicted for the plan", "y": predicted})

    scale = chart(
        "loss_scale",
        "Loss scale and skipped steps",
        "dynamic loss scale (fp16); shaded: steps whose update was skipped",
        build("loss scale", "loss_scale"),
        log_scale=True,
        empty="No loss scale in this log (bf16 and fp32 runs have none).",
    )
    skipped = steps[np.equal(cols.raw("skipped"), True)]
    if len(skipped):
        scale.bands.append({"name": "skipped steps", "ranges": mask_ranges(steps, skipped)})
        if not scale.series:
            total = build("skipped steps so far", "skipped_total")
            if total is None:
                flags = cols.present("skipped")
                total = Series.build(
                    "skipped", "skipped", steps[flags],
                    np.equal(cols.raw("skipped")[flags], True).astype(np.float64), steps,
                )
            scale.series.append(total)
            scale.log_scale = False
    return [loss, grad, lr, memory, throughput, scale]


def _predicted_tokens_per_s(plan: Plan) -> float | None:
    """The plan's step-cost model (``sapper.parallel.predict_step``): job tokens/s, or
    None when the plan lacks what the model needs (model, sequence length, GPU, layout)."""
    from sapper.parallel import predict_step

    try:
        return float(predict_step(plan).tokens_per_s)
    except SapperError:
        return None


def _throughput(cols: Columns) -> ChartData:
    """tokens/s if logged, else samples/s, else derived from tokens or samples per step
    over the step time (a plain division, labelled as such), else the step time."""
    steps = cols.steps
    for name, key in (("tokens/s", "tokens_per_s"), ("samples/s", "samples_per_s")):
        series = Series.build(name, key, *cols.get(key), steps)
        if series is not None:
            return ChartData("throughput", "Throughput", name, [series])
    step_time = cols.floats("step_time_s")
    for name, key in (("tokens/s (tokens ÷ step time)", "tokens"),
                      ("samples/s (samples ÷ step time)", "samples")):
        amount = cols.floats(key)
        ok = (amount > 0) & (step_time > 0)  # NaN (missing) compares False
        if ok.any():
            rate = amount[ok] / step_time[ok]
            series = Series.build(name, key.rstrip("s") + "s_per_s", steps[ok], rate, steps)
            return ChartData("throughput", "Throughput", name.split(" ")[0], [series])
    series = Series.build("step time (s)", "step_time_s", *cols.get("step_time_s"), steps)
    if series is not None:
        return ChartData("throughput", "Throughput", "seconds per step", [series])
    return ChartData(
        "throughput", "Throughput", "", empty="No throughput or step time in this log."
    )


def _finding_json(f: Finding, docs: dict[str, Any]) -> dict[str, Any]:
    out = f.to_json()
    rule = docs.get(f.code)
    if rule is not None:
        out.update(why=rule.why, signs=rule.signs, defuse=rule.fix, seed=rule.seed)
    return out


def _checklist(report: CheckReport, docs: dict[str, Any]) -> dict[str, Any]:
    derived = {k: v for k, v in report.plan.derived().items() if v is not None}
    facts = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in derived.items())
    return {
        "facts": (report.plan.name or "plan") + (f": {facts}" if facts else ""),
        "items": [
            {"item": i.item, "status": i.status, "findings": len(i.findings)}
            for i in report.items()
        ],
        "findings": [_finding_json(f, docs) for f in report.findings],
        "errors": report.errors,
        "warnings": report.warnings,
    }


def build_report_data(
    analysis: Analysis,
    *,
    plan: Plan | None = None,
    checklist: CheckReport | None = None,
    expected_tokens_per_s: float | None = None,
    title: str | None = None,
) -> dict[str, Any]:
    """Everything the page shows, as one JSON-ready dict."""
    docs = {r.code: r for r in all_rules()}
    with gc_paused():
        charts = _charts(analysis.log.records, plan, expected_tokens_per_s)
    findings = [_finding_json(f, docs) for f in analysis.findings]
    by_id = {c.id: c for c in charts}
    for idx, f in enumerate(analysis.findings):
        if f.step is None:
            continue
        target = by_id.get(CHART_OF_CHECK.get(f.check, "loss"), by_id["loss"])
        if not target.series:
            target = by_id["loss"]
        target.markers.append(idx)
    counts = {s: sum(f["severity"] == s for f in findings) for s in ("error", "warning", "info")}
    return {
        "title": title or f"sapper report: {_run_name(analysis.log.path)}",
        "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
        "source": analysis.summary(),
        "decimated": any(s.count > MAX_POINTS for c in charts for s in c.series),
        "charts": [c.to_json() for c in charts],
        "findings": findings,
        "counts": counts,
        "checklist": _checklist(checklist, docs) if checklist is not None else None,
        "notes": analysis.notes,
    }


def _run_name(path: str) -> str:
    """The file name, with its folder when the name says nothing about the run
    (every HF run's state is ``trainer_state.json``)."""
    p = Path(path.split(" + ")[0])
    return f"{p.parent.name}/{p.name}" if p.name == "trainer_state.json" else p.name


def _clean(value: Any) -> Any:
    """Non-finite floats as strings ("nan", "inf"): JSON has no literal for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _script_json(data: dict[str, Any]) -> str:
    """JSON safe inside a <script> element: no ``</script>``, no HTML comment openers,
    no bare line separators."""
    text = json.dumps(
        _clean(data), separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str
    )
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _asset(name: str) -> str:
    return resources.files("sapper.report").joinpath("assets", name).read_text(encoding="utf-8")


def render_report(data: dict[str, Any]) -> str:
    """The page: template, stylesheet, script and data inlined into one string."""
    parts = {
        "TITLE": html.escape(data["title"]),
        "CSS": _asset("report.css"),
        "JS": _asset("report.js"),
        "DATA": _script_json(data),
    }
    # One pass, so a title or log text that spells a placeholder is never expanded.
    return _PLACEHOLDER.sub(lambda m: parts[m.group(1)], _asset("report.html"))


def write_report(path: str | Path, data: dict[str, Any]) -> int:
    """Write the page to ``path``; return its size in bytes."""
    text = render_report(data)
    target = Path(path)
    target.write_text(text, encoding="utf-8")
    return len(text.encode("utf-8"))
