"""Throughput (seed §5.1 item 7, §5.2): below expectation, degrading, waiting for data,
step-time outliers.

Step time is wall time from one step to the next, data wait included; the data wait is
the time the loop spent between the end of one step and the start of the next forward
(fetching the batch). The first ``warmup_steps`` of a run are skipped: allocation,
compilation and caches make them slow on every healthy run. A log that starts after the
run's first ``run_start_steps`` (100) steps (an excerpt) has no such steps to skip.

Wall-clock numbers are noisy: on a shared machine a neighbour's job slows a run for a
while and goes away. So R060-R062 are decided on *episodes* (:class:`Episode`): a
stretch of consecutive records on which the condition holds (throughput below the plan,
below ``degrade`` × its early level, data wait above ``data_share``), each condition on
a rolling median or share so that single slow steps (R063's business) do not start one.

- onset: the condition held on ``onset_records`` consecutive records → an *info*
  finding ("not sustained yet");
- sustained: it held on ``sustain_records`` records *and*, when the records carry step
  times, for ``sustain_s`` seconds of wall time (a neighbour's burst is minutes, not ten
  of them) → the rule's *warning*, saying it has not recovered so far;
- still holding at the end of the stream, over at least ``sustain_share`` (a quarter)
  of the log's records and twice as long (in records and, when timed, in seconds) as
  the longest episode of the same rule that recovered earlier in the log → the warning,
  "not recovered by the end of the log" (the change persisted for the whole remaining
  run, and is not one more of the dips the run has shown it recovers from, cut by the
  log's end);
- recovered after the warning → an info finding saying when it recovered.

A dip that recovers before it is sustained therefore stays at info. A log too short for
R061's rolling test (fewer than ``degrade_window + smooth`` rates: an excerpt of a few
windows pasted from a thread) is judged at its end on its first and last quarters: the
warning when the last quarter's median is below ``degrade`` × the first quarter's, every
rate of the last quarter below halfway back, and the last quarter spans
``sustain_s`` of wall time when step times are known (a burst is minutes). An episode ends
only when the value is clearly back (hysteresis): the rate above halfway between the
threshold and the reference (0.85 × the early level for ``degrade`` = 0.7), the data
wait below 0.8 × ``data_share``; a noisy machine's throughput otherwise crosses the
threshold back and forth and a real slowdown never looks sustained.

Data wait (R062, R064) is judged against the run's own early level: the share over the
first ``window`` data-wait records past the warmup. A share that is high from the start
(a toy dataset that is slow to build, a loader that was always the bottleneck) is no
change: it is reported once as R064 (info) with its numbers, unless the detector is
told the loader must keep up (``loader_must_keep_up``: a plan that declares a loader
rate or an expected throughput, or an expected throughput given here), where it is
R062's warning. R062's episodes need the share to rise ``data_share`` (25 points) above
that early level. Under CPU contention the loop's data wait and its compute slow down
together, so the share stays where it was; a loader that really slows down moves it.

CPU contention (a neighbour's busy processes on the same cores) slows every step by
the time the training thread spends waiting for a CPU. The live monitor measures that
wait (``extra["cpu_wait_s"]``: the thread's run-queue delay over the step, from Linux
``/proc/thread-self/schedstat``); R060/R061 judge the rate the run reaches on the CPU
time it gets (the step time less that wait), so another process's load does not read
as the run slowing down. Records without the field (logs) are taken as they are.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector, fmt
from sapper.runtime.detectors.stats import RollingRobust, SortedWindow, median
from sapper.runtime.records import StepRecord

__all__ = [
    "DATA_WAIT",
    "DATA_WAIT_CONSTANT",
    "STEP_OUTLIER",
    "THROUGHPUT_DEGRADING",
    "THROUGHPUT_LOW",
    "ThroughputDetector",
]

THROUGHPUT_LOW = register(
    Rule(
        code="R060",
        name="throughput-below-plan",
        check="throughput",
        severity=Severity.WARNING,
        title="Throughput is far below what the plan expects",
        why="""\
A run much slower than its estimate is losing time to communication that crosses slow
links (TP across nodes), a starved data pipeline, host-device syncs in the loop,
recomputation nobody asked for or a fallback kernel; the budget runs out before the
tokens do.

Frameworks: any; needs an expected throughput (a plan the cost model can price). Wall-
clock numbers are noisy on shared machines: a finding needs a sustained change, a dip
that recovers stays at info.""",
        signs="""\
tokens/s (or MFU) well below the estimate from the first hundred steps on; GPU
utilisation below ~90%.""",
        fix="""\
Profile one step (torch.profiler): communication → keep TP inside the node; data → more
loader workers, pinned memory, prefetch; syncs → remove .item() from the hot loop.""",
        seed="§4.4, §5.2",
    )
)

THROUGHPUT_DEGRADING = register(
    Rule(
        code="R061",
        name="throughput-degrading",
        check="throughput",
        severity=Severity.WARNING,
        title="Throughput degrades over the run",
        why="""\
A step that gets slower with time points at growth somewhere: memory fragmentation and
allocator retries near the limit, a Python-side list or log that grows every step, a
thermally throttled or failing GPU, a slower node in a collective.

Frameworks: any. Wall-clock numbers are noisy on shared machines: a finding needs a
sustained change, a dip that recovers stays at info.""",
        signs="""\
tokens/s falling steadily from its early level; step time creeping up; allocator retries.""",
        fix="""\
Compare early and late profiles; check torch.cuda.memory_stats()['num_alloc_retries'],
GPU clocks and temperatures, and per-rank step times.""",
        seed="§5.2",
    )
)

DATA_WAIT = register(
    Rule(
        code="R062",
        name="data-loader-bottleneck",
        check="throughput",
        severity=Severity.WARNING,
        title="A large share of each step is spent waiting for data",
        why="""\
While the loop waits for the next batch the accelerator idles; the data pipeline, not
the model, sets the speed (checklist item 7).

Frameworks: any; needs the data-wait time (the live monitor measures it; some loggers
write data_time). Judged against the run's own early share: a rise that is sustained
is a warning, a burst that recovers stays at info; a share that is high from the start
is R064 (info), or this warning when the plan says the loader must keep up.""",
        signs="""\
Data-wait time a growing fraction of the step time; GPU utilisation dropping in bursts.""",
        fix="""\
Raise DataLoader num_workers, use pin_memory and persistent_workers, prefetch, move
tokenisation offline (pre-tokenised shards), read from local disk.""",
        seed="§5.1, §5.2",
    )
)

DATA_WAIT_CONSTANT = register(
    Rule(
        code="R064",
        name="data-wait-constant",
        check="throughput",
        severity=Severity.INFO,
        title="Waiting for data takes a large, constant share of every step",
        why="""\
A loader that is slower than the model from the first step on sets the run's speed:
nothing changed and nothing breaks, the accelerator simply idles for that share of the
time. Common and harmless on small or toy runs whose data is built on the fly; worth
fixing on a paid run.

Frameworks: any; needs the data-wait time. Info only: a plan that says the loader must
keep up (a declared loader rate, an expected throughput) makes it R062's warning.""",
        signs="""\
The data-wait share of the first logged steps above the threshold (25%) and staying
there; the step time does not change over the run.""",
        fix="""\
If the speed matters: more DataLoader workers, pin_memory, prefetching, pre-tokenised
shards on local disk; measure the loader alone (sapper's data check) against the step.""",
        seed="§5.1, §5.2",
    )
)

STEP_OUTLIER = register(
    Rule(
        code="R063",
        name="step-time-outlier",
        check="throughput",
        severity=Severity.INFO,
        title="A step took far longer than the others",
        why="""\
Isolated slow steps are checkpoint saves, evaluation, garbage collection or a straggler
rank; they are harmless when rare and expected, a sign of contention when frequent.

Frameworks: any; info only.""",
        signs="""\
A step time many robust standard deviations above the median step time.""",
        fix="""\
Check what ran at that step (checkpoint, eval, gc); if unexpected, look for a straggler
node or shared-filesystem stalls.""",
        seed="§5.2",
    )
)


@dataclass
class Episode:
    """One stretch of consecutive records on which a condition held (see the module doc):
    where it started, how many records and seconds it has lasted, which findings it has
    produced. ``observe`` returns the event a record brings, if any."""

    onset_records: int
    sustain_records: int
    sustain_s: float
    start: int | None = None
    last: int | None = None
    records: int = 0
    seconds: float = 0.0
    timed: bool = True
    onset: bool = False
    warned: bool = False
    #: The worst value seen in the episode (the lowest rate, the highest share).
    worst: float | None = None
    #: The last episode that ended: its first step, records, seconds and worst value.
    last_start: int | None = None
    last_records: int = 0
    last_seconds: float = 0.0
    last_worst: float | None = None
    #: The longest episode that ended (recovered), in records and in seconds.
    longest_records: int = 0
    longest_seconds: float = 0.0

    @property
    def ongoing(self) -> bool:
        return self.start is not None

    def sustained(self) -> bool:
        """The stated duration: ``sustain_records`` records and, when step times are
        known, ``sustain_s`` seconds."""
        if self.records < self.sustain_records:
            return False
        return not self.timed or self.seconds >= self.sustain_s

    def observe(self, holds: bool, step: int, seconds: float | None, value: float) -> str | None:
        """Feed one record: ``"onset"``, ``"sustained"``, ``"recovered"`` or None."""
        if not holds:
            if self.start is None:
                return None
            event = "recovered" if self.warned else None
            self.last_start, self.last_records = self.start, self.records
            self.last_seconds, self.last_worst = self.seconds, self.worst
            self.longest_records = max(self.longest_records, self.records)
            self.longest_seconds = max(self.longest_seconds, self.seconds)
            self.start, self.records, self.seconds, self.timed = None, 0, 0.0, True
            self.onset = self.warned = False
            self.worst = None
            return event
        if self.start is None:
            self.start = step
        self.last = step
        self.records += 1
        if seconds is None:
            self.timed = False
        else:
            self.seconds += seconds
        self.worst = value if self.worst is None else self.worst_of(self.worst, value)
        if not self.warned and self.sustained():
            self.warned = True
            return "sustained"
        if not self.onset and not self.warned and self.records >= self.onset_records:
            self.onset = True
            return "onset"
        return None

    def worst_of(self, a: float, b: float) -> float:
        return min(a, b)


class HighEpisode(Episode):
    """An episode whose worst value is the highest (a data-wait share)."""

    def worst_of(self, a: float, b: float) -> float:
        return max(a, b)


def _rate(record: StepRecord) -> tuple[float, str] | None:
    if record.tokens_per_s is not None:
        return record.tokens_per_s, "tokens/s"
    t = record.step_time_s
    if record.tokens is not None and t:
        return record.tokens / t, "tokens/s"
    if record.samples_per_s is not None:
        return record.samples_per_s, "samples/s"
    if record.samples is not None and t:
        return record.samples / t, "samples/s"
    if t:
        return 1.0 / t, "steps/s"
    return None


def cpu_wait(record: StepRecord) -> float | None:
    """The record's CPU wait (``extra["cpu_wait_s"]``, see the module doc) when it is a
    number inside the step time (0 ≤ wait < step time), else None."""
    w = record.extra.get("cpu_wait_s") if record.extra else None
    t = record.step_time_s
    if w is None or isinstance(w, bool) or not isinstance(w, (int, float)) or t is None:
        return None
    if not (math.isfinite(w) and math.isfinite(t) and 0 <= w < t):
        return None
    return float(w)


def own_rate(value: float, record: StepRecord) -> float:
    """``value`` (a rate over the step time) over the CPU time the step got instead: the
    step time less the CPU wait; unchanged without one."""
    w = cpu_wait(record)
    if not w:
        return value
    t = float(record.step_time_s or 0.0)
    return value * (t / (t - w))


class ThroughputDetector(RuleDetector):
    """R060-R064 over step times, data-wait times and tokens/samples per second."""

    name = "throughput"
    rules = (THROUGHPUT_LOW, THROUGHPUT_DEGRADING, DATA_WAIT, STEP_OUTLIER, DATA_WAIT_CONSTANT)
    cooldown = 500

    def __init__(
        self,
        *,
        expected_tokens_per_s: float | None = None,
        expected_samples_per_s: float | None = None,
        below: float = 0.7,
        warmup_steps: int = 5,
        run_start_steps: int = 100,
        window: int = 20,
        min_records: int = 8,
        degrade: float = 0.7,
        degrade_window: int = 50,
        data_share: float = 0.25,
        outlier_k: float = 10.0,
        outlier_ratio: float = 3.0,
        outlier_cooldown: int = 50,
        smooth: int = 9,
        sustain_records: int = 50,
        sustain_s: float = 600.0,
        sustain_share: float = 0.25,
        onset_records: int = 3,
        loader_must_keep_up: bool = False,
    ) -> None:
        super().__init__()
        self.expected = {"tokens/s": expected_tokens_per_s, "samples/s": expected_samples_per_s}
        self.below = below
        self.warmup_steps = warmup_steps
        self.run_start_steps = run_start_steps
        self.min_records = min_records
        self.degrade = degrade
        self.data_share = data_share
        self.outlier_k = outlier_k
        self.outlier_ratio = outlier_ratio
        self.outlier_cooldown = outlier_cooldown
        self.first_step: int | None = None
        self.degrade_window = degrade_window
        self.early: list[float] = []
        self.early_median: float | None = None
        self.rate_count = 0
        self.early_unit: str | None = None
        self.rates = SortedWindow(window)
        self.times = RollingRobust(max(window, 50))
        self.waits: deque[tuple[float, float]] = deque(maxlen=window)
        self.last_outlier: int | None = None
        self.smooth = smooth
        self.sustain_records = sustain_records
        self.sustain_s = sustain_s
        self.recent_rates = SortedWindow(smooth)
        self.sustain_share = sustain_share
        ep = (onset_records, sustain_records, sustain_s)
        self.low_episode = Episode(*ep)
        self.slow_episode = Episode(*ep)
        self.wait_episode = HighEpisode(*ep)
        self.prev_step: int | None = None
        self.seconds: float | None = None
        self.records_seen = 0
        # running sums over ``waits`` (data wait, step time): the share is O(1) per record
        self.wait_sum = 0.0
        self.time_sum = 0.0
        self.timed_records = 0
        self.wait_records = 0
        self.rate_unit: str | None = None
        #: (rate, seconds) of the first degrade_window + smooth rates: a short log's R061
        self.first_rates: list[tuple[float, float | None]] = []
        self.loader_must_keep_up = loader_must_keep_up
        #: The data-wait share of the first full window (the run's own early level) and
        #: that window's mean wait and step time.
        self.wait_base: float | None = None
        self.wait_base_times: tuple[float, float] | None = None

    def update(self, record: StepRecord) -> list[Finding]:
        step = record.step
        if self.first_step is None:
            self.first_step = step
        self.seconds = self._seconds(record)
        self.prev_step = step
        from_start = self.first_step <= self.run_start_steps
        if from_start and step - self.first_step < self.warmup_steps:
            return []
        self.records_seen += 1
        out = self._outlier(record)
        if record.data_time_s is not None:
            out += self._data_wait(record)
        rate = _rate(record)
        if rate is None:
            return out
        value, unit = rate
        if not math.isfinite(value) or value <= 0:
            return out
        if "cpu_wait_s" in record.extra:  # the CPU wait (cpu_wait); without one, as is
            value = own_rate(value, record)
        if self.early_unit is None:
            self.early_unit = unit
        if unit != self.early_unit:
            return out
        self.rate_unit = unit
        self.rates.add(value)
        self.recent_rates.add(value)
        count = self.rate_count = self.rate_count + 1
        full = self.degrade_window + self.smooth
        if count <= full:  # the first rates are kept while they are being counted
            if len(self.first_rates) < full:
                self.first_rates.append((value, self.seconds))
            if len(self.early) < self.degrade_window:
                self.early.append(value)
        if self.expected.get(unit):
            out += self._below(step, unit)
        if count >= full:
            out += self._degrading(step, unit)
        return out

    def _seconds(self, record: StepRecord) -> float | None:
        """Wall time this record stands for: its step time × the steps since the previous
        record (a log written every k steps), else None."""
        t = record.step_time_s
        if t is None or not math.isfinite(t) or t <= 0:
            return None
        span = record.step - self.prev_step if self.prev_step is not None else 1
        return t * max(1, span)

    def _below(self, step: int, unit: str) -> list[Finding]:
        expected = self.expected.get(unit)
        if not expected or len(self.rates) < self.min_records:
            return []
        now = self.rates.median()
        ep = self.low_episode
        bar = self.below if not ep.ongoing else 0.5 * (1.0 + self.below)
        event = ep.observe(now < bar * expected, step, self.seconds, now)
        if event is None:
            return []
        return self._episode(
            THROUGHPUT_LOW,
            self.low_episode,
            event,
            step,
            f"median throughput {fmt(now)} {unit} over the last {len(self.rates)} logged "
            f"steps is {fmt(100 * now / expected)}% of the expected {fmt(expected)} {unit}",
            value=now,
            threshold=self.below * expected,
        )

    def _slow_now(self) -> tuple[bool, float, float]:
        """R061's condition on this record: the median of the last ``smooth`` rates below
        ``degrade`` × the median of the first ``degrade_window`` (the run's own early
        level), or, inside an episode, still below halfway back to that level
        (hysteresis); returns (holds, early level, smoothed rate now)."""
        if self.early_median is None:  # the early window is full and fixed by now
            self.early_median = median(self.early)
        ref, now = self.early_median, self.recent_rates.median()
        bar = self.degrade if not self.slow_episode.ongoing else 0.5 * (1.0 + self.degrade)
        return now < bar * ref, ref, now

    def _degrading(self, step: int, unit: str) -> list[Finding]:
        """A sustained fall of the throughput below its early level (see the module doc:
        a dip that recovers before it is sustained stays at info)."""
        ep = self.slow_episode
        ref = self.early_median
        if ref is not None and ep.start is None:  # not ongoing
            # the common case, _slow_now's test read inline: the smoothed rate at or
            # above its bar, outside an episode, has nothing to track
            if not self.recent_rates.median() < self.degrade * ref:
                return []
        holds, ref, now = self._slow_now()
        if not holds and not ep.ongoing:  # the common case: nothing to track
            return []
        event = ep.observe(holds, step, self.seconds, now)
        if event is None:
            return []
        worst = ep.worst if ep.worst is not None else now
        return self._episode(
            THROUGHPUT_DEGRADING,
            ep,
            event,
            step,
            f"throughput fell from {fmt(ref)} to {fmt(now if holds else worst)} {unit} "
            f"({fmt(100 * (1 - (now if holds else worst) / ref))}% slower than the first "
            f"{self.degrade_window} logged steps)",
            value=now,
            threshold=self.degrade * ref,
            early=ref,
        )

    def _data_wait(self, record: StepRecord) -> list[Finding]:
        d, t = record.data_time_s, record.step_time_s
        if d is None or t is None or t <= 0 or not (math.isfinite(d) and math.isfinite(t)):
            return []
        self.wait_records += 1
        waits = self.waits
        if len(waits) == waits.maxlen and waits:
            old_d, old_t = waits[0]
            self.wait_sum -= old_d
            self.time_sum -= old_t
        waits.append((d, t))
        self.wait_sum += d
        self.time_sum += t
        if len(waits) < self.min_records:
            return []
        share = self.wait_sum / self.time_sum if self.time_sum > 0 else 0.0
        base = self.wait_base
        if base is None:
            if len(waits) < (waits.maxlen or 0):
                return []
            return self._wait_baseline(record.step, share)
        ep = self.wait_episode
        bar = base + (self.data_share if not ep.ongoing else 0.8 * self.data_share)
        if share < bar and not ep.ongoing:
            return []
        event = ep.observe(share >= bar, record.step, self.seconds, share)
        if event is None:
            return []
        return self._episode(
            DATA_WAIT,
            ep,
            event,
            record.step,
            f"{fmt(100 * share)}% of the step time of the last {len(self.waits)} logged steps "
            f"was spent waiting for data, up from {fmt(100 * base)}% over the run's first "
            f"{len(self.waits)} (limit: {fmt(100 * self.data_share)} points above it)",
            value=share,
            threshold=base + self.data_share,
            early=base,
        )

    def keeps_up(self) -> bool:
        """Whether the loader must keep up: told so (a plan), or an expected rate."""
        return self.loader_must_keep_up or any(self.expected.values())

    def _wait_baseline(self, step: int, share: float) -> list[Finding]:
        """The first full window fixes the run's own data-wait level; a level at or above
        ``data_share`` is reported once (R064, or R062 when the loader must keep up)."""
        n = len(self.waits)
        self.wait_base = share
        self.wait_base_times = (self.wait_sum / n, self.time_sum / n)
        if share < self.data_share:
            return []
        wait, step_time = self.wait_base_times
        what = (
            f"{fmt(100 * share)}% of the step time of the first {n} logged steps was spent "
            f"waiting for data (a mean wait of {fmt(wait)} s in a {fmt(step_time)} s step; "
            f"threshold {fmt(100 * self.data_share)}%), from the start of the run"
        )
        if self.keeps_up():
            return self.fire(
                DATA_WAIT,
                step,
                f"{what}; the plan expects the loader to keep up (a declared loader rate "
                "or an expected throughput), and it does not",
                value=share,
                threshold=self.data_share,
                early=share,
                constant=True,
            )
        return self.fire(
            DATA_WAIT_CONSTANT,
            step,
            f"{what}: a constant share, not a change — the loader sets this run's speed "
            "(R062 warns if it rises further)",
            value=share,
            threshold=self.data_share,
            mean_wait_s=wait,
            mean_step_s=step_time,
        )

    def _episode(
        self,
        rule: Rule,
        ep: Episode,
        event: str | None,
        step: int,
        what: str,
        *,
        final: bool = False,
        **details: float,
    ) -> list[Finding]:
        """The finding an episode event calls for (see the module doc): info at the
        onset and on recovery, the rule's warning once it is sustained or still holds at
        the end. Each event of an episode is reported once, past the cooldown."""
        if event is None:
            return []
        since = f"since step {ep.start}" if ep.start is not None else ""
        span = self._span(ep)
        if event == "onset":
            need = f"{self.sustain_records} logged steps" + (
                f" and {fmt(self.sustain_s)} s" if ep.timed else ""
            )
            message = (
                f"{what}, {since} ({span}); not sustained yet — a warning follows if it "
                f"lasts {need} or to the end of the log"
            )
            severity: Severity | None = Severity.INFO
        elif event == "sustained":
            message = f"{what}, {since} ({span}) and not recovered so far"
            severity = None
        elif final:
            message = f"{what}, {since} ({span}), not recovered by the end of the log"
            severity = None
        else:  # recovered
            lasted = f"{ep.last_records} logged step(s)" + (
                f", {fmt(ep.last_seconds)} s" if ep.last_seconds else ""
            )
            message = (
                f"recovered at step {step} after {lasted} since step {ep.last_start} "
                f"(worst {fmt(ep.last_worst)}); now: {what}"
            )
            severity = Severity.INFO
        if event != "onset":  # the warning and its recovery are never held back by an info
            self.fired.pop(rule.code, None)
        return self.fire(
            rule,
            step,
            message,
            severity=severity,
            episode_start=ep.start if ep.start is not None else ep.last_start,
            recovered=event == "recovered",
            **details,
        )

    @staticmethod
    def _span(ep: Episode) -> str:
        steps = f"{ep.records} logged step(s)"
        return steps + (f", {fmt(ep.seconds)} s" if ep.timed and ep.seconds else "")

    def finish(self) -> list[Finding]:
        """Episodes still holding at the end of the stream persisted for the whole rest of
        the run: the rule's warning, unless it was already given."""
        last = self.prev_step if self.prev_step is not None else 0
        out = self._short_log_slowdown(last)
        for rule, ep in (
            (THROUGHPUT_LOW, self.low_episode),
            (THROUGHPUT_DEGRADING, self.slow_episode),
            (DATA_WAIT, self.wait_episode),
        ):
            need = max(
                self.min_records, self.sustain_share * self.records_seen, 2 * ep.longest_records
            )
            if not ep.ongoing or ep.warned or ep.records < need:
                continue
            if ep.timed and ep.seconds < 2 * ep.longest_seconds:
                continue  # not longer than the dips this run recovered from
            ep.warned = True
            what = {
                THROUGHPUT_LOW.code: "throughput below the expected rate",
                THROUGHPUT_DEGRADING.code: "throughput below its early level",
                DATA_WAIT.code: "data wait above its early level",
            }[rule.code]
            worst = ep.worst
            shown = fmt(worst)
            if rule is DATA_WAIT and worst is not None and self.wait_base is not None:
                shown = (
                    f"{fmt(100 * worst)}% of the step time, against "
                    f"{fmt(100 * self.wait_base)}% over the run's first steps"
                )
            out += self._episode(
                rule,
                ep,
                "final",
                last,
                f"{what} (worst {shown})",
                final=True,
                value=worst if worst is not None else math.nan,
            )
        return out

    def _short_log_slowdown(self, last: int) -> list[Finding]:
        """R061 on a log too short for the rolling test: its last quarter against its
        first (see the module doc)."""
        rates = self.first_rates
        n = len(rates)
        if self.rate_count >= self.degrade_window + self.smooth or n < self.min_records:
            return []
        q = max(2, n // 4)
        ref = median([r for r, _ in rates[:q]])
        tail = rates[-q:]
        now = median([r for r, _ in tail])
        seconds = [t for _, t in tail]
        span = None if any(t is None for t in seconds) else sum(t for t in seconds if t)
        if not (
            now < self.degrade * ref
            and max(r for r, _ in tail) < 0.5 * (1.0 + self.degrade) * ref
            and (span is None or span >= self.sustain_s)
        ):
            return []
        unit = self.rate_unit or ""
        took = f" over {fmt(span)} s" if span else ""
        return self.fire(
            THROUGHPUT_DEGRADING,
            last,
            f"throughput fell from {fmt(ref)} {unit} (median of the first {q} logged steps) "
            f"to {fmt(now)} {unit} (the last {q}{took}), {fmt(100 * (1 - now / ref))}% "
            "slower, not recovered by the end of the log (a short log: its first and last "
            "quarters compared)",
            value=now,
            threshold=self.degrade * ref,
            early=ref,
            recovered=False,
        )

    def unevaluated(self) -> list[str]:
        """What R060-R063 could not look at: no timing or rate field at all, no expected
        throughput (R060), no data-wait field (R062), too few rates (R061)."""
        if self.records_seen == 0 or (
            self.rate_count == 0 and self.wait_records == 0 and not len(self.times)
        ):
            return [
                "R060-R063 throughput: not evaluated — the log has no step time, "
                "tokens/s or samples/s"
            ]
        out = []
        if not any(self.expected.values()):
            out.append(
                "R060 throughput below plan: not evaluated — no expected throughput (a plan "
                "with model, GPU and batch, or throughput.expected_tokens_per_s)"
            )
        if self.rate_count < self.degrade_window + self.smooth:
            out.append(
                f"R061 throughput degrading: not evaluated by the rolling test — "
                f"{self.rate_count} rate record(s), needs {self.degrade_window + self.smooth}; "
                "only the log's first and last quarters were compared"
            )
        if self.wait_records == 0:
            out.append(
                "R062 data-loader bottleneck: not evaluated — the log has no data-wait time "
                "next to the step time"
            )
        elif self.wait_base is None:
            out.append(
                f"R062/R064 data wait: not evaluated — {self.wait_records} data-wait "
                f"record(s), needs {max(self.min_records, self.waits.maxlen or 0)} for the "
                "run's own early level"
            )
        return out

    def _outlier(self, record: StepRecord) -> list[Finding]:
        t = record.step_time_s
        if t is None or not math.isfinite(t) or t <= 0:
            return []
        times = self.times
        enough = len(times.values) >= self.min_records
        med = times.level() if enough else 0.0
        times.add(t)
        if not enough or t <= self.outlier_ratio * med:  # below the smallest possible limit
            return []
        limit = max(med + self.outlier_k * self.times.sigma(), self.outlier_ratio * med)
        if t <= limit:
            return []
        last = self.last_outlier
        if last is not None and record.step - last < self.outlier_cooldown:
            return []
        self.last_outlier = record.step
        self.fired.pop(STEP_OUTLIER.code, None)
        return self.fire(
            STEP_OUTLIER,
            record.step,
            f"step {record.step} took {fmt(t)} s, {fmt(t / med)}× the median {fmt(med)} s",
            value=t,
            threshold=limit,
        )
