"""The gradient-norm rules (R010-R013) over a grad_norm column; twin of
:class:`sapper.runtime.detectors.gradnorm.GradNormDetector`.

Non-finite norms (outside skipped steps), clip saturation (a rolling share of clipped
steps and, where it is high enough, the rolling median of norm / threshold), tiny norms
(a rolling count below the threshold, the median taken where at least half are) and
surges (the log-norm against a rolling robust level, with the same snapshots as the
streaming window). Logarithms are taken with :func:`math.log`, the
function the streaming detector calls, so the numbers agree to the bit.
"""

from __future__ import annotations

import copy
import math
import weakref
from functools import partial
from typing import Any

import numpy as np

from sapper.logs.columnar.frame import Columns
from sapper.logs.columnar.twins.base import Twin, at_rows, finding, row_of, state_is
from sapper.logs.columnar.twins.rolling import (
    RobustSnapshots,
    cooldown_pick,
    exact_log,
    rolling_sum,
    window_medians,
)
from sapper.rules.model import Finding
from sapper.runtime.detectors.base import fmt
from sapper.runtime.detectors.gradnorm import (
    CLIP_SATURATED,
    GRAD_NONFINITE,
    GRAD_SURGE,
    GRAD_TINY,
    GradNormDetector,
    _largest_layer,
    saturation_message,
)
from sapper.runtime.detectors.stats import median

__all__ = ["TWIN"]

_STATE = {
    "fired",
    "clip_threshold",
    "warmup_steps",
    "skip_first",
    "saturate_window",
    "saturate_share",
    "saturate_ratio",
    "clip_ratios",
    "tiny",
    "tiny_window",
    "surge_window",
    "surge_min_history",
    "surge_k",
    "surge_ratio",
    "clipped",
    "log_norms",
    "norms",
    "clipped_count",
    "tiny_count",
    "first_step",
    "cold_ratio",
    "layer_window",
    "layer_min_history",
    "layer_ratio",
    "layer_logs",
    "count",
    "prev_gn",
    "saturation_seen",
    "cold_ratio_start",
    "run_start_steps",
}


def _accepts(det: GradNormDetector) -> bool:
    return (
        state_is(det, _STATE)
        and not det.fired
        and det.first_step is None
        and not det.norms
        and det.saturate_window >= 1
        and det.tiny_window >= 1
        and det.surge_window >= 1
        and det.surge_window >= det.surge_min_history >= 1
        and not det.layer_logs
        and det.surge_ratio > 0
        and det.log_norms.refresh >= 1
    )


def _cooldown(det: GradNormDetector, code: str) -> int | None:
    return det.cooldowns.get(code, det.cooldown)


def run(det: GradNormDetector, cols: Columns) -> list[Finding]:
    _SEEN.pop(det, None)
    has = cols.has("grad_norm")
    rows = None if has.all() else np.flatnonzero(has)  # None: every row (no copies)
    gn = at_rows(cols.get("grad_norm"), rows)
    steps = at_rows(cols.steps, rows)
    fin = np.isfinite(gn)
    out: list[Finding] = []
    surges = _layer_surges(det, cols)
    if len(gn):
        bad = ~fin
        if "skipped" in cols.present:  # a log that never says so skips no step
            skipped = at_rows(cols.get("skipped"), rows)
            bad &= ~(at_rows(cols.has("skipped"), rows) & (np.nan_to_num(skipped) != 0))
        out += _nonfinite(det, gn, steps, bad)
        if fin.all():
            f_rows, g, s = rows, gn, steps
        else:
            keep = np.flatnonzero(fin)
            f_rows = keep if rows is None else rows[keep]
            g, s = gn[keep], steps[keep]
        first_step = int(steps[0])
        del gn, steps, fin
        if len(g):
            out += _saturation(det, cols, f_rows, g, s, first_step)
            surges = _surge(det, cols, f_rows, g, s, first_step) + surges
            out += _tiny(det, g, s)
    # One rule, one cooldown over the global (cold-start and rolling) and per-layer surges;
    # at one step the global test comes first, as in the streaming update.
    surges.sort(key=lambda c: (c[0], c[1]))
    at = np.fromiter((c[0] for c in surges), dtype=np.int64, count=len(surges))
    out += [surges[j][2]() for j in cooldown_pick(at, _cooldown(det, GRAD_SURGE.code))]
    return out


def _layer_surges(det: GradNormDetector, cols: Columns) -> list[tuple[int, int, Any]]:
    """The per-layer surge test on the rows with extras (it reads only
    ``extra["grad_norm_layers"]``), run by a scratch detector that may always fire: its
    findings are candidates for the shared cooldown."""
    scratch = _scratch(det)
    out: list[tuple[int, int, Any]] = []
    has, gn = cols.has("grad_norm"), cols.get("grad_norm")
    for row in sorted(cols.full):
        if has[row] and not math.isfinite(gn[row]):
            continue  # a non-finite norm returns before the layers are looked at
        scratch.fired.clear()
        for f in scratch._layer_surge(cols.record(row)):
            out.append((int(cols.steps[row]), 1, partial(lambda f: f, f)))
    return out


def _scratch(det: GradNormDetector) -> GradNormDetector:
    return copy.deepcopy(det)


def _nonfinite(
    det: GradNormDetector, gn: np.ndarray, steps: np.ndarray, bad: np.ndarray
) -> list[Finding]:
    idx = np.flatnonzero(bad)
    out = []
    for j in cooldown_pick(steps[idx], _cooldown(det, GRAD_NONFINITE.code)):
        i = int(idx[j])
        value, step = float(gn[i]), int(steps[i])
        out.append(
            finding(GRAD_NONFINITE, f"gradient norm is {value} at step {step}", step, value=value)
        )
    return out


#: How many rows the saturation test counted in the last run of each detector, with the
#: columns it ran on: ``unevaluated`` right after ``run`` reads it instead of counting again.
_SEEN: weakref.WeakKeyDictionary[GradNormDetector, tuple[int, int]] = (
    weakref.WeakKeyDictionary()
)


def _eligible(
    det: GradNormDetector,
    cols: Columns,
    rows: np.ndarray | None,
    s: np.ndarray,
    first_step: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The finite-norm rows the saturation test counts (a threshold in force, past the
    first steps) and the threshold per row."""
    own = at_rows(cols.get("clip_threshold"), rows)
    own_set = at_rows(cols.has("clip_threshold"), rows) & (own != 0)  # ``record.clip_threshold or``
    # ``record.clip_threshold or self.clip_threshold``, then ``not t or t <= 0`` skips:
    # a NaN is truthy and passes the comparison, as in the streaming test.
    default = det.clip_threshold
    d_ok = default is not None and bool(default) and not default <= 0
    d_val = float(default) if default is not None else np.nan
    thr = np.where(own_set, own, d_val)
    valid = np.where(own_set, ~(own <= 0), d_ok)
    valid &= ~(s - first_step < max(det.skip_first, det.warmup_steps))
    return np.flatnonzero(valid), thr


def _saturation(
    det: GradNormDetector,
    cols: Columns,
    rows: np.ndarray | None,
    g: np.ndarray,
    s: np.ndarray,
    first_step: int,
) -> list[Finding]:
    idx, thr = _eligible(det, cols, rows, s, first_step)
    _SEEN[det] = (id(cols), len(idx))
    if len(idx) < det.saturate_window:
        return []
    # the counted rows are usually all but the first few: a slice, no copies
    sel = slice(int(idx[0]), int(idx[-1]) + 1) if idx[-1] - idx[0] + 1 == len(idx) else idx
    g_in, thr_in = g[sel], thr[sel]
    w = det.saturate_window
    share = rolling_sum(g_in > thr_in, w) / w
    ok = share >= det.saturate_share
    ok[: w - 1] = False
    cand = np.flatnonzero(ok)
    del ok
    if len(cand):
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = g_in / thr_in
        ratio = np.where(np.isnan(ratio), 0.0, ratio)
        size = window_medians(ratio, cand + 1, w)
        keep = size >= det.saturate_ratio
        cand, size = cand[keep], size[keep]
    out = []
    for j in cooldown_pick(s[idx[cand]], _cooldown(det, CLIP_SATURATED.code)):
        c = int(cand[j])
        i = int(idx[c])
        t, v, sh, step = float(thr[i]), float(g[i]), float(share[c]), int(s[i])
        m = float(size[j])
        out.append(
            finding(
                CLIP_SATURATED,
                saturation_message(det, sh, w, m, t, v),
                step,
                value=sh,
                threshold=det.saturate_share,
                grad_norm=v,
                clip_threshold=t,
                median_ratio=m,
            )
        )
    return out


def _surge(
    det: GradNormDetector,
    cols: Columns,
    rows: np.ndarray | None,
    g: np.ndarray,
    s: np.ndarray,
    first_step: int,
) -> list[tuple[int, int, Any]]:
    """Global surges, the cold-start test on the first ``surge_min_history`` positive
    norms and the rolling test after, as (step, 0, finding maker) candidates."""
    pos = np.flatnonzero(g > 0)
    out: list[tuple[int, int, Any]] = []
    cold = min(len(pos), det.surge_min_history)
    gl = g[: int(pos[cold - 1]) + 1].tolist() if cold else []  # the cold start's rows only
    # ``_cold_ratio``: 100× for a log that starts in the run's first steps, else 10×
    ratio = det.cold_ratio_start if first_step <= det.run_start_steps else det.cold_ratio
    for p in range(1, cold):
        j = int(pos[p])
        value = gl[j]
        ref = median([v for v in gl[max(0, j - det.tiny_window) : j] if v > 0])
        if not ref > 0 or value < ratio * ref:
            continue
        out.append(
            (int(s[j]), 0, partial(_cold_finding, det, cols, row_of(rows, j), value, ref, p, ratio))
        )
    if len(pos) <= det.surge_min_history:
        return out
    logs = exact_log(g[pos])
    snaps = RobustSnapshots(logs, det.surge_window, det.surge_min_history, det.log_norms.refresh)
    log_ratio = math.log(det.surge_ratio)
    # The level is at least the window's minimum: at or below min + log(ratio), no surge.
    calls, v = snaps.above_floor(lambda lo: lo + log_ratio)
    med = snaps.level_at(calls)
    cand = np.flatnonzero(v > med + log_ratio)
    if not len(cand):
        return out
    c_calls, c_med = calls[cand], med[cand]
    sigma = snaps.sigma_at(c_calls, c_med)
    step_of = s[pos]
    k = det.surge_k * np.where(step_of[c_calls] < det.warmup_steps, 2.0, 1.0)
    ks = k * sigma
    margin = np.where(log_ratio > ks, log_ratio, ks)
    hit = np.flatnonzero(v[cand] > c_med + margin)

    def make(h: int) -> Finding:
        i = int(c_calls[h])
        value, step = float(g[pos[i]]), int(step_of[i])
        base = math.exp(float(c_med[h]))
        layer = _largest_layer(cols.record(row_of(rows, int(pos[i]))))
        where = f"; largest in {layer}" if layer else ""
        return finding(
            GRAD_SURGE,
            f"gradient norm {fmt(value)} at step {step} is {fmt(value / base)}× its rolling "
            f"median {fmt(base)}{where}",
            step,
            value=value,
            threshold=base * det.surge_ratio,
            median=base,
        )

    out += [(int(step_of[c_calls[h]]), 0, partial(make, h)) for h in hit.tolist()]
    return out


def _cold_finding(
    det: GradNormDetector, cols: Columns, row: int, gn: float, ref: float, n: int, ratio: float
) -> Finding:
    step = int(cols.steps[row])
    layer = _largest_layer(cols.record(row))
    where = f"; largest in {layer}" if layer else ""
    return finding(
        GRAD_SURGE,
        f"gradient norm {fmt(gn)} at step {step} is {fmt(gn / ref)}× the median "
        f"{fmt(ref)} of the {n} logged step(s) before it; cold start: "
        f"too few for the rolling test, the jump alone exceeds ×{fmt(ratio)}{where}",
        step,
        value=gn,
        threshold=ref * ratio,
        median=ref,
        cold_start=True,
    )


def _tiny(det: GradNormDetector, g: np.ndarray, s: np.ndarray) -> list[Finding]:
    w = det.tiny_window
    if len(g) < w:
        return []
    low = rolling_sum(g < det.tiny, w)
    cand = np.flatnonzero((np.arange(len(g)) >= w - 1) & (low >= (w + 1) // 2))
    if not len(cand):
        return []
    med = window_medians(g, cand + 1, w)
    hit = np.flatnonzero(med < det.tiny)
    out = []
    for j in cooldown_pick(s[cand[hit]], _cooldown(det, GRAD_TINY.code)):
        h = int(hit[j])
        m, step = float(med[h]), int(s[cand[h]])
        out.append(
            finding(
                GRAD_TINY,
                f"median gradient norm over the last {w} logged steps is {fmt(m)}, "
                f"below {fmt(det.tiny)}",
                step,
                value=m,
                threshold=det.tiny,
            )
        )
    return out


def unevaluated(det: GradNormDetector, cols: Columns, found: list[Finding]) -> list[str]:
    """The streaming detector's own lines, from the counters they read."""
    scratch = _scratch(det)
    rows = np.flatnonzero(cols.has("grad_norm"))
    gn = cols.get("grad_norm")[rows]
    fin = np.isfinite(gn)
    scratch.count = int(fin.sum())
    if len(rows):
        scratch.first_step = int(cols.steps[rows[0]])
    if scratch.count:
        seen = _SEEN.pop(det, None)
        if seen is not None and seen[0] == id(cols):
            scratch.saturation_seen = seen[1]
        else:
            f_rows = rows[fin]
            scratch.saturation_seen = len(
                _eligible(det, cols, f_rows, cols.steps[f_rows], int(cols.steps[rows[0]]))[0]
            )
    has, gn_all = cols.has("grad_norm"), cols.get("grad_norm")
    for row in sorted(cols.full):  # the per-layer histories (R013's layer test)
        if has[row] and not math.isfinite(gn_all[row]):
            continue
        scratch.fired.clear()
        scratch._layer_surge(cols.record(row))
    return scratch.unevaluated()


TWIN = Twin(
    cls=GradNormDetector,
    run=run,
    accepts=_accepts,
    unevaluated=unevaluated,
    modules=(
        "sapper.runtime.detectors.gradnorm",
        "sapper.runtime.detectors.stats",
        "sapper.runtime.detectors.base",
    ),
    scratch=42,
    cost=0.065,
)
