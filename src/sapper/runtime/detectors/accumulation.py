"""Gradient accumulation (seed §5.3): loss not divided by GA, per-micro-batch means,
effective batch changed without an LR change.

The live monitor measures the weight with which each micro-batch's loss entered the
backward pass: the gradient arriving at the model's loss tensor (divided by the loss
scale). With ``GA`` micro-batches per step and the usual mean, it is ``1/GA``; a weight of
1 means the loss was not divided and every gradient is ``GA``× too large
(``extra["loss_weight"]``, ``extra["grad_accum"]``). A model that normalises by the whole
step's token count (``num_items_in_batch``) is marked ``extra["loss_normalised"]``.

A loop that computes the loss itself (``F.cross_entropy(model(x).logits, y)``) gives the
model no loss to hook: the weight is then read from the gradient reaching the logits,
whose shape a softmax cross-entropy fixes (:mod:`sapper.monitor.logits`), and the record
says so (``extra["loss_weight_from"] == "logits"``). Either way the weight is the direct
evidence of the cause; a clipping threshold engaged on every step since the first
(``extra["clip_coef"] < 1``) is what the too-large gradients look like, and is named
with it. Neither the clipping nor the gradient norm alone fires the rule: both are
common in healthy runs at initialisation.
"""

from __future__ import annotations

import math

from sapper.rules.model import Finding, Rule, Severity
from sapper.rules.registry import register
from sapper.runtime.detectors.base import RuleDetector, fmt
from sapper.runtime.records import StepRecord

__all__ = [
    "BATCH_CHANGED_LR_KEPT",
    "GA_LOSS_NOT_DIVIDED",
    "GA_MICRO_MEAN",
    "AccumulationDetector",
]

GA_LOSS_NOT_DIVIDED = register(
    Rule(
        code="R080",
        name="grad-accum-loss-not-divided",
        check="accumulation",
        severity=Severity.ERROR,
        title="With gradient accumulation the loss is not divided by the accumulation steps",
        why="""\
Gradients of the GA micro-batches add up. Unless each micro-batch's loss is divided by GA,
the accumulated gradient is GA× the mean: with SGD the effective LR is GA× too high, with
Adam the clipping threshold and epsilon mean something else; changing GA changes the
training. No error is raised.

Frameworks: a loop the live monitor watches with gradient accumulation. The HF Trainer,
Lightning, DeepSpeed and Megatron divide the loss by the accumulation steps themselves;
there it points at a custom loss or training_step.""",
        signs="""\
A gradient norm that scales with GA (doubling GA doubles it); clipping engaging on every
step after GA was raised.""",
        fix="""\
Backpropagate loss / GA for each micro-batch (or sum the per-token losses and divide by
the step's total token count).""",
        seed="§5.3",
    )
)

GA_MICRO_MEAN = register(
    Rule(
        code="R081",
        name="grad-accum-per-micro-batch-mean",
        check="accumulation",
        severity=Severity.WARNING,
        title="Per-micro-batch mean losses with uneven token counts",
        why="""\
Averaging per-micro-batch means gives each micro-batch the same weight, so a token in a
short micro-batch counts more than a token in a long one: the accumulated gradient is not
the gradient of the step's per-token mean, and it changes with GA.

Frameworks: a loop the live monitor watches. The HF Trainer averaged per micro-batch
until its gradient-accumulation loss fix (transformers 4.46, num_items_in_batch);
Megatron and DeepSpeed average over the whole batch.""",
        signs="""\
Token counts per micro-batch that differ a lot (padding, packing, variable lengths) while
every micro-batch's loss enters backward with the same weight 1/GA.""",
        fix="""\
Sum the per-token losses of each micro-batch and divide by the total number of label
tokens of the whole step (transformers: pass num_items_in_batch).""",
        seed="§5.3",
    )
)

BATCH_CHANGED_LR_KEPT = register(
    Rule(
        code="R082",
        name="effective-batch-changed-lr-kept",
        check="accumulation",
        severity=Severity.WARNING,
        title="The effective batch size changed but the learning rate did not",
        why="""\
The LR is tuned for a batch size: the gradient noise, and so the largest stable LR, depend
on it. Changing GA (or the number of GPUs) changes the effective batch; keeping the LR makes
updates too noisy (smaller batch) or wastes the larger one.

Frameworks: any; needs samples or tokens per step in the log.""",
        signs="""\
Samples or tokens per optimizer step jump by a factor while the LR stays where it was.""",
        fix="""\
Re-tune the LR for the new batch, or scale it (linear for SGD, about √ for Adam) and keep
warmup; or keep the effective batch constant when changing GPUs (adjust GA).""",
        seed="§5.3",
    )
)


#: The live monitor's fields R080-R081 and the clip count read; a log record has none.
_LIVE_KEYS = frozenset({"loss_weight", "micro_tokens", "clip_coef"})


class AccumulationDetector(RuleDetector):
    """R080-R082 over the live monitor's GA measurements and samples per step."""

    name = "accumulation"
    rules = (GA_LOSS_NOT_DIVIDED, GA_MICRO_MEAN, BATCH_CHANGED_LR_KEPT)
    cooldown = None

    def __init__(
        self,
        *,
        weight_tolerance: float = 1.5,
        patience: int = 2,
        token_spread: float = 2.0,
        batch_change: float = 1.5,
        lr_kept: float = 0.15,
    ) -> None:
        super().__init__()
        self.weight_tolerance = weight_tolerance
        self.patience = patience
        self.token_spread = token_spread
        self.batch_change = batch_change
        self.lr_kept = lr_kept
        self.heavy = 0
        self.uneven = 0
        self.base_batch: float | None = None
        self.base_lr: float | None = None
        self.changed = 0
        self.weights_seen = False
        self.batch_seen = False
        #: Records with a clip coefficient since the first, and those where it engaged.
        self.clip_steps = 0
        self.clip_engaged = 0

    def update(self, record: StepRecord) -> list[Finding]:
        extra = record.extra
        if record.samples is not None or record.tokens is not None:
            self.batch_seen = True
        if extra.keys().isdisjoint(_LIVE_KEYS):  # none of the live monitor's fields
            return self._batch(record)
        if "loss_weight" in extra or "micro_tokens" in extra:
            self.weights_seen = True
        coef = extra.get("clip_coef")
        if isinstance(coef, (int, float)) and math.isfinite(coef):
            self.clip_steps += 1
            self.clip_engaged += coef < 1.0
        return self._weight(record) + self._micro_tokens(record) + self._batch(record)

    def unevaluated(self) -> list[str]:
        """R080-R081 read the live monitor's per-micro-batch loss weights and token
        counts; R082 needs the batch size (samples or tokens) per step."""
        out = []
        if not self.weights_seen:
            out.append(
                "R080-R081 gradient accumulation: not evaluated — needs the live monitor's "
                "per-micro-batch loss weights and token counts"
            )
        if not self.batch_seen:
            out.append(
                "R082 batch size changed: not evaluated — the log has no samples or tokens "
                "per step"
            )
        return out

    def _weight(self, record: StepRecord) -> list[Finding]:
        ga, w = record.extra.get("grad_accum"), record.extra.get("loss_weight")
        if not isinstance(ga, int) or ga <= 1 or not isinstance(w, (int, float)):
            return []
        if record.extra.get("loss_normalised") or not math.isfinite(w):
            return []
        self.heavy = self.heavy + 1 if w > self.weight_tolerance / ga else 0
        if self.heavy < self.patience:
            return []
        outside = record.extra.get("loss_weight_from") == "logits"
        what = (
            "the loss is computed outside the model; from the gradient reaching its logits, "
            "each micro-batch's cross-entropy"
            if outside
            else "each micro-batch loss"
        )
        message = (
            f"{what} entered backward with weight {fmt(w)} over {ga} micro-batches "
            f"(expected 1/{ga} = {fmt(1 / ga)}): the loss is not divided by the "
            f"gradient-accumulation steps, gradients are {fmt(w * ga)}× the mean"
        )
        if self.clip_steps and self.clip_engaged == self.clip_steps:
            message += (
                f"; clipping engaged on every step so far ({self.clip_engaged} of "
                f"{self.clip_steps}), as gradients {fmt(w * ga)}× too large do"
            )
        return self.fire(
            GA_LOSS_NOT_DIVIDED,
            record.step,
            message,
            value=w,
            threshold=1 / ga,
            grad_accum=ga,
            evidence="logits gradient" if outside else "loss gradient",
            clip_engaged=self.clip_engaged,
            clip_steps=self.clip_steps,
        )

    def _micro_tokens(self, record: StepRecord) -> list[Finding]:
        counts = record.extra.get("micro_tokens")
        ga, w = record.extra.get("grad_accum"), record.extra.get("loss_weight")
        if not isinstance(counts, list) or len(counts) < 2 or record.extra.get("loss_normalised"):
            return []
        if isinstance(ga, int) and isinstance(w, (int, float)) and abs(w * ga - 1) > 0.2:
            return []  # the loss is not a plain per-micro-batch mean / GA
        lo, hi = min(counts), max(counts)
        self.uneven = self.uneven + 1 if lo > 0 and hi / lo >= self.token_spread else 0
        if self.uneven < self.patience:
            return []
        return self.fire(
            GA_MICRO_MEAN,
            record.step,
            f"label tokens per micro-batch range from {lo} to {hi} at step {record.step} "
            "while each micro-batch mean has the same weight",
            value=hi / lo if lo else None,
            threshold=self.token_spread,
        )

    def _batch(self, record: StepRecord) -> list[Finding]:
        size = record.samples if record.samples is not None else record.tokens
        lr = record.lr
        if size is None or size <= 0 or lr is None or not math.isfinite(lr):
            return []
        if self.base_batch is None:
            self.base_batch, self.base_lr = size, lr
            return []
        ratio = size / self.base_batch
        if 1 / self.batch_change < ratio < self.batch_change:
            self.changed = 0
            self.base_lr = lr
            return []
        self.changed += 1
        if self.changed < self.patience:
            return []
        old_batch, old_lr = self.base_batch, self.base_lr or lr
        self.base_batch, self.base_lr, self.changed = size, lr, 0
        lr_ratio = lr / old_lr if old_lr else 1.0
        if abs(lr_ratio - 1) > self.lr_kept:
            return []
        self.fired.pop(BATCH_CHANGED_LR_KEPT.code, None)
        unit = "samples" if record.samples is not None else "tokens"
        return self.fire(
            BATCH_CHANGED_LR_KEPT,
            record.step,
            f"the batch went from {fmt(old_batch)} to {fmt(size)} {unit} per step "
            f"({fmt(ratio)}×) while the LR stayed at {fmt(lr)} ({fmt(lr_ratio)}× before)",
            value=ratio,
            threshold=self.batch_change,
            lr_ratio=lr_ratio,
        )
