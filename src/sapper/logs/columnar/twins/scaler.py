"""The loss-scaling rules (R030-R033); twin of
:class:`sapper.runtime.detectors.scaler.ScalerDetector`.

A long fp16 run holds its loss scale for thousands of records between two overflows,
and a Megatron log prints the scale and the skip counter on every line. On such a
record the streaming detector only counts: one more record with a scale, one more
record the scale held, a zero halving and a zero skip in its windows. Here the
streaming detector itself reads every record where something can happen (the first
ones, a scale that moves or sits at the floor, a skip and the records its window still
holds it for, a gradient norm of the order of the scale, a record with extras), fed the
rows and fields the streaming fallback feeds it, and the quiet stretches between are
counted at once, its state set as those records would have set it.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from sapper.logs.columnar.frame import Columns
from sapper.logs.columnar.twins.base import state_is, walking_twin
from sapper.logs.columnar.twins.fallback import rows_for
from sapper.rules.model import Finding
from sapper.runtime.detectors.scaler import (
    SCALER_INTERNAL,
    ScalerDetector,
    _halvings_since_growth,
)

__all__ = ["TWIN"]

_STATE = {
    "fired",
    "min_scale",
    "collapse_drops",
    "skip_grace_steps",
    "skip_min_records",
    "skip_share",
    "scaled_ratio",
    "scaled_min_scale",
    "scaled_records",
    "scaled_max_ratio",
    "unknown_records",
    "calibration_steps",
    "cold_halvings",
    "scale_records",
    "halvings",
    "changes",
    "grown",
    "stable",
    "calibrated",
    "scaled_losses",
    "ratio_records",
    "skip_records",
    "prev_scale",
    "peak_scale",
    "drops",
    "skips",
    "prev_skipped_total",
    "prev_step",
    "first_step",
    "scaled_run",
    "live_flags_seen",
}


def _accepts(det: ScalerDetector) -> bool:
    return (
        state_is(det, _STATE)
        and not det.fired
        and det.first_step is None
        and det.prev_step is None
        and det.prev_scale is None
        and det.prev_skipped_total is None
        and det.scale_records == det.skip_records == det.ratio_records == 0
        and not det.skips
        and not det.changes
        and not det.live_flags_seen
        and det.skip_share > 0
        and det.unknown_records >= 1
        and det.scaled_records >= 1
    )


def _previous(values: np.ndarray, has: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the value of the last row before it that has one (and whether any)."""
    n = len(values)
    idx = np.where(has, np.arange(n), -1)
    np.maximum.accumulate(idx, out=idx)
    before = np.empty(n, dtype=np.int64)
    before[0] = -1
    before[1:] = idx[:-1]
    return values[np.maximum(before, 0)], before >= 0


def _walk(det: ScalerDetector, cols: Columns) -> tuple[ScalerDetector, list[Finding]]:
    d = copy.deepcopy(det)
    found: list[Finding] = []
    rows, fields = rows_for(d, cols)
    n = len(rows)
    if n == 0:
        return d, found
    steps = cols.steps[rows]
    scale = cols.get("loss_scale")[rows]
    has_scale = cols.has("loss_scale")[rows] & np.isfinite(scale)
    # as Columns.partial builds the records: a NaN count or flag is no value
    total = cols.get("skipped_total")[rows]
    has_total = cols.has("skipped_total")[rows] & np.isfinite(total)
    skipped = cols.get("skipped")[rows]
    has_skipped = cols.has("skipped")[rows] & ~np.isnan(skipped) & ~has_total
    gn = cols.get("grad_norm")[rows]
    loss = cols.get("loss")[rows]
    has_loss = cols.has("loss")[rows] & np.isfinite(loss)
    extras = np.zeros(n, dtype=bool)
    if cols.full:
        full = np.fromiter(cols.full, dtype=np.int64, count=len(cols.full))
        extras = np.isin(rows, full)
    first = int(steps[0])
    # A quiet row: one the streaming detector only counts.
    prev_scale, had_scale = _previous(scale, has_scale)
    quiet = ~extras
    quiet &= ~has_scale | (had_scale & (scale == prev_scale))
    prev_total, had_total = _previous(total, has_total)
    quiet &= ~has_total | (had_total & (total == prev_total))
    quiet &= ~has_skipped | (skipped == 0)
    entry = has_total | has_skipped
    quiet &= ~entry | (steps - first >= d.skip_grace_steps)
    if first <= d.skip_grace_steps:  # the scaler's calibration (see _calibrating)
        quiet &= steps >= d.calibration_steps
    internal = d.framework in SCALER_INTERNAL
    with_norm = cols.has("grad_norm")[rows] & np.isfinite(gn) & has_scale
    if not internal:
        strict = d.framework != "torch-amp"
        high = d.scaled_max_ratio if strict else math.inf
        with np.errstate(invalid="ignore", over="ignore"):
            scaled = (
                with_norm
                & (scale >= d.scaled_min_scale)
                & (d.scaled_ratio * scale <= gn)
                & (gn <= high * scale)
            )
        if strict:
            scaled &= has_loss
        quiet &= ~scaled
    quiet[0] = False
    loud = np.flatnonzero(~quiet)
    span = np.empty(n, dtype=np.int64)
    span[0] = 1
    span[1:] = np.maximum(1, steps[1:] - steps[:-1])
    update = d.update
    partial = cols.partial
    i = 0
    while i < n:
        if quiet[i] and _still(d):
            j = int(loud[np.searchsorted(loud, i)]) if loud[-1] > i else n
            _count(d, i, j, steps, has_scale, has_total, has_skipped, span, with_norm, internal)
            i = j
            continue
        found += update(partial(int(rows[i]), fields))
        i += 1
    return d, found


def _still(d: ScalerDetector) -> bool:
    """Whether the detector's state lets a quiet record pass without a look: past the
    cold start, no skip left in its window, the scale not at its floor."""
    if d.scale_records < 2 * d.collapse_drops:
        return False
    if any(k for k, _ in d.skips):
        return False
    s, peak = d.prev_scale, d.peak_scale
    return not (s is not None and s <= d.min_scale and (peak or 0) > d.min_scale)


def _count(
    d: ScalerDetector,
    i: int,
    j: int,
    steps: np.ndarray,
    has_scale: np.ndarray,
    has_total: np.ndarray,
    has_skipped: np.ndarray,
    span: np.ndarray,
    with_norm: np.ndarray,
    internal: bool,
) -> None:
    """Quiet rows ``i:j`` as ScalerDetector.update leaves its state."""
    scaled = int(has_scale[i:j].sum())
    if scaled:  # _collapse: the scale held
        d.scale_records += scaled
        d.stable += scaled
        if d.grown or d.stable >= 2:
            d.calibrated = True
        d.drops = 0
        maxlen = d.changes.maxlen
        d.changes.extend([0.0] * (scaled if maxlen is None else min(scaled, maxlen)))
        d.halvings = _halvings_since_growth(d.changes)
    # _skips: a zero for every record with a counter
    totals = has_total[i:j]
    flags = has_skipped[i:j]
    entries = int(totals.sum() + flags.sum())
    if entries:
        d.skip_records += entries
        maxlen = d.skips.maxlen
        keep = entries if maxlen is None else min(entries, maxlen)
        rows = np.flatnonzero(totals | flags)[-keep:] + i if keep else np.zeros(0, np.int64)
        d.skips.extend((0, int(span[r]) if has_total[r] else 1) for r in rows.tolist())
    # _scaled_norm: no norm of the order of the scale
    if not internal and not d.live_flags_seen:
        normed = int(with_norm[i:j].sum())
        if normed:
            d.ratio_records += normed
            d.scaled_run = 0
            d.scaled_losses.clear()
    d.prev_step = int(steps[j - 1])


TWIN = walking_twin(
    ScalerDetector,
    _walk,
    _accepts,
    ("sapper.runtime.detectors.scaler", "sapper.runtime.detectors.base"),
    scratch=8,
    cost=0.005,
)
