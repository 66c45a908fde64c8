"""The shapes of torchtune's decoder model builders, keyed by the path a config names.

torchtune builds its models in Python (``model: {_component_:
torchtune.models.llama3_1.llama3_1_8b}``): the YAML names the builder, the builder's source
holds the shape. This table is read from that source, pytorch/torchtune at commit
bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1 (Apr 2026): the keyword arguments each builder in
``torchtune/models/<family>/_model_builders.py`` passes to its component builder
(``torchtune/models/<family>/_component_builders.py``), with the component builder's own
defaults where a builder leaves one out (``rope_base``, ``tie_word_embeddings``, the Llama
3.1/3.2 ``scale_factor``, Qwen's q/k/v biases) and ``scale_hidden_dim_for_mlp`` for Llama 2's
MLP width (``torchtune/models/llama2/_model_utils.py``: 4·⌊2·dim/3⌋ rounded up to a multiple
of 256). ``llama3_3`` re-exports the Llama 3.1 70B builders; ``qlora_*`` builders are
``partial(lora_*, quantize_base=True)``.

Columns of :class:`Shape`: the component builder, then ``vocab_size``, ``num_layers``,
``num_heads``, ``num_kv_heads``, ``embed_dim``, ``intermediate_dim``, ``max_seq_len``,
``rope_base`` as the builders name them. :func:`model_fields` turns a shape into Plan model
fields with the exact parameter count of the ``TransformerDecoder`` the builder returns
(tested against published model sizes). Builders not listed here (vision, Llama 4 MoE,
reward and classifier heads, T5, CLIP, Flux) leave the model unknown.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["ADAPTERS", "BUILDER_PARAMS", "SHAPES", "Shape", "find_builder", "model_fields"]


class Shape(NamedTuple):
    """What one builder builds."""

    component: str
    vocab_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    embed_dim: int
    intermediate_dim: int
    max_seq_len: int
    rope_base: float
    #: Per-head width when it is not embed_dim // num_heads (Gemma, Qwen 3).
    head_dim: int | None = None
    #: The output projection is the token embedding (TiedLinear).
    tied: bool = False
    #: Biases on the q, k and v projections (Qwen 2); never on the output projection.
    qkv_bias: bool = False
    #: An RMSNorm over each query and key head (Qwen 3).
    qk_norm: bool = False
    #: Llama3ScaledRoPE's scale_factor (Llama 3.1, 3.2), over an original 8192 context.
    rope_scale: int | None = None


#: Base builders: "<module under torchtune.models>.<builder>" -> shape.
SHAPES: dict[str, Shape] = {
    "llama2.llama2_7b": Shape("llama2", 32_000, 32, 32, 32, 4096, 11_008, 4096, 10_000),
    "llama2.llama2_13b": Shape("llama2", 32_000, 40, 40, 40, 5120, 13_824, 4096, 10_000),
    "llama2.llama2_70b": Shape("llama2", 32_000, 80, 64, 8, 8192, 28_672, 4096, 10_000),
    "llama3.llama3_8b": Shape("llama3", 128_256, 32, 32, 8, 4096, 14_336, 8192, 500_000),
    "llama3.llama3_70b": Shape("llama3", 128_256, 80, 64, 8, 8192, 28_672, 8192, 500_000),
    "llama3_1.llama3_1_8b": Shape("llama3_1", 128_256, 32, 32, 8, 4096, 14_336, 131_072, 500_000,
        rope_scale=8),
    "llama3_1.llama3_1_70b": Shape("llama3_1", 128_256, 80, 64, 8, 8192, 28_672, 131_072, 500_000,
        rope_scale=8),
    "llama3_1.llama3_1_405b": Shape(
        "llama3_1", 128_256, 126, 128, 8, 16_384, 53_248, 131_072, 500_000,
        rope_scale=8),
    "llama3_2.llama3_2_1b": Shape("llama3_2", 128_256, 16, 32, 8, 2048, 8192, 131_072, 500_000,
        tied=True, rope_scale=32),
    "llama3_2.llama3_2_3b": Shape("llama3_2", 128_256, 28, 24, 8, 3072, 8192, 131_072, 500_000,
        tied=True, rope_scale=32),
    "mistral.mistral_7b": Shape("mistral", 32_000, 32, 32, 8, 4096, 14_336, 32_768, 10_000),
    "qwen2.qwen2_7b": Shape("qwen2", 152_064, 28, 28, 4, 3584, 18_944, 32_768, 1_000_000,
        qkv_bias=True),
    "qwen2.qwen2_0_5b": Shape("qwen2", 151_936, 24, 14, 2, 896, 4864, 32_768, 1_000_000,
        tied=True, qkv_bias=True),
    "qwen2.qwen2_1_5b": Shape("qwen2", 151_936, 28, 12, 2, 1536, 8960, 32_768, 1_000_000,
        tied=True, qkv_bias=True),
    "qwen2_5.qwen2_5_0_5b": Shape("qwen2", 151_936, 24, 14, 2, 896, 4864, 32_768, 1_000_000,
        tied=True, qkv_bias=True),
    "qwen2_5.qwen2_5_1_5b_base": Shape("qwen2", 151_936, 28, 12, 2, 1536, 8960, 131_072, 1_000_000,
        tied=True, qkv_bias=True),
    "qwen2_5.qwen2_5_1_5b_instruct": Shape(
        "qwen2", 151_936, 28, 12, 2, 1536, 8960, 32_768, 1_000_000,
        tied=True, qkv_bias=True),
    "qwen2_5.qwen2_5_3b": Shape("qwen2", 151_936, 36, 16, 2, 2048, 11_008, 32_768, 1_000_000,
        tied=True, qkv_bias=True),
    "qwen2_5.qwen2_5_7b_base": Shape("qwen2", 152_064, 28, 28, 4, 3584, 18_944, 131_072, 1_000_000,
        qkv_bias=True),
    "qwen2_5.qwen2_5_7b_instruct": Shape(
        "qwen2", 152_064, 28, 28, 4, 3584, 18_944, 32_768, 1_000_000,
        qkv_bias=True),
    "qwen2_5.qwen2_5_14b_base": Shape("qwen2", 152_064, 48, 40, 8, 5120, 13_824, 131_072, 1_000_000,
        qkv_bias=True),
    "qwen2_5.qwen2_5_14b_instruct": Shape(
        "qwen2", 152_064, 48, 40, 8, 5120, 13_824, 32_768, 1_000_000,
        qkv_bias=True),
    "qwen2_5.qwen2_5_32b_base": Shape("qwen2", 152_064, 64, 40, 8, 5120, 27_648, 131_072, 1_000_000,
        qkv_bias=True),
    "qwen2_5.qwen2_5_32b_instruct": Shape(
        "qwen2", 152_064, 64, 40, 8, 5120, 27_648, 32_768, 1_000_000,
        qkv_bias=True),
    "qwen2_5.qwen2_5_72b_base": Shape("qwen2", 152_064, 80, 64, 8, 8192, 29_568, 131_072, 1_000_000,
        qkv_bias=True),
    "qwen2_5.qwen2_5_72b_instruct": Shape(
        "qwen2", 152_064, 80, 64, 8, 8192, 29_568, 32_768, 1_000_000,
        qkv_bias=True),
    "qwen3.qwen3_0_6b_base": Shape("qwen3", 151_936, 28, 16, 8, 1024, 3072, 32_768, 1_000_000,
        head_dim=128, tied=True, qk_norm=True),
    "qwen3.qwen3_0_6b_instruct": Shape("qwen3", 151_936, 28, 16, 8, 1024, 3072, 40_960, 1_000_000,
        head_dim=128, tied=True, qk_norm=True),
    "qwen3.qwen3_1_7b_base": Shape("qwen3", 151_936, 28, 16, 8, 2048, 6144, 32_768, 1_000_000,
        tied=True, qk_norm=True),
    "qwen3.qwen3_1_7b_instruct": Shape("qwen3", 151_936, 28, 16, 8, 2048, 6144, 40_960, 1_000_000,
        tied=True, qk_norm=True),
    "qwen3.qwen3_4b_base": Shape("qwen3", 151_936, 36, 32, 8, 2560, 9728, 32_768, 1_000_000,
        head_dim=128, tied=True, qk_norm=True),
    "qwen3.qwen3_4b_instruct": Shape("qwen3", 151_936, 36, 32, 8, 2560, 9728, 40_960, 1_000_000,
        head_dim=128, tied=True, qk_norm=True),
    "qwen3.qwen3_8b_base": Shape("qwen3", 151_936, 36, 32, 8, 4096, 12_288, 32_768, 1_000_000,
        qk_norm=True),
    "qwen3.qwen3_8b_instruct": Shape("qwen3", 151_936, 36, 32, 8, 4096, 12_288, 40_960, 1_000_000,
        qk_norm=True),
    "qwen3.qwen3_14b_base": Shape("qwen3", 151_936, 40, 40, 8, 5120, 17_408, 32_768, 1_000_000,
        qk_norm=True),
    "qwen3.qwen3_14b_instruct": Shape("qwen3", 151_936, 40, 40, 8, 5120, 17_408, 40_960, 1_000_000,
        qk_norm=True),
    "qwen3.qwen3_32b": Shape("qwen3", 151_936, 64, 64, 8, 5120, 25_600, 40_960, 1_000_000,
        head_dim=128, qk_norm=True),
    "gemma.gemma_2b": Shape("gemma", 256_000, 18, 8, 1, 2048, 16_384, 8192, 10_000, tied=True),
    "gemma.gemma_7b": Shape("gemma", 256_000, 28, 16, 16, 3072, 24_576, 8192, 10_000,
        head_dim=256, tied=True),
    "gemma2.gemma2_2b": Shape("gemma2", 256_000, 26, 8, 4, 2304, 9216, 8192, 10_000,
        head_dim=256, tied=True),
    "gemma2.gemma2_9b": Shape("gemma2", 256_000, 42, 16, 8, 3584, 14_336, 8192, 10_000,
        head_dim=256, tied=True),
    "gemma2.gemma2_27b": Shape("gemma2", 256_000, 46, 32, 16, 4608, 36_864, 8192, 10_000,
        head_dim=128, tied=True),
    "phi3.phi3_mini": Shape("phi3", 32_064, 32, 32, 32, 3072, 8192, 4096, 10_000),
    "phi4.phi4_14b": Shape("phi3", 100_352, 40, 40, 10, 5120, 17_920, 16_384, 10_000),
    "smol.smollm2_135m": Shape("smollm2", 49_152, 30, 9, 3, 576, 1536, 8192, 100_000,
        tied=True, rope_scale=32),
    "smol.smollm2_360m": Shape("smollm2", 49_152, 32, 15, 5, 960, 2560, 8192, 100_000,
        tied=True, rope_scale=32),
    "smol.smollm2_1_7b": Shape("smollm2", 49_152, 24, 32, 32, 2048, 8192, 8192, 130_000,
        tied=True, rope_scale=32),
}

#: The builders under another name (torchtune/models/llama3_3/_model_builders.py).
_ALIASES = {
    "llama3_3.llama3_3_70b": "llama3_1.llama3_1_70b",
    "llama3_3.lora_llama3_3_70b": "llama3_1.lora_llama3_1_70b",
    "llama3_3.qlora_llama3_3_70b": "llama3_1.qlora_llama3_1_70b",
}

#: LoRA builders (``lora_<base>``) and QLoRA ones (``qlora_<base>``: the base weights in
#: NF4) each module exports, by module.
_ADAPTER_BUILDERS: dict[str, tuple[str, ...]] = {
    "llama2": ("7b", "13b", "70b"),
    "llama3": ("8b", "70b"),
    "llama3_1": ("8b", "70b", "405b"),
    "llama3_2": ("1b", "3b"),
    "mistral": ("7b",),
    "gemma": ("2b", "7b"),
    "gemma2": ("2b", "9b", "27b"),
    "phi3": ("mini",),
    "phi4": ("14b",),
}
#: Modules with LoRA builders and no QLoRA ones: every size has one.
_LORA_ONLY = ("qwen2", "qwen2_5", "qwen3")


def _adapters() -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for key in SHAPES:
        module, name = key.split(".")
        size = name.removeprefix(f"{module}_").removeprefix("phi3_")
        if module in _LORA_ONLY:
            out[f"{module}.lora_{name}"] = (key, "lora")
        elif size in _ADAPTER_BUILDERS.get(module, ()):
            out[f"{module}.lora_{name}"] = (key, "lora")
            out[f"{module}.qlora_{name}"] = (key, "qlora")
    return out


#: Adapter builders -> (their base builder, "lora" or "qlora").
ADAPTERS: dict[str, tuple[str, str]] = _adapters()

_LORA_PARAMS = frozenset({
    "lora_attn_modules", "apply_lora_to_mlp", "apply_lora_to_output", "lora_rank",
    "lora_alpha", "lora_dropout", "use_dora", "quantize_base",
})


def _params(key: str) -> frozenset[str]:
    """The keyword arguments a builder takes (each passed from the config's ``model:``)."""
    module, name = key.split(".")
    if key not in ADAPTERS:
        return frozenset({"tie_word_embeddings"}) if module == "llama3_2" else frozenset()
    params = set(_LORA_PARAMS)
    if module == "llama3_2":
        params.add("tie_word_embeddings")
    if module in ("gemma", "gemma2") or name.endswith(("qwen2_0_5b", "qwen2_1_5b")):
        params.discard("apply_lora_to_output")  # a tied output has no projection of its own
    if name.endswith("llama3_1_405b"):
        params.discard("use_dora")
    return frozenset(params)


#: Builder -> the keyword arguments it accepts.
BUILDER_PARAMS: dict[str, frozenset[str]] = {k: _params(k) for k in [*SHAPES, *ADAPTERS]}


def find_builder(component: str) -> tuple[str, Shape, str | None] | None:
    """``(builder key, shape, adapter)`` for a ``_component_`` path such as
    ``torchtune.models.llama3_1.lora_llama3_1_8b`` (``adapter`` is ``lora``, ``qlora`` or
    None), or None when the path is not a builder in the table."""
    parts = component.strip().split(".")
    if len(parts) < 4 or parts[:2] != ["torchtune", "models"]:
        return None
    if len(parts) == 5 and parts[3] == "_model_builders":
        parts = [*parts[:3], parts[4]]
    if len(parts) != 4:
        return None
    key = _ALIASES.get(f"{parts[2]}.{parts[3]}", f"{parts[2]}.{parts[3]}")
    if key in SHAPES:
        return key, SHAPES[key], None
    if key in ADAPTERS:
        base, kind = ADAPTERS[key]
        return key, SHAPES[base], kind
    return None


#: Component builder -> the Hugging Face model_type of the same architecture (what sapper's
#: memory model knows of each family's code: Gemma 2's extra norms and soft-capping, Qwen
#: 3's q/k norms).
_FAMILIES = {
    "llama2": "llama", "llama3": "llama", "llama3_1": "llama", "llama3_2": "llama",
    "smollm2": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
    "gemma": "gemma", "gemma2": "gemma2", "phi3": "phi3",
}


def model_fields(shape: Shape, *, tied: bool | None = None) -> dict[str, Any]:
    """Plan ``model`` fields of a builder's TransformerDecoder, with its exact parameter
    count: token embedding, per layer two RMSNorms (four in Gemma 2: sa_scale and
    mlp_scale), q/k/v/output projections (q/k/v biases in Qwen 2, a head_dim RMSNorm on
    queries and keys in Qwen 3), a gated MLP (w1, w3 in, w2 out), the final norm, and the
    output projection unless tied. ``tied`` overrides the builder's
    ``tie_word_embeddings``."""
    tied = shape.tied if tied is None else tied
    h, d = shape.embed_dim, shape.head_dim or shape.embed_dim // shape.num_heads
    q, kv, ffn = shape.num_heads * d, shape.num_kv_heads * d, shape.intermediate_dim
    gemma = shape.component in ("gemma", "gemma2")
    attn = h * (q + 2 * kv) + q * h
    if shape.qkv_bias:
        attn += q + 2 * kv
    if shape.qk_norm:
        attn += 2 * d
    norms = 4 if shape.component == "gemma2" else 2
    layer = attn + 3 * h * ffn + norms * h
    total = shape.num_layers * layer + shape.vocab_size * h + h
    if not tied:
        total += shape.vocab_size * h
    fields: dict[str, Any] = {
        "family": _FAMILIES[shape.component],
        "hidden_size": h,
        "num_layers": shape.num_layers,
        "num_heads": shape.num_heads,
        "num_kv_heads": shape.num_kv_heads,
        "head_dim": d,
        "ffn_hidden_size": ffn,
        "activation": "geglu" if gemma else "swiglu",
        "hidden_act": "gelu_pytorch_tanh" if gemma else "silu",
        "vocab_size": shape.vocab_size,
        "position_encoding": "rope",
        "rope_theta": float(shape.rope_base),
        "max_position_embeddings": shape.max_seq_len,
        "norm_type": "rmsnorm",
        "norm_placement": "pre",
        "tied_embeddings": tied,
        "attention_bias": shape.qkv_bias,
        "mlp_bias": False,
        "parallel_residual": False,
        "dropout": 0.0,
        "num_params": total,
    }
    if shape.rope_scale:
        fields["rope_scaling"] = {"type": "llama3", "factor": float(shape.rope_scale),
                                  "original_max_position_embeddings": 8192}
    return fields
