"""The gradient-norm rules (R010-R013) over a grad_norm column; twin of
:class:`sapper.runtime.detectors.gradnorm.GradNormDetector`.

Non-finite norms (outside skipped steps), clip saturation (a rolling share of clipped
steps), tiny norms (a rolling count below the threshold, the median taken where at
least half are) and surges (the log-norm against a rolling robust level, with the same
snapshots as the streaming window). Logarithms are taken with :func:`math.log`, the
function the streaming detector calls, so the numbers agree to the bit.
"""

from __future__ import annotations

import math

import numpy as np

from sapper.logs.columnar.frame import Columns
from sapper.rules.model import Finding
from sapper.runtime.columnar.base import Twin, finding
from sapper.runtime.columnar.rolling import (
    RobustSnapshots,
    cooldown_pick,
    rolling_sum,
    window_medians,
)
from sapper.runtime.detectors.base import fmt
from sapper.runtime.detectors.gradnorm import (
    CLIP_SATURATED,
    GRAD_NONFINITE,
    GRAD_SURGE,
    GRAD_TINY,
    GradNormDetector,
    _largest_layer,
)

__all__ = ["TWIN"]

_STATE = {
    "fired",
    "clip_threshold",
    "warmup_steps",
    "skip_first",
    "saturate_window",
    "saturate_share",
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
}


def _accepts(det: GradNormDetector) -> bool:
    return (
        set(vars(det)) == _STATE
        and not det.fired
        and det.first_step is None
        and not det.norms
        and det.saturate_window >= 1
        and det.tiny_window >= 1
        and det.surge_window >= 1
        and det.surge_min_history >= 1
        and det.surge_ratio > 0
        and det.log_norms.refresh >= 1
    )


def _cooldown(det: GradNormDetector, code: str) -> int | None:
    return det.cooldowns.get(code, det.cooldown)


def run(det: GradNormDetector, cols: Columns) -> list[Finding]:
    rows = np.flatnonzero(cols.has("grad_norm"))
    if not len(rows):
        return []
    gn = cols.get("grad_norm")[rows]
    steps = cols.steps[rows]
    first_step = int(steps[0])
    fin = np.isfinite(gn)
    skipped = cols.has("skipped")[rows] & (np.nan_to_num(cols.get("skipped")[rows]) != 0)
    out = _nonfinite(det, gn, steps, ~fin & ~skipped)
    f_rows = rows[fin]
    g, s = gn[fin], steps[fin]
    if len(g):
        out += _saturation(det, cols, f_rows, g, s, first_step)
        out += _surge(det, cols, f_rows, g, s)
        out += _tiny(det, g, s)
    return out


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


def _saturation(
    det: GradNormDetector,
    cols: Columns,
    rows: np.ndarray,
    g: np.ndarray,
    s: np.ndarray,
    first_step: int,
) -> list[Finding]:
    own = cols.get("clip_threshold")[rows]
    own_set = cols.has("clip_threshold")[rows] & (own != 0)  # ``record.clip_threshold or``
    # ``record.clip_threshold or self.clip_threshold``, then ``not t or t <= 0`` skips:
    # a NaN is truthy and passes the comparison, as in the streaming test.
    default = det.clip_threshold
    d_ok = default is not None and bool(default) and not default <= 0
    d_val = float(default) if default is not None else np.nan
    thr = np.where(own_set, own, d_val)
    valid = np.where(own_set, ~(own <= 0), d_ok)
    valid &= ~(s - first_step < max(det.skip_first, det.warmup_steps))
    idx = np.flatnonzero(valid)
    if len(idx) < det.saturate_window:
        return []
    over = g[idx] > thr[idx]
    w = det.saturate_window
    count = rolling_sum(over, w)
    share = count / w
    cand = np.flatnonzero((np.arange(len(idx)) >= w - 1) & (share >= det.saturate_share))
    out = []
    for j in cooldown_pick(s[idx[cand]], _cooldown(det, CLIP_SATURATED.code)):
        c = int(cand[j])
        i = int(idx[c])
        t, v, sh, step = float(thr[i]), float(g[i]), float(share[c]), int(s[i])
        out.append(
            finding(
                CLIP_SATURATED,
                f"the gradient norm exceeded the clipping threshold {fmt(t)} on "
                f"{fmt(100 * sh)}% of the last {w} logged steps "
                f"(now {fmt(v)}, {fmt(v / t)}× the threshold)",
                step,
                value=sh,
                threshold=det.saturate_share,
                grad_norm=v,
                clip_threshold=t,
            )
        )
    return out


def _surge(
    det: GradNormDetector, cols: Columns, rows: np.ndarray, g: np.ndarray, s: np.ndarray
) -> list[Finding]:
    pos = np.flatnonzero(g > 0)
    if len(pos) <= det.surge_min_history or det.surge_window < det.surge_min_history:
        return []
    logs = np.fromiter(map(math.log, g[pos].tolist()), dtype=np.float64, count=len(pos))
    snaps = RobustSnapshots(logs, det.surge_window, det.surge_min_history, det.log_norms.refresh)
    calls = snaps.calls
    v = logs[calls]
    log_ratio = math.log(det.surge_ratio)
    # The level is at least the window's minimum: at or below min + log(ratio), no surge.
    lo = snaps.floor_at(calls)
    bound = lo + log_ratio
    keep = ~(v < bound - 1e-9 * np.abs(bound))
    calls, v = calls[keep], v[keep]
    med = snaps.level_at(calls)
    cand = np.flatnonzero(v > med + log_ratio)
    if not len(cand):
        return []
    c_calls, c_med = calls[cand], med[cand]
    sigma = snaps.sigma_at(c_calls, c_med)
    step_of = s[pos]
    k = det.surge_k * np.where(step_of[c_calls] < det.warmup_steps, 2.0, 1.0)
    ks = k * sigma
    margin = np.where(log_ratio > ks, log_ratio, ks)
    hit = np.flatnonzero(v[cand] > c_med + margin)
    out = []
    for j in cooldown_pick(step_of[c_calls[hit]], _cooldown(det, GRAD_SURGE.code)):
        h = int(hit[j])
        i = int(c_calls[h])
        value, step = float(g[pos[i]]), int(step_of[i])
        base = math.exp(float(c_med[h]))
        layer = _largest_layer(cols.record(int(rows[pos[i]])))
        where = f"; largest in {layer}" if layer else ""
        out.append(
            finding(
                GRAD_SURGE,
                f"gradient norm {fmt(value)} at step {step} is {fmt(value / base)}× its rolling "
                f"median {fmt(base)}{where}",
                step,
                value=value,
                threshold=base * det.surge_ratio,
                median=base,
            )
        )
    return out


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


TWIN = Twin(
    cls=GradNormDetector,
    run=run,
    accepts=_accepts,
    modules=(
        "sapper.runtime.detectors.gradnorm",
        "sapper.runtime.detectors.stats",
        "sapper.runtime.detectors.base",
    ),
)
