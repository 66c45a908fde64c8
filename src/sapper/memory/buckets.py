"""ZeRO's buffer sizes for the memory model, and where each one came from.

A DeepSpeed config sets them under ``zero_optimization`` (the Plan keeps them in
``parallel.deepspeed``). Three sources, in this order:

* the plan's own value (the user's JSON);
* ``"auto"`` (the field is in ``plan.unresolved``): the Hugging Face integration fills
  ``reduce_bucket_size`` with hidden², and at stage 3 ``stage3_prefetch_bucket_size`` with
  0.9·hidden² and ``stage3_param_persistence_threshold`` with 10·hidden
  (``HfTrainerDeepSpeedConfig.trainer_config_finalize``,
  transformers src/transformers/integrations/deepspeed.py, commit 02348331). That is only
  known when the model's hidden size is; otherwise the size stays unknown and the estimate
  says so instead of assuming a default;
* DeepSpeed's defaults: ``DeepSpeedZeroConfig`` in deepspeed/runtime/zero/config.py
  (deepspeedai/DeepSpeed commit edaa7221, Aug 2026): reduce and allgather buckets 5·10^8,
  prefetch 5·10^7, max live parameters and max reuse distance 10^9, persistence threshold
  10^5, sub-group 10^9 elements.
"""

from __future__ import annotations

from dataclasses import dataclass

from sapper.plan.schema import Plan

__all__ = [
    "DEEPSPEED_DEFAULTS",
    "DS_KEYS",
    "STAGE3_ONLY",
    "Bucket",
    "ZeroBuckets",
    "default_buckets",
    "zero_buckets",
]

#: DeepSpeedZeroConfig's defaults (elements), deepspeed/runtime/zero/config.py.
DEEPSPEED_DEFAULTS: dict[str, int] = {
    "reduce_bucket_size": 500_000_000,
    "allgather_bucket_size": 500_000_000,
    "prefetch_bucket_size": 50_000_000,
    "max_live_parameters": 1_000_000_000,
    "max_reuse_distance": 1_000_000_000,
    "param_persistence_threshold": 100_000,
    "sub_group_size": 1_000_000_000,
}

#: Plan field -> the key a DeepSpeed config writes.
DS_KEYS: dict[str, str] = {
    "reduce_bucket_size": "reduce_bucket_size",
    "allgather_bucket_size": "allgather_bucket_size",
    "prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "max_live_parameters": "stage3_max_live_parameters",
    "max_reuse_distance": "stage3_max_reuse_distance",
    "param_persistence_threshold": "stage3_param_persistence_threshold",
    "sub_group_size": "sub_group_size",
}

#: Sizes only ZeRO-3 reads (stage3.py and its parameter coordinator).
STAGE3_ONLY = frozenset(
    {"prefetch_bucket_size", "max_live_parameters", "max_reuse_distance",
     "param_persistence_threshold", "sub_group_size"}
)

_DEFAULT_SOURCE = "DeepSpeed default (runtime/zero/config.py)"


@dataclass(frozen=True)
class Bucket:
    """One size: ``elements`` is None when it is "auto" and the hidden size is unknown."""

    name: str
    elements: int | None
    source: str

    def to_json(self) -> dict[str, object]:
        return {"key": DS_KEYS[self.name], "elements": self.elements, "source": self.source}


@dataclass(frozen=True)
class ZeroBuckets:
    """The seven ZeRO sizes (elements) the estimate used, and whether DeepSpeed's buffer
    rules apply (the plan runs under DeepSpeed) with ``overlap_comm``."""

    reduce: Bucket
    allgather: Bucket
    prefetch: Bucket
    max_live: Bucket
    max_reuse: Bucket
    persistence: Bucket
    sub_group: Bucket
    deepspeed: bool = False
    overlap_comm: bool = False
    contiguous: bool = True  # contiguous_gradients (DeepSpeedZeroConfig default: true)

    def all(self) -> tuple[Bucket, ...]:
        return (self.reduce, self.allgather, self.prefetch, self.max_live, self.max_reuse,
                self.persistence, self.sub_group)

    @property
    def unknown(self) -> tuple[str, ...]:
        """DeepSpeed keys left "auto" with no hidden size to fill them from."""
        return tuple(DS_KEYS[b.name] for b in self.all() if b.elements is None)

    def to_json(self) -> list[dict[str, object]]:
        return [b.to_json() for b in self.all()]


def default_buckets() -> ZeroBuckets:
    """DeepSpeed's defaults for every size (a plan that sets none)."""
    return ZeroBuckets(*(Bucket(n, v, _DEFAULT_SOURCE) for n, v in DEEPSPEED_DEFAULTS.items()))


def _auto(name: str, hidden: int | None, zero: int) -> tuple[int | None, str]:
    """What the HF integration fills an "auto" size with, or None when it cannot be known."""
    key = DS_KEYS[name]
    hf = "transformers integrations/deepspeed.py"
    if hidden is None:
        return None, f'"auto" and the model\'s hidden size is unknown: set {key}'
    if name == "reduce_bucket_size":
        return hidden * hidden, f'"auto": hidden² = {hidden}² ({hf})'
    if zero == 3 and name == "prefetch_bucket_size":
        return int(0.9 * hidden * hidden), f'"auto": 0.9·hidden², hidden {hidden} ({hf})'
    if zero == 3 and name == "param_persistence_threshold":
        return 10 * hidden, f'"auto": 10·hidden, hidden {hidden} ({hf})'
    if zero < 3 and name in STAGE3_ONLY:
        # not read below stage 3 (the integration fills none of them there either); a
        # what-if at stage 3 gets DeepSpeed's default, as without the key
        return DEEPSPEED_DEFAULTS[name], f'"auto", unused below stage 3; {_DEFAULT_SOURCE}'
    return None, f'"auto", which the HF integration does not fill: set {key}'


def zero_buckets(plan: Plan) -> ZeroBuckets:
    """The sizes of ``plan`` with the source of each. DeepSpeed's rules apply when the
    framework is DeepSpeed or the plan sets (or leaves "auto") any of its sizes."""
    spec = plan.parallel.deepspeed
    hidden = plan.model.hidden_size if plan.model is not None else None
    unresolved = set(plan.unresolved)
    out: list[Bucket] = []
    for name, default in DEEPSPEED_DEFAULTS.items():
        value = getattr(spec, name)
        field = f"parallel.deepspeed.{name}"
        if value is not None:
            out.append(Bucket(name, value, "given"))
        elif field in unresolved:
            elements, source = _auto(name, hidden, plan.parallel.zero_stage)
            out.append(Bucket(name, elements, source))
        else:
            out.append(Bucket(name, default, _DEFAULT_SOURCE))
    deepspeed = (
        plan.framework == "deepspeed"
        or bool(spec.model_dump(exclude_none=True))
        or any(f.startswith("parallel.deepspeed.") for f in unresolved)
    )
    return ZeroBuckets(
        *out,
        deepspeed=deepspeed,
        overlap_comm=plan.parallel.overlap_dp_comm,
        contiguous=spec.contiguous_gradients is not False,
    )
