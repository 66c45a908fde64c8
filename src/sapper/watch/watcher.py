"""The watch loop: new records from a follower go through the detectors, findings go out.

One :class:`Watcher` owns one follower and one :class:`DetectorSet` built from the same
``default_detectors`` the live monitor and ``sapper analyze`` use, so a finding means
the same thing in all three. Each tick reads what the log gained, feeds every new record
to the detectors once (their state carries over from tick to tick; nothing is read
again) and hands records, findings and notes to the sinks (the live view, the findings
file, ``--exec``).

Latency: a record is read at the first poll after it was written. Readers that merge
several lines into one step hold the newest step until a later step shows it complete;
when the writer has been quiet for ``settle`` seconds (a fraction of the poll interval,
measured from the file's modification time) the watcher releases it, waking early for
that if needed, so a finding appears at most one poll interval after the record that
shows it, even when it is the last record the job ever writes. Such an early wake first
asks the follower whether the writer wrote since (:meth:`Follower.pending`, a ``stat``):
if it did, the next step's line releases the held step, so the watcher sleeps on to the
regular poll — a job that writes all the time is read once per poll interval, not at
every settle deadline.

Cost: at 1,000 records a second nearly all of the watcher's CPU is the detectors'
per-record work. A poll's records go through them detector by detector
(:meth:`DetectorSet.update_batch`), which keeps each detector's code and state hot
across the batch; and :meth:`Watcher.run` keeps the objects the process holds from its
start (imported modules, the plan) out of the garbage collector's full collections for
the watch (``gc.freeze``; undone when it returns) unless the process froze objects
itself.
"""

from __future__ import annotations

import gc
import itertools
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from sapper.errors import InputError
from sapper.logs.analysis import WARM_RECORDS
from sapper.logs.base import gc_paused
from sapper.plan.schema import Plan
from sapper.rules.model import Finding, Severity
from sapper.rules.registry import select_rules
from sapper.runtime.detector import Detector, DetectorSet

# Imported here, not on first use: loading the detector modules takes a noticeable part
# of a second, which must not delay the first finding.
from sapper.runtime.detectors import default_detectors
from sapper.runtime.detectors.eval import EvalLossDetector
from sapper.runtime.records import StepRecord
from sapper.watch.follow import Follower

__all__ = ["WatchResult", "WatchSink", "Watcher", "watch_detectors"]


def watch_detectors(plan: Plan | None) -> list[Detector]:
    """The monitor's default detectors for ``plan``, plus the eval-loss detector (as
    ``sapper analyze`` runs them)."""
    detectors = list(default_detectors(plan=plan))
    if not any(isinstance(d, EvalLossDetector) for d in detectors):
        detectors.append(EvalLossDetector())
    return detectors


@dataclass
class WatchResult:
    """What a watch saw, when it stopped and why."""

    path: str
    format: str | None
    records: int
    first_step: int | None
    last_step: int | None
    findings: list[Finding]
    #: "idle" (no new data for --idle-timeout), "input ended" (a pipe closed),
    #: "interrupted" (Ctrl-C) or "stopped" (by the caller).
    reason: str
    notes: list[str] = field(default_factory=list)
    #: Attempts seen: a restart from a checkpoint starts the next one.
    attempts: int = 1

    def count(self, severity: Severity) -> int:
        return sum(f.severity == severity for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "records": self.records,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "reason": self.reason,
            "attempts": self.attempts,
            "errors": self.count(Severity.ERROR),
            "warnings": self.count(Severity.WARNING),
            "infos": self.count(Severity.INFO),
            "notes": self.notes,
        }


class WatchSink:
    """Receives what the watcher sees; every method does nothing unless overridden."""

    def start(self, watcher: Watcher) -> None:
        """Before the first poll."""

    def records(self, records: list[StepRecord]) -> None:
        """New records, in step order, before the findings they trigger."""

    def finding(self, finding: Finding) -> None:
        """A new finding (after --select/--ignore), the moment it fires."""

    def note(self, text: str) -> None:
        """Something the user should know about the log or the follower."""

    def tick(self, watcher: Watcher) -> None:
        """After each poll (views refresh here)."""

    def end(self, result: WatchResult) -> None:
        """The watch stopped; ``result`` holds everything it found."""


class Watcher:
    """Follows one log and runs the detectors over it incrementally."""

    def __init__(
        self,
        follower: Follower,
        *,
        plan: Plan | None = None,
        detectors: Callable[[Plan | None], list[Detector]] = watch_detectors,
        select: Iterable[str] = (),
        ignore: Iterable[str] = (),
        poll: float = 1.0,
        idle_timeout: float = 600.0,
        settle: float | None = None,
        sinks: Iterable[WatchSink] = (),
    ) -> None:
        if not poll > 0:
            raise InputError("must be positive", field="--poll", value=poll,
                             expected="seconds between two looks at the log, e.g. 1.0")
        if not idle_timeout >= 0:
            raise InputError("must not be negative", field="--idle-timeout", value=idle_timeout,
                             expected="seconds without new data before stopping (0: never)")
        self.follower = follower
        self.plan = plan
        self.make_detectors = detectors
        self.select, self.ignore = list(select), list(ignore)
        self.poll_s = poll
        self.idle_timeout = idle_timeout
        #: Quiet time after which held-back steps are released (default: a quarter poll).
        self.settle_s = settle if settle is not None else min(0.25 * poll, 0.5)
        self.sinks = list(sinks)
        self.started = time.monotonic()
        self.records = 0
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.findings: list[Finding] = []
        self.notes: list[str] = []
        self.detector_set: DetectorSet | None = None
        self._keys: set[tuple[Any, ...]] = set()
        #: The attempt being watched (a restarted log starts the next one).
        self.attempt = 1
        self._parser: Any = None
        self._index = 0  # records of the current parser consumed so far
        self._prev_step: int | None = None
        self._lineage: deque[StepRecord] = deque(maxlen=WARM_RECORDS)
        self._data_mark: float | None = None
        self._settled = True
        self._notes_seen = 0
        self._stored_seen = 0
        self._failed_seen: set[str] = set()
        self._interrupted = False
        self._sleeping = False
        #: The last tick's wait ends before the regular poll, only to release held steps.
        self._settle_wake = False
        self._next_poll = 0.0  # monotonic time of the regular poll after the last tick
        #: Still reading what the log held when the watch started (see :meth:`tick`);
        #: findings fired meanwhile were in the log before the watch (``--exec`` skips
        #: them unless ``--exec-existing``). A pipe holds nothing from before.
        self.catching_up = not getattr(follower, "live", False)

    # ---- one poll ---------------------------------------------------------------------
    def tick(self) -> float:
        """Read what the log gained and run the detectors; return the seconds to wait.

        The cyclic garbage collector is paused for the poll (:func:`gc_paused`): a poll
        builds thousands of records and values without cycles, which the collector would
        otherwise walk a few dozen times; one collection after the poll finds the same
        garbage."""
        with gc_paused():
            return self._tick()

    def _tick(self) -> float:
        fol = self.follower
        self._settle_wake = False
        self._next_poll = time.monotonic() + self.poll_s
        self._consume(fol.poll())
        if fol.last_data != self._data_mark:
            self._data_mark, self._settled = fol.last_data, False
        if not self._settled and not fol.behind and fol.quiet_since is not None:
            if time.monotonic() - fol.quiet_since >= self.settle_s:
                self._consume(fol.settle())
                self._settled = True
        caught_up = self.catching_up and not fol.behind
        if caught_up:
            # Everything the log held at the start is read: release the step the reader
            # holds back too (a crashed run's last line is often its NaN), so its
            # findings count as already in the log, however old the file.
            self._consume(fol.settle())
            self._settled = True
        self._drain_side()
        for sink in self.sinks:
            sink.tick(self)
        if caught_up:
            self.catching_up = False  # whatever fires from now on is new
        if fol.behind:
            return 0.0
        if not self._settled and fol.quiet_since is not None:
            due = fol.quiet_since + self.settle_s - time.monotonic()
            if due < self.poll_s:
                self._settle_wake = True
                return max(0.01, due)
        return self.poll_s

    def stop_reason(self) -> str | None:
        """Why following should stop now, or ``None`` to go on."""
        if self.follower.ended:
            return "input ended"
        if self.idle_timeout > 0:
            since = self.follower.last_data or self.started
            if time.monotonic() - since >= self.idle_timeout:
                return "idle"
        return None

    def run(self, stop: threading.Event | None = None) -> WatchResult:
        """Follow until idle, end of input, Ctrl-C or ``stop`` is set; then finish.

        Ctrl-C never cuts a poll in half (the detectors' state and the counts stay whole):
        during a poll it only marks the watch as interrupted; while waiting it ends the
        wait at once. A second Ctrl-C interrupts whatever runs, the closing included."""
        stop = stop or threading.Event()
        for sink in self.sinks:
            sink.start(self)
        reason = "stopped"
        previous = self._catch_sigint()
        # what exists now outlives the watch: full collections need not walk it again
        frozen = gc.get_freeze_count() == 0
        if frozen:
            gc.freeze()
        try:  # the handler is restored however the watch ends (an input refused too)
            try:
                while True:
                    wait = self.tick()
                    why = "interrupted" if self._interrupted else self.stop_reason()
                    if why is not None:
                        reason = why
                        break
                    if self._sleep(stop, wait):
                        break
                    if self._settle_wake and self.follower.pending():
                        # the writer wrote since: its next step releases the held one
                        if self._sleep(stop, self._next_poll - time.monotonic()):
                            break
            except KeyboardInterrupt:
                reason = "interrupted"
                self._interrupted = True  # a second Ctrl-C stops the closing too
            return self.close(reason)
        finally:
            if frozen:
                gc.unfreeze()
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _sleep(self, stop: threading.Event, seconds: float) -> bool:
        """Wait ``seconds`` (Ctrl-C ends the wait at once); True when ``stop`` was set."""
        self._sleeping = True
        try:
            return stop.wait(max(0.0, seconds))
        finally:
            self._sleeping = False

    def _catch_sigint(self) -> Any:
        """Install the Ctrl-C handler (main thread only); return the one it replaces."""
        if threading.current_thread() is not threading.main_thread():
            return None

        def on_sigint(signum: int, frame: Any) -> None:
            if self._sleeping or self._interrupted:
                raise KeyboardInterrupt
            self._interrupted = True

        return signal.signal(signal.SIGINT, on_sigint)

    def close(self, reason: str = "stopped") -> WatchResult:
        """Release what the reader held back, let the detectors finish, tell the sinks."""
        self._consume(self.follower.close())
        if self.detector_set is not None:
            for finding in self.detector_set.finish():
                self._emit(finding)
        self._drain_side()
        result = WatchResult(
            path=self.follower.name,
            format=self.follower.format,
            records=self.records,
            first_step=self.first_step,
            last_step=self.last_step,
            findings=list(self.findings),
            reason=reason,
            notes=list(self.notes),
            attempts=self.attempt,
        )
        for sink in self.sinks:
            sink.end(result)
        return result

    # ---- internals --------------------------------------------------------------------
    def _consume(self, records: list[StepRecord]) -> None:
        if not records:
            return
        if self.detector_set is None:
            self.detector_set = DetectorSet(self._detectors(records))
        for sink in self.sinks:
            sink.records(records)
        starts = self._attempt_starts()
        # Runs of records between attempt starts go through the detectors a run at a time
        # (DetectorSet.update_batch: the same findings, in the same order, faster).
        first, end = self._index, self._index + len(records)
        cuts = sorted(k - first for k in starts if first < k < end)
        for a, b in itertools.pairwise([0, *cuts, len(records)]):
            number = starts.get(self._index)
            if number is not None:
                self._new_attempt(number, records[a])
            run = records[a:b]
            self._index += len(run)
            for found in self.detector_set.update_batch(run):
                if found:  # the findings in record order, as record by record
                    for finding in found:
                        self._emit(finding)
            self._prev_step = run[-1].step
            self._lineage.extend(run[-WARM_RECORDS:])
        self.records += len(records)
        if self.first_step is None:
            self.first_step = records[0].step
        top = max(r.step for r in records)
        self.last_step = top if self.last_step is None else max(self.last_step, top)

    def _attempt_starts(self) -> dict[int, int]:
        """Index of the parser's records where a later attempt starts -> its number."""
        parser = self.follower.parser
        if parser is not self._parser:
            self._parser, self._index = parser, 0  # a new reader counts from its start
        if parser is None:
            return {}
        return {a.start: a.number for a in parser.attempts if a.number > self.attempt}

    def _new_attempt(self, number: int, rec: StepRecord) -> None:
        """The log restarted (a rollback and resume): the attempt that ended is finished,
        the next one gets fresh detectors, as ``sapper analyze`` runs it."""
        assert self.detector_set is not None
        for finding in self.detector_set.finish():
            self._emit(finding)
        self.attempt = number
        self.detector_set = DetectorSet(self._detectors([rec]))
        # As sapper analyze does: the history the attempt resumes from, seen but not
        # reported, so a resumed run is not judged as a run at its start.
        kept = [r for r in self._lineage if r.step < rec.step]
        self._lineage = deque(kept, maxlen=WARM_RECORDS)
        for old in kept:
            self.detector_set.update(old)
        self.note(
            f"the run restarted: step {rec.step:,} follows step {self._prev_step:,}; attempt "
            f"{number} is watched with fresh detectors"
        )
    def _detectors(self, records: list[StepRecord]) -> list[Detector]:
        """Fresh detectors for the plan, told the framework the log shows so far (meta,
        format, first records), as ``sapper analyze`` does."""
        from sapper.logs.framework import framework_from

        detectors = self.make_detectors(self._plan())
        framework = framework_from(self.follower.meta, self.follower.format, records)
        for det in detectors:
            det.set_framework(framework)
        return detectors

    def _plan(self) -> Plan | None:
        if self.plan is not None:
            return self.plan
        raw = self.follower.meta.get("plan")
        if not isinstance(raw, dict):
            return None
        try:
            return Plan.model_validate(raw)
        except ValidationError as exc:
            self.note(
                f"the plan stored in the run log is not valid and was ignored "
                f"({exc.error_count()} error(s))"
            )
            return None

    def _emit(self, finding: Finding) -> None:
        if self.attempt > 1 and "attempt" not in finding.data:
            finding = finding.model_copy(update={"data": {**finding.data, "attempt": self.attempt}})
        data = finding.data
        key = (finding.code, finding.step, finding.rank, data.get("attempt"), data.get("eval_set"))
        if key in self._keys:
            return
        self._keys.add(key)
        if not select_rules({finding.code}, self.select, self.ignore):
            return
        if not finding.source:
            finding = finding.model_copy(update={"source": self.follower.name})
        self.findings.append(finding)
        for sink in self.sinks:
            sink.finding(finding)

    def note(self, text: str) -> None:
        """Tell the user something (kept in the result, passed to every sink)."""
        self.notes.append(text)
        for sink in self.sinks:
            sink.note(text)

    def _drain_side(self) -> None:
        """Findings stored in the log, the reader's notes, the follower's events."""
        fol = self.follower
        stored = fol.findings
        for finding in stored[self._stored_seen :]:
            self._emit(finding)
        self._stored_seen = len(stored)
        notes = fol.notes
        for text in notes[self._notes_seen :]:
            self.note(text)
        self._notes_seen = len(notes)
        for text in fol.events:
            self.note(text)
        fol.events.clear()
        if self.detector_set is not None:
            for name, error in self.detector_set.failed.items():
                if name not in self._failed_seen:
                    self._failed_seen.add(name)
                    self.note(f"detector {name} failed and was skipped ({error}); a bug in sapper")
