"""Axolotl YAML -> Plan: Axolotl's defaults and warmup, its schema's keys for typos, hub
models and GPU-dependent precision left unknown, adapters said to be beyond the Plan."""

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

AXO = EXAMPLES / "axolotl"
YAMLS = sorted([*AXO.glob("*.yml"), *AXO.glob("*.yaml")])
HUB_UNKNOWN = ["model", "schedule.total_steps", "schedule.warmup_steps", "precision.dtype"]


def _write(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "axolotl.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def _codes(src) -> list[str]:
    return [f.code for f in src.findings]


BASE = {"base_model": "NousResearch/Llama-3.2-1B", "datasets": [{"path": "x", "type": "alpaca"}],
        "micro_batch_size": 2, "sequence_len": 2048, "learning_rate": 2e-4, "bf16": True}


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_every_example_is_read_as_axolotl(path: Path) -> None:
    assert detect_config(Sniff.of(path)).name == "axolotl"
    src = read_config(path)
    # bf16: auto leaves the dtype to the GPU; bf16: true says it
    said = yaml.safe_load(path.read_text()).get("bf16") is True
    unknown = [f for f in HUB_UNKNOWN if f != "precision.dtype" or not said]
    assert set(unknown) <= set(src.unresolved) or src.data["framework"] == "deepspeed"


def test_referenced_deepspeed_json_is_read_as_deepspeed() -> None:
    path = AXO / "deepspeed_configs" / "zero3_bf16_cpuoffload_params.json"
    assert detect_config(Sniff.of(path)).name == "deepspeed"


def test_qlora_example() -> None:
    """axolotl examples/llama-3/qlora-1b.yml, every value by hand."""
    src = read_config(AXO / "qlora-1b.yml")
    assert src.data == {
        "framework": "transformers",
        "init": {"from_pretrained": True},
        "batch": {"micro_batch_size": 2, "gradient_accumulation_steps": 4, "seq_len": 2048},
        "optimizer": {"type": "adamw", "eight_bit": True, "lr": 0.0002, "weight_decay": 0.0,
                      "eps": 1e-08, "betas": [0.9, 0.999]},
        "precision": {"optimizer_states": "int8"},
        "schedule": {"type": "cosine"},
        "clipping": {"max_norm": 1.0},
        "parallel": {"checkpointing": {"granularity": "full"}},
    }
    assert src.origin["clipping.max_norm"] == "max_grad_norm (HF Trainer default)"
    assert src.origin["optimizer.type"] == "optimizer"
    assert src.unresolved == [*HUB_UNKNOWN, "model.trainable_parameters"]
    adapter = [f for f in src.findings if f.data.get("key") == "adapter"]
    assert len(adapter) == 1 and adapter[0].code == "C006"
    assert "4-bit" in adapter[0].message and "left unknown" in adapter[0].message


def test_adapter_run_memory_is_unknown_not_failed() -> None:
    """Full-training memory of a QLoRA job would fail it on an upper bound."""
    res = json.loads(check("--config", str(AXO / "qlora-1b.yml"), "--model", str(LLAMA),
                           "--gpus", "8", "--gpu", "H100", "-f", "json").stdout)
    assert res["summary"]["items"]["memory"] == "unknown"
    assert not any(f["code"].startswith("M00") for f in res["findings"])
    full = json.loads(check("--config", str(AXO / "config.yml"), "--model", str(LLAMA),
                            "--gpus", "8", "--gpu", "H100", "-f", "json").stdout)
    assert full["summary"]["items"]["memory"] != "unknown"  # a full fine-tune is estimated


def test_fsdp_example_and_the_fsdp_keys_axolotl_drops() -> None:
    """examples/llama-3/fft-8b-liger-fsdp.yaml: full_shard with CPU offload; three of its
    fsdp_config keys are not in Axolotl's FSDPConfig any more."""
    src = read_config(AXO / "fft-8b-liger-fsdp.yaml")
    assert src.data["parallel"] == {"zero_stage": 3, "offload_params": "cpu",
                                    "offload_optimizer": "cpu",
                                    "checkpointing": {"granularity": "full"}}
    assert src.origin["parallel.zero_stage"] == "fsdp"
    assert src.data["optimizer"]["fused"] is True
    dropped = {f.data["key"] for f in src.findings if f.code == "C005"}
    assert dropped == {"fsdp_config.fsdp_limit_all_gathers",
                       "fsdp_config.fsdp_sharding_strategy", "fsdp_config.fsdp_backward_prefetch"}


def test_deepspeed_example_reads_its_json_and_lets_it_decide_precision() -> None:
    loaded = load_plan(configs=[AXO / "bigstral-ds-zero3.yaml"])
    plan = loaded.plan
    assert plan.framework == "deepspeed"
    assert (plan.parallel.zero_stage, plan.parallel.offload_params) == (3, "cpu")
    assert plan.precision.dtype == "bf16"  # bf16.enabled: true in the JSON
    assert "precision.dtype" not in plan.unresolved
    assert plan.batch.seq_len == 2048 and plan.optimizer.lr == 1e-4


def test_local_base_model_is_read(tmp_path: Path) -> None:
    (tmp_path / "llama").mkdir()
    shutil.copy(LLAMA, tmp_path / "llama" / "config.json")
    path = _write(tmp_path, {**BASE, "base_model": "./llama"})
    src = read_config(path)
    assert src.refs["hf_config"] == tmp_path / "llama" / "config.json"
    assert "model" not in src.unresolved
    plan = load_plan(configs=[path]).plan
    assert plan.model is not None and plan.model.num_params == 6_738_415_616


@pytest.mark.parametrize(
    ("extra", "warmup", "origin"),
    [
        ({"max_steps": 1000, "warmup_ratio": 0.05}, 50, "warmup_ratio × max_steps"),
        ({"max_steps": 999, "warmup_ratio": 0.1}, 99, "warmup_ratio × max_steps"),  # floor
        ({"max_steps": 10000}, 100, "warmup_ratio (Axolotl default: 3% of the steps, at most "
                                    "100) × max_steps"),
        ({"max_steps": 1000}, 30, None),
        ({"warmup_steps": 1}, 2, "warmup_steps"),  # Axolotl turns one warmup step into two
        ({"warmup_steps": 10}, 10, "warmup_steps"),
    ],
)
def test_axolotl_warmup(tmp_path: Path, extra: dict, warmup: int, origin: str | None) -> None:
    src = read_config(_write(tmp_path, {**BASE, **extra}))
    assert src.data["schedule"]["warmup_steps"] == warmup
    if origin:
        assert src.origin["schedule.warmup_steps"] == origin
    assert "schedule.warmup_steps" not in src.unresolved


def test_defaults_are_axolotls(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {"base_model": "x/y", "datasets": [], "learning_rate": 1e-5,
                                        "max_steps": 100}))
    assert src.data["batch"] == {"micro_batch_size": 1, "gradient_accumulation_steps": 1,
                                 "seq_len": 512}
    assert src.origin["batch.seq_len"] == "sequence_len (Axolotl default)"
    assert src.data["schedule"]["type"] == "cosine"
    assert src.data["optimizer"]["fused"] is True
    assert src.data["precision"]["dtype"] == "fp32"


def test_typos_are_c005_with_the_suggestion(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**BASE, "gradient_acumulation_steps": 8,
                                        "fsdp_config": {"ofload_params": True}}))
    found = {f.data["key"]: f.data["suggestion"] for f in src.findings if f.code == "C005"}
    assert found == {"gradient_acumulation_steps": "gradient_accumulation_steps",
                     "fsdp_config.ofload_params": "fsdp_config.offload_params"}
    assert src.data["batch"]["gradient_accumulation_steps"] == 1  # the typo has no effect


def test_plugin_keys_are_known(tmp_path: Path) -> None:
    plugin = "axolotl.integrations.liger.LigerPlugin"
    src = read_config(_write(tmp_path, {**BASE, "plugins": [plugin], "liger_rope": True}))
    assert "C005" not in _codes(src)


def test_both_precisions_is_c003(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**BASE, "fp16": True}))
    assert "C003" in _codes(src)
    assert "dtype" not in src.data.get("precision", {})


def test_hub_model_verdicts_are_unknown_never_pass(tmp_path: Path) -> None:
    res = json.loads(check("--config", str(AXO / "qlora-1b.yml"), "-f", "json").stdout)
    items = res["summary"]["items"]
    assert items["memory"] == "unknown" and items["normalization"] != "pass"
    assert "model" in res["summary"]["unresolved"]


@pytest.mark.parametrize(
    ("extra", "parts"),
    [
        ({"micro_batch_size": 0}, ["micro_batch_size: invalid value (got 0)", "≥ 1"]),
        ({"micro_batch_size": "two"}, ["micro_batch_size: invalid value (got 'two')"]),
        ({"learning_rate": "fast"}, ["learning_rate: invalid value (got 'fast')", "a number"]),
        ({"bf16": "maybe"}, ["bf16: invalid value (got 'maybe')", "true or false"]),
        ({"adapter": "prefix"}, ["adapter: invalid value (got 'prefix')", "lora, qlora"]),
        ({"fsdp": ["quarter_shard"]}, ["fsdp: invalid value", "full_shard"]),
        ({"deepspeed": {"zero_optimization": {"stage": 5}}},
         ["deepspeed.zero_optimization.stage: invalid value (got 5)"]),
        ({"deepspeed": {"zero_optimization": {"stage": 2}}, "fsdp_config": {"version": 2}},
         ["deepspeed and fsdp are both set"]),
        ({"tensor_parallel_size": 0}, ["tensor_parallel_size: invalid value (got 0)"]),
        ({"dp_shard_size": 4}, ["dp_shard_size: invalid value (got 4)", "without FSDP"]),
    ],
)
def test_bad_values_are_one_line(tmp_path: Path, extra: dict, parts: list[str]) -> None:
    one_line_error(_write(tmp_path, {**BASE, **extra}), *parts)


def test_hsdp_and_tp_layout_from_the_distributed_parallel_examples() -> None:
    """Axolotl's own N-D parallel examples: dp_shard 4 × dp_replicate 2 with TP 2, and
    dp_shard 2 with CP 2 and TP 2 (the replicate degree left to the GPU count)."""
    hsdp = read_config(AXO / "llama-3_1-8b-hsdp-tp.yaml").data["parallel"]
    assert (hsdp["tp"], hsdp["dp"], hsdp["zero_stage"]) == (2, 8, 3)
    src = read_config(AXO / "qwen3-8b-fsdp-tp-cp.yaml")
    layout = src.data["parallel"]
    assert (layout["tp"], layout["cp"]) == (2, 2)
    assert "dp" not in layout  # dp_replicate_size takes what the GPU count leaves
    assert src.origin["parallel.cp"] == "context_parallel_size"


@pytest.mark.parametrize(
    ("extra", "layout"),
    [
        ({"sequence_parallel_degree": 4}, {"cp": 4}),
        ({"context_parallel_size": 2, "sequence_parallel_degree": 4}, {"cp": 2}),
        ({"dp_replicate_size": 4}, {}),
        ({"dp_shard_size": 1, "dp_replicate_size": 4}, {"dp": 4}),
    ],
)
def test_axolotl_layout_keys(tmp_path: Path, extra: dict, layout: dict) -> None:
    parallel = read_config(_write(tmp_path, {**BASE, **extra})).data.get("parallel", {})
    assert {k: v for k, v in parallel.items() if k in ("tp", "cp", "dp")} == layout


def test_inline_deepspeed_dict(tmp_path: Path) -> None:
    path = _write(tmp_path, {**BASE, "deepspeed": {"zero_optimization": {"stage": 2},
                                                   "bf16": {"enabled": "auto"},
                                                   "train_micro_batch_size_per_gpu": "auto"}})
    src = read_config(path)
    assert src.data["framework"] == "deepspeed"
    assert src.data["parallel"]["zero_stage"] == 2
    assert src.origin["parallel.zero_stage"] == "deepspeed.zero_optimization.stage"
    assert "batch.micro_batch_size" not in src.unresolved  # micro_batch_size fills the auto


def test_same_verdicts_as_the_hand_written_plan(tmp_path: Path) -> None:
    loader = same_verdicts(AXO / "qlora-1b.yml", {
        "framework": "transformers",
        "init": {"from_pretrained": True},
        "batch": {"micro_batch_size": 2, "gradient_accumulation_steps": 4, "seq_len": 2048},
        "optimizer": {"type": "adamw", "eight_bit": True, "lr": 0.0002, "weight_decay": 0.0,
                      "eps": 1e-08, "betas": [0.9, 0.999]},
        "precision": {"optimizer_states": "int8"},
        "schedule": {"type": "cosine"},
        "clipping": {"max_norm": 1.0},
        "parallel": {"checkpointing": {"granularity": "full"}},
        "unresolved": ["schedule.total_steps", "schedule.warmup_steps", "precision.dtype",
                       "model.trainable_parameters"],
    }, tmp_path, "--model", str(LLAMA), "--gpus", "8", "--gpu", "H100")
    assert set(loader) == {"C006"}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("axolotl")
    shutil.copytree(AXO, folder, dirs_exist_ok=True)
    return folder


@stable_settings(300)
@given(case=st.sampled_from(YAMLS).flatmap(
    lambda p: st.tuples(st.just(p), mutated(p.read_bytes()))), cli=st.integers(0, 9))
def test_mutated_examples_never_crash(scratch: Path, case: tuple[Path, bytes], cli: int) -> None:
    path, data = case
    hostile_case(scratch, path.name, data, cli == 0)


def test_pure_bf16_and_cosine_floor(tmp_path: Path) -> None:
    src = read_config(_write(tmp_path, {**BASE, "bf16": False, "bfloat16": True,
                                        "cosine_min_lr_ratio": 0.1}))
    assert src.data["precision"] == {"dtype": "bf16", "master_weights": "bf16",
                                     "autocast": False, "loss_scaling": {"mode": "none"}}
    assert src.data["schedule"]["min_lr"] == pytest.approx(2e-5)
