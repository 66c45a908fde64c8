"""The model's architecture, read from a Plan once, checked once.

:class:`Architecture` is the flat, frozen record of what follows from the model alone
(widths, heads, experts, which kernels its code runs, where it drops out). The memory
model's :class:`~sapper.memory.inputs.Shape` and the step-cost model's
:class:`~sapper.parallel.workload.Workload` extend it with a layout and a batch, so the
fields, the plan checks and the arithmetic over them (:mod:`sapper.model.params`,
:mod:`sapper.model.flops`) exist once. Impossible inputs (heads that do not divide the
width, more routed experts than experts) raise :class:`~sapper.errors.InputError` naming
the plan field; a value the plan lacks raises :class:`MissingInput`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from sapper.errors import InputError
from sapper.plan.schema import Plan, dropout_at

__all__ = [
    "Architecture",
    "MissingInput",
    "architecture_fields",
    "architecture_from_plan",
    "need",
]


class MissingInput(InputError):
    """The plan lacks a value an estimate needs (a check then says it could not run)."""


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """What the model is, independent of how it is laid out or batched."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    positions: int  # learned position table rows (0 if none)
    experts: int
    top_k: int  # experts a token passes through (1 for a dense model)
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
    num_params: int | None  # the loader's exact count, when it knew one
    family: str = ""
    #: Inner width of the MLP every token meets beside its routed experts (0: none).
    shared_ffn: int = 0
    #: The shared experts' output is scaled by a sigmoid gate of its own (Qwen-MoE), which
    #: keeps that output for backward.
    shared_gate: bool = False
    #: Leading blocks of a MoE model with a dense MLP of ``ffn`` instead of experts.
    first_dense: int = 0
    #: Multi-head latent attention (0: plain attention): keys and values come up from a
    #: ``kv_lora``-wide latent, queries from a ``q_lora``-wide one (0: directly), the
    #: rotary ``rope_dim`` part of each query/key head from its own projection, the values
    #: ``v_head_dim`` wide per head (``head_dim`` outside MLA).
    kv_lora: int = 0
    q_lora: int = 0
    rope_dim: int = 0
    v_head_dim: int = 0
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
    #: Dropout per site (None: ``dropout``): on the attention probabilities, on the
    #: sub-layer outputs before the residual adds, on the embeddings, after the MLP's
    #: activation (None there: no dropout).
    attention_dropout: float | None = None
    hidden_dropout: float | None = None
    embedding_dropout: float | None = None
    activation_dropout: float | None = None

    def dropout_at(self, site: str) -> float:
        return dropout_at(self, site)

    @property
    def moe(self) -> bool:
        return self.experts > 1

    @property
    def mla(self) -> bool:
        return self.kv_lora > 0

    @property
    def value_dim(self) -> int:
        """Per-head width of the values."""
        return self.v_head_dim or self.head_dim

    @property
    def moe_layers(self) -> int:
        """Blocks with routed experts (all of them, less the leading dense ones)."""
        return self.layers - self.first_dense if self.moe else 0


def architecture_fields(arch: Architecture) -> dict[str, object]:
    """The architecture's own fields (not those a subclass adds), to build a view on it."""
    return {f.name: getattr(arch, f.name) for f in fields(Architecture)}


def need(value: int | None, field: str, why: str) -> int:
    """``value``, which the estimate cannot do without: absent raises
    :class:`MissingInput` (the check says it could not run), not positive an InputError."""
    if value is None:
        raise MissingInput(f"missing value: {why}", field=field, expected="a positive integer")
    if value <= 0:
        raise InputError("must be positive", field=field, value=value, expected="an integer > 0")
    return value


#: What Hugging Face modelling code of a family runs beyond the Plan's generic fields:
#: Gemma 2 puts a norm before and after each sub-layer, soft-caps attention scores and
#: the final logits with tanh, and has no SDPA path (softcapping needs the eager code);
#: Gemma 3 and Qwen 3 normalize each query and key head; GPT-J's and Phi's parallel
#: blocks share one norm; GPT-NeoX fuses q/k/v into one projection despite RoPE; Qwen-MoE
#: gates its shared expert.
_HF_TRAITS: dict[str, dict[str, object]] = {
    "gemma2": {"block_norms": 4, "attn_softcap": True, "logit_softcap": True,
               "no_sdpa": True},
    "gemma3_text": {"block_norms": 4, "qk_norm": True},
    "gemma3": {"block_norms": 4, "qk_norm": True},
    "gptj": {"parallel_residual": "shared"},
    "phi": {"parallel_residual": "shared"},
    "gpt_neox": {"fused_qkv": True},
    "qwen2_moe": {"shared_gate": True},
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


def architecture_from_plan(plan: Plan) -> Architecture:
    """Read and check the plan's model; raise :class:`InputError` on anything impossible.

    A learned position table without a stated length is as long as the plan's sequence.
    """
    m = plan.model
    if m is None:
        raise MissingInput(
            "the plan has no model", field="model", expected="a model section or --model config"
        )
    hidden = need(m.hidden_size, "model.hidden_size", "model width")
    heads = need(m.num_heads, "model.num_heads", "attention heads")
    kv = m.kv_heads
    need(kv, "model.num_kv_heads", "key/value heads")
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
    layers = need(m.num_layers, "model.num_layers", "number of transformer blocks")
    if m.first_dense_layers > layers:
        raise InputError(
            f"first_dense_layers {m.first_dense_layers} exceeds the {layers} layers",
            field="model.first_dense_layers",
            value=m.first_dense_layers,
            expected=f"at most {layers}",
        )
    if m.kv_lora_rank and m.qk_rope_head_dim and m.qk_rope_head_dim > m.head_size:
        raise InputError(
            f"qk_rope_head_dim {m.qk_rope_head_dim} exceeds head_dim {m.head_size}",
            field="model.qk_rope_head_dim",
            value=m.qk_rope_head_dim,
            expected=f"the rotary part of head_dim, at most {m.head_size}",
        )
    positions = 0
    if m.position_encoding.value == "learned":
        positions = m.max_position_embeddings or plan.batch.seq_len or 0
    ffn = m.ffn_size
    return Architecture(
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv,
        head_dim=m.head_size,
        ffn=ffn,
        vocab=need(m.vocab_size, "model.vocab_size", "vocabulary size"),
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
        family=(m.family or "").lower(),
        shared_ffn=(m.shared_expert_ffn_hidden_size or 0) if m.is_moe else 0,
        first_dense=m.first_dense_layers if m.is_moe else 0,
        kv_lora=m.kv_lora_rank or 0,
        q_lora=(m.q_lora_rank or 0) if m.kv_lora_rank else 0,
        rope_dim=(m.qk_rope_head_dim or 0) if m.kv_lora_rank else 0,
        v_head_dim=m.v_head_dim or 0,
        **_traits(plan),  # type: ignore[arg-type]
    )
