"""Loss (seed §5.2): non-finite, spikes, no progress, oscillation.

The spike test is robust and warmup-aware: a loss is a spike when it stands more than
``k`` robust standard deviations (1.4826·MAD) *and* a minimum relative margin above the
median of a rolling window of recent losses. A fixed multiplier alone (3× the running
mean) misses spikes on a low loss and fires on a noisy high one; a frozen reference (the
first 100 steps) goes stale as the loss falls. During the LR warmup the loss falls fast
and the window lags, so the threshold is doubled there.

Cold start: a log excerpt pasted from a chronicle or an issue often holds 5–20 records
around the event, too few for the robust window. With fewer than ``min_history`` losses
a loss still counts as a spike when it is large in absolute terms: at least
``cold_ratio`` (1.5×) the reference *and* ``cold_min_jump`` (0.5, in the loss's own unit:
nats for a cross-entropy) above it, the reference being the larger of the previous loss
and the median of the few before. ×1.5 is below the jumps of the spikes in the public
BigScience chronicles (tr1-13B: lm loss 2.77 → 7.34, ×2.6; tr8-104B: 3.11 → 7.71, ×2.5,
and 3.68 → 7.27, ×2.0; tests/fixtures/logs) with room for a smaller spike; the
absolute margin keeps the noisy first steps of a run from step 0 (10.9 → 11.3 as Adam
starts) and the batch noise of a low fine-tuning loss (0.3 → 0.5) quiet. The larger of
the two references means a loss that first fell fast and then bounced back a little is
not a spike either. A loss that climbs instead of jumping counts too, once it has risen
on each of the last ``cold_climb`` (3) records to ``cold_ratio``× the lowest loss of the
short history and ``cold_min_jump`` above it (tr8-104B's second glitch of Experiment 1:
6.37 → 6.60 → 7.31 → 9.12 → 10.24 over 40 iterations, no single step ×1.5).
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import deque
from typing import ClassVar

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector, fmt
from sapper.runtime.detectors.stats import RollingRobust, median
from sapper.runtime.records import StepRecord

__all__ = ["LOSS_FLAT", "LOSS_NONFINITE", "LOSS_OSCILLATING", "LOSS_SPIKE", "LossDetector"]

LOSS_NONFINITE = register(
    Rule(
        code="R001",
        name="loss-non-finite",
        check="loss",
        severity=Severity.ERROR,
        title="The loss is NaN or Inf",
        why="""\
Once a NaN reaches the loss, the backward pass spreads it into every gradient and, without
a loss scaler that skips the step, the optimizer writes it into every weight: the run is
lost from that step on. In fp16 the usual cause is an activation above 65504 (overflow)
a few layers before the loss; otherwise a too-high LR, a log/div of zero or bad data.

Frameworks: any. The loss as logged: under a dynamic loss scaler (torch-amp, DeepSpeed,
Megatron fp16) R030/R031 tell whether the scaler recovers from the overflow.""",
        signs="""\
Loss spikes and rising gradient norms in the steps before; a loss scale that keeps
halving; the loss printed as nan or inf.""",
        fix="""\
Stop and restore the last good checkpoint; find the first module whose output went
non-finite (sapper names it when the monitor is attached); lower the LR, enable clipping,
switch fp16 to bf16 or enable dynamic loss scaling.""",
        seed="§2.1",
    )
)

LOSS_SPIKE = register(
    Rule(
        code="R002",
        name="loss-spike",
        check="loss",
        severity=Severity.WARNING,
        title="Loss spike far above its recent level",
        why="""\
A sudden jump of the loss means one update moved the weights far: a bad batch, an LR
too high for the current curvature, or an fp16 overflow in progress. Repeated spikes are
the usual prelude to divergence.

Frameworks: any. The loss as logged: an HF Trainer loss is averaged over logging_steps
and a Megatron lm loss over log-interval iterations, which makes a one-step spike look
smaller.""",
        signs="""\
The loss jumps several robust standard deviations above its rolling median, often with
a gradient-norm surge at the same step.""",
        fix="""\
Check the batch at that step; lower the LR or lengthen warmup; enable gradient clipping
(≈1.0); if spikes repeat, restore a checkpoint before the first one and skip its data.""",
        seed="§5.2",
    )
)

LOSS_FLAT = register(
    Rule(
        code="R003",
        name="loss-not-decreasing",
        check="loss",
        severity=Severity.WARNING,
        title="The loss is not decreasing in the first steps",
        why="""\
In the first few hundred steps a healthy run's loss falls at a visible slope. A flat or
rising loss there means the updates do not reach the weights: LR far too low, a frozen
model, labels that do not match the inputs, or data the model cannot learn from.

Frameworks: any; needs the run's first steps in the log.""",
        signs="""\
The loss stays at its initial level (for a language model near ln(vocab size)) or
rises, while the gradient norm looks normal.""",
        fix="""\
Check the LR actually applied (print optimizer.param_groups[i]['lr']), that parameters
require grad and are in the optimizer, and that labels are the inputs shifted by one.""",
        seed="§5.2",
    )
)

LOSS_OSCILLATING = register(
    Rule(
        code="R004",
        name="loss-oscillating",
        check="loss",
        severity=Severity.WARNING,
        title="The loss oscillates with a large amplitude",
        why="""\
A loss that swings up and down by a large fraction of its value from step to step means
the updates overshoot: the LR is too high for the batch size, or the batch is too small
for the gradient noise, and clipping is not damping it.

Frameworks: any.""",
        signs="""\
Consecutive differences alternate in sign most of the time and their typical size is a
large fraction of the loss itself (and at least 0.05 in the loss's unit: a fine-tuning
loss of 0.01 that doubles between logs is batch noise).""",
        fix="""\
Lower the LR, raise the (effective) batch size, or enable gradient clipping at ≈1.0.""",
        seed="§5.2",
    )
)


class LossDetector(RuleDetector):
    """R001-R004 over ``record.loss``."""

    name = "loss"
    rules = (LOSS_NONFINITE, LOSS_SPIKE, LOSS_FLAT, LOSS_OSCILLATING)
    cooldown = 100
    #: No progress is a property of the run's start: said once.
    cooldowns: ClassVar[dict[str, int | None]] = {"R003": None}

    def __init__(
        self,
        *,
        window: int = 50,
        min_history: int = 10,
        spike_k: float = 6.0,
        spike_rel: float = 0.1,
        warmup_steps: int = 0,
        flat_steps: int = 100,
        flat_min_drop: float = 0.01,
        flat_horizon: int = 1000,
        osc_window: int = 30,
        osc_flips: float = 0.7,
        osc_amplitude: float = 0.25,
        osc_min_swing: float = 0.05,
        cold_ratio: float = 1.5,
        cold_min_jump: float = 0.5,
        cold_climb: int = 3,
    ) -> None:
        super().__init__()
        self.window = window
        self.min_history = min_history
        self.spike_k = spike_k
        self.spike_rel = spike_rel
        self.warmup_steps = warmup_steps
        self.flat_steps = flat_steps
        self.flat_min_drop = flat_min_drop
        self.flat_horizon = flat_horizon
        self.osc_window = osc_window
        self.osc_flips = osc_flips
        self.osc_amplitude = osc_amplitude
        self.osc_min_swing = osc_min_swing
        self.cold_ratio = cold_ratio
        self.cold_min_jump = cold_min_jump
        self.cold_climb = cold_climb
        self.recent: deque[float] = deque(maxlen=max(window, osc_window))
        self.reference = RollingRobust(window)
        # The oscillation test's window and, per consecutive pair of differences in it,
        # whether they have opposite signs, with a running count: the share of flips is
        # then O(1) per record, and the window is scanned only when it is high.
        self.osc_last: float | None = None
        self.osc_diff: float | None = None
        self.osc_flip_flags: deque[bool] = deque(maxlen=max(0, osc_window - 2))
        self.osc_flip_count = 0
        self.first: list[float] = []
        self.first_step: int | None = None
        self.nonfinite_steps = 0
        self.finite_count = 0
        self.last_step: int | None = None

    def update(self, record: StepRecord) -> list[Finding]:
        loss, step = record.loss, record.step
        if loss is None:
            return []
        if not math.isfinite(loss):
            self.nonfinite_steps += 1
            return self.fire(
                LOSS_NONFINITE,
                step,
                f"loss is {loss} at step {step}"
                + (f" (last finite loss {fmt(self.recent[-1])})" if self.recent else ""),
                value=loss,
            )
        self.last_step = step
        recent = self.recent
        if len(self.reference.values) >= self.min_history:
            out = self._spike(loss, step)
        else:
            out = self._cold_spike(loss, step)
        self.finite_count += 1
        recent.append(loss)
        self.reference.add(loss)
        self._count_flip(loss)
        if self.first_step is None:
            self.first_step = step
        if len(self.first) < 5:
            self.first.append(loss)
        if step - self.first_step <= self.flat_horizon:  # silent past its horizon
            out += self._flat(step)
        osc = self.osc_window
        if step >= self.warmup_steps and len(recent) >= osc:
            # the counted direction changes first: too few and there is nothing to test
            if osc < 2 or self.osc_flip_count / max(1, osc - 2) >= self.osc_flips:
                out += self._oscillation(step)
        return out

    def _spike(self, loss: float, step: int) -> list[Finding]:
        reference = self.reference
        n = len(reference.values)
        if n < self.min_history:
            return []
        med = reference.level()
        if loss <= med + self.spike_rel * abs(med):  # below the smallest possible margin
            return []
        sigma = self.reference.sigma()
        k = self.spike_k * (2.0 if step < self.warmup_steps else 1.0)
        margin = max(k * sigma, self.spike_rel * abs(med))
        if loss <= med + margin:
            return []
        z = (loss - med) / sigma if sigma > 0 else math.inf
        return self.fire(
            LOSS_SPIKE,
            step,
            f"loss {fmt(loss)} at step {step} is {fmt(z)}σ above the median {fmt(med)} "
            f"of the last {n} logged steps (threshold {fmt(med + margin)})",
            value=loss,
            threshold=med + margin,
            median=med,
            robust_sigma=sigma,
        )

    def _cold_spike(self, loss: float, step: int) -> list[Finding]:
        """The spike test while the window holds fewer than ``min_history`` losses: a jump
        of ``cold_ratio``× and ``cold_min_jump`` over the reference (see the module doc)."""
        n = len(self.reference)
        if n == 0:
            return []
        ref = max(self.recent[-1], median(self.recent))  # recent = the whole short history
        if ref <= 0 or loss < self.cold_ratio * ref or loss - ref < self.cold_min_jump:
            return self._cold_climb(loss, step)
        what = (
            f"is {fmt(loss / ref)}× the loss before it ({fmt(ref)}); cold start: only {n} "
            f"earlier logged step(s), the jump alone exceeds ×{fmt(self.cold_ratio)}"
        )
        return self._cold_fire(loss, step, ref, what)

    def _cold_fire(self, loss: float, step: int, ref: float, what: str) -> list[Finding]:
        return self.fire(
            LOSS_SPIKE,
            step,
            f"loss {fmt(loss)} at step {step} {what}",
            value=loss,
            threshold=max(self.cold_ratio * ref, ref + self.cold_min_jump),
            median=ref,
            cold_start=True,
        )

    def _cold_climb(self, loss: float, step: int) -> list[Finding]:
        """The cold-start test of a loss that climbs over a few records rather than jumping
        (see the module doc)."""
        k = self.cold_climb
        if len(self.recent) < k:
            return []
        tail = [*list(self.recent)[-k:], loss]
        if any(b <= a for a, b in itertools.pairwise(tail)):
            return []
        low = min(self.recent)
        if low <= 0 or loss < self.cold_ratio * low or loss - low < self.cold_min_jump:
            return []
        what = (
            f"has climbed to {fmt(loss / low)}× the lowest earlier loss ({fmt(low)}), rising "
            f"at each of its last {k} logged steps; cold start: only {len(self.reference)} "
            "earlier logged step(s)"
        )
        return self._cold_fire(loss, step, low, what)

    def unevaluated(self) -> list[str]:
        """What R001-R004 could not look at: no loss at all, too few losses for the robust
        spike window or the oscillation window, or a log that does not show the run's
        first steps (R003 is about the start)."""
        if self.finite_count == 0 and self.nonfinite_steps == 0:
            return ["R001-R004 loss: not evaluated — the log has no loss"]
        out = []
        if self.finite_count <= self.min_history:
            out.append(
                f"R002 loss spike: not evaluated by the robust test — {self.finite_count} "
                f"finite loss record(s), needs {self.min_history + 1}; only the cold-start "
                f"check ran (a jump of ×{fmt(self.cold_ratio)} and "
                f"+{fmt(self.cold_min_jump)} over the previous loss)"
            )
        first, last = self.first_step, self.last_step
        if first is not None and last is not None:
            start = max(self.flat_steps, self.warmup_steps)
            if first > self.flat_horizon:
                out.append(
                    f"R003 loss not decreasing: not evaluated — the log starts at step "
                    f"{first}, after the first {self.flat_horizon} steps the rule looks at"
                )
            elif last - first < start or self.finite_count < 10:
                out.append(
                    f"R003 loss not decreasing: not evaluated — the log covers "
                    f"{last - first} step(s) and {self.finite_count} loss record(s) from its "
                    f"start, needs {start} steps and 10 records"
                )
        if self.finite_count < self.osc_window:
            out.append(
                f"R004 loss oscillating: not evaluated — {self.finite_count} loss record(s), "
                f"needs {self.osc_window}"
            )
        return out

    def _flat(self, step: int) -> list[Finding]:
        if self.first_step is None or len(self.first) < 3 or len(self.recent) < 10:
            return []
        elapsed = step - self.first_step
        start = max(self.flat_steps, self.warmup_steps)
        if elapsed < start or elapsed > self.flat_horizon:
            return []
        # The loss at the first record is the one before any update; the median of the
        # first few guards against one noisy batch. Take the lower: a loss that jumps in
        # the first steps (LR too high) must come back below where it started.
        ref = min(self.first[0], median(self.first))
        tail = list(self.recent)[-max(5, len(self.recent) // 5) :]
        now = median(tail)
        drop = (ref - now) / abs(ref) if ref else 0.0
        if drop >= self.flat_min_drop:
            return []
        verb = "rose" if drop < 0 else "barely moved"
        return self.fire(
            LOSS_FLAT,
            step,
            f"loss {verb} from {fmt(ref)} to {fmt(now)} over the first {elapsed} steps "
            f"({fmt(100 * drop)}% drop, expected at least {fmt(100 * self.flat_min_drop)}%)",
            value=drop,
            threshold=self.flat_min_drop,
            initial=ref,
            current=now,
        )

    def _count_flip(self, loss: float) -> None:
        last, self.osc_last = self.osc_last, loss
        if last is None:
            return
        diff, prev = loss - last, self.osc_diff
        self.osc_diff = diff
        if prev is None:
            return
        flips = self.osc_flip_flags
        if flips.maxlen == 0:
            return
        if len(flips) == flips.maxlen:
            self.osc_flip_count -= flips[0]
        flip = prev * diff < 0
        flips.append(flip)
        self.osc_flip_count += flip

    def _swing_too_small(self) -> bool:
        """Whether the window's range already rules an oscillation out, read from the
        spike window's sorted order without a median: every difference of the last
        ``osc_window`` losses is at most the range of the last ``window`` (when that holds
        them all), so the typical swing is too; and their median is at least the lowest.
        So a range under ``osc_min_swing``, or (all losses positive) a range under
        ``osc_amplitude`` of the lowest, means the swing or the amplitude test fails
        (rounding is monotone, so the bound holds for the computed values too)."""
        ordered = self.reference.sorted
        if self.window < self.osc_window or not ordered:
            return False  # the spike window does not hold the oscillation window
        low = ordered[0]
        spread = ordered[-1] - low
        return spread < self.osc_min_swing or (low > 0 and spread / low < self.osc_amplitude)

    def _oscillation(self, step: int) -> list[Finding]:
        """R004 on a full window past the warmup, called by :meth:`update` once (for a
        window of 2 or more) the counted direction changes reach ``osc_flips``."""
        if self.osc_window >= 2:
            # The flips among the window's differences are the last osc_window - 2 counted.
            flip_share = self.osc_flip_count / max(1, self.osc_window - 2)
            if self._swing_too_small():
                return []
            xs = list(self.recent)[-self.osc_window :]
            diffs = list(map(operator.sub, xs[1:], xs[:-1]))
        else:
            xs = list(self.recent)[-self.osc_window :]
            diffs = [b - a for a, b in itertools.pairwise(xs)]
            flips = sum(1 for a, b in itertools.pairwise(diffs) if a * b < 0)
            flip_share = flips / max(1, len(diffs) - 1)
        level = abs(median(xs))
        swing = median(list(map(abs, diffs)))
        amplitude = swing / level if level else 0.0
        if flip_share < self.osc_flips or amplitude < self.osc_amplitude:
            return []
        if swing < self.osc_min_swing:
            return []  # a tiny loss (0.01) swinging ×2 is batch noise, not overshooting
        return self.fire(
            LOSS_OSCILLATING,
            step,
            f"over the last {len(xs)} logged steps the loss changed direction "
            f"{fmt(100 * flip_share)}% of the time with a typical swing of "
            f"{fmt(100 * amplitude)}% of its level {fmt(level)}",
            value=amplitude,
            threshold=self.osc_amplitude,
            flip_share=flip_share,
        )
