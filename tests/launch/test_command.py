"""Reading launch commands as their launchers do.

The command lines are real ones, as their projects publish them (each test names where
it was found; only the command line is used, the files they name are written here
small): LLaMA-Factory's README and examples/README.md (hiyouga/LLaMA-Factory), Axolotl's
README (axolotl-ai-cloud/axolotl), torchtune's README (pytorch/torchtune), Megatron-LM's
examples/gpt3/train_gpt3_175b_distributed.sh (NVIDIA/Megatron-LM, its DISTRIBUTED_ARGS
expanded), DeepSpeed-Chat's training scripts (microsoft/DeepSpeedExamples,
applications/DeepSpeed-Chat/training/step1_supervised_finetuning), the Hugging Face
Trainer examples (huggingface/transformers, examples/pytorch/language-modeling), TRL's
and LitGPT's documentation, and llm-foundry's README (mosaicml/llm-foundry).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from sapper.launch.command import parse_command


def _touch(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}\n" if name.endswith(".json") else "a: 1\n")


def parse(line: str, cwd: Path, gpus: int | None = None):
    return parse_command(shlex.split(line), cwd, machine_gpus=gpus)


def test_torchrun_megatron_flags(tmp_path: Path) -> None:
    # Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh, DISTRIBUTED_ARGS expanded
    line = ("torchrun --nproc_per_node 8 --nnodes 1 --master_addr localhost --master_port 6000 "
            "examples/classes/pretrain_gpt.py --num-layers 96 --hidden-size 12288 "
            "--num-attention-heads 96 --seq-length 2048 --micro-batch-size 1 "
            "--global-batch-size 1536 --fp16 --lr 6.0e-5 --tensor-model-parallel-size 8 "
            "--pipeline-model-parallel-size 16")
    launch = parse(line, tmp_path)
    assert (launch.launcher, launch.world_size, launch.nproc_per_node, launch.nnodes) == (
        "torchrun", 8, 8, 1)
    assert launch.program[0] == "examples/classes/pretrain_gpt.py"
    assert launch.origins["nproc_per_node"] == "torchrun --nproc_per_node"


def test_torchrun_dashes_equals_and_node_rank(tmp_path: Path) -> None:
    launch = parse("python -m torch.distributed.run --nproc-per-node=4 --nnodes=2 "
                   "--node-rank 1 train.py --lr 1e-4", tmp_path)
    assert (launch.launcher, launch.world_size, launch.nnodes, launch.node_rank) == (
        "torchrun", 8, 2, 1)


def test_torchrun_elastic_range_is_unknown(tmp_path: Path) -> None:
    launch = parse("torchrun --nnodes 1:4 --nproc-per-node 8 train.py", tmp_path)
    assert launch.world_size is None
    assert any("1:4" in n for n in launch.notes)


def test_torchrun_gpu_counts_from_the_machine(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert parse("torchrun --nproc-per-node gpu train.py", tmp_path, gpus=4).world_size == 4
    assert parse("torchrun --nproc-per-node gpu train.py", tmp_path).world_size is None


def test_hf_trainer_under_torchrun_names_deepspeed_and_model(tmp_path: Path) -> None:
    # transformers examples/pytorch/language-modeling/README.md, with a DeepSpeed JSON
    _touch(tmp_path, "ds_config.json", "llama/config.json")
    line = ("torchrun --nproc_per_node 8 run_clm.py --model_name_or_path ./llama "
            "--dataset_name wikitext --per_device_train_batch_size 8 --do_train "
            "--output_dir /tmp/test-clm --deepspeed ds_config.json")
    launch = parse(line, tmp_path)
    assert launch.world_size == 8
    assert launch.deepspeed == tmp_path / "ds_config.json"
    assert launch.model == tmp_path / "llama" / "config.json"


def test_deepspeed_num_gpus(tmp_path: Path) -> None:
    # DeepSpeedExamples DeepSpeed-Chat step1 training_scripts (single node)
    launch = parse("deepspeed --num_gpus 8 main.py --data_path Dahoas/rm-static "
                   "--model_name_or_path facebook/opt-1.3b --per_device_train_batch_size 8 "
                   "--zero_stage 2 --deepspeed --output_dir ./output", tmp_path)
    assert (launch.launcher, launch.world_size) == ("deepspeed", 8)
    assert launch.model is None  # a hub id: not on this machine


def test_deepspeed_include_and_hostfile(tmp_path: Path) -> None:
    launch = parse("deepspeed --include localhost:0,1,2,3 main.py", tmp_path)
    assert (launch.world_size, launch.nproc_per_node, launch.nnodes) == (4, 4, 1)
    (tmp_path / "hostfile").write_text("worker-1 slots=8\nworker-2 slots=8\n")
    launch = parse("deepspeed --hostfile hostfile main.py --deepspeed_config ds.json",
                   tmp_path)
    assert (launch.world_size, launch.nproc_per_node, launch.nnodes) == (16, 8, 2)
    assert any("ds.json" in n for n in launch.notes)  # named but not here


def test_accelerate_launch_options(tmp_path: Path) -> None:
    _touch(tmp_path, "fsdp.yaml")
    launch = parse("accelerate launch --config_file fsdp.yaml --num_processes 16 "
                   "--num_machines 2 --machine_rank 0 --mixed_precision bf16 train.py",
                   tmp_path)
    assert (launch.launcher, launch.world_size, launch.nproc_per_node, launch.nnodes) == (
        "accelerate", 16, 8, 2)
    assert launch.configs == [tmp_path / "fsdp.yaml"]
    assert ("precision.dtype", "bf16", "accelerate --mixed_precision") in launch.values


def test_axolotl_both_ways(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # Axolotl README
    _touch(tmp_path, "examples/llama-3/lora-1b.yml", "examples/openllama-3b/lora.yml")
    launch = parse("axolotl train examples/llama-3/lora-1b.yml", tmp_path, gpus=2)
    assert launch.launcher == "axolotl"
    assert launch.configs == [tmp_path / "examples/llama-3/lora-1b.yml"]
    assert launch.world_size == 2
    launch = parse("accelerate launch -m axolotl.cli.train examples/openllama-3b/lora.yml",
                   tmp_path)
    assert launch.launcher == "accelerate"
    assert launch.configs == [tmp_path / "examples/openllama-3b/lora.yml"]


def test_llamafactory_cli(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("NPROC_PER_NODE", raising=False)
    monkeypatch.delenv("NNODES", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # LLaMA-Factory README / examples/README.md
    _touch(tmp_path, "examples/train_full/llama3_full_sft.yaml")
    launch = parse("env FORCE_TORCHRUN=1 NNODES=2 NPROC_PER_NODE=8 llamafactory-cli train "
                   "examples/train_full/llama3_full_sft.yaml", tmp_path)
    assert (launch.launcher, launch.world_size, launch.nnodes) == ("llamafactory", 16, 2)
    assert launch.configs == [tmp_path / "examples/train_full/llama3_full_sft.yaml"]
    launch = parse("llamafactory-cli train examples/train_full/llama3_full_sft.yaml "
                   "learning_rate=1e-5", tmp_path)
    assert any("learning_rate=1e-5" in n for n in launch.notes)


def test_torchtune_recipe_and_config(tmp_path: Path) -> None:
    # torchtune README: a built-in config name, then a local YAML
    launch = parse("tune run --nproc_per_node 2 full_finetune_distributed "
                   "--config llama3_1/8B_full", tmp_path)
    assert (launch.launcher, launch.world_size) == ("torchtune", 2)
    assert launch.configs == []
    assert any("built-in" in n for n in launch.notes)
    _touch(tmp_path, "my_config.yaml")
    launch = parse("tune run lora_finetune_single_device --config my_config.yaml", tmp_path)
    assert (launch.world_size, launch.configs) == (1, [tmp_path / "my_config.yaml"])


def test_trl_and_litgpt_and_composer(tmp_path: Path) -> None:
    _touch(tmp_path, "recipe.yaml", "config_hub/pretrain/tinyllama.yaml", "yamls/mpt-7b.yaml")
    launch = parse("trl sft --config recipe.yaml --num_processes 4", tmp_path)
    assert (launch.launcher, launch.world_size, launch.configs) == (
        "trl", 4, [tmp_path / "recipe.yaml"])
    # LitGPT docs: litgpt pretrain --config config_hub/pretrain/tinyllama.yaml
    launch = parse("litgpt pretrain --config config_hub/pretrain/tinyllama.yaml --devices 8 "
                   "--num_nodes 2", tmp_path)
    assert (launch.launcher, launch.world_size, launch.nnodes) == ("litgpt", 16, 2)
    # llm-foundry README: composer train.py yamls/pretrain/mpt-125m.yaml
    launch = parse("composer -n 8 train.py yamls/mpt-7b.yaml max_duration=10ba", tmp_path)
    assert (launch.launcher, launch.world_size) == ("composer", 8)
    assert launch.configs == [tmp_path / "yamls/mpt-7b.yaml"]


def test_python_script_module_and_code(tmp_path: Path) -> None:
    launch = parse("python train.py config/train_gpt2.py --learning_rate=6e-4", tmp_path)
    # alone, python says nothing of the world size (Lightning may spawn its processes)
    assert (launch.launcher, launch.world_size, launch.trains) == ("python", None, True)
    launch = parse("python -m my_pkg.train --per_device_train_batch_size 4", tmp_path)
    assert launch.program[0] == "my_pkg.train"
    assert parse('python -c "print(1)"', tmp_path).trains is False


def test_shell_script_is_a_config(tmp_path: Path) -> None:
    _touch(tmp_path, "pretrain_gpt.sh")
    for line in ("bash pretrain_gpt.sh ckpt tb", "./pretrain_gpt.sh"):
        launch = parse(line, tmp_path)
        assert (launch.launcher, launch.configs) == ("shell", [tmp_path / "pretrain_gpt.sh"])
    assert parse("bash -c 'echo hi'", tmp_path).trains is False


@pytest.mark.parametrize("line", ["", "torchrun", "deepspeed --num_gpus", "accelerate launch"])
def test_incomplete_commands_do_not_raise(tmp_path: Path, line: str) -> None:
    parse_command(shlex.split(line), tmp_path)


def test_an_unknown_launcher_flag_does_not_swallow_the_script(tmp_path: Path) -> None:
    launch = parse("accelerate launch --some_new_flag train.py --lr 1", tmp_path)
    assert launch.program[0] == "train.py"
    launch = parse("python -m torch.distributed.launch --use_env --nproc_per_node 2 train.py",
                   tmp_path)
    assert (launch.world_size, launch.program[0]) == (2, "train.py")
