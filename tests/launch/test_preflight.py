"""The plan of a launch is the plan ``sapper check`` reads from the same files and flags,
plus the launcher's process counts and the machine's GPU."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from sapper.launch.command import parse_command
from sapper.launch.preflight import plan_inputs, preflight
from sapper.plan.load import load_plan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _dump(plan) -> dict:
    return plan.model_dump(mode="json")


def test_a_config_cli_reads_the_plan_check_reads(monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("NPROC_PER_NODE", raising=False)
    config = EXAMPLES / "llamafactory" / "qwen3_full_sft.yaml"
    launch = parse_command(["llamafactory-cli", "train", str(config)], ROOT)
    pre = preflight(launch, ROOT)
    assert pre.report is not None
    assert _dump(pre.loaded.plan) == _dump(load_plan(configs=[config]).plan)


def test_trainer_flags_launcher_counts_and_gpu(tmp_path: Path) -> None:
    model = tmp_path / "llama"
    model.mkdir()
    shutil.copy(EXAMPLES / "hf" / "llama-2-7b.json", model / "config.json")
    shutil.copy(EXAMPLES / "deepspeed" / "zero2-bf16.json", tmp_path / "ds.json")
    line = ("torchrun --nproc-per-node 8 --nnodes 2 train.py --deepspeed ds.json "
            "--model_name_or_path ./llama --per_device_train_batch_size 4 "
            "--gradient_accumulation_steps 2 --learning_rate 2e-5 --bf16 "
            "--num_train_epochs 1 --output_dir out --max_seq_length 4096")
    launch = parse_command(shlex.split(line), tmp_path)
    pre = preflight(launch, tmp_path, gpu="H100", gpu_origin="this machine: NVIDIA H100")
    plan, origins = pre.loaded.plan, pre.loaded.origins
    assert plan.model is not None and plan.model.family == "llama"
    assert (plan.hardware.num_gpus, plan.hardware.gpus_per_node, plan.hardware.nodes) == (
        16, 8, 2)
    assert plan.hardware.gpu == "H100"
    assert plan.optimizer.lr == 2e-5
    assert plan.batch.micro_batch_size == 4
    assert origins["hardware.gpu"] == "this machine: NVIDIA H100"
    assert "torchrun --nproc-per-node" in origins["hardware.num_gpus"]
    assert origins["optimizer.lr"].startswith("launch command")
    # check reads the same command line (as a file) into the same plan values
    (tmp_path / "launch.sh").write_text(line + "\n")
    checked = load_plan(configs=[tmp_path / "launch.sh"]).plan
    assert checked.optimizer.lr == plan.optimizer.lr
    assert checked.model == plan.model


def test_megatron_script_is_read_as_check_reads_it() -> None:
    script = EXAMPLES / "megatron" / "tr11-176B-ml.slurm"
    launch = parse_command(["bash", str(script)], ROOT)
    pre = preflight(launch, ROOT)
    assert _dump(pre.loaded.plan) == _dump(load_plan(configs=[script]).plan)


def test_nothing_to_read_is_no_checklist(tmp_path: Path) -> None:
    launch = parse_command(["python", "-c", "print(1)"], tmp_path)
    assert plan_inputs(launch, tmp_path) is None
    pre = preflight(launch, tmp_path)
    assert pre.report is None and pre.errors == 0 and "names no config" in pre.skipped


def test_an_unreadable_config_is_said_not_raised(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("model: [unclosed\n")
    launch = parse_command(["python", "train.py", "--config", "bad.yaml"], tmp_path)
    pre = preflight(launch, tmp_path)
    assert pre.report is None and pre.skipped.startswith("could not read the plan")


def test_what_the_user_gives_completes_and_wins(tmp_path: Path) -> None:
    from sapper.launch.preflight import Given

    launch = parse_command(["python", "train.py"], tmp_path)
    assert plan_inputs(launch, tmp_path) is None
    given = Given({"gpu": "A100-80GB", "seq_len": 2048},
                  configs=[EXAMPLES / "plans" / "healthy-llama-7b.yaml"])
    pre = preflight(launch, tmp_path, gpu="H100", gpu_origin="this machine", given=given)
    plan, origins = pre.loaded.plan, pre.loaded.origins
    assert (plan.hardware.gpu, plan.batch.seq_len) == ("A100-80GB", 2048)
    assert (origins["hardware.gpu"], origins["batch.seq_len"]) == ("--gpu", "--seq-len")
