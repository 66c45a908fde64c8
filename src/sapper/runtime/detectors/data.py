"""Duplicated data (seed §5.3): the same samples served again within an epoch.

Each record may carry ``extra["sample_hashes"]``: one 64-bit fingerprint per sample of the
step (hex strings or ints; the live monitor computes them on the device, see
:mod:`sapper.monitor.fingerprint`). The detector keeps the last ``capacity`` fingerprints
with the step that first served them (bounded memory).

A repeat alone is not a bug: every new epoch repeats the data. The two differ in what
follows. After an epoch boundary *every* later sample is a repeat; a broken sampler that
serves a batch twice goes on serving new samples around the repeats. So a repeat is
reported once a later step (within ``confirm_steps``) brings never-seen samples; a stream
that keeps repeating is taken as a new epoch (reported once, as info) and the window
restarts. When records carry ``extra["epoch"]`` the window restarts at each new epoch
instead.

A new epoch is expected; the same handful of batches served over and over is not (a loader
that cycles a few cached batches, a dataset that loads one shard, ``itertools.cycle`` over
a short list): the model memorises them. R072 names it when either

* the cycle is short and keeps coming back: its distinct samples amount to at most
  ``short_cycle_steps`` (64) optimizer steps, and it has started its ``min_passes``-th
  (4th) pass. Up to about four passes over repeated data train nearly as well as fresh
  data (Muennighoff et al. 2023, "Scaling Data-Constrained Language Models") and
  fine-tuning recipes rarely run more than three epochs over a small set; a cycle of at
  most 64 steps is shorter than any real pre-training or fine-tuning set at its batch
  size, and shorter than the windows the loss detectors judge trends over. A real
  epoch over a dataset of more than 64 steps stays R071 however often it repeats. The
  plan's ``schedule.total_steps`` brings the warning forward to the first repeat when
  the planned run would serve the short cycle ``min_passes`` times or more;
* or the plan declares the dataset (``data.num_samples``, or ``data.num_tokens`` over
  ``batch.seq_len``) and the data repeats after less than ``declared_fraction`` (half)
  of this rank's share of it (the declared size over the data-parallel degree): the
  loader reads a fraction of the data, whatever its length.

A training loss below ``memorised_loss`` (0.1 nats per token, under the entropy of any
natural text or code corpus) on the repeated data, and an eval loss rising while the
training loss falls (records' ``eval_loss``), are what memorisation looks like: they
are named in the message, and when they appear after the warning it is repeated once
with them.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector
from sapper.runtime.records import StepRecord

__all__ = ["DATA_CYCLE", "DATA_SHORT_CYCLE", "DUPLICATE_SAMPLES", "DuplicateDataDetector"]

DUPLICATE_SAMPLES = register(
    Rule(
        code="R070",
        name="duplicate-samples",
        check="data",
        severity=Severity.WARNING,
        title="The same samples are served again within an epoch",
        why="""\
A pipeline bug (a sampler not re-seeded per rank or per epoch, a resumed run replaying
its data, a shard listed twice) repeats batches. The model memorises them: the loss falls
fast and looks great while generalisation suffers, and nothing raises an error.

Frameworks: any loop the live monitor watches (per-sample fingerprints); not readable
from a log.""",
        signs="""\
A training loss falling faster than the eval loss; identical sample ids or identical
token sequences at different steps; loss dips at the repeated steps.""",
        fix="""\
Check the sampler (DistributedSampler with set_epoch each epoch, a distinct seed per
rank), the shard list, and how a resumed run skips the data it already consumed.""",
        seed="§5.3",
    )
)

DATA_CYCLE = register(
    Rule(
        code="R071",
        name="data-epoch-boundary",
        check="data",
        severity=Severity.INFO,
        title="The data started repeating as a whole (a new epoch)",
        why="""\
Repeating the whole dataset is a new epoch: expected for multi-epoch training, a surprise
when the plan assumed one pass over a much larger dataset.

Frameworks: any loop the live monitor watches (per-sample fingerprints); not readable
from a log.""",
        signs="""\
From one step on, every sample is one seen before.""",
        fix="""\
If the dataset should be larger, check the shard list and the number of samples the
loader actually reads.""",
        seed="§5.3",
    )
)


DATA_SHORT_CYCLE = register(
    Rule(
        code="R072",
        name="data-short-cycle",
        check="data",
        severity=Severity.WARNING,
        title="The data repeats in a short cycle: a few batches served over and over",
        why="""\
A loader that cycles over a handful of cached batches, reads one shard instead of the
whole dataset, or wraps a short list in itertools.cycle serves the same samples again and
again. The model memorises them: the training loss falls towards zero, far below the
entropy of real data, while the eval loss rises, and nothing raises an error.

Frameworks: any loop the live monitor watches (per-sample fingerprints); not readable
from a log.""",
        signs="""\
Few distinct batches over many steps; the same samples in the same order every few
steps; a training loss collapsing towards 0 while the eval loss turns up.""",
        fix="""\
Check the loader: the dataset length and shard list, that the iterator is not a cached
list or itertools.cycle over a few batches, and the sampler's epoch length. Overfitting
one batch on purpose (a debugging step) is fine.""",
        seed="§5.3",
    )
)


@dataclass
class _Pending:
    step: int
    repeats: list[tuple[int, int]] = field(default_factory=list)  # (hash, first step)
    total: int = 0
    hashes: list[int] = field(default_factory=list)


def _as_int(h: Any) -> int | None:
    if isinstance(h, int):
        return h
    if isinstance(h, str):
        try:
            return int(h, 16)
        except ValueError:
            return None
    return None


class DuplicateDataDetector(RuleDetector):
    """R070-R072 over ``extra["sample_hashes"]`` (and ``extra["epoch"]`` when known),
    with the losses of those records and any ``eval_loss`` for R072's evidence."""

    name = "data"
    rules = (DUPLICATE_SAMPLES, DATA_CYCLE, DATA_SHORT_CYCLE)
    cooldown = 200
    cooldowns: ClassVar[dict[str, int | None]] = {"R072": None}

    def __init__(
        self,
        *,
        capacity: int = 200_000,
        confirm_steps: int = 3,
        short_cycle_steps: int = 64,
        min_passes: int = 4,
        dataset_samples: int | None = None,
        declared_fraction: float = 0.5,
        total_steps: int | None = None,
        memorised_loss: float = 0.1,
    ) -> None:
        super().__init__()
        self.capacity = capacity
        self.confirm_steps = confirm_steps
        self.short_cycle_steps = short_cycle_steps
        self.min_passes = min_passes
        self.dataset_samples = dataset_samples
        self.declared_fraction = declared_fraction
        self.total_steps = total_steps
        self.memorised_loss = memorised_loss
        self._seen: OrderedDict[int, int] = OrderedDict()
        self._pending: list[_Pending] = []
        self.epoch: Any = None
        self.samples_seen = 0
        #: Records with fingerprints, their distinct batches (capped at ``capacity``).
        self.hashed_steps = 0
        self.first_step: int | None = None
        self._batches: set[int] = set()
        #: Data boundaries found so far (the data started over), and the short cycle.
        self.boundaries = 0
        self.cycle: dict[str, Any] = {}
        self.evidence_reported = False
        self.train_losses: list[tuple[int, float]] = []
        self.evals: list[tuple[int, float, float | None]] = []  # step, eval, train then

    def unevaluated(self) -> list[str]:
        """R070-R071 read per-sample fingerprints, which the live monitor computes."""
        if self.samples_seen:
            return []
        return [
            "R070-R071 duplicated data: not evaluated — needs per-sample fingerprints "
            "(the live monitor's sample_hashes)"
        ]

    def _remember(self, h: int, step: int) -> None:
        self._seen[h] = step
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)

    def _restart(self) -> None:
        self._seen.clear()

    def update(self, record: StepRecord) -> list[Finding]:
        extra = record.extra
        if record.eval_loss is None and "sample_hashes" not in extra and "epoch" not in extra:
            return []  # no sample hashes, no epoch, no evaluation: nothing to read
        raw = record.extra.get("sample_hashes")
        epoch = record.extra.get("epoch")
        if epoch is not None and epoch != self.epoch:
            if self.epoch is not None:
                self._restart()
                self._pending.clear()
            self.epoch = epoch
        out: list[Finding] = []
        if isinstance(record.eval_loss, float) and math.isfinite(record.eval_loss):
            train = self.train_losses[-1][1] if self.train_losses else None
            self.evals.append((record.step, record.eval_loss, train))
            if len(self.evals) > 1024:  # bounded: the best evaluation and the latest ones
                best = min(self.evals, key=lambda e: e[1])
                self.evals = [best, *[e for e in self.evals[-512:] if e is not best]]
            out += self._memorising(record.step)
        if not isinstance(raw, list) or not raw:
            return out
        hashes = [h for h in (_as_int(x) for x in raw) if h is not None]
        step = record.step
        self.hashed_steps += 1
        if self.first_step is None:
            self.first_step = step
        if len(self._batches) < self.capacity:
            self._batches.add(hash(tuple(hashes)))
        if isinstance(record.loss, float) and math.isfinite(record.loss):
            self.train_losses.append((step, record.loss))
            del self.train_losses[:-64]
        cur = _Pending(step=step, total=len(hashes), hashes=hashes)
        new = 0
        for h in hashes:
            first = self._seen.get(h)
            if first is None:
                new += 1
                self._remember(h, step)
            else:
                cur.repeats.append((h, first))
        self.samples_seen += len(hashes)
        if new and self._pending:
            out += self._confirm(step)
        if cur.repeats:
            self._pending.append(cur)
            if not new and step - self._pending[0].step >= self.confirm_steps:
                out += self._epoch()
        return out

    def _confirm(self, step: int) -> list[Finding]:
        events, self._pending = self._pending, []
        repeats = [r for e in events for r in e.repeats]
        steps = [e.step for e in events]
        firsts = sorted({first for _, first in repeats})
        whole = [e.step for e in events if len(e.repeats) == e.total]
        what = f"{len(repeats)} sample(s) at step(s) {_steps(steps)}"
        what += f" repeat samples first served at step(s) {_steps(firsts)}"
        if whole:
            what += f"; whole batch repeated at step(s) {_steps(whole)}"
        return self.fire(
            DUPLICATE_SAMPLES,
            steps[0],
            what + f" (confirmed at step {step}: new samples kept coming, not a new epoch)",
            value=len(repeats),
            repeat_steps=steps,
            first_steps=firsts,
        )

    def _epoch(self) -> list[Finding]:
        events, self._pending = self._pending, []
        distinct = len(self._seen)
        self._restart()
        for e in events:
            for h in e.hashes:
                self._remember(h, e.step)
        start = events[0].step
        self.boundaries += 1
        short = self._short_cycle(start, distinct)
        if short or self.cycle.get("distinct") == distinct:
            return short  # the short cycle, named once: its later passes are not epochs
        return self.fire(
            DATA_CYCLE,
            start,
            f"from step {start} every sample is one seen before: the data "
            f"repeats after {distinct} distinct samples (a new epoch)",
            value=distinct,
        )

    def _short_cycle(self, start: int, distinct: int) -> list[Finding]:
        """R072 at a data boundary: a short cycle back for its ``min_passes``-th pass (or
        planned to be), or an epoch far shorter than the declared dataset."""
        if self.fired.get(DATA_SHORT_CYCLE.code) is not None:
            return []
        per_step = self.samples_seen / max(1, self.hashed_steps)
        cycle_steps = distinct / per_step if per_step else float("inf")
        # The pass starting at ``start``: boundaries are confirmed ``confirm_steps`` after
        # a repeat, so a cycle shorter than that is counted by its length, not by them.
        span = start - (self.first_step if self.first_step is not None else start)
        passes = max(self.boundaries + 1, int(span / cycle_steps + 1e-9) + 1 if span else 1)
        why = ""
        if self.dataset_samples and distinct < self.declared_fraction * self.dataset_samples:
            why = (
                f"the plan declares {self.dataset_samples} samples for this rank, "
                f"{distinct / self.dataset_samples:.1%} of them were served before the "
                "data started over"
            )
        elif cycle_steps <= self.short_cycle_steps:
            planned = self.total_steps / cycle_steps if self.total_steps else 0.0
            if passes >= self.min_passes:
                why = f"pass {passes} over it began at step {start}"
            elif planned >= self.min_passes:
                why = (
                    f"the plan's {self.total_steps} steps would serve it {planned:.0f} times"
                )
        if not why:
            return []
        batches = len(self._batches)
        self.cycle = {
            "distinct": distinct,
            "cycle_steps": cycle_steps,
            "batches": batches,
            "steps": self.hashed_steps,
            "start": start,
        }
        return self.fire(
            DATA_SHORT_CYCLE,
            start,
            f"the data repeats in a short cycle: {distinct} distinct samples every "
            f"{_n(cycle_steps, 'step')} ({_n(batches, 'distinct batch')} over the "
            f"{self.hashed_steps} steps fingerprinted since step {self.first_step}); {why}"
            + self._evidence(),
            value=distinct,
            threshold=round(self.short_cycle_steps * per_step),
            cycle_steps=cycle_steps,
            distinct_batches=batches,
            steps=self.hashed_steps,
            passes=passes,
        )

    def _evidence(self) -> str:
        """What memorisation of the repeated data looks like, as far as it shows."""
        parts = []
        low = min((v for _, v in self.train_losses), default=None)
        if low is not None and low < self.memorised_loss:
            parts.append(
                f"the training loss fell to {low:.3g}, below any plausible entropy floor of "
                "real data"
            )
        rising = self._eval_rising()
        if rising:
            parts.append(rising)
        if not parts:
            return ""
        return "; " + " and ".join(parts) + ": the model memorises the repeated batches"

    def _eval_rising(self) -> str:
        """'eval loss rose from a to b since step s while the training loss fell', or ''."""
        if len(self.evals) < 2:
            return ""
        best = min(self.evals, key=lambda e: e[1])
        last = self.evals[-1]
        if last[0] <= best[0] or last[1] <= best[1] * 1.02:
            return ""
        if best[2] is not None and last[2] is not None and last[2] >= best[2]:
            return ""  # the training loss did not fall meanwhile: not memorisation
        return (
            f"the eval loss rose from {best[1]:.3g} (step {best[0]}) to {last[1]:.3g} "
            f"(step {last[0]}) while the training loss fell"
        )

    def _memorising(self, step: int) -> list[Finding]:
        """After R072, the eval loss turning up is reported once, with the cycle."""
        if not self.cycle or self.evidence_reported or not self._eval_rising():
            return []
        self.evidence_reported = True
        self.fired.pop(DATA_SHORT_CYCLE.code, None)
        c = self.cycle
        return self.fire(
            DATA_SHORT_CYCLE,
            step,
            f"memorisation confirmed: {self._evidence()[2:]}; the data repeats every "
            f"{c['cycle_steps']:.3g} steps ({c['distinct']} distinct samples, first "
            f"repeated at step {c['start']})",
            value=c["distinct"],
            cycle_steps=c["cycle_steps"],
        )


def _n(count: float, noun: str) -> str:
    """'1 step', '4 steps', '2.5 steps', '1 distinct batch', '4 distinct batches'."""
    plural = noun + ("es" if noun.endswith("h") else "s")
    return f"{count:.3g} {noun if count == 1 else plural}"


def _steps(steps: list[int], limit: int = 6) -> str:
    shown = ", ".join(str(s) for s in steps[:limit])
    return shown + (f" … (+{len(steps) - limit})" if len(steps) > limit else "")
