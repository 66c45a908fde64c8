"""Read a Hugging Face ``config.json`` into the Plan's ``model`` section.

The file is parsed by transformers' own config class for its ``model_type``, so legacy
names (``n_embd``, ``n_head``, ``n_layer``), defaults and validation are resolved exactly
as when transformers builds the model. On top of that sapper translates what transformers
itself no longer reads: the original Falcon ``RefinedWebModel``/``RefinedWeb`` configs
(``n_head``, ``n_layer``, ``n_head_kv``), and configs that name only their architecture.

The architecture (norm type and placement, position encoding, gating, biases, tied head)
and the exact parameter count come from :mod:`sapper.plan.readers.hf_families`. What the file does
not state is left unset rather than guessed: the context length of a RoPE/ALiBi model whose
config omits ``max_position_embeddings`` stays unknown, and so does an activation sapper
has no name for. The checkpoint's ``torch_dtype`` is not read: it says how the weights were
saved, not how the job will train; nor is ``initializer_range``: a config.json does not say
whether the job trains from scratch or from pretrained weights.
"""

from __future__ import annotations

import difflib
import enum
import re
from pathlib import Path
from typing import Any

from sapper.errors import InputError
from sapper.plan.readers.base import ConfigFormat, Sniff
from sapper.plan.readers.hf_families import (
    FAMILIES,
    Family,
    activation,
    count_on_meta,
    dropout_of,
    dropout_sites,
    generic,
    quiet_transformers,
)
from sapper.plan.readers.hf_fast import fast_config
from sapper.plan.schema import (
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_TOKENS,
    MAX_VOCAB,
    MAX_WIDTH,
    PositionEncoding,
    fmt_bound,
)
from sapper.plan.sources import PlanSource, read_json_object

__all__ = ["FORMAT", "SUPPORTED_FAMILIES", "read_hf_config", "transformers_config"]

#: Families whose parameter count sapper derives without building the model.
SUPPORTED_FAMILIES: tuple[str, ...] = tuple(FAMILIES)

#: Original Falcon hub configs: model_type -> (family, uses the 40B "new" decoder).
_LEGACY_MODEL_TYPES = {"RefinedWebModel": ("falcon", False), "RefinedWeb": ("falcon", True)}
_LEGACY_KEYS = {
    "falcon": {
        "n_head": "num_attention_heads",
        "n_layer": "num_hidden_layers",
        "n_head_kv": "num_kv_heads",
    },
}

#: Keys that must hold a positive integer when present, with the largest value accepted
#: (checked before transformers, so the message is the same whatever transformers version
#: is installed, and so a hostile size never reaches transformers or the meta build).
_POSITIVE_INTS: dict[str, int] = {
    **dict.fromkeys(
        ("hidden_size", "n_embd", "n_embed", "d_model", "head_dim", "intermediate_size"),
        MAX_WIDTH,
    ),
    **dict.fromkeys(("ffn_dim", "n_inner", "ffn_hidden_size", "word_embed_proj_dim"), MAX_WIDTH),
    **dict.fromkeys(("num_hidden_layers", "n_layer"), MAX_LAYERS),
    **dict.fromkeys(
        ("num_attention_heads", "n_head", "num_key_value_heads", "num_kv_heads", "n_head_kv"),
        MAX_HEADS,
    ),
    "vocab_size": MAX_VOCAB,
    **dict.fromkeys(("max_position_embeddings", "n_positions"), MAX_TOKENS),
    **dict.fromkeys(("num_local_experts", "num_experts_per_tok"), MAX_EXPERTS),
    **dict.fromkeys(
        ("moe_intermediate_size", "shared_expert_intermediate_size", "kv_lora_rank",
         "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"),
        MAX_WIDTH,
    ),
}

#: Plan model field -> config.json keys that state it (the first present names the source).
_ORIGIN: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "n_embed", "d_model"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query"),
    "head_dim": ("head_dim", "qk_nope_head_dim"),
    "ffn_hidden_size": ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size"),
    "activation": ("hidden_act", "activation_function", "activation", "hidden_activation"),
    "hidden_act": ("hidden_activation", "hidden_act", "activation_function", "activation"),
    "vocab_size": ("vocab_size",),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "seq_length"),
    "rope_theta": ("rope_theta", "rope_parameters", "rotary_emb_base"),
    "rope_scaling": ("rope_scaling", "rope_parameters"),
    "norm_placement": ("do_layer_norm_before",),
    "position_encoding": ("alibi",),
    "tied_embeddings": ("tie_word_embeddings",),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "experts_top_k": ("num_experts_per_tok", "moe_top_k"),
    "shared_expert_ffn_hidden_size": ("shared_expert_intermediate_size", "n_shared_experts"),
    "first_dense_layers": ("first_k_dense_replace",),
    "kv_lora_rank": ("kv_lora_rank",),
    "q_lora_rank": ("q_lora_rank",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "attention_bias": ("attention_bias", "bias", "enable_bias"),
    "mlp_bias": ("mlp_bias", "bias", "enable_bias"),
    "parallel_residual": ("use_parallel_residual", "parallel_attn", "new_decoder_architecture"),
}


def read_hf_config(path: str | Path) -> PlanSource:
    """A Plan source holding ``model.*`` from an HF ``config.json``."""
    file = str(path)
    raw, model_type, kwargs = _read(path)
    # A family sapper counts itself is resolved without transformers (seconds to import);
    # anything the fast path is unsure of is parsed, and validated, by transformers.
    cfg = fast_config(model_type, kwargs) if model_type in FAMILIES else None
    if cfg is None:
        cfg = _parse(model_type, kwargs, raw, file)
    _check_resolved(cfg, raw, file)
    try:
        family = _describe(cfg, model_type)
        _add_positions(family, cfg, raw)
        family.model["hidden_act"] = _hidden_act(cfg)
        dropout = dropout_of(cfg)
        sites = dropout_sites(cfg)
    except (TypeError, ValueError, ArithmeticError, AttributeError) as exc:
        # The file was accepted but a value it left alone (a null width, a string where
        # a number goes) cannot describe a model: bad input, not a bug.
        raise InputError(
            f"the config does not describe a model sapper can count ({exc})",
            file=file,
            expected="positive integers for the model's sizes",
        ) from None
    if isinstance(dropout, (int, float)) and 0 <= dropout < 1:
        family.model["dropout"] = dropout
        for site, p in sites.items():
            if 0 <= p < 1:
                family.model[f"{site}_dropout"] = p

    src = PlanSource(name=file)
    src.set("model.family", model_type, origin="model_type")
    for name, value in family.model.items():
        if value is None:
            continue
        src.set(f"model.{name}", _plain(value), origin=_origin(name, raw))
    if family.num_params is not None:
        src.set("model.num_params", family.num_params, origin="model_type (parameter count)")
    return src


def _read(path: str | Path) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """The file's raw keys, its model_type and the keywords for transformers' config class;
    the numbers checked."""
    raw = read_json_object(
        path,
        "a Hugging Face config.json",
        'an object with "model_type", "hidden_size", "num_hidden_layers", ...',
    )
    model_type, kwargs = _normalize(raw, str(path))
    _check_numbers(raw, str(path))
    return raw, model_type, kwargs


def transformers_config(path: str | Path) -> tuple[Any, dict[str, Any]]:
    """transformers' own config object for an HF ``config.json`` (the one its model classes
    take), and the file's raw keys; InputError naming the file and the field otherwise.
    The same validation as :func:`read_hf_config`, without the fast path: the caller
    builds the model from it."""
    file = str(path)
    raw, model_type, kwargs = _read(path)
    cfg = _parse(model_type, kwargs, raw, file)
    _check_resolved(cfg, raw, file)
    return cfg, raw


# ---- which family, in which form transformers reads it ----------------------------------
def _causal_lm_types() -> dict[str, str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _expected_types(given: object = None) -> str:
    known = _causal_lm_types()
    hint = ""
    if isinstance(given, str):
        close = difflib.get_close_matches(given, list(known), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"a causal-LM model_type the installed transformers knows{hint}: "
        f"{', '.join(SUPPORTED_FAMILIES)} are counted exactly from the config, the other "
        f"{len(known) - len(SUPPORTED_FAMILIES)} by building the model on the meta device"
    )


def _normalize(raw: dict[str, Any], file: str) -> tuple[str, dict[str, Any]]:
    """The model_type and the keyword dict transformers' config class should receive.

    Needs transformers only for a file without ``model_type`` (its architecture names the
    family) and for a family sapper does not count itself (is it a causal LM?)."""
    kwargs = dict(raw)
    model_type = raw.get("model_type")
    if model_type is None:
        model_type = _type_from_architectures(raw.get("architectures"))
        if model_type is None:
            raise InputError(
                "missing value",
                file=file,
                field="model_type",
                expected=_expected_types(),
            )
    if not isinstance(model_type, str):
        raise InputError(
            "invalid value",
            file=file,
            field="model_type",
            value=model_type,
            expected="a string naming the model family",
        )
    if model_type in _LEGACY_MODEL_TYPES:
        model_type, new_arch = _LEGACY_MODEL_TYPES[model_type]
        kwargs.setdefault("new_decoder_architecture", new_arch)
        kwargs.pop("auto_map", None)  # points at remote code the family no longer needs
    for old, new in _LEGACY_KEYS.get(model_type, {}).items():
        if old in kwargs and new not in kwargs:
            kwargs[new] = kwargs.pop(old)
    kwargs["model_type"] = model_type
    if model_type not in FAMILIES:
        _check_causal_lm(model_type, raw, file)
    return model_type, kwargs


def _check_causal_lm(model_type: str, raw: dict[str, Any], file: str) -> None:
    """A family transformers knows, and a causal language model."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        raise InputError(
            "unknown model family",
            file=file,
            field="model_type",
            value=raw.get("model_type", model_type),
            expected=_expected_types(model_type),
        )
    if model_type not in _causal_lm_types():
        raise InputError(
            "not a causal language model",
            file=file,
            field="model_type",
            value=model_type,
            expected=_expected_types(),
        )


def _type_from_architectures(architectures: Any) -> str | None:
    """``"architectures": ["LlamaForCausalLM"]`` names its family unambiguously."""
    if not isinstance(architectures, list):
        return None
    by_class = {cls: mt for mt, cls in _causal_lm_types().items() if isinstance(cls, str)}
    for arch in architectures:
        if isinstance(arch, str) and arch in by_class:
            return by_class[arch]
    return None


def _check_numbers(raw: dict[str, Any], file: str) -> None:
    for key, most in _POSITIVE_INTS.items():
        if key not in raw or raw[key] is None:
            continue
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= most:
            raise InputError(
                "invalid value",
                file=file,
                field=key,
                value=value,
                expected=f"a positive integer ≤ {fmt_bound(most)}",
            )


#: Sizes every family needs, as transformers names them once legacy keys are resolved.
_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def _check_resolved(cfg: Any, raw: dict[str, Any], file: str) -> None:
    """A size that transformers resolved to null or a non-integer (``"hidden_size": null``
    passes transformers) is reported under the key the file used."""
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    names = {"hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
             "num_attention_heads": "num_heads", "vocab_size": "vocab_size"}
    for attr in _REQUIRED:
        try:
            value = getattr(text_cfg, attr)
        except AttributeError:
            continue  # a family that names it otherwise; its reader checks it
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            key = _origin(names[attr], raw)
            raise InputError(
                "invalid value",
                file=file,
                field=key if key != "model_type" else attr,
                value=value,
                has_value=True,
                expected="a positive integer",
            )


def _parse(model_type: str, kwargs: dict[str, Any], raw: dict[str, Any], file: str) -> Any:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    try:
        with quiet_transformers():
            return cls.from_dict(kwargs)
    except Exception as exc:  # transformers rejects the file: report it as bad input
        raise _rejected(exc, cls.__name__, raw, file) from None


def _rejected(exc: Exception, class_name: str, raw: dict[str, Any], file: str) -> InputError:
    text = str(exc)
    cause = str(exc.__cause__ or exc).strip().splitlines()
    detail = cause[-1].strip() if cause else text
    field = re.search(r"field '([^']+)'", text)
    if field:
        key = field.group(1)
        expected = re.search(r"expected (.+?), got", detail)
        return InputError(
            "invalid value",
            file=file,
            field=key,
            value=raw.get(key),
            has_value=key in raw,
            expected=f"{expected.group(1) if expected else 'a valid value'} ({class_name})",
        )
    return InputError(f"transformers' {class_name} rejects this config: {detail}", file=file)


# ---- what the config says about the architecture ----------------------------------------
def _describe(cfg: Any, model_type: str) -> Family:
    known = FAMILIES.get(model_type)
    if known is not None:
        return known(cfg)
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    family = generic(text_cfg, model_type)
    counted = count_on_meta(cfg)
    if counted is not None:
        family.num_params, gated = counted
        act_name = next(
            (getattr(text_cfg, a) for a in _ORIGIN["activation"] if hasattr(text_cfg, a)), None
        )
        family.model["activation"] = activation(act_name, gated=gated)
    return family


def _hidden_act(cfg: Any) -> str | None:
    """The exact activation name the model's MLP is built with, as transformers resolved
    it (Gemma's legacy ``gelu`` becomes ``gelu_pytorch_tanh``): ``gelu_new`` keeps several
    width-sized tensors for backward where a fused ``gelu`` keeps one, so activation memory
    depends on it. Gemma 2 and later read ``hidden_activation``; GPT-2, OPT and GPT-J
    ``activation_function``; Falcon ``activation``. None when the family hard-codes it."""
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    for attr in _ORIGIN["hidden_act"]:
        value = getattr(text_cfg, attr, None)
        if isinstance(value, str) and value:
            return value
    return None


def _add_positions(family: Family, cfg: Any, raw: dict[str, Any]) -> None:
    """Context length and RoPE parameters. A learned table has the size transformers
    builds; a RoPE/ALiBi model's context is only known if the file states it."""
    model = family.model
    learned = model.get("position_encoding") == PositionEncoding.LEARNED
    stated = any(key in raw for key in _ORIGIN["max_position_embeddings"])
    max_pos = getattr(cfg, "max_position_embeddings", None)
    if isinstance(max_pos, int) and (learned or stated):
        model["max_position_embeddings"] = max_pos
    if model.get("position_encoding") != PositionEncoding.ROPE:
        return
    theta, scaling = _rope_parameters(cfg)
    if isinstance(theta, (int, float)) and not isinstance(theta, bool) and theta > 0:
        model["rope_theta"] = float(theta)
    if scaling is not None:
        spec = _rope_scaling(scaling, cfg, model.get("max_position_embeddings"))
        if spec is not None:
            model["rope_scaling"] = spec


def _rope_parameters(cfg: Any) -> tuple[Any, dict[str, Any] | None]:
    """(theta, scaling) from transformers 5's ``rope_parameters`` or 4.x attributes."""
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        params = params.get("full_attention") or next(iter(params.values()))
    if isinstance(params, dict) and params:
        kind = params.get("rope_type") or params.get("type") or "default"
        return params.get("rope_theta"), None if kind == "default" else params
    theta = getattr(cfg, "rope_theta", None) or getattr(cfg, "rotary_emb_base", None)
    scaling = getattr(cfg, "rope_scaling", None)
    return theta, scaling if isinstance(scaling, dict) and scaling else None


def _rope_scaling(scaling: dict[str, Any], cfg: Any, max_pos: int | None) -> dict | None:
    kind = scaling.get("rope_type") or scaling.get("type")
    original = scaling.get("original_max_position_embeddings") or getattr(
        cfg, "original_max_position_embeddings", None
    )
    factor = scaling.get("factor")
    if factor is None and isinstance(original, int) and max_pos:
        factor = max_pos / original  # how transformers derives it for longrope / yarn
    if not isinstance(kind, str) or not isinstance(factor, (int, float)) or factor <= 0:
        return None
    spec: dict[str, Any] = {"type": kind, "factor": float(factor)}
    if isinstance(original, int) and original > 0:
        spec["original_max_position_embeddings"] = original
    return spec


def _origin(field: str, raw: dict[str, Any]) -> str:
    for key in _ORIGIN.get(field, ()):
        if key in raw:
            return key
    return "model_type"


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


_NAMES = frozenset({"model_type", "architectures"})
_WIDTHS = frozenset({"hidden_size", "n_embd", "d_model"})
_DEPTHS = frozenset({"num_hidden_layers", "n_layer", "num_layers"})


def _recognise(sniff: Sniff) -> float:
    """A config.json is always JSON (Axolotl's YAML also has a ``model_type``)."""
    doc = sniff.json
    if not isinstance(doc, dict):
        return 0.0
    keys = set(doc)
    if keys & _NAMES:
        return 0.95
    return 0.8 if keys & _WIDTHS and keys & _DEPTHS else 0.0


FORMAT = ConfigFormat(
    name="hf",
    title="a Hugging Face config.json",
    looks_for='a JSON object with "model_type" or "architectures", or a width and a depth '
    "such as hidden_size and num_hidden_layers",
    recognise=_recognise,
    read=lambda sniff: read_hf_config(sniff.path),
)
