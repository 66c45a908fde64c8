"""What the framework that runs the job decides when the plan leaves it unsaid.

A plan merged from a DeepSpeed JSON and command-line values does not yet say everything
the engine will use: DeepSpeed derives the missing one (or two) of train_batch_size,
train_micro_batch_size_per_gpu and gradient_accumulation_steps from the others and the
data-parallel size, and refuses to start when they disagree; DeepSpeed, Megatron-LM,
apex and the Hugging Face Trainer all scale fp16 losses dynamically unless told
otherwise. :func:`resolve` fills those values in exactly as the framework would, so the
checks and the memory estimate see the job that really runs; where the framework is
not known nothing is filled in, and the checks that need the value report ``unknown``.
"""

from __future__ import annotations

from typing import Any

from sapper.plan.rules import GLOBAL_BATCH_MISMATCH
from sapper.plan.schema import Plan
from sapper.rules.model import Finding

__all__ = ["deepspeed_batch", "resolve"]

#: Frameworks whose fp16 path scales the loss dynamically by default (DeepSpeed
#: ``fp16.loss_scale: 0``, Megatron-LM without ``--loss-scale``, NeMo's and Lightning's
#: ``16-mixed`` GradScaler, the Trainer's and accelerate's GradScaler). A plain torch loop
#: (torchtitan included: it has no fp16 loss scaling) scales only if the script creates a
#: GradScaler.
_DYNAMIC_FP16 = ("deepspeed", "megatron", "nemo", "transformers", "accelerate", "lightning")


def deepspeed_batch(
    train: int | None, micro: int | None, ga: int | None, dp: int
) -> tuple[int | None, int | None, int | None]:
    """The batch triple after DeepSpeed's ``DeepSpeedConfig._set_batch_related_parameters``
    (deepspeed/runtime/config.py): floor divisions, GA 1 when only one size is given."""
    if train is not None and micro is not None and ga is not None:
        return train, micro, ga
    if train is not None and micro is not None:
        return train, micro, train // micro // dp
    if train is not None and ga is not None:
        return train, train // dp // ga, ga
    if micro is not None and ga is not None:
        return micro * ga * dp, micro, ga
    if train is not None:
        return train, train // dp, 1
    if micro is not None:
        return micro * dp, micro, 1
    return train, micro, ga


def _deepspeed_batch(plan: Plan) -> tuple[dict[str, Any], list[Finding]]:
    b, dp = plan.batch, plan.dp_degree
    given = (b.global_batch_size, b.micro_batch_size, b.gradient_accumulation_steps)
    if dp is None or None not in given or given[:2] == (None, None):
        return {}, []
    train, micro, ga = deepspeed_batch(*given, dp)
    assert train is not None and micro is not None and ga is not None
    if micro > 0 and ga > 0 and train == micro * ga * dp:
        names = ("global_batch_size", "micro_batch_size", "gradient_accumulation_steps")
        return {n: v for n, v, g in zip(names, (train, micro, ga), given, strict=True)
                if g is None}, []
    derived = [
        f"{name} {value} (derived)" if g is None else f"{name} {value}"
        for name, value, g in zip(("micro", "GA"), (micro, ga), given[1:], strict=True)
    ]
    message = (
        f"DeepSpeed derives {', '.join(derived)} from train_batch_size {train} and DP {dp}, "
        f"then asserts train_batch_size == micro × GA × DP: {micro} × {ga} × {dp} = "
        f"{micro * ga * dp} ≠ {train}, so the engine refuses to start"
    )
    return {}, [
        GLOBAL_BATCH_MISMATCH.finding(
            message,
            fix=f"make train_batch_size a multiple of micro × DP ({max(micro, 1)} × {dp}), "
            "or give all three of train_batch_size, train_micro_batch_size_per_gpu and "
            "gradient_accumulation_steps",
            value=micro * ga * dp,
            threshold=train,
            source="batch.global_batch_size",
        )
    ]


def _composer_batch(plan: Plan) -> dict[str, Any]:
    """Composer's split of the global batch (llm-foundry's ``calculate_batch_size_info``,
    llmfoundry/utils/config_utils.py): each GPU takes global / DP sequences, a micro-batch
    larger than that is lowered to it, and the accumulation is the share over the
    micro-batch. Filled in only when the micro-batches split the share evenly; otherwise the
    batch checks report it."""
    b, dp = plan.batch, plan.dp_degree
    if (b.gradient_accumulation_steps is not None or None in (b.global_batch_size,
                                                               b.micro_batch_size, dp)):
        return {}
    assert b.global_batch_size and b.micro_batch_size and dp
    share, left = divmod(b.global_batch_size, dp)
    if left or share == 0:
        return {}  # llm-foundry refuses a global batch the GPUs do not divide
    micro = min(b.micro_batch_size, share)
    if share % micro:
        return {}
    return {"micro_batch_size": micro, "gradient_accumulation_steps": share // micro}


def resolve(plan: Plan) -> tuple[Plan, list[Finding]]:
    """The plan with what its framework fills in, and the findings that filling raised."""
    findings: list[Finding] = []
    if plan.framework == "deepspeed":
        batch, findings = _deepspeed_batch(plan)
        if batch:
            plan = plan.model_copy(update={"batch": plan.batch.model_copy(update=batch)})
    elif plan.framework == "composer":
        batch = _composer_batch(plan)
        if batch:
            plan = plan.model_copy(update={"batch": plan.batch.model_copy(update=batch)})
    p = plan.precision
    if (
        p.dtype == "fp16"
        and plan.framework in _DYNAMIC_FP16
        and "mode" not in p.loss_scaling.model_fields_set
    ):
        scaling = p.loss_scaling.model_copy(update={"mode": "dynamic"})
        scaling.__pydantic_fields_set__.add("mode")
        plan = plan.model_copy(
            update={"precision": p.model_copy(update={"loss_scaling": scaling})}
        )
    return plan, findings
