"""Loss scaling (seed §2.2): scale collapse, skipped steps, and GradScaler misuse.

The live monitor observes the order of scaler.scale, scaler.unscale_,
clip_grad_norm_ and optimizer.step and marks a record with
extra["scaled_grads_step"] (the optimizer stepped on gradients still multiplied by
the scale) or extra["clip_before_unscale"] (clipping measured scaled gradients). From
a log alone, the signature is a gradient norm that tracks the loss scale: a real norm is
O(1), a scaled one is O(scale).

Frameworks. R030 and R031 hold for every dynamic loss scaler (torch.amp's GradScaler,
DeepSpeed's and Megatron's own). R032 and R033 are about torch-amp's GradScaler API
(the order of ``scaler.scale``, ``scaler.unscale_``, clipping and ``scaler.step``);
Megatron-LM/Megatron-DeepSpeed, DeepSpeed, the HF Trainer (through Accelerate) and
Lightning drive the scaler themselves and unscale before clipping and stepping. What
they log varies: Megatron and the HF Trainer log the unscaled norm, which on an fp16
run with a scale of 65536 merely happens to be a small fraction of the scale; DeepSpeed
ZeRO-1/2 before April 2022 (deepspeedai/DeepSpeed 56c5223) logged the norm of the
still-scaled gradients ("norm is in fact norm*scale") — the BigScience fp16 norms of
1e4–1e6 — while its optimizer stepped on unscaled ones. Either way a norm of the order
of the scale says nothing about the step there. So the offline R032 signature is read:

- ``framework="torch-amp"`` (the live monitor saw a GradScaler, or a sapper run log
  says so): a norm ≥ ``scaled_ratio`` × the scale on ``scaled_records`` logged steps in
  a row;
- ``megatron``, ``deepspeed``, ``hf-trainer``, ``lightning``: never (said by
  :meth:`ScalerDetector.unevaluated`);
- ``unknown``/``torch``: only on unambiguous evidence, a norm between ``scaled_ratio``
  and ``scaled_max_ratio`` × the scale (the scale times a plausible unscaled norm) on
  ``unknown_records`` logged steps in a row, with every loss on them finite and the
  loss not falling over them (a loop that applies scaled gradients does not learn); or,
  in a log that starts at the run's start, on ``scaled_records`` logged steps (the loss
  not falling over them either) when every gradient norm of the log sat there from its
  first one under a power-of-two scale (a GradScaler's): no unscaled norm was ever
  logged, and a run that applies scaled gradients may die within a few steps.

R033 comes only from the live monitor's hooks (``clip_before_unscale``), which are
GradScaler evidence themselves.

Calibration and cold start. A dynamic scaler starts high (torch 2^16, DeepSpeed and
Megatron up to 2^32) and halves on the first overflows until it fits: the halvings of a
log that starts at the run's beginning, before the scale ever held for three records in
a row or grew, and within the first ``calibration_steps`` steps, are calibration, not
collapse. A short excerpt from the
middle of a run (at most ``2 × collapse_drops`` scale records) cannot show
``collapse_drops`` drops; there ``cold_halvings`` (4) halvings within the last
``collapse_drops`` records, counted since the last growth, are enough. Halvings are counted
as log2 of each drop (a log written every 10 iterations shows 65536 → 8192, three
halvings, in one record), and DeepSpeed's and Megatron's hysteresis (the scale held for
a record between two halvings) does not break the count. An excerpt may begin inside the
collapse: a scale below ``min_scale`` that falls again is one on its own (no scaler
starts below 2^16), two records suffice. The skip window's grace (``skip_grace_steps``)
is for a run's first overflows only: a log that starts later may begin inside the skips.
"""

from __future__ import annotations

import math
from collections import deque
from operator import itemgetter

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector, fmt
from sapper.runtime.detectors.stats import median
from sapper.runtime.records import StepRecord

_FIRST, _SECOND = itemgetter(0), itemgetter(1)

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
and the run stops learning while it seems to go on.

Frameworks: every dynamic loss scaler: torch-amp's GradScaler, DeepSpeed's and
Megatron's fp16 scalers. bf16 and fp32 runs have no loss scale. The halvings while a
scaler calibrates at a run's start (from 2^16, or 2^32 in DeepSpeed and Megatron) are
not counted.""",
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
schedule runs ahead of the updates, and the scale oscillates.

Frameworks: every dynamic loss scaler: torch-amp, DeepSpeed and Megatron fp16 (skipped-
step flags or the skipped-iteration counts they log).""",
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
large. Nothing raises an error; the loss rises in a strange way or goes NaN.

Frameworks: torch-amp's GradScaler only. Megatron-LM and Megatron-DeepSpeed,
DeepSpeed, the HF Trainer (through Accelerate) and Lightning drive the scaler themselves
and step on unscaled gradients, whatever norm they log (the unscaled one, a small
fraction of a scale of 65536 in fp16; or, in DeepSpeed ZeRO-1/2 before April 2022, the
norm of the scaled gradients); from their logs R032 never fires. From a log of unknown
origin it fires only on unambiguous evidence (a norm of the scale × a plausible unscaled
norm for 20 logged steps with a finite loss that does not fall, or for 3 from the run's first
logged norm under a power-of-two scale, the loss not falling); the live monitor sees
the GradScaler calls themselves.""",
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
scale, a tiny fraction of what was meant. The run crawls; nothing raises an error.

Frameworks: torch-amp's GradScaler only, and only from the live monitor's hooks, which
see clip_grad_norm_ run before scaler.unscale_; no log shows that order. Megatron,
DeepSpeed, the HF Trainer and Lightning unscale before they clip.""",
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
        scaled_max_ratio: float = 100.0,
        unknown_records: int = 20,
        calibration_steps: int = 100,
        cold_halvings: int = 4,
        framework: str = "unknown",
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
        self.scaled_max_ratio = scaled_max_ratio
        self.unknown_records = unknown_records
        self.calibration_steps = calibration_steps
        self.cold_halvings = cold_halvings
        self.set_framework(framework)
        self.scale_records = 0
        self.halvings = 0
        # log2(previous / scale) of the last collapse_drops scale records (> 0: halvings)
        self.changes: deque[float] = deque(maxlen=collapse_drops)
        self.grown = False
        self.stable = 0  # consecutive records with the scale unchanged
        self.calibrated = False
        # the losses of the current run of scaled-looking norms (the last 10 windows)
        self.scaled_losses: deque[float] = deque(maxlen=10 * unknown_records)
        self.ratio_records = 0
        self.skip_records = 0
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
        if extra.keys().isdisjoint(_ORDER_FLAGS):  # the live monitor's; a log has none
            return out
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
        self.scale_records += 1
        self.peak_scale = max(self.peak_scale or scale, scale)
        prev = self.prev_scale
        if prev is not None:
            self.grown = self.grown or scale > prev
            self.stable = self.stable + 1 if scale == prev else 0
            if self.grown or self.stable >= 2:
                self.calibrated = True  # the scale fits: later drops are overflows
            if self._calibrating(record.step):
                self.drops = self.halvings = 0
                self.changes.clear()
            else:
                self.drops = self.drops + 1 if scale < prev else 0
                changes = self.changes
                change = math.log2(prev / scale) if scale > 0 and prev > 0 else 0.0
                # an unchanged scale adds a 0 and, when the window is full, drops its
                # oldest change: the halvings stay as they are when that one was a 0 too
                full = len(changes) == changes.maxlen
                same = change == 0.0 and bool(changes) and not (full and changes[0])
                changes.append(change)
                if not same:
                    self.halvings = _halvings_since_growth(changes)
        self.prev_scale = scale
        at_floor = scale <= self.min_scale and (self.peak_scale or 0) > self.min_scale
        cold = (
            self.scale_records <= 2 * self.collapse_drops
            and self.halvings >= self.cold_halvings
        )
        # Below the floor and still falling: no scaler starts there (GradScaler at 2^16,
        # DeepSpeed and Megatron at 2^16-2^32), so the log began inside the collapse.
        sinking = scale < self.min_scale and prev is not None and scale < prev
        if self.drops < self.collapse_drops and not (at_floor or cold or sinking):
            return []
        if self.drops >= self.collapse_drops:
            why = f"fell on {self.drops} consecutive logged steps"
        elif at_floor:
            why = f"reached the floor {fmt(self.min_scale)}"
        elif sinking:
            why = (
                f"is below {fmt(self.min_scale)} and still falling (from {fmt(prev)}): "
                "dynamic scalers start at 2^16 or more, so the collapse began before this "
                "log does"
            )
        else:
            why = (
                f"halved {self.halvings} times within the last {len(self.changes)} logged "
                f"steps (cold start: only {self.scale_records} loss-scale records in the log)"
            )
        return self.fire(
            SCALE_COLLAPSE,
            record.step,
            f"loss scale {fmt(scale)} (peak {fmt(self.peak_scale)}) {why}",
            value=scale,
            threshold=self.min_scale,
            peak=self.peak_scale,
        )

    def _calibrating(self, step: int) -> bool:
        """The scaler's first search for a scale that fits: the log starts at the run's
        start, the scale has neither held for three records nor grown yet, and the step
        is early (see the module doc)."""
        first = self.first_step or 0
        early = first <= self.skip_grace_steps and step < self.calibration_steps
        return early and not self.calibrated

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
        self.skip_records += 1
        first = self.first_step or 0
        if first <= self.skip_grace_steps and step - first < self.skip_grace_steps:
            # the scaler's first overflows at the run's start; an excerpt from later in a
            # run has no such grace: it may begin inside the skips.
            self.skips.clear()
            return []
        if len(self.skips) < min(self.skip_min_records, self.skips.maxlen or 1):
            return []
        # once per record over the window: the skipped counts first (C-level sums), as a
        # healthy run's are all 0 and its share is then below any positive threshold
        skipped = sum(map(_FIRST, self.skips))
        if not skipped and self.skip_share > 0:
            return []
        steps = sum(map(_SECOND, self.skips))
        if steps == 0:
            return []
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

    def _scaled_from_start(self, scale: float) -> bool:
        """Whether every gradient norm of the log so far sat at the scale times a
        plausible norm, the log starting at the run's start, under a scale a GradScaler
        keeps (a power of two): no unscaled norm was ever logged, so there is no stretch
        of healthy steps to wait for (a run that dies within a few steps)."""
        first = self.first_step if self.first_step is not None else 0
        return (
            first <= self.skip_grace_steps
            and self.scaled_run == self.ratio_records
            and _power_of_two(scale)
        )

    def _scaled_norm(self, record: StepRecord) -> list[Finding]:
        """Offline fallback: a gradient norm of the order of the loss scale, read as the
        framework allows (see the module doc)."""
        if self.live_flags_seen or self.framework in SCALER_INTERNAL:
            return []
        gn, scale = record.grad_norm, record.loss_scale
        if gn is None or scale is None or not (math.isfinite(gn) and math.isfinite(scale)):
            return []
        self.ratio_records += 1
        strict = self.framework != "torch-amp"
        high = self.scaled_max_ratio if strict else math.inf
        loss = record.loss
        if (
            scale >= self.scaled_min_scale
            and self.scaled_ratio * scale <= gn <= high * scale
            and not (strict and (loss is None or not math.isfinite(loss)))
        ):
            self.scaled_run += 1
            if strict:
                self.scaled_losses.append(loss)  # type: ignore[arg-type]
        else:
            self.scaled_run = 0
            self.scaled_losses.clear()
        early = strict and self._scaled_from_start(scale)
        need = self.unknown_records if strict and not early else self.scaled_records
        if self.scaled_run < need:
            return []
        if strict and _falling(self.scaled_losses):
            return []
        if early:
            evidence = (
                "; from the log's first gradient norm on, under a GradScaler-style scale (a "
                "power of two), so a run that dies within a few steps shows it too"
            )
        elif strict:
            evidence = (
                f"; the framework is not known, so this rests on {self.scaled_run} steps with a "
                "finite loss that does not fall"
            )
        else:
            evidence = ""
        return self.fire(
            SCALED_GRADS_STEP,
            record.step,
            f"the gradient norm {fmt(gn)} tracks the loss scale {fmt(scale)} on "
            f"{self.scaled_run} logged steps in a row: gradients are read or applied "
            f"before scaler.unscale_{evidence}",
            value=gn / scale,
            threshold=self.scaled_ratio,
        )

    def unevaluated(self) -> list[str]:
        """What R030-R033 could not look at: no loss scale or skipped-step field (normal
        for bf16/fp32 runs), and GradScaler order rules on a framework that drives the
        scaler itself or without the live monitor's hooks."""
        out = []
        if self.scale_records == 0 and self.skip_records == 0:
            out.append(
                "R030-R031 loss scaling: not evaluated — no loss_scale or skipped-step "
                "field in the log (none is expected for bf16/fp32 runs)"
            )
        if self.live_flags_seen:
            return out
        if self.framework == "torch":
            out.append("R032-R033 GradScaler order: not applicable — no GradScaler in this run")
            return out
        if self.framework in SCALER_INTERNAL:
            out.append(
                f"R032-R033 GradScaler order: not evaluated — a {self.framework} log: the "
                "framework unscales the gradients itself before clipping and stepping"
            )
            return out
        if self.ratio_records == 0:
            out.append(
                "R032 step on scaled gradients: not evaluated — needs grad_norm and "
                "loss_scale in the log, or the live monitor's GradScaler hooks"
            )
        out.append(
            "R033 clipping before unscale: not evaluated — only the live monitor's "
            "GradScaler hooks can see the order of clip_grad_norm_ and scaler.unscale_"
        )
        return out


#: The live monitor's flags on the order of the GradScaler calls, in ``extra``.
_ORDER_FLAGS = frozenset({"scaler_checked", "scaled_grads_step", "clip_before_unscale"})

#: Frameworks that drive the loss scaler themselves (never the user's GradScaler calls).
SCALER_INTERNAL = frozenset({"megatron", "deepspeed", "hf-trainer", "lightning"})


def _halvings_since_growth(changes: deque[float]) -> int:
    """Halvings (log2 of the drops) in ``changes`` after its last growth."""
    total = 0.0
    for change in reversed(changes):
        if change < 0:
            break
        total += change
    return round(total)


def _power_of_two(x: float) -> bool:
    return x > 0 and math.log2(x).is_integer()


def _falling(losses: deque[float]) -> bool:
    """Whether the loss fell over these steps: the median of the last third below 98% of
    the median of the first third."""
    xs = list(losses)
    n = len(xs) // 3
    if n == 0:
        return False
    return median(xs[-n:]) < 0.98 * median(xs[:n])
