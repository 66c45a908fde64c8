"""The LR rules without a declared schedule (R042 from the live monitor's counts, R043
warmup far too short, R044 schedule past its end); twin of
:class:`sapper.runtime.detectors.lr.LRDetector`.

The shape rules are a small state machine over the LR series (the peak, the ramp from
the start, the trough since the last high, runs of zeros and of rises); it is walked
here over plain floats in one loop, statement for statement as the streaming detector
walks it, without a record or a method call per row, and only while a rule can still
fire (each is said once per run). With a declared schedule the streaming detector runs.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from sapper.logs.columnar.frame import Columns
from sapper.logs.columnar.twins.base import state_is, walking_twin
from sapper.rules.model import Finding
from sapper.runtime.detectors.base import fmt
from sapper.runtime.detectors.lr import LR_OVERRUN, LR_WARMUP_SHORT, LRDetector

__all__ = ["TWIN"]

#: Rows looked ahead at once for the end of a quiet stretch.
_AHEAD = 1 << 14

_STATE = {
    "fired",
    "schedule",
    "peak_lr",
    "warmup_steps",
    "total_steps",
    "min_lr",
    "grad_accum",
    "rtol",
    "patience",
    "warmup_min_share",
    "overrun_floor",
    "overrun_rise",
    "restart_jump",
    "zero_records",
    "zero_share",
    "flat_drop",
    "misses",
    "per_micro",
    "multi_sched",
    "lr_records",
    "first_step",
    "first_lr",
    "prev_lr",
    "peak",
    "peak_step",
    "warmup_end",
    "ramp_open",
    "trough",
    "rise_run",
    "rise_from",
    "zero_run",
    "zero_since",
    "flat_lr",
    "flat_from",
    "flat_broken",
}


def _accepts(det: LRDetector) -> bool:
    return (
        state_is(det, _STATE)
        and not det.fired
        and det.lr_records == 0
        and (det.schedule is None or det.peak_lr is None)
    )


def _walk(det: LRDetector, cols: Columns) -> tuple[LRDetector, list[Finding]]:
    """A scratch copy fed the stream: the shape rules in one loop over the finite LRs,
    the scheduler-call counts on the rows with extras, merged in row order."""
    d = copy.deepcopy(det)
    lr_all = cols.get("lr")
    fin = cols.has("lr") & np.isfinite(lr_all)
    rows = np.flatnonzero(fin)
    extras = sorted(cols.full)
    found: list[Finding] = []
    steps = cols.steps
    lrs = _Numbers(lr_all[rows])
    srows = _Numbers(rows)
    e = 0
    # the shape state, as locals (written back at the end)
    first_step, first_lr, prev_lr = d.first_step, d.first_lr, d.prev_lr
    peak, peak_step, warmup_end, ramp_open = d.peak, d.peak_step, d.warmup_end, d.ramp_open
    trough, rise_run, rise_from = d.trough, d.rise_run, d.rise_from
    zero_run, zero_since = d.zero_run, d.zero_since
    total = d.total_steps or 0
    share, floor, rise_k, jump = (
        d.warmup_min_share,
        d.overrun_floor,
        d.overrun_rise,
        d.restart_jump,
    )
    fired = d.fired
    w_code, o_code = LR_WARMUP_SHORT.code, LR_OVERRUN.code
    steps_arr = steps[rows]
    step_list = _Numbers(steps_arr)

    def sync() -> None:
        d.first_step, d.first_lr, d.prev_lr = first_step, first_lr, prev_lr
        d.peak, d.peak_step, d.warmup_end, d.ramp_open = peak, peak_step, warmup_end, ramp_open
        d.trough, d.rise_run, d.rise_from = trough, rise_run, rise_from
        d.zero_run, d.zero_since = zero_run, zero_since

    arr = lrs.arr
    m = len(arr)
    k = 0
    while k < m:
        row, lr, step = srows[k], lrs[k], step_list[k]
        k += 1
        while e < len(extras) and extras[e] <= row:  # the live counter, in row order
            found += d._live_counter(cols.record(extras[e]))
            e += 1
        # _warmup_shape
        if first_step is None:
            first_step, first_lr = step, lr
        if lr > peak:
            peak, peak_step = lr, step
        elif ramp_open and prev_lr is not None and lr <= prev_lr:
            ramp_open = False
            first, start_lr, top = first_step, first_lr or 0.0, peak_step
            ramp = top is not None and top > first and start_lr <= 0.5 * peak
            if ramp and top is not None and first <= 0.5 * top:
                warmup_end = top
        if warmup_end is not None and w_code not in fired:
            run = max(step, total) - (first_step or 0)
            if not warmup_end > share * run:
                end = warmup_end
                found += d.fire(
                    LR_WARMUP_SHORT,
                    step,
                    f"the LR ramps up to {fmt(peak)} by step {end}, "
                    f"{fmt(100 * end / run)}% of the {run:,} steps the run has reached "
                    f"(published warmups are 0.1-10% of training): check the warmup's unit "
                    f"and that the scheduler steps once per optimizer step",
                    value=end,
                    threshold=share * run,
                    run_steps=run,
                )
        # _overrun
        if lr < 0:
            found += d.fire(
                LR_OVERRUN,
                step,
                f"LR {fmt(lr)} at step {step} is negative: the schedule ran past its end "
                "without a clamp (the optimizer now climbs the loss)",
                value=lr,
                threshold=0.0,
            )
        elif not (peak <= 0 or o_code in fired):
            fire = False
            if lr == 0 and prev_lr is not None and (prev_lr > 0 or zero_run):
                zero_run += 1
                zero_since = zero_since if zero_since is not None else step
            elif lr != 0:
                zero_run, zero_since = 0, None
            if zero_run >= d.zero_records and zero_since is not None:
                span = step - zero_since
                if span >= d.zero_share * (step - (first_step or 0)):
                    fire = True
                    found += d.fire(
                        LR_OVERRUN,
                        step,
                        f"the LR has been exactly 0 since step {zero_since} ({span:,} steps, "
                        f"{zero_run} logged): the schedule ended before the run did",
                        value=0.0,
                        threshold=0.0,
                        since=zero_since,
                    )
            if not fire and prev_lr is not None:
                if peak_step == step:
                    trough, rise_run, rise_from = None, 0, None
                else:
                    if trough is None or lr < trough:
                        trough = lr
                    if not trough > floor * peak:
                        if lr - prev_lr > jump * peak:
                            trough, rise_run, rise_from = None, 0, None
                        elif lr > prev_lr:
                            rise_run += 1
                            rise_from = trough if rise_from is None else rise_from
                            low = rise_from if rise_from is not None else trough
                            if not (rise_run < 3 or lr - low < rise_k * peak):
                                found += d.fire(
                                    LR_OVERRUN,
                                    step,
                                    f"the LR decayed to {fmt(low)} ({fmt(100 * low / peak)}% "
                                    f"of its peak {fmt(peak)}) and rises again, smoothly, to "
                                    f"{fmt(lr)} at step {step}: a schedule stepped past its "
                                    "total (a cosine coming back up)",
                                    value=lr,
                                    threshold=low + rise_k * peak,
                                    trough=low,
                                )
                        else:
                            rise_run, rise_from = 0, None
        prev_lr = lr
        # A quiet stretch: no ramp left to close, no zero run or rise under way, not
        # decayed: the rows up to the next one that can change more than the trough
        # (a new high, an LR at or below zero or the decay floor, where R043 may fire)
        # only lower the trough and move prev_lr; they are taken in one step.
        if (
            k < m
            and not ramp_open
            and zero_run == 0
            and zero_since is None
            and rise_run == 0
            and rise_from is None
            and peak > 0
            and trough is not None
            and trough > floor * peak
        ):
            stop = min(m, k + _AHEAD)
            if e < len(extras):  # the live counter's next row is taken in order
                stop = min(stop, int(np.searchsorted(rows, extras[e], side="left")))
            seg = arr[k:stop]
            loud = (seg > peak) | (seg <= 0) | (seg <= floor * peak)
            if warmup_end is not None and w_code not in fired:
                runs = np.maximum(steps_arr[k:stop], total) - (first_step or 0)
                loud |= ~(warmup_end > share * runs)
            hit = np.flatnonzero(loud)
            j = k + int(hit[0]) if len(hit) else stop
            if j > k:
                trough = min(trough, float(arr[k:j].min()))
                prev_lr = lrs[j - 1]
                k = j
    while e < len(extras):
        found += d._live_counter(cols.record(extras[e]))
        e += 1
    sync()
    d.lr_records = m
    return d, found


class _Numbers:
    """``arr[k]`` as the Python number ``arr.tolist()[k]`` is, converted a block at a
    time when first read: the walk jumps over quiet stretches, so most of a long log's
    rows are never read one by one and never converted."""

    __slots__ = ("arr", "blocks")
    _SHIFT = 12

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr
        self.blocks: dict[int, list[Any]] = {}

    def __getitem__(self, k: int) -> Any:
        b = k >> self._SHIFT
        block = self.blocks.get(b)
        if block is None:
            size = 1 << self._SHIFT
            block = self.blocks[b] = self.arr[b * size : (b + 1) * size].tolist()
        return block[k & ((1 << self._SHIFT) - 1)]


TWIN = walking_twin(
    LRDetector,
    _walk,
    _accepts,
    ("sapper.runtime.detectors.lr", "sapper.runtime.detectors.base"),
    scratch=52,
    cost=0.04,
)
