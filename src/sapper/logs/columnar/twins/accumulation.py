"""The accumulation rules (R080-R082); twin of
:class:`sapper.runtime.detectors.accumulation.AccumulationDetector`.

R080 and R081 read the live monitor's extras (a few rows): the streaming detector
itself is fed those rows, stripped of the batch size and LR so its batch test stays
out. R082 (the batch changed, the LR did not) reads a size and an LR on every row; it
is a small state machine, walked here in blocks: the run of out-of-band sizes that
confirms a change is found with numpy, so Python only sees each confirmed change.
"""

from __future__ import annotations

import copy

import numpy as np

from sapper.logs.base import new_record
from sapper.logs.columnar.frame import Columns
from sapper.logs.columnar.twins.base import Twin, finding, row_of, state_is
from sapper.rules.model import Finding
from sapper.runtime.detector import DetectorSet
from sapper.runtime.detectors.accumulation import BATCH_CHANGED_LR_KEPT, AccumulationDetector
from sapper.runtime.detectors.base import fmt

__all__ = ["TWIN"]

_STATE = {
    "fired",
    "weight_tolerance",
    "patience",
    "token_spread",
    "batch_change",
    "lr_kept",
    "heavy",
    "uneven",
    "base_batch",
    "base_lr",
    "changed",
    "weights_seen",
    "batch_seen",
    "clip_steps",
    "clip_engaged",
}
_BLOCK = 4096


def _accepts(det: AccumulationDetector) -> bool:
    return state_is(det, _STATE) and not det.fired and det.base_batch is None


def run(det: AccumulationDetector, cols: Columns) -> list[Finding]:
    return _extras(det, cols) + _batch(det, cols)


def _extras(det: AccumulationDetector, cols: Columns) -> list[Finding]:
    # the rows with extras a detector reads (a row of other extras changes nothing here)
    rows = sorted(cols.full)
    if not rows:
        return []
    own = copy.deepcopy(det)
    records = []
    for i in rows:
        rec = new_record(int(cols.steps[i]))
        rec.extra = cols.record(i).extra
        records.append(rec)
    dset = DetectorSet([own])
    found = dset.run(records)
    if dset.failed:
        raise RuntimeError(dset.failed)  # the streaming fallback reports it as it does
    return found


def _batch(det: AccumulationDetector, cols: Columns) -> list[Finding]:
    has_samples: np.ndarray | None = None  # None: no row has samples (the tokens count)
    if "samples" in cols.present:
        has_samples = cols.has("samples")
        size = np.where(has_samples, cols.get("samples"), cols.get("tokens"))
        has_size = has_samples | cols.has("tokens")
    else:
        size, has_size = cols.get("tokens"), cols.has("tokens")
    lr = cols.get("lr")
    valid = has_size & ~(size <= 0) & cols.has("lr") & np.isfinite(lr)
    rows: np.ndarray | None = None  # None: every row (a run log's), read in place
    if valid.all():
        sz, lrs, steps = size, lr, cols.steps
    else:
        rows = np.flatnonzero(valid)
        sz, lrs, steps = size[rows], lr[rows], cols.steps[rows]
    del valid
    m = len(sz)
    if not m:
        return []
    base_b, base_lr = float(sz[0]), float(lrs[0])
    changed, pos, block = 0, 1, _BLOCK
    bc, patience = det.batch_change, max(1, det.patience)
    out: list[Finding] = []
    while pos < m:
        end = min(m, pos + block)
        ratio = sz[pos:end] / base_b
        inband = (1 / bc < ratio) & (ratio < bc)
        k_idx = np.arange(end - pos)
        last_in = np.maximum.accumulate(np.where(inband, k_idx, -1))
        run_len = np.where(last_in >= 0, k_idx - last_in, k_idx + 1 + changed)
        hit = np.flatnonzero(~inband & (run_len >= patience))
        if not len(hit):
            if last_in[-1] >= 0:
                base_lr = float(lrs[pos + int(last_in[-1])])
            changed = int(run_len[-1])
            pos, block = end, block * 2
            continue
        k = int(hit[0])
        if last_in[k] >= 0:
            base_lr = float(lrs[pos + int(last_in[k])])
        i = pos + k
        new_b, new_lr = float(sz[i]), float(lrs[i])
        old_batch, old_lr = base_b, base_lr or new_lr
        r = float(ratio[k])
        base_b, base_lr, changed = new_b, new_lr, 0
        lr_ratio = new_lr / old_lr if old_lr else 1.0
        if not abs(lr_ratio - 1) > det.lr_kept:
            row = row_of(rows, i)
            unit = "samples" if has_samples is not None and has_samples[row] else "tokens"
            out.append(
                finding(
                    BATCH_CHANGED_LR_KEPT,
                    f"the batch went from {fmt(old_batch)} to {fmt(new_b)} {unit} per step "
                    f"({fmt(r)}×) while the LR stayed at {fmt(new_lr)} "
                    f"({fmt(lr_ratio)}× before)",
                    int(steps[i]),
                    value=r,
                    threshold=bc,
                    lr_ratio=lr_ratio,
                )
            )
        pos, block = i + 1, _BLOCK
    return out


def unevaluated(det: AccumulationDetector, cols: Columns, found: list[Finding]) -> list[str]:
    """The streaming detector's own lines, from what it saw: per-micro-batch weights or
    token counts (extras), a batch size."""
    scratch = copy.deepcopy(det)
    rows = sorted(cols.full)  # the rows with extras
    scratch.weights_seen = any(
        "loss_weight" in cols.record(i).extra or "micro_tokens" in cols.record(i).extra
        for i in rows
    )
    scratch.batch_seen = bool((cols.has("samples") | cols.has("tokens")).any())
    return scratch.unevaluated()


TWIN = Twin(
    cls=AccumulationDetector,
    run=run,
    accepts=_accepts,
    unevaluated=unevaluated,
    modules=("sapper.runtime.detectors.accumulation", "sapper.runtime.detectors.base"),
    scratch=68,
    cost=0.04,
)
