"""Helpers shared by the cross-rank detectors: reading the table off a record, wording."""

from __future__ import annotations

from collections.abc import Iterable

from sapper.distributed.table import DIST_KEY, RankTable
from sapper.runtime.records import StepRecord

__all__ = ["fmt_ranks", "table_of", "window_text"]


def table_of(record: StepRecord) -> RankTable | None:
    """The cross-rank table a record carries: the live object, or one rebuilt from a
    logged record (offline)."""
    value = record.extra.get(DIST_KEY)
    if isinstance(value, RankTable):
        return value
    if isinstance(value, dict):
        return RankTable.from_extra(value)
    return None


def fmt_ranks(ranks: Iterable[int]) -> str:
    rs = sorted(ranks)
    if len(rs) == 1:
        return f"rank {rs[0]}"
    return "ranks " + ", ".join(str(r) for r in rs)


def window_text(table: RankTable) -> str:
    if table.prev_step is None:
        return f"the window ending at step {table.step}"
    return f"steps {table.prev_step + 1}–{table.step}"
