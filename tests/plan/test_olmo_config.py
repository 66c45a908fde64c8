"""OLMo trainer YAML -> Plan: the model from ModelConfig with its defaults, batch and
FSDP, scheduler units in steps or tokens, what the file cannot give left unknown, typos,
bad values as one line; llm-foundry and OLMo configs told apart; Python recipes of
OLMo-core, NeMo 2 and Megatron-Bridge refused with what to pass instead."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import stable_settings
from tests.plan.launch_support import (
    EXAMPLES,
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

from sapper.plan.readers.base import Sniff
from sapper.plan.readers.registry import detect_config, formats, read_config

OLMO = EXAMPLES / "olmo"
YAMLS = sorted(OLMO.glob("*.yaml"))

BASE: dict = {
    "run_name": "test",
    "model": {"d_model": 1024, "n_heads": 16, "n_layers": 16, "mlp_ratio": 8,
              "block_type": "sequential", "layer_norm_type": "rms", "rope": True,
              "max_sequence_length": 2048, "vocab_size": 50280, "embedding_size": 50304,
              "include_bias": False, "weight_tying": False, "init_fn": "normal",
              "init_std": 0.02},
    "optimizer": {"name": "adamw", "learning_rate": 4.0e-4, "weight_decay": 0.1},
    "scheduler": {"name": "cosine_with_warmup", "t_warmup": 2000, "alpha_f": 0.1},
    "data": {"paths": ["part-0.npy"]},
    "max_duration": 10000,
    "global_train_batch_size": 512,
    "device_train_microbatch_size": 8,
    "precision": "amp_bf16",
    "fsdp": {"precision": "mixed"},
    "max_grad_norm": 1.0,
}


def _write(tmp_path: Path, config: dict, name: str = "olmo.yaml") -> Path:
    return write_yaml(tmp_path, config, name)


def _with(**changes: object) -> dict:
    """BASE with dotted keys changed (None removes the key)."""
    return changed(BASE, **changes)


_c006 = c006_by_key


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_every_example_is_read_as_olmo(path: Path) -> None:
    assert detect_config(Sniff.of(path)).name == "olmo"
    src = read_config(path)
    assert [f for f in src.findings if f.code == "C005"] == []
    assert src.data["model"]["family"] == "olmo"


def test_olmo_1b_value_by_value() -> None:
    """configs/official-0724/OLMo-1B.yaml, checked by hand against the file and OLMo's
    defaults."""
    src = read_config(OLMO / "OLMo-1B.yaml")
    assert src.data == {
        "framework": "torch",
        "model": {
            "hidden_size": 2048, "num_heads": 16, "num_layers": 16, "family": "olmo",
            "num_kv_heads": 16,  # neither n_kv_heads nor multi_query_attention: n_heads
            "activation": "swiglu",
            "ffn_hidden_size": 8192,  # mlp_ratio 8 × 2048, halved by SwiGLU
            "vocab_size": 50304,  # embedding_size, the table's rows
            "max_position_embeddings": 2048, "position_encoding": "rope",
            "rope_theta": 10000.0,  # ModelConfig default
            "norm_type": "layernorm", "norm_placement": "pre",
            "attention_bias": False, "mlp_bias": False, "tied_embeddings": True,
            "attention_impl": "sdpa",  # flash_attention: false
            "attention_dropout": 0.0, "hidden_dropout": 0.0, "embedding_dropout": 0.0,
        },
        # init_fn mitchell: 1/√d_model, output projections by 1/√(2·d·(layer+1)).
        "init": {"std": pytest.approx(1 / math.sqrt(2048)), "residual_scaling": "depth"},
        "batch": {"global_batch_size": 2048, "micro_batch_size": 8, "seq_len": 2048},
        # fsdp: precision mixed, sharding FULL_SHARD (FSDPConfig default); no checkpointing.
        "parallel": {"checkpointing": {"granularity": "none"}, "zero_stage": 3},
        "precision": {"dtype": "bf16", "loss_scaling": {"mode": "none"}, "autocast": False,
                      "grad_dtype": "fp32"},
        "optimizer": {"type": "adamw", "lr": 4.0e-4, "weight_decay": 0.1,
                      "eps": 1e-5,  # OptimizerConfig default
                      "betas": [0.9, 0.95]},
        "schedule": {"type": "cosine", "total_steps": 739_328, "warmup_steps": 2000,
                     "min_lr": pytest.approx(4.0e-5)},
        "clipping": {"max_norm": 1.0},
    }
    assert src.unresolved == [] and src.findings == []
    assert src.origin["model.rope_theta"] == "model.rope_theta (OLMo ModelConfig default)"
    assert src.origin["optimizer.eps"] == "optimizer.eps (OLMo OptimizerConfig default)"
    assert src.origin["parallel.zero_stage"] == \
        "fsdp.sharding_strategy (OLMo FSDPConfig default)"
    assert src.origin["batch.seq_len"] == "model.max_sequence_length"


def test_same_verdicts_as_the_hand_written_plan(tmp_path: Path) -> None:
    loader = same_verdicts(OLMO / "OLMo2-7B-stage2-seed42.yaml", {
        "framework": "torch",
        "model": {"hidden_size": 4096, "num_heads": 32, "num_layers": 32, "family": "olmo",
                  "num_kv_heads": 32, "activation": "swiglu", "ffn_hidden_size": 11008,
                  "vocab_size": 100352, "max_position_embeddings": 4096,
                  "position_encoding": "rope", "rope_theta": 500000, "norm_type": "rmsnorm",
                  "attention_bias": False, "mlp_bias": False, "tied_embeddings": False,
                  "attention_impl": "flash", "attention_dropout": 0.0,
                  "hidden_dropout": 0.0, "embedding_dropout": 0.0},
        "init": {"std": 0.02, "residual_scaling": "none", "from_pretrained": True},
        "batch": {"global_batch_size": 1024, "micro_batch_size": 2, "seq_len": 4096},
        "parallel": {"checkpointing": {"granularity": "none"}, "zero_stage": 3},
        "precision": {"dtype": "bf16", "loss_scaling": {"mode": "none"}, "autocast": False,
                      "grad_dtype": "fp32"},
        "optimizer": {"type": "adamw", "lr": 6.1499e-05, "weight_decay": 0.1, "eps": 1e-08,
                      "betas": [0.9, 0.95]},
        # 50e9T: ceil(50e9 / (1024 × 4096)) steps, as the file's own stop_at comment says.
        "schedule": {"type": "linear", "total_steps": 11921, "warmup_steps": 0, "min_lr": 0.0},
        "clipping": {"max_norm": 1.0},
    }, tmp_path, "--gpus", "64", "--gpu", "H100")
    assert loader == []


# ---- steps, tokens, epochs ------------------------------------------------------------------
def test_token_units_convert_exactly(tmp_path: Path) -> None:
    """OLMo 2's stage-1 schedule: units tokens, warmup 8,388,608,000 tokens at 1024 × 4096
    tokens per step is 2000 steps; t_max 5e12 tokens."""
    src = read_config(_write(tmp_path, _with(
        global_train_batch_size=1024, model__max_sequence_length=4096, max_duration="1ep",
        scheduler={"name": "cosine_with_warmup", "units": "tokens", "t_warmup": 8388608000,
                   "t_max": 5e12, "alpha_f": 0.1})))
    s = src.data["schedule"]
    assert s["warmup_steps"] == 2000
    assert s["total_steps"] == math.ceil(5e12 / (1024 * 4096))
    assert src.origin["schedule.total_steps"] == "scheduler.t_max (scheduler.units)"
    assert src.unresolved == []  # the schedule's length is t_max, whatever max_duration


def test_olmo_7b_tokens_duration() -> None:
    src = read_config(OLMO / "OLMo-7B.yaml")
    assert src.data["schedule"]["total_steps"] == math.ceil(2e12 / (2048 * 2048))
    assert src.data["schedule"]["type"] == "linear"


def test_epochs_are_unknown(tmp_path: Path) -> None:
    src = read_config(OLMO / "peteish7-weka-microanneal-from928646_pes2o.yaml")
    assert src.unresolved == ["schedule.total_steps"]
    assert "1ep" in _c006(src)["max_duration"]
    assert src.data["parallel"]["checkpointing"] == {"granularity": "full", "every_k_layers": 4}
    assert src.data["init"]["from_pretrained"] is True


def test_missing_precision_is_unknown_not_fp32(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(precision=None)))
    assert "dtype" not in src.data.get("precision", {})
    assert "precision.dtype" in src.unresolved and "precision" in _c006(src)


def test_interpolation_from_the_environment_is_unknown(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(device_train_microbatch_size="${oc.env:MICRO}")))
    assert "batch.micro_batch_size" in src.unresolved
    assert "oc.env" in _c006(src)["device_train_microbatch_size"]
    src = read_config(_write(tmp_path, _with(max_grad_norm="${optimizer.weight_decay}")))
    assert src.data["clipping"]["max_norm"] == 0.1


# ---- how OLMo runs it ------------------------------------------------------------------------
def test_fp16_has_no_loss_scaling_and_sapper_says_so(tmp_path: Path) -> None:
    path = _write(tmp_path, _with(precision="amp_fp16"))
    src = read_config(path)
    assert src.data["precision"]["loss_scaling"] == {"mode": "none"}
    assert "GradScaler" in src.origin["precision.loss_scaling.mode"]
    _, codes, _, _ = verdicts("--config", str(path), "--gpus", "8", "--gpu", "H100")
    assert any(code.startswith("N1") for code in codes), codes  # fp16 without scaling


@pytest.mark.parametrize(("changes", "zero", "autocast"), [
    ({"distributed_strategy": "ddp"}, 0, True),
    ({"fsdp": {"precision": None}}, 3, True),
    ({"fsdp": {"sharding_strategy": "SHARD_GRAD_OP"}}, 2, False),
    ({"fsdp": {"sharding_strategy": "NO_SHARD", "precision": "pure"}}, 0, False),
])
def test_strategies(tmp_path: Path, changes: dict, zero: int, autocast: bool) -> None:
    src = read_config(_write(tmp_path, _with(**changes)))
    assert src.data["parallel"]["zero_stage"] == zero
    assert src.data["precision"]["autocast"] is autocast


@pytest.mark.parametrize(("value", "expected"), [
    (True, {"granularity": "full"}),
    ("whole_layer", {"granularity": "full"}),
    ("one_in_three", {"granularity": "full", "every_k_layers": 3}),
    ("fine_grained", {"granularity": "selective"}),
    (False, {"granularity": "none"}),
])
def test_activation_checkpointing(tmp_path: Path, value: object, expected: dict) -> None:
    src = read_config(_write(tmp_path, _with(activation_checkpointing=value)))
    assert src.data["parallel"]["checkpointing"] == expected


def test_partial_checkpointing_is_unknown(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(activation_checkpointing="two_in_three")))
    assert "parallel.checkpointing.granularity" in src.unresolved


@pytest.mark.parametrize(("init", "std", "scaling"), [
    ({"init_fn": "normal", "init_std": 0.006}, 0.006, "none"),
    ({"init_fn": "full_megatron", "init_std": 0.01}, 0.01, "depth"),
    ({"init_fn": "mitchell"}, 1 / math.sqrt(1024), "depth"),
])
def test_init(tmp_path: Path, init: dict, std: float, scaling: str) -> None:
    model = {**BASE["model"], **init}
    src = read_config(_write(tmp_path, _with(model=model)))
    assert src.data["init"] == {"std": pytest.approx(std), "residual_scaling": scaling}


def test_model_defaults_and_gqa(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(model={"d_model": 512, "n_kv_heads": 2,
                                                    "layer_norm_type": "default",
                                                    "block_type": "llama"})))
    m = src.data["model"]
    assert (m["num_heads"], m["num_layers"], m["num_kv_heads"]) == (12, 12, 2)
    assert (m["ffn_hidden_size"], m["vocab_size"]) == (1024, 50304)  # 4 × 512 / 2
    assert (m["position_encoding"], m["attention_dropout"]) == ("learned", 0.1)
    assert src.data["optimizer"]["type"] == "adamw"  # BASE's; the default is lionw
    src = read_config(_write(tmp_path, _with(optimizer={"learning_rate": 1e-4})))
    assert src.data["optimizer"]["type"] == "lion" and "eps" not in src.data["optimizer"]


def test_adaptive_clipping_is_unknown(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, _with(max_grad_norm_ratio=1.5)))
    assert "clipping.max_norm" in src.unresolved
    src = read_config(_write(tmp_path, _with(max_grad_norm=None)))
    assert src.data["clipping"] == {"max_norm": None}


# ---- keys, bad values -----------------------------------------------------------------------
@pytest.mark.parametrize(("changes", "key", "hint"), [
    ({"model__d_modle": 2048}, "model.d_modle", "model.d_model"),
    ({"global_train_batch_sise": 8}, "global_train_batch_sise", "global_train_batch_size"),
    ({"scheduler__t_warmpu": 10}, "scheduler.t_warmpu", "scheduler.t_warmup"),
    ({"fsdp__sharding_strategi": "FULL_SHARD"}, "fsdp.sharding_strategi",
     "fsdp.sharding_strategy"),
])
def test_typos_are_c005_with_the_suggestion(tmp_path: Path, changes: dict, key: str,
                                            hint: str) -> None:
    src = read_config(_write(tmp_path, _with(**changes)))
    found = {f.data["key"]: f.data["suggestion"] for f in src.findings if f.code == "C005"}
    assert found == {key: hint}
    assert "stops at start" in next(f.message for f in src.findings if f.code == "C005")


@pytest.mark.parametrize(("changes", "parts"), [
    ({"precision": "bf16"}, ["precision: invalid value (got 'bf16')", "amp_bf16"]),
    ({"model__n_layers": "many"}, ["model.n_layers", "an integer"]),
    ({"model__d_model": float("inf")}, ["model.d_model"]),
    ({"model__init_fn": "kaiming_normal"}, ["model.init_fn", "NotImplementedError"]),
    ({"model__n_kv_heads": 4, "model__multi_query_attention": True},
     ["model.n_kv_heads", "not both"]),
    ({"model__rope": True, "model__alibi": True}, ["model.rope", "not both"]),
    ({"max_duration": "forever"}, ["max_duration", "tokens"]),
    ({"max_duration": 3.5}, ["max_duration"]),
    ({"scheduler__units": "epochs"}, ["scheduler.units", "steps / tokens"]),
    ({"activation_checkpointing": "one_in_nine"}, ["activation_checkpointing", "whole_layer"]),
    ({"optimizer__betas": "0.9, 0.95"}, ["optimizer.betas", "two numbers"]),
])
def test_bad_values_are_one_line(tmp_path: Path, changes: dict, parts: list[str]) -> None:
    one_line_error(_write(tmp_path, _with(**changes)), *parts)


def test_null_fsdp_with_the_fsdp_strategy_is_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, BASE)
    path.write_text(path.read_text().replace("fsdp:\n  precision: mixed", "fsdp: null"))
    one_line_error(path, "fsdp", "FSDP settings")


def test_deep_nesting_is_one_line(tmp_path: Path) -> None:
    deep: object = 0.1
    for _ in range(200):
        deep = [deep]
    one_line_error(_write(tmp_path, _with(optimizer__weight_decay=deep)), "nested deeper")
    deep = 0.1
    for _ in range(60):  # within YAML's limits: the reader names the key
        deep = [deep]
    one_line_error(_write(tmp_path, _with(optimizer__weight_decay=deep)),
                   "optimizer.weight_decay", "a number")


# ---- telling the formats apart -----------------------------------------------------------
def test_llmfoundry_and_olmo_are_told_apart(tmp_path: Path) -> None:
    """Both are Composer-era YAMLs (global_train_batch_size, device_train_microbatch_size,
    precision): OLMo's model has d_model with block_type/layer_norm_type and no name,
    llm-foundry's names its model and has train_loader/variables."""
    olmo = read_config(_write(tmp_path, BASE))
    assert olmo.format == "olmo"
    foundry = {k: v for k, v in BASE.items() if k != "data"}
    foundry["model"] = {"name": "mpt_causal_lm", "d_model": 1024, "n_heads": 16,
                        "n_layers": 16}
    foundry["train_loader"] = {"name": "text"}
    foundry["scheduler"] = {"name": "cosine_with_warmup", "t_warmup": "2000ba"}
    foundry["max_seq_len"] = 2048
    src = read_config(_write(tmp_path, foundry, "foundry.yaml"))
    assert src.format == "llmfoundry"
    by_name = {f.name: f for f in formats()}
    for path in sorted((EXAMPLES / "llmfoundry").glob("*.yaml")):
        assert by_name["olmo"].recognise(Sniff.of(path)) == 0.0, path
    for path in YAMLS:
        assert by_name["llmfoundry"].recognise(Sniff.of(path)) == 0.0, path


# ---- Python recipes ------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "what"), [
    ("from olmo_core.nn.transformer import TransformerConfig\n"
     "model = TransformerConfig.olmo2_1B(vocab_size=100352)\n", "OLMo-core"),
    ("import nemo_run as run\nfrom nemo.collections import llm\n\n"
     "recipe = llm.llama3_8b.pretrain_recipe(num_nodes=1)\n", "NeMo 2"),
    ("from nemo.collections.llm.recipes import llama3_8b\n", "NeMo 2"),
    ("from megatron.bridge.recipes.llama.llama3 import llama3_8b_pretrain_config\n"
     "cfg = llama3_8b_pretrain_config()\n", "Megatron-Bridge"),
])
def test_python_recipes_are_refused_with_what_to_pass(tmp_path: Path, text: str,
                                                      what: str) -> None:
    path = tmp_path / "train.py"
    path.write_text(f'"""A training recipe."""\n{text}')
    line = one_line_error(path, what, "--model", "config.json")
    assert "never runs code" in line


def test_a_python_file_of_something_else_is_not_called_a_recipe(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text("import torch\n# olmo_core is not imported here\nprint('hi')\n")
    res = check("--config", str(path))
    assert res.exit_code == 2 and "not a config sapper can read" in res.output
    assert "never runs code" not in res.output


# ---- hostile input ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("olmo")
    shutil.copytree(OLMO, folder, dirs_exist_ok=True)
    return folder


@stable_settings(150)
@given(case=st.sampled_from(YAMLS).flatmap(
    lambda p: st.tuples(st.just(p), mutated(p.read_bytes()))), cli=st.integers(0, 9))
def test_mutated_examples_never_crash(scratch: Path, case: tuple[Path, bytes], cli: int) -> None:
    path, data = case
    hostile_case(scratch, path.name, data, cli == 0)


def test_check_reads_an_example_end_to_end() -> None:
    res = check("--config", str(OLMO / "OLMo-1B.yaml"), "--gpus", "64", "--gpu", "H100")
    assert res.exit_code == 0, res.output
    assert "parameters 1,176,899,584" in " ".join(res.output.split())
