"""Short-lived allocations that often make the peak (seed §3.1).

* The output head and loss: logits are ``b·s·V`` — with a large vocabulary the largest
  single allocation of the step — and the loss upcasts them to fp32 and keeps the
  log-softmax; its backward holds the fp32 gradient of the logits.
* Optimizer-step temporaries: PyTorch's multi-tensor (foreach) Adam allocates ``sqrt(v)``
  for every parameter at once; the per-tensor loop, for the largest tensor only; fused
  kernels none.
* Communication buffers: ZeRO's gradient reduce bucket and stage-3 parameter gathers and
  prefetch (DeepSpeed's defaults unless told otherwise), DDP's gradient buckets.
* Under ``torch.autocast``, the low-precision copy of every matmul weight, kept from its
  forward until its backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from sapper.memory.activations import tokens
from sapper.memory.inputs import Shape
from sapper.memory.states import ParamCount, block_params

__all__ = ["HeadCost", "comm_buffers", "head_cost", "optimizer_temporaries", "weight_casts"]


def _div(n: int, k: int) -> int:
    return -(-n // k)


@dataclass(frozen=True)
class HeadCost:
    """The final norm, output projection and loss for one micro-batch (bytes)."""

    saved: int  # kept for backward after the loss is computed
    fwd_peak: int  # momentary, while the loss runs (includes ``saved``)
    bwd_peak: int  # momentary, at the start of backward (includes ``saved``)


def head_cost(sh: Shape) -> HeadCost:
    r = sh.recipe
    c, res = r.compute, r.residual
    n = tokens(sh)
    v = _div(sh.vocab, sh.tp)
    h = sh.hidden
    if sh.norm == "layernorm":
        norm = res * h + 8
    elif res == 4:
        norm = 8 * h + 4
    else:
        norm = 6 * h + 4
    proj_in = c * h if (r.autocast and res != c) else res * h
    if sh.impl == "megatron":
        # vocab-parallel cross entropy: an fp32 copy of the logits becomes the softmax it
        # keeps; backward turns it into the gradient in place and casts it down.
        norm = (c * h + (8 if sh.norm == "layernorm" else 4)) / (sh.tp if sh.sp else 1)
        base = int(n * (norm + c * h))
        saved = base + 4 * v * n
        return HeadCost(saved, saved + c * v * n, saved + c * v * n)
    logits = c * v * n
    upcast = 4 * v * n if c != 4 else 0
    lsm = 4 * v * n
    base = int(n * (norm + proj_in))
    if sh.logit_softcap:
        base += c * v * n  # tanh(logits / cap), kept by tanh's backward
    saved = base + lsm
    fwd = base + logits + upcast + lsm
    # nll gradient, log-softmax gradient and the saved log-softmax; then the cast down
    bwd = base + max(3 * 4 * v * n, 4 * v * n + (c * v * n if c != 4 else 0))
    return HeadCost(saved, fwd, bwd)


def optimizer_temporaries(sh: Shape, elements: int, largest: int) -> int:
    """Peak extra bytes of one optimizer step over ``elements`` parameters on the GPU."""
    if sh.offload_optimizer != "none" or elements == 0:
        return 0
    kind = sh.optimizer
    state = 4
    if sh.fused or sh.recipe.master:
        # fused kernels, and the fused multi-tensor Adam that DeepSpeed and Megatron run
        # over their fp32 master copies, allocate nothing per parameter
        return 0
    unit = elements if sh.foreach else largest
    if kind in ("adam", "adamw", "fusedadam", "lamb"):
        extra = 1 if sh.foreach else 2  # sqrt(v) (then divided in place) / sqrt and quotient
        if kind == "adam" and sh.weight_decay > 0:
            extra += 1  # grad + wd·param is a new tensor
        return extra * state * unit
    if kind == "sgd":
        return state * unit if sh.weight_decay > 0 else 0
    if kind in ("lion", "adagrad", "rmsprop", "muon"):
        return state * unit
    if kind == "adafactor":
        return 2 * state * largest
    return state * unit


def weight_casts(sh: Shape, pc: ParamCount, last_stage: bool) -> int:
    """Autocast's low-precision copies of matmul weights (bytes) for one stage."""
    if not sh.recipe.autocast:
        return 0
    n = pc.matmul
    if last_stage and sh.tied and sh.pp == 1:
        n += _div(sh.vocab, sh.tp) * sh.hidden  # the head reuses the embedding table
    return sh.recipe.compute * n


#: DeepSpeed defaults (elements): reduce bucket, stage-3 prefetch, stage-3 max live params.
REDUCE_BUCKET = 500_000_000
PREFETCH_BUCKET = 50_000_000
MAX_LIVE = 1_000_000_000


def comm_buffers(sh: Shape, pc: ParamCount) -> tuple[int, int]:
    """(persistent, backward-only) communication bytes on one GPU of a stage."""
    r = sh.recipe
    if sh.dp * sh.cp <= 1 and sh.zero == 0:
        return 0, 0
    if sh.zero == 0:
        if sh.impl == "megatron":
            return 0, 0  # gradients are views into the bucketed buffer
        return pc.total * r.grad, 0  # DDP keeps a bucketed copy of every gradient
    bucket = min(REDUCE_BUCKET, pc.total) * r.grad
    if sh.zero < 3:
        return 0, bucket
    block = block_params(sh).total
    gathered = min(MAX_LIVE, 2 * block + PREFETCH_BUCKET) * r.weight
    return gathered, bucket + block * r.grad
