"""LLaMA-Factory YAML -> Plan: cutoff_len as the sequence length, LLaMA-Factory's own
defaults (LoRA unless told, checkpointing on unless disabled), its DeepSpeed JSON with the
"auto" values the YAML fills, partial training and preference stages left to an unknown
memory verdict, its argument classes' keys for typos."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import stable_settings
from tests.plan.launch_support import (
    EXAMPLES,
    LLAMA,
    check,
    hostile_case,
    one_line_error,
    same_verdicts,
)
from tests.plan.test_hostile_property import mutated

from sapper.plan.load import load_plan
from sapper.plan.readers.base import Sniff
from sapper.plan.readers.registry import detect_config, read_config

LF = EXAMPLES / "llamafactory"
YAMLS = sorted(LF.glob("*.yaml"))
DS_JSON = LF / "examples" / "deepspeed" / "ds_z3_config.json"
HUB_UNKNOWN = ["model", "schedule.total_steps", "schedule.warmup_steps"]
TRAINABLE = "model.trainable_parameters"

BASE = {"model_name_or_path": "Qwen/Qwen3-4B-Instruct-2507", "stage": "sft", "do_train": True,
        "finetuning_type": "full", "dataset": "identity", "template": "qwen3_nothink",
        "cutoff_len": 4096, "per_device_train_batch_size": 2, "learning_rate": 1e-5,
        "max_steps": 1000, "bf16": True}


def _write(tmp_path: Path, config: dict, name: str = "lf.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def _codes(src) -> list[str]:
    return [f.code for f in src.findings]


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_every_example_is_read_as_llamafactory(path: Path) -> None:
    assert detect_config(Sniff.of(path)).name == "llamafactory"
    src = read_config(path)
    assert set(HUB_UNKNOWN) <= set(src.unresolved)
    assert "C005" not in _codes(src)  # LLaMA-Factory's own examples use only its keys


def test_the_deepspeed_json_it_names_is_read_as_deepspeed() -> None:
    assert detect_config(Sniff.of(DS_JSON)).name == "deepspeed"


def test_full_sft_example_by_hand() -> None:
    """LLaMA-Factory examples/train_full/qwen3_full_sft.yaml, every value by hand: the
    file's keys, LLaMA-Factory's checkpointing default, the installed transformers'
    defaults for what the file leaves out."""
    src = read_config(LF / "qwen3_full_sft.yaml")
    assert src.data == {
        "framework": "deepspeed",
        "init": {"from_pretrained": True},
        "batch": {"micro_batch_size": 1, "gradient_accumulation_steps": 2, "seq_len": 2048},
        "optimizer": {"type": "adamw", "fused": True, "lr": 1e-05, "weight_decay": 0.0,
                      "eps": 1e-08, "betas": [0.9, 0.999]},
        "schedule": {"type": "cosine"},
        "clipping": {"max_norm": 1.0},
        "parallel": {"checkpointing": {"granularity": "full"}},
        "precision": {"dtype": "bf16", "loss_scaling": {"mode": "none"}},
    }
    assert src.origin["batch.seq_len"] == "cutoff_len"
    assert src.origin["framework"] == "deepspeed"
    assert src.origin["parallel.checkpointing.granularity"] == (
        "disable_gradient_checkpointing (LLaMA-Factory default: false, so checkpointing is on)")
    assert src.origin["optimizer.type"].startswith("optim (transformers ")
    assert src.unresolved == HUB_UNKNOWN
    assert Path(src.refs["deepspeed"]).resolve() == DS_JSON.resolve()
    model = [f for f in src.findings if f.data.get("key") == "model_name_or_path"]
    assert len(model) == 1 and "Qwen/Qwen3-4B-Instruct-2507" in model[0].message


def test_deepspeed_autos_are_filled_by_the_yaml() -> None:
    """ds_z3_config.json leaves micro-batch, accumulation, clipping and bf16 "auto": the
    HF integration fills them from the Trainer's settings, and so does sapper."""
    plan = load_plan(configs=[LF / "qwen3_full_sft.yaml"]).plan
    assert plan.framework == "deepspeed" and plan.parallel.zero_stage == 3
    assert (plan.batch.micro_batch_size, plan.batch.gradient_accumulation_steps) == (1, 2)
    assert plan.precision.dtype == "bf16" and plan.clipping.max_norm == 1.0
    for field in ("batch.micro_batch_size", "batch.gradient_accumulation_steps",
                  "precision.dtype", "clipping.max_norm"):
        assert field not in plan.unresolved


def test_deepspeed_path_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llamafactory-cli opens the JSON from where it is started (the repository root)."""
    (tmp_path / "configs").mkdir()
    (tmp_path / "ds").mkdir()
    shutil.copy(DS_JSON, tmp_path / "ds" / "z3.json")
    path = _write(tmp_path / "configs", {**BASE, "deepspeed": "ds/z3.json"})
    monkeypatch.chdir(tmp_path)
    src = read_config(path)
    assert Path(src.refs["deepspeed"]).resolve() == (tmp_path / "ds" / "z3.json").resolve()
    missing = read_config(_write(tmp_path / "configs", {**BASE, "deepspeed": "nope.json"}))
    assert "parallel.zero_stage" in missing.unresolved
    assert missing.data["framework"] == "deepspeed"


def test_finetuning_type_defaults_to_lora(tmp_path: Path) -> None:
    config = {k: v for k, v in BASE.items() if k != "finetuning_type"}
    src = read_config(_write(tmp_path, config))
    assert TRAINABLE in src.unresolved
    finding = next(f for f in src.findings if f.data.get("key") == "finetuning_type")
    assert finding.code == "C006"
    assert "lora (LLaMA-Factory default when the key is absent)" in finding.message
    assert TRAINABLE not in read_config(_write(tmp_path, BASE)).unresolved


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ({"finetuning_type": "freeze"}, "finetuning_type", "freeze_trainable_layers"),
        ({"finetuning_type": "lora", "quantization_bit": 4}, "finetuning_type", "4-bit"),
        ({"use_badam": True}, "use_badam", "one block of layers"),
        ({"use_galore": True}, "use_galore", "low-rank"),
        ({"stage": "dpo"}, "stage", "reference model"),
        ({"stage": "ppo"}, "stage", "reward model"),
    ],
)
def test_what_the_plan_cannot_express_leaves_memory_unknown(
    tmp_path: Path, extra: dict, key: str, words: str
) -> None:
    src = read_config(_write(tmp_path, {**BASE, **extra}))
    assert TRAINABLE in src.unresolved
    finding = next(f for f in src.findings if f.data.get("key") == key)
    assert words in finding.message and "memory verdict is left unknown" in finding.message


def test_lora_memory_is_unknown_full_is_estimated() -> None:
    args = ("--model", str(LLAMA), "--gpus", "8", "--gpu", "H100", "-f", "json")
    lora = json.loads(check("--config", str(LF / "qwen3_lora_sft.yaml"), *args).stdout)
    assert lora["summary"]["items"]["memory"] == "unknown"
    assert not any(f["code"].startswith("M00") for f in lora["findings"])
    full = json.loads(check("--config", str(LF / "qwen3_full_sft.yaml"), *args).stdout)
    assert full["summary"]["items"]["memory"] != "unknown"


@pytest.mark.parametrize(
    ("extra", "granularity", "origin"),
    [
        ({}, "full", "disable_gradient_checkpointing (LLaMA-Factory default: false, so "
                     "checkpointing is on)"),
        ({"gradient_checkpointing": False}, "full", "disable_gradient_checkpointing "
                                                    "(LLaMA-Factory default: false, so "
                                                    "checkpointing is on)"),
        ({"disable_gradient_checkpointing": True}, "none", "disable_gradient_checkpointing"),
        ({"disable_gradient_checkpointing": True, "gradient_checkpointing": True}, "full",
         "gradient_checkpointing"),
    ],
)
def test_checkpointing_is_on_unless_disabled(
    tmp_path: Path, extra: dict, granularity: str, origin: str
) -> None:
    src = read_config(_write(tmp_path, {**BASE, **extra}))
    assert src.data["parallel"]["checkpointing"]["granularity"] == granularity
    assert src.origin["parallel.checkpointing.granularity"] == origin


def test_unsloth_checkpointing_is_offloaded(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**BASE, "use_unsloth_gc": True}))
    assert src.data["parallel"]["checkpointing"] == {"granularity": "full", "cpu_offload": True}


def test_defaults_are_llamafactorys(tmp_path: Path) -> None:
    config = {k: v for k, v in BASE.items() if k not in ("cutoff_len", "bf16")}
    src = read_config(_write(tmp_path, config))
    assert src.data["batch"]["seq_len"] == 2048
    assert src.origin["batch.seq_len"] == "cutoff_len (LLaMA-Factory default)"
    assert src.data["precision"]["dtype"] == "fp32"  # no bf16/fp16: LLaMA-Factory warns
    assert src.data["framework"] == "transformers"


def test_pure_bf16_trains_the_bf16_weights(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**BASE, "bf16": False, "pure_bf16": True}))
    assert src.data["precision"] == {"dtype": "bf16", "master_weights": "bf16",
                                     "autocast": False, "loss_scaling": {"mode": "none"}}


def test_fsdp_and_fp8_example() -> None:
    """examples/extras/fp8/llama3_fp8_fsdp_sft.yaml: the Trainer's FSDP as a YAML list, fp8."""
    src = read_config(LF / "llama3_fp8_fsdp_sft.yaml")
    assert src.data["parallel"]["zero_stage"] == 3
    assert src.origin["parallel.zero_stage"] == "fsdp"
    assert src.data["precision"]["dtype"] == "fp8"
    assert src.data["batch"]["seq_len"] == 1024


def test_local_model_is_read(tmp_path: Path) -> None:
    (tmp_path / "llama").mkdir()
    shutil.copy(LLAMA, tmp_path / "llama" / "config.json")
    path = _write(tmp_path, {**BASE, "model_name_or_path": "./llama"})
    src = read_config(path)
    assert src.refs["hf_config"] == tmp_path / "llama" / "config.json"
    assert "model" not in src.unresolved
    plan = load_plan(configs=[path]).plan
    assert plan.model is not None and plan.model.num_params == 6_738_415_616


def test_missing_model_and_epochs_are_unresolved_not_guessed(tmp_path: Path) -> None:
    config = {k: v for k, v in BASE.items() if k not in ("model_name_or_path", "max_steps")}
    src = read_config(_write(tmp_path, {**config, "warmup_ratio": 0.1}))
    assert {"model", "schedule.total_steps", "schedule.warmup_steps"} <= set(src.unresolved)
    assert "total_steps" not in src.data.get("schedule", {})
    assert "warmup_steps" not in src.data.get("schedule", {})
    steps = read_config(_write(tmp_path, {**BASE, "warmup_ratio": 0.1}))
    assert steps.data["schedule"]["warmup_steps"] == 100  # ceil(0.1 × 1000)


def test_typos_are_c005_with_the_suggestion(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**BASE, "cutof_len": 8192, "finetunning_type": "lora",
                                        "gradient_acumulation_steps": 8}))
    found = {f.data["key"]: f.data["suggestion"] for f in src.findings if f.code == "C005"}
    assert found == {"cutof_len": "cutoff_len", "finetunning_type": "finetuning_type",
                     "gradient_acumulation_steps": "gradient_accumulation_steps"}
    assert "refuses to start" in next(f for f in src.findings if f.code == "C005").message
    assert src.data["batch"]["seq_len"] == 4096  # the typo has no effect


def test_transformers_4_keys_are_known(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**BASE, "overwrite_output_dir": True,
                                        "warmup_ratio": 0.1, "predict_with_generate": False}))
    assert "C005" not in _codes(src)


def test_both_precisions_is_c003(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**BASE, "fp16": True}))
    assert "C003" in _codes(src)


def test_a_trainer_yaml_is_not_claimed(tmp_path: Path) -> None:
    """TrainingArguments alone, or with an unrelated ``template`` key, is not LLaMA-Factory's."""
    plain = _write(tmp_path, {"output_dir": "out", "per_device_train_batch_size": 4,
                              "learning_rate": 1e-4, "num_train_epochs": 1})
    assert detect_config(Sniff.of(plain)).name == "training_args"
    other = _write(tmp_path, {"template": "x", "dataset": "y", "name": "z"}, "other.yaml")
    from sapper.plan.readers.llamafactory import FORMAT

    assert FORMAT.recognise(Sniff.of(other)) == 0.0


@pytest.mark.parametrize(
    ("extra", "parts"),
    [
        ({"cutoff_len": 0}, ["cutoff_len: invalid value (got 0)", "≥ 1"]),
        ({"cutoff_len": "long"}, ["cutoff_len: invalid value (got 'long')", "an integer"]),
        ({"cutoff_len": float("nan")}, ["cutoff_len: invalid value"]),
        ({"cutoff_len": 10**30}, ["cutoff_len"]),
        ({"stage": "rlhf"}, ["stage: invalid value (got 'rlhf')", "pt / sft / rm"]),
        ({"finetuning_type": ["lora"]}, ["finetuning_type: invalid value", "a string"]),
        ({"quantization_bit": 7}, ["quantization_bit: invalid value (got 7)", "8, 6, 5, 4"]),
        ({"pure_bf16": "maybe"}, ["pure_bf16: invalid value (got 'maybe')", "true or false"]),
        ({"learning_rate": "fast"}, ["learning_rate: invalid value (got 'fast')", "a number"]),
        ({"model_name_or_path": 7}, ["model_name_or_path: invalid value (got 7)"]),
        ({"per_device_train_batch_size": -2}, ["per_device_train_batch_size: invalid value"]),
        ({"deepspeed": {"zero_optimization": {"stage": 5}}},
         ["deepspeed.zero_optimization.stage: invalid value (got 5)"]),
        ({"fsdp": ["quarter_shard"]}, ["fsdp: invalid value", "full_shard"]),
    ],
)
def test_bad_values_are_one_line(tmp_path: Path, extra: dict, parts: list[str]) -> None:
    one_line_error(_write(tmp_path, {**BASE, **extra}), *parts)


def test_deep_nesting_and_a_non_mapping_are_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("stage: sft\nfinetuning_type: full\ntemplate: x\ncutoff_len: 2048\n"
                    "dataset: " + "[" * 500 + "]" * 500 + "\n")
    res = check("--config", str(deep))
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert str(deep) in res.output
    from sapper.errors import InputError
    from sapper.plan.readers.llamafactory import read_llamafactory_config

    listed = tmp_path / "list.yaml"
    listed.write_text("- stage: sft\n")
    with pytest.raises(InputError, match="must be a mapping"):
        read_llamafactory_config(Sniff.of(listed))


def test_same_verdicts_as_the_hand_written_plan(tmp_path: Path) -> None:
    config = _write(tmp_path, BASE)
    loader = same_verdicts(config, {
        "framework": "transformers",
        "init": {"from_pretrained": True},
        "batch": {"micro_batch_size": 2, "gradient_accumulation_steps": 1, "seq_len": 4096},
        "optimizer": {"type": "adamw", "fused": True, "lr": 1e-05, "weight_decay": 0.0,
                      "eps": 1e-08, "betas": [0.9, 0.999]},
        "schedule": {"type": "linear", "total_steps": 1000, "warmup_steps": 0},
        "clipping": {"max_norm": 1.0},
        "parallel": {"checkpointing": {"granularity": "full"}},
        "precision": {"dtype": "bf16", "loss_scaling": {"mode": "none"}, "autocast": True},
    }, tmp_path, "--model", str(LLAMA), "--gpus", "8", "--gpu", "H100")
    assert set(loader) == {"C006"}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("llamafactory")
    shutil.copytree(LF, folder, dirs_exist_ok=True)
    return folder


@stable_settings(200)
@given(case=st.sampled_from(YAMLS).flatmap(
    lambda p: st.tuples(st.just(p), mutated(p.read_bytes()))), cli=st.integers(0, 9))
def test_mutated_examples_never_crash(scratch: Path, case: tuple[Path, bytes], cli: int) -> None:
    path, data = case
    hostile_case(scratch, path.name, data, cli == 0)
