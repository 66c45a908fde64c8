"""The cross-rank detectors over per-rank run logs, after the fact.

With ``Monitor(run_log="logs/rank{rank}.jsonl")`` every rank writes its own run log (its
own numbers: rank 0 does not fold in the job's). ``sapper analyze logs/`` then reads the
``rank<N>.jsonl`` files, lines their records up by step and builds one
:class:`~sapper.distributed.table.RankTable` per step the ranks logged — loss, gradient
norm, times, memory, throughput, the non-finite steps derived from the loss and the
norm, and each rank's own loss as its peak (X010; a per-rank log's gradient norm is the
all-reduced one, so the local norm before the all-reduce is not there) — so the X
detectors name ranks offline as they would have live (also for runs
whose exchange was off, or that ended before rank 0 reported).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

from sapper.distributed.table import COLUMNS, DIST_KEY, RankTable
from sapper.runtime.records import StepRecord

__all__ = ["RANK_LOG", "cross_rank_records", "rank_of_path", "ranked_logs"]

#: A per-rank run log's name: ``rank3.jsonl``, ``run-rank3.jsonl``, ``rank_3.jsonl``.
RANK_LOG = re.compile(r"(?:^|[-_.])rank[-_]?(\d+)\.jsonl$")

_FIELDS = (
    "loss",
    "grad_norm",
    "step_time_s",
    "data_time_s",
    "memory_peak_gib",
    "memory_reserved_gib",
    "tokens",
    "samples",
    "tokens_per_s",
    "samples_per_s",
)


def rank_of_path(path: str | Path) -> int | None:
    m = RANK_LOG.search(Path(path).name)
    return int(m.group(1)) if m else None


def ranked_logs(paths: Sequence[str]) -> dict[int, int] | None:
    """rank -> index in ``paths`` when two or more paths are per-rank logs of one folder
    with distinct ranks, else None."""
    by_rank: dict[int, int] = {}
    folders = set()
    for i, p in enumerate(paths):
        r = rank_of_path(p)
        if r is None or r in by_rank:
            continue
        by_rank[r] = i
        folders.add(str(Path(p).parent))
    if len(by_rank) < 2 or len(folders) != 1:
        return None
    return by_rank


def _bad(v: float | None) -> bool:
    return v is not None and not math.isfinite(v)


def cross_rank_records(per_rank: dict[int, Sequence[StepRecord]]) -> list[StepRecord]:
    """One record per step any rank logged, carrying the per-rank table of that step
    (ranks numbered 0..world-1 by their log names; a rank without the step is None)."""
    ranks = sorted(per_rank)
    world = max(ranks) + 1
    at: dict[int, dict[int, StepRecord]] = {}
    for r in ranks:
        for rec in per_rank[r]:
            at.setdefault(rec.step, {})[r] = rec  # a resumed log: the later record wins
    everyone = [list(range(world))]
    out: list[StepRecord] = []
    prev: int | None = None
    for step in sorted(at):
        cols: dict[str, list[float | None]] = {name: [None] * world for name in COLUMNS}
        for r, rec in at[step].items():
            cols["step"][r] = float(step)
            cols["steps"][r] = 1.0
            for name in _FIELDS:
                v = getattr(rec, name)
                cols[name][r] = float(v) if v is not None else None
            loss_bad, grad_bad = _bad(rec.loss), _bad(rec.grad_norm)
            cols["nonfinite_loss_step"][r] = float(step) if loss_bad else -1.0
            cols["nonfinite_grad_step"][r] = float(step) if grad_bad else -1.0
            cols["nonfinite_steps"][r] = float(loss_bad or grad_bad)
            if rec.loss is not None and not loss_bad:  # X010: each rank's own loss
                cols["loss_peak"][r] = abs(float(rec.loss))
                cols["loss_peak_step"][r] = float(step)
        table = RankTable(
            step=step,
            columns=cols,
            data_groups=everyone,
            param_groups=[],
            layout_source="per-rank run logs",
            prev_step=prev,
        )
        prev = step
        out.append(StepRecord(step=step, extra={DIST_KEY: table}))
    return out
