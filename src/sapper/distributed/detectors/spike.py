"""X010: the rank whose batch made a huge but finite loss or gradient, before the all-reduce
spread it to every rank.

Under DDP one rank's bad batch becomes every rank's gradient-norm spike (R013 on rank 0):
after the all-reduce the global norm is the same everywhere. What is still the rank's own
is what X001 already measures before the reduction — the window's peak local gradient
norm (``local_grad_norm``, a DDP communication hook) and peak loss (``loss_peak``), each
with its step. A rank is named when, at one exchange, its value is

* at least ``ratio`` times the median of the other ranks' values, and
* at least ``ratio`` times its own recent level (the median of its last windows), while
  the other ranks stayed near theirs (a spike on every rank — an LR spike, a hard batch
  for everyone — is the global rules' business, not a rank's).

With three ranks or more the other ranks' median alone suffices before a history exists;
with two, "the others" is one rank, so its own history is required. Windows where any
rank went non-finite are X001's. The samples of the spiking step come from the tracker's
second, small gather (:meth:`RankTracker._spike_detail`): the loop's own ids when its
batches carry them, else the samples' fingerprints.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

from sapper.distributed.detectors._common import table_of
from sapper.distributed.rules import SPIKE_ON_RANK
from sapper.distributed.table import RankTable
from sapper.rules.model import Finding
from sapper.runtime.detector import Detector
from sapper.runtime.records import StepRecord

__all__ = ["SPIKE_ON_RANK", "SPIKE_RATIO", "SpikeRankDetector", "spike_suspects"]

#: A rank's value this many times the others' median (and its own level) is its own spike.
SPIKE_RATIO = 10.0
#: Per-rank values before the all-reduce, strongest first: (column, its step, words).
_METRICS = (
    ("local_grad_norm", "local_grad_peak_step", "local gradient norm before the all-reduce"),
    ("loss_peak", "loss_peak_step", "loss"),
)
_TINY = 1e-12


def _finite(table: RankTable, name: str) -> dict[int, float]:
    return {
        r: float(v)
        for r, v in enumerate(table.col(name))
        if v is not None and math.isfinite(v)
    }


def _went_nonfinite(table: RankTable) -> bool:
    """Some rank saw a non-finite value in the window: X001's."""
    for name in ("nonfinite_steps",):
        if any(v is not None and v > 0 for v in table.col(name)):
            return True
    for name in ("nonfinite_loss_step", "nonfinite_grad_step", "local_grad_nonfinite_step",
                 "output_nonfinite_step"):
        if any(v is not None and v >= 0 for v in table.col(name)):
            return True
    return False


def _cross(vals: dict[int, float]) -> tuple[int, float, float] | None:
    """The rank with the largest value, its value and the median of the others'."""
    if len(vals) < 2:
        return None
    top = max(vals, key=lambda r: vals[r])
    others = [v for r, v in vals.items() if r != top]
    return top, vals[top], statistics.median(others)


def spike_suspects(table: RankTable, ratio: float = SPIKE_RATIO) -> list[int]:
    """Ranks whose loss or local gradient norm is at least ``ratio`` times the other
    ranks' median in this table alone (the cross-rank half of X010's test). Every rank
    holding the same gathered rows gets the same answer."""
    if _went_nonfinite(table):
        return []
    out: set[int] = set()
    for name, _, _ in _METRICS:
        got = _cross(_finite(table, name))
        if got is not None and got[1] >= ratio * max(abs(got[2]), _TINY):
            out.add(got[0])
    return sorted(out)


class SpikeRankDetector(Detector):
    """Names the rank whose own loss or local gradient norm spiked far above the other
    ranks' and its own recent level; once per episode (a window without it re-arms)."""

    rules = (SPIKE_ON_RANK,)

    def __init__(
        self, ratio: float = SPIKE_RATIO, history: int = 8, min_history: int = 2
    ) -> None:
        self.ratio = float(ratio)
        self.min_history = int(min_history)
        self._size = int(history)
        #: column -> rank -> its last windows' values.
        self.history: dict[str, dict[int, deque[float]]] = {m[0]: {} for m in _METRICS}
        self.reported: set[int] = set()

    def _level(self, name: str, rank: int) -> float | None:
        h = self.history[name].get(rank)
        if h is None or len(h) < self.min_history:
            return None
        return statistics.median(h)

    def _remember(self, name: str, vals: dict[int, float]) -> None:
        for r, v in vals.items():
            self.history[name].setdefault(r, deque(maxlen=self._size)).append(v)

    def _judge(self, name: str, vals: dict[int, float]) -> dict[str, Any] | None:
        got = _cross(vals)
        if got is None:
            return None
        rank, value, others = got
        if value < self.ratio * max(abs(others), _TINY):
            return None
        level = self._level(name, rank)
        if level is None:
            if len(vals) < 3:  # two ranks: the other is no crowd; its own history must speak
                return None
        elif value < self.ratio * max(abs(level), _TINY):
            return None
        rises = [
            vals[r] / max(abs(lv), _TINY)
            for r in vals
            if r != rank and (lv := self._level(name, r)) is not None
        ]
        if rises and statistics.median(rises) >= self.ratio:
            return None  # the others spiked too: not this rank's alone
        return {"rank": rank, "value": value, "others": others, "level": level}

    def update(self, record: StepRecord) -> list[Finding]:
        table = table_of(record)
        if table is None or table.sparse or _went_nonfinite(table):
            return []
        hits: dict[int, tuple[str, str, str, dict[str, Any]]] = {}
        for name, step_col, words in _METRICS:
            vals = _finite(table, name)
            hit = self._judge(name, vals)
            if hit is not None and hit["rank"] not in hits:
                hits[hit["rank"]] = (name, step_col, words, hit)
            self._remember(name, vals)
        out: list[Finding] = []
        for rank, (name, step_col, words, hit) in sorted(hits.items()):
            if rank in self.reported:
                continue
            out.append(self._finding(table, rank, name, step_col, words, hit))
        self.reported = set(hits)
        return out

    def _finding(
        self, table: RankTable, rank: int, name: str, step_col: str, words: str,
        hit: dict[str, Any],
    ) -> Finding:
        at = table.col(step_col)[rank]
        step = int(at) if at is not None and at >= 0 else table.step
        value, others, level = hit["value"], hit["others"], hit["level"]
        ratio = value / max(abs(others), _TINY)
        msg = (
            f"rank {rank}: its {words} was {value:.3g} at step {step}, "
            f"{ratio:.0f}× the other ranks' median {others:.3g}"
        )
        if level is not None:
            msg += f" and {value / max(abs(level), _TINY):.0f}× its own recent level {level:.3g}"
        extra = []
        for other, _, other_words in _METRICS:
            if other == name:
                continue
            col = _finite(table, other)
            if rank in col and len(col) > 1:
                rest = statistics.median(v for r, v in col.items() if r != rank)
                extra.append(f"its {other_words} {col[rank]:.3g} vs {rest:.3g}")
        if extra:
            msg += "; " + "; ".join(extra)
        msg += " — the gradient all-reduce spread it to every rank"
        samples = _samples_of(table, rank, step)
        if samples:
            kind = "ids" if samples["kind"] == "ids" else "fingerprints"
            shown = ", ".join(str(s) for s in samples["samples"][:8])
            more = len(samples["samples"]) - 8
            msg += f"; its samples of step {step} ({kind}): {shown}"
            if more > 0:
                msg += f" (+{more} more)"
        data: dict[str, Any] = {
            "metric": name,
            "values": {str(r): v for r, v in _finite(table, name).items()},
            "others_median": others,
            "own_level": level,
            "ratio": ratio,
        }
        if samples:
            data["samples"] = samples["samples"]
            data["samples_kind"] = samples["kind"]
        return SPIKE_ON_RANK.finding(
            msg, step=step, rank=rank, value=ratio, threshold=self.ratio, **data
        )


def _samples_of(table: RankTable, rank: int, step: int) -> dict[str, Any] | None:
    per = table.detail.get("spike_samples", {}).get(str(rank)) or {}
    got = per.get(step, per.get(str(step)))
    return got if isinstance(got, dict) and got.get("samples") else None
