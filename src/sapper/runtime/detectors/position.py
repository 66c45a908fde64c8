"""Position overflow (seed §5.3): sequences longer than the positions the model has.

A learned position table indexed past its end raises (CPU) or trips a device-side assert
(CUDA) in the middle of a step; some code paths clamp or wrap instead, and RoPE models
simply extrapolate past the context they were trained at. Either way the model sees
positions it never learned. The live monitor checks every micro-batch's length and
position ids *before* the forward pass and records ``extra["max_position"]`` (largest
position index used, 0-based), ``extra["position_limit"]`` (table size or trained
context) and ``extra["position_kind"]`` (``learned`` / ``rope``). A script (or a model)
that wraps or clamps its position ids never indexes past the table, so the monitor also
records the sequence length the model received (``extra["position_seq_len"]``) and, when
the ids were evidently ``i mod m`` or ``min(i, m-1)``, ``extra["position_reuse"]``
(``wrapped`` / ``clamped``): that is R091. ``position_source`` (where the limit was read)
and ``position_site`` (where the positions were seen) go into the messages.

A learned table is an error (it crashes, or the positions are wrong); RoPE past its
trained context is a warning (nothing is wrong by construction, but the rotations are
unseen), as for the plan checks D101 / D102.
"""

from __future__ import annotations

from typing import Any

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector
from sapper.runtime.records import StepRecord

__all__ = ["POSITION_OVERFLOW", "POSITION_REUSED", "PositionDetector"]

POSITION_OVERFLOW = register(
    Rule(
        code="R090",
        name="position-overflow",
        check="data",
        severity=Severity.ERROR,
        title="Positions beyond the model's position table or trained context",
        why="""\
A learned position table has max_position_embeddings rows: a longer sequence indexes past
it (a crash, or silent clamping/wrapping in some kernels); RoPE models run past the context
they were trained at and attend with rotations they never saw. Either way the model is fed
positions it cannot represent, silently degrading it.

Frameworks: any model with learned or RoPE positions that the live monitor watches (the
position indices it sees); not readable from a log.""",
        signs="""\
Sequence length or position ids ≥ max_position_embeddings; a loss that is worse on long
samples; a device-side assert in an embedding lookup.""",
        fix="""\
Truncate or pack sequences to the model's context; or extend the context on purpose
(RoPE scaling with the right original_max_position_embeddings, a resized position
table) and fine-tune on long data.""",
        seed="§5.3",
    )
)


POSITION_REUSED = register(
    Rule(
        code="R091",
        name="positions-wrapped",
        check="data",
        severity=Severity.ERROR,
        title="Sequences longer than the model's positions, with position ids wrapped or clamped",
        why="""\
The model receives sequences longer than its position table (or RoPE's trained context),
but the position ids were wrapped (position = i mod max_positions) or clamped
(min(i, max_positions - 1)) to fit, by the training script or inside the model. No index
passes the table, so nothing crashes and R090's largest-position test stays silent; but
wrapped tokens max_positions apart share a position (attention cannot tell them apart)
and clamped tokens all sit at the last position. The model trains on a context it cannot
represent, and the only visible effect is a loss that is worse than it should be.

Frameworks: any model with learned or RoPE positions that the live monitor watches (the
sequence length it receives and its position ids); not readable from a log.""",
        signs="""\
Sequence length above max_position_embeddings / n_positions / block_size while the largest
position id stays below it; a loss that plateaus higher than a run at the model's
context; `% max_pos` or `.clamp(max=...)` on position ids in the data pipeline or model.""",
        fix="""\
Truncate or pack sequences to the model's context instead of wrapping the positions; or
extend the context on purpose (a larger or interpolated position table, RoPE scaling)
and fine-tune on long data.""",
        seed="§5.3",
    )
)


def _what(kind: str | None, extra: dict[str, Any]) -> str:
    """The limit in words: a learned table, RoPE's trained context (and its scaling)."""
    if kind == "learned":
        return "the learned position table has"
    if kind == "rope":
        factor, trained = extra.get("position_rope_factor"), extra.get("position_trained")
        if isinstance(factor, (int, float)) and isinstance(trained, int):
            return (
                f"RoPE trained on {trained} positions with rope_scaling factor {factor:g} "
                "supports"
            )
        return "RoPE (no rope_scaling) was trained on"
    return "the model supports"


def _source(extra: dict[str, Any]) -> str:
    source = extra.get("position_source")
    return f" ({source})" if isinstance(source, str) and source else ""


class PositionDetector(RuleDetector):
    """R090 over ``extra["max_position"]`` and the model's limit; R091 over the sequence
    length when the positions were wrapped or clamped to fit."""

    name = "position"
    rules = (POSITION_OVERFLOW, POSITION_REUSED)
    cooldown = None

    def __init__(self, *, limit: int | None = None, kind: str | None = None) -> None:
        super().__init__()
        self.limit = limit
        self.kind = kind
        self.positions_seen = False

    def unevaluated(self) -> list[str]:
        """R090-R091 read the largest position index and the sequence length per step,
        which only the live monitor records."""
        if self.positions_seen:
            return []
        return [
            "R090-R091 position overflow: not evaluated — needs the live monitor's position "
            "indices (max_position per step)"
        ]

    def update(self, record: StepRecord) -> list[Finding]:
        extra = record.extra
        if "max_position" not in extra:  # the live monitor's reading; a log has none
            return []
        pos = extra.get("max_position")
        self.positions_seen = self.positions_seen or isinstance(pos, int)
        limit = extra.get("position_limit") or self.limit
        if not isinstance(pos, int) or not isinstance(limit, int):
            return []
        kind = extra.get("position_kind") or self.kind
        # As D101 / D102: a learned table is an error, RoPE past its context a warning.
        severity = Severity.WARNING if kind == "rope" else None
        seq = extra.get("position_seq_len")
        tokens = f"{seq} tokens" if isinstance(seq, int) else f"{pos + 1}+ tokens"
        site = extra.get("position_site")
        where = f" {site}" if isinstance(site, str) and site else ""
        what, source = _what(kind, extra), _source(extra)
        if pos >= limit:
            return self.fire(
                POSITION_OVERFLOW,
                record.step,
                f"position index {pos} used at step {record.step}{where} (sequence of "
                f"{tokens}); {what} {limit} positions{source}",
                severity=severity,
                value=pos,
                threshold=limit - 1,
            )
        reuse = extra.get("position_reuse")
        if not isinstance(seq, int) or seq <= limit or reuse not in ("wrapped", "clamped"):
            return []
        if reuse == "wrapped":
            how = (
                f"wrapped{where} (position = i mod {pos + 1}, largest id {pos}): tokens "
                f"{pos + 1} apart share a position"
            )
            unless = (
                f" (unless these are packed documents of exactly {pos + 1} tokens, masked "
                "from each other)"
            )
        else:
            how = (
                f"clamped{where} at {pos}: the last {seq - pos - 1} tokens of each sequence "
                f"share position {pos}"
            )
            unless = ""
        return self.fire(
            POSITION_REUSED,
            record.step,
            f"sequences of {tokens} at step {record.step}, but {what} {limit} "
            f"positions{source}; the position ids were {how}. Nothing fails: the model "
            f"silently trains past its context{unless}",
            severity=severity,
            value=seq,
            threshold=limit,
        )
