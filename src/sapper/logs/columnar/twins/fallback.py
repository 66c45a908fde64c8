"""Detectors without a vectorised twin, fed record by record, but only the rows that
can change what they do.

Each entry of :data:`READS` names the fields a streaming detector reads and the rows
it must see; every other row is one its ``update`` returns from without touching its
state (it lacks every field the detector reads), so leaving it out changes nothing.
The rows it does see are built from the columns with only those fields (and their
extras), which is far cheaper than whole records. A detector not listed here (a
plugin, a new one) sees every row with every field: slower, never different.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sapper.logs.columnar.frame import BOOL_FIELDS, FLOAT_FIELDS, INT_FIELDS, Columns
from sapper.rules.model import Finding
from sapper.runtime.detector import Detector, DetectorSet

__all__ = ["READS", "Reads", "rows_for", "run_streaming"]

_ALL = (*FLOAT_FIELDS, *INT_FIELDS, *BOOL_FIELDS)


@dataclass(frozen=True)
class Reads:
    """The fields a detector reads and the rows that matter to it."""

    fields: tuple[str, ...]
    rows: Callable[[Detector, Columns], np.ndarray]


def _extras(cols: Columns) -> np.ndarray:
    mask = np.zeros(len(cols), dtype=bool)
    if cols.full:
        mask[np.fromiter(cols.full, dtype=np.int64, count=len(cols.full))] = True
    return mask


def _any(cols: Columns, names: tuple[str, ...]) -> np.ndarray:
    mask = _extras(cols)
    for name in names:
        mask |= cols.has(name)
    return mask


def _first(mask: np.ndarray) -> np.ndarray:
    """Row 0 too: detectors that note the first step of the stream."""
    if len(mask):
        mask[0] = True
    return mask


def _extras_only(det: Detector, cols: Columns) -> np.ndarray:
    return _extras(cols)


def _scaler_rows(det: Detector, cols: Columns) -> np.ndarray:
    # Every update notes the step as ``prev_step``, read only by a row with
    # ``skipped_total`` (the span since the record before it): that row's predecessor
    # is fed too. ``first_step`` comes from row 0.
    mask = _any(cols, ("loss_scale", "skipped", "skipped_total"))
    total = np.flatnonzero(cols.has("skipped_total"))
    mask[total[total > 0] - 1] = True
    return _first(mask)


def _lr_rows(det: Detector, cols: Columns) -> np.ndarray:
    # A record without an LR only brings the live monitor's scheduler-call counts (extras).
    return _any(cols, ("lr",))


def _structure_rows(det: Detector, cols: Columns) -> np.ndarray:
    # The warmup probe reads finite LRs until it has decided, ``warmup_probe_steps``
    # after the first one; later LRs are never read.
    mask = _extras(cols)
    lr = cols.get("lr")
    fin = np.flatnonzero(cols.has("lr") & np.isfinite(lr))
    if len(fin):
        steps = cols.steps[fin]
        probe = getattr(det, "warmup_probe_steps", None)
        stop = (
            len(fin)
            if not isinstance(probe, int)
            else int(np.searchsorted(steps, steps[0] + probe, side="left"))
        )
        mask[fin[: stop + 1]] = True
    return mask


def _eval_rows(det: Detector, cols: Columns) -> np.ndarray:
    # The training losses are kept in a window of ``train_window`` and read only at an
    # evaluation: the window's worth of finite losses before each evaluation is fed.
    mask = _any(cols, ("eval_loss",))
    evals = np.flatnonzero(mask)
    window = getattr(getattr(det, "train", None), "maxlen", None)
    loss = cols.get("loss")
    fin = np.flatnonzero(cols.has("loss") & np.isfinite(loss))
    if window is None:
        mask[fin] = True
        return mask
    if len(evals) and len(fin) and window > 0:
        # Index in ``fin`` of the last finite loss at or before each evaluation.
        upto = np.searchsorted(fin, evals, side="right")
        for end in np.unique(upto):
            mask[fin[max(0, end - window) : end]] = True
    return mask


def _data_rows(det: Detector, cols: Columns) -> np.ndarray:
    # Fingerprints (extras) and the loss on the same rows; evaluations anywhere.
    return _any(cols, ("eval_loss",))


def _accumulation_rows(det: Detector, cols: Columns) -> np.ndarray:
    # The batch-size test needs a size and an LR on the same row; the rest are extras.
    # The first row with a size is fed even without an LR: it is what tells the detector
    # that the log has batch sizes at all (its "not evaluated" line).
    sized = cols.has("samples") | cols.has("tokens")
    mask = _extras(cols) | (sized & cols.has("lr"))
    first = np.flatnonzero(sized)
    if len(first):
        mask[first[0]] = True
    return mask


READS: dict[str, Reads] = {
    "NumericsDetector": Reads((), _extras_only),
    "PositionDetector": Reads((), _extras_only),
    "DuplicateDataDetector": Reads(("loss", "eval_loss"), _data_rows),
    "SetupDetector": Reads((), _extras_only),
    # the loss too: a run of scaled-looking norms counts only where the loss is finite
    "ScalerDetector": Reads(
        ("loss_scale", "skipped", "skipped_total", "grad_norm", "clip_threshold", "loss"),
        _scaler_rows,
    ),
    "LRDetector": Reads(("lr",), _lr_rows),
    "StructureDetector": Reads(("lr",), _structure_rows),
    "EvalLossDetector": Reads(("loss", "eval_loss"), _eval_rows),
    "AccumulationDetector": Reads(("samples", "tokens", "lr"), _accumulation_rows),
}


def rows_for(det: Detector, cols: Columns) -> tuple[np.ndarray, tuple[str, ...]]:
    """The rows ``det`` is fed and the fields its records carry."""
    reads = READS.get(type(det).__name__)
    if reads is None or type(det).__module__.split(".")[:3] != ["sapper", "runtime", "detectors"]:
        return np.arange(len(cols)), _ALL
    return np.flatnonzero(reads.rows(det, cols)), reads.fields


def run_streaming(
    det: Detector,
    cols: Columns,
    rows: np.ndarray | None = None,
    fields: tuple[str, ...] | None = None,
) -> tuple[list[Finding], dict[str, str], list[str]]:
    """Feed ``det`` its rows as records and finish it: its findings, its failure if it
    raised (as :class:`DetectorSet` reports it) and what it could not evaluate."""
    if rows is None or fields is None:
        rows, fields = rows_for(det, cols)
    dset = DetectorSet([det])
    if fields is _ALL:  # a detector not listed in READS: whole records, extras included
        found = dset.run(cols.record(i) for i in rows.tolist())
    else:
        partial = cols.partial
        found = dset.run(partial(int(i), fields) for i in rows)
    unevaluated = dset.unevaluated()
    return found, dict(dset.failed), unevaluated
