"""Loss scaling (seed §2.2): scale collapse, skipped steps, and GradScaler misuse.

The live monitor observes the order of scaler.scale, scaler.unscale_,
clip_grad_norm_ and optimizer.step and marks a record with
extra["scaled_grads_step"] (the optimizer stepped on gradients still multiplied by
the scale) or extra["clip_before_unscale"] (clipping measured scaled gradients). From
a log alone, the signature is a gradient norm that tracks the loss scale: a real norm is
O(1), a scaled one is O(scale).
"""

from __future__ import annotations

import math
from collections import deque

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector, fmt
from sapper.runtime.records import StepRecord

__all__ = [
    "CLIP_BEFORE_UNSCALE",
    "SCALED_GRADS_STEP",
    "SCALE_COLLAPSE",
    "SKIPPED_STEPS",
    "ScalerDetector",
]

SCALE_COLLAPSE = register(
    Rule(
        code="R030",
        name="loss-scale-collapse",
        check="scaler",
        severity=Severity.ERROR,
        title="The dynamic loss scale is collapsing",
        why="""\
A dynamic scaler halves the scale on every overflow. Gradient overflow is fixed by a
smaller scale; an Inf produced in the *forward* pass (an activation above fp16's 65504)
is not, so the scale halves step after step towards 1 and below, every step is skipped,
and the run stops learning while it seems to go on.""",
        signs="""\
The loss scale falls on many consecutive steps; skipped steps pile up; the loss is inf or
nan on those steps.""",
        fix="""\
Find the module whose output overflows (sapper names it); keep its computation in fp32
(attention softmax, final norm, logits) or train in bf16; check the LR and the init.""",
        seed="§2.1, §2.2",
    )
)

SKIPPED_STEPS = register(
    Rule(
        code="R031",
        name="too-many-skipped-steps",
        check="scaler",
        severity=Severity.WARNING,
        title="Too many optimizer steps skipped by the loss scaler",
        why="""\
Each skipped step is compute spent without an update. A few at the start, while the
scaler calibrates, are normal; a steady share means overflow keeps happening, the
schedule runs ahead of the updates, and the scale oscillates.""",
        signs="""\
More than a few percent of steps skipped past the first steps; the scale oscillating by
2× every few steps.""",
        fix="""\
Lengthen the scaler's growth interval; find the overflowing module; consider bf16.""",
        seed="§2.2",
    )
)

SCALED_GRADS_STEP = register(
    Rule(
        code="R032",
        name="optimizer-step-on-scaled-gradients",
        check="scaler",
        severity=Severity.ERROR,
        title="The optimizer stepped on gradients still multiplied by the loss scale",
        why="""\
After scaler.scale(loss).backward() every gradient is multiplied by the scale (65536
by default). A bare optimizer.step() (instead of scaler.step(optimizer), or
without scaler.unscale_(optimizer) first) applies updates thousands of times too
large. Nothing raises an error; the loss rises in a strange way or goes NaN.""",
        signs="""\
A gradient norm of the order of the loss scale; the loss rising right after the first
steps; Adam runs look "almost fine" because Adam normalises the scale away, SGD explodes.""",
        fix="""\
Use scaler.step(optimizer) then scaler.update(); if you touch gradients first
(clipping, logging norms), call scaler.unscale_(optimizer) before.""",
        seed="§2.2",
    )
)

CLIP_BEFORE_UNSCALE = register(
    Rule(
        code="R033",
        name="clipping-before-unscale",
        check="scaler",
        severity=Severity.ERROR,
        title="Gradient clipping applied to scaled gradients (before unscale_)",
        why="""\
Clipping scaled gradients compares a norm of the order of the loss scale with a threshold
of ≈1: it always clips, and after unscaling every update is the threshold divided by the
scale, a tiny fraction of what was meant. The run crawls; nothing raises an error.""",
        signs="""\
The pre-clip gradient norm reads of the order of the loss scale; clipping engages on
every step; the loss falls far slower than a bf16/fp32 run.""",
        fix="""\
Call scaler.unscale_(optimizer) right before clip_grad_norm_, then
scaler.step(optimizer) and scaler.update().""",
        seed="§2.2, §2.3",
    )
)


class ScalerDetector(RuleDetector):
    """R030-R033 over loss_scale, skipped and the live monitor's order flags."""

    name = "scaler"
    rules = (SCALE_COLLAPSE, SKIPPED_STEPS, SCALED_GRADS_STEP, CLIP_BEFORE_UNSCALE)
    cooldown = 500

    def __init__(
        self,
        *,
        min_scale: float = 1.0,
        collapse_drops: int = 8,
        skip_window: int = 50,
        skip_min_records: int = 20,
        skip_share: float = 0.1,
        skip_grace_steps: int = 20,
        scaled_ratio: float = 0.1,
        scaled_min_scale: float = 1024.0,
        scaled_records: int = 3,
    ) -> None:
        super().__init__()
        self.min_scale = min_scale
        self.collapse_drops = collapse_drops
        self.skip_grace_steps = skip_grace_steps
        self.skip_min_records = skip_min_records
        self.skip_share = skip_share
        self.scaled_ratio = scaled_ratio
        self.scaled_min_scale = scaled_min_scale
        self.scaled_records = scaled_records
        self.prev_scale: float | None = None
        self.peak_scale: float | None = None
        self.drops = 0
        self.skips: deque[tuple[int, int]] = deque(maxlen=skip_window)
        self.prev_skipped_total: int | None = None
        self.prev_step: int | None = None
        self.first_step: int | None = None
        self.scaled_run = 0
        self.live_flags_seen = False

    def update(self, record: StepRecord) -> list[Finding]:
        step = record.step
        if self.first_step is None:
            self.first_step = step
        out = self._order_flags(record)
        out += self._collapse(record)
        out += self._skips(record)
        out += self._scaled_norm(record)
        self.prev_step = step
        return out

    def _order_flags(self, record: StepRecord) -> list[Finding]:
        extra, step = record.extra, record.step
        out: list[Finding] = []
        if "scaler_checked" in extra:
            self.live_flags_seen = True
        if extra.get("scaled_grads_step"):
            out += self.fire(
                SCALED_GRADS_STEP,
                step,
                "optimizer.step() ran on gradients still multiplied by the loss scale "
                f"{fmt(record.loss_scale)} (no scaler.unscale_/scaler.step before it)",
                value=record.loss_scale,
            )
        if extra.get("clip_before_unscale"):
            out += self.fire(
                CLIP_BEFORE_UNSCALE,
                step,
                "clip_grad_norm_ ran before scaler.unscale_: it measured a norm of "
                f"{fmt(record.grad_norm)} on gradients scaled by {fmt(record.loss_scale)}",
                value=record.grad_norm,
                threshold=record.clip_threshold,
            )
        return out

    def _collapse(self, record: StepRecord) -> list[Finding]:
        scale = record.loss_scale
        if scale is None or not math.isfinite(scale):
            return []
        self.peak_scale = max(self.peak_scale or scale, scale)
        if self.prev_scale is not None:
            self.drops = self.drops + 1 if scale < self.prev_scale else 0
        self.prev_scale = scale
        at_floor = scale <= self.min_scale and (self.peak_scale or 0) > self.min_scale
        if self.drops < self.collapse_drops and not at_floor:
            return []
        why = (
            f"fell on {self.drops} consecutive logged steps"
            if self.drops >= self.collapse_drops
            else f"reached the floor {fmt(self.min_scale)}"
        )
        return self.fire(
            SCALE_COLLAPSE,
            record.step,
            f"loss scale {fmt(scale)} (peak {fmt(self.peak_scale)}) {why}",
            value=scale,
            threshold=self.min_scale,
            peak=self.peak_scale,
        )

    def _skips(self, record: StepRecord) -> list[Finding]:
        step = record.step
        if record.skipped_total is not None:
            if self.prev_skipped_total is not None and self.prev_step is not None:
                span = max(1, step - self.prev_step)
                self.skips.append((max(0, record.skipped_total - self.prev_skipped_total), span))
            self.prev_skipped_total = record.skipped_total
        elif record.skipped is not None:
            self.skips.append((int(record.skipped), 1))
        else:
            return []
        if step - (self.first_step or 0) < self.skip_grace_steps:
            self.skips.clear()
            return []
        steps = sum(s for _, s in self.skips)
        if len(self.skips) < min(self.skip_min_records, self.skips.maxlen or 1) or steps == 0:
            return []
        skipped = sum(k for k, _ in self.skips)
        share = skipped / steps
        if share < self.skip_share:
            return []
        return self.fire(
            SKIPPED_STEPS,
            step,
            f"{skipped} of the last {steps} steps were skipped by the loss scaler "
            f"({fmt(100 * share)}%)",
            value=share,
            threshold=self.skip_share,
        )

    def _scaled_norm(self, record: StepRecord) -> list[Finding]:
        """Offline fallback: a gradient norm of the order of the loss scale."""
        if self.live_flags_seen:
            return []
        gn, scale = record.grad_norm, record.loss_scale
        if gn is None or scale is None or not (math.isfinite(gn) and math.isfinite(scale)):
            return []
        if scale >= self.scaled_min_scale and gn >= self.scaled_ratio * scale:
            self.scaled_run += 1
        else:
            self.scaled_run = 0
        if self.scaled_run < self.scaled_records:
            return []
        return self.fire(
            SCALED_GRADS_STEP,
            record.step,
            f"the gradient norm {fmt(gn)} tracks the loss scale {fmt(scale)} on "
            f"{self.scaled_run} logged steps in a row: gradients are read or applied "
            "before scaler.unscale_",
            value=gn / scale,
            threshold=self.scaled_ratio,
        )
