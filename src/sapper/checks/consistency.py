"""Batch arithmetic (seed §5.1 item 6, §5.3): global = micro × GA × DP, shown as arithmetic.

Frameworks derive the batch each from its own subset of these numbers (DeepSpeed from
``train_batch_size``, Megatron from ``global_batch_size``, HF from micro and GA), so a plan
that states all of them can contradict itself and train at a batch nobody intended. The
GPU-count arithmetic (dp = -1 with GPUs not divisible by tp·pp·cp) belongs to the
parallel checks; these rules need a known DP degree and stay silent otherwise.
"""

from __future__ import annotations

from sapper.checks.engine import CheckOutput, plan_check
from sapper.plan.schema import Plan
from sapper.rules.model import Rule, Severity

__all__ = ["GLOBAL_BATCH_INDIVISIBLE", "GLOBAL_BATCH_MISMATCH"]

GLOBAL_BATCH_MISMATCH = Rule(
    code="C101",
    name="global-batch-mismatch",
    check="parallel",
    severity=Severity.ERROR,
    title="Global batch ≠ micro batch × gradient accumulation × DP",
    why="""\
One optimizer step consumes micro × GA × DP sequences. When the configured global batch
says otherwise, the framework either refuses to start (DeepSpeed asserts
train_batch_size == micro × GA × world/(tp·pp)), or silently recomputes one of the numbers
— usually gradient accumulation — so the run trains at a batch, and so an effective
learning rate and a token budget, nobody chose (seed §5.3).""",
    signs="""\
A different number of steps per epoch than planned; tokens per step in the log that do
not match the plan; a learning-rate schedule that ends early or late.""",
    fix="""\
Make the numbers agree: set gradient accumulation to global / (micro × DP), or change
the global batch (and retune the learning rate if it moves).""",
    seed="§5.1, §5.3",
)

GLOBAL_BATCH_INDIVISIBLE = Rule(
    code="C102",
    name="global-batch-indivisible",
    check="parallel",
    severity=Severity.ERROR,
    title="Global batch is not divisible by micro batch × DP",
    why="""\
Gradient accumulation must be an integer: GA = global / (micro × DP). When it does not
divide, frameworks stop at start-up (Megatron, DeepSpeed) or round GA down and train at a
smaller batch than planned, dropping the remainder of every step.""",
    signs="""\
A start-up assertion about batch divisibility, or fewer tokens per step than planned.""",
    fix="""\
Pick a global batch that is a multiple of micro × DP, or change the micro batch or the
data-parallel degree so it divides.""",
    seed="§5.1",
)


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
