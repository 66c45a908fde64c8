"""The HTML run report: one self-contained file with the curves of seed §5.2.

Loss, gradient norm (with the clip threshold), learning rate (with the declared
schedule), memory (with the device limit) and throughput (with the expected rate), plus
the loss scale and skipped steps; every finding is marked on the curve of its topic at
the step where it fired, and listed with its why / early signs / how to defuse. With a
Plan, the pre-flight checklist is summarised too.

The file works offline and never touches the network: the stylesheets, the charting
library (uPlot, vendored in ``assets/vendor/uplot``), the report's script and the data
are inlined, and a Content-Security-Policy forbids any fetch. Text from logs reaches the
page only as JSON inside a ``<script type="application/json">`` block (with ``<``, ``>``
and ``&`` escaped) and is put in the page with ``textContent``, so a log cannot inject
markup. Every chart is drawn by uPlot, with the cursor and the zoom shared by all charts.
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
from typing import TYPE_CHECKING, Any

import numpy as np

from sapper.checks.engine import CheckReport
from sapper.errors import SapperError
from sapper.logs.analysis import Analysis
from sapper.logs.base import LogData, gc_paused
from sapper.model.derived import derived
from sapper.plan.schema import Plan
from sapper.report.html_data import (
    ChartData,
    Columns,
    Segment,
    Series,
    extra_table,
    mask_ranges,
    page_text,
    segments,
)
from sapper.rules.model import Finding
from sapper.rules.registry import all_rules
from sapper.runtime.records import StepRecord

if TYPE_CHECKING:  # the checkpoint reader imports torch: only the CLI loads it, on demand
    from sapper.checkpoint.inspect import InspectResult

__all__ = ["CHART_OF_CHECK", "build_report_data", "render_report", "write_report"]

#: Which chart a finding is marked on, by its rule's topic (``Rule.check``).
CHART_OF_CHECK: dict[str, str] = {
    "loss": "loss",
    "eval": "loss",
    "data": "loss",
    "setup": "loss",
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


#: Per-layer gradient norms drawn: the layers with the largest norms, no more.
TOP_LAYERS = 5


class _Builder:
    """Series for every attempt of the log: one per attempt, named after it, sharing the
    metric's colour group."""

    def __init__(self, records: Sequence[StepRecord], parts: list[Segment]) -> None:
        self.cols = Columns(records)
        self.parts = parts

    def steps(self, part: Segment) -> np.ndarray:
        return self.cols.steps[part.start : part.stop]

    def series(self, name: str, key: str, kind: str = "line") -> list[Series]:
        out = []
        for part in self.parts:
            steps, values = self.cols.get(key, part.start, part.stop)
            out.append(self._one(name, key, steps, values, part, kind))
        return [s for s in out if s is not None]

    def masked(
        self, name: str, key: str, values: np.ndarray, mask: np.ndarray, kind: str = "line",
        group: str = "",
    ) -> list[Series]:
        """Series from a column computed here (``values`` where ``mask``)."""
        out = []
        for part in self.parts:
            window = slice(part.start, part.stop)
            ok = mask[window]
            out.append(
                self._one(name, key, self.steps(part)[ok], values[window][ok], part, kind, group)
            )
        return [s for s in out if s is not None]

    def _one(
        self, name: str, key: str, steps: np.ndarray, values: np.ndarray, part: Segment,
        kind: str, group: str = "",
    ) -> Series | None:
        return Series.build(
            part.label(name), key, steps, values, self.steps(part), kind,
            max_points=part.budget, group=group or key, attempt=part.number,
        )

    def band(self, marked: np.ndarray) -> list[list[int]]:
        """Step ranges of the ``marked`` records, attempt by attempt."""
        ranges: list[list[int]] = []
        for part in self.parts:
            steps = self.steps(part)
            ranges += mask_ranges(steps, steps[marked[part.start : part.stop]])
        return ranges


def _charts(
    log: LogData,
    plan: Plan | None,
    expected_tokens_per_s: float | None,
) -> list[ChartData]:
    records = log.records
    b = _Builder(records, segments(records, log.attempts))
    cols = b.cols
    steps = cols.steps

    def chart(cid: str, title: str, unit: str, *series: list[Series], **kw: Any) -> ChartData:
        return ChartData(cid, title, unit, [s for group in series for s in group], **kw)

    evals = extra_table(records, "eval_losses")
    loss = chart(
        "loss",
        "Loss",
        "training loss per logged step; eval loss as points, one series per eval set",
        b.series("train loss", "loss"),
        b.series("eval loss", "eval_loss", "points"),
        *(
            b.masked(f"eval loss ({name})", f"eval_losses.{name}", values, mask, "points")
            for name, (values, mask) in evals.items()
        ),
        empty="No loss in this log.",
    )

    grad = chart(
        "grad_norm",
        "Gradient norm",
        "global norm before clipping",
        b.series("grad norm", "grad_norm"),
        log_scale=True,
        empty="No gradient norm in this log.",
    )
    clip = cols.constant("clip_threshold")
    if clip is not None:
        grad.lines.append({"name": "clip threshold", "y": clip})
    elif cols.present("clip_threshold").any():
        grad.series += b.series("clip threshold", "clip_threshold")
    elif plan is not None and plan.clipping.max_norm:
        grad.lines.append({"name": "clip threshold (plan)", "y": float(plan.clipping.max_norm)})

    layers = _layer_chart(b, records)

    lr = chart(
        "lr", "Learning rate", "first parameter group", b.series("lr", "lr"),
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
        b.series("allocated", "memory_allocated_gib"),
        b.series("reserved", "memory_reserved_gib"),
        b.series("peak", "memory_peak_gib"),
        b.series("process RSS", "rss_gib"),
        empty="No memory readings in this log.",
    )
    limit = cols.last("memory_limit_gib")
    if limit is not None:
        memory.lines.append({"name": "device limit", "y": limit})
    elif plan is not None and plan.gpu is not None and memory.series:
        memory.lines.append({"name": f"{plan.gpu.name} memory", "y": float(plan.gpu.memory_gib)})

    throughput = _throughput(b)
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
        b.series("loss scale", "loss_scale"),
        log_scale=True,
        empty="No loss scale in this log (bf16 and fp32 runs have none).",
    )
    skipped = np.equal(cols.raw("skipped"), True)
    if skipped.any():
        scale.bands.append({"name": "skipped steps", "ranges": b.band(skipped)})
        if not scale.series:
            total = b.series("skipped steps so far", "skipped_total")
            if not total:
                total = b.masked(
                    "skipped", "skipped", skipped.astype(np.float64), cols.present("skipped")
                )
            scale.series += total
            scale.log_scale = False
    charts = [loss, grad, lr, memory, throughput, scale]
    if layers is not None:
        charts.insert(2, layers)
    return charts


def _layer_chart(b: _Builder, records: Sequence[StepRecord]) -> ChartData | None:
    """The per-layer gradient norms of the few layers whose norm got largest: where a
    spike in the global norm came from. None when the log has no per-layer norms."""
    table = extra_table(records, "grad_norm_layers")
    if not table:
        return None

    def peak(item: tuple[str, tuple[np.ndarray, np.ndarray]]) -> float:
        values, mask = item[1]
        finite = values[mask & np.isfinite(values)]
        # a layer that went non-finite is the first to show
        return math.inf if (mask & ~np.isfinite(values)).any() else float(finite.max(initial=0))

    top = sorted(table.items(), key=peak, reverse=True)[:TOP_LAYERS]
    shown = f"the {len(top)} of {len(table)} layers with the largest norm"
    layers = ChartData(
        "grad_norm_layers",
        "Gradient norm per layer",
        shown if len(table) > len(top) else f"{len(table)} layer(s)",
        [s for name, (values, mask) in top
         for s in b.masked(name, f"grad_norm_layers.{name}", values, mask)],
        log_scale=True,
    )
    return layers


def _predicted_tokens_per_s(plan: Plan) -> float | None:
    """The plan's step-cost model (``sapper.parallel.predict_step``): job tokens/s, or
    None when the plan lacks what the model needs (model, sequence length, GPU, layout)."""
    from sapper.parallel import predict_step

    try:
        return float(predict_step(plan).tokens_per_s)
    except SapperError:
        return None


def _throughput(b: _Builder) -> ChartData:
    """tokens/s if logged, else samples/s, else derived from tokens or samples per step
    over the step time (a plain division, labelled as such), else the step time."""
    cols = b.cols
    for name, key in (("tokens/s", "tokens_per_s"), ("samples/s", "samples_per_s")):
        series = b.series(name, key)
        if series:
            return ChartData("throughput", "Throughput", name, series)
    step_time = cols.floats("step_time_s")
    for name, key in (("tokens/s (tokens ÷ step time)", "tokens"),
                      ("samples/s (samples ÷ step time)", "samples")):
        amount = cols.floats(key)
        ok = (amount > 0) & (step_time > 0)  # NaN (missing) compares False
        if ok.any():
            with np.errstate(divide="ignore", invalid="ignore"):
                rate = amount / step_time
            series = b.masked(name, key.rstrip("s") + "s_per_s", rate, ok)
            return ChartData("throughput", "Throughput", name.split(" ")[0], series)
    series = b.series("step time (s)", "step_time_s")
    if series:
        return ChartData("throughput", "Throughput", "seconds per step", series)
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
    shown = {k: v for k, v in derived(report.plan).items() if v is not None}
    facts = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in shown.items())
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


def _checkpoint(result: InspectResult, docs: dict[str, Any]) -> dict[str, Any]:
    """What ``sapper inspect`` says of the run's (later) checkpoint, per layer in layer
    order (weight RMS, the largest Adam update its moments imply, non-finite values), for
    the page's checkpoint section; the findings in the page's finding shape."""
    report = result.checkpoints[-1]

    def finite(v: Any) -> float | None:
        return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None

    return {
        "path": report.path,
        "format": report.kind,
        "steps": report.steps,
        "parameters": sum(s.numel for s in report.weights),
        "layers": [
            {"layer": r["layer"], "rms": finite(r["rms"]), "max_update": finite(r["max_update"]),
             "nonfinite": r["nonfinite"], "findings": r["findings"]}
            for r in sorted(report.layers(), key=lambda r: r["layer"])
        ],
        "findings": [_finding_json(f, docs) for f in result.findings],
    }


def build_report_data(
    analysis: Analysis,
    *,
    plan: Plan | None = None,
    checklist: CheckReport | None = None,
    expected_tokens_per_s: float | None = None,
    title: str | None = None,
    diagnosis: dict[str, Any] | None = None,
    checkpoint: InspectResult | None = None,
) -> dict[str, Any]:
    """Everything the page shows, as one JSON-ready dict; ``diagnosis``: what ``sapper
    diagnose`` says of the run (its JSON), drawn as a timeline with the cause marked;
    ``checkpoint``: what ``sapper inspect`` found in the run's checkpoint."""
    docs = {r.code: r for r in all_rules()}
    with gc_paused():
        charts = _charts(analysis.log, plan, expected_tokens_per_s)
    findings = [_finding_json(f, docs) for f in analysis.findings]
    by_id = {c.id: c for c in charts}
    for idx, f in enumerate(analysis.findings):
        if f.step is None:
            continue
        # its topic's chart; else the loss; else any chart with a curve to mark
        drawn = [c for c in charts if c.series] or charts
        topic = by_id.get(CHART_OF_CHECK.get(f.check, "loss"), by_id["loss"])
        target = next(c for c in (topic, by_id["loss"], *drawn) if c.series or c is drawn[0])
        target.markers.append(idx)
    section = _checkpoint(checkpoint, docs) if checkpoint is not None else None
    # the header's counts are the page's: the checkpoint's findings count too
    shown = findings + (section["findings"] if section else [])
    counts = {s: sum(f["severity"] == s for f in shown) for s in ("error", "warning", "info")}
    return page_text({
        "title": title or f"sapper report: {_run_name(analysis.log.path)}",
        "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
        "source": analysis.summary(),
        "decimated": any(s.decimated for c in charts for s in c.series),
        "attempts": [
            {"number": a.number, "first_step": a.first_step, "last_step": a.last_step,
             "records": a.stop - a.start}
            for a in analysis.log.attempts
        ] if len(analysis.log.attempts) > 1 else [],
        "charts": [c.to_json() for c in charts],
        "findings": findings,
        "counts": counts,
        "checklist": _checklist(checklist, docs) if checklist is not None else None,
        "notes": analysis.notes,
        "diagnosis": diagnosis,
        "checkpoint": section,
    })


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


#: The vendored charting library (see ``assets/vendor/uplot/README.md``).
UPLOT = "vendor/uplot"


def uplot_version() -> str:
    return _asset(f"{UPLOT}/VERSION").strip()


def _inline_script(text: str) -> str:
    """Script text that cannot end its ``<script>`` element early: a ``</script`` inside
    a string literal is written ``<\\/script`` (the same string to JavaScript)."""
    return re.sub(r"</(script)", r"<\\/\1", text, flags=re.IGNORECASE)


def _scripts() -> str:
    """uPlot (with its MIT notice, which must travel with every copy) then the report's
    own script."""
    notice = _asset(f"{UPLOT}/LICENSE").replace("*/", "* /")
    return _inline_script(
        f"/* uPlot {uplot_version()}, vendored by sapper. {notice} */\n"
        + _asset(f"{UPLOT}/uPlot.iife.min.js")
        + "\n"
        + _asset("report.js")
    )


def render_report(data: dict[str, Any]) -> str:
    """The page: template, stylesheets, scripts and data inlined into one string."""
    parts = {
        "TITLE": html.escape(data["title"]),
        "CSS": _asset(f"{UPLOT}/uPlot.min.css") + "\n" + _asset("report.css"),
        "JS": _scripts(),
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
