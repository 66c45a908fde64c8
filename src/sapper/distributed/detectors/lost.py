"""X005: a rank stopped answering sapper's exchange (crashed, hung or cut off)."""

from __future__ import annotations

from sapper.distributed.detectors._common import fmt_ranks
from sapper.distributed.reduce import ChannelLost
from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register

__all__ = ["RANK_LOST", "lost_rank_finding"]

RANK_LOST = register(
    Rule(
        code="X005",
        name="rank-lost",
        check="distributed",
        severity=Severity.ERROR,
        title="A rank stopped answering: crashed, hung or unreachable",
        why="""\
When one rank dies (out of memory, a segfault, a lost node) or hangs (a deadlock, a
stuck filesystem read, a mismatched collective), the other ranks block in their next
collective until its timeout — NCCL's default is 10 minutes, often raised to hours — and
then die with an error that names no culprit. A monitor whose own collective waited
forever would add one more hang.""",
        signs="""\
Throughput drops to zero on every rank at once; GPU utilization falls to 0 or sits at
100% in an NCCL kernel; the launcher reports a failed child long after the fact.""",
        fix="""\
Read the named rank's own log and exit status (OOM killer, segfault, Python traceback)
and its node's health; with torchrun the agent restarts the group
(--max-restarts) from the last checkpoint. Set a collective timeout that fits the job
(init_process_group(timeout=...)) and enable TORCH_NCCL_ASYNC_ERROR_HANDLING so a hang
becomes an error.""",
        seed="§4.3, §5.1 (6)",
    )
)


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
