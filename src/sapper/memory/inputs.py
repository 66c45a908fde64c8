"""The numbers the memory model reads, taken from a Plan once and checked.

:class:`Shape` is a flat, frozen record (plain ints, bools and strings) so the estimator
runs in microseconds and what-if variants are a ``dataclasses.replace`` away. Impossible
inputs (heads that do not divide the width, zero layers, negative sizes, more pipeline
stages than layers) raise :class:`~sapper.errors.InputError` naming the plan field.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field

from sapper.errors import InputError
from sapper.memory.buckets import ZeroBuckets, default_buckets, zero_buckets
from sapper.memory.optimizers import state_tensors
from sapper.memory.stages import stage_split
from sapper.memory.units import DTYPE_BYTES
from sapper.plan.schema import Plan, dropout_at

__all__ = ["MissingInput", "Recipe", "Shape", "shape_from_plan"]

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


@dataclass(frozen=True)
class Shape:
    """Everything the analytic memory model needs, per GPU where it says so."""

    # architecture
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    positions: int  # learned position table rows (0 if none)
    experts: int
    top_k: int
    expert_ffn: int
    gated: bool
    act: str  # kernel name: gelu, gelu_tanh_python, silu, relu ...
    norm: str  # layernorm / rmsnorm
    rope: bool
    tied: bool
    attn_bias: bool
    mlp_bias: bool
    attn_impl: str  # eager / sdpa / flash
    dropout: float  # the model's dropout; the per-site probabilities below default to it
    impl: str  # transformers / megatron
    num_params: int | None
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
    family: str
    foreach: bool  # multi-tensor step: temporaries over all parameters at once
    fused: bool  # fused step: no temporaries
    #: ``optimizer.impl`` as given ("auto": torch's default for the device, decided by
    #: the estimate, which knows the device).
    optimizer_impl: str = "auto"
    #: Norms per block: 2 (pre or post placement) or 4 (sandwich: each sub-layer's
    #: output is normed too before it joins the residual stream).
    block_norms: int = 2
    attn_softcap: bool = False  # eager attention keeps tanh(scores / cap) as well
    logit_softcap: bool = False  # the loss reads cap·tanh(logits / cap), kept for backward
    qk_norm: bool = False  # per-head RMSNorm on queries and keys before RoPE
    #: Attention and MLP read the same block input: "" (sequential), "shared" (one norm
    #: feeds both: GPT-J, Phi) or "two_norms" (each has its own norm of that same input:
    #: GPT-NeoX, Pythia).
    parallel_residual: str = ""
    #: One fused q/k/v projection even with RoPE (GPT-NeoX): the rotated q and k are new
    #: tensors while v stays a view that keeps the whole fused output alive.
    fused_qkv: bool = False
    #: Master weights and optimizer states partitioned over DP although ``zero`` < 1
    #: (DeepSpeed's BF16_Optimizer for bf16 without ZeRO).
    optimizer_partitioned: bool = False
    #: ZeRO's buffer sizes and where they came from (memory/buckets.py).
    buckets: ZeroBuckets = dataclass_field(default_factory=default_buckets)
    #: Dropout per site (None: ``dropout``): on the attention probabilities, on the
    #: sub-layer outputs before the residual adds, on the embeddings, after the MLP's
    #: activation (None there: no dropout).
    attention_dropout: float | None = None
    hidden_dropout: float | None = None
    embedding_dropout: float | None = None
    activation_dropout: float | None = None

    def dropout_at(self, site: str) -> float:
        return dropout_at(self, site)

    def replace(self, **changes: object) -> Shape:
        return replace(self, **changes)

    @property
    def moe(self) -> bool:
        return self.experts > 1


class MissingInput(InputError):
    """The plan lacks a value the estimate needs (a check then stays silent)."""


def _need(value: int | None, field: str, why: str) -> int:
    if value is None:
        raise MissingInput(f"missing value: {why}", field=field, expected="a positive integer")
    if value <= 0:
        raise InputError("must be positive", field=field, value=value, expected="an integer > 0")
    return value


#: What Hugging Face modelling code of a family runs beyond the Plan's generic fields:
#: Gemma 2 puts a norm before and after each sub-layer, soft-caps attention scores and
#: the final logits with tanh, and has no SDPA path (softcapping needs the eager code);
#: Gemma 3 and Qwen 3 normalize each query and key head; GPT-J's and Phi's parallel
#: blocks share one norm; GPT-NeoX fuses q/k/v into one projection despite RoPE.
_HF_TRAITS: dict[str, dict[str, object]] = {
    "gemma2": {"block_norms": 4, "attn_softcap": True, "logit_softcap": True,
               "no_sdpa": True},
    "gemma3_text": {"block_norms": 4, "qk_norm": True},
    "gemma3": {"block_norms": 4, "qk_norm": True},
    "gptj": {"parallel_residual": "shared"},
    "phi": {"parallel_residual": "shared"},
    "gpt_neox": {"fused_qkv": True},
    "qwen3": {"qk_norm": True},
    "qwen3_moe": {"qk_norm": True},
}


def _traits(plan: Plan) -> dict[str, object]:
    """Family traits of the code that runs (Hugging Face only; Megatron fuses them)."""
    m = plan.model
    assert m is not None
    traits: dict[str, object] = {}
    if m.implementation == "transformers":
        traits = dict(_HF_TRAITS.get((m.family or "").lower(), {}))
    if m.norm_placement.value == "sandwich":
        traits["block_norms"] = 4
    if m.parallel_residual and not traits.get("parallel_residual"):
        traits["parallel_residual"] = "two_norms"
    attn = m.attention_impl.value
    if traits.pop("no_sdpa", False) and attn == "sdpa":
        attn = "eager"  # transformers falls back to the eager code
    traits["attn_impl"] = attn
    return traits


def _act_kernel(activation: str, hidden_act: str | None) -> str:
    """Which activation kernel runs: it decides what is kept for backward."""
    name = (hidden_act or activation).lower()
    if name in ("gelu_new", "gelu_fast", "gelu_python", "quick_gelu"):
        return "gelu_tanh_python"  # composed of elementwise ops, each keeps its input
    if name in ("silu", "swish", "swiglu"):
        return "silu"
    if name.startswith("gelu") or name == "geglu":
        return "gelu"
    return name


#: ``optimizer.impl`` -> (foreach, fused): whether the step's temporaries span every
#: parameter at once (multi-tensor), one tensor at a time (torch's per-tensor loop), or
#: none (a fused kernel; CPUAdam and bitsandbytes run fused kernels too).
IMPL_KIND: dict[str, tuple[bool, bool]] = {
    "for_loop": (False, False),
    "foreach": (True, False),
    "fused": (False, True),
    "deepspeed_fused": (False, True),
    "deepspeed_cpu": (False, True),
    "apex": (False, True),
    "bnb_8bit": (False, True),
}


def _step_kind(plan: Plan) -> dict[str, object]:
    opt = plan.optimizer
    foreach, fused = IMPL_KIND.get(opt.impl, (not opt.fused, opt.fused))
    return {"foreach": foreach, "fused": fused, "optimizer_impl": opt.impl}


def _recipe(plan: Plan) -> Recipe:
    p, opt = plan.precision, plan.optimizer
    dtype = p.dtype
    n_states = state_tensors(opt.type, opt.momentum)
    if opt.eight_bit or opt.impl == "bnb_8bit" or p.optimizer_states == "int8":
        # bitsandbytes block-wise 8-bit: one byte per moment plus an fp32 scale per 256 values.
        state_bytes = n_states * (1 + 4 / 256)
    else:
        state_bytes = n_states * DTYPE_BYTES[p.optimizer_states]
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
    m = plan.model
    if m is None:
        raise MissingInput(
            "the plan has no model", field="model", expected="a model section or --model config"
        )
    hidden = _need(m.hidden_size, "model.hidden_size", "model width")
    layers = _need(m.num_layers, "model.num_layers", "number of transformer blocks")
    heads = _need(m.num_heads, "model.num_heads", "attention heads")
    vocab = _need(m.vocab_size, "model.vocab_size", "vocabulary size")
    kv = m.kv_heads
    _need(kv, "model.num_kv_heads", "key/value heads")
    if m.head_dim is None and hidden % heads:
        raise InputError(
            f"hidden_size {hidden} is not divisible by num_heads {heads}",
            field="model.num_heads",
            value=heads,
            expected=f"a divisor of {hidden} (or an explicit model.head_dim)",
        )
    if heads % kv:
        raise InputError(
            f"num_heads {heads} is not a multiple of num_kv_heads {kv}",
            field="model.num_kv_heads",
            value=kv,
            expected=f"a divisor of {heads}",
        )
    if m.experts_top_k > m.num_experts:
        raise InputError(
            f"experts_top_k {m.experts_top_k} exceeds num_experts {m.num_experts}",
            field="model.experts_top_k",
            value=m.experts_top_k,
            expected=f"at most {m.num_experts}",
        )
    b = plan.batch
    micro = _need(b.micro_batch_size, "batch.micro_batch_size", "sequences per GPU")
    seq = _need(b.seq_len, "batch.seq_len", "tokens per sequence")
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
    dp = plan.dp_degree or 1
    positions = 0
    if m.position_encoding.value == "learned":
        positions = m.max_position_embeddings or seq
    ffn = m.ffn_size
    shape = Shape(
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv,
        head_dim=m.head_size,
        ffn=ffn,
        vocab=vocab,
        positions=positions,
        experts=m.num_experts,
        top_k=m.experts_top_k if m.is_moe else 1,
        expert_ffn=m.moe_ffn_hidden_size or ffn,
        gated=m.activation.gated,
        act=_act_kernel(m.activation.value, m.hidden_act),
        norm=m.norm_type.value,
        rope=m.position_encoding.value == "rope",
        tied=m.tied_embeddings,
        attn_bias=m.attention_bias,
        mlp_bias=m.mlp_bias,
        dropout=m.dropout,
        attention_dropout=m.dropout_at("attention"),
        hidden_dropout=m.dropout_at("hidden"),
        embedding_dropout=m.dropout_at("embedding"),
        activation_dropout=m.dropout_at("activation"),
        impl=m.implementation,
        num_params=m.num_params,
        micro_batch=micro,
        seq=seq,
        micro_batches=plan.grad_accum or 1,
        tp=par.tp,
        pp=par.pp,
        cp=par.cp,
        ep=par.ep,
        dp=dp,
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
        family=(m.family or '').lower(),
        **_step_kind(plan),
        buckets=zero_buckets(plan),
        **_traits(plan),  # type: ignore[arg-type]
    )
    # An explicit first/last split that cannot work raises here.
    stage_split(shape.layers, shape.pp, shape.first_layers, shape.last_layers)
    return shape
