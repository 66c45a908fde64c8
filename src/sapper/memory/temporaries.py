"""Short-lived allocations that often make the peak (seed §3.1).

* The output head and loss: logits are ``b·s·V`` — with a large vocabulary the largest
  single allocation of the step — and the loss upcasts them to fp32 and keeps the
  log-softmax; its backward holds the fp32 gradient of the logits.
* Optimizer-step temporaries: PyTorch's multi-tensor (foreach) Adam allocates ``sqrt(v)``
  for every parameter at once; the per-tensor loop, for the largest tensor only; fused
  kernels none.
* Communication buffers: ZeRO's gradient reduce bucket and stage-3 parameter gathers and
  prefetch, sized by the plan's DeepSpeed ``zero_optimization`` values (DeepSpeed's
  defaults where it sets none: :mod:`sapper.memory.buckets`), DDP's gradient buckets.
* Under ``torch.autocast``, the low-precision copy of every matmul weight, kept from its
  forward until its backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from sapper.memory.activations import tokens
from sapper.memory.buckets import DEEPSPEED_DEFAULTS, DS_KEYS, Bucket
from sapper.memory.inputs import Shape
from sapper.memory.states import block_params
from sapper.model import MissingInput
from sapper.model.params import ParamCount

__all__ = [
    "HeadCost",
    "comm_buffers",
    "grouped_experts",
    "head_cost",
    "largest_tensor",
    "master_grad_elements",
    "optimizer_temporaries",
    "weight_casts",
]


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


def grouped_experts(sh: Shape) -> bool:
    """Hugging Face MoE experts run through transformers' grouped matmul (its default
    experts implementation in 5.x): one 3D weight per projection for all of a layer's
    experts, and an op autocast does not cover, so the experts compute in the weights'
    own dtype (their input is cast to it, not to the autocast dtype)."""
    return sh.moe and sh.impl == "transformers"


def _expert_matmul(sh: Shape, pc: ParamCount) -> int:
    """Elements of the expert weight matrices in ``pc`` (its expert part less biases)."""
    if not pc.expert:
        return 0
    f = _div(sh.expert_ffn, sh.tp)
    mats = (3 if sh.gated else 2) * sh.hidden * f
    bias = ((2 if sh.gated else 1) * f + sh.hidden) if sh.mlp_bias else 0
    return pc.expert * mats // (mats + bias)


def largest_tensor(sh: Shape, pc: ParamCount) -> int:
    """Elements of the largest parameter tensor (a per-tensor optimizer loop's
    temporaries are sized by it). Grouped experts store a layer's local experts as one
    ``E × 2f × h`` gate-up tensor (gated; ``E × f × h`` otherwise) and one down tensor."""
    if not grouped_experts(sh) or not pc.expert:
        return pc.largest
    local = _div(sh.experts, sh.ep)
    f = _div(sh.expert_ffn, sh.tp)
    return max(pc.largest, local * (2 if sh.gated else 1) * f * sh.hidden)


def weight_casts(sh: Shape, pc: ParamCount, last_stage: bool) -> int:
    """Autocast's low-precision copies of matmul weights (bytes) for one stage (grouped
    experts are not cast: :func:`grouped_experts`)."""
    if not sh.recipe.autocast:
        return 0
    n = pc.matmul - (_expert_matmul(sh, pc) if grouped_experts(sh) else 0)
    if last_stage and sh.tied and sh.pp == 1:
        n += _div(sh.vocab, sh.tp) * sh.hidden  # the head reuses the embedding table
    return sh.recipe.compute * n


def comm_buffers(sh: Shape, pc: ParamCount, blocks: int = 0) -> tuple[int, int]:
    """(persistent, backward-only) communication bytes on one GPU of a stage holding
    ``blocks`` transformer blocks."""
    r = sh.recipe
    if sh.dp * sh.cp <= 1 and sh.zero == 0:
        return 0, 0
    if sh.zero == 0:
        if sh.impl == "megatron":
            return 0, 0  # gradients are views into the bucketed buffer
        return pc.total * r.grad, 0  # DDP keeps a bucketed copy of every gradient
    if sh.buckets.deepspeed:
        return _deepspeed_buffers(sh, pc, blocks)
    # Other sharded data parallelism (FSDP): one reduce bucket of the stage's gradients;
    # at stage 3 the gathered block, the next one prefetched and its gradients.
    bucket = min(DEEPSPEED_DEFAULTS["reduce_bucket_size"], pc.total) * r.grad
    if sh.zero < 3:
        return 0, bucket
    block = block_params(sh).total
    gathered = min(
        DEEPSPEED_DEFAULTS["max_live_parameters"],
        2 * block + DEEPSPEED_DEFAULTS["prefetch_bucket_size"],
    ) * r.weight
    return gathered, bucket + block * r.grad


def _size(bucket: Bucket) -> int:
    """A size the estimate needs; "auto" left unknown raises :class:`MissingInput`."""
    if bucket.elements is None:
        key = DS_KEYS[bucket.name]
        raise MissingInput(
            f"zero_optimization.{key} is unknown: {bucket.source}",
            field=f"parallel.deepspeed.{bucket.name}",
            expected="a number of elements (or a model whose hidden size fills \"auto\")",
        )
    return bucket.elements


def _deepspeed_buffers(sh: Shape, pc: ParamCount, blocks: int) -> tuple[int, int]:
    """DeepSpeed ZeRO's buffers from the plan's sizes (deepspeed/runtime/zero/).

    Stages 1-2 (stage_1_and_2.py ``setup_buckets``): with ``contiguous_gradients`` (on by
    default) each backward allocates a reduce buffer of ``reduce_bucket_size`` elements —
    the full size, however small the model — and a second one with ``overlap_comm``; the
    epilogue frees them. Without it, ``allreduce_bucket`` flattens each bucket instead.
    The updated parameters are all-gathered in place into the flat 16-bit buffer
    (runtime/utils.py ``all_gather_dp_groups`` slices it by ``allgather_bucket_size``), so
    that size costs no memory.

    Stage 3 (stage3.py): with ``contiguous_gradients`` the reduce buffer (one per
    gradient dtype) is allocated once at start-up and kept. The parameter coordinator
    (partitioned_param_coordinator.py) holds the gathered block and prefetches up to
    ``stage3_prefetch_bucket_size`` more, never past ``stage3_max_live_parameters``
    (which also bounds what ``stage3_max_reuse_distance`` keeps). Tensors of at most
    ``stage3_param_persistence_threshold`` elements stay whole on every GPU
    (:func:`_persistent`).
    """
    r, zb = sh.recipe, sh.buckets
    bucket = _size(zb.reduce)
    # without contiguous_gradients each bucket of gradients is flattened into a new
    # tensor while it is reduced: at most the bucket, at most the stage's gradients
    flat = min(bucket, pc.total) * r.grad
    if sh.zero < 3:
        if not zb.contiguous:
            return 0, flat
        # sized in the dtype of the 16-bit weights the optimizer holds, not autocast's
        return 0, bucket * r.weight * (2 if zb.overlap_comm else 1)
    block = block_params(sh)
    live = _size(zb.max_live)
    gathered = min(live, 2 * block.total + _size(zb.prefetch)) * r.weight
    keep = gathered + _persistent(sh, block, blocks)
    if zb.contiguous:
        return keep + bucket * r.grad, block.total * r.grad
    return keep, block.total * r.grad + flat


def _block_tensors(sh: Shape) -> list[tuple[int, int]]:
    """(elements, count) of each tensor of one block on one GPU, as Hugging Face modules
    hold them (separate q/k/v projections; one tensor per norm weight and bias)."""
    h, t = sh.hidden, sh.tp
    q, kv = _div(sh.heads * sh.head_dim, t), _div(sh.kv_heads * sh.head_dim, t)
    norm_tensors = sh.block_norms * (2 if sh.norm == "layernorm" else 1)
    out = [(h, norm_tensors), (h * q, 1), (h * kv, 2), (q * h, 1)]
    if sh.attn_bias:
        out += [(q, 1), (kv, 2), (h, 1)]
    in_mats = 2 if sh.gated else 1
    if sh.moe:
        f = _div(sh.expert_ffn, t)
        local = _div(sh.experts, sh.ep)
        out += [(h * f, in_mats * local), (f * h, local), (h * sh.experts, 1)]
        if sh.mlp_bias:
            out += [(f, in_mats * local), (h, local)]
    else:
        f = _div(sh.ffn, t)
        out += [(h * f, in_mats), (f * h, 1)]
        if sh.mlp_bias:
            out += [(f, in_mats), (h, 1)]
    return out


def _persistent(sh: Shape, block: ParamCount, blocks: int) -> int:
    """Bytes the persistence threshold keeps whole beyond what states.py counts.

    ``Init._convert_to_deepspeed_param`` (runtime/zero/partition_parameters.py) marks a
    tensor of at most ``stage3_param_persistence_threshold`` elements ``ds_persist``: it is
    replicated through training and its partition stays on the GPU even with parameter
    offload. At the default 10^5 that is every norm weight and bias, a small MoE router,
    and, in a model narrower than about 300, the projections too. states.py already
    counts a 1/DP shard of them on the GPU, none when parameters are offloaded.
    """
    threshold = _size(sh.buckets.persistence)
    if blocks <= 0:
        return 0
    per_block = sum(n * k for n, k in _block_tensors(sh) if n <= threshold)
    kept = min(per_block, block.total) * blocks
    counted = 0 if sh.offload_params != "none" else kept // max(sh.dp * sh.cp, 1)
    return (kept - counted) * sh.recipe.weight


def master_grad_elements(sh: Shape, elements: int) -> int:
    """Elements of the fp32 gradient copy the optimizer step makes of ``elements`` shard
    elements: ZeRO-3 under DeepSpeed makes it one sub-group at a time
    (stage3.py ``_prepare_fp32_grad_for_sub_group``; sub-groups of ``sub_group_size``),
    everything else for the whole shard at once."""
    if sh.zero == 3 and sh.buckets.deepspeed:
        return min(elements, _size(sh.buckets.sub_group))
    return elements
