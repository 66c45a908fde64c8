"""Per-family architecture of Hugging Face causal LMs: Plan model fields and exact size.

Each family function reads a transformers config object (legacy keys and defaults already
resolved by transformers) and mirrors the layer shapes of that family's modeling file:
which projections carry a bias, how many norms a block has and whether they have a bias,
position tables, tied or untied heads, MoE routers and experts. The parameter count equals
``sum(p.numel() for p in model.parameters())`` of the model transformers builds from the
same config (tested per family against a meta-device build), so no memory estimate starts
from a rounded "7B".

Families without a function here are described by :func:`generic` from the standard
config attributes, and counted by building the model on the meta device (no memory, no
weights): exact too, only slower.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sapper.plan.schema import Activation, NormPlacement, NormType, PositionEncoding

__all__ = [
    "FAMILIES",
    "POST_LN_FAMILIES",
    "Family",
    "activation",
    "count_on_meta",
    "dropout_of",
    "dropout_sites",
    "generic",
    "meta_causal_lm",
    "quiet_transformers",
]

#: Causal-LM families whose HF modeling code puts the norm after the residual add.
POST_LN_FAMILIES = frozenset(
    {
        "bert",
        "bert-generation",
        "roberta",
        "camembert",
        "xlm-roberta",
        "electra",
        "ernie",
        "data2vec-text",
        "xmod",
        "rembert",
        "openai-gpt",
        "bart",
        "marian",
    }
)


@dataclass
class Family:
    """What a config says about the model: Plan ``model`` fields and the exact parameter
    count when known."""

    model: dict[str, Any]
    num_params: int | None = None


def _linear(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _layernorm(n: int, *, bias: bool = True, affine: bool = True) -> int:
    if not affine:
        return 0
    return 2 * n if bias else n


def activation(name: Any, gated: bool) -> Activation | None:
    """Plan activation for an HF activation name; None when it has no Plan equivalent."""
    if not isinstance(name, str):
        return None
    act = name.lower()
    if "gelu" in act:
        return Activation.GEGLU if gated else Activation.GELU
    if act in ("silu", "swish"):
        return Activation.SWIGLU if gated else Activation.SILU
    if act == "relu":
        return Activation.RELU
    return None


#: The config keys of each dropout site, most specific first (families name them
#: differently: GPT-2 resid_pdrop/attn_pdrop/embd_pdrop, OPT dropout/attention_dropout/
#: activation_dropout, BERT hidden_dropout_prob/attention_probs_dropout_prob ...).
DROPOUT_KEYS: dict[str, tuple[str, ...]] = {
    "attention": ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob"),
    "hidden": ("hidden_dropout", "resid_pdrop", "hidden_dropout_prob", "dropout"),
    "embedding": ("embd_pdrop", "embedding_dropout", "emb_dropout"),
    "activation": ("activation_dropout",),
}


def _probability(cfg: Any, names: tuple[str, ...]) -> float | None:
    for name in names:
        v = getattr(cfg, name, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def dropout_sites(cfg: Any) -> dict[str, float]:
    """The dropout probability of each site the config sets. The embeddings take the
    hidden dropout where the family names none of its own (OPT, BERT, GPT-NeoX drop the
    summed embeddings with it); a site the config does not name has no dropout."""
    sites = {site: _probability(cfg, names) for site, names in DROPOUT_KEYS.items()}
    if sites["embedding"] is None:
        sites["embedding"] = sites["hidden"]
    return {site: p if p is not None else 0.0 for site, p in sites.items()}


def dropout_of(cfg: Any) -> float | None:
    """The largest dropout probability the config sets (any site)."""
    values = [
        p for names in DROPOUT_KEYS.values() if (p := _probability(cfg, names)) is not None
    ]
    return max(values) if values else None


def _head_dim(cfg: Any) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


# ---- RMSNorm, gated-MLP, rotary families (Llama and its descendants) ------------------
def _llama_like(
    cfg: Any, *, qkv_bias: bool, o_bias: bool, mlp_bias: bool, act_attr: str = "hidden_act"
) -> Family:
    h, layers, heads = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    d, inner, vocab = _head_dim(cfg), cfg.intermediate_size, cfg.vocab_size
    experts = getattr(cfg, "num_local_experts", None) or 1
    attn = (
        _linear(h, heads * d, qkv_bias)
        + 2 * _linear(h, kv * d, qkv_bias)
        + _linear(heads * d, h, o_bias)
    )
    expert = 2 * _linear(h, inner, mlp_bias) + _linear(inner, h, mlp_bias)
    mlp = expert if experts == 1 else experts * expert + h * experts  # + bias-free router
    per_layer = attn + mlp + 2 * h
    tied = bool(cfg.tie_word_embeddings)
    total = layers * per_layer + vocab * h + h + (0 if tied else vocab * h)
    model: dict[str, Any] = {
        "hidden_size": h,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv,
        "head_dim": d,
        "ffn_hidden_size": inner,
        "activation": activation(getattr(cfg, act_attr, None), gated=True),
        "vocab_size": vocab,
        "position_encoding": PositionEncoding.ROPE,
        "norm_type": NormType.RMSNORM,
        "norm_placement": NormPlacement.PRE,
        "tied_embeddings": tied,
        "attention_bias": qkv_bias or o_bias,
        "mlp_bias": mlp_bias,
        "parallel_residual": False,
    }
    if experts > 1:
        model["num_experts"] = experts
        model["experts_top_k"] = cfg.num_experts_per_tok
    return Family(model, total)


def _llama(cfg: Any) -> Family:
    bias = bool(cfg.attention_bias)
    return _llama_like(cfg, qkv_bias=bias, o_bias=bias, mlp_bias=bool(cfg.mlp_bias))


def _mistral(cfg: Any) -> Family:
    return _llama_like(cfg, qkv_bias=False, o_bias=False, mlp_bias=False)


def _qwen2(cfg: Any) -> Family:
    return _llama_like(cfg, qkv_bias=True, o_bias=False, mlp_bias=False)


def _gemma(cfg: Any) -> Family:
    bias = bool(cfg.attention_bias)
    return _llama_like(cfg, qkv_bias=bias, o_bias=bias, mlp_bias=False)


# ---- GPT-2: learned positions, LayerNorm with bias, Conv1D with bias --------------------
def _gpt2(cfg: Any) -> Family:
    h, layers, heads, vocab = cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.vocab_size
    inner = cfg.n_inner or 4 * h
    block = (
        2 * _layernorm(h)
        + _linear(h, 3 * h, True)
        + _linear(h, h, True)
        + _linear(h, inner, True)
        + _linear(inner, h, True)
    )
    if cfg.add_cross_attention:
        block += _layernorm(h) + _linear(h, 2 * h, True) + 2 * _linear(h, h, True)
    tied = bool(cfg.tie_word_embeddings)
    total = (
        layers * block
        + vocab * h
        + cfg.n_positions * h
        + _layernorm(h)
        + (0 if tied else vocab * h)
    )
    model = {
        "hidden_size": h,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": h // heads,
        "ffn_hidden_size": inner,
        "activation": activation(cfg.activation_function, gated=False),
        "vocab_size": vocab,
        "position_encoding": PositionEncoding.LEARNED,
        "norm_type": NormType.LAYERNORM,
        "norm_placement": NormPlacement.PRE,
        "tied_embeddings": tied,
        "attention_bias": True,
        "mlp_bias": True,
        "parallel_residual": False,
    }
    return Family(model, total)


# ---- GPT-NeoX / Pythia: fused QKV, partial rotary, parallel residual --------------------
def _gpt_neox(cfg: Any) -> Family:
    h, layers, heads = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads
    inner, vocab, bias = cfg.intermediate_size, cfg.vocab_size, bool(cfg.attention_bias)
    block = (
        2 * _layernorm(h)
        + _linear(h, 3 * h, bias)
        + _linear(h, h, bias)
        + _linear(h, inner, True)
        + _linear(inner, h, True)
    )
    tied = bool(cfg.tie_word_embeddings)
    total = layers * block + vocab * h + _layernorm(h) + (0 if tied else vocab * h)
    model = {
        "hidden_size": h,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": h // heads,
        "ffn_hidden_size": inner,
        "activation": activation(cfg.hidden_act, gated=False),
        "vocab_size": vocab,
        "position_encoding": PositionEncoding.ROPE,
        "norm_type": NormType.LAYERNORM,
        "norm_placement": NormPlacement.PRE,
        "tied_embeddings": tied,
        "attention_bias": bias,
        "mlp_bias": True,
        "parallel_residual": bool(cfg.use_parallel_residual),
    }
    return Family(model, total)


# ---- Falcon: multi-query (7B), grouped KV + two norms (40B), sequential + ALiBi (RW) ----
def _falcon(cfg: Any) -> Family:
    h, layers, heads = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads
    vocab = cfg.vocab_size
    d, bias, ffn = h // heads, bool(cfg.bias), cfg.ffn_hidden_size
    new_arch = bool(cfg.new_decoder_architecture)
    if new_arch:
        kv = cfg.num_kv_heads
        qkv_out = (2 * kv + heads) * d
    elif cfg.multi_query:
        kv = 1
        qkv_out = h + 2 * d
    else:
        kv = cfg.num_kv_heads
        qkv_out = 3 * h
    n_ln_parallel = cfg.num_ln_in_parallel_attn or (2 if new_arch else 1)
    norms = 2 if not cfg.parallel_attn or n_ln_parallel == 2 else 1
    block = (
        norms * _layernorm(h)
        + _linear(h, qkv_out, bias)
        + _linear(h, h, bias)
        + _linear(h, ffn, bias)
        + _linear(ffn, h, bias)
    )
    tied = bool(cfg.tie_word_embeddings)
    total = layers * block + vocab * h + _layernorm(h) + (0 if tied else vocab * h)
    model = {
        "hidden_size": h,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv,
        "head_dim": d,
        "ffn_hidden_size": ffn,
        "activation": activation(cfg.activation, gated=False),
        "vocab_size": vocab,
        "position_encoding": PositionEncoding.ALIBI if cfg.alibi else PositionEncoding.ROPE,
        "norm_type": NormType.LAYERNORM,
        "norm_placement": NormPlacement.PRE,
        "tied_embeddings": tied,
        "attention_bias": bias,
        "mlp_bias": bias,
        "parallel_residual": new_arch or bool(cfg.parallel_attn),
    }
    return Family(model, total)


# ---- BLOOM: ALiBi, LayerNorm after the embedding ------------------------------------------
def _bloom(cfg: Any) -> Family:
    h, layers, heads, vocab = cfg.hidden_size, cfg.n_layer, cfg.n_head, cfg.vocab_size
    block = (
        2 * _layernorm(h)
        + _linear(h, 3 * h, True)
        + _linear(h, h, True)
        + _linear(h, 4 * h, True)
        + _linear(4 * h, h, True)
    )
    tied = bool(cfg.tie_word_embeddings)
    total = layers * block + vocab * h + 2 * _layernorm(h) + (0 if tied else vocab * h)
    model = {
        "hidden_size": h,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": h // heads,
        "ffn_hidden_size": 4 * h,
        "activation": Activation.GELU,
        "vocab_size": vocab,
        "position_encoding": PositionEncoding.ALIBI,
        "norm_type": NormType.LAYERNORM,
        "norm_placement": NormPlacement.PRE,
        "tied_embeddings": tied,
        "attention_bias": True,
        "mlp_bias": True,
        "parallel_residual": False,
    }
    return Family(model, total)


# ---- OPT: learned positions with an offset of 2, optional embedding projection, post-LN --
_OPT_POSITION_OFFSET = 2


def _opt(cfg: Any) -> Family:
    h, layers, heads = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads
    vocab = cfg.vocab_size
    ffn, bias, affine = cfg.ffn_dim, bool(cfg.enable_bias), bool(cfg.layer_norm_elementwise_affine)
    emb_dim = cfg.word_embed_proj_dim
    pre_ln = bool(cfg.do_layer_norm_before)
    block = (
        4 * _linear(h, h, bias)
        + _linear(h, ffn, bias)
        + _linear(ffn, h, bias)
        + 2 * _layernorm(h, affine=affine)
    )
    embeddings = vocab * emb_dim + (cfg.max_position_embeddings + _OPT_POSITION_OFFSET) * h
    if emb_dim != h:
        embeddings += 2 * h * emb_dim  # project_in and project_out, bias-free
    final_norm = pre_ln and not cfg._remove_final_layer_norm
    tied = bool(cfg.tie_word_embeddings)
    total = (
        layers * block
        + embeddings
        + (_layernorm(h, affine=affine) if final_norm else 0)
        + (0 if tied else vocab * emb_dim)
    )
    model = {
        "hidden_size": h,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": h // heads,
        "ffn_hidden_size": ffn,
        "activation": activation(cfg.activation_function, gated=False),
        "vocab_size": vocab,
        "position_encoding": PositionEncoding.LEARNED,
        "norm_type": NormType.LAYERNORM,
        "norm_placement": NormPlacement.PRE if pre_ln else NormPlacement.POST,
        "tied_embeddings": tied,
        "attention_bias": bias,
        "mlp_bias": bias,
        "parallel_residual": False,
    }
    return Family(model, total)


# ---- Phi (1, 1.5, 2): parallel attention + MLP from one LayerNorm, biased LM head --------
def _phi(cfg: Any) -> Family:
    h, layers, heads = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads
    kv = cfg.num_key_value_heads or heads
    d, inner, vocab = _head_dim(cfg), cfg.intermediate_size, cfg.vocab_size
    block = (
        _layernorm(h)
        + _linear(h, heads * d, True)
        + 2 * _linear(h, kv * d, True)
        + _linear(heads * d, h, True)
        + _linear(h, inner, True)
        + _linear(inner, h, True)
    )
    if cfg.qk_layernorm:
        block += 2 * _layernorm(h // heads)
    tied = bool(cfg.tie_word_embeddings)
    # lm_head has a bias even when its weight is tied to the embedding.
    total = layers * block + vocab * h + _layernorm(h) + (0 if tied else vocab * h) + vocab
    model = {
        "hidden_size": h,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv,
        "head_dim": d,
        "ffn_hidden_size": inner,
        "activation": activation(cfg.hidden_act, gated=False),
        "vocab_size": vocab,
        "position_encoding": PositionEncoding.ROPE,
        "norm_type": NormType.LAYERNORM,
        "norm_placement": NormPlacement.PRE,
        "tied_embeddings": tied,
        "attention_bias": True,
        "mlp_bias": True,
        "parallel_residual": True,
    }
    return Family(model, total)


#: model_type -> family function (exact parameter count without building the model).
FAMILIES: dict[str, Callable[[Any], Family]] = {
    "llama": _llama,
    "mistral": _mistral,
    "mixtral": _mistral,
    "qwen2": _qwen2,
    "gemma": _gemma,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "falcon": _falcon,
    "bloom": _bloom,
    "opt": _opt,
    "phi": _phi,
}


# ---- any other causal LM transformers knows ---------------------------------------------
def _first_int(cfg: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(cfg, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _moe_extras(cfg: Any, expert_ffn: int | None) -> dict[str, Any]:
    """The MLP every token meets beside its routed experts (Qwen-MoE's one shared expert
    of its own width; DeepSeek's n_shared_experts of the routed width) and DeepSeek's
    leading dense blocks (first_k_dense_replace)."""
    out: dict[str, Any] = {}
    shared = _first_int(cfg, "shared_expert_intermediate_size")
    n_shared = _first_int(cfg, "n_shared_experts")
    if shared is None and n_shared and expert_ffn:
        shared = n_shared * expert_ffn
    if shared:
        out["shared_expert_ffn_hidden_size"] = shared
    dense = _first_int(cfg, "first_k_dense_replace")
    layers = _first_int(cfg, "num_hidden_layers")
    if dense:  # (more than the layers: transformers builds every block dense)
        out["first_dense_layers"] = min(dense, layers) if layers else dense
    return out


def _latent_attention(cfg: Any) -> dict[str, Any]:
    """DeepSeek-V2/V3's multi-head latent attention: the latent widths, and head_dim as
    the query/key width per head (its nope and rope parts; transformers' own head_dim
    attribute is the rope part only)."""
    kv_lora = _first_int(cfg, "kv_lora_rank")
    if not kv_lora:
        return {}
    nope, rope = _first_int(cfg, "qk_nope_head_dim"), _first_int(cfg, "qk_rope_head_dim")
    out: dict[str, Any] = {
        "kv_lora_rank": kv_lora,
        "q_lora_rank": _first_int(cfg, "q_lora_rank"),
        "qk_rope_head_dim": rope,
        "v_head_dim": _first_int(cfg, "v_head_dim"),
    }
    if nope is not None and rope is not None:
        out["head_dim"] = nope + rope
    return {k: v for k, v in out.items() if v is not None}


def generic(cfg: Any, model_type: str) -> Family:
    """Fields every transformers config spells the same way (``attribute_map`` resolves
    legacy names); anything the config does not state is left unset."""
    model: dict[str, Any] = {
        "hidden_size": _first_int(cfg, "hidden_size", "d_model", "n_embd"),
        "num_layers": _first_int(cfg, "num_hidden_layers", "n_layer", "num_layers"),
        "num_heads": _first_int(cfg, "num_attention_heads", "n_head", "num_heads"),
        "num_kv_heads": _first_int(cfg, "num_key_value_heads", "num_kv_heads", "n_head_kv"),
        "head_dim": _first_int(cfg, "head_dim"),
        "ffn_hidden_size": _first_int(
            cfg, "intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", "d_ff"
        ),
        "vocab_size": _first_int(cfg, "vocab_size"),
    }
    experts = _first_int(cfg, "num_local_experts", "num_experts", "n_routed_experts")
    if experts and experts > 1:
        model["num_experts"] = experts
        model["experts_top_k"] = _first_int(cfg, "num_experts_per_tok", "moe_top_k", "top_k")
        model["moe_ffn_hidden_size"] = _first_int(cfg, "moe_intermediate_size")
        model.update(_moe_extras(cfg, model["moe_ffn_hidden_size"]))
    model.update(_latent_attention(cfg))
    tied = getattr(cfg, "tie_word_embeddings", None)
    if isinstance(tied, bool):
        model["tied_embeddings"] = tied
    if getattr(cfg, "rms_norm_eps", None) is not None:
        model["norm_type"] = NormType.RMSNORM
    elif getattr(cfg, "layer_norm_eps", None) is not None or (
        getattr(cfg, "layer_norm_epsilon", None) is not None
    ):
        model["norm_type"] = NormType.LAYERNORM
    if model_type in POST_LN_FAMILIES:
        model["norm_placement"] = NormPlacement.POST
    if getattr(cfg, "alibi", None) is True:
        model["position_encoding"] = PositionEncoding.ALIBI
    elif getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_theta", None):
        model["position_encoding"] = PositionEncoding.ROPE
    for attr in ("use_parallel_residual", "parallel_attn"):
        if isinstance(getattr(cfg, attr, None), bool):
            model["parallel_residual"] = getattr(cfg, attr)
            break
    return Family({k: v for k, v in model.items() if v is not None})


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers logs notes about legacy values while parsing; sapper reports what
    matters itself, so keep the terminal clean."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


#: Blocks (layers × (1 + experts per layer)) above which the model is not built on the
#: meta device: building costs about 2 ms per block, so DeepSeek-V3 (61 × 257) takes
#: half a minute and a hostile config with 10^4 layers of 10^3 experts would take hours.
MAX_META_BLOCKS = 20_000


def _blocks(cfg: Any) -> int:
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    values = [getattr(text_cfg, a, None) for a in ("num_hidden_layers", "n_layer", "num_layers")]
    layers = next((v for v in values if isinstance(v, int)), 1)
    experts = [
        getattr(text_cfg, a, None) for a in ("num_local_experts", "num_experts", "n_routed_experts")
    ]
    per_layer = max([e for e in experts if isinstance(e, int)], default=0)
    return layers * (1 + per_layer)


def meta_causal_lm(cfg: Any) -> Any | None:
    """The causal LM ``cfg`` describes, built on the meta device (no memory, no weights);
    None when transformers cannot build it from this config, or when it has more than
    MAX_META_BLOCKS blocks."""
    if _blocks(cfg) > MAX_META_BLOCKS:
        return None
    try:
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"), quiet_transformers():
            return AutoModelForCausalLM.from_config(cfg)
    except Exception:  # a config transformers cannot instantiate
        return None


def count_on_meta(cfg: Any) -> tuple[int, bool] | None:
    """The causal LM's parameter count, built on the meta device, and whether its MLP is
    gated (a ``gate_proj``/``gate_up_proj`` weight); None where :func:`meta_causal_lm`
    cannot build it (then the Plan's own estimate is used)."""
    model = meta_causal_lm(cfg)
    if model is None:
        return None
    names = [name for name, _ in model.named_parameters()]
    gated = any(".gate_proj." in n or ".gate_up_proj" in n for n in names)
    return sum(p.numel() for p in model.parameters()), gated
