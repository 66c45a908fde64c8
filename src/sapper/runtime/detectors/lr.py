"""Learning rate (seed §5.2, §5.3): the applied LR against the declared schedule.

The declared schedule comes from the Plan (``schedule`` and ``optimizer.lr``). The LR a
log shows at step ``t`` may be the one used by step ``t`` or the one set for ``t+1``
(loggers differ), so a value matches when it fits the schedule at ``t-1``, ``t`` or
``t+1``. When it does not, the detector tests the usual culprits in turn: a scheduler
stepped once per micro-batch (the LR runs ``GA``× ahead), a warmup that was never
applied, and otherwise reports the expected and the actual value. The live monitor also
counts ``scheduler.step()`` calls per optimizer step (``extra["scheduler_steps"]``).
"""

from __future__ import annotations

import math

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector, fmt
from sapper.runtime.records import StepRecord

__all__ = ["LR_NO_WARMUP", "LR_OFF_SCHEDULE", "LR_PER_MICRO_BATCH", "LRDetector", "expected_lr"]

LR_OFF_SCHEDULE = register(
    Rule(
        code="R040",
        name="lr-off-schedule",
        check="lr",
        severity=Severity.WARNING,
        title="The applied learning rate departs from the declared schedule",
        why="""\
Every other hyper-parameter was tuned against the schedule you declared. A different
peak, a decay that runs too fast or never starts, or a schedule keyed on the wrong step
counter changes the training as much as a different LR would, silently.""",
        signs="""\
optimizer.param_groups[0]['lr'] differs from the schedule's value at the same step by
more than a few percent, step after step.""",
        fix="""\
Print the scheduler's LR next to the step counter; check total_steps / warmup_steps as
the scheduler received them, and that it is created after the optimizer's LR is final.""",
        seed="§5.2",
    )
)

LR_NO_WARMUP = register(
    Rule(
        code="R041",
        name="lr-warmup-not-applied",
        check="lr",
        severity=Severity.WARNING,
        title="The declared LR warmup is not applied",
        why="""\
Adam's second-moment estimates are poor in the first steps; without warmup the first
updates at full LR are too large, which Post-LN models in particular do not survive
(seed §2.4). A warmup declared but not applied is the worst case: you think you have it.""",
        signs="""\
The LR at step 0 is already the peak; loss spikes or NaN in the first hundred steps.""",
        fix="""\
Create the scheduler with the warmup (e.g. get_cosine_schedule_with_warmup) and call
scheduler.step() once per optimizer step.""",
        seed="§2.4, §5.2",
    )
)

LR_PER_MICRO_BATCH = register(
    Rule(
        code="R042",
        name="scheduler-stepped-per-micro-batch",
        check="lr",
        severity=Severity.WARNING,
        title="The LR scheduler is stepped once per micro-batch",
        why="""\
With gradient accumulation, an optimizer step spans GA micro-batches. A scheduler.step()
inside the micro-batch loop advances the schedule GA times per update: warmup ends GA×
too early and the decay reaches its floor after 1/GA of training.""",
        signs="""\
The LR reaches its peak at warmup_steps/GA and decays GA× faster than planned.""",
        fix="""\
Call scheduler.step() next to optimizer.step(), once per optimizer step (outside the
micro-batch loop).""",
        seed="§5.3",
    )
)


def expected_lr(
    step: int, *, kind: str, peak: float, warmup: int, total: int | None, min_lr: float
) -> float | None:
    """The LR a schedule sets after ``step`` scheduler steps; None for unknown kinds."""
    if step < 0:
        return None
    if warmup and step < warmup:
        return peak * step / warmup
    kind = kind.lower().replace("-", "_")
    if kind in ("constant", "constant_with_warmup", "none"):
        return peak
    if total is None or total <= warmup:
        return None
    progress = min(1.0, (step - warmup) / (total - warmup))
    if kind in ("linear", "linear_with_warmup"):
        return min_lr + (peak - min_lr) * (1.0 - progress)
    if kind in ("cosine", "cosine_with_warmup"):
        return min_lr + (peak - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return None


class LRDetector(RuleDetector):
    """R040-R042 over ``record.lr`` against a declared schedule (from a Plan)."""

    name = "lr"
    rules = (LR_OFF_SCHEDULE, LR_NO_WARMUP, LR_PER_MICRO_BATCH)
    cooldown = None

    def __init__(
        self,
        *,
        schedule: str | None = None,
        peak_lr: float | None = None,
        warmup_steps: int = 0,
        total_steps: int | None = None,
        min_lr: float = 0.0,
        grad_accum: int | None = None,
        rtol: float = 0.05,
        patience: int = 3,
    ) -> None:
        super().__init__()
        self.schedule = schedule
        self.peak_lr = peak_lr
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_lr = min_lr
        self.grad_accum = grad_accum
        self.rtol = rtol
        self.patience = patience
        self.misses = 0
        self.per_micro = 0
        self.multi_sched = 0

    def _expected(self, step: int) -> float | None:
        if self.schedule is None or self.peak_lr is None:
            return None
        return expected_lr(
            step,
            kind=self.schedule,
            peak=self.peak_lr,
            warmup=self.warmup_steps,
            total=self.total_steps,
            min_lr=self.min_lr,
        )

    def _close(self, actual: float, expected: float) -> bool:
        scale = max(abs(expected), 0.01 * (self.peak_lr or abs(expected)))
        return abs(actual - expected) <= self.rtol * scale + 1e-12

    def _fits(self, actual: float, center: int, spread: int = 1) -> bool | None:
        seen = False
        for s in range(center - spread, center + spread + 1):
            exp = self._expected(s)
            if exp is None:
                continue
            seen = True
            if self._close(actual, exp):
                return True
        return False if seen else None

    def update(self, record: StepRecord) -> list[Finding]:
        out = self._live_counter(record)
        lr, step = record.lr, record.step
        if lr is None or not math.isfinite(lr):
            return out
        fits = self._fits(lr, step)
        if fits is None:
            return out
        if fits:
            self.misses = 0
            return out
        self.misses += 1
        if self.misses < self.patience:
            return out
        ga = record.extra.get("grad_accum") or self.grad_accum
        if isinstance(ga, int) and ga > 1 and self._fits(lr, ga * step, spread=ga):
            out += self.fire(
                LR_PER_MICRO_BATCH,
                step,
                f"LR {fmt(lr)} at step {step} matches the schedule at step {ga * step} "
                f"(= GA {ga} × {step}), not at step {step} ({fmt(self._expected(step))})",
                value=lr,
                expected=self._expected(step),
                grad_accum=ga,
            )
            return out
        peak = self.peak_lr or 0.0
        if self.warmup_steps and step < self.warmup_steps and lr >= 0.9 * peak:
            out += self.fire(
                LR_NO_WARMUP,
                step,
                f"LR {fmt(lr)} at step {step} is already at the peak {fmt(peak)}; the plan "
                f"declares a {self.warmup_steps}-step warmup "
                f"(expected {fmt(self._expected(step))})",
                value=lr,
                threshold=self._expected(step),
            )
            return out
        exp = self._expected(step)
        out += self.fire(
            LR_OFF_SCHEDULE,
            step,
            f"LR {fmt(lr)} at step {step}, the declared {self.schedule} schedule gives "
            f"{fmt(exp)} (off on {self.misses} logged steps in a row)",
            value=lr,
            threshold=exp,
        )
        return out

    def _live_counter(self, record: StepRecord) -> list[Finding]:
        calls = record.extra.get("scheduler_steps")
        if not isinstance(calls, int):
            return []
        self.multi_sched = self.multi_sched + 1 if calls > 1 else 0
        if self.multi_sched < 2:
            return []
        return self.fire(
            LR_PER_MICRO_BATCH,
            record.step,
            f"scheduler.step() was called {calls} times during optimizer step {record.step}",
            value=calls,
            threshold=1,
        )
