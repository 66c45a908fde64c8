"""llm-foundry training YAML -> Plan: MPT models described in the file with MPTConfig's
defaults, Composer's FSDP and precision, time strings in steps, interpolations resolved,
hub models, "auto" and epochs left unknown, TrainConfig's keys for typos, bad values as
one line."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import stable_settings
from tests.plan.launch_support import (
    EXAMPLES,
    LLAMA,
    c006_by_key,
    changed,
    check,
    hostile_case,
    one_line_error,
    same_verdicts,
    verdicts,
    write_yaml,
)
from tests.plan.test_hostile_property import mutated

from sapper.plan.load import load_plan
from sapper.plan.readers.base import Sniff
from sapper.plan.readers.registry import detect_config, read_config

LF = EXAMPLES / "llmfoundry"
YAMLS = sorted(LF.glob("*.yaml"))

#: A minimal MPT job; tests change one thing at a time.
BASE: dict = {
    "variables": {"max_seq_len": 1024},
    "max_seq_len": "${variables.max_seq_len}",
    "model": {"name": "mpt_causal_lm", "d_model": 512, "n_heads": 8, "n_layers": 8,
              "max_seq_len": "${variables.max_seq_len}", "vocab_size": 50368},
    "tokenizer": {"name": "EleutherAI/gpt-neox-20b"},
    "train_loader": {"name": "text", "dataset": {"max_seq_len": "${variables.max_seq_len}"}},
    "scheduler": {"name": "cosine_with_warmup", "t_warmup": "100ba", "alpha_f": 0.1},
    "optimizer": {"name": "decoupled_adamw", "lr": 6.0e-4},
    "max_duration": "1000ba",
    "global_train_batch_size": 256,
    "device_train_microbatch_size": 16,
    "precision": "amp_bf16",
    "fsdp_config": {"sharding_strategy": "FULL_SHARD", "mixed_precision": "PURE"},
}


def _write(tmp_path: Path, config: dict, name: str = "train.yaml") -> Path:
    return write_yaml(tmp_path, config, name)


def _with(**changes: object) -> dict:
    """BASE with dotted keys changed (None removes the key)."""
    return changed(BASE, **changes)


_c006 = c006_by_key


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_every_example_is_read_as_llmfoundry(path: Path) -> None:
    assert detect_config(Sniff.of(path)).name == "llmfoundry"
    src = read_config(path)
    assert src.data["framework"] == "composer"
    assert src.data["batch"]["global_batch_size"] >= 1


def test_mpt_125m_value_by_value() -> None:
    """scripts/train/yamls/pretrain/mpt-125m.yaml, checked by hand against the file and
    MPTConfig's / Composer's defaults."""
    src = read_config(LF / "mpt-125m.yaml")
    assert src.data == {
        "framework": "composer",
        "batch": {"global_batch_size": 256, "micro_batch_size": 16, "seq_len": 2048},
        # fsdp_config: FULL_SHARD, mixed_precision PURE, activation_checkpointing false.
        "parallel": {"zero_stage": 3, "checkpointing": {"granularity": "none"}},
        # amp_bf16 under FSDP PURE: bf16 weights gathered from fp32 shards, fp32 gradients.
        "precision": {"dtype": "bf16", "loss_scaling": {"mode": "none"}, "autocast": False,
                      "grad_dtype": "fp32"},
        "model": {
            "family": "mpt", "hidden_size": 768, "num_heads": 12, "num_layers": 12,
            "vocab_size": 50368, "max_position_embeddings": 2048,
            "ffn_hidden_size": 3072,  # expansion_ratio 4 × d_model
            "activation": "gelu", "hidden_act": "gelu",  # mptmlp, GELU (ffn.py default)
            "num_kv_heads": 12,  # multihead_attention (MPTConfig default)
            "attention_impl": "flash", "attention_dropout": 0.0, "hidden_dropout": 0.0,
            "embedding_dropout": 0.0, "position_encoding": "learned", "norm_type": "layernorm",
            "mlp_bias": True, "attention_bias": True, "tied_embeddings": True,
        },
        # kaiming_normal_, fan_in, relu: √2/√768; residual projections / √(2·12).
        "init": {"std": pytest.approx(math.sqrt(2 / 768)), "residual_scaling": "depth"},
        "optimizer": {"type": "adamw", "lr": 6.0e-4, "weight_decay": 0.0, "eps": 1.0e-8,
                      "betas": [0.9, 0.95]},
        "schedule": {"type": "cosine", "total_steps": 4800, "warmup_steps": 100,
                     "min_lr": pytest.approx(6.0e-5)},
        "clipping": {"max_norm": 1.0, "applied": "after_unscale"},
    }
    assert src.unresolved == [] and src.findings == []
    assert src.origin["batch.seq_len"] == "train_loader.dataset.max_seq_len"
    assert src.origin["model.num_kv_heads"] == \
        "model.attn_config.attn_type (MPTConfig default)"
    assert src.origin["model.tied_embeddings"] == \
        "model.tie_word_embeddings (MPTConfig default)"
    assert src.origin["schedule.total_steps"] == "max_duration"
    assert src.origin["init.std"].startswith("model.init_config.name (MPTConfig default)")


def test_mpt_parameter_count_is_mpt_125ms() -> None:
    """MPT-125M: 125,311,488 parameters (embeddings 50368 × 768, a learned 2048-row
    position table, 12 blocks with biases and two LayerNorms each, a final LayerNorm)."""
    plan = load_plan(configs=[LF / "mpt-125m.yaml"]).plan
    d, f, v, s, layers = 768, 3072, 50368, 2048, 12
    block = 4 * d * d + 4 * d + 2 * d * f + f + d + 2 * 2 * d
    from sapper.model.derived import derived

    assert derived(plan)["parameters"] == v * d + s * d + layers * block + 2 * d


def test_same_verdicts_as_the_hand_written_plan(tmp_path: Path) -> None:
    loader = same_verdicts(LF / "mpt-7b.yaml", {
        "framework": "composer",
        "batch": {"global_batch_size": 1024, "micro_batch_size": 8, "seq_len": 2048},
        "parallel": {"zero_stage": 3, "checkpointing": {"granularity": "full"}},
        "precision": {"dtype": "bf16", "loss_scaling": {"mode": "none"}, "autocast": False,
                      "grad_dtype": "fp32"},
        "model": {"family": "mpt", "hidden_size": 4096, "num_heads": 32, "num_layers": 32,
                  "vocab_size": 50368, "max_position_embeddings": 2048,
                  "ffn_hidden_size": 16384, "activation": "gelu", "hidden_act": "gelu",
                  "num_kv_heads": 32, "attention_impl": "flash", "attention_dropout": 0.0,
                  "hidden_dropout": 0.0, "embedding_dropout": 0.0,
                  "position_encoding": "learned", "norm_type": "layernorm", "mlp_bias": True,
                  "attention_bias": True, "tied_embeddings": True},
        "init": {"std": math.sqrt(2) / math.sqrt(4096), "residual_scaling": "depth"},
        "optimizer": {"type": "adamw", "lr": 1.2e-4, "weight_decay": 0.0, "eps": 1.0e-8,
                      "betas": [0.9, 0.95]},
        "schedule": {"type": "cosine", "total_steps": 63900, "warmup_steps": 100,
                     "min_lr": 1.2e-5},
        "clipping": {"max_norm": 1.0, "applied": "after_unscale"},
    }, tmp_path, "--gpus", "64", "--gpu", "H100")
    assert loader == []


# ---- what stays unknown ------------------------------------------------------------------
def test_hub_model_is_unknown_and_never_passes() -> None:
    src = read_config(LF / "llama-3-8b_domain_adapt.yaml")
    assert src.unresolved == ["model"]
    assert "meta-llama/Meta-Llama-3-8B" in _c006(src)["model.pretrained_model_name_or_path"]
    assert src.data["init"] == {"from_pretrained": True}
    items, _, _, unresolved = verdicts("--config", str(LF / "llama-3-8b_domain_adapt.yaml"),
                                       "--gpus", "64", "--gpu", "H100")
    assert items["memory"] == "unknown" and "model" in unresolved
    # Given the model's config.json, the run is checked.
    items, _, _, _ = verdicts("--config", str(LF / "llama-3-8b_domain_adapt.yaml"),
                              "--model", str(LLAMA), "--gpus", "64", "--gpu", "H100")
    assert items["memory"] != "unknown"


def test_local_model_folder_is_read(tmp_path: Path) -> None:
    (tmp_path / "llama").mkdir()
    shutil.copy(LLAMA, tmp_path / "llama" / "config.json")
    model = {"name": "hf_causal_lm", "pretrained_model_name_or_path": "./llama",
             "pretrained": False}
    src = read_config(_write(tmp_path, _with(model=model)))
    assert src.refs["hf_config"] == tmp_path / "llama" / "config.json"
    assert "model" not in src.unresolved and "init" not in src.data
    plan = load_plan(configs=[tmp_path / "train.yaml"]).plan
    assert plan.model is not None and plan.model.num_params == 6_738_415_616
    # Overrides of the saved shape are not applied: the model is unknown, not wrong.
    model["config_overrides"] = {"num_hidden_layers": 8}
    src = read_config(_write(tmp_path, _with(model=model)))
    assert "model" in src.unresolved and "num_hidden_layers" in _c006(src)["model.config_overrides"]


def test_adapters_and_frozen_parameters_leave_memory_unknown(tmp_path: Path) -> None:
    model = {"name": "hf_causal_lm", "pretrained_model_name_or_path": "x/y",
             "peft_config": {"peft_type": "LORA", "r": 16}}
    src = read_config(_write(tmp_path, _with(model=model)))
    assert "model.trainable_parameters" in src.unresolved
    src = read_config(_write(tmp_path, _with(optimizer__disable_grad="transformer.wte")))
    assert "model.trainable_parameters" in src.unresolved


@pytest.mark.parametrize("micro", ["auto", None])
def test_auto_micro_batch_is_unresolved_not_guessed(tmp_path: Path, micro: object) -> None:
    src = read_config(_write(tmp_path, _with(device_train_microbatch_size=micro)))
    assert "micro_batch_size" not in src.data["batch"]
    assert "batch.micro_batch_size" in src.unresolved
    (message,) = [m for k, m in _c006(src).items() if k.startswith("device_train")]
    assert '"auto"' in message
    # The command line resolves it.
    res = json.loads(check("--config", str(tmp_path / "train.yaml"), "--micro-batch", "4",
                           "--gpus", "8", "--gpu", "H100", "-f", "json").stdout)
    assert "batch.micro_batch_size" not in res["summary"]["unresolved"]


def test_interpolations_resolve_within_the_file_and_nowhere_else(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(variables={"max_seq_len": 4096})))
    assert src.data["batch"]["seq_len"] == 4096
    assert src.origin["batch.seq_len"] == "train_loader.dataset.max_seq_len"
    env = _with(global_train_batch_size="${oc.env:GLOBAL_BATCH}")
    src = read_config(_write(tmp_path, env))
    assert "global_batch_size" not in src.data["batch"]
    assert "oc.env" in _c006(src)["global_train_batch_size"]


@pytest.mark.parametrize(("changes", "warmup", "total"), [
    ({"scheduler__t_warmup": "0.01dur", "max_duration": "4800ba"}, 48, 4800),
    ({"scheduler__t_warmup": "1000sp"}, 4, 1000),  # ceil(1000 / 256)
    ({"scheduler__t_warmup": "1e8tok", "max_duration": "1e9tok"},
     math.ceil(1e8 / (256 * 1024)), math.ceil(1e9 / (256 * 1024))),
    ({"scheduler__t_warmup": "0ba"}, 0, 1000),
])
def test_composer_time_strings_become_steps(tmp_path: Path, changes: dict, warmup: int,
                                            total: int) -> None:
    src = read_config(_write(tmp_path, _with(**changes)))
    assert src.data["schedule"]["warmup_steps"] == warmup
    assert src.data["schedule"]["total_steps"] == total
    assert src.unresolved == []


@pytest.mark.parametrize(("changes", "key", "field"), [
    ({"max_duration": "2ep"}, "max_duration", "schedule.total_steps"),
    ({"max_duration": 3}, "max_duration", "schedule.total_steps"),  # Composer: epochs
    ({"scheduler__t_warmup": "0.05dur", "max_duration": "1ep"}, "scheduler.t_warmup",
     "schedule.warmup_steps"),
    ({"scheduler__t_warmup": "1000tok", "train_loader__name": "finetuning"},
     "scheduler.t_warmup", "schedule.warmup_steps"),
])
def test_lengths_the_file_cannot_give_in_steps_are_unknown(tmp_path: Path, changes: dict,
                                                           key: str, field: str) -> None:
    src = read_config(_write(tmp_path, _with(**changes)))
    assert field in src.unresolved and key in _c006(src)


# ---- how Composer runs it ------------------------------------------------------------------
def test_precision_without_fsdp_is_autocast_and_fp16_is_scaled(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(fsdp_config=None, precision="amp_fp16")))
    assert src.data["precision"] == {"dtype": "fp16", "loss_scaling": {"mode": "dynamic"},
                                     "autocast": True}
    assert src.data["parallel"]["zero_stage"] == 0
    src = read_config(_write(tmp_path, _with(fsdp_config__mixed_precision="FULL")))
    assert src.data["precision"]["autocast"] is True
    src = read_config(_write(tmp_path, _with(precision=None)))
    assert src.data["precision"]["dtype"] == "bf16"
    assert src.origin["precision.dtype"] == "precision (llm-foundry TrainConfig default)"


def test_sharding_offload_and_checkpointing(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(fsdp_config={
        "sharding_strategy": "SHARD_GRAD_OP", "cpu_offload": True,
        "activation_checkpointing": True, "activation_cpu_offload": True})))
    assert src.data["parallel"] == {
        "zero_stage": 2, "offload_params": "cpu", "offload_optimizer": "cpu",
        "checkpointing": {"granularity": "full", "cpu_offload": True}}
    src = read_config(_write(tmp_path, _with(fsdp_config={"activation_cpu_offload": True})))
    assert "parallel.checkpointing.cpu_offload" in src.unresolved


def test_ffn_tensor_parallelism_is_unknown(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(tp_config={"strategy": "ffn",
                                                        "tensor_parallel_degree": 2})))
    assert "parallel.tp" in src.unresolved and "tp" not in src.data["parallel"]


def test_pure_bf16_master_weights(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(model__master_weights_dtype="bf16", fsdp_config=None)))
    p = src.data["precision"]
    assert (p["master_weights"], p["optimizer_states"], p["grad_dtype"]) == ("bf16",) * 3
    assert p["autocast"] is False


def test_mpt_variants(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(
        model__attn_config={"attn_type": "grouped_query_attention", "kv_n_heads": 2,
                            "rope": True, "rope_theta": 500000, "attn_impl": "torch"},
        model__ffn_config={"ffn_type": "mptglu", "ffn_act_fn": {"name": "silu"},
                           "ffn_hidden_size": 1408},
        model__norm_type="rmsnorm", model__no_bias=True,
        model__init_config={"name": "baseline_", "init_std": 0.02,
                            "init_div_is_residual": False})))
    m = src.data["model"]
    assert (m["num_kv_heads"], m["position_encoding"], m["rope_theta"]) == (2, "rope", 500000)
    assert (m["activation"], m["ffn_hidden_size"], m["attention_impl"]) == \
        ("swiglu", 1408, "eager")
    assert (m["norm_type"], m["mlp_bias"], m["attention_bias"]) == ("rmsnorm", False, False)
    assert src.data["init"] == {"std": 0.02, "residual_scaling": "none"}


def test_moe_ffn_leaves_the_model_unknown(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(model__ffn_config={
        "ffn_type": "mb_dmoe", "moe_num_experts": 4, "moe_top_k": 2})))
    assert "model" in src.unresolved and "model" not in src.data


def test_clipping(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, BASE))
    assert src.data["clipping"] == {"max_norm": None}
    src = read_config(_write(tmp_path, _with(algorithms={"gradient_clipping": {
        "clipping_type": "adaptive", "clipping_threshold": 0.01}})))
    assert "clipping.max_norm" in src.unresolved


def test_global_batch_the_gpus_share_caps_the_micro_batch() -> None:
    """mpt-7b_dolly_sft.yaml on 8 GPUs: 48 sequences are 6 per GPU, so Composer lowers the
    micro-batch of 8 to 6 (calculate_batch_size_info): no batch error."""
    _, codes, derived, _ = verdicts("--config", str(LF / "mpt-7b_dolly_sft.yaml"),
                                    "--model", str(LLAMA), "--gpus", "8", "--gpu", "H100")
    assert "C101" not in codes and "C102" not in codes
    assert derived["gradient_accumulation"] == 1
    # A global batch the GPUs do not divide is refused by llm-foundry: still reported.
    _, codes, _, _ = verdicts("--config", str(LF / "mpt-7b_dolly_sft.yaml"), "--model",
                              str(LLAMA), "--gpus", "7", "--gpu", "H100")
    assert "C102" in codes


# ---- keys and bad values ----------------------------------------------------------------
def test_examples_unknown_keys() -> None:
    """1b_local_data_sft.yaml keeps a YAML anchor under a top-level ``dataset:``, which
    TrainConfig refuses ("Unused parameters"); the other examples use known keys only."""
    for path in YAMLS:
        found = [f.data["key"] for f in read_config(path).findings if f.code == "C005"]
        assert found == (["dataset"] if path.name == "1b_local_data_sft.yaml" else []), path


@pytest.mark.parametrize(("changes", "key", "hint"), [
    ({"global_train_batch_sise": 8}, "global_train_batch_sise", "global_train_batch_size"),
    ({"fsdp_config__sharding_stratgy": "FULL_SHARD"}, "fsdp_config.sharding_stratgy",
     "fsdp_config.sharding_strategy"),
    ({"model__n_head": 8}, "model.n_head", "model.n_heads"),
    ({"optimizer__weight_decy": 0.1}, "optimizer.weight_decy", "optimizer.weight_decay"),
])
def test_typos_are_c005_with_the_suggestion(tmp_path: Path, changes: dict, key: str,
                                            hint: str) -> None:
    src = read_config(_write(tmp_path, _with(**changes)))
    found = {f.data["key"]: f.data["suggestion"] for f in src.findings if f.code == "C005"}
    assert found == {key: hint}


@pytest.mark.parametrize(("changes", "parts"), [
    ({"device_train_microbatch_size": "two"}, ["device_train_microbatch_size", "'two'"]),
    ({"precision": "amp_fp7"}, ["precision: invalid value (got 'amp_fp7')", "amp_bf16"]),
    ({"fsdp_config__sharding_strategy": "QUARTER"}, ["fsdp_config.sharding_strategy",
                                                     "FULL_SHARD"]),
    ({"model__d_model": float("nan")}, ["model.d_model", "an integer"]),
    ({"model__d_model": 10**30}, ["model.d_model"]),
    ({"model__n_layers": -3}, ["model.n_layers", "≥ 1"]),
    ({"optimizer__betas": [0.9]}, ["optimizer.betas", "two numbers"]),
    ({"optimizer__lr": [[[[1e-4]]]]}, ["optimizer.lr", "a number"]),
    ({"scheduler__t_warmup": "100 batches"}, ["scheduler.t_warmup", "Composer time"]),
    ({"scheduler__t_warmup": 100}, ["scheduler.t_warmup", "with its unit"]),
    ({"max_duration": "1.5ba"}, ["max_duration", "whole number"]),
    ({"global_train_batch_size": True}, ["global_train_batch_size", "an integer"]),
])
def test_bad_values_are_one_line(tmp_path: Path, changes: dict, parts: list[str]) -> None:
    one_line_error(_write(tmp_path, _with(**changes)), *parts)


def test_huge_values_are_refused_by_the_plan(tmp_path: Path) -> None:
    """A value of the right type past what any job has is refused by the plan's bounds,
    naming the value and the range."""
    res = check("--config", str(_write(tmp_path, _with(model__d_model=10**9))))
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "1000000000" in res.output and "model.hidden_size" in res.output


# ---- hostile input ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("llmfoundry")
    shutil.copytree(LF, folder, dirs_exist_ok=True)
    return folder


@stable_settings(200)
@given(case=st.sampled_from(YAMLS).flatmap(
    lambda p: st.tuples(st.just(p), mutated(p.read_bytes()))), cli=st.integers(0, 9))
def test_mutated_examples_never_crash(scratch: Path, case: tuple[Path, bytes], cli: int) -> None:
    path, data = case
    hostile_case(scratch, path.name, data, cli == 0)
