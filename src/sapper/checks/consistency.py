"""Batch arithmetic (seed §5.1 item 6, §5.3): global = micro × GA × DP, shown as arithmetic.

Frameworks derive the batch each from its own subset of these numbers (DeepSpeed from
``train_batch_size``, Megatron from ``global_batch_size``, HF from micro and GA), so a plan
that states all of them can contradict itself and train at a batch nobody intended. The
GPU-count arithmetic (dp = -1 with GPUs not divisible by tp·pp·cp) belongs to the
parallel checks; these rules need a known DP degree and stay silent otherwise.
"""

from __future__ import annotations

from sapper.checks.engine import CheckOutput, plan_check
from sapper.plan.rules import GLOBAL_BATCH_INDIVISIBLE, GLOBAL_BATCH_MISMATCH
from sapper.plan.schema import Plan

__all__ = ["global_batch_indivisible", "global_batch_mismatch"]

# The rules themselves are defined in sapper.plan.rules: a DeepSpeed reader reports C101
# too, while it derives the batch, and the readers sit below the checks.
@plan_check(GLOBAL_BATCH_MISMATCH)
def global_batch_mismatch(plan: Plan) -> CheckOutput:
    b, dp = plan.batch, plan.dp_degree
    if None in (b.global_batch_size, b.micro_batch_size, b.gradient_accumulation_steps, dp):
        return
    assert b.micro_batch_size and b.gradient_accumulation_steps and dp and b.global_batch_size
    product = b.micro_batch_size * b.gradient_accumulation_steps * dp
    if product == b.global_batch_size:
        return
    q, r = divmod(b.global_batch_size, b.micro_batch_size * dp)
    fix = (
        f"set gradient accumulation to {q} (= {b.global_batch_size} / ({b.micro_batch_size} "
        f"× {dp})), or global batch to {product}"
        if r == 0 and q > 0
        else f"set the global batch to {product}, or change micro/GA/DP so they multiply to "
        f"{b.global_batch_size}"
    )
    yield GLOBAL_BATCH_MISMATCH.finding(
        f"micro {b.micro_batch_size} × GA {b.gradient_accumulation_steps} × DP {dp} = "
        f"{product} ≠ global {b.global_batch_size}",
        fix=fix,
        value=product,
        threshold=b.global_batch_size,
        source="batch.global_batch_size",
    )


@plan_check(GLOBAL_BATCH_INDIVISIBLE)
def global_batch_indivisible(plan: Plan) -> CheckOutput:
    b, dp = plan.batch, plan.dp_degree
    if b.gradient_accumulation_steps is not None:
        return  # with GA given, C101 checks the product
    if b.global_batch_size is None or b.micro_batch_size is None or dp is None:
        return
    per_step = b.micro_batch_size * dp
    if b.global_batch_size % per_step == 0:
        return
    nearest = sorted(
        {
            max(per_step, b.global_batch_size // per_step * per_step),
            (b.global_batch_size // per_step + 1) * per_step,
        }
    )
    yield GLOBAL_BATCH_INDIVISIBLE.finding(
        f"global {b.global_batch_size} / (micro {b.micro_batch_size} × DP {dp} = {per_step}) "
        f"= {b.global_batch_size / per_step:.3g}: no integer gradient accumulation",
        fix=f"use a global batch of {' or '.join(map(str, nearest))}, or change micro or DP",
        value=b.global_batch_size,
        threshold=per_step,
        source="batch.global_batch_size",
    )
