"""Micro-batches whose activations a pipeline stage holds at once (seed §4.1).

Under 1F1B stage ``i`` of ``p`` runs ``p - i`` forwards before its first backward, so the
first stage holds the activations of up to ``p`` micro-batches and the last of one.
GPipe runs every forward first and holds all ``m``. The interleaved schedule (``v``
model chunks per GPU) warms up with ``2(p - i - 1) + (v - 1)p`` chunk forwards, each a
``1/v`` share of the stage's layers. Without a pipeline one micro-batch is in flight at
a time, whatever the gradient accumulation.
"""

from __future__ import annotations

from sapper.memory.inputs import Shape

__all__ = ["in_flight"]


def in_flight(sh: Shape, stage: int) -> float:
    """Micro-batches of full-stage activations held at the peak (may be fractional for
    the interleaved schedule, where chunks of a stage are in flight)."""
    p, m = sh.pp, sh.micro_batches
    if p == 1:
        return 1.0
    if sh.schedule == "gpipe":
        return float(m)
    if sh.schedule == "interleaved" and sh.vpp > 1:
        v = sh.vpp
        chunks = min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
        return chunks / v
    return float(min(p - stage, m))
