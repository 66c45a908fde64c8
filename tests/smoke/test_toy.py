"""The toy keeps the architecture (model type, GQA ratio, MoE routing, tied embeddings,
activation) and shrinks only sizes; bad configs and factories are input errors."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import GPT2Config, LlamaConfig, MixtralConfig, Qwen2MoeConfig

from sapper.errors import InputError
from sapper.smoke.toy import (
    ToySize,
    build_hf_model,
    find_blocks,
    hf_toy_factory,
    shrink_hf_config,
    user_factory,
)


def _llama3_8b() -> dict:
    return LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
        rope_theta=500000.0, bos_token_id=128000, eos_token_id=128001,
    ).to_dict()


def test_llama_keeps_gqa_ratio_and_ffn_ratio() -> None:
    toy, notes = shrink_hf_config(_llama3_8b())
    assert toy["model_type"] == "llama"
    assert toy["num_attention_heads"] // toy["num_key_value_heads"] == 4
    assert toy["num_key_value_heads"] > 1  # grouped, not collapsed to multi-query
    assert toy["hidden_size"] == toy["num_attention_heads"] * toy["head_dim"]
    assert toy["intermediate_size"] / toy["hidden_size"] == pytest.approx(14336 / 4096, rel=0.05)
    assert toy["num_hidden_layers"] == 4 and toy["vocab_size"] == 512
    assert toy["hidden_act"] == "silu"
    assert toy["rope_parameters"]["rope_theta"] == 500000.0
    assert toy["bos_token_id"] < 512 and toy["eos_token_id"] < 512
    assert "layers 32→4" in notes
    model = build_hf_model(toy)
    logits = model(input_ids=torch.randint(0, 512, (2, 8))).logits
    assert logits.shape == (2, 8, 512)


def test_moe_keeps_routing_and_tied_embeddings_stay_tied() -> None:
    mixtral, _ = shrink_hf_config(MixtralConfig().to_dict())
    assert mixtral["num_local_experts"] == 4 and mixtral["num_experts_per_tok"] == 2
    qwen, _ = shrink_hf_config(Qwen2MoeConfig().to_dict())
    assert qwen["num_experts"] == 4 and qwen["num_experts_per_tok"] == 4
    gpt2, _ = shrink_hf_config(GPT2Config().to_dict())
    model = build_hf_model(gpt2)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert gpt2["activation_function"] == GPT2Config().activation_function


def test_small_dimensions_are_kept_and_data_widens_the_vocab() -> None:
    toy, notes = shrink_hf_config(_llama3_8b(), ToySize(layers=2, vocab_size=64), min_vocab=300)
    assert toy["num_hidden_layers"] == 2 and toy["vocab_size"] == 300
    again, notes = shrink_hf_config(toy)
    assert notes == [] and again["hidden_size"] == toy["hidden_size"]


def test_blocks_are_the_longest_module_list() -> None:
    toy, _ = shrink_hf_config(_llama3_8b())
    names = [n for n, _ in find_blocks(build_hf_model(toy))]
    assert names == [f"model.layers.{i}" for i in range(4)]


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"hidden_size": 64}, "missing model_type"),
        ({"model_type": "no-such-model"}, "model_type unknown"),
        ({"model_type": "llama", "auto_map": {"AutoModel": "x.Y"}}, "remote code"),
    ],
)
def test_bad_configs_are_input_errors(tmp_path, config: dict, problem: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(InputError, match=problem):
        hf_toy_factory(path)


def test_bad_factories_are_input_errors() -> None:
    with pytest.raises(InputError, match="not a module:function"):
        user_factory("no_colon")
    with pytest.raises(InputError, match="cannot import"):
        user_factory("sapper_no_such_module:build")
    with pytest.raises(InputError, match="has no attribute"):
        user_factory("smoke_planted:no_such_function")
    not_a_module = user_factory(lambda: 42)
    with pytest.raises(InputError, match=r"did not return a torch\.nn\.Module"):
        not_a_module.build(0)
