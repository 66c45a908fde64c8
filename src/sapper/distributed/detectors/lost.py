"""X005: a rank stopped answering sapper's exchange (crashed, hung or cut off)."""

from __future__ import annotations

from sapper.distributed.detectors._common import fmt_ranks
from sapper.distributed.reduce import ChannelLost
from sapper.distributed.rules import RANK_LOST
from sapper.rules.model import Finding

__all__ = ["RANK_LOST", "lost_rank_finding"]


def lost_rank_finding(lost: ChannelLost, world_size: int, timeout_s: float) -> Finding:
    """The finding for a closed side channel; sapper stops its cross-rank checks."""
    if lost.missing:
        seen = ", ".join(
            f"rank {r} last at step {lost.last_seen[r]}"
            if lost.last_seen.get(r, -1) >= 0
            else f"rank {r} never"
            for r in lost.missing[:8]
        )
        msg = f"{fmt_ranks(lost.missing)} did not reach the exchange at step {lost.step} ({seen})"
    elif not lost.last_seen:
        msg = (
            f"the exchange at step {lost.step} failed and the job's store is unreachable "
            f"(its host, rank 0 outside torchrun, may be the lost rank): {lost.reason}"
        )
    else:
        msg = f"the exchange at step {lost.step} failed ({lost.reason})"
    how = (
        f"no answer within {timeout_s:g} s"
        if lost.timed_out
        else f"the connection failed after {lost.waited_s:.2f} s"
    )
    msg += f": {how}; sapper stopped its cross-rank checks, training goes on"
    return RANK_LOST.finding(
        msg,
        step=lost.step,
        rank=lost.missing[0] if lost.missing else None,
        value=float(len(lost.missing)) if lost.missing else None,
        threshold=timeout_s,
        ranks=lost.missing,
        world_size=world_size,
        reason=lost.reason,
        timed_out=lost.timed_out,
    )
