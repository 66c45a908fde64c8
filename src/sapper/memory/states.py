"""Model states per GPU: parameters, gradients and optimizer states (seed §3.1, §3.3).

Parameters per GPU come from :mod:`sapper.model.params` (counted per tensor, split the
way TP, EP and the pipeline split them). ZeRO then shards optimizer states (stage 1),
gradients (stage 2) and the weights themselves (stage 3) over the data-parallel group
(seed §3.3); offload moves states to host memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from sapper.memory.inputs import Shape
from sapper.memory.pipeline import layers_per_stage
from sapper.model import params
from sapper.model.params import ParamCount

__all__ = [
    "StageStates",
    "block_params",
    "stage_param_count",
    "stage_params",
    "stage_states",
]


def block_params(sh: Shape) -> ParamCount:
    """One transformer block on one GPU (after TP and EP)."""
    return params.block_params(sh, sh.tp, sh.ep)


def stage_params(sh: Shape) -> tuple[ParamCount, ...]:
    """Parameters on one GPU of each pipeline stage."""
    return params.stage_params(sh, layers_per_stage(sh), sh.tp, sh.ep)


def stage_param_count(sh: Shape, i: int) -> ParamCount:
    """Parameters on one GPU of pipeline stage ``i``."""
    return stage_params(sh)[i]


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
