"""Hugging Face configs of the families sapper counts itself, resolved without transformers.

Importing transformers (and the torch it imports) takes seconds: many times what the rest
of ``sapper check --model config.json`` takes. For the families of
:data:`sapper.plan.readers.hf_families.FAMILIES`, sapper reads a few dozen attributes of the
parsed config, so this module resolves those attributes the way transformers' config
classes do: the class defaults, the ``attribute_map`` aliases (GPT-2's ``hidden_size``
is ``n_embd``), the ``__post_init__`` derivations (``head_dim``, ``num_key_value_heads``,
Falcon's ``ffn_hidden_size``, Gemma's legacy ``gelu``) and the RoPE parameters, which
transformers 5 folds into ``rope_parameters``. Every other key of the file becomes an
attribute as it is, as transformers sets it.

Whenever it cannot vouch for the result it returns None and the caller parses the file
with transformers, which also words the error: a value of a type transformers' strict
config would reject, a RoPE scaling it does not know, a head count that does not divide
the width, a config without ``model_type``. Keys sapper does not read are not validated
here. ``tests/plan/test_hf_fast.py`` checks that both paths give the same model section
for every fixture, and for each fixture with each of its keys removed (the defaults).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FAST_FAMILIES", "FastConfig", "fast_config"]


class FastConfig:
    """Attribute access like a transformers config: aliases resolve, a missing
    attribute raises AttributeError (so ``getattr(cfg, name, None)`` behaves the same)."""

    def __init__(self, values: dict[str, Any], aliases: dict[str, str]) -> None:
        self.__dict__["_values"] = values
        self.__dict__["_aliases"] = aliases

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__["_values"]
        key = self.__dict__["_aliases"].get(name, name)
        if key in values:
            return values[key]
        raise AttributeError(name)

    def get_text_config(self) -> FastConfig:
        return self


# ---- value kinds, as transformers' @strict configs check them -----------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_KIND: dict[str, Callable[[Any], bool]] = {
    "int": _is_int,
    "float": _is_number,
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
}


def _kind_of(default: Any) -> str:
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "float"
    return "str"


@dataclass(frozen=True)
class _Spec:
    """One family's config class, as far as sapper reads it.

    ``defaults``: the class default of every field sapper reads (None where the class
    derives it in ``__post_init__``); ``nullable``: fields that accept None, with the
    kind of their other values; ``rope``: how the class builds ``rope_parameters``.
    """

    defaults: dict[str, Any]
    nullable: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    rope: str | None = "standard"  # "standard", "neox" (rotary_emb_base) or None
    default_theta: float = 10_000.0
    post_init: Callable[[dict[str, Any]], None] | None = None
    #: Keys the class handles in a way not mirrored here (left to transformers).
    unusual: frozenset[str] = frozenset()

    def accepts(self, key: str, value: Any) -> bool:
        """Whether transformers' strict config takes this value for a field sapper reads
        (keys sapper does not read are accepted here and left to transformers)."""
        if key in self.nullable:
            return value is None or _KIND[self.nullable[key]](value)
        if key in self.defaults:
            return _KIND[_kind_of(self.defaults[key])](value)
        return True


def _kv_from_heads(v: dict[str, Any]) -> None:
    if v["num_key_value_heads"] is None:
        v["num_key_value_heads"] = v["num_attention_heads"]


def _llama_post(v: dict[str, Any]) -> None:
    if v["head_dim"] is None:
        v["head_dim"] = v["hidden_size"] // v["num_attention_heads"]
    _kv_from_heads(v)


def _gemma_post(v: dict[str, Any]) -> None:
    if v["hidden_act"] == "gelu":  # the official releases' legacy name for the tanh form
        v["hidden_act"] = "gelu_pytorch_tanh"


def _falcon_post(v: dict[str, Any]) -> None:
    n_embed = v.pop("n_embed", None)
    if n_embed is not None:
        v["hidden_size"] = n_embed
    if v["num_kv_heads"] is None:
        v["num_kv_heads"] = v["num_attention_heads"]
    if v["ffn_hidden_size"] is None:
        v["ffn_hidden_size"] = 4 * v["hidden_size"]
    v["head_dim"] = v["hidden_size"] // v["num_attention_heads"]  # a property there


def _bloom_post(v: dict[str, Any]) -> None:
    n_embed = v.pop("n_embed", None)
    if n_embed is not None:
        v["hidden_size"] = n_embed


def _opt_post(v: dict[str, Any]) -> None:
    if v["word_embed_proj_dim"] is None:
        v["word_embed_proj_dim"] = v["hidden_size"]


_DROPOUT_0 = {"attention_dropout": 0.0}
_LLAMA_NULLABLE = {"num_key_value_heads": "int", "head_dim": "int"}

#: The transformers 5 config classes' defaults for the fields sapper reads.
_SPECS: dict[str, _Spec] = {
    "llama": _Spec(
        {
            "vocab_size": 32000,
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": None,
            "head_dim": None,
            "hidden_act": "silu",
            "max_position_embeddings": 2048,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            **_DROPOUT_0,
        },
        nullable=_LLAMA_NULLABLE,
        post_init=_llama_post,
    ),
    "mistral": _Spec(
        {
            "vocab_size": 32000,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": None,
            "hidden_act": "silu",
            "max_position_embeddings": 4096 * 32,
            "tie_word_embeddings": False,
            **_DROPOUT_0,
        },
        nullable=_LLAMA_NULLABLE,
        post_init=_llama_post,
    ),
    "mixtral": _Spec(
        {
            "vocab_size": 32000,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": None,
            "hidden_act": "silu",
            "max_position_embeddings": 4096 * 32,
            "tie_word_embeddings": False,
            "num_experts_per_tok": 2,
            "num_local_experts": 8,
            **_DROPOUT_0,
        },
        nullable=_LLAMA_NULLABLE,
        aliases={"num_experts": "num_local_experts"},
        default_theta=1_000_000.0,
        post_init=_kv_from_heads,
    ),
    "qwen2": _Spec(
        {
            "vocab_size": 151936,
            "hidden_size": 4096,
            "intermediate_size": 22016,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "hidden_act": "silu",
            "max_position_embeddings": 32768,
            "tie_word_embeddings": False,
            **_DROPOUT_0,
        },
        nullable={"num_key_value_heads": "int"},
        post_init=_kv_from_heads,
    ),
    "gemma": _Spec(
        {
            "vocab_size": 256000,
            "hidden_size": 3072,
            "intermediate_size": 24576,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "head_dim": 256,
            "hidden_act": "gelu_pytorch_tanh",
            "max_position_embeddings": 8192,
            "tie_word_embeddings": True,
            "attention_bias": False,
            **_DROPOUT_0,
        },
        post_init=_gemma_post,
    ),
    "gpt2": _Spec(
        {
            "vocab_size": 50257,
            "n_positions": 1024,
            "n_embd": 768,
            "n_layer": 12,
            "n_head": 12,
            "n_inner": None,
            "activation_function": "gelu_new",
            "resid_pdrop": 0.1,
            "embd_pdrop": 0.1,
            "attn_pdrop": 0.1,
            "add_cross_attention": False,
            "tie_word_embeddings": True,
        },
        nullable={"n_inner": "int"},
        aliases={
            "hidden_size": "n_embd",
            "max_position_embeddings": "n_positions",
            "num_attention_heads": "n_head",
            "num_hidden_layers": "n_layer",
        },
        rope=None,
    ),
    "gpt_neox": _Spec(
        {
            "vocab_size": 50432,
            "hidden_size": 6144,
            "num_hidden_layers": 44,
            "num_attention_heads": 64,
            "intermediate_size": 24576,
            "hidden_act": "gelu",
            "attention_dropout": 0.0,
            "hidden_dropout": 0.0,
            "max_position_embeddings": 2048,
            "tie_word_embeddings": False,
            "use_parallel_residual": True,
            "attention_bias": True,
        },
        rope="neox",
    ),
    "falcon": _Spec(
        {
            "vocab_size": 65024,
            "hidden_size": 4544,
            "num_hidden_layers": 32,
            "num_attention_heads": 71,
            "num_ln_in_parallel_attn": None,
            "hidden_dropout": 0.0,
            "attention_dropout": 0.0,
            "num_kv_heads": None,
            "alibi": False,
            "new_decoder_architecture": False,
            "multi_query": True,
            "parallel_attn": True,
            "bias": False,
            "max_position_embeddings": 2048,
            "ffn_hidden_size": None,
            "activation": "gelu",
            "tie_word_embeddings": True,
        },
        nullable={
            "num_ln_in_parallel_attn": "int",
            "hidden_dropout": "float",
            "attention_dropout": "float",
            "num_kv_heads": "int",
            "alibi": "bool",
            "new_decoder_architecture": "bool",
            "multi_query": "bool",
            "parallel_attn": "bool",
            "bias": "bool",
            "ffn_hidden_size": "int",
            "activation": "str",
        },
        post_init=_falcon_post,
        unusual=frozenset({"head_dim", "rotary"}),  # read-only properties there
    ),
    "bloom": _Spec(
        {
            "vocab_size": 250880,
            "hidden_size": 64,
            "n_layer": 2,
            "n_head": 8,
            "hidden_dropout": 0.0,
            "attention_dropout": 0.0,
            "tie_word_embeddings": True,
        },
        aliases={"num_hidden_layers": "n_layer", "num_attention_heads": "n_head"},
        rope=None,
        post_init=_bloom_post,
    ),
    "opt": _Spec(
        {
            "vocab_size": 50272,
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "ffn_dim": 3072,
            "max_position_embeddings": 2048,
            "do_layer_norm_before": True,
            "_remove_final_layer_norm": False,
            "word_embed_proj_dim": None,
            "dropout": 0.1,
            "attention_dropout": 0.0,
            "num_attention_heads": 12,
            "activation_function": "relu",
            "enable_bias": True,
            "layer_norm_elementwise_affine": True,
            "tie_word_embeddings": True,
        },
        nullable={"word_embed_proj_dim": "int"},
        rope=None,
        post_init=_opt_post,
    ),
    "phi": _Spec(
        {
            "vocab_size": 51200,
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 24,
            "num_attention_heads": 32,
            "num_key_value_heads": None,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attention_dropout": 0.0,
            "hidden_act": "gelu_new",
            "max_position_embeddings": 2048,
            "tie_word_embeddings": False,
            "qk_layernorm": False,
        },
        nullable={"num_key_value_heads": "int", "attention_dropout": "float"},
        post_init=_kv_from_heads,
    ),
}

#: Families read without transformers (all of :data:`sapper.plan.readers.hf_families.FAMILIES`).
FAST_FAMILIES: tuple[str, ...] = tuple(_SPECS)

#: RoPE scalings resolved here: the keys transformers requires for each (besides
#: ``rope_type`` and ``rope_theta``) and those it also accepts.
_ROPE_REQUIRED: dict[str, frozenset[str]] = {
    "linear": frozenset({"factor"}),
    "dynamic": frozenset({"factor"}),
    "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor"}),
}
_ROPE_KEYS = frozenset(
    {"type", "rope_type", "rope_theta", "original_max_position_embeddings", "factor",
     "low_freq_factor", "high_freq_factor"}
)


def _rope_parameters(spec: _Spec, v: dict[str, Any]) -> dict[str, Any] | None:
    """``rope_parameters`` as transformers 5 standardizes it; None when unsure."""
    if v.pop("rope_parameters", None) is not None:
        return None  # the transformers 5 form: rare in files, left to transformers
    scaling = v.pop("rope_scaling", None)
    if spec.rope == "neox":
        if scaling:
            return None
        theta = v.pop("rotary_emb_base", spec.default_theta)
        v.pop("rotary_pct", None)
        return {"rope_theta": theta, "rope_type": "default"} if _is_number(theta) else None
    theta = v.pop("rope_theta", spec.default_theta)
    v.pop("partial_rotary_factor", None)
    if not _is_number(theta):
        return None
    if not scaling:
        return {"rope_theta": theta, "rope_type": "default"}
    if not isinstance(scaling, dict) or not set(scaling) <= _ROPE_KEYS:
        return None
    params = dict(scaling)
    kind = params.setdefault("rope_type", params.get("type", "default"))
    required = _ROPE_REQUIRED.get(kind) if isinstance(kind, str) else None
    if required is None or not all(_is_number(params.get(k)) for k in required):
        return None
    params.setdefault("rope_theta", theta)
    if kind == "llama3":
        params.setdefault("original_max_position_embeddings", v["max_position_embeddings"])
        if not _is_int(params["original_max_position_embeddings"]):
            return None
    return params


def fast_config(model_type: str, kwargs: dict[str, Any]) -> FastConfig | None:
    """The config transformers would build from ``kwargs`` (a config.json's keys, legacy
    ones already renamed), for a family in :data:`FAST_FAMILIES`; None when this module
    cannot be sure, and the caller should ask transformers."""
    spec = _SPECS.get(model_type)
    if spec is None:
        return None
    given = {spec.aliases.get(k, k): val for k, val in kwargs.items()}
    if len(given) != len(kwargs) or spec.unusual & set(given):
        return None  # a field given under both of its names, or a key not mirrored
    if not all(spec.accepts(k, val) for k, val in given.items()):
        return None
    values = {**spec.defaults, **given}
    if spec.post_init is not None:
        spec.post_init(values)
    heads = values.get(spec.aliases.get("num_attention_heads", "num_attention_heads"))
    width = values.get(spec.aliases.get("hidden_size", "hidden_size"))
    if not _is_int(heads) or not _is_int(width) or heads <= 0 or width % heads:
        return None  # transformers rejects some of these; let it say so
    if spec.rope is not None:
        rope = _rope_parameters(spec, values)
        if rope is None:
            return None
        head_dim = values.get("head_dim")
        if _is_int(head_dim) and head_dim > 4 and head_dim % 2:
            return None  # RoPE needs an even rotary dimension (transformers checks)
        values["rope_parameters"] = rope
    return FastConfig(values, spec.aliases)
