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
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector
from sapper.runtime.records import StepRecord

__all__ = ["DATA_CYCLE", "DUPLICATE_SAMPLES", "DuplicateDataDetector"]

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
    """R070-R071 over ``extra["sample_hashes"]`` (and ``extra["epoch"]`` when known)."""

    name = "data"
    rules = (DUPLICATE_SAMPLES, DATA_CYCLE)
    cooldown = 200

    def __init__(self, *, capacity: int = 200_000, confirm_steps: int = 3) -> None:
        super().__init__()
        self.capacity = capacity
        self.confirm_steps = confirm_steps
        self._seen: OrderedDict[int, int] = OrderedDict()
        self._pending: list[_Pending] = []
        self.epoch: Any = None
        self.samples_seen = 0

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
        raw = record.extra.get("sample_hashes")
        epoch = record.extra.get("epoch")
        if epoch is not None and epoch != self.epoch:
            if self.epoch is not None:
                self._restart()
                self._pending.clear()
            self.epoch = epoch
        if not isinstance(raw, list) or not raw:
            return []
        hashes = [h for h in (_as_int(x) for x in raw) if h is not None]
        step = record.step
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
        out: list[Finding] = []
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
        return self.fire(
            DATA_CYCLE,
            events[0].step,
            f"from step {events[0].step} every sample is one seen before: the data "
            f"repeats after {distinct} distinct samples (a new epoch)",
            value=distinct,
        )


def _steps(steps: list[int], limit: int = 6) -> str:
    shown = ", ".join(str(s) for s in steps[:limit])
    return shown + (f" … (+{len(steps) - limit})" if len(steps) > limit else "")
