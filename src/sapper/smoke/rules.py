"""The S family: what each start-small check proves, and what to do when it fails.

Kept free of torch so ``sapper rules`` and ``sapper explain S003`` stay instant; the checks
that fire these rules live in the sibling modules (one module per check).
"""

from __future__ import annotations

from sapper.rules.model import Rule, Severity
from sapper.rules.registry import register

__all__ = [
    "ACCUMULATION",
    "CHECKPOINTING",
    "DATA_PARALLEL",
    "FP16_HEADROOM",
    "INIT_HEALTH",
    "LABEL_SHIFT",
    "MEASURED_VS_ESTIMATE",
    "OVERFIT",
    "PADDING_IN_LABELS",
    "PRECISION_AGREEMENT",
    "SMOKE_RULES",
    "STEP_CONTRACT",
    "UNSHARDED_SAMPLER",
]

OVERFIT = Rule(
    code="S001",
    name="cannot-overfit-one-batch",
    check="smoke",
    severity=Severity.ERROR,
    title="The model cannot overfit a single batch",
    why="""\
A model of any size can memorise one small batch in a few dozen steps. When the loss does
not fall on one batch, the big run will not learn either: the learning rate is zero or tiny,
the optimizer is not attached to the parameters, gradients never reach the weights (a
detach, a frozen module, a scheduler that starts at 0), or the loss does not depend on the
model's output.""",
    signs="""\
A flat loss curve from step 0 at ln(vocab); gradient norm of zero; weights identical
between checkpoints.""",
    fix="""\
Check the learning rate the optimizer actually uses (print optimizer.param_groups), that
the optimizer holds the model's parameters, that no module is frozen by mistake, and that
the loss is computed from the model's logits.""",
    seed="§5.2, §6",
)

LABEL_SHIFT = Rule(
    code="S002",
    name="labels-not-shifted",
    check="smoke",
    severity=Severity.ERROR,
    title="The loss target is not the next token",
    why="""\
A causal LM predicts token t+1 from tokens ≤ t. If the training step compares the logits at
position t with token t (labels not shifted), the model only learns to copy its input: the
loss falls fast, to near zero, and the model learns nothing useful. If it shifts twice (the
model shifts internally and the loop shifts again), it predicts token t+2 and learns a worse
model. Neither raises an error.""",
    signs="""\
A loss that falls far faster than expected and approaches zero (no shift); a loss stuck
above a comparable run's (double shift); generations that repeat the prompt.""",
    fix="""\
Shift exactly once: logits[:, :-1] against labels[:, 1:]. Hugging Face models shift
internally when given labels=input_ids; do not shift them again in the collator.""",
    seed="§5.1 (7), §5.3",
)

ACCUMULATION = Rule(
    code="S003",
    name="grad-accumulation-not-equivalent",
    check="smoke",
    severity=Severity.ERROR,
    title="Gradient accumulation does not give the gradient of the large batch",
    why="""\
k micro-batches with gradient accumulation must give the gradient of one batch k times as
large. A loss averaged over each micro-batch and then divided by k weighs the tokens of a
short micro-batch more than those of a long one whenever sequences are padded to different
lengths, so the effective loss depends on how the data was cut into micro-batches. This was
a long-standing bug in popular trainers (2024), found by eye from loss curves that did not
match across accumulation settings.""",
    signs="""\
Runs with the same global batch but a different accumulation count give different loss
curves; the loss with accumulation sits above the one without.""",
    fix="""\
Normalise by the number of target tokens of the whole optimizer step: sum the token losses
of each micro-batch and divide by the total count over all micro-batches (and, in data
parallel, over all ranks), e.g. transformers' num_items_in_batch.""",
    seed="§3.2, §5.3",
)

CHECKPOINTING = Rule(
    code="S004",
    name="checkpointing-changes-gradients",
    check="smoke",
    severity=Severity.ERROR,
    title="Activation checkpointing changes the gradients",
    why="""\
Checkpointing must only trade compute for memory: the recomputed forward in the backward
pass has to reproduce the original one exactly. It does not when the recompute draws new
dropout masks (RNG state not preserved), when the checkpointed function has side effects
(caches, counters, in-place updates of its inputs), or when the wrapper cuts the graph
(inputs detached, reentrant checkpoint without inputs requiring grad). Combined with mixed
precision and accumulation this goes unnoticed.""",
    signs="""\
The loss curve changes when checkpointing is switched on; some layers' gradients are zero
or differ between runs with and without it.""",
    fix="""\
Use torch.utils.checkpoint with use_reentrant=False and preserve_rng_state=True (the
defaults of Hugging Face's gradient_checkpointing_enable), checkpoint whole transformer
blocks, and keep checkpointed functions free of side effects.""",
    seed="§3.2",
)

PRECISION_AGREEMENT = Rule(
    code="S005",
    name="low-precision-gradients-disagree",
    check="precision",
    severity=Severity.ERROR,
    title="Mixed-precision gradients disagree with fp32",
    why="""\
Under bf16/fp16 autocast the gradients differ from fp32 by rounding only: per layer the
cosine similarity stays near 1 and the relative error near the dtype's precision. Larger
disagreement means a layer overflows (Inf/NaN), underflows (fp16 gradients flushed to zero
without loss scaling) or runs a precision-sensitive op (softmax, norm, loss) in the low
dtype.""",
    signs="""\
NaN loss after a few hundred steps; skipped steps under a loss scaler; layers whose gradient
norm reads 0; a mixed-precision run that trails an fp32 run of the same model.""",
    fix="""\
Keep softmax, normalisation and the loss in fp32 (autocast does this for its own ops; custom
kernels may not), use dynamic loss scaling with fp16, and prefer bf16 where the GPU
supports it.""",
    seed="§2.1, §2.2",
)

FP16_HEADROOM = Rule(
    code="S006",
    name="fp16-activation-overflow",
    check="precision",
    severity=Severity.ERROR,
    title="Activations exceed fp16's range",
    why="""\
fp16's largest value is 65504. An activation beyond it becomes Inf under fp16 and turns into
NaN a few layers later; the loss scaler cannot help because the overflow happens in the
forward pass. Activations grow with width, depth and training (outlier features), so little
headroom at toy scale means none at full scale.""",
    signs="""\
NaN loss with fp16 while bf16/fp32 train fine; Inf in a few layers' outputs; a loss scale
that collapses to its minimum.""",
    fix="""\
Train in bf16; otherwise find the module with the largest output and keep it in fp32, scale
attention logits, lower the init scale of the offending projection, or add a norm before
it.""",
    seed="§2.1",
)

DATA_PARALLEL = Rule(
    code="S007",
    name="data-parallel-not-equivalent",
    check="parallel",
    severity=Severity.ERROR,
    title="Data parallel does not give the update of one process",
    why="""\
With DP = N each rank computes the gradient of its share of the global batch and an
all-reduce averages them; the result must equal one process's gradient over the whole
global batch. It does not when the loss is normalised per rank while ranks hold different
numbers of tokens, when gradients are not all-reduced (a parameter outside DDP, a missed
sync after no_sync), or when ranks start from different weights.""",
    signs="""\
Loss curves that change with the number of GPUs at a fixed global batch; ranks whose weights
drift apart (different checkpoints per rank); a DP run that trails a single-GPU run.""",
    fix="""\
Wrap the model in DDP/FSDP after it is built identically on every rank, let the last
micro-batch synchronise, and normalise the loss by the token count summed over all ranks
(multiply by the world size when DDP averages).""",
    seed="§4.1, §5.1 (6)",
)

UNSHARDED_SAMPLER = Rule(
    code="S008",
    name="data-not-sharded-across-ranks",
    check="data",
    severity=Severity.ERROR,
    title="Data-parallel ranks read the same samples",
    why="""\
Each DP rank must read a different share of the data. A data loader built without a
DistributedSampler (or with the same rank for every process) gives every rank the same
batches: the run costs N GPUs but sees the data of one, the effective batch is N times
smaller than planned, and every sample repeats N times per step.""",
    signs="""\
Loss falls as fast as a single-GPU run at N times the cost; an epoch takes as many steps as on
one GPU; sample IDs repeat across ranks.""",
    fix="""\
Use DistributedSampler(dataset, num_replicas=world_size, rank=rank) (and set_epoch each
epoch), or shard the stream by rank; check that the ranks' sample IDs are disjoint.""",
    seed="§5.1 (7), §5.3",
)

INIT_HEALTH = Rule(
    code="S009",
    name="unhealthy-initialisation",
    check="init",
    severity=Severity.WARNING,
    title="Activations or gradients grow or vanish across layers at initialisation",
    why="""\
At initialisation every block should pass activations and gradients on at a similar scale.
Too large an init variance makes activations grow layer by layer until they overflow; too
small makes them vanish so gradients do not flow back. A per-layer growth factor g
measured on a few toy layers compounds to g^L at the full depth.""",
    signs="""\
Loss spikes or NaN in the first steps; a first-layer gradient norm orders of magnitude off
the last layer's; activation maxima that grow with depth.""",
    fix="""\
Initialise weights from N(0, 0.02) (or 1/sqrt(fan_in)), scale residual output projections
by 1/sqrt(2·layers), and use Pre-LN.""",
    seed="§2.4",
)

MEASURED_VS_ESTIMATE = Rule(
    code="S010",
    name="memory-estimate-off",
    check="memory",
    severity=Severity.WARNING,
    title="Measured memory at toy scale differs from the estimator",
    why="""\
The memory plan of the big run comes from an estimate. Measured at toy scale on the same
architecture, parameters, gradients and optimizer states must match it closely and
activations within a small factor; a large gap means the estimate for the big run is off by
the same mechanism (an unmodelled buffer, a different attention implementation, optimizer
states in another dtype).""",
    signs="""\
OOM at a batch size the plan said fits, or memory left unused that the plan said was
needed.""",
    fix="""\
Find the category that disagrees and correct the plan (attention implementation,
optimizer, dtype, checkpointing) or the estimator before sizing the big run.""",
    seed="§3.1",
)

PADDING_IN_LABELS = Rule(
    code="S011",
    name="padding-scored-by-the-loss",
    check="data",
    severity=Severity.ERROR,
    title="The loss is taken on padding tokens",
    why="""\
Padded positions hold no text: the loss must ignore them (label -100, or a mask the loss
applies). A collator that copies labels = input_ids after padding, without replacing the
padding with -100, makes the model learn to predict pad tokens after every short sequence:
the loss falls quickly on the easy pad-after-pad targets, the real tokens get a smaller
share of every gradient (the average is over padding too), the loss depends on how much
padding a batch happens to have, and the model learns to emit padding. Nothing raises an
error, and sapper's own probe batches never show it.""",
    signs="""\
A loss that falls fast early and then plateaus above a packed run's; the loss of a batch
that rises or falls with its padding; generations that end in runs of the pad or EOS token;
token counts per step that equal batch × sequence length although sequences are shorter.""",
    fix="""\
Set labels to -100 where attention_mask is 0 (labels = input_ids.masked_fill(attention_mask
== 0, -100)), or use transformers' DataCollatorForLanguageModeling(tokenizer, mlm=False),
which does it; when pad and EOS are the same id, mask by the attention mask, not by the id,
so the real EOS keeps its target.""",
    seed="§5.1 (7), §5.3",
)

STEP_CONTRACT = Rule(
    code="S012",
    name="train-step-contract-broken",
    check="step",
    severity=Severity.ERROR,
    title="The training step breaks the TrainStep contract",
    why="""\
A hand-written training step is where the distributed and mixed-precision details live:
whether gradients accumulate across micro-batches, whether the forward goes through the DDP
wrapper (a forward through model.module is never all-reduced), whether the last
micro-batch synchronises, whether the loss scale applied to the gradients is the one
unscaled later, whether autocast is open. Each mistake trains without an error: on one
rank's gradient, on the last micro-batch only, with a step 65536 times too large, or in
fp32 at half the speed the plan assumed.""",
    signs="""\
Ranks whose weights drift apart; a loss that ignores the accumulation count; loss spikes on
the first fp16 steps or a scaler that skips every step; a throughput well below the plan.""",
    fix="""\
Follow docs/train-step.md: zero gradients outside the step, call model(...) (the wrapper),
backward once per micro-batch with all but the last under model.no_sync(), divide the loss
by the target tokens of the whole step summed over ranks and multiply by the world size,
open torch.autocast for the requested precision, and report the loss scale you multiplied
by as StepResult.grad_scale.""",
    seed="§4.1, §5.3",
)

SMOKE_RULES: tuple[Rule, ...] = tuple(
    register(r)
    for r in (
        OVERFIT,
        LABEL_SHIFT,
        ACCUMULATION,
        CHECKPOINTING,
        PRECISION_AGREEMENT,
        FP16_HEADROOM,
        DATA_PARALLEL,
        UNSHARDED_SAMPLER,
        INIT_HEALTH,
        MEASURED_VS_ESTIMATE,
        PADDING_IN_LABELS,
        STEP_CONTRACT,
    )
)
