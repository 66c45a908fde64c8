"""Nanotron YAML -> Plan: layout, batch, precision, the Llama/Qwen2 model and its init,
optimizer and schedule as Nanotron runs them; values Nanotron requires and the file
lacks left unknown; dacite's strict keys for typos; bad values as one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import stable_settings
from tests.plan.launch_support import (
    EXAMPLES,
    c006_by_key,
    changed,
    hostile_case,
    one_line_error,
    same_verdicts,
    verdicts,
)
from tests.plan.test_hostile_property import mutated

from sapper.plan.readers.base import Sniff
from sapper.plan.readers.registry import detect_config, read_config

NT = EXAMPLES / "nanotron"
YAMLS = sorted(NT.glob("*.yaml"))
TINY = yaml.safe_load((NT / "config_tiny_llama.yaml").read_text())


def _write(tmp_path: Path, config: dict, name: str = "nanotron.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


_DROP = object()


def _with(**changes: object) -> dict:
    """config_tiny_llama.yaml with dotted keys (``__``) changed; _DROP removes one."""
    return changed(TINY, drop=_DROP, **changes)


_c006 = c006_by_key


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_every_example_is_read_as_nanotron(path: Path) -> None:
    assert detect_config(Sniff.of(path)).name == "nanotron"
    src = read_config(path)
    assert src.unresolved == []
    found = sorted(f.data["key"] for f in src.findings if f.code == "C005")
    expected = (["model.model_config.interleaved_rotary", "parallelism.moe_layer_recompute"]
                if path.name == "config_resume_training.yaml" else [])
    assert found == expected


def test_tiny_llama_value_by_value() -> None:
    """examples/config_tiny_llama.yaml, checked by hand against the file and Nanotron's
    dataclass defaults."""
    src = read_config(NT / "config_tiny_llama.yaml")
    assert src.data == {
        "framework": "torch",
        "parallel": {"dp": 4, "tp": 2, "pp": 1,
                     "cp": 1,  # context_parallel_size default
                     "ep": 1, "sequence_parallel": True,  # tp_mode REDUCE_SCATTER
                     "checkpointing": {"granularity": "none"},  # recompute_layer default
                     "zero_stage": 0},
        "hardware": {"num_gpus": 8},  # dp × tp × pp × cp: Nanotron's WORLD_SIZE
        "batch": {"micro_batch_size": 3, "gradient_accumulation_steps": 1, "seq_len": 4096},
        "schedule": {"total_steps": 2000, "warmup_steps": 2, "min_lr": 1e-5, "type": "cosine"},
        # dtype bfloat16 with accumulate_grad_in_fp32: fp32 weights and gradients for the step.
        "precision": {"dtype": "bf16", "autocast": False, "loss_scaling": {"mode": "none"},
                      "master_weights": "fp32", "grad_dtype": "fp32"},
        "model": {
            "family": "llama", "hidden_size": 2048, "num_heads": 16, "num_layers": 28,
            "num_kv_heads": 2, "ffn_hidden_size": 11008, "activation": "swiglu",
            "hidden_act": "silu",
            "vocab_size": 128256,  # a multiple of make_vocab_size_divisible_by 1 × tp 2
            "max_position_embeddings": 128256, "position_encoding": "rope",
            "rope_theta": 10000.0,  # LlamaConfig default
            "norm_type": "rmsnorm", "norm_placement": "pre",
            "attention_bias": False,  # LlamaConfig default
            "mlp_bias": False, "tied_embeddings": True, "dropout": 0.0,
        },
        # RandomInit std 0.025, scaling_method NUM_LAYERS (default): o_proj/down_proj / √(2L).
        "init": {"std": 0.025, "residual_scaling": "depth"},
        "optimizer": {"weight_decay": 0.01, "type": "adamw", "eps": 1e-8, "betas": [0.9, 0.95],
                      "fused": True, "lr": 3e-4},
        "clipping": {"max_norm": 1.0},
    }
    assert src.findings == []
    assert src.origin["model.rope_theta"] == \
        "model.model_config.rope_theta (Nanotron LlamaConfig default)"
    assert src.origin["hardware.num_gpus"].startswith("parallelism.dp × tp × pp")


def test_same_verdicts_as_the_hand_written_plan(tmp_path: Path) -> None:
    loader = same_verdicts(NT / "config_qwen.yaml", {
        "framework": "torch",
        "parallel": {"dp": 2, "tp": 2, "pp": 1, "cp": 1, "ep": 1, "sequence_parallel": True,
                     "checkpointing": {"granularity": "none"}, "zero_stage": 0},
        "hardware": {"num_gpus": 4},
        "batch": {"micro_batch_size": 3, "gradient_accumulation_steps": 1, "seq_len": 4096},
        "schedule": {"total_steps": 32000, "warmup_steps": 2, "min_lr": 1e-5, "type": "cosine"},
        "precision": {"dtype": "bf16", "autocast": False, "loss_scaling": {"mode": "none"},
                      "master_weights": "fp32", "grad_dtype": "fp32"},
        "model": {"family": "qwen2", "hidden_size": 2048, "num_heads": 16, "num_layers": 36,
                  "num_kv_heads": 4, "ffn_hidden_size": 11008, "activation": "swiglu",
                  "hidden_act": "silu", "vocab_size": 128256, "max_position_embeddings": 4096,
                  "position_encoding": "rope", "rope_theta": 10000.0, "norm_type": "rmsnorm",
                  "norm_placement": "pre", "attention_bias": False, "mlp_bias": False,
                  "tied_embeddings": True, "dropout": 0.0},
        "init": {"std": 0.025, "residual_scaling": "depth"},
        "optimizer": {"weight_decay": 0.01, "type": "adamw", "eps": 1e-8, "betas": [0.9, 0.95],
                      "fused": True, "lr": 3e-4},
        "clipping": {"max_norm": 1.0},
    }, tmp_path, "--gpu", "H100")
    assert loader == []


def test_moe_example() -> None:
    m = read_config(NT / "config_qwen_with_moe.yaml").data["model"]
    assert (m["num_experts"], m["experts_top_k"]) == (8, 1)
    # moe_intermediate_size and shared_expert_intermediate_size: MoEConfig's defaults.
    assert (m["moe_ffn_hidden_size"], m["shared_expert_ffn_hidden_size"]) == (1408, 5632)


def test_resuming_means_pretrained_weights() -> None:
    src = read_config(NT / "config_resume_training.yaml")
    assert src.data["init"]["from_pretrained"] is True
    assert src.origin["init.from_pretrained"] == "checkpoints.resume_checkpoint_path"


# ---- what Nanotron requires and the file lacks ---------------------------------------------
@pytest.mark.parametrize(("key", "field"), [
    ("tokens__micro_batch_size", "batch.micro_batch_size"),
    ("tokens__train_steps", "schedule.total_steps"),
    ("parallelism__dp", "parallel.dp"),
    ("optimizer__clip_grad", "clipping.max_norm"),
    ("optimizer__accumulate_grad_in_fp32", "precision.master_weights"),
    ("optimizer__optimizer_factory__adam_eps", "optimizer.eps"),
    ("optimizer__learning_rate_scheduler__lr_warmup_style", "schedule.warmup_steps"),
    ("model__init_method", "init.std"),
])
def test_required_values_missing_are_unknown(tmp_path: Path, key: str, field: str) -> None:
    src = read_config(_write(tmp_path, _with(**{key: _DROP})))
    assert field in src.unresolved
    assert key.replace("__", ".") in _c006(src)


def test_a_null_clip_grad_turns_clipping_off(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(optimizer__clip_grad=None)))
    assert src.data["clipping"] == {"max_norm": None}


# ---- how Nanotron runs it --------------------------------------------------------------------
def test_schedule_defaults(tmp_path: Path) -> None:
    """min_decay_lr defaults to the learning rate (no decay); a constant warmup starts at
    the peak; a decay starting after the warmup is warmup-stable-decay."""
    s = "optimizer__learning_rate_scheduler__"
    src = read_config(_write(tmp_path, _with(**{f"{s}min_decay_lr": _DROP})))
    assert src.data["schedule"]["type"] == "constant"
    assert src.data["schedule"]["min_lr"] == 3e-4
    src = read_config(_write(tmp_path, _with(**{f"{s}lr_warmup_style": "constant"})))
    assert src.data["schedule"]["warmup_steps"] == 0
    src = read_config(_write(tmp_path, _with(**{f"{s}lr_decay_starting_step": 1500})))
    assert src.data["schedule"]["type"] == "wsd"


def test_bf16_without_fp32_accumulation(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(optimizer__accumulate_grad_in_fp32=False)))
    p = src.data["precision"]
    assert (p["master_weights"], p["optimizer_states"], p["grad_dtype"]) == ("bf16",) * 3


def test_zero_stages_above_one_are_zero_one(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(optimizer__zero_stage=3)))
    assert src.data["parallel"]["zero_stage"] == 1
    assert "ZeRO 1" in src.origin["parallel.zero_stage"]


def test_pipeline_and_recompute(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(parallelism__pp=2, parallelism__recompute_layer=True,
                                             parallelism__tp_mode="ALL_REDUCE")))
    p = src.data["parallel"]
    assert (p["pp"], p["pipeline_schedule"], p["sequence_parallel"]) == (2, "1f1b", False)
    assert p["checkpointing"] == {"granularity": "full"}
    assert src.data["hardware"]["num_gpus"] == 16
    src = read_config(_write(tmp_path, _with(parallelism__pp=2, parallelism__pp_engine=_DROP)))
    assert src.data["parallel"]["pipeline_schedule"] == "gpipe"  # AllForwardAllBackward


def test_vocabulary_padding_and_from_the_dataset(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(model__make_vocab_size_divisible_by=128,
                                             model__model_config__vocab_size=50257)))
    assert src.data["model"]["vocab_size"] == 50432  # ceil(50257 / 256) × 256
    src = read_config(NT / "config_qwen.yaml")
    assert src.data["model"]["vocab_size"] == 128256
    qwen = yaml.safe_load((NT / "config_qwen.yaml").read_text())
    qwen["model"]["model_config"]["vocab_size"] = -1
    src = read_config(_write(tmp_path, qwen))
    assert src.data["model"]["vocab_size"] == 128256
    assert src.origin["model.vocab_size"].startswith("data_stages.0.data.dataset.vocab_size")


def test_init_methods(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(model__init_method={"use_mup": True})))
    assert "init.std" in src.unresolved
    src = read_config(_write(tmp_path, _with(model__init_method={"path": "/ckpt"})))
    assert src.data["init"] == {"from_pretrained": True}
    src = read_config(_write(tmp_path, _with(model__init_method={"std": 0.02,
                                                                 "scaling_method": "NONE"})))
    assert src.data["init"] == {"std": 0.02, "residual_scaling": "none"}


def test_starcoder2_leaves_the_model_unknown(tmp_path: Path) -> None:
    config = _with(model__model_config={"is_starcoder2_config": True, "hidden_size": 2048,
                                        "num_attention_heads": 16, "num_hidden_layers": 24,
                                        "num_kv_heads": 2, "vocab_size": 49152})
    src = read_config(_write(tmp_path, config))
    assert "model" in src.unresolved and "model" not in src.data
    items, _, _, _ = verdicts("--config", str(tmp_path / "nanotron.yaml"), "--gpu", "H100")
    assert items["memory"] == "unknown"


def test_a_data_stage_of_another_length_is_unknown(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(data_stages__0__sequence_length=8192)))
    assert "batch.seq_len" in src.unresolved


# ---- keys, bad values -----------------------------------------------------------------------
@pytest.mark.parametrize(("changes", "key", "hint"), [
    ({"tokens__micro_batch_sise": 3}, "tokens.micro_batch_sise", "tokens.micro_batch_size"),
    ({"parallelism__expert_paralel_size": 1}, "parallelism.expert_paralel_size",
     "parallelism.expert_parallel_size"),
    ({"model__model_config__num_hidden_layer": 4}, "model.model_config.num_hidden_layer",
     "model.model_config.num_hidden_layers"),
    ({"data_stages__0__data__seeed": 1}, "data_stages.0.data.seeed", "data_stages.0.data.seed"),
])
def test_typos_are_c005_with_the_suggestion(tmp_path: Path, changes: dict, key: str,
                                            hint: str) -> None:
    src = read_config(_write(tmp_path, _with(**changes)))
    found = {f.data["key"]: f.data["suggestion"] for f in src.findings if f.code == "C005"}
    assert found == {key: hint}


@pytest.mark.parametrize(("changes", "parts"), [
    ({"parallelism__tp": 0}, ["parallelism.tp: invalid value (got 0)", "≥ 1"]),
    ({"tokens__sequence_length": "long"}, ["tokens.sequence_length", "an integer"]),
    ({"model__dtype": "float8"}, ["model.dtype", "bfloat16"]),
    ({"parallelism__tp_mode": "SCATTER"}, ["parallelism.tp_mode", "REDUCE_SCATTER"]),
    ({"optimizer__optimizer_factory__adam_beta2": 1.5},
     ["optimizer.optimizer_factory.adam_beta2", "≤ 1"]),
    ({"optimizer__learning_rate_scheduler__lr_decay_style": "exp"},
     ["lr_decay_style", "cosine"]),
    ({"model__model_config__hidden_size": float("nan")}, ["model.model_config.hidden_size"]),
    ({"tokens": [1, 2]}, ["tokens", "a mapping"]),
    ({"model__init_method": "normal"}, ["model.init_method", "std"]),
])
def test_bad_values_are_one_line(tmp_path: Path, changes: dict, parts: list[str]) -> None:
    one_line_error(_write(tmp_path, _with(**changes)), *parts)


# ---- hostile input ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("nanotron")
    shutil.copytree(NT, folder, dirs_exist_ok=True)
    return folder


@stable_settings(200)
@given(case=st.sampled_from(YAMLS).flatmap(
    lambda p: st.tuples(st.just(p), mutated(p.read_bytes()))), cli=st.integers(0, 9))
def test_mutated_examples_never_crash(scratch: Path, case: tuple[Path, bytes], cli: int) -> None:
    path, data = case
    hostile_case(scratch, path.name, data, cli == 0)
