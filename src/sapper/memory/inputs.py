"""The numbers the memory model reads, taken from a Plan once and checked.

:class:`Shape` is the model's :class:`~sapper.model.architecture.Architecture` (read and
checked there) with the batch, the layout and the mixed-precision recipe added: a flat,
frozen record (plain ints, bools and strings) so the estimator runs in microseconds and
what-if variants are a ``dataclasses.replace`` away. Impossible inputs (a micro-batch of
zero, more pipeline stages than layers, a sequence CP cannot split) raise
:class:`~sapper.errors.InputError` naming the plan field.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field

from sapper.errors import InputError
from sapper.memory.buckets import ZeroBuckets, default_buckets, zero_buckets
from sapper.model.architecture import (
    Architecture,
    architecture_fields,
    architecture_from_plan,
    need,
)
from sapper.model.dtypes import DTYPE_BYTES
from sapper.model.optimizers import state_bytes_per_param, step_kind
from sapper.model.stages import stage_split
from sapper.plan.schema import Plan

__all__ = ["Recipe", "Shape", "shape_from_plan"]


@dataclass(frozen=True)
class Recipe:
    """Bytes per element of each copy of the model (mixed-precision recipe, seed §2.1)."""

    weight: int  # the model's own weights
    grad: int  # gradients
    master: int  # separate master copy in the optimizer (0: the weights are the master)
    state: float  # optimizer state bytes per parameter (all moments together)
    compute: int  # activations produced by matmuls
    residual: int  # the residual stream between blocks
    autocast: bool  # matmuls cast fp32 weights/inputs to ``compute`` on the fly


@dataclass(frozen=True, kw_only=True)
class Shape(Architecture):
    """The architecture in one layout and batch: everything the analytic memory model
    needs, per GPU where it says so."""

    # batch
    micro_batch: int
    seq: int
    micro_batches: int  # per optimizer step per pipeline (gradient accumulation)
    # layout
    tp: int
    pp: int
    cp: int
    ep: int
    dp: int
    sp: bool
    zero: int
    offload_optimizer: str
    offload_params: str
    ckpt: str  # none / selective / full
    ckpt_every: int
    vpp: int
    schedule: str
    first_layers: int | None  # blocks on the first pipeline stage (None: an even split)
    last_layers: int | None  # blocks on the last pipeline stage (None: an even split)
    # numerics and optimizer
    recipe: Recipe
    optimizer: str
    momentum: float
    weight_decay: float
    foreach: bool  # multi-tensor step: temporaries over all parameters at once
    fused: bool  # fused step: no temporaries
    #: ``optimizer.impl`` as given ("auto": torch's default for the device, decided by
    #: the estimate, which knows the device).
    optimizer_impl: str = "auto"
    #: Master weights and optimizer states partitioned over DP although ``zero`` < 1
    #: (DeepSpeed's BF16_Optimizer for bf16 without ZeRO).
    optimizer_partitioned: bool = False
    #: ZeRO's buffer sizes and where they came from (memory/buckets.py).
    buckets: ZeroBuckets = dataclass_field(default_factory=default_buckets)

    def replace(self, **changes: object) -> Shape:
        return replace(self, **changes)


def _step_kind(plan: Plan) -> dict[str, object]:
    opt = plan.optimizer
    foreach, fused = step_kind(opt.impl, opt.fused)
    return {"foreach": foreach, "fused": fused, "optimizer_impl": opt.impl}


def _recipe(plan: Plan) -> Recipe:
    p, opt = plan.precision, plan.optimizer
    dtype = p.dtype
    state_bytes = state_bytes_per_param(
        opt.type, opt.momentum, p.optimizer_states,
        eight_bit=opt.eight_bit or opt.impl == "bnb_8bit",
    )
    if dtype in ("fp32", "tf32"):
        grad = DTYPE_BYTES[p.grad_dtype or "fp32"]
        return Recipe(4, grad, 0, state_bytes, 4, 4, False)
    compute = 2  # fp8 recipes keep bf16 activations and weights (fp8 copies are transient)
    if p.autocast:
        grad = DTYPE_BYTES[p.grad_dtype or "fp32"]
        return Recipe(4, grad, 0, state_bytes, compute, 4, True)
    weight = 2
    master = DTYPE_BYTES[p.master_weights] if DTYPE_BYTES[p.master_weights] != weight else 0
    grad = DTYPE_BYTES[p.grad_dtype] if p.grad_dtype else weight
    return Recipe(weight, grad, master, state_bytes, compute, compute, False)


def shape_from_plan(plan: Plan) -> Shape:
    """Read and check the plan; raise :class:`InputError` on anything impossible."""
    arch = architecture_from_plan(plan)
    layers = arch.layers
    b = plan.batch
    micro = need(b.micro_batch_size, "batch.micro_batch_size", "sequences per GPU")
    seq = need(b.seq_len, "batch.seq_len", "tokens per sequence")
    par = plan.parallel
    explicit = par.pp > 1 and (
        par.first_stage_layers is not None or par.last_stage_layers is not None
    )
    if par.pp > layers or (not explicit and par.pp * par.virtual_pipeline_stages > layers):
        # (explicit first/last counts may leave a chunk with no block: Llama 3's first
        # chunk holds only the embedding)
        raise InputError(
            f"pp {par.pp} × virtual stages {par.virtual_pipeline_stages} exceeds the "
            f"{layers} layers",
            field="parallel.pp",
            value=par.pp,
            expected=f"at most {layers // par.virtual_pipeline_stages} stages",
        )
    if seq % par.cp:
        raise InputError(
            f"seq_len {seq} is not divisible by cp {par.cp}",
            field="parallel.cp",
            value=par.cp,
            expected=f"a divisor of {seq}",
        )
    shape = Shape(
        **architecture_fields(arch),  # type: ignore[arg-type]
        micro_batch=micro,
        seq=seq,
        micro_batches=plan.grad_accum or 1,
        tp=par.tp,
        pp=par.pp,
        cp=par.cp,
        ep=par.ep,
        dp=plan.dp_degree or 1,
        sp=par.sequence_parallel and par.tp > 1,
        zero=par.zero_stage,
        optimizer_partitioned=par.optimizer_partitioned,
        offload_optimizer=(
            "cpu" if plan.optimizer.impl == "deepspeed_cpu" else par.offload_optimizer
        ),
        offload_params=par.offload_params,
        ckpt=par.checkpointing.granularity,
        ckpt_every=par.checkpointing.every_k_layers,
        vpp=par.virtual_pipeline_stages,
        schedule=par.pipeline_schedule,
        first_layers=par.first_stage_layers if explicit else None,
        last_layers=par.last_stage_layers if explicit else None,
        recipe=_recipe(plan),
        optimizer=plan.optimizer.type.replace("_", "").replace("-", ""),
        momentum=plan.optimizer.momentum,
        weight_decay=plan.optimizer.weight_decay,
        **_step_kind(plan),
        buckets=zero_buckets(plan),
    )
    # An explicit first/last split that cannot work raises here.
    stage_split(shape.layers, shape.pp, shape.first_layers, shape.last_layers)
    return shape
