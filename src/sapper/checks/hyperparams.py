"""The peak learning rate against what published runs of the same size used (seed §5.2).

A learning rate is not a number that can be checked in isolation, but it can be checked
against a reference: every large pre-training run publishes its peak LR with its size,
optimizer and batch, and they fall on a narrow band that shrinks with model size (6e-4 at
125M, 3e-4 at 7B, 8e-5 at 405B for Adam). A peak LR ten times above every run of the
same size is a bet nobody has published; a hundred times above is a blow-up that only
needs its first sharp batch. The reference here is the highest peak LR published for a
run within a factor of two of the plan's parameter count (active parameters for MoE), so
the warning fires only where no published run went; it is raised by √(batch ratio) when
the plan's batch is larger than that run's (the square-root rule for Adam, Malladi et al.
2022), never lowered.

Every number below was checked against its source:

- GPT-3: Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1 (batch in
  tokens).
- Pythia: Biderman et al. 2023, "Pythia: A Suite for Analyzing Large Language Models",
  model table (EleutherAI/pythia README): 1024 sequences × 2048 tokens per step.
- LLaMA: Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language Models",
  Table 2.
- Llama 2: Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models",
  Table 1 (4M tokens per step).
- Llama 3: Llama Team 2024, "The Llama 3 Herd of Models", Table 3 (405B: 4M tokens per
  step while the LR peaks, raised to 8M and 16M later).
- Chinchilla and Gopher: Hoffmann et al. 2022, "Training Compute-Optimal Large Language
  Models", Table 4 (the first batch of each; both doubled it midway).
- OLMo: Groeneveld et al. 2024; the released configs allenai/OLMo
  configs/official-0724/OLMo-1B.yaml and OLMo-7B.yaml (2048 × 2048 tokens per step).
- BLOOM: BigScience 2022, "BLOOM: A 176B-Parameter Open-Access Multilingual Language
  Model" (2048 × 2048 tokens per step).

Other optimizers: Lion's authors (Chen et al. 2023, "Symbolic Discovery of Optimization
Algorithms", §5) put its learning rate 3-10× below AdamW's, so the Adam reference is
divided by 3 (the generous end). Adafactor with parameter scaling steps relative to each
weight's size: PaLM (Chowdhery et al. 2022, §5) and T5 (Raffel et al. 2020) ran it at
10^-2 at every size. SGD, Muon, LAMB, GaLore and schedule-free variants have no
comparable published table for transformer pre-training, so the check says it cannot run
rather than guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sapper.checks.engine import CheckOutput, NotEvaluated, not_evaluated, plan_check
from sapper.model.derived import plan_architecture
from sapper.model.params import active_params
from sapper.plan.schema import Plan
from sapper.rules.model import Rule, Severity

__all__ = [
    "LR_FAR_ABOVE",
    "LR_FAR_BELOW",
    "PUBLISHED_ADAM",
    "LrReference",
    "PublishedRun",
    "lr_reference",
    "optimizer_family",
]


@dataclass(frozen=True)
class PublishedRun:
    """One pre-training run's peak LR as its authors published it."""

    run: str
    params: float
    lr: float
    #: Tokens per optimizer step while the LR was at its peak.
    batch_tokens: float
    source: str


_GPT3 = "Brown et al. 2020, Table 2.1"
_PYTHIA = "Biderman et al. 2023, model table"
_LLAMA = "Touvron et al. 2023, Table 2"
_LLAMA2 = "Touvron et al. 2023 (Llama 2), Table 1"
_LLAMA3 = "Llama Team 2024, Table 3"
_CHINCHILLA = "Hoffmann et al. 2022, Table 4"
_OLMO = "Groeneveld et al. 2024, configs/official-0724"
_BLOOM = "BigScience 2022"

#: Adam-family pre-training runs, smallest first.
PUBLISHED_ADAM: tuple[PublishedRun, ...] = (
    PublishedRun("Pythia-70M", 70e6, 1.0e-3, 2.0e6, _PYTHIA),
    PublishedRun("GPT-3 Small", 125e6, 6.0e-4, 0.5e6, _GPT3),
    PublishedRun("Pythia-160M", 160e6, 6.0e-4, 2.0e6, _PYTHIA),
    PublishedRun("GPT-3 Medium", 350e6, 3.0e-4, 0.5e6, _GPT3),
    PublishedRun("Pythia-410M", 410e6, 3.0e-4, 2.0e6, _PYTHIA),
    PublishedRun("GPT-3 Large", 760e6, 2.5e-4, 0.5e6, _GPT3),
    PublishedRun("Pythia-1B", 1.0e9, 3.0e-4, 2.0e6, _PYTHIA),
    PublishedRun("OLMo-1B", 1.2e9, 4.0e-4, 4.2e6, _OLMO),
    PublishedRun("GPT-3 XL", 1.3e9, 2.0e-4, 1.0e6, _GPT3),
    PublishedRun("Pythia-1.4B", 1.4e9, 2.0e-4, 2.0e6, _PYTHIA),
    PublishedRun("GPT-3 2.7B", 2.7e9, 1.6e-4, 1.0e6, _GPT3),
    PublishedRun("Pythia-2.8B", 2.8e9, 1.6e-4, 2.0e6, _PYTHIA),
    PublishedRun("GPT-3 6.7B", 6.7e9, 1.2e-4, 2.0e6, _GPT3),
    PublishedRun("LLaMA-7B", 6.7e9, 3.0e-4, 4.0e6, _LLAMA),
    PublishedRun("Pythia-6.9B", 6.9e9, 1.2e-4, 2.0e6, _PYTHIA),
    PublishedRun("OLMo-7B", 6.9e9, 3.0e-4, 4.2e6, _OLMO),
    PublishedRun("Llama 2 7B", 7.0e9, 3.0e-4, 4.0e6, _LLAMA2),
    PublishedRun("Llama 3 8B", 8.0e9, 3.0e-4, 4.0e6, _LLAMA3),
    PublishedRun("Pythia-12B", 12e9, 1.2e-4, 2.0e6, _PYTHIA),
    PublishedRun("GPT-3 13B", 13e9, 1.0e-4, 2.0e6, _GPT3),
    PublishedRun("LLaMA-13B", 13e9, 3.0e-4, 4.0e6, _LLAMA),
    PublishedRun("Llama 2 13B", 13e9, 3.0e-4, 4.0e6, _LLAMA2),
    PublishedRun("LLaMA-33B", 32.5e9, 1.5e-4, 4.0e6, _LLAMA),
    PublishedRun("Llama 2 34B", 34e9, 1.5e-4, 4.0e6, _LLAMA2),
    PublishedRun("LLaMA-65B", 65.2e9, 1.5e-4, 4.0e6, _LLAMA),
    PublishedRun("Chinchilla 70B", 70e9, 1.0e-4, 1.5e6, _CHINCHILLA),
    PublishedRun("Llama 2 70B", 70e9, 1.5e-4, 4.0e6, _LLAMA2),
    PublishedRun("Llama 3 70B", 70e9, 1.5e-4, 4.0e6, _LLAMA3),
    PublishedRun("GPT-3 175B", 175e9, 0.6e-4, 3.2e6, _GPT3),
    PublishedRun("BLOOM-176B", 176e9, 0.6e-4, 4.2e6, _BLOOM),
    PublishedRun("Gopher 280B", 280e9, 0.4e-4, 3.0e6, _CHINCHILLA),
    PublishedRun("Llama 3 405B", 405e9, 0.8e-4, 4.0e6, _LLAMA3),
)

#: Runs within this factor of the plan's size count as "the same size".
SIZE_WINDOW = 2.0
#: Lion's LR is 3-10× below AdamW's (Chen et al. 2023): the generous end.
LION_DIVISOR = 3.0
#: Adafactor with parameter scaling (PaLM, T5): 10^-2 whatever the size.
ADAFACTOR_LR = 1e-2
_ADAFACTOR_SOURCE = "Chowdhery et al. 2022 (PaLM) §5; Raffel et al. 2020 (T5)"
#: Above the reference: warning beyond 10×, error from 100×.
WARN_RATIO = 10.0
ERROR_RATIO = 100.0
#: An Adam-family LR at or above this diverges a transformer at any size.
ADAM_ABSOLUTE_ERROR = 0.1
#: Below the lowest published LR of the size by this factor: a pre-training run that
#: barely moves.
LOW_RATIO = 30.0

#: Optimizer names whose LR has no comparable published table (looked for before Adam's).
_NO_REFERENCE = ("galore", "schedule_free", "schedulefree", "muon", "lamb", "lars", "sophia",
                 "lomo", "shampoo", "soap", "prodigy", "dadapt", "sgd", "rmsprop", "adagrad",
                 "adadelta", "novograd", "came")


def optimizer_family(name: str) -> str | None:
    """``adam``, ``lion`` or ``adafactor`` for an optimizer sapper has published LRs for
    (any spelling: ``adamw_torch_fused``, ``paged_adamw_8bit``, ``decoupled_lionw``), else
    None."""
    n = name.lower().replace("-", "_")
    if any(word in n for word in _NO_REFERENCE):
        return None
    if "lion" in n:
        return "lion"
    if "adafactor" in n:
        return "adafactor"
    if "adam" in n:
        return "adam"
    return None


@dataclass(frozen=True)
class LrReference:
    """What the plan's peak LR is compared with, and where each number comes from."""

    lr: float
    #: The highest published peak LR the reference rests on (before the optimizer and
    #: batch adjustments), and the run that used it.
    base_lr: float
    run: str
    source: str
    #: The lowest published peak LR of the same size (for the low side).
    low_lr: float
    low_run: str
    params: int
    family: str
    assumed_family: bool
    #: Multiplier from the batch (√ rule), 1 when not applied.
    batch_factor: float

    def describe(self) -> str:
        """The reference as arithmetic: run, source, adjustments."""
        text = f"{self.run} ({self.source}) peaked at {self.base_lr:.2g}"
        if self.family == "lion":
            text += f", ÷{LION_DIVISOR:g} for Lion"
        if self.batch_factor >= 1.05:
            text += f", ×{self.batch_factor:.2g} for the larger batch (√ rule)"
        return text


def _same_size(params: float) -> list[PublishedRun]:
    near = [r for r in PUBLISHED_ADAM if params / SIZE_WINDOW <= r.params <= params * SIZE_WINDOW]
    if near:
        return near
    # Between table rows or off its ends: the nearest run(s) in log size.
    dist = [abs(math.log(r.params / params)) for r in PUBLISHED_ADAM]
    best = min(dist)
    return [r for r, d in zip(PUBLISHED_ADAM, dist, strict=True) if d <= best * 1.000001]


def _unresolved(plan: Plan, path: str) -> bool:
    return any(path == u or path.startswith(u + ".") for u in plan.unresolved)


def lr_reference(plan: Plan) -> LrReference | NotEvaluated:
    """The published reference for the plan's size, optimizer and batch, or what is missing
    to find one (never a guess)."""
    what = "the peak learning rate against published runs of this size and optimizer"
    arch = plan_architecture(plan)
    if arch is None:
        return not_evaluated(what, "model")
    opt = plan.optimizer
    assumed = "type" not in opt.model_fields_set or _unresolved(plan, "optimizer.type")
    family = "adam" if assumed else optimizer_family(opt.type)
    if family is None:
        return not_evaluated(
            f"{what}: sapper has published peak LRs for Adam-family, Lion and Adafactor "
            f"optimizers, none for '{opt.type}'",
            "optimizer.type",
        )
    params = active_params(arch)
    near = _same_size(params)
    top = max(near, key=lambda r: r.lr)
    low = min(near, key=lambda r: r.lr)
    if family == "adafactor":
        return LrReference(ADAFACTOR_LR, ADAFACTOR_LR, "Adafactor with parameter scaling",
                           _ADAFACTOR_SOURCE, ADAFACTOR_LR, "Adafactor", params, family,
                           assumed, 1.0)
    factor = 1.0
    tokens = plan.tokens_per_step
    if family == "adam" and tokens is not None and tokens > top.batch_tokens:
        factor = math.sqrt(tokens / top.batch_tokens)
    lr = top.lr * factor / (LION_DIVISOR if family == "lion" else 1.0)
    low_lr = low.lr / (LION_DIVISOR if family == "lion" else 1.0)
    return LrReference(lr, top.lr, top.run, top.source, low_lr, low.run, params, family,
                       assumed, factor)


def _lr_or_missing(plan: Plan) -> float | NotEvaluated:
    if plan.optimizer.lr is None or _unresolved(plan, "optimizer.lr"):
        return not_evaluated(
            "the peak learning rate against published runs of this size and optimizer",
            "optimizer.lr",
        )
    return plan.optimizer.lr


def _size(params: int) -> str:
    return f"{params / 1e9:.3g}B" if params >= 1e9 else f"{params / 1e6:.3g}M"


LR_FAR_ABOVE = Rule(
    code="N501",
    name="peak-lr-far-above-published",
    check="optimizer",
    severity=Severity.WARNING,
    title="Peak learning rate far above what runs of this size used",
    why="""\
Published pre-training runs sit on a narrow band of peak learning rates that falls with
model size: for Adam 6e-4 at 125M parameters, 3e-4 at 7B, 1.5e-4 at 70B, 8e-5 at 405B
(GPT-3, Pythia, LLaMA, Llama 2, Llama 3, Chinchilla, OLMo, BLOOM). Larger models take smaller
steps because a wider layer sums more updated weights into each output (the reason μP
scales Adam's LR of hidden matrices by 1/width). A peak LR ten
times above every published run of the same size has no evidence it trains; a hundred
times above (or 0.1 and more with Adam, whose step is about LR per weight whatever the
gradient's size) moves every weight by about the LR on the first steps after warmup: the
loss spikes, the gradient norm surges and the run diverges or settles far above where it
should (seed §5.2: gradient norm often above the threshold means the LR is too high).
sapper compares with the highest peak LR published within a factor of two of the plan's
parameter count (active parameters for MoE), raised by √(batch ratio) for a larger batch
(Adam), divided by 3 for Lion (its authors: 3-10× below AdamW); Adafactor with parameter
scaling is compared with PaLM's and T5's 10^-2.""",
    signs="""\
Loss falls fast and then spikes or turns to NaN around the end of warmup, when the LR
reaches its peak; gradient norms above the clipping threshold on most steps; the loss
curve of a smaller run at the same LR is fine.""",
    fix="""\
Use a peak LR near the published one for this size and optimizer (the finding names it);
if the value was meant, sweep it on a small model first (sapper smoke) and keep a warmup.
Check the exponent (3e-4 typed as 3e-2) and any LR scaled linearly from a much smaller
batch.""",
    seed="§5.2, §6",
)

LR_FAR_BELOW = Rule(
    code="N502",
    name="peak-lr-far-below-published",
    check="optimizer",
    severity=Severity.WARNING,
    title="Peak learning rate far below what pre-training runs of this size used",
    why="""\
Fine-tuning and preference training run at LRs 10-1000× below pre-training (full
fine-tuning about 1e-5, DPO about 5e-7), so a low LR on a pretrained model is normal. On
a model trained from scratch, a peak LR 30× below the lowest published pre-training run
of the same size makes each step move the weights by almost nothing: the loss falls far
more slowly than planned and the run ends undertrained, with no error anywhere (seed
§5.2: a flat loss means check the LR). sapper reports it as a warning when the plan says
it trains from scratch (init.from_pretrained: false), as information when it does not
say, and not at all for a fine-tune.""",
    signs="""\
A loss that moves far more slowly than in published runs at the same token count;
gradient norms that are healthy while the weights barely change between checkpoints.""",
    fix="""\
For pre-training, use a peak LR near the published one for this size (the finding names
it). If the run fine-tunes a checkpoint, say so (init.from_pretrained: true).""",
    seed="§5.2",
)


@plan_check(LR_FAR_ABOVE, LR_FAR_BELOW)
def peak_lr_vs_published(plan: Plan) -> CheckOutput:
    lr = _lr_or_missing(plan)
    if isinstance(lr, NotEvaluated):
        yield lr
        return
    ref = lr_reference(plan)
    if isinstance(ref, NotEvaluated):
        yield ref
        return
    yield from _far_above(plan, lr, ref)
    yield from _far_below(plan, lr, ref)


def _far_above(plan: Plan, lr: float, ref: LrReference) -> CheckOutput:
    ratio = lr / ref.lr
    absolute = ref.family == "adam" and lr >= ADAM_ABSOLUTE_ERROR
    if ratio <= WARN_RATIO * (1 + 1e-9) and not absolute:
        return
    error = ratio >= ERROR_RATIO * (1 - 1e-9) or absolute
    opt = ("an Adam-family optimizer (assumed: the plan names none)" if ref.assumed_family
           else plan.optimizer.type)
    tuning = (" (fine-tuning from a checkpoint: full fine-tunes run about 10× below this, "
              "adapters near it)" if plan.init.from_pretrained else "")
    message = (
        f"peak LR {lr:g} with {opt} on {_size(ref.params)} parameters is {ratio:.3g}× the "
        f"reference {ref.lr:.2g} ({ref.describe()}){tuning}"
    )
    if absolute and ratio < ERROR_RATIO:
        message += f"; an Adam LR ≥ {ADAM_ABSOLUTE_ERROR:g} diverges a transformer at any size"
    yield LR_FAR_ABOVE.finding(
        message,
        severity=Severity.ERROR if error else None,
        fix=f"set optimizer.lr near {ref.lr:.2g} (published for this size and optimizer); "
        "sweep on a small model if a higher LR was meant",
        value=lr,
        threshold=ref.lr * (ERROR_RATIO if error else WARN_RATIO),
        source="optimizer.lr",
        ratio=round(ratio, 3),
        reference_lr=ref.lr,
        reference_run=ref.run,
        reference_source=ref.source,
        parameters=ref.params,
        optimizer_family=ref.family,
        batch_factor=round(ref.batch_factor, 3),
    )


def _far_below(plan: Plan, lr: float, ref: LrReference) -> CheckOutput:
    if plan.init.from_pretrained:
        return  # fine-tuning and preference training run far below pre-training LRs
    floor = ref.low_lr / LOW_RATIO
    if lr >= floor * (1 - 1e-9):
        return
    scratch = "from_pretrained" in plan.init.model_fields_set
    yield LR_FAR_BELOW.finding(
        f"peak LR {lr:g} on {_size(ref.params)} parameters is {ref.low_lr / lr:.3g}× below "
        f"the lowest published pre-training peak of this size ({ref.low_run}: "
        f"{ref.low_lr:.2g})"
        + ("" if scratch else "; fine if this fine-tunes a checkpoint (say so: "
           "init.from_pretrained: true)"),
        severity=None if scratch else Severity.INFO,
        fix=f"for pre-training use a peak LR near {ref.lr:.2g}",
        value=lr,
        threshold=floor,
        source="optimizer.lr",
        reference_lr=ref.low_lr,
        reference_run=ref.low_run,
        parameters=ref.params,
    )
