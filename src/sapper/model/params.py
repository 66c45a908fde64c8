"""Parameters of the model, counted per tensor: per block, per stage, in total.

One count serves every command: ``check`` prints its total, ``memory`` turns each stage's
share into bytes, ``plan`` prices the optimizer update and the gradient reduction over
it. Matrices are split the way tensor parallelism splits them (column/row parallel; norms
and row-parallel biases stay whole), experts the way expert parallelism does, blocks over
pipeline stages (the first takes the embeddings, the last the final norm and the output
head). When a loader knew the exact count (``model.num_params``, e.g. from the Hugging
Face model built on the meta device) every count keeps its split and is scaled to that
total, so the commands print the loader's number and not an approximation of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sapper.model.architecture import Architecture

__all__ = [
    "ModelParams",
    "ParamCount",
    "active_params",
    "block_params",
    "blocks_params",
    "model_params",
    "stage_params",
    "total_params",
]


def _div(n: int, k: int) -> int:
    """Ceil division: a split that does not divide leaves the largest shard."""
    return -(-n // k)


@dataclass(frozen=True)
class ParamCount:
    """Parameters on one GPU, split by how they are used and sharded."""

    dense: int = 0  # replicated over the whole data-parallel group
    expert: int = 0  # expert weights (sharded over ep; replicated over dp / ep)
    matmul: int = 0  # the part used by matmuls (autocast casts these)
    factored: int = 0  # Adafactor state elements (rows + cols per matrix, full for vectors)
    largest: int = 0  # largest single tensor (per-tensor optimizer temporaries)

    @property
    def total(self) -> int:
        return self.dense + self.expert

    def __add__(self, other: ParamCount) -> ParamCount:
        return ParamCount(
            self.dense + other.dense,
            self.expert + other.expert,
            self.matmul + other.matmul,
            self.factored + other.factored,
            max(self.largest, other.largest),
        )

    def times(self, k: int) -> ParamCount:
        return ParamCount(
            self.dense * k, self.expert * k, self.matmul * k, self.factored * k, self.largest
        )

    def scaled(self, f: float) -> ParamCount:
        if f == 1.0:
            return self
        return ParamCount(
            round(self.dense * f),
            round(self.expert * f),
            round(self.matmul * f),
            round(self.factored * f),
            self.largest,
        )


def _matrix(rows: int, cols: int, *, expert: bool = False, count: int = 1) -> ParamCount:
    n = rows * cols * count
    fac = (rows + cols) * count
    if expert:
        return ParamCount(expert=n, matmul=n, factored=fac, largest=rows * cols)
    return ParamCount(dense=n, matmul=n, factored=fac, largest=rows * cols)


def _vector(n: int, *, expert: bool = False) -> ParamCount:
    if expert:
        return ParamCount(expert=n, factored=n, largest=n)
    return ParamCount(dense=n, factored=n, largest=n)


def _norm(arch: Architecture) -> ParamCount:
    return _vector(arch.hidden * (2 if arch.norm == "layernorm" else 1))


def _attention(arch: Architecture, tp: int) -> ParamCount:
    """Projections (and their biases) of one block's attention on one TP rank."""
    h, heads = arch.hidden, arch.heads
    out = _matrix(_div(heads * arch.value_dim, tp), h)
    if arch.mla:
        # DeepSeek's multi-head latent attention: the down projections (to the latents,
        # and the shared rotary key) are whole on every TP rank, the up projections and
        # the output split by heads.
        q = heads * arch.head_dim
        pc = _matrix(h, arch.kv_lora + arch.rope_dim) + _vector(arch.kv_lora)
        pc += _matrix(arch.kv_lora, _div(heads * (arch.head_dim - arch.rope_dim
                                                  + arch.value_dim), tp))
        if arch.q_lora:
            pc += _matrix(h, arch.q_lora) + _vector(arch.q_lora)
            pc += _matrix(arch.q_lora, _div(q, tp))
        else:
            pc += _matrix(h, _div(q, tp))
        if arch.attn_bias:
            pc += _vector(arch.q_lora) + _vector(arch.kv_lora + arch.rope_dim) + _vector(h)
        return pc + out
    qkv = heads * arch.head_dim + arch.kv_heads * (arch.head_dim + arch.value_dim)
    pc = _matrix(h, _div(qkv, tp)) + out
    if arch.attn_bias:
        pc += _vector(_div(qkv, tp)) + _vector(h)
    return pc


def _mlp(arch: Architecture, width: int, tp: int, *, expert: bool = False,
         count: int = 1) -> ParamCount:
    """``count`` MLPs of inner ``width`` (gated: gate and up, then down) on one TP rank."""
    h, f = arch.hidden, _div(width, tp)
    in_mats = 2 if arch.gated else 1
    pc = _matrix(h, f, expert=expert, count=count * in_mats)
    pc += _matrix(f, h, expert=expert, count=count)
    if arch.mlp_bias:
        pc += _vector(count * (in_mats * f + h), expert=expert)
    return pc


@lru_cache(maxsize=1024)
def block_params(arch: Architecture, tp: int = 1, ep: int = 1, dense: bool = False) -> ParamCount:
    """One transformer block on one GPU (after TP and EP), before any exact-count scaling:
    a MoE model's expert block unless ``dense`` (its leading dense blocks)."""
    pc = _norm(arch) + _norm(arch) + _attention(arch, tp)
    if arch.moe and not dense:
        pc += _mlp(arch, arch.expert_ffn, tp, expert=True, count=_div(arch.experts, ep))
        pc += _matrix(arch.hidden, arch.experts)  # router
        if arch.shared_ffn:
            pc += _mlp(arch, arch.shared_ffn, tp)
    else:
        pc += _mlp(arch, arch.ffn, tp)
    return pc


def blocks_params(arch: Architecture, start: int, n: int, tp: int = 1, ep: int = 1) -> ParamCount:
    """Blocks ``start`` … ``start + n - 1`` on one GPU (the leading ones may be dense)."""
    dense = max(0, min(start + n, arch.first_dense) - start) if arch.moe else 0
    pc = block_params(arch, tp, ep).times(n - dense)
    if dense:
        pc += block_params(arch, tp, ep, dense=True).times(dense)
    return pc


def _embedding(arch: Architecture, tp: int) -> ParamCount:
    pc = _matrix(_div(arch.vocab, tp), arch.hidden)
    # lookups are not matmuls: autocast leaves the table in fp32
    pc = ParamCount(pc.dense, 0, 0, pc.factored, pc.largest)
    if arch.positions:
        pc += _vector(arch.positions * arch.hidden)
    return pc


def _head(arch: Architecture, tp: int, shares_embedding: bool) -> ParamCount:
    if shares_embedding:
        return _norm(arch)
    return _norm(arch) + _matrix(_div(arch.vocab, tp), arch.hidden)


@lru_cache(maxsize=1024)
def _unscaled_total(arch: Architecture) -> int:
    """The whole model on one GPU: every block, the embeddings, the final norm and head."""
    return (
        blocks_params(arch, 0, arch.layers).total
        + _embedding(arch, 1).total
        + _head(arch, 1, shares_embedding=arch.tied).total
    )


def exact_scale(arch: Architecture) -> float:
    """The factor from the per-tensor count to the loader's exact one (1 without one)."""
    total = _unscaled_total(arch)
    return arch.num_params / total if arch.num_params and total else 1.0


@lru_cache(maxsize=1024)
def stage_params(
    arch: Architecture, split: tuple[int, ...], tp: int = 1, ep: int = 1
) -> tuple[ParamCount, ...]:
    """Parameters on one GPU of each pipeline stage, ``split`` giving each stage's blocks
    (:func:`sapper.model.stages.stage_split`)."""
    f = exact_scale(arch)
    last = len(split) - 1
    out = []
    start = 0
    for i, n in enumerate(split):
        pc = blocks_params(arch, start, n, tp, ep)
        start += n
        if i == 0:
            pc += _embedding(arch, tp)
        if i == last:
            # A tied head shares the embedding when both live on the same stage; with
            # pp > 1 the last stage keeps its own copy (synchronised by an all-reduce).
            pc += _head(arch, tp, shares_embedding=arch.tied and last == 0)
        out.append(pc.scaled(f))
    return tuple(out)


def total_params(arch: Architecture) -> int:
    """Parameters of the whole model: the loader's exact count when it knew one."""
    return arch.num_params or _unscaled_total(arch)


def active_params(arch: Architecture) -> int:
    """Parameters a token passes through (MoE: its top-k experts, not all of them)."""
    total = total_params(arch)
    if not arch.moe:
        return total
    idle = block_params(arch).expert * (arch.experts - arch.top_k) // arch.experts
    return total - round(idle * arch.moe_layers * exact_scale(arch))


@dataclass(frozen=True)
class ModelParams:
    """The unsharded count split the way the step-cost model prices it (scaled to the
    exact count): per block (the mean over the blocks) outside and inside the experts,
    the embeddings (with a learned position table), the final norm with the untied
    head."""

    layer: float
    expert: float
    embedding: float
    head: float


@lru_cache(maxsize=1024)
def model_params(arch: Architecture) -> ModelParams:
    """The unsharded split of :class:`ModelParams`; its parts add up to
    :func:`total_params`."""
    f = exact_scale(arch)
    blocks = blocks_params(arch, 0, arch.layers)
    return ModelParams(
        layer=blocks.dense / arch.layers * f,
        expert=blocks.expert / arch.layers * f,
        embedding=_embedding(arch, 1).total * f,
        head=_head(arch, 1, shares_embedding=arch.tied).total * f,
    )
