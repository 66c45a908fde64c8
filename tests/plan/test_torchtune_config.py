"""torchtune recipe config -> Plan: the builders' shapes and exact sizes, pure bf16, FSDP2
and TP from the parallel dims, the optimizer and schedule components, adapters and
run-time memory savers left unknown, typos in keys and in component arguments."""

from __future__ import annotations

import json
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
from sapper.plan.readers.registry import detect_config, formats, read_config
from sapper.plan.readers.torchtune_models import SHAPES, find_builder, model_fields

TT = EXAMPLES / "torchtune"
YAMLS = sorted(TT.glob("*.yaml"))
TRAINABLE = "model.trainable_parameters"

BASE = {
    "model": {"_component_": "torchtune.models.llama3_2.llama3_2_1b"},
    "tokenizer": {"_component_": "torchtune.models.llama3.llama3_tokenizer", "path": "t",
                  "max_seq_len": 2048},
    "checkpointer": {"_component_": "torchtune.training.FullModelHFCheckpointer",
                     "checkpoint_dir": "/nowhere/Llama-3.2-1B"},
    "dataset": {"_component_": "torchtune.datasets.alpaca_cleaned_dataset"},
    "optimizer": {"_component_": "torch.optim.AdamW", "lr": 2e-5},
    "batch_size": 4, "gradient_accumulation_steps": 2, "epochs": 1,
    "max_steps_per_epoch": None, "dtype": "bf16",
}


def _write(tmp_path: Path, config: dict, name: str = "tune.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def _read(tmp_path: Path, **changes: object):
    return read_config(_write(tmp_path, {**BASE, **changes}))


def _c006(src) -> dict[str, str]:
    return {str(f.data.get("key")): f.message for f in src.findings if f.code == "C006"}


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_every_example_is_read_as_torchtune(path: Path) -> None:
    assert detect_config(Sniff.of(path)).name == "torchtune"
    src = read_config(path)
    assert src.data["framework"] == "torch"
    assert "model" not in src.unresolved and src.data["model"]["num_params"] > 10**9
    assert "schedule.total_steps" in src.unresolved  # epochs of a dataset
    assert not [f for f in src.findings if f.code == "C005"]  # torchtune's own files


def test_other_formats_examples_are_not_torchtune() -> None:
    tune = next(f for f in formats() if f.name == "torchtune")
    others = [p for p in EXAMPLES.rglob("*") if p.is_file() and TT not in p.parents
              and p.suffix in (".yaml", ".yml", ".json", ".toml", ".sh", ".slurm", ".log")]
    assert others
    for path in others:
        assert tune.recognise(Sniff.of(path)) == 0.0, path


def test_full_finetune_example_by_hand() -> None:
    """recipes/configs/llama3_1/8B_full.yaml, every value by hand against the file and
    torchtune's defaults."""
    src = read_config(TT / "llama3_1-8B_full.yaml")
    model = src.data.pop("model")
    assert src.data == {
        "framework": "torch",
        "init": {"from_pretrained": True},  # checkpointer: the HF weights are loaded
        "batch": {"micro_batch_size": 2, "gradient_accumulation_steps": 1},
        # data_parallel_shard_dim -1 (default): FSDP2 over every GPU; reshard: ZeRO-3
        "parallel": {"tp": 1, "cp": 1, "dp": -1, "zero_stage": 3,
                     "checkpointing": {"granularity": "full"}},
        # dtype: bf16 is the weights, gradients and states themselves: no AMP
        "precision": {"dtype": "bf16", "loss_scaling": {"mode": "none"},
                      "master_weights": "bf16", "optimizer_states": "bf16",
                      "grad_dtype": "bf16", "autocast": False},
        # torch.optim.AdamW, lr 2e-5, fused; the rest AdamW's defaults
        "optimizer": {"type": "adamw", "lr": 2e-5, "weight_decay": 0.01, "eps": 1e-8,
                      "betas": [0.9, 0.999], "fused": True, "impl": "fused"},
        "schedule": {"type": "constant", "warmup_steps": 0},  # no lr_scheduler
        "clipping": {"max_norm": None},  # clip_grad_norm: null
    }
    assert model == {
        "family": "llama", "hidden_size": 4096, "num_layers": 32, "num_heads": 32,
        "num_kv_heads": 8, "head_dim": 128, "ffn_hidden_size": 14336,
        "activation": "swiglu", "hidden_act": "silu", "vocab_size": 128256,
        "position_encoding": "rope", "rope_theta": 500000.0,
        "max_position_embeddings": 131072, "norm_type": "rmsnorm", "norm_placement": "pre",
        "tied_embeddings": False, "attention_bias": False, "mlp_bias": False,
        "parallel_residual": False, "dropout": 0.0, "num_params": 8_030_261_248,
        "rope_scaling": {"type": "llama3", "factor": 8.0,
                         "original_max_position_embeddings": 8192},
    }
    assert src.unresolved == ["batch.seq_len", "schedule.total_steps"]  # max_seq_len: null
    assert src.origin["optimizer.betas"] == "optimizer.betas (torch.optim default)"
    assert src.origin["clipping.max_norm"] == "clip_grad_norm (null: no clipping)"
    assert "null" in _c006(src)["tokenizer.max_seq_len"]


def test_hf_config_of_the_same_model_gives_the_same_shape() -> None:
    """The builder and Meta's config.json describe one model."""
    hf = load_plan(hf_config=ROOT_FIXTURES / "llama-3.1-8b.json").plan.model
    tune = load_plan(configs=[TT / "llama3_1-8B_full.yaml"]).plan.model
    assert hf is not None and tune is not None
    for field in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                  "ffn_hidden_size", "vocab_size", "rope_theta", "rope_scaling",
                  "tied_embeddings", "num_params", "activation", "norm_type"):
        assert getattr(tune, field) == getattr(hf, field), field


ROOT_FIXTURES = Path(__file__).parent.parent / "fixtures" / "hf"


@pytest.mark.parametrize(
    ("builder", "params"),
    [
        # The published sizes of the models the builders load (each equals the count of
        # the torchtune TransformerDecoder built on the meta device, and of the HF model).
        ("torchtune.models.llama3_1.llama3_1_8b", 8_030_261_248),  # "8.03B"
        ("torchtune.models.qwen2_5.qwen2_5_7b_instruct", 7_615_616_512),  # "7.61B"
        ("torchtune.models.gemma.gemma_2b", 2_506_172_416),  # "2.51B"
        ("torchtune.models.llama3_2.llama3_2_1b", 1_235_814_400),  # "1.24B", tied
        ("torchtune.models.llama3_3.llama3_3_70b", 70_553_706_496),  # "70.6B"
    ],
)
def test_builder_sizes_match_the_published_ones(tmp_path: Path, builder: str,
                                                params: int) -> None:
    path = _write(tmp_path, {**BASE, "model": {"_component_": builder}})
    res = check("--config", str(path), "-f", "json")
    assert res.exit_code in (0, 1), res.output
    assert json.loads(res.stdout)["summary"]["derived"]["parameters"] == params


def test_every_builder_in_the_table_resolves_with_a_positive_count() -> None:
    for key, shape in SHAPES.items():
        module, name = key.split(".")
        found = find_builder(f"torchtune.models.{module}.{name}")
        assert found is not None and found[1] == shape
        assert model_fields(shape)["num_params"] > 10**8
    assert find_builder("torchtune.models.llama3_1._model_builders.llama3_1_8b") is not None
    assert find_builder("torchtune.models.llama4.llama4_scout_17b_16e") is None


def test_tied_override_of_a_builder_argument(tmp_path: Path) -> None:
    src = _read(tmp_path, model={"_component_": "torchtune.models.llama3_2.llama3_2_1b",
                                 "tie_word_embeddings": False})
    assert src.data["model"]["tied_embeddings"] is False
    assert src.data["model"]["num_params"] == 1_498_482_688
    assert src.origin["model.tied_embeddings"] == "model.tie_word_embeddings"


def test_lora_example_leaves_memory_unknown() -> None:
    src = read_config(TT / "llama3_1-8B_lora.yaml")
    assert TRAINABLE in src.unresolved
    assert "LoRA adapters" in _c006(src)["model._component_"]
    assert src.data["schedule"] == {"type": "cosine", "min_lr": 0.0, "warmup_steps": 100}
    assert src.data["batch"]["gradient_accumulation_steps"] == 8
    assert src.data["parallel"]["checkpointing"] == {"granularity": "none"}
    res = json.loads(check("--config", str(TT / "llama3_1-8B_lora.yaml"), "--seq-len",
                           "2048", "--gpu", "H100", "--gpus", "2", "-f", "json").stdout)
    assert res["summary"]["items"]["memory"] == "unknown"


def test_qlora_example() -> None:
    src = read_config(TT / "llama3_2-3B_qlora_single_device.yaml")
    assert TRAINABLE in src.unresolved
    assert "NF4" in _c006(src)["model._component_"]
    assert src.data["model"]["num_params"] == 3_212_749_824  # Llama-3.2-3B, tied


def test_single_device_example_paged_and_in_backward() -> None:
    """qwen2_5/7B_full_single_device.yaml: bitsandbytes PagedAdamW (32-bit states, paged
    to the host under pressure) stepped in backward: the full estimate is only a bound."""
    src = read_config(TT / "qwen2_5-7B_full_single_device.yaml")
    assert src.data["optimizer"]["type"] == "adamw"
    assert src.data["precision"]["optimizer_states"] == "fp32"  # bnb's 32-bit states
    assert src.data["precision"]["master_weights"] == "bf16"
    assert {"optimizer.paged", "optimizer.in_backward"} <= set(src.unresolved)
    res = json.loads(check("--config", str(TT / "qwen2_5-7B_full_single_device.yaml"),
                           "--seq-len", "2048", "--gpu", "H100", "--gpus", "1",
                           "-f", "json").stdout)
    assert res["summary"]["items"]["memory"] == "unknown"  # not a false "does not fit"


def test_multinode_example_tensor_parallel() -> None:
    src = read_config(TT / "llama3_3-70B_full_multinode.yaml")
    par = src.data["parallel"]
    assert (par["tp"], par["dp"], par["zero_stage"], par["sequence_parallel"]) == (8, -1, 3, True)
    assert src.data["batch"]["seq_len"] == 1024
    plan = load_plan(configs=[TT / "llama3_3-70B_full_multinode.yaml"]).plan
    assert plan.model is not None and plan.model.num_params == 70_553_706_496


def test_full_fine_tune_memory_is_estimated() -> None:
    res = json.loads(check("--config", str(TT / "llama3_1-8B_full.yaml"), "--seq-len",
                           "2048", "--gpu", "H100", "--gpus", "4", "-f", "json").stdout)
    assert res["summary"]["items"]["memory"] in ("pass", "warn")


def test_interpolations_resolve_within_the_file(tmp_path: Path) -> None:
    src = _read(tmp_path, max_len=4096,
                tokenizer={"_component_": "torchtune.models.llama3.llama3_tokenizer",
                           "path": "t", "max_seq_len": "${max_len}"},
                batch_size="${oc.env:BS}")
    assert src.data["batch"]["seq_len"] == 4096
    assert "batch.micro_batch_size" in src.unresolved
    assert "oc.env" in _c006(src)["batch_size"]


def test_missing_required_values_are_unknown_not_guessed(tmp_path: Path) -> None:
    config = {k: v for k, v in BASE.items() if k not in ("batch_size", "dtype")}
    src = read_config(_write(tmp_path, config))
    assert {"batch.micro_batch_size", "precision.dtype"} <= set(src.unresolved)
    assert "stop at start" in _c006(src)["dtype"]
    assert "dtype" not in src.data.get("precision", {})


def test_null_dtype_is_fp32(tmp_path: Path) -> None:
    src = _read(tmp_path, dtype=None)
    assert src.data["precision"] == {"dtype": "fp32"}


def test_unknown_builder_is_named(tmp_path: Path) -> None:
    path = "torchtune.models.llama4.llama4_scout_17b_16e"
    src = _read(tmp_path, model={"_component_": path})
    assert "model" in src.unresolved
    assert path in _c006(src)["model._component_"]


def test_unknown_builder_reads_a_local_checkpoint_config(tmp_path: Path) -> None:
    folder = tmp_path / "Llama-3.1-8B"
    folder.mkdir()
    shutil.copy(ROOT_FIXTURES / "llama-3.1-8b.json", folder / "config.json")
    src = _read(tmp_path, model={"_component_": "my.models.custom_8b"},
                checkpointer={"_component_": "torchtune.training.FullModelHFCheckpointer",
                              "checkpoint_dir": str(folder)})
    assert src.refs["hf_config"] == folder / "config.json"
    assert "model" not in src.unresolved


def test_typos_are_c005(tmp_path: Path) -> None:
    src = _read(tmp_path, gradient_acumulation_steps=4,
                optimizer={"_component_": "torch.optim.AdamW", "lr": 1e-5, "weight_decy": 0.1},
                model={"_component_": "torchtune.models.llama3_1.lora_llama3_1_8b",
                       "lora_attn_modules": ["q_proj"], "lora_rnk": 8})
    found = {f.data["key"]: f.data["suggestion"] for f in src.findings if f.code == "C005"}
    assert found == {"gradient_acumulation_steps": "gradient_accumulation_steps",
                     "optimizer.weight_decy": "optimizer.weight_decay",
                     "model.lora_rnk": "model.lora_rank"}


def test_optimizer_and_schedule_variants(tmp_path: Path) -> None:
    src = _read(tmp_path, optimizer={"_component_": "bitsandbytes.optim.PagedAdamW8bit",
                                     "lr": "3e-4", "betas": [0.9, 0.95]},
                lr_scheduler={"_component_":
                              "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
                              "num_warmup_steps": 50},
                clip_grad_norm=1.0)
    assert src.data["optimizer"] == {"type": "adamw", "lr": 3e-4, "weight_decay": 0.01,
                                     "eps": 1e-8, "betas": [0.9, 0.95], "eight_bit": True,
                                     "impl": "bnb_8bit"}
    assert src.data["precision"]["optimizer_states"] == "int8"
    assert src.data["schedule"]["warmup_steps"] == 50
    assert src.data["clipping"]["max_norm"] == 1.0
    odd = _read(tmp_path, optimizer={"_component_": "my.optim.Lion", "lr": 1e-4},
                lr_scheduler={"_component_": "torch.optim.lr_scheduler.StepLR"})
    assert {"optimizer.type", "schedule.type"} <= set(odd.unresolved)
    assert odd.data["optimizer"] == {"lr": 1e-4}


def test_layout_keys(tmp_path: Path) -> None:
    src = _read(tmp_path, data_parallel_shard_dim=4, data_parallel_replicate_dim=2,
                fsdp_reshard_after_forward=False, fsdp_cpu_offload=True,
                enable_activation_checkpointing=True, enable_activation_offloading=True)
    par = src.data["parallel"]
    assert (par["dp"], par["zero_stage"]) == (8, 2)
    assert (par["offload_params"], par["offload_optimizer"]) == ("cpu", "cpu")
    assert par["checkpointing"] == {"granularity": "full", "cpu_offload": True}
    one = _read(tmp_path, data_parallel_shard_dim=1)
    assert one.data["parallel"]["zero_stage"] == 0
    hsdp = _read(tmp_path, data_parallel_replicate_dim=2)
    assert "parallel.dp" in hsdp.unresolved
    sel = _read(tmp_path, ac_mode="selective", ac_option=2)
    assert sel.data["parallel"]["checkpointing"] == {"granularity": "full", "every_k_layers": 2}


def test_extra_models_leave_memory_unknown(tmp_path: Path) -> None:
    src = _read(tmp_path, teacher_model={"_component_": "torchtune.models.llama3_1.llama3_1_8b"})
    assert TRAINABLE in src.unresolved and "teacher" in _c006(src)["teacher_model"]


@pytest.mark.parametrize(
    ("changes", "parts"),
    [
        ({"batch_size": 0}, ["batch_size: invalid value (got 0)", "≥ 1"]),
        ({"batch_size": "two"}, ["batch_size: invalid value (got 'two')", "an integer"]),
        ({"batch_size": 10**30}, ["batch_size (plan field batch.micro_batch_size)", "≤ 10^6"]),
        ({"dtype": "fp16"}, ["dtype", "fp16", "bf16 or fp32"]),
        ({"dtype": "bfloat16"}, ["dtype: invalid value (got 'bfloat16')", "bf16 / fp32"]),
        ({"optimizer": {"_component_": "torch.optim.AdamW", "lr": float("nan")}},
         ["optimizer.lr: invalid value (got nan)", "a number"]),
        ({"optimizer": {"_component_": "torch.optim.AdamW", "lr": 1e-5, "betas": [0.9]}},
         ["optimizer.betas: invalid value", "two numbers"]),
        ({"optimizer": "AdamW"}, ["optimizer: invalid value (got 'AdamW')", "_component_"]),
        ({"clip_grad_norm": 0}, ["clip_grad_norm: invalid value (got 0)", "positive"]),
        ({"optimizer_in_bwd": True}, ["optimizer_in_bwd", "gradient_accumulation_steps"]),
        ({"enable_activation_offloading": True}, ["enable_activation_offloading",
                                                  "enable_activation_checkpointing"]),
        ({"tensor_parallel_dim": 2}, ["tensor_parallel_dim", "tensor_parallel_plan"]),
        ({"data_parallel_shard_dim": 0}, ["data_parallel_shard_dim: invalid value (got 0)"]),
        ({"model": {"_component_": "torchtune.models.llama3_2.llama3_2_1b",
                    "tie_word_embeddings": "no"}},
         ["model.tie_word_embeddings: invalid value (got 'no')", "true or false"]),
    ],
)
def test_bad_values_are_one_line(tmp_path: Path, changes: dict, parts: list[str]) -> None:
    one_line_error(_write(tmp_path, {**BASE, **changes}), *parts)


def test_deep_nesting_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(yaml.safe_dump(BASE) + "extra: " + "[" * 150 + "]" * 150 + "\n")
    res = check("--config", str(path))
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("torchtune")
    shutil.copytree(TT, folder, dirs_exist_ok=True)
    return folder


@stable_settings(200)
@given(case=st.sampled_from(YAMLS).flatmap(
    lambda p: st.tuples(st.just(p), mutated(p.read_bytes()))), cli=st.integers(0, 9))
def test_mutated_examples_never_crash(scratch: Path, case: tuple[Path, bytes], cli: int) -> None:
    path, data = case
    hostile_case(scratch, path.name, data, cli == 0)
