"""The loss rules (R001-R004) over a loss column; twin of
:class:`sapper.runtime.detectors.loss.LossDetector`.

The four rules only share the sequence of finite losses, so each is computed on its
own: non-finite losses and spikes as candidate masks with the cooldown applied over the
few candidates, the no-progress test as a short loop over the first ``flat_horizon``
steps (it is said once), oscillation as rolling flip counts with the amplitude taken at
the steps where the flips are frequent enough.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable
from functools import partial

import numpy as np

from sapper.logs.columnar.frame import Columns
from sapper.logs.columnar.twins.base import Twin, finding, state_is
from sapper.logs.columnar.twins.rolling import (
    RobustSnapshots,
    cooldown_pick,
    rolling_sum,
    window_medians,
    window_reduce,
)
from sapper.rules.model import Finding
from sapper.runtime.detectors.base import fmt
from sapper.runtime.detectors.loss import (
    LOSS_FLAT,
    LOSS_NONFINITE,
    LOSS_OSCILLATING,
    LOSS_SPIKE,
    LossDetector,
)
from sapper.runtime.detectors.stats import median

__all__ = ["TWIN"]

_STATE = {
    "fired",
    "window",
    "min_history",
    "spike_k",
    "spike_rel",
    "warmup_steps",
    "flat_steps",
    "flat_min_drop",
    "flat_horizon",
    "osc_window",
    "osc_flips",
    "osc_amplitude",
    "recent",
    "reference",
    "osc_last",
    "osc_diff",
    "osc_flip_flags",
    "osc_flip_count",
    "first",
    "first_step",
    "nonfinite_steps",
    "cold_ratio",
    "cold_min_jump",
    "cold_climb",
    "finite_count",
    "last_step",
    "osc_min_swing",
}


def _accepts(det: LossDetector) -> bool:
    return (
        state_is(det, _STATE)
        and not det.fired
        and not det.recent
        and det.first_step is None
        and det.window >= det.min_history >= 1
        and det.osc_window >= 2
        and det.reference.refresh >= 1
    )


def _cooldown(det: LossDetector, code: str) -> int | None:
    return det.cooldowns.get(code, det.cooldown)


def run(det: LossDetector, cols: Columns) -> list[Finding]:
    has = cols.has("loss")
    if has.all():  # every row has a loss (a run log): the columns as they are
        loss, steps = cols.get("loss"), cols.steps
    else:
        rows = np.flatnonzero(has)
        loss, steps = cols.get("loss")[rows], cols.steps[rows]
    if not len(loss):
        return []
    fin = np.isfinite(loss)
    out = _nonfinite(det, loss, steps, fin)
    x, s = (loss, steps) if fin.all() else (loss[fin], steps[fin])
    del loss, steps
    if len(x):
        out += _spikes(det, x, s)
        out += _flat(det, x, s)
        out += _oscillation(det, x, s)
    return out


def _nonfinite(
    det: LossDetector, loss: np.ndarray, steps: np.ndarray, fin: np.ndarray
) -> list[Finding]:
    bad = np.flatnonzero(~fin)
    if not len(bad):
        return []
    last_fin = np.maximum.accumulate(np.where(fin, np.arange(len(fin)), -1))
    out = []
    for j in cooldown_pick(steps[bad], _cooldown(det, LOSS_NONFINITE.code)):
        i = int(bad[j])
        value, step = float(loss[i]), int(steps[i])
        k = int(last_fin[i])
        tail = f" (last finite loss {fmt(float(loss[k]))})" if k >= 0 else ""
        out.append(
            finding(LOSS_NONFINITE, f"loss is {value} at step {step}" + tail, step, value=value)
        )
    return out


def _cold(
    det: LossDetector, x: np.ndarray, s: np.ndarray
) -> list[tuple[int, Callable[[], Finding]]]:
    """The cold-start spike test on the first ``min_history`` losses (the streaming
    test itself: a handful of records), as (step, finding) candidates."""
    out = []
    xs = x[: det.min_history].tolist()
    for i in range(1, len(xs)):
        loss, prev = xs[i], xs[:i]
        ref = max(prev[-1], median(prev))
        if ref <= 0 or loss < det.cold_ratio * ref or loss - ref < det.cold_min_jump:
            climb = _climb(det, loss, prev)
            if climb is None:
                continue
            ref, what = climb
        else:
            what = (
                f"is {fmt(loss / ref)}× the loss before it ({fmt(ref)}); cold start: only "
                f"{i} earlier logged step(s), the jump alone exceeds ×{fmt(det.cold_ratio)}"
            )
        step = int(s[i])
        details = {
            "value": loss,
            "threshold": max(det.cold_ratio * ref, ref + det.cold_min_jump),
            "median": ref,
            "cold_start": True,
        }
        message = f"loss {fmt(loss)} at step {step} {what}"
        out.append((step, partial(finding, LOSS_SPIKE, message, step, **details)))
    return out


def _climb(det: LossDetector, loss: float, prev: list[float]) -> tuple[float, str] | None:
    """The streaming ``_cold_climb``: a loss that rose at each of its last ``cold_climb``
    records to ``cold_ratio``× the lowest earlier loss; (that low, the message tail)."""
    k = det.cold_climb
    if len(prev) < k:
        return None
    tail = [*prev[-k:], loss]
    if any(b <= a for a, b in itertools.pairwise(tail)):
        return None
    low = min(prev)
    if low <= 0 or loss < det.cold_ratio * low or loss - low < det.cold_min_jump:
        return None
    return low, (
        f"has climbed to {fmt(loss / low)}× the lowest earlier loss ({fmt(low)}), rising "
        f"at each of its last {k} logged steps; cold start: only {len(prev)} "
        "earlier logged step(s)"
    )


def _spikes(det: LossDetector, x: np.ndarray, s: np.ndarray) -> list[Finding]:
    """Cold-start and robust spikes: one rule, one cooldown over both."""
    cands = _cold(det, x, s) + _robust(det, x, s)
    steps = np.fromiter((c[0] for c in cands), dtype=np.int64, count=len(cands))
    return [cands[j][1]() for j in cooldown_pick(steps, _cooldown(det, LOSS_SPIKE.code))]


def _robust(
    det: LossDetector, x: np.ndarray, s: np.ndarray
) -> list[tuple[int, Callable[[], Finding]]]:
    """The robust test from ``min_history`` losses on: (step, finding maker) per hit."""
    if det.window < det.min_history or len(x) <= det.min_history:
        return []
    snaps = RobustSnapshots(x, det.window, det.min_history, det.reference.refresh)
    rel_k = det.spike_rel
    if 0 <= rel_k < 1:
        # m + rel·|m| grows with m and the median is at least the window's minimum: a
        # loss at or below that bound is no candidate (a hair of margin for rounding).
        calls, v = snaps.above_floor(lambda lo: lo + rel_k * np.abs(lo))
    else:
        calls = snaps.calls
        v = x[calls]
    med = snaps.level_at(calls)
    pre = v > med + rel_k * np.abs(med)
    cand = np.flatnonzero(pre)
    if not len(cand):
        return []
    c_calls = calls[cand]
    c_med = med[cand]
    sigma = snaps.sigma_at(c_calls, c_med)
    k = det.spike_k * np.where(s[c_calls] < det.warmup_steps, 2.0, 1.0)
    rel = rel_k * np.abs(c_med)
    margin = np.where(rel > k * sigma, rel, k * sigma)
    hit = np.flatnonzero(v[cand] > c_med + margin)
    if not len(hit):
        return []

    def make(h: int) -> Finding:
        i = int(c_calls[h])
        value, step = float(x[i]), int(s[i])
        m, sg, mg = float(c_med[h]), float(sigma[h]), float(margin[h])
        z = (value - m) / sg if sg > 0 else math.inf
        n = min(i, det.window)
        return finding(
            LOSS_SPIKE,
            f"loss {fmt(value)} at step {step} is {fmt(z)}σ above the median {fmt(m)} "
            f"of the last {n} logged steps (threshold {fmt(m + mg)})",
            step,
            value=value,
            threshold=m + mg,
            median=m,
            robust_sigma=sg,
        )

    return [(int(s[c_calls[h]]), partial(make, h)) for h in hit.tolist()]


def _flat(det: LossDetector, x: np.ndarray, s: np.ndarray) -> list[Finding]:
    """The streaming test itself over the first ``flat_horizon`` steps: a few hundred
    records at most, and it stops at its first finding (said once per run)."""
    first_step = int(s[0])
    keep = max(det.window, det.osc_window)
    horizon = int(np.searchsorted(s, first_step + det.flat_horizon, side="right"))
    start = max(det.flat_steps, det.warmup_steps)
    cooldown = _cooldown(det, LOSS_FLAT.code)
    out: list[Finding] = []
    last: int | None = None
    xs = x[:horizon].tolist()
    for i in range(horizon):
        step = int(s[i])
        first = xs[: min(i + 1, 5)]
        recent = xs[max(0, i + 1 - keep) : i + 1]
        if len(first) < 3 or len(recent) < 10:
            continue
        elapsed = step - first_step
        if elapsed < start or elapsed > det.flat_horizon:
            continue
        if last is not None and (cooldown is None or step - last < cooldown):
            continue
        ref = min(first[0], median(first))
        tail = recent[-max(5, len(recent) // 5) :]
        now = median(tail)
        drop = (ref - now) / abs(ref) if ref else 0.0
        if drop >= det.flat_min_drop:
            continue
        verb = "rose" if drop < 0 else "barely moved"
        out.append(
            finding(
                LOSS_FLAT,
                f"loss {verb} from {fmt(ref)} to {fmt(now)} over the first {elapsed} steps "
                f"({fmt(100 * drop)}% drop, expected at least {fmt(100 * det.flat_min_drop)}%)",
                step,
                value=drop,
                threshold=det.flat_min_drop,
                initial=ref,
                current=now,
            )
        )
        last = step
        if cooldown is None:
            break
    return out


def _oscillation(det: LossDetector, x: np.ndarray, s: np.ndarray) -> list[Finding]:
    ow = det.osc_window
    m = len(x)
    if m < ow:
        return []
    d = np.diff(x)
    flags = np.zeros(m, dtype=bool)
    if m >= 3:
        np.less(d[:-1] * d[1:], 0, out=flags[2:])
    share = rolling_sum(flags, ow - 2) / max(1, ow - 2)
    del flags  # each full-length temporary let go once read: a lower peak
    ok = share >= det.osc_flips
    ok[: ow - 1] = False
    ok &= s >= det.warmup_steps
    cand = np.flatnonzero(ok)
    del ok
    if not len(cand):
        return []
    share = share[cand]  # the flip share where it is read: at the candidates
    swings = np.abs(d)
    del d
    # The amplitude is at most the largest swing over the smallest level the window
    # allows (when it does not straddle zero); below the limit by that bound, skip it.
    lo = window_reduce(x, cand + 1, ow, "min")
    hi = window_reduce(x, cand + 1, ow, "max")
    top = window_reduce(swings, cand, ow - 1, "max")
    floor = np.where(lo > 0, lo, np.where(hi < 0, -hi, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = np.where(floor > 0, top / np.where(floor > 0, floor, 1.0), np.inf)
    keep = ~(bound < det.osc_amplitude * (1 - 1e-9))
    cand, share = cand[keep], share[keep]
    if not len(cand):
        return []
    level = np.abs(window_medians(x, cand + 1, ow))
    swing = window_medians(swings, cand, ow - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        amp = np.where(level != 0, swing / np.where(level != 0, level, 1.0), 0.0)
    # a tiny loss swinging ×2 is batch noise: the swing itself must reach osc_min_swing
    hit = np.flatnonzero(~(swing < det.osc_min_swing) & (amp >= det.osc_amplitude))
    out = []
    for j in cooldown_pick(s[cand[hit]], _cooldown(det, LOSS_OSCILLATING.code)):
        h = int(hit[j])
        i = int(cand[h])
        fs, a, lv = float(share[h]), float(amp[h]), float(level[h])
        out.append(
            finding(
                LOSS_OSCILLATING,
                f"over the last {ow} logged steps the loss changed direction "
                f"{fmt(100 * fs)}% of the time with a typical swing of "
                f"{fmt(100 * a)}% of its level {fmt(lv)}",
                int(s[i]),
                value=a,
                threshold=det.osc_amplitude,
                flip_share=fs,
            )
        )
    return out


def unevaluated(det: LossDetector, cols: Columns, found: list[Finding]) -> list[str]:
    """The streaming detector's own lines, from the counters they read."""
    has = cols.has("loss")
    every = has.all()
    loss = cols.get("loss") if every else cols.get("loss")[has]
    fin = np.isfinite(loss)
    rows = np.flatnonzero(fin)
    if not every:
        rows = np.flatnonzero(has)[rows]
    scratch = copy.deepcopy(det)
    scratch.finite_count = len(rows)
    scratch.nonfinite_steps = len(loss) - len(rows)
    scratch.first_step = int(cols.steps[rows[0]]) if len(rows) else None
    scratch.last_step = int(cols.steps[rows[-1]]) if len(rows) else None
    return scratch.unevaluated()


TWIN = Twin(
    cls=LossDetector,
    run=run,
    accepts=_accepts,
    unevaluated=unevaluated,
    modules=(
        "sapper.runtime.detectors.loss",
        "sapper.runtime.detectors.stats",
        "sapper.runtime.detectors.base",
    ),
    scratch=58,
    cost=0.08,
)
