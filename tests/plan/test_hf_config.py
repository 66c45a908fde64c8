"""Hugging Face config.json → Plan model section, with exact parameter counts.

Every fixture is the real config.json of a public model. The count sapper derives from it
must equal the parameters of the model transformers builds from the same file (on the
meta device: no memory, no weights).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from sapper.errors import InputError
from sapper.model import active_params, architecture_from_plan, total_params
from sapper.plan.load import load_plan
from sapper.plan.readers.hf_config import SUPPORTED_FAMILIES, read_hf_config
from sapper.plan.readers.hf_families import quiet_transformers

FIXTURES = Path(__file__).parent.parent / "fixtures" / "hf"
CONFIGS = sorted(FIXTURES.glob("*.json"))


def _built_count(path: Path) -> int:
    """Parameters of the model transformers builds from the same file."""
    from sapper.plan.readers.hf_config import _normalize, _parse

    raw = json.loads(path.read_text())
    model_type, kwargs = _normalize(raw, str(path))
    cfg = _parse(model_type, kwargs, raw, str(path))
    with torch.device("meta"), quiet_transformers():
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def _model(path: Path) -> dict:
    return read_hf_config(path).data["model"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_parameter_count_equals_transformers(path: Path) -> None:
    assert _model(path)["num_params"] == _built_count(path)


def test_every_supported_family_has_a_real_config() -> None:
    families = {_model(p)["family"] for p in CONFIGS}
    assert set(SUPPORTED_FAMILIES) <= families


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("llama-2-7b", 6_738_415_616),
        ("mistral-7b-v0.1", 7_241_732_096),
        ("mixtral-8x7b-v0.1", 46_702_792_704),
        ("gpt2", 124_439_808),
        ("bloom-560m", 559_214_592),
        ("phi-2", 2_779_683_840),
    ],
)
def test_counts_match_published_sizes(name: str, published: int) -> None:
    assert _model(FIXTURES / f"{name}.json")["num_params"] == published


def test_llama_fields_and_origins() -> None:
    src = read_hf_config(FIXTURES / "llama-2-7b.json")
    m = src.data["model"]
    assert (m["hidden_size"], m["num_layers"], m["num_heads"], m["num_kv_heads"]) == (
        4096,
        32,
        32,
        32,
    )
    assert m["ffn_hidden_size"] == 11008
    assert m["activation"] == "swiglu"
    assert (m["norm_type"], m["norm_placement"]) == ("rmsnorm", "pre")
    assert (m["position_encoding"], m["rope_theta"]) == ("rope", 10000.0)
    assert m["max_position_embeddings"] == 4096
    assert m["tied_embeddings"] is False
    assert "rope_scaling" not in m
    assert src.origin["model.num_layers"] == "num_hidden_layers"
    assert "init" not in src.data  # from scratch or fine-tuning: the file does not say


def test_llama3_rope_scaling() -> None:
    m = _model(FIXTURES / "llama-3.1-8b.json")
    assert m["rope_scaling"] == {
        "type": "llama3",
        "factor": 8.0,
        "original_max_position_embeddings": 8192,
    }
    assert m["rope_theta"] == 500000.0
    assert (m["num_kv_heads"], m["max_position_embeddings"]) == (8, 131072)


def test_rope_parameters_form_of_transformers_5(tmp_path: Path) -> None:
    raw = json.loads((FIXTURES / "llama-3.1-8b.json").read_text())
    scaling = raw.pop("rope_scaling")
    raw["rope_parameters"] = {**scaling, "rope_theta": raw.pop("rope_theta")}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    m = _model(path)
    assert m["rope_scaling"]["type"] == "llama3"
    assert m["rope_theta"] == 500000.0


def test_mixtral_experts() -> None:
    m = _model(FIXTURES / "mixtral-8x7b-v0.1.json")
    assert (m["num_experts"], m["experts_top_k"]) == (8, 2)


def test_gpt2_legacy_names_and_learned_positions() -> None:
    src = read_hf_config(FIXTURES / "gpt2-xl.json")
    m = src.data["model"]
    assert (m["hidden_size"], m["num_layers"], m["num_heads"]) == (1600, 48, 25)
    assert (m["position_encoding"], m["max_position_embeddings"]) == ("learned", 1024)
    assert m["tied_embeddings"] is True
    assert src.origin["model.hidden_size"] == "n_embd"
    assert m["dropout"] == 0.1


def test_gpt_neox_parallel_residual() -> None:
    m = _model(FIXTURES / "pythia-1.4b.json")
    assert m["parallel_residual"] is True
    assert (m["norm_type"], m["activation"]) == ("layernorm", "gelu")


def test_falcon_legacy_keys_and_variants() -> None:
    legacy = read_hf_config(FIXTURES / "falcon-7b-legacy.json")
    m7 = legacy.data["model"]
    assert (m7["family"], m7["num_heads"], m7["num_layers"]) == ("falcon", 71, 32)
    assert m7["num_kv_heads"] == 1  # multi_query
    assert legacy.origin["model.num_heads"] == "n_head"
    m40 = _model(FIXTURES / "falcon-40b-legacy.json")
    assert m40 == {**_model(FIXTURES / "falcon-40b.json")}
    assert (m40["num_kv_heads"], m40["parallel_residual"]) == (8, True)
    rw = _model(FIXTURES / "falcon-rw-1b.json")
    assert (rw["position_encoding"], rw["parallel_residual"]) == ("alibi", False)
    assert rw["attention_bias"] is True
    # A RoPE model whose file does not state its context length: left unknown.
    assert "max_position_embeddings" not in m7


def test_bloom_alibi_without_context_length() -> None:
    m = _model(FIXTURES / "bloom-560m.json")
    assert m["position_encoding"] == "alibi"
    assert "max_position_embeddings" not in m
    assert (m["num_heads"], m["num_layers"]) == (16, 24)


def test_opt_post_ln_and_projection() -> None:
    m350 = _model(FIXTURES / "opt-350m.json")
    assert m350["norm_placement"] == "post"
    m13 = _model(FIXTURES / "opt-1.3b.json")
    assert m13["norm_placement"] == "pre"
    assert m350["activation"] == "relu"


def test_phi_and_qwen2_tied() -> None:
    phi = _model(FIXTURES / "phi-2.json")
    assert phi["parallel_residual"] is True
    qwen = _model(FIXTURES / "qwen2-0.5b.json")
    assert qwen["tied_embeddings"] is True
    assert (qwen["num_kv_heads"], qwen["attention_bias"]) == (2, True)


def test_other_families_are_counted_on_the_meta_device() -> None:
    m = _model(FIXTURES / "phi-3-mini-4k.json")
    assert m["family"] == "phi3"
    assert m["num_params"] == 3_821_079_552
    assert (m["activation"], m["norm_type"], m["position_encoding"]) == (
        "swiglu",
        "rmsnorm",
        "rope",
    )


def test_architectures_name_the_family(tmp_path: Path) -> None:
    raw = json.loads((FIXTURES / "mistral-7b-v0.1.json").read_text())
    del raw["model_type"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    assert _model(path)["family"] == "mistral"


def test_partial_config_leaves_unknowns_unset(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 2048,
                "num_hidden_layers": 16,
                "num_attention_heads": 16,
            }
        )
    )
    m = _model(path)
    assert (m["hidden_size"], m["num_layers"]) == (2048, 16)
    assert "max_position_embeddings" not in m  # transformers' placeholder is not a fact


def test_loads_into_a_valid_plan() -> None:
    plan = load_plan(hf_config=FIXTURES / "mixtral-8x7b-v0.1.json").plan
    assert plan.model is not None
    assert total_params(architecture_from_plan(plan)) == 46_702_792_704
    assert active_params(architecture_from_plan(plan)) < total_params(architecture_from_plan(plan))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", "must be a JSON object (got 'list')"),
        ('{"hidden_size": 4096}', "model_type: missing value"),
        ('{"model_type": "llamma"}', "model_type: unknown model family (got 'llamma')"),
        ('{"model_type": "t5"}', "model_type: not a causal language model"),
        ('{"model_type": "llama", "hidden_size": "big"}', "hidden_size: invalid value"),
        ('{"model_type": "llama", "tie_word_embeddings": "yes"}', "tie_word_embeddings"),
    ],
)
def test_bad_configs(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(InputError) as err:
        read_hf_config(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    "name", ["gpt2", "phi-2", "gemma-2b", "gpt-neox-20b", "llama-3.1-8b", "falcon-7b-legacy",
             "opt-350m"]
)
def test_hidden_act_is_the_activation_transformers_builds(name: str) -> None:
    """model.hidden_act names the exact kernel (activation memory depends on it): the
    module the MLP is built with is the one ACT2FN gives for that name — also where
    transformers rewrote the file's value (Gemma's legacy "gelu" runs the tanh form)."""
    from transformers.activations import ACT2FN

    path = FIXTURES / f"{name}.json"
    act = _model(path)["hidden_act"]
    raw = json.loads(path.read_text())
    from sapper.plan.readers.hf_config import _normalize, _parse

    model_type, kwargs = _normalize(raw, str(path))
    cfg = _parse(model_type, kwargs, raw, str(path))
    with torch.device("meta"), quiet_transformers():
        model = AutoModelForCausalLM.from_config(cfg)
    built = {type(m) for m in model.modules()}
    assert type(ACT2FN[act]) in built
    # the key the file states it with, or its family's default
    assert read_hf_config(path).origin["model.hidden_act"] in (*raw, "model_type")
