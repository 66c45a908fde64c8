"""Model states per GPU: parameters, gradients and optimizer states (seed §3.1, §3.3).

Parameters are counted per tensor from the architecture, then divided the way the
layout divides them: tensor parallelism splits the matrices (column/row parallel; norms
and row-parallel biases stay whole), expert parallelism splits the experts, the pipeline
gives each stage its blocks (the first the embeddings, the last the final norm and the
output head). ZeRO then shards optimizer states (stage 1), gradients (stage 2) and the
weights themselves (stage 3) over the data-parallel group (seed §3.3); offload moves
states to host memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sapper.memory.inputs import Shape
from sapper.memory.pipeline import layers_per_stage

__all__ = [
    "ParamCount",
    "StageStates",
    "block_params",
    "stage_param_count",
    "stage_params",
    "stage_states",
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


@lru_cache(maxsize=512)
def block_params(sh: Shape) -> ParamCount:
    """One transformer block on one GPU (after TP and EP)."""
    h, t = sh.hidden, sh.tp
    q = sh.heads * sh.head_dim
    kv = sh.kv_heads * sh.head_dim
    norm = h * (2 if sh.norm == "layernorm" else 1)
    pc = _vector(norm) + _vector(norm)
    pc += _matrix(h, _div(q + 2 * kv, t)) + _matrix(_div(q, t), h)
    if sh.attn_bias:
        pc += _vector(_div(q + 2 * kv, t)) + _vector(h)
    mats = 3 if sh.gated else 2
    in_mats = mats - 1
    if sh.moe:
        local = _div(sh.experts, sh.ep)
        f = _div(sh.expert_ffn, t)
        pc += _matrix(h, f, expert=True, count=local * in_mats)
        pc += _matrix(f, h, expert=True, count=local)
        if sh.mlp_bias:
            pc += _vector(local * (in_mats * f + h), expert=True)
        pc += _matrix(h, sh.experts)  # router
    else:
        f = _div(sh.ffn, t)
        pc += _matrix(h, f, count=in_mats) + _matrix(f, h)
        if sh.mlp_bias:
            pc += _vector(in_mats * f + h)
    return pc


def _embedding(sh: Shape) -> ParamCount:
    pc = _matrix(_div(sh.vocab, sh.tp), sh.hidden)
    # lookups are not matmuls: autocast leaves the table in fp32
    pc = ParamCount(pc.dense, 0, 0, pc.factored, pc.largest)
    if sh.positions:
        pc += _vector(sh.positions * sh.hidden)
    return pc


def _head(sh: Shape, shares_embedding: bool) -> ParamCount:
    final_norm = _vector(sh.hidden * (2 if sh.norm == "layernorm" else 1))
    if shares_embedding:
        return final_norm
    return final_norm + _matrix(_div(sh.vocab, sh.tp), sh.hidden)


def _stage_count(sh: Shape, i: int, n: int) -> ParamCount:
    pc = block_params(sh).times(n)
    if i == 0:
        pc += _embedding(sh)
    if i == sh.pp - 1:
        # A tied head shares the embedding when both live on the same stage; with
        # pp > 1 the last stage keeps its own copy (synchronised by an all-reduce).
        pc += _head(sh, shares_embedding=sh.tied and sh.pp == 1)
    if sh.num_params:
        # A loader knew the exact count: keep the split, scale to the exact total.
        total = sum(_full_model(sh))
        if total:
            f = sh.num_params / total
            pc = ParamCount(
                round(pc.dense * f),
                round(pc.expert * f),
                round(pc.matmul * f),
                round(pc.factored * f),
                pc.largest,
            )
    return pc


def stage_param_count(sh: Shape, i: int) -> ParamCount:
    """Parameters on one GPU of pipeline stage ``i``."""
    return _stage_count(sh, i, layers_per_stage(sh)[i])


@lru_cache(maxsize=512)
def stage_params(sh: Shape) -> tuple[ParamCount, ...]:
    """Parameters on one GPU of each pipeline stage."""
    return tuple(_stage_count(sh, i, n) for i, n in enumerate(layers_per_stage(sh)))


@lru_cache(maxsize=512)
def _full_model(sh: Shape) -> list[int]:
    """Unsharded parameter count of the whole model (for scaling to an exact count)."""
    one = sh.replace(tp=1, ep=1, pp=1, num_params=None)
    return [p.total for p in stage_params(one)]


@dataclass(frozen=True)
class StageStates:
    """Resident bytes of the model states on one GPU, and what lives on the host."""

    params: int
    grads: int
    optimizer: int  # master copy + moments
    host: int  # bytes offloaded to CPU memory (per GPU)
    nvme: int  # bytes offloaded to NVMe (per GPU)
    params_full: int  # this GPU's parameters before ZeRO-3 sharding (bytes)
    grads_full: int  # this GPU's gradients before ZeRO-2 sharding (bytes)


def _shard(n: float, k: int) -> int:
    return int(-(-n // k)) if k > 1 else int(n)


def stage_states(sh: Shape, pc: ParamCount) -> StageStates:
    """Bytes of parameters, gradients and optimizer states on one GPU of a stage."""
    r = sh.recipe
    zg_dense = max(sh.dp * sh.cp, 1)
    zg_expert = max(zg_dense // sh.ep, 1)

    def sharded(per_param: float, on: bool) -> int:
        if not on:
            return int(pc.dense * per_param + pc.expert * per_param)
        return _shard(pc.dense * per_param, zg_dense) + _shard(pc.expert * per_param, zg_expert)

    if sh.optimizer == "adafactor":
        moments = pc.factored * 4 + (pc.total * 4 if sh.momentum > 0 else 0)
        state_bytes = moments / max(pc.total, 1)
    else:
        state_bytes = r.state
    opt_per_param = state_bytes + r.master
    params = sharded(r.weight, sh.zero >= 3)
    grads = sharded(r.grad, sh.zero >= 2)
    optimizer = sharded(opt_per_param, sh.zero >= 1 or sh.optimizer_partitioned)
    host = nvme = 0
    if sh.offload_optimizer != "none":
        # ZeRO-Offload: master, moments and (fp32) gradients of the shard move to the host.
        moved = optimizer + sharded(4, sh.zero >= 1 or sh.optimizer_partitioned)
        if sh.offload_optimizer == "nvme":
            nvme += optimizer
            host += moved - optimizer
        else:
            host += moved
        optimizer = 0
        grads = sharded(r.grad, True) if sh.zero >= 2 else grads
    if sh.offload_params != "none" and sh.zero >= 3:
        if sh.offload_params == "nvme":
            nvme += params
        else:
            host += params
        params = 0
    return StageStates(
        params=params,
        grads=grads,
        optimizer=optimizer,
        host=host,
        nvme=nvme,
        params_full=int(pc.total * r.weight),
        grads_full=int(pc.total * r.grad),
    )
