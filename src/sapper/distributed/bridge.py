"""What the live :class:`~sapper.monitor.Monitor` calls when it runs under torch.distributed.

The monitor reads its device accumulators into step records every ``log_every`` steps —
and earlier on one rank when a fault makes it look closer. The cross-rank exchange must
happen at the *same* step on every rank, so it is tied to the step count, not to reads:
:meth:`MonitorBridge.due` tells the monitor to read at each boundary, and
:meth:`MonitorBridge.on_records` feeds every read to the rank's tracker and exchanges
once a boundary is reached, before the records go to the detectors and the run log (so
rank 0's last record carries the per-rank table and the job's numbers).

Quick steps stretch the cadence: an exchange costs a few milliseconds of host time
whatever the step, so on steps of a few milliseconds one every ``every`` steps would be
a large share of each. The exchange runs every ``every`` steps, or every
``min_interval_s`` seconds (1 by default) when that is more steps, up to
``MAX_STRETCH`` × ``every``. At one a second its amortised cost on 10–20 ms steps
stays near 0.1 ms per step (twice that at two a second: a fifth of the monitor's 1 ms
per-step budget); what it finds (a straggler, a rank's NaN, replicas drifting apart)
names the same rank and step, at most a second later, and a lost or hung rank is seen
between exchanges by the heartbeat's lost-rank watcher. The stretch is decided from the
step times just exchanged, which every rank holds alike, so every rank takes the next
exchange at the same step.
``min_interval_s=0`` keeps the cadence at exactly ``every`` steps.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as dist

from sapper.distributed.tracker import RankTracker
from sapper.plan.schema import Plan
from sapper.rules.model import Finding
from sapper.runtime.records import StepRecord

__all__ = ["DEFAULT_MIN_INTERVAL_S", "MonitorBridge"]

#: Seconds between exchanges on quick steps, unless ``distributed={"min_interval_s": ...}``.
DEFAULT_MIN_INTERVAL_S = 1.0


class MonitorBridge:
    """One rank's cross-rank checks inside the monitor."""

    #: The most steps an exchange is put off by quick steps, as a multiple of ``every``
    #: (steps that turn slow after a quick window are not left unchecked for long).
    MAX_STRETCH = 5

    def __init__(
        self,
        tracker: RankTracker,
        every: int,
        start_step: int = 0,
        min_interval_s: float = DEFAULT_MIN_INTERVAL_S,
    ) -> None:
        self.tracker = tracker
        self.every = int(every)
        self.min_interval_s = float(min_interval_s)
        #: Steps from one exchange to the next (``every``, or more on quick steps).
        self.interval = self.every
        self._next = start_step + self.every

    @classmethod
    def attach(
        cls,
        model: Any,
        plan: Plan | None = None,
        *,
        every: int = 20,
        start_step: int = 0,
        options: dict[str, Any] | None = None,
    ) -> MonitorBridge | None:
        """A bridge when a process group of two or more ranks is initialized, else None.
        Collective: every rank must create its monitor at the same point."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        opts = dict(options or {})
        every = int(opts.pop("every", every))
        min_interval_s = opts.pop("min_interval_s", DEFAULT_MIN_INTERVAL_S)
        if not isinstance(min_interval_s, (int, float)) or not 0 <= min_interval_s < math.inf:
            from sapper.errors import InputError

            raise InputError(
                "must be a number of seconds",
                field="distributed.min_interval_s",
                value=min_interval_s,
                expected="a number ≥ 0 (0: exchange every `every` steps exactly)",
            )
        opts.setdefault("start_step", start_step)
        tracker = RankTracker(model, plan=plan, every=every, **opts)
        return cls(tracker, every, start_step, float(min_interval_s))

    @property
    def rank(self) -> int:
        return self.tracker.rank

    @property
    def is_main(self) -> bool:
        """Rank 0 prints and writes the main run log; the other ranks keep quiet."""
        return self.tracker.ctx.is_main

    def due(self, next_step: int) -> bool:
        """A boundary is reached: the monitor should read now (on every rank)."""
        return self.tracker.active and next_step >= self._next

    def on_records(self, records: Sequence[StepRecord], next_step: int) -> list[Finding]:
        """Records the monitor just read; exchanges at a boundary. Findings for this rank
        to report (rank 0, or the lowest surviving rank for a lost rank)."""
        self.tracker.add_records(records)
        if next_step < self._next:
            return []
        found = self.tracker.exchange(records[-1] if records else None)
        self.interval = self._interval()
        self._next = next_step + self.interval
        if found and not self.is_main:
            # rank 0 is gone (the only case another rank reports): say it here, once
            for f in found:
                print(f"sapper [rank {self.rank}] {f.code}: {f.message}", file=sys.stderr)
        return found

    def _interval(self) -> int:
        """Steps to the next exchange, from the exchanged table's slowest step time (the
        same numbers on every rank, so the same answer on every rank)."""
        table = self.tracker.last_table
        if self.min_interval_s <= 0 or table is None:
            return self.every
        try:
            step_s = table.job().col("step_time_s").max
        except Exception:  # a table without step times: the plain cadence
            return self.every
        if not (isinstance(step_s, (int, float)) and math.isfinite(step_s) and step_s > 0):
            return self.every
        wanted = math.ceil(self.min_interval_s / step_s)
        return max(self.every, min(self.every * self.MAX_STRETCH, wanted))

    def listen(self, on_finding: Callable[[list[Finding]], None]) -> None:
        """Findings made outside the exchange (at start, or by the lost-rank watcher
        thread) go to ``on_finding`` at once: host work only, safe from any thread."""
        self.tracker.listen(on_finding)

    def close(self) -> None:
        self.tracker.close()
