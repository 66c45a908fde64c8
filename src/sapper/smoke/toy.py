"""The toy model: the user's architecture at a size a CPU trains in milliseconds.

A Hugging Face ``config.json`` is scaled down, never re-invented: the same ``model_type``
(so the same modelling code, activation, norm type and placement, position encoding), the
same GQA ratio, MoE routing (fewer experts, the same top-k where it fits), tied or untied
embeddings, dropout and init range; only widths, depth, head count and vocabulary shrink.
A user's own ``nn.Module`` factory is taken as is. Every check rebuilds the model from the
same initial weights, and the data-parallel check rebuilds it in other processes, so a
factory must be a module-level function.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sapper.errors import InputError
from sapper.plan.sources import read_json_file
from sapper.smoke.userref import import_callable

__all__ = [
    "ModelFactory",
    "ToySize",
    "build_hf_model",
    "find_blocks",
    "hf_toy_factory",
    "shrink_hf_config",
    "user_factory",
]

_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
_TOPK_KEYS = ("num_experts_per_tok", "moe_topk")
_SPECIAL_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
# Multi-head latent attention (DeepSeek V2/V3): low-rank widths, shrunk to toy widths.
_MLA_CAPS = {
    "kv_lora_rank": 32,
    "q_lora_rank": 48,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
}
# Widths tied to the hidden size: keep their ratio to it.
_RATIO_KEYS = (
    "intermediate_size",
    "ffn_hidden_size",
    "ffn_dim",
    "n_inner",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "word_embed_proj_dim",
)


@dataclass(frozen=True)
class ToySize:
    """Upper bounds of the toy; a dimension already smaller is kept."""

    layers: int = 4
    head_dim: int = 16
    vocab_size: int = 512
    max_heads: int = 8
    max_experts: int = 4


@dataclass(frozen=True)
class ModelFactory:
    """How to build the toy model; ``build_fn`` must pickle (module-level or a partial of one)."""

    build_fn: Callable[[], nn.Module]
    description: str
    hf_config: dict[str, Any] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def build(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        model = self.build_fn()
        if not isinstance(model, nn.Module):
            raise InputError(
                "the model factory did not return a torch.nn.Module",
                field="--factory",
                value=type(model).__name__,
                expected="a function returning an nn.Module whose forward(input_ids) gives logits",
            )
        return model.float()


def _config_class(model_type: str, file: str) -> Any:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        return CONFIG_MAPPING[model_type]
    except KeyError:
        raise InputError(
            "model_type unknown to the installed transformers",
            file=file,
            field="model_type",
            value=model_type,
            expected="a model_type transformers can build (or pass --factory module:function)",
        ) from None


def _round8(x: float) -> int:
    return max(8, math.ceil(x / 8.0) * 8)


def _shrink_heads(heads: int, kv: int | None, max_heads: int) -> tuple[int, int | None]:
    """Toy (query heads, kv heads) keeping the GQA ratio; MQA stays MQA, MHA stays MHA."""
    if kv is None or kv <= 0 or heads % kv or kv == heads:
        toy = min(heads, 4)
        return toy, (None if kv is None else toy)
    ratio = heads // kv
    toy_kv = 1 if kv == 1 else 2
    if toy_kv * ratio > max_heads:  # a very wide group: cap the query heads
        toy_kv = max(1, max_heads // ratio)
        return min(max_heads, toy_kv * ratio), toy_kv
    return toy_kv * ratio, toy_kv


def shrink_hf_config(
    raw: dict[str, Any], size: ToySize = ToySize(), *, file: str = "config.json",
    min_vocab: int = 0,
) -> tuple[dict[str, Any], list[str]]:
    """The toy version of an HF config dict, plus one note per dimension that changed."""
    model_type = raw.get("model_type")
    if not isinstance(model_type, str):
        raise InputError(
            "missing model_type", file=file, field="model_type",
            expected="a Hugging Face config.json (it names its model_type)",
        )
    if raw.get("auto_map"):
        raise InputError(
            "the config needs remote code (auto_map), which sapper never runs",
            file=file, field="auto_map",
            expected="a model_type built into transformers, or --factory module:function",
        )
    cls = _config_class(model_type, file)
    clean = {k: v for k, v in raw.items() if k not in ("quantization_config", "torch_dtype")}
    clean.pop("dtype", None)
    try:
        cfg = cls.from_dict(clean)
    except (TypeError, ValueError, KeyError) as exc:
        raise InputError(f"transformers rejects this config ({exc})", file=file) from None
    notes: list[str] = []

    def change(attr: str, new: Any, label: str | None = None) -> None:
        old = getattr(cfg, attr, None)
        if old is None or old == new:
            return
        setattr(cfg, attr, new)
        notes.append(f"{label or attr} {old}→{new}")

    old_hidden = cfg.hidden_size
    layers = cfg.num_hidden_layers
    change("num_hidden_layers", min(layers, size.layers), "layers")
    toy_layers = cfg.num_hidden_layers
    types = getattr(cfg, "layer_types", None)
    if isinstance(types, list) and len(types) > toy_layers:
        kept = list(types[:toy_layers])
        for kind in dict.fromkeys(types):  # keep one layer of every kind (sliding/full ...)
            if kind not in kept:
                kept[-1] = kind
        cfg.layer_types = kept
    if getattr(cfg, "first_k_dense_replace", None):
        cfg.first_k_dense_replace = min(cfg.first_k_dense_replace, max(0, toy_layers - 1))

    old_heads, old_kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None)
    heads, kv = _shrink_heads(old_heads, old_kv, size.max_heads)
    cfg.num_attention_heads = heads
    if kv is not None:
        cfg.num_key_value_heads = kv
    if (heads, kv) != (old_heads, old_kv):
        notes.append(f"heads/kv-heads {old_heads}/{old_kv or old_heads}→{heads}/{kv or heads}")
    hidden = heads * size.head_dim
    cfg.hidden_size = hidden
    if hidden != old_hidden:
        notes.append(f"hidden {old_hidden}→{hidden}")
    old_head_dim = old_hidden // old_heads
    for key in _RATIO_KEYS:
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 0:
            change(key, _round8(value * hidden / old_hidden))
    for key, cap in _MLA_CAPS.items():
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > cap:
            change(key, cap)
    if getattr(cfg, "head_dim", None) is not None:
        # MLA models take their RoPE head width as head_dim; others the per-head width.
        toy_head_dim = getattr(cfg, "qk_rope_head_dim", None) or size.head_dim
        with contextlib.suppress(AttributeError):  # some configs derive it (read-only)
            cfg.head_dim = toy_head_dim
    rotary = getattr(cfg, "rotary_dim", None)
    if isinstance(rotary, int) and rotary > 0:  # partial RoPE width (GPT-J style)
        change("rotary_dim", max(2, 2 * round(rotary * size.head_dim / old_head_dim / 2)))

    experts = next((k for k in _EXPERT_KEYS if isinstance(getattr(cfg, k, None), int)), None)
    if experts is not None and getattr(cfg, experts) > 1:
        change(experts, min(getattr(cfg, experts), size.max_experts), "experts")
        for key in _TOPK_KEYS:
            if isinstance(getattr(cfg, key, None), int):
                change(key, min(getattr(cfg, key), getattr(cfg, experts)), "top-k")
        for key in ("n_group", "topk_group"):
            if isinstance(getattr(cfg, key, None), int):
                setattr(cfg, key, 1)
        if isinstance(getattr(cfg, "n_shared_experts", None), int):
            change("n_shared_experts", min(cfg.n_shared_experts, 1), "shared experts")

    vocab = max(min(cfg.vocab_size, size.vocab_size), min_vocab)
    change("vocab_size", vocab, "vocab")
    for key in _SPECIAL_IDS:
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value >= vocab:
            setattr(cfg, key, vocab - 1)
        elif isinstance(value, list):
            setattr(cfg, key, [min(v, vocab - 1) for v in value])
    cfg.use_cache = False
    out = cfg.to_dict()
    out.pop("dtype", None)
    out.pop("torch_dtype", None)
    return out, notes


def build_hf_model(config: dict[str, Any]) -> nn.Module:
    """Build a causal LM from a config dict in fp32 (module-level so it pickles)."""
    from transformers import AutoModelForCausalLM

    cls = _config_class(config["model_type"], "toy config")
    cfg = cls.from_dict(dict(config))
    try:
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    except ValueError as exc:
        raise InputError(
            f"transformers has no causal-LM class for this config ({exc})",
            field="model_type", value=config["model_type"],
            expected="a decoder-only model type, or --factory module:function",
        ) from None


def hf_toy_factory(
    path: str | Path, size: ToySize = ToySize(), *, min_vocab: int = 0
) -> ModelFactory:
    """A factory for the toy version of the HF ``config.json`` at ``path``."""
    raw = read_json_file(path)
    if not isinstance(raw, dict):
        raise InputError("not a JSON object", file=str(path), expected="a config.json")
    toy, notes = shrink_hf_config(raw, size, file=str(path), min_vocab=min_vocab)
    factory = ModelFactory(
        functools.partial(build_hf_model, toy),
        f"{raw['model_type']} toy from {Path(path).name}",
        hf_config=toy,
        notes=tuple(notes),
    )
    try:
        factory.build(0)
    except InputError:
        raise
    except Exception as exc:  # transformers raises many types for odd configs
        raise InputError(
            f"cannot build the toy model ({type(exc).__name__}: {exc})",
            file=str(path),
            expected="a config transformers can build scaled down, or --factory module:function",
        ) from None
    return factory


def _call_ref(spec: str) -> nn.Module:
    return import_callable(spec, "--factory")()


def user_factory(fn: str | Callable[[], nn.Module]) -> ModelFactory:
    """The user's model: a ``module:function`` reference or a module-level callable."""
    if isinstance(fn, str):
        import_callable(fn, "--factory")  # fail early, with the input error
        return ModelFactory(functools.partial(_call_ref, fn), fn)
    name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
    return ModelFactory(fn, name)


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The repeated transformer blocks: the longest ``ModuleList`` of same-class modules."""
    best: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > len(best):
            kinds = {type(m) for m in module}
            if len(kinds) == 1:
                best = [(f"{name}.{i}", m) for i, m in enumerate(module)]
    return best
