"""The transformers-free reading of known families gives what transformers gives.

``sapper check --model config.json`` resolves the families sapper counts itself without
importing transformers (sapper.plan.readers.hf_fast). Each case here reads one config both ways,
through the fast path and through transformers' own config class, and compares the whole
model section and its origins: every real config of tests/fixtures/hf and examples/hf,
each of them with each key removed (so every class default is exercised), and the edits
where transformers does something special.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sapper.errors import InputError
from sapper.plan.readers import hf_config
from sapper.plan.readers.hf_families import FAMILIES
from sapper.plan.readers.hf_fast import FAST_FAMILIES, fast_config

ROOT = Path(__file__).parent.parent.parent
CONFIGS = sorted((ROOT / "tests" / "fixtures" / "hf").glob("*.json")) + sorted(
    (ROOT / "examples" / "hf").glob("*.json")
)


def _fast_family(raw: dict[str, Any]) -> bool:
    mt = raw.get("model_type")
    return mt in FAMILIES or mt in hf_config._LEGACY_MODEL_TYPES


KNOWN = [p for p in CONFIGS if _fast_family(json.loads(p.read_text()))]


def _read(raw: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, fast: bool):
    """(model section, origins) or the error message, read one way."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(hf_config, "fast_config", lambda *_: None)
        else:
            m.setattr(hf_config, "_parse", _no_transformers)
        try:
            src = hf_config.read_hf_config(path)
        except InputError as exc:
            return str(exc)
    return src.data, src.origin


def _no_transformers(*_: Any) -> Any:
    raise AssertionError("the fast path fell back to transformers")


def _both(raw: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fast and transformers agree; or the fast path declines (and transformers decides)."""
    mt, kwargs = hf_config._normalize(raw, "config.json")
    slow = _read(raw, tmp_path, monkeypatch, fast=False)
    if fast_config(mt, kwargs) is None:
        return
    assert _read(raw, tmp_path, monkeypatch, fast=True) == slow


def test_every_counted_family_has_a_fast_path() -> None:
    assert set(FAST_FAMILIES) == set(FAMILIES)


@pytest.mark.parametrize("path", KNOWN, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_real_configs_take_the_fast_path_and_agree(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = json.loads(path.read_text())
    mt, kwargs = hf_config._normalize(raw, str(path))
    assert fast_config(mt, kwargs) is not None, "a real config should not need transformers"
    slow = _read(raw, tmp_path, monkeypatch, fast=False)
    assert _read(raw, tmp_path, monkeypatch, fast=True) == slow


@pytest.mark.parametrize("path", KNOWN, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_each_key_removed_agrees(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Removing a key exposes the class default (or derivation) the fast path mirrors."""
    raw = json.loads(path.read_text())
    for key in sorted(raw):
        if key == "model_type":
            continue
        _both({k: v for k, v in raw.items() if k != key}, tmp_path, monkeypatch)


DELETE = object()
EDITS: list[tuple[str, dict[str, Any]]] = [
    ("llama-2-7b", {"num_key_value_heads": None, "head_dim": None}),
    ("llama-2-7b", {"rope_theta": 500000}),
    ("llama-2-7b", {"rope_scaling": {"type": "linear", "factor": 4.0}}),
    ("llama-2-7b", {"rope_scaling": {"rope_type": "dynamic", "factor": 2}}),
    ("llama-2-7b", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}),
    ("llama-2-7b", {"rope_scaling": {"rope_type": "linear"}}),
    ("llama-2-7b", {"hidden_dropout": 0.1, "num_local_experts": 4, "num_experts_per_tok": 2}),
    ("llama-2-7b", {"tie_word_embeddings": "yes"}),
    ("llama-2-7b", {"hidden_act": None}),
    ("llama-2-7b", {"attention_bias": 1}),
    ("llama-2-7b", {"num_attention_heads": 48}),
    ("llama-3.1-8b", {"max_position_embeddings": 16384}),
    ("llama-3.1-8b", {"original_max_position_embeddings": 4096}),
    ("mixtral-8x7b-v0.1", {"num_experts": 4}),
    ("mixtral-8x7b-v0.1", {"rope_theta": None}),
    ("mistral-7b-v0.1", {"head_dim": 96}),
    ("gemma-2b", {"hidden_act": "gelu_new"}),
    ("gemma-2b", {"hidden_activation": "gelu_pytorch_tanh"}),
    ("gpt2", {"hidden_size": 1536, "n_embd": DELETE}),
    ("gpt2", {"n_inner": 2048, "activation_function": "relu", "add_cross_attention": True}),
    ("gpt2", {"max_position_embeddings": 2048}),
    ("pythia-1.4b", {"rotary_emb_base": 500000, "rotary_pct": 1.0}),
    ("pythia-1.4b", {"rope_theta": 500000}),
    ("falcon-7b-legacy", {"n_embed": 5112}),
    ("falcon-40b", {"ffn_hidden_size": None, "num_kv_heads": None}),
    ("falcon-40b", {"ffn_hidden_size": DELETE, "num_kv_heads": DELETE}),
    ("falcon-40b", {"head_dim": 64}),
    ("bloom-560m", {"num_hidden_layers": 12}),
    ("opt-350m", {"word_embed_proj_dim": None, "_remove_final_layer_norm": True}),
    ("opt-350m", {"word_embed_proj_dim": DELETE}),
    ("phi-2", {"qk_layernorm": True, "num_key_value_heads": 8}),
    ("qwen2-0.5b", {"num_key_value_heads": None}),
]


@pytest.mark.parametrize(("name", "edit"), EDITS, ids=lambda x: x if isinstance(x, str) else "")
def test_edits_agree(
    name: str, edit: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = json.loads((ROOT / "tests" / "fixtures" / "hf" / f"{name}.json").read_text())
    edited = {k: v for k, v in {**raw, **edit}.items() if v is not DELETE}
    _both(edited, tmp_path, monkeypatch)


@pytest.mark.parametrize("model_type", FAST_FAMILIES)
def test_class_defaults_agree(
    model_type: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file naming only its family: every value is the config class's default."""
    raw = {"model_type": model_type}
    assert fast_config(model_type, dict(raw)) is not None
    slow = _read(raw, tmp_path, monkeypatch, fast=False)
    assert _read(raw, tmp_path, monkeypatch, fast=True) == slow


def _attributes_agree(model_type: str, kwargs: dict[str, Any]) -> None:
    """Every attribute the fast path mirrors equals the transformers config's."""
    from sapper.plan.readers.hf_fast import _SPECS

    fast = fast_config(model_type, dict(kwargs))
    assert fast is not None
    slow = hf_config._parse(model_type, dict(kwargs), kwargs, "config.json")
    spec = _SPECS[model_type]
    for name in [*spec.defaults, *spec.aliases]:
        assert getattr(fast, name) == getattr(slow, name), name
    if spec.rope is not None:
        rope = {k: v for k, v in slow.rope_parameters.items() if k != "partial_rotary_factor"}
        assert fast.rope_parameters == rope


@pytest.mark.parametrize("model_type", FAST_FAMILIES)
def test_class_default_attributes_agree(model_type: str) -> None:
    _attributes_agree(model_type, {"model_type": model_type})


@pytest.mark.parametrize("path", KNOWN, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_real_config_attributes_agree(path: Path) -> None:
    mt, kwargs = hf_config._normalize(json.loads(path.read_text()), str(path))
    _attributes_agree(mt, kwargs)


def test_odd_inputs_fall_back_to_transformers() -> None:
    base = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32}
    declined = [
        {**base, "tie_word_embeddings": "yes"},  # a type transformers rejects
        {**base, "num_attention_heads": 48},  # width not divisible by the heads
        {**base, "rope_scaling": {"rope_type": "longrope", "factor": 2.0}},  # not mirrored
        {**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
        {"model_type": "gpt2", "hidden_size": 1024, "n_embd": 1024},  # both names
    ]
    for kwargs in declined:
        assert fast_config(kwargs["model_type"], kwargs) is None, kwargs
    assert fast_config("phi3", {"model_type": "phi3"}) is None  # counted on the meta device
