"""Learning rate (seed §5.2, §5.3): the applied LR against the declared schedule.

The declared schedule comes from the Plan (``schedule`` and ``optimizer.lr``). The LR a
log shows at step ``t`` may be the one used by step ``t`` or the one set for ``t+1``
(loggers differ), so a value matches when it fits the schedule at ``t-1``, ``t`` or
``t+1``. When it does not, the detector tests the usual culprits in turn: a scheduler
stepped once per micro-batch (the LR runs ``GA``× ahead), a warmup that was never
applied, and otherwise reports the expected and the actual value. The live monitor also
counts ``scheduler.step()`` calls per optimizer step (``extra["scheduler_steps"]``).

Without a plan the LR series still has a shape to check (R043, R044):

- R043: the warmup, visible as a ramp from the log's start to a peak, ends far earlier
  than the run goes on. Published recipes warm up over 0.1–10% of training: GPT-3 375M
  of 300B tokens (0.125%, Brown et al. 2020, table 2.1 and §B), BERT 10k of 1M steps
  (1%), HF fine-tuning recipes ``warmup_ratio`` 0.03–0.1; for Adam, Ma & Yarats (2021,
  "On the adequacy of untuned warmup for adaptive optimization") suggest about
  2/(1−β2) steps (2000 for β2 = 0.999, 40 for β2 = 0.95). So a short warmup alone is
  common practice and is not flagged; a warmup under ``warmup_min_share`` (0.02%, six
  times below GPT-3's) of the steps the run has reached — 10 steps of a 100k-step run —
  is the signature of a warmup given in the wrong unit (samples, tokens or micro-batches
  taken as steps; a ratio taken as a count), or of a scheduler stepped per micro-batch.
- R044: a decay that runs past its end: an LR that went negative (a linear schedule
  extrapolated past its total without a clamp: gradient ascent), that reached ≈0 (under
  ``overrun_floor``, 2% of its peak: a cyclic schedule's floor is usually higher) and
  rises again gradually (a cosine stepped past its total comes back up; a restart
  jumps, and is not flagged), or that sits at exactly 0 for a stretch of the run
  (a clamped linear schedule whose total was shorter than the run).
- R045 (with a declared decaying schedule): the LR stays flat where the schedule falls
  (``scheduler.step()`` never called, a constant scheduler, the scheduler on another
  optimizer).

Frameworks: none; the LR is the one the optimizer applies, whoever logs it.
"""

from __future__ import annotations

import math

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector, fmt
from sapper.runtime.records import StepRecord

__all__ = [
    "LR_FLAT",
    "LR_NO_WARMUP",
    "LR_OFF_SCHEDULE",
    "LR_OVERRUN",
    "LR_PER_MICRO_BATCH",
    "LR_WARMUP_SHORT",
    "LRDetector",
    "expected_lr",
]

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
counter changes the training as much as a different LR would, silently.

Frameworks: any; needs the declared schedule (a plan).""",
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
(seed §2.4). A warmup declared but not applied is the worst case: you think you have it.

Frameworks: any; needs the declared warmup (a plan).""",
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
too early and the decay reaches its floor after 1/GA of training.

Frameworks: any. From a log it needs the declared schedule and gradient accumulation (a
plan); live, the monitor counts scheduler.step() calls per optimizer step (a loop that
steps the scheduler itself; the HF Trainer, Lightning, DeepSpeed and Megatron step it
once per optimizer step).""",
        signs="""\
The LR reaches its peak at warmup_steps/GA and decays GA× faster than planned.""",
        fix="""\
Call scheduler.step() next to optimizer.step(), once per optimizer step (outside the
micro-batch loop).""",
        seed="§5.3",
    )
)


LR_WARMUP_SHORT = register(
    Rule(
        code="R043",
        name="lr-warmup-far-too-short",
        check="lr",
        severity=Severity.WARNING,
        title="The LR warmup ends far earlier than the run's length suggests",
        why="""\
Warmup lengths in published recipes are 0.1–10% of training (GPT-3 0.125%, BERT 1%,
fine-tuning warmup_ratio 0.03–0.1), or about 2/(1−β2) steps for Adam. A warmup that
ends after a few dozen steps of a run of hundreds of thousands is usually not a choice
but a unit mistake: warmup given in samples, tokens or micro-batches and read as steps,
a warmup_ratio read as a count, or a scheduler stepped per micro-batch. The first
full-LR updates then meet Adam's unsettled second-moment estimates.

Frameworks: none; read from the LR series alone.""",
        signs="""\
The logged LR ramps from ≈0 to its peak within the first few records, in a log whose
step count (or declared total) is thousands of times longer; loss spikes early in
training.""",
        fix="""\
Check the warmup as the scheduler received it (steps, not samples or tokens; for
Megatron --lr-warmup-iters vs --lr-warmup-samples; for the HF Trainer warmup_steps vs
warmup_ratio) and that scheduler.step() runs once per optimizer step.""",
        seed="§2.4, §5.2",
    )
)

LR_OVERRUN = register(
    Rule(
        code="R044",
        name="lr-schedule-past-its-end",
        check="lr",
        severity=Severity.WARNING,
        title="The LR schedule ran past its end",
        why="""\
A schedule is built for a number of steps. When training runs longer (a total computed
for fewer epochs or without gradient accumulation, a scheduler stepped per
micro-batch), the schedule leaves its domain: a cosine comes back up towards the peak
at the end of training, a linear decay goes negative (gradient ascent) or is clamped at
0 and the remaining steps train nothing.

Frameworks: none; read from the LR series alone.""",
        signs="""\
The LR reaches ≈0 and then rises again smoothly, goes below 0, or stays at exactly 0
while steps keep being logged.""",
        fix="""\
Give the scheduler the real number of optimizer steps (epochs × batches per epoch ÷
gradient accumulation), step it once per optimizer step, and clamp a custom schedule at
its floor.""",
        seed="§5.2, §5.3",
    )
)

LR_FLAT = register(
    Rule(
        code="R045",
        name="lr-flat-despite-schedule",
        check="lr",
        severity=Severity.WARNING,
        title="The LR stays flat where the declared schedule changes",
        why="""\
A declared decay that never happens leaves the LR at its peak for the whole run: the
final loss is worse than planned and late training is noisy. The usual causes are a
scheduler.step() that is never called, a scheduler built on another optimizer, or a
constant scheduler where a decaying one was meant.

Frameworks: none; needs the declared schedule (a plan).""",
        signs="""\
optimizer.param_groups[0]['lr'] has the same value on every logged step while the plan
declares a cosine or linear decay.""",
        fix="""\
Call scheduler.step() once per optimizer step, check that the scheduler wraps the
optimizer that trains, and that its type is the declared one.""",
        seed="§5.2",
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
    """R040-R042 and R045 over ``record.lr`` against a declared schedule (from a Plan);
    R043-R044 from the shape of the LR series alone."""

    name = "lr"
    rules = (
        LR_OFF_SCHEDULE,
        LR_NO_WARMUP,
        LR_PER_MICRO_BATCH,
        LR_WARMUP_SHORT,
        LR_OVERRUN,
        LR_FLAT,
    )
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
        warmup_min_share: float = 0.0002,
        overrun_floor: float = 0.02,
        overrun_rise: float = 0.05,
        restart_jump: float = 0.25,
        zero_records: int = 5,
        zero_share: float = 0.02,
        flat_drop: float = 0.1,
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
        self.warmup_min_share = warmup_min_share
        self.overrun_floor = overrun_floor
        self.overrun_rise = overrun_rise
        self.restart_jump = restart_jump
        self.zero_records = zero_records
        self.zero_share = zero_share
        self.flat_drop = flat_drop
        self.misses = 0
        self.per_micro = 0
        self.multi_sched = 0
        # the LR series' shape (R043, R044)
        self.lr_records = 0
        self.first_step: int | None = None
        self.first_lr: float | None = None
        self.prev_lr: float | None = None
        self.peak: float = 0.0
        self.peak_step: int | None = None
        self.warmup_end: int | None = None  # the step the ramp from the start peaked at
        self.ramp_open = True
        self.trough: float | None = None
        self.rise_run = 0
        self.rise_from: float | None = None
        self.zero_run = 0
        self.zero_since: int | None = None
        # the LR past the declared warmup (R045)
        self.flat_lr: float | None = None
        self.flat_from: int | None = None
        self.flat_broken = False

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
        # the live monitor's counter; a log record has none
        out = self._live_counter(record) if "scheduler_steps" in record.extra else []
        lr, step = record.lr, record.step
        if lr is None or not math.isfinite(lr):
            return out
        self.lr_records += 1
        out += self._warmup_shape(lr, step)
        out += self._overrun(lr, step)
        self.prev_lr = lr
        if self.schedule is None or self.peak_lr is None:
            return out  # no declared schedule: nothing to track or fit (_fits gives None)
        self._track_flat(lr, step)
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
        if self._flat_so_far():  # R045 names this case once the schedule fell enough
            return out + self._flat(lr, step)
        out += self.fire(
            LR_OFF_SCHEDULE,
            step,
            f"LR {fmt(lr)} at step {step}, the declared {self.schedule} schedule gives "
            f"{fmt(exp)} (off on {self.misses} logged steps in a row)",
            value=lr,
            threshold=exp,
        )
        return out

    def _warmup_shape(self, lr: float, step: int) -> list[Finding]:
        """R043: a ramp from the log's start that peaked at ``warmup_end``, in a run that
        has gone (or is declared to go) on past ``warmup_end / warmup_min_share``."""
        if self.first_step is None:
            self.first_step, self.first_lr = step, lr
        if lr > self.peak:
            self.peak, self.peak_step = lr, step
        elif self.ramp_open and self.prev_lr is not None and lr <= self.prev_lr:
            self.ramp_open = False  # the LR stopped rising: the ramp, if any, ended
            first, start_lr, top = self.first_step, self.first_lr or 0.0, self.peak_step
            ramp = top is not None and top > first and start_lr <= 0.5 * self.peak
            if ramp and top is not None and first <= 0.5 * top:
                self.warmup_end = top
        end = self.warmup_end
        if end is None or LR_WARMUP_SHORT.code in self.fired:  # said once per run
            return []
        run = max(step, self.total_steps or 0) - (self.first_step or 0)
        if end > self.warmup_min_share * run:
            return []
        return self.fire(
            LR_WARMUP_SHORT,
            step,
            f"the LR ramps up to {fmt(self.peak)} by step {end}, "
            f"{fmt(100 * end / run)}% of the {run:,} steps the run has reached "
            f"(published warmups are 0.1-10% of training): check the warmup's unit and "
            f"that the scheduler steps once per optimizer step",
            value=end,
            threshold=self.warmup_min_share * run,
            run_steps=run,
        )

    def _overrun(self, lr: float, step: int) -> list[Finding]:
        """R044: the LR went negative, sits at 0 for a stretch, or rose again gradually
        after decaying to ≈0 (see the module doc)."""
        if lr < 0:
            return self.fire(
                LR_OVERRUN,
                step,
                f"LR {fmt(lr)} at step {step} is negative: the schedule ran past its end "
                "without a clamp (the optimizer now climbs the loss)",
                value=lr,
                threshold=0.0,
            )
        peak = self.peak
        if peak <= 0 or LR_OVERRUN.code in self.fired:  # said once per run
            return []
        if lr == 0 and self.prev_lr is not None and (self.prev_lr > 0 or self.zero_run):
            self.zero_run += 1
            self.zero_since = self.zero_since if self.zero_since is not None else step
        elif lr != 0:
            self.zero_run, self.zero_since = 0, None
        if self.zero_run >= self.zero_records and self.zero_since is not None:
            span = step - self.zero_since
            if span >= self.zero_share * (step - (self.first_step or 0)):
                return self.fire(
                    LR_OVERRUN,
                    step,
                    f"the LR has been exactly 0 since step {self.zero_since} ({span:,} steps, "
                    f"{self.zero_run} logged): the schedule ended before the run did",
                    value=0.0,
                    threshold=0.0,
                    since=self.zero_since,
                )
        prev = self.prev_lr
        if prev is None:
            return []
        if self.peak_step == step:  # a new high (warmup, a restart): the decay starts over
            self.trough, self.rise_run, self.rise_from = None, 0, None
            return []
        if self.trough is None or lr < self.trough:
            self.trough = lr
        if self.trough > self.overrun_floor * peak:
            return []  # not decayed to ≈0 (yet)
        if lr - prev > self.restart_jump * peak:  # a warm restart jumps: a new cycle
            self.trough, self.rise_run, self.rise_from = None, 0, None
            return []
        if lr > prev:
            self.rise_run += 1
            self.rise_from = self.trough if self.rise_from is None else self.rise_from
        else:
            self.rise_run, self.rise_from = 0, None
            return []
        low = self.rise_from if self.rise_from is not None else self.trough
        if self.rise_run < 3 or lr - low < self.overrun_rise * peak:
            return []
        return self.fire(
            LR_OVERRUN,
            step,
            f"the LR decayed to {fmt(low)} ({fmt(100 * low / peak)}% of its peak {fmt(peak)}) "
            f"and rises again, smoothly, to {fmt(lr)} at step {step}: a schedule stepped "
            "past its total (a cosine coming back up)",
            value=lr,
            threshold=low + self.overrun_rise * peak,
            trough=low,
        )

    def _track_flat(self, lr: float, step: int) -> None:
        """Whether the LR has kept one value since the declared warmup ended (R045)."""
        if self.schedule is None or step < self.warmup_steps:
            return
        if self.flat_lr is None:
            self.flat_lr, self.flat_from = lr, step
        elif abs(lr - self.flat_lr) > 1e-6 * max(abs(self.flat_lr), 1e-30):
            self.flat_broken = True

    def _flat_so_far(self) -> bool:
        """The LR has kept one value on every record past the declared warmup."""
        return not self.flat_broken and self.flat_from is not None

    def _flat(self, lr: float, step: int) -> list[Finding]:
        """R045: off the declared schedule because the LR never moved past the warmup
        while the schedule fell by ``flat_drop`` of its peak."""
        if not self._flat_so_far() or not self.peak_lr:
            return []
        start, now = self._expected(self.flat_from), self._expected(step)
        if start is None or now is None or start - now < self.flat_drop * self.peak_lr:
            return []
        return self.fire(
            LR_FLAT,
            step,
            f"the LR has stayed at {fmt(lr)} from step {self.flat_from} to {step}; the "
            f"declared {self.schedule} schedule falls from {fmt(start)} to {fmt(now)} "
            "over that span (scheduler.step() not called, or not on this optimizer)",
            value=lr,
            threshold=now,
            since=self.flat_from,
        )

    def unevaluated(self) -> list[str]:
        """What R040-R045 could not look at: no LR in the log, no declared schedule, no
        warmup ramp visible from the run's start."""
        if self.lr_records == 0:
            return ["R040-R045 learning rate: not evaluated — the log has no lr"]
        out = []
        if self.schedule is None or self.peak_lr is None:
            out.append(
                "R040-R042, R045 LR against the schedule: not evaluated — no declared "
                "schedule (a plan with optimizer.lr and schedule, or --lr/--warmup)"
            )
        if self.warmup_end is None and "R043" not in self.fired:
            first = self.first_step or 0
            if self.ramp_open and self.lr_records > 1 and (self.first_lr or 0) < self.peak:
                why = "the LR is still rising at the end of the log (the warmup is not over)"
            elif first > 0 and (self.first_lr or 0) > 0.5 * self.peak:
                why = f"the log starts at step {first}"
            else:
                why = "no warmup ramp from the log's start"
            out.append(f"R043 warmup length: not evaluated — {why}")
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
