"""LitGPT YAML -> Plan: the command the keys imply, LitGPT's defaults per command, the
model from its config table, an inline model_config or a local checkpoint, Fabric's
precisions, floored gradient accumulation, adapters left unknown, typos, hostile values."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import stable_settings
from tests.plan.launch_support import EXAMPLES, check, hostile_case, one_line_error
from tests.plan.test_hostile_property import mutated

from sapper.plan.load import load_plan
from sapper.plan.readers.base import Sniff
from sapper.plan.readers.litgpt import config_shape
from sapper.plan.readers.litgpt_keys import MODELS
from sapper.plan.readers.registry import detect_config, formats, read_config

LG = EXAMPLES / "litgpt"
YAMLS = sorted(LG.glob("*.yaml"))
TRAINABLE = "model.trainable_parameters"
HF = Path(__file__).parent.parent / "fixtures" / "hf"

PRETRAIN = {"model_name": "tiny-llama-1.1b", "precision": "bf16-mixed", "devices": 8,
            "train": {"global_batch_size": 512, "micro_batch_size": 4, "max_tokens": 10**9,
                      "max_seq_length": 2048, "max_norm": 1.0, "lr_warmup_steps": 100},
            "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 4e-4}}}
FINETUNE = {"checkpoint_dir": "checkpoints/meta-llama/Meta-Llama-3.1-8B",
            "precision": "bf16-true", "devices": 1,
            "train": {"global_batch_size": 16, "micro_batch_size": 2, "epochs": 1,
                      "max_seq_length": 1024}}


def _write(tmp_path: Path, config: dict, name: str = "litgpt.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def _c006(src) -> dict[str, str]:
    return {str(f.data.get("key")): f.message for f in src.findings if f.code == "C006"}


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_every_example_is_read_as_litgpt(path: Path) -> None:
    assert detect_config(Sniff.of(path)).name == "litgpt"
    src = read_config(path)
    assert src.data["framework"] == "lightning"
    assert "model" not in src.unresolved and src.data["model"]["num_params"] > 10**7
    assert not [f for f in src.findings if f.code == "C005"]


def test_other_formats_examples_are_not_litgpt() -> None:
    litgpt = next(f for f in formats() if f.name == "litgpt")
    others = [p for p in EXAMPLES.rglob("*") if p.is_file() and LG not in p.parents
              and p.suffix in (".yaml", ".yml", ".json", ".toml", ".sh", ".slurm", ".log")]
    assert others
    for path in others:
        assert litgpt.recognise(Sniff.of(path)) == 0.0, path


def test_lora_example_by_hand() -> None:
    """config_hub/finetune/llama-3.1-8b/lora.yaml, every value by hand against the file
    and LitGPT's defaults (litgpt finetune_lora on one device)."""
    src = read_config(LG / "llama-3.1-8b-lora.yaml")
    model = src.data.pop("model")
    assert src.data == {
        "framework": "lightning",
        "hardware": {"gpus_per_node": 1, "nodes": 1},  # devices: 1, num_nodes: 1
        "init": {"from_pretrained": True},  # checkpoint_dir
        # precision: bf16-true: Fabric converts the model, no fp32 copy, no autocast
        "precision": {"dtype": "bf16", "master_weights": "bf16", "optimizer_states": "bf16",
                      "grad_dtype": "bf16", "autocast": False,
                      "loss_scaling": {"mode": "none"}},
        # global 8 // 1 GPU // micro 1 = 8 accumulation steps; max_seq_length 512
        "batch": {"micro_batch_size": 1, "global_batch_size": 8,
                  "gradient_accumulation_steps": 8, "seq_len": 512},
        "parallel": {"zero_stage": 0, "checkpointing": {"granularity": "none"}},  # 1 GPU
        "optimizer": {"type": "adamw", "lr": 0.0002, "weight_decay": 0.0, "eps": 1e-08,
                      "betas": [0.9, 0.95]},
        # get_lr_scheduler: linear warmup over lr_warmup_steps, cosine to 0; no clipping
        "schedule": {"type": "cosine", "min_lr": 0.0, "warmup_steps": 10},
        "clipping": {"max_norm": None},
    }
    assert model["num_params"] == 8_030_261_248  # Llama-3.1-8B in litgpt/config.py
    assert (model["num_layers"], model["num_kv_heads"], model["vocab_size"]) == (32, 8, 128256)
    assert model["rope_scaling"] == {"type": "llama3", "factor": 8.0,
                                     "original_max_position_embeddings": 8192}
    assert src.origin["batch.gradient_accumulation_steps"] == (
        "train.global_batch_size // (devices × num_nodes) // train.micro_batch_size")
    assert src.unresolved == ["schedule.total_steps", TRAINABLE]
    assert "LoRA adapters (rank 32)" in _c006(src)["lora_r"]


def test_pretrain_example_defaults_and_unknowns() -> None:
    src = read_config(LG / "pretrain-tinyllama.yaml")
    assert src.data["precision"] == {"dtype": "bf16", "autocast": True,
                                     "loss_scaling": {"mode": "none"}}  # bf16-mixed
    assert src.data["schedule"] == {"type": "cosine", "min_lr": 4e-05, "warmup_steps": 2000}
    assert src.data["clipping"] == {"max_norm": 1.0}
    assert src.data["optimizer"]["fused"] is True  # pretrain.py: fused=True on CUDA
    assert src.data["batch"] == {"micro_batch_size": 4, "global_batch_size": 512,
                                 "seq_len": 2048}
    assert src.data["init"]["std"] == pytest.approx(math.sqrt(2 / 5 / 2048))
    # devices: auto: every GPU of the machine, so neither the GPUs nor the steps are known
    assert {"hardware.gpus_per_node", "schedule.total_steps"} <= set(src.unresolved)
    assert "hardware" not in src.data


def test_pretrain_steps_from_max_tokens(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, PRETRAIN))
    # GA = 512 // 8 // 4 = 16; steps = 10^9 // 8 // (4 × 2048) // 16
    assert src.data["batch"]["gradient_accumulation_steps"] == 16
    assert src.data["schedule"]["total_steps"] == 10**9 // 8 // (4 * 2048) // 16


def test_inline_model_config_and_tied_embeddings() -> None:
    """pretrain/tinystories.yaml: stories15M given inline, embeddings tied."""
    src = read_config(LG / "pretrain-tinystories.yaml")
    model = src.data["model"]
    assert (model["hidden_size"], model["num_layers"], model["head_dim"]) == (288, 6, 48)
    assert model["tied_embeddings"] is True
    assert model["num_params"] == 15_191_712


@pytest.mark.parametrize(
    ("name", "params"),
    [  # each equals LitGPT's GPT built on the meta device; the published sizes in brackets
        ("Llama-3.1-8B", 8_030_261_248),  # 8.03B
        ("tiny-llama-1.1b", 1_100_048_384),  # 1.1B
        ("phi-2", 2_779_683_840),  # 2.78B
        ("Mistral-7B-v0.1", 7_241_732_096),  # 7.24B
        ("Gemma-2b", 3_030_460_416),  # 2.51B with the head LitGPT keeps apart
        ("falcon-7b", 7_217_189_760),  # 7.22B
    ],
)
def test_litgpt_config_counts(name: str, params: int) -> None:
    assert config_shape({"name": name, **MODELS[name]}, "f", "model")["num_params"] == params


def test_full_finetune_on_several_gpus_shards_and_checkpoints() -> None:
    src = read_config(LG / "llama-3.1-8b-full.yaml")
    assert src.data["parallel"] == {"zero_stage": 3, "checkpointing": {"granularity": "full"}}
    assert TRAINABLE not in src.unresolved


def test_qlora_example_and_memory_unknown() -> None:
    src = read_config(LG / "phi-2-qlora.yaml")
    assert TRAINABLE in src.unresolved and "bnb.nf4" in _c006(src)["lora_r"]
    res = json.loads(check("--config", str(LG / "phi-2-qlora.yaml"), "--gpu", "H100",
                           "-f", "json").stdout)
    assert res["summary"]["items"]["memory"] == "unknown"


def test_floored_global_batch(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**PRETRAIN, "devices": 3}))
    # 512 // 3 // 4 = 42 micro-batches: 42 × 4 × 3 = 504 sequences per step
    assert src.data["batch"]["global_batch_size"] == 504
    assert "floored" in src.origin["batch.global_batch_size"]


def test_local_checkpoint_model_config(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints" / "my-model"
    folder.mkdir(parents=True)
    (folder / "model_config.yaml").write_text(yaml.safe_dump(
        {"name": "my-model", "n_layer": 2, "n_head": 4, "n_embd": 256, "vocab_size": 1000,
         "padding_multiple": 64, "mlp_class_name": "LLaMAMLP", "intermediate_size": 512,
         "norm_class_name": "RMSNorm", "bias": False, "parallel_residual": False}))
    src = read_config(_write(tmp_path, {**FINETUNE, "checkpoint_dir": str(folder)}))
    assert src.data["model"]["vocab_size"] == 1024 and src.data["model"]["num_layers"] == 2


def test_local_checkpoint_hf_config(tmp_path: Path) -> None:
    folder = tmp_path / "unknown-model"
    folder.mkdir()
    shutil.copy(HF / "llama-2-7b.json", folder / "config.json")
    src = read_config(_write(tmp_path, {**FINETUNE, "checkpoint_dir": str(folder)}))
    assert src.refs["hf_config"] == folder / "config.json"
    plan = load_plan(configs=[_write(tmp_path, {**FINETUNE, "checkpoint_dir": str(folder)})])
    assert plan.plan.model is not None and plan.plan.model.num_params == 6_738_415_616


def test_unknown_names_and_auto_precision_stay_unknown(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**PRETRAIN, "model_name": "my-secret-model",
                                        "precision": None}))
    assert {"model", "precision.dtype"} <= set(src.unresolved)
    assert "my-secret-model" in _c006(src)["model_name"]
    assert "GPU decides" in _c006(src)["precision"]


def test_precisions(tmp_path: Path) -> None:
    fp16 = read_config(_write(tmp_path, {**PRETRAIN, "precision": "16-true"}))
    assert fp16.data["precision"]["loss_scaling"] == {"mode": "none"}  # no GradScaler
    assert fp16.data["precision"]["master_weights"] == "fp16"
    mixed = read_config(_write(tmp_path, {**PRETRAIN, "precision": "16-mixed"}))
    assert mixed.data["precision"]["loss_scaling"] == {"mode": "dynamic"}
    te = read_config(_write(tmp_path, {**PRETRAIN, "precision": "transformer-engine"}))
    assert "precision.dtype" in te.unresolved


def test_typos_are_c005(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**PRETRAIN, "num_node": 2,
                                        "train": {**PRETRAIN["train"], "micro_batchsize": 2}}))
    found = {f.data["key"]: f.data["suggestion"] for f in src.findings if f.code == "C005"}
    assert found == {"num_node": "num_nodes", "train.micro_batchsize": "train.micro_batch_size"}


@pytest.mark.parametrize(
    ("config", "parts"),
    [
        ({**PRETRAIN, "train": {**PRETRAIN["train"], "micro_batch_size": 0}},
         ["train.micro_batch_size: invalid value (got 0)", "≥ 1"]),
        ({**PRETRAIN, "devices": "many"}, ["devices: invalid value (got 'many')"]),
        ({**PRETRAIN, "train": {**PRETRAIN["train"], "max_norm": float("nan")}},
         ["train.max_norm: invalid value (got nan)"]),
        ({**PRETRAIN, "train": {**PRETRAIN["train"], "global_batch_size": 4}},
         ["train.global_batch_size: invalid value (got 4)", "gradient accumulation"]),
        ({**PRETRAIN, "train": {**PRETRAIN["train"], "epochs": 3}},
         ["train.epochs: invalid value (got 3)", "max_tokens"]),
        ({**FINETUNE, "train": {**FINETUNE["train"], "max_norm": 1.0}},
         ["train.max_norm: invalid value (got 1.0)", "refuse"]),
        ({**FINETUNE, "lora_r": 8, "quantize": "bnb.nf4", "precision": "bf16-mixed"},
         ["precision", "Quantization and mixed precision"]),
        ({**FINETUNE, "quantize": "int3"}, ["quantize: invalid value (got 'int3')"]),
        ({**FINETUNE, "model_name": "phi-2"}, ["checkpoint_dir and model_name"]),
        ({**PRETRAIN, "model_name": None, "model_config": {"n_embd": 100, "n_head": 3}},
         ["model_config.n_head: invalid value (got 3)", "divisor of n_embd"]),
        ({**PRETRAIN, "optimizer": {"class_path": "torch.optim.AdamW",
                                    "init_args": {"betas": [0.9]}}},
         ["optimizer.init_args.betas: invalid value", "two numbers"]),
        ({**PRETRAIN, "train": {**PRETRAIN["train"], "micro_batch_size": 10**30}},
         ["train.global_batch_size: invalid value (got 512)", "LitGPT asserts"]),
        ({**PRETRAIN, "devices": "auto",
          "train": {**PRETRAIN["train"], "micro_batch_size": 10**30}},
         ["train.micro_batch_size (plan field batch.micro_batch_size)", "10^6"]),
    ],
)
def test_bad_values_are_one_line(tmp_path: Path, config: dict, parts: list[str]) -> None:
    one_line_error(_write(tmp_path, config), *parts)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("litgpt")
    shutil.copytree(LG, folder, dirs_exist_ok=True)
    return folder


@stable_settings(200)
@given(case=st.sampled_from(YAMLS).flatmap(
    lambda p: st.tuples(st.just(p), mutated(p.read_bytes()))), cli=st.integers(0, 9))
def test_mutated_examples_never_crash(scratch: Path, case: tuple[Path, bytes], cli: int) -> None:
    path, data = case
    hostile_case(scratch, path.name, data, cli == 0)
