"""One training step as the detectors see it, whoever recorded it.

The live monitor, the offline log readers (HF ``trainer_state.json``, TensorBoard, CSV,
Megatron text logs) and ``sapper watch`` all produce :class:`StepRecord` objects, so the
same detectors serve every one of them. Every field but ``step`` is optional: logs are
sparse, and a detector skips records that lack what it needs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from sapper.jsontext import NON_FINITE, finite_safe

__all__ = ["StepRecord"]


@dataclass
class StepRecord:
    """Metrics of one optimizer step; units are in the names."""

    step: int
    loss: float | None = None
    #: Global gradient norm before clipping.
    grad_norm: float | None = None
    #: The clipping threshold in force (max_norm).
    clip_threshold: float | None = None
    #: LR of the first parameter group; ``lrs`` holds all groups when known.
    lr: float | None = None
    lrs: list[float] | None = None
    loss_scale: float | None = None
    #: This step's optimizer update was skipped (fp16 overflow).
    skipped: bool | None = None
    #: Skipped steps so far (Megatron's "number of skipped iterations" is per interval).
    skipped_total: int | None = None
    memory_allocated_gib: float | None = None
    memory_reserved_gib: float | None = None
    memory_peak_gib: float | None = None
    memory_limit_gib: float | None = None
    rss_gib: float | None = None
    step_time_s: float | None = None
    data_time_s: float | None = None
    tokens: int | None = None
    samples: int | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    mfu: float | None = None
    eval_loss: float | None = None
    #: Wall-clock time (Unix seconds) when the step ended, if known.
    time: float | None = None
    #: Anything else: per-layer norms, sample hashes, rank ...
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict without empty fields; non-finite floats become strings
        ("nan", "inf", "-inf") so the JSONL stays valid JSON."""
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if value is None or (key == "extra" and not value):
                continue
            out[key] = finite_safe(value)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepRecord:
        """Inverse of :meth:`to_json`; unknown keys go to ``extra``."""
        names = {f.name for f in fields(cls)}
        known = {k: _from_json(v) for k, v in data.items() if k in names and k != "extra"}
        extra = dict(data.get("extra") or {})
        extra.update({k: v for k, v in data.items() if k not in names})
        return cls(**known, extra=extra)


def _from_json(value: Any) -> Any:
    if isinstance(value, str) and value in NON_FINITE:
        return float(value)
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value
