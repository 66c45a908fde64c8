"""TrainingArguments (JSON, YAML, command line) -> Plan: the installed transformers'
defaults, the Trainer's warmup, typos of Trainer flags, shell values and hub models left
unknown, pickles refused."""

from __future__ import annotations

import dataclasses
import json
import shutil
import zipfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import stable_settings
from tests.plan.launch_support import (
    EXAMPLES,
    LLAMA,
    hostile_case,
    one_line_error,
    same_verdicts,
)
from tests.plan.test_hostile_property import mutated

from sapper.plan.load import load_plan
from sapper.plan.readers.base import Sniff
from sapper.plan.readers.registry import detect_config, read_config
from sapper.plan.readers.training_args import _LEGACY, SIGNATURE, parse_command_line

TA = EXAMPLES / "training_args"
FILES = sorted(p for p in TA.iterdir() if p.name != "README.md")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _write(tmp_path: Path, text: str, name: str = "train.sh") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _codes(src) -> list[str]:
    return [f.code for f in src.findings]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_example_is_read_as_training_args(path: Path) -> None:
    assert detect_config(Sniff.of(path)).name == "training_args"
    assert "model" in read_config(path).unresolved


def test_signature_is_trainingarguments_fields() -> None:
    from transformers import TrainingArguments

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert SIGNATURE - fields <= _LEGACY


def test_to_json_string_output() -> None:
    src = read_config(TA / "training_args.json")
    assert src.data == {
        "framework": "transformers",
        "batch": {"micro_batch_size": 4, "gradient_accumulation_steps": 8},
        "optimizer": {"type": "adamw", "fused": True, "lr": 2e-05, "weight_decay": 0.1,
                      "eps": 1e-08, "betas": [0.9, 0.95]},
        "schedule": {"type": "cosine", "total_steps": 2000, "warmup_steps": 100},
        "clipping": {"max_norm": 1.0},
        "parallel": {"checkpointing": {"granularity": "full"}},
        "precision": {"dtype": "bf16", "loss_scaling": {"mode": "none"}, "autocast": True},
    }
    assert src.origin["schedule.warmup_steps"] == "warmup_steps × max_steps"
    assert _codes(src) == ["C006"] and src.unresolved == ["model"]


def test_run_clm_command_line_uses_the_trainers_defaults() -> None:
    """transformers' language-modeling README: only the batch size is given."""
    src = read_config(TA / "run_clm.sh")
    from transformers import TrainingArguments

    defaults = TrainingArguments.__dataclass_fields__
    assert src.data["batch"] == {"micro_batch_size": 8, "gradient_accumulation_steps": 1}
    assert src.data["optimizer"]["lr"] == defaults["learning_rate"].default
    assert src.data["schedule"]["type"] == defaults["lr_scheduler_type"].default
    assert src.data["clipping"] == {"max_norm": defaults["max_grad_norm"].default}
    assert src.origin["optimizer.lr"].startswith("learning_rate (transformers ")
    assert src.data["precision"] == {"dtype": "fp32"}
    assert src.data["init"] == {"from_pretrained": True}
    assert sorted(src.unresolved) == ["model", "schedule.total_steps"]


def test_deepspeed_launcher_and_missing_config() -> None:
    src = read_config(TA / "deepspeed_run_translation.sh")
    assert src.data["framework"] == "deepspeed"
    assert src.data["hardware"] == {"gpus_per_node": 2, "num_gpus": 2}
    assert src.data["precision"] == {"dtype": "fp16"}  # no autocast: DeepSpeed holds fp16
    assert "parallel.zero_stage" in src.unresolved and src.refs == {}


def test_deepspeed_config_on_disk_is_read_first(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text(json.dumps({
        "zero_optimization": {"stage": 3}, "fp16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}))
    path = _write(tmp_path, "deepspeed --num_gpus 8 --num_nodes 2 train.py \\\n"
                  "  --deepspeed ds.json --per_device_train_batch_size 2 \\\n"
                  "  --gradient_accumulation_steps 4 --fp16 True --max_steps 100\n")
    plan = load_plan(configs=[path]).plan
    assert plan.framework == "deepspeed" and plan.parallel.zero_stage == 3
    assert (plan.batch.micro_batch_size, plan.batch.gradient_accumulation_steps) == (2, 4)
    assert plan.hardware.num_gpus == 16 and plan.global_batch == 2 * 4 * 16
    assert plan.precision.loss_scaling.mode == "dynamic"
    assert "batch.micro_batch_size" not in plan.unresolved


def test_torchrun_with_fsdp_and_a_local_model(tmp_path: Path) -> None:
    (tmp_path / "llama").mkdir()
    shutil.copy(LLAMA, tmp_path / "llama" / "config.json")
    path = _write(tmp_path, """# fine-tune
torchrun --nproc_per_node=8 --nnodes 2 train.py \\
    --model_name_or_path ./llama \\
    --fsdp "full_shard auto_wrap offload" \\
    --per_device_train_batch_size 1 --bf16 --learning_rate=1e-5 \\
    --max_steps 1000 --warmup_ratio 0.03 --optim adamw_bnb_8bit \\
    --gradient_checkpointing True --block_size 4096
""")
    src = read_config(path)
    assert src.refs["hf_config"] == tmp_path / "llama" / "config.json"
    assert src.data["parallel"] == {"zero_stage": 3, "offload_params": "cpu",
                                    "offload_optimizer": "cpu",
                                    "checkpointing": {"granularity": "full"}}
    assert src.data["schedule"]["warmup_steps"] == 30  # ceil(0.03 × 1000)
    assert src.data["optimizer"]["eight_bit"] is True
    assert src.data["batch"]["seq_len"] == 4096
    assert src.data["hardware"] == {"nodes": 2, "gpus_per_node": 8, "num_gpus": 16}
    plan = load_plan(configs=[path]).plan
    assert plan.model is not None and plan.model.num_params == 6_738_415_616
    assert plan.unresolved == []


def test_command_line_parsing() -> None:
    args, launch, launcher = parse_command_line(
        "accelerate launch --num_processes 4 run.py --bf16 --lr_scheduler_type=cosine "
        "--fp16 False --output_dir out # a comment --max_steps 5\n"
    )
    assert launcher == "accelerate" and launch == {"num_processes": "4"}
    assert args == {"bf16": True, "lr_scheduler_type": "cosine", "fp16": "False",
                    "output_dir": "out"}


def test_typos_of_trainer_flags_only(tmp_path: Path) -> None:
    path = _write(tmp_path, "python run.py --per_device_train_batch_size 4 --output_dir o "
                  "--gradient_acumulation_steps 8 --dataset_name wikitext --learning_rate 1e-4\n")
    src = read_config(path)
    found = {f.data["key"]: f.data["suggestion"] for f in src.findings if f.code == "C005"}
    assert found == {"--gradient_acumulation_steps": "--gradient_accumulation_steps"}


def test_shell_values_are_unknown(tmp_path: Path) -> None:
    path = _write(tmp_path, "python run.py --per_device_train_batch_size $BS "
                  "--learning_rate ${LR} --output_dir o --max_steps 10\n")
    src = read_config(path)
    assert {"batch.micro_batch_size", "optimizer.lr"} <= set(src.unresolved)
    assert "micro_batch_size" not in src.data.get("batch", {})


def test_yaml_recipe_with_trl_keys_and_a_hub_model() -> None:
    src = read_config(TA / "zephyr-7b-sft-full.yaml")
    assert src.data["batch"] == {"micro_batch_size": 16, "gradient_accumulation_steps": 1,
                                 "seq_len": 2048}
    assert src.origin["batch.seq_len"] == "max_seq_length"
    assert "C005" not in _codes(src)
    assert sorted(src.unresolved) == ["model", "schedule.total_steps", "schedule.warmup_steps"]


def test_both_precisions_is_c003(tmp_path: Path) -> None:
    path = _write(tmp_path, "python run.py --per_device_train_batch_size 4 --output_dir o "
                  "--bf16 --fp16\n")
    assert "C003" in _codes(read_config(path))


def test_pickled_training_args_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "training_args.bin"
    with zipfile.ZipFile(path, "w") as zf:  # what torch.save writes
        zf.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    one_line_error(path, "never unpickles", "to_json_string")
    raw = tmp_path / "args.pkl"
    raw.write_bytes(b"\x80\x04\x95\x00\xff\xfe")
    one_line_error(raw, "pickled Python object")


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("python r.py --per_device_train_batch_size 0 --output_dir o\n",
         ["per_device_train_batch_size: invalid value (got '0')", "≥ 1"]),
        ("python r.py --per_device_train_batch_size 4 --output_dir o --learning_rate fast\n",
         ["learning_rate: invalid value (got 'fast')", "a number"]),
        ("python r.py --per_device_train_batch_size 4 --output_dir o --bf16 maybe\n",
         ["bf16: invalid value (got 'maybe')", "true or false"]),
        ("python r.py --per_device_train_batch_size 4 --output_dir o --fsdp quarter_shard\n",
         ["fsdp: invalid value (got 'quarter_shard')", "full_shard"]),
        ("python r.py --per_device_train_batch_size 4 --output_dir o --warmup_steps 2.5\n",
         ["warmup_steps: invalid value"]),
    ],
)
def test_bad_values_are_one_line(tmp_path: Path, text: str, parts: list[str]) -> None:
    one_line_error(_write(tmp_path, text), *parts)


def test_same_verdicts_as_the_hand_written_plan(tmp_path: Path) -> None:
    loader = same_verdicts(TA / "training_args.json", {
        "framework": "transformers",
        "batch": {"micro_batch_size": 4, "gradient_accumulation_steps": 8},
        "optimizer": {"type": "adamw", "fused": True, "lr": 2e-05, "weight_decay": 0.1,
                      "eps": 1e-08, "betas": [0.9, 0.95]},
        "schedule": {"type": "cosine", "total_steps": 2000, "warmup_steps": 100},
        "clipping": {"max_norm": 1.0},
        "parallel": {"checkpointing": {"granularity": "full"}},
        "precision": {"dtype": "bf16", "loss_scaling": {"mode": "none"}, "autocast": True},
    }, tmp_path, "--model", str(LLAMA), "--gpus", "8", "--gpu", "H100", "--seq-len", "4096")
    assert loader == ["C006"]  # the model, until --model gives it


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("training_args")
    shutil.copytree(TA, folder, dirs_exist_ok=True)
    return folder


@stable_settings(300)
@given(case=st.sampled_from(FILES).flatmap(
    lambda p: st.tuples(st.just(p), mutated(p.read_bytes()))), cli=st.integers(0, 9))
def test_mutated_examples_never_crash(scratch: Path, case: tuple[Path, bytes], cli: int) -> None:
    path, data = case
    hostile_case(scratch, path.name, data, cli == 0)


def test_yaml_and_json_of_the_same_settings_agree(tmp_path: Path) -> None:
    settings = json.loads((TA / "training_args.json").read_text())
    path = _write(tmp_path, yaml.safe_dump(settings), "args.yaml")
    assert read_config(path).data == read_config(TA / "training_args.json").data


def test_constant_schedule_has_no_warmup(tmp_path: Path) -> None:
    """transformers builds the constant schedule without the warmup arguments."""
    path = _write(tmp_path, "python run.py --per_device_train_batch_size 4 --output_dir o "
                  "--lr_scheduler_type constant --warmup_steps 500\n")
    src = read_config(path)
    assert src.data["schedule"]["warmup_steps"] == 0
    assert "constant_with_warmup" in src.origin["schedule.warmup_steps"]
    with_warmup = _write(tmp_path, "python run.py --per_device_train_batch_size 4 "
                         "--output_dir o --lr_scheduler_type constant_with_warmup "
                         "--warmup_steps 500\n", "b.sh")
    assert read_config(with_warmup).data["schedule"] == {"type": "constant", "warmup_steps": 500}
