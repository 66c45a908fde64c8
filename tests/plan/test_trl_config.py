"""TRL command-line YAML -> Plan: TRL's defaults (bf16 and checkpointing on, each
command's learning rate, max_length 1024), the trl command told by the file's keys and left
open when they fit several, the weights' dtype, accelerate launch options and TRL's shipped
accelerate configs, older releases' keys named and typos reported."""

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

TRL = EXAMPLES / "trl"
YAMLS = sorted(TRL.glob("*.yaml"))
TRAINABLE = "model.trainable_parameters"

BASE = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "dataset_name": "trl-lib/Capybara",
        "per_device_train_batch_size": 2, "gradient_accumulation_steps": 8, "max_steps": 500,
        "packing": True, "max_length": 2048}


def _write(tmp_path: Path, config: dict, name: str = "sft_config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def _codes(src) -> list[str]:
    return [f.code for f in src.findings]


def _finding(src, key: str):
    return next(f for f in src.findings if f.data.get("key") == key)


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_every_example_is_read_as_trl(path: Path) -> None:
    assert detect_config(Sniff.of(path)).name == "trl"
    src = read_config(path)
    assert {"model", "schedule.total_steps"} <= set(src.unresolved)
    assert src.data["parallel"]["checkpointing"]["granularity"] == "full"


def test_olympiccoder_sft_example_by_hand() -> None:
    """open-r1 recipes/OlympicCoder-7B/sft/config_v00.00.yaml, every value by hand: an SFT
    config (packing), weights loaded in bf16 (torch_dtype, the older name of dtype) and
    trained as they are, the installed transformers' defaults for the rest."""
    src = read_config(TRL / "olympiccoder-7b-sft.yaml")
    assert src.data == {
        "framework": "transformers",
        "init": {"from_pretrained": True},
        "batch": {"micro_batch_size": 2, "gradient_accumulation_steps": 8, "seq_len": 32768},
        "optimizer": {"type": "adamw", "fused": True, "lr": 1e-05, "weight_decay": 0.0,
                      "eps": 1e-08, "betas": [0.9, 0.999]},
        "schedule": {"type": "cosine"},
        "clipping": {"max_norm": 0.2},
        "parallel": {"checkpointing": {"granularity": "full"}},
        "precision": {"dtype": "bf16", "master_weights": "bf16", "optimizer_states": "bf16",
                      "autocast": False, "loss_scaling": {"mode": "none"}},
    }
    assert src.origin["batch.seq_len"] == "max_length"
    assert src.origin["precision.master_weights"] == "torch_dtype"
    assert src.origin["schedule.type"] == "lr_scheduler_type"  # cosine_with_min_lr
    assert src.unresolved == ["model", "schedule.total_steps", "schedule.warmup_steps"]
    legacy = _finding(src, "torch_dtype")
    assert legacy.code == "C005" and legacy.data["suggestion"] == "dtype"
    assert [f.code for f in src.findings].count("C005") == 1


def test_trl_defaults_for_an_sft_file(tmp_path: Path) -> None:
    """bf16 and gradient checkpointing on (_BaseConfig), SFT's learning rate and max_length."""
    config = {k: v for k, v in BASE.items() if k != "max_length"}
    src = read_config(_write(tmp_path, config))
    assert src.data["precision"] == {"dtype": "bf16", "loss_scaling": {"mode": "none"},
                                     "autocast": True}
    assert src.origin["precision.dtype"] == "bf16 (TRL default: true unless fp16)"
    assert src.origin["parallel.checkpointing.granularity"] == (
        "gradient_checkpointing (TRL default: true)")
    assert src.data["optimizer"]["lr"] == 2e-5
    assert src.origin["optimizer.lr"] == "learning_rate (TRL default for trl sft)"
    assert src.data["batch"]["seq_len"] == 1024
    assert TRAINABLE not in src.unresolved  # trl sft: one model, one batch


def test_fp16_turns_the_bf16_default_off(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**BASE, "fp16": True}))
    assert src.data["precision"]["dtype"] == "fp16"
    off = read_config(_write(tmp_path, {**BASE, "gradient_checkpointing": False}))
    assert off.data["parallel"]["checkpointing"]["granularity"] == "none"


def test_a_dpo_file(tmp_path: Path) -> None:
    config = {k: v for k, v in BASE.items() if k != "packing"}
    src = read_config(_write(tmp_path, {**config, "beta": 0.1, "loss_type": ["sigmoid"],
                                        "f_divergence_type": "reverse_kl"}))
    assert src.data["optimizer"]["lr"] == 1e-6
    assert src.origin["optimizer.lr"] == "learning_rate (TRL default for trl dpo)"
    assert src.data["batch"]["seq_len"] == 2048
    finding = _finding(src, "(trl dpo)")
    assert TRAINABLE in src.unresolved and "reference model" in finding.message


def test_which_command_is_open_when_the_keys_fit_several() -> None:
    """TRL's own examples/cli_configs/example_config.yaml fits every trl command: the
    defaults that differ (max_length) stay unknown, and so does the memory verdict."""
    src = read_config(TRL / "example_config.yaml")
    assert src.data["optimizer"]["lr"] == 1e-4  # given
    assert "seq_len" not in src.data["batch"]
    assert {"batch.seq_len", TRAINABLE} <= set(src.unresolved)
    assert "does not say which runs it" in _finding(src, "(which trl command)").message


def test_a_reference_model_command_pair(tmp_path: Path) -> None:
    """beta with precompute_ref_log_probs fits trl dpo and trl kto: their learning rate
    agrees (1e-6), and both hold a reference model."""
    config = {k: v for k, v in BASE.items() if k != "packing"}
    src = read_config(_write(tmp_path, {**config, "beta": 0.1,
                                        "precompute_ref_log_probs": True}))
    assert src.data["optimizer"]["lr"] == 1e-6
    assert src.origin["optimizer.lr"] == "learning_rate (TRL default for trl dpo/kto)"
    message = _finding(src, "(which trl command)").message
    assert "trl dpo, kto" in message and "only trl sft" not in message


def test_learning_rate_left_open_when_the_commands_differ(tmp_path: Path) -> None:
    config = {k: v for k, v in BASE.items() if k not in ("packing",)}
    src = read_config(_write(tmp_path, config))
    assert "optimizer.lr" in src.unresolved and "lr" not in src.data["optimizer"]
    assert "sft 2e-05, dpo 1e-06" in _finding(src, "learning_rate").message


def test_keys_of_two_commands_are_said(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**BASE, "beta": 0.1, "learning_rate": 1e-5}))
    finding = _finding(src, "beta, max_length, packing")
    assert "no trl command takes all of these keys" in finding.message
    assert TRAINABLE in src.unresolved


def test_grpo_sequence_length(tmp_path: Path) -> None:
    """open-r1's GRPO recipe: prompt (max_prompt_length, an older release's key) plus the
    completion; without max_prompt_length the dataset decides."""
    src = read_config(TRL / "qwen2.5-1.5b-grpo.yaml")
    assert src.data["batch"]["seq_len"] == 512 + 1024
    assert src.origin["batch.seq_len"] == "max_prompt_length + max_completion_length"
    assert TRAINABLE in src.unresolved
    config = {"model_name_or_path": "x/y", "dataset_name": "d", "num_generations": 8,
              "learning_rate": 1e-6}
    open_len = read_config(_write(tmp_path, config))
    assert "batch.seq_len" in open_len.unresolved


@pytest.mark.parametrize(
    ("dtype", "master"),
    [("bfloat16", "bf16"), ("float16", "fp16"), ("float32", None)],
)
def test_weights_dtype(tmp_path: Path, dtype: str, master: str | None) -> None:
    src = read_config(_write(tmp_path, {**BASE, "dtype": dtype}))
    assert src.data["precision"].get("master_weights") == master
    if master:
        assert src.data["precision"]["autocast"] is False


def test_weights_dtype_auto_is_unresolved(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**BASE, "dtype": "auto"}))
    assert "precision.master_weights" in src.unresolved
    assert "checkpoint's dtype" in _finding(src, "dtype").message


def test_deepspeed_keeps_its_own_master_weights(tmp_path: Path) -> None:
    ds = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"},
          "train_micro_batch_size_per_gpu": "auto"}
    src = read_config(_write(tmp_path, {**BASE, "dtype": "bfloat16", "deepspeed": ds}))
    assert src.data["framework"] == "deepspeed"
    assert "master_weights" not in src.data["precision"]
    assert src.data["precision"]["dtype"] == "bf16"  # fills the JSON's "auto"
    assert "autocast" not in src.data["precision"]


def test_peft_and_quantized_base(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**BASE, "use_peft": True, "load_in_4bit": True}))
    finding = _finding(src, "use_peft")
    assert "LoRA adapter" in finding.message and "4-bit" in finding.message
    assert TRAINABLE in src.unresolved


def test_peft_memory_is_unknown_full_sft_is_estimated(tmp_path: Path) -> None:
    args = ("--model", str(LLAMA), "--gpus", "8", "--gpu", "H100", "-f", "json")
    peft = _write(tmp_path, {**BASE, "use_peft": True}, "peft.yaml")
    res = json.loads(check("--config", str(peft), *args).stdout)
    assert res["summary"]["items"]["memory"] == "unknown"
    full = json.loads(check("--config", str(_write(tmp_path, BASE)), *args).stdout)
    assert full["summary"]["items"]["memory"] != "unknown"


@pytest.mark.parametrize(
    ("name", "framework", "stage"),
    [("zero3", "deepspeed", 3), ("zero2", "deepspeed", 2), ("fsdp2", "transformers", 3),
     ("multi_gpu", "transformers", None)],
)
def test_trl_accelerate_configs(tmp_path: Path, name: str, framework: str,
                                stage: int | None) -> None:
    src = read_config(_write(tmp_path, {**BASE, "accelerate_config": name,
                                        "dtype": "bfloat16"}))
    assert src.data["framework"] == framework
    assert src.data.get("parallel", {}).get("zero_stage") == stage
    assert src.data["hardware"] == {"num_gpus": 8, "nodes": 1, "gpus_per_node": 8}
    assert src.origin["hardware.num_gpus"].startswith(f"accelerate_config {name} (trl/")
    # DeepSpeed and FSDP keep fp32 master weights; plain DDP trains the bf16 weights
    assert ("master_weights" in src.data["precision"]) == (name == "multi_gpu")


def test_launch_options_override_the_accelerate_config(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**BASE, "accelerate_config": "zero3",
                                        "num_processes": 16, "num_machines": 2}))
    assert src.data["hardware"] == {"num_gpus": 16, "nodes": 2, "gpus_per_node": 8}
    assert src.origin["hardware.num_gpus"] == "num_processes"


def test_accelerate_config_file_and_launch_flags(tmp_path: Path) -> None:
    acc = EXAMPLES / "accelerate" / "deepspeed.yaml"
    shutil.copy(acc, tmp_path / "acc.yaml")
    src = read_config(_write(tmp_path, {**BASE, "accelerate_config": "acc.yaml"}))
    assert src.data["framework"] == "deepspeed"
    missing = read_config(_write(tmp_path, {**BASE, "accelerate_config": "nope.yaml"}))
    assert "parallel.zero_stage" in missing.unresolved
    flags = read_config(_write(tmp_path, {**BASE, "use_deepspeed": True, "zero_stage": 3,
                                          "offload_optimizer_device": "cpu"}))
    assert flags.data["framework"] == "deepspeed"
    assert flags.data["parallel"] == {"zero_stage": 3, "offload_optimizer": "cpu",
                                      "checkpointing": {"granularity": "full"}}
    fsdp = read_config(_write(tmp_path, {**BASE, "use_fsdp": True,
                                         "fsdp_sharding_strategy": "SHARD_GRAD_OP"}))
    assert fsdp.data["parallel"]["zero_stage"] == 2


def test_local_model_is_read(tmp_path: Path) -> None:
    (tmp_path / "llama").mkdir()
    shutil.copy(LLAMA, tmp_path / "llama" / "config.json")
    path = _write(tmp_path, {**BASE, "model_name_or_path": "./llama"})
    src = read_config(path)
    assert src.refs["hf_config"] == tmp_path / "llama" / "config.json"
    plan = load_plan(configs=[path]).plan
    assert plan.model is not None and plan.model.num_params == 6_738_415_616


def test_typos_and_older_keys(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**BASE, "max_lenght": 4096, "use_pfet": True,
                                        "max_prompt_length": 512}))
    found = {f.data["key"]: f.data["suggestion"] for f in src.findings if f.code == "C005"}
    assert found == {"max_lenght": "max_length", "use_pfet": "use_peft",
                     "max_prompt_length": None}
    assert "accelerate launch, which refuses" in _finding(src, "max_lenght").message
    assert "older TRL releases" in _finding(src, "max_prompt_length").message
    assert src.data["batch"]["seq_len"] == 2048  # the typo has no effect


def test_older_max_seq_length_is_read(tmp_path: Path) -> None:
    """alignment-handbook recipes/smollm2/sft/config.yaml: max_seq_length, TRL 0.19's
    name of max_length, is an SFT key and is read."""
    src = read_config(TRL / "smollm2-1.7b-sft.yaml")
    assert src.data["batch"]["seq_len"] == 8192
    assert src.origin["batch.seq_len"] == "max_seq_length"
    assert _finding(src, "max_seq_length").data["suggestion"] == "max_length"
    assert TRAINABLE not in src.unresolved  # max_seq_length says trl sft


def test_max_length_null_is_unresolved(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**BASE, "max_length": None}))
    assert "batch.seq_len" in src.unresolved and "seq_len" not in src.data["batch"]


def test_not_claimed_without_dataset_or_with_script_keys(tmp_path: Path) -> None:
    from sapper.plan.readers.trl import FORMAT

    handbook = EXAMPLES / "training_args" / "zephyr-7b-sft-full.yaml"  # dataset_mixture
    assert FORMAT.recognise(Sniff.of(handbook)) == 0.0
    run_clm = _write(tmp_path, {"model_name_or_path": "gpt2", "dataset_name": "wikitext",
                                "dataset_config_name": "wikitext-2-raw-v1", "block_size": 512,
                                "per_device_train_batch_size": 8, "output_dir": "out",
                                "learning_rate": 5e-5}, "run_clm.yaml")
    assert FORMAT.recognise(Sniff.of(run_clm)) == 0.0
    assert detect_config(Sniff.of(run_clm)).name == "training_args"
    mixture = _write(tmp_path, {"model_name_or_path": "x/y",
                                "datasets": [{"path": "a"}, {"path": "b"}]}, "mix.yaml")
    assert detect_config(Sniff.of(mixture)).name == "trl"


@pytest.mark.parametrize(
    ("extra", "parts"),
    [
        ({"max_length": 0}, ["max_length: invalid value (got 0)", "≥ 1"]),
        ({"max_length": "long"}, ["max_length: invalid value (got 'long')", "an integer"]),
        ({"max_length": float("inf")}, ["max_length: invalid value"]),
        ({"max_length": 10**30}, ["max_length"]),
        ({"dtype": "int8"}, ["dtype: invalid value (got 'int8')", "bfloat16"]),
        ({"env": [1, 2]}, ["env: invalid value", "a mapping"]),
        ({"num_processes": 0}, ["num_processes: invalid value (got 0)"]),
        ({"num_processes": 9, "num_machines": 2}, ["num_processes: invalid value (got 9)",
                                                   "a multiple of num_machines"]),
        ({"accelerate_config": ["zero3"]}, ["accelerate_config: invalid value", "zero3"]),
        ({"use_deepspeed": True, "zero_stage": 4}, ["zero_stage: invalid value (got 4)"]),
        ({"use_fsdp": True, "fsdp_sharding_strategy": "HALF"},
         ["fsdp_sharding_strategy: invalid value (got 'HALF')"]),
        ({"use_peft": "sure"}, ["use_peft: invalid value (got 'sure')", "true or false"]),
        ({"learning_rate": "fast"}, ["learning_rate: invalid value (got 'fast')"]),
        ({"model_name_or_path": ["a"]}, ["model_name_or_path: invalid value"]),
    ],
)
def test_bad_values_are_one_line(tmp_path: Path, extra: dict, parts: list[str]) -> None:
    one_line_error(_write(tmp_path, {**BASE, **extra}), *parts)


def test_deep_nesting_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("model_name_or_path: x\ndataset_name: y\nenv: " + "{a: " * 400
                    + "1" + "}" * 400 + "\n")
    res = check("--config", str(deep))
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert str(deep) in res.output


def test_same_verdicts_as_the_hand_written_plan(tmp_path: Path) -> None:
    loader = same_verdicts(_write(tmp_path, BASE), {
        "framework": "transformers",
        "init": {"from_pretrained": True},
        "batch": {"micro_batch_size": 2, "gradient_accumulation_steps": 8, "seq_len": 2048},
        "optimizer": {"type": "adamw", "fused": True, "lr": 2e-05, "weight_decay": 0.0,
                      "eps": 1e-08, "betas": [0.9, 0.999]},
        "schedule": {"type": "linear", "total_steps": 500, "warmup_steps": 0},
        "clipping": {"max_norm": 1.0},
        "parallel": {"checkpointing": {"granularity": "full"}},
        "precision": {"dtype": "bf16", "loss_scaling": {"mode": "none"}, "autocast": True},
    }, tmp_path, "--model", str(LLAMA), "--gpus", "8", "--gpu", "H100")
    assert set(loader) == {"C006"}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("trl")
    shutil.copytree(TRL, folder, dirs_exist_ok=True)
    return folder


@stable_settings(200)
@given(case=st.sampled_from(YAMLS).flatmap(
    lambda p: st.tuples(st.just(p), mutated(p.read_bytes()))), cli=st.integers(0, 9))
def test_mutated_examples_never_crash(scratch: Path, case: tuple[Path, bytes], cli: int) -> None:
    path, data = case
    hostile_case(scratch, path.name, data, cli == 0)
