"""The R-rule detectors: plain objects over streams of :class:`StepRecord`.

One module per concern (loss, gradient norm, loss scaler, LR, memory, throughput,
duplicated data, gradient accumulation, position overflow, step-0 structure, numerics,
eval loss, the training setup at the first step).
The live monitor, the framework callbacks, ``sapper analyze`` and ``sapper watch`` all
call :func:`default_detectors` and feed it records, so live and offline runs share one
code path. Records may be sparse (logged every k steps), have gaps or lack fields; a
detector stays silent on what it cannot see.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sapper.errors import InputError
from sapper.plan.schema import Plan, PositionEncoding
from sapper.runtime.detector import Detector
from sapper.runtime.detectors.accumulation import AccumulationDetector
from sapper.runtime.detectors.data import DuplicateDataDetector
from sapper.runtime.detectors.eval import EvalLossDetector
from sapper.runtime.detectors.gradnorm import GradNormDetector
from sapper.runtime.detectors.internal import MONITOR_ERROR
from sapper.runtime.detectors.loss import LossDetector
from sapper.runtime.detectors.lr import LRDetector
from sapper.runtime.detectors.memory import MemoryDetector
from sapper.runtime.detectors.numerics import NumericsDetector
from sapper.runtime.detectors.position import PositionDetector
from sapper.runtime.detectors.scaler import ScalerDetector
from sapper.runtime.detectors.setup import SetupDetector
from sapper.runtime.detectors.structure import StructureDetector
from sapper.runtime.detectors.throughput import ThroughputDetector

__all__ = [
    "DETECTORS",
    "MONITOR_ERROR",
    "AccumulationDetector",
    "DuplicateDataDetector",
    "EvalLossDetector",
    "GradNormDetector",
    "LRDetector",
    "LossDetector",
    "MemoryDetector",
    "NumericsDetector",
    "PositionDetector",
    "ScalerDetector",
    "SetupDetector",
    "StructureDetector",
    "ThroughputDetector",
    "default_detectors",
    "plan_options",
]

#: Every built-in detector by name, in the order they run.
DETECTORS: dict[str, type[Detector]] = {
    "loss": LossDetector,
    "gradnorm": GradNormDetector,
    "numerics": NumericsDetector,
    "scaler": ScalerDetector,
    "lr": LRDetector,
    "memory": MemoryDetector,
    "throughput": ThroughputDetector,
    "data": DuplicateDataDetector,
    "accumulation": AccumulationDetector,
    "position": PositionDetector,
    "structure": StructureDetector,
    "eval": EvalLossDetector,
    "setup": SetupDetector,
}


def plan_options(plan: Plan) -> dict[str, dict[str, Any]]:
    """Detector settings that follow from a Plan (the declared job)."""
    warmup = plan.schedule.warmup_steps
    opts: dict[str, dict[str, Any]] = {
        "loss": {"warmup_steps": warmup},
        "gradnorm": {"warmup_steps": warmup},
    }
    if plan.clipping.max_norm and plan.clipping.max_norm > 0:
        opts["gradnorm"]["clip_threshold"] = plan.clipping.max_norm
    scaling = plan.precision.loss_scaling
    if scaling.mode == "dynamic":
        opts["scaler"] = {"min_scale": scaling.min_scale}
    if plan.optimizer.lr is not None:
        opts["lr"] = {
            "schedule": plan.schedule.type,
            "peak_lr": plan.optimizer.lr,
            "warmup_steps": warmup,
            "total_steps": plan.schedule.total_steps,
            "min_lr": plan.schedule.min_lr,
            "grad_accum": plan.grad_accum,
        }
    elif plan.grad_accum:
        opts["lr"] = {"grad_accum": plan.grad_accum}
    if plan.gpu is not None:
        opts["memory"] = {"limit_gib": plan.gpu.memory_gib}
    data = _data_options(plan)
    if data:
        opts["data"] = data
    expected = _expected_tokens_per_s(plan)
    if expected:
        # A cost model's estimate is rough: warn only below half of it.
        opts["throughput"] = {"expected_tokens_per_s": expected, "below": 0.5}
    if plan.data.loader_tokens_per_sec or plan.data.loader_samples_per_sec:
        # a declared loader rate: a data wait high from the start contradicts the plan
        opts.setdefault("throughput", {})["loader_must_keep_up"] = True
    model = plan.model
    if model is not None:
        rope = model.position_encoding == PositionEncoding.ROPE
        # The declared context (a RoPE extension raises it on purpose), else the trained one.
        limit = model.max_position_embeddings or model.trained_context
        if limit and model.position_encoding in (PositionEncoding.ROPE, PositionEncoding.LEARNED):
            opts["position"] = {"limit": limit, "kind": "rope" if rope else "learned"}
        if "norm_placement" in model.model_fields_set:
            opts["structure"] = {"declared_placement": model.norm_placement.value}
    return opts


def _data_options(plan: Plan) -> dict[str, Any]:
    """The declared dataset per rank (the monitor fingerprints its own rank's samples)
    and the planned run length, for the short-cycle test (R072)."""
    out: dict[str, Any] = {}
    samples = plan.data.num_samples
    if samples is None and plan.data.num_tokens and plan.batch.seq_len:
        samples = plan.data.num_tokens // plan.batch.seq_len
    if samples:
        out["dataset_samples"] = max(1, samples // (plan.dp_degree or 1))
    if plan.schedule.total_steps:
        out["total_steps"] = plan.schedule.total_steps
    return out


def _expected_tokens_per_s(plan: Plan) -> float | None:
    """Tokens/s one data-parallel replica should reach, from the parallel cost model
    (:func:`sapper.parallel.predict_step`) when it is installed and the plan is complete
    enough; the monitor counts the tokens of its own replica."""
    if plan.model is None or plan.gpu is None or not plan.batch.seq_len:
        return None
    try:
        from sapper.parallel import predict_step  # type: ignore[attr-defined]

        cost = predict_step(plan)
    except Exception:  # no cost model, or a plan it cannot price: no expectation
        return None
    rate = getattr(cost, "tokens_per_s", None)
    dp = plan.dp_degree or 1
    return float(rate) / dp if rate else None


def _build(name: str, cls: Callable[..., Detector], kwargs: dict[str, Any]) -> Detector:
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise InputError(
            f"unknown or invalid option for the {name} detector ({exc})",
            field=f"detectors.{name}",
            value=sorted(kwargs),
            expected="keyword arguments of " + cls.__name__,
        ) from None


def default_detectors(
    plan: Plan | None = None,
    *,
    exclude: Iterable[str] = (),
    framework: str | None = None,
    **options: dict[str, Any],
) -> list[Detector]:
    """The built-in detectors, configured from ``plan`` when given.

    ``options`` are per-detector keyword arguments by detector name, applied over what the
    plan implies, e.g. ``default_detectors(plan, loss={"window": 100},
    throughput={"expected_tokens_per_s": 2.5e5})``; ``exclude`` drops detectors by name.
    Names: ``loss, gradnorm, numerics, scaler, lr, memory, throughput, data,
    accumulation, position, structure, eval, setup``. ``framework`` (one of
    :data:`sapper.runtime.detector.FRAMEWORKS`) tells every detector whose mechanics the
    stream follows, so framework-specific rules (R032/R033: torch-amp's GradScaler) apply
    only where they belong; None keeps each detector's own setting.
    """
    unknown = (set(options) | set(exclude)) - set(DETECTORS)
    if unknown:
        raise InputError(
            "unknown detector name",
            field="detectors",
            value=sorted(unknown),
            expected=", ".join(DETECTORS),
        )
    merged = plan_options(plan) if plan is not None else {}
    for name, kwargs in options.items():
        if not isinstance(kwargs, dict):
            raise InputError(
                "detector options must be a mapping of keyword arguments",
                field=f"detectors.{name}",
                value=kwargs,
                expected="a dict such as {'window': 100}",
            )
        merged[name] = {**merged.get(name, {}), **kwargs}
    skip = set(exclude)
    built = [
        _build(name, cls, merged.get(name, {}))
        for name, cls in DETECTORS.items()
        if name not in skip
    ]
    if framework is not None:
        for det in built:
            det.set_framework(framework)
    return built
