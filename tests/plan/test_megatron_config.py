"""The Megatron-LM / Megatron-DeepSpeed reader: real launch scripts and a real log load
into the Plan their authors meant, the CLI gives the same verdicts as the equivalent
hand-written plan, bash is followed as bash runs it, unknown values stay unknown (C006),
misspelled arguments are C005, bad values one line naming file and argument, and mutated
scripts never crash sapper."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import stable_settings, time_limit
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.errors import InputError
from sapper.model import architecture_from_plan, total_params
from sapper.plan.load import load_plan
from sapper.plan.readers.base import Sniff
from sapper.plan.readers.megatron_args import DESTS, OPTIONS
from sapper.plan.readers.registry import detect_config, read_config
from sapper.plan.readers.shell import read_script

ROOT = Path(__file__).parent.parent.parent
EXAMPLES = ROOT / "examples"
MEG = EXAMPLES / "megatron"
GPT3 = MEG / "train_gpt3_175b_distributed.sh"
MIXTRAL = MEG / "train_mixtral_8x7b_distributed.sh"
LLAMA3 = MEG / "train_llama3_8b_h100_fp8.sh"
V26 = MEG / "pretrain_gpt_distributed_with_mp.sh"
BLOOM = MEG / "tr11-176B-ml.slurm"
NVLM = MEG / "pretrain_yi_34b_internvit_6b.sh"
LOG = MEG / "megatron-deepspeed-llama-fp16.log"
runner = CliRunner()
_register_commands()


def check(*args: str):
    return runner.invoke(app, ["check", *args])


def check_json(*args: str) -> dict:
    res = check(*args, "-f", "json")
    assert res.exit_code in (0, 1), res.output
    return json.loads(res.stdout)


def codes(findings: list[dict], prefix: str | None = None) -> list[str]:
    return sorted(f["code"] for f in findings if prefix is None or f["code"].startswith(prefix))


# ---- detection ------------------------------------------------------------------------
def test_a_megatron_log_with_its_arguments_dump_is_megatron() -> None:
    log = EXAMPLES / "logs" / "megatron-gpt345m-fp16.log"
    assert detect_config(Sniff.of(log)).name == "megatron"
    src = read_config(log)
    assert src.data["hardware"] == {"num_gpus": 8}  # "using world size: 8, ..."
    assert src.origin["hardware.num_gpus"] == "using world size"
    assert "model.vocab_size" in src.unresolved


@pytest.mark.parametrize(
    "text",
    [
        "python train.py --per_device_train_batch_size 8 --learning_rate 3e-5",
        "model:\n  num_layers: 32\n  hidden_size: 4096\n",
        '{"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32}',
        "echo --num-layers",
    ],
)
def test_other_text_is_not_megatron(tmp_path: Path, text: str) -> None:
    from sapper.plan.readers.megatron import FORMAT

    path = tmp_path / "x.sh"
    path.write_text(text)
    assert FORMAT.recognise(Sniff.of(path)) < 0.3


# ---- real examples, field by field ----------------------------------------------------
def test_gpt3_175b_example() -> None:
    src = read_config(GPT3)
    d = src.data
    assert src.format == "megatron" and d["framework"] == "megatron"
    assert d["parallel"]["tp"] == 8 and d["parallel"]["pp"] == 16
    assert d["hardware"] == {"gpus_per_node": 8, "nodes": 1}
    assert d["batch"] == {"micro_batch_size": 1, "global_batch_size": 1536, "seq_len": 2048}
    assert d["precision"]["dtype"] == "fp16"
    scaling = d["precision"]["loss_scaling"]
    assert scaling == {
        "mode": "dynamic", "initial_scale": 2.0**32, "min_scale": 1.0,
        "growth_interval": 1000, "hysteresis": 2,
    }
    assert d["optimizer"] == {
        "type": "adamw", "lr": 6e-5, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
    }
    # --lr-warmup-fraction .001 of --lr-decay-iters 430000
    assert d["schedule"] == {
        "type": "cosine", "min_lr": 6e-6, "total_steps": 500000, "warmup_steps": 430,
    }
    assert d["clipping"]["max_norm"] == 1.0
    assert d["init"]["std"] == 0.006
    m = d["model"]
    assert (m["num_layers"], m["hidden_size"], m["num_heads"]) == (96, 12288, 96)
    assert "vocab_size" not in m  # the vocabulary is the tokenizer file's ($3) ...
    assert load_plan(configs=[GPT3]).plan.model is None  # ... so the model is unknown
    assert {"model.vocab_size", "data.path"} <= set(src.unresolved)
    assert src.origin["schedule.warmup_steps"] == (
        "--lr-warmup-fraction (via $TRAINING_ARGS) × --lr-decay-iters"
    )
    assert src.origin["optimizer.eps"] == "--adam-eps (Megatron default)"
    assert src.origin["hardware.gpus_per_node"] == "torchrun --nproc_per_node"


def test_gpt3_175b_through_the_cli() -> None:
    out = check_json("--config", str(GPT3))
    # TP 8 × PP 16 = 128 GPUs per replica, on the 8 the script sets up
    assert "P102" in codes(out["findings"])
    assert out["summary"]["items"]["memory"] == "unknown"
    c006 = [f for f in out["findings"] if f["code"] == "C006"]
    assert any("$5 is an argument the script is called with" in f["message"] for f in c006)


def test_bloom_176b_slurm_script() -> None:
    src = read_config(BLOOM)
    d, m = src.data, src.data["model"]
    assert d["framework"] == "deepspeed"
    assert d["hardware"] == {"gpus_per_node": 8, "nodes": 24}
    # NNODES=$SLURM_NNODES, which Slurm sets from "#SBATCH --nodes=24"
    assert src.origin["hardware.nodes"].startswith("torchrun --nnodes")
    assert (d["parallel"]["tp"], d["parallel"]["pp"]) == (4, 12)
    assert d["parallel"]["checkpointing"]["granularity"] == "full"  # --checkpoint-activations
    assert (m["num_layers"], m["hidden_size"], m["num_heads"]) == (70, 14336, 112)
    assert m["vocab_size"] == 250880 and m["position_encoding"] == "alibi"
    assert m["ffn_hidden_size"] == 4 * 14336 and m["tied_embeddings"] is True
    assert d["precision"]["dtype"] == "bf16"
    assert d["batch"] == {"micro_batch_size": 2, "global_batch_size": 2048, "seq_len": 2048}
    assert "rampup-batch-size" in src.origin["batch.global_batch_size"]
    assert d["init"]["std"] == 0.0048
    assert d["optimizer"]["betas"] == [0.9, 0.95] and d["optimizer"]["weight_decay"] == 0.1
    # the ramp makes the step counts of --train-samples / --lr-warmup-samples unknown
    assert set(src.unresolved) == {"schedule.total_steps", "schedule.warmup_steps"}
    # the DeepSpeed config the script writes with `cat <<EOT > $config_json`, where
    # config_json="./ds_config.$SLURM_JOB_ID.json" is also what --deepspeed_config names
    assert d["clipping"]["max_norm"] == 1.0 and d["parallel"]["zero_stage"] == 0
    assert d["parallel"]["optimizer_partitioned"] is True  # bf16 + ZeRO 0: BF16_Optimizer
    assert src.origin["parallel.zero_stage"] == (
        "zero_optimization.stage (in the heredoc for ./ds_config.$SLURM_JOB_ID.json)"
    )


#: BLOOM-176B as a sapper plan, written from the script by hand.
BLOOM_PLAN = """
framework: deepspeed
model:
  family: gpt
  implementation: megatron
  num_layers: 70
  hidden_size: 14336
  num_heads: 112
  num_kv_heads: 112
  ffn_hidden_size: 57344
  activation: gelu
  hidden_act: gelu
  vocab_size: 250880
  max_position_embeddings: 2048
  position_encoding: alibi
  norm_type: layernorm
  tied_embeddings: true
  attention_bias: true
  mlp_bias: true
  dropout: 0.1
precision:
  dtype: bf16
  grad_dtype: fp32
  loss_scaling:
    mode: none
clipping:
  max_norm: 1.0
optimizer:
  type: adamw
  lr: 6.0e-5
  betas: [0.9, 0.95]
  eps: 1.0e-8
  weight_decay: 0.1
schedule:
  type: cosine
  min_lr: 6.0e-6
init:
  std: 0.0048
  residual_scaling: depth
batch:
  micro_batch_size: 2
  global_batch_size: 2048
  seq_len: 2048
parallel:
  tp: 4
  pp: 12
  checkpointing:
    granularity: full
  pipeline_scatter_gather: false
  zero_stage: 0
  optimizer_partitioned: true
  overlap_dp_comm: false
hardware:
  gpus_per_node: 8
  nodes: 24
unresolved: [schedule.total_steps, schedule.warmup_steps]
"""


def _verdicts(out: dict) -> tuple[dict, list[str], dict]:
    items = {k: v for k, v in out["summary"]["items"].items() if k != "config"}
    return items, codes(out["findings"], None), out["summary"]["derived"]


@pytest.mark.parametrize("gpu", [[], ["--gpu", "A100-80GB"]])
def test_bloom_verdicts_equal_the_hand_written_plan(tmp_path: Path, gpu: list[str]) -> None:
    plan = tmp_path / "bloom.yaml"
    plan.write_text(BLOOM_PLAN)
    from_script = check_json("--config", str(BLOOM), *gpu)
    by_hand = check_json(str(plan), *gpu)
    items, found, derived = _verdicts(from_script)
    hand_items, hand_found, hand_derived = _verdicts(by_hand)
    assert items == hand_items
    assert [c for c in found if not c.startswith("C")] == hand_found
    assert derived == hand_derived
    assert derived["world_size"] == 192 and derived["dp"] == 4
    assert codes(from_script["findings"], "C") == ["C006"] * 2


def test_arguments_dump_in_a_megatron_deepspeed_log() -> None:
    src = read_config(LOG)
    d, m = src.data, src.data["model"]
    assert d["framework"] == "deepspeed"  # deepspeed ... True in the dump
    assert d["hardware"] == {"num_gpus": 8}  # world_size
    assert (d["parallel"]["tp"], d["parallel"]["pp"]) == (2, 2)
    assert m["vocab_size"] == 32000  # "> padded vocab (size: 32000) ... (new size: 32000)"
    assert (m["num_layers"], m["hidden_size"], m["ffn_hidden_size"]) == (24, 2048, 5504)
    assert m["position_encoding"] == "rope"  # use_rotary_position_embeddings True
    assert m["norm_type"] == "rmsnorm" and m["activation"] == "swiglu"
    assert m["attention_bias"] is False and m["tied_embeddings"] is False
    assert d["precision"]["dtype"] == "fp16"
    assert d["schedule"] == {"type": "cosine", "min_lr": 3e-5, "total_steps": 2500,
                             "warmup_steps": 2000}
    assert d["batch"] == {"micro_batch_size": 4, "global_batch_size": 32, "seq_len": 2048}
    assert src.origin["model.num_layers"] == "num_layers"
    # a blend of two datasets; the DeepSpeed JSON (./tmp/deepspeed.json) is not here
    assert {"data.path", "clipping.max_norm", "precision.loss_scaling.mode"} <= set(
        src.unresolved
    )
    out = check_json("--config", str(LOG), "--gpu", "A100-80GB")
    assert out["summary"]["derived"]["parameters"] == 1_345_423_360
    assert out["summary"]["derived"]["gradient_accumulation"] == 4


def test_dump_lines_behind_rank_and_time_prefixes(tmp_path: Path) -> None:
    lines = ["num_layers 32", "hidden_size 4096", "num_attention_heads 32",
             "ffn_hidden_size 11008", "swiglu True", "bf16 True", "fp16 False",
             "padded_vocab_size 32000", "world_size 16", "micro_batch_size 1",
             "global_batch_size 64", "data_parallel_size 16", "lr_warmup_fraction None",
             "lr_warmup_iters 100", "train_iters 1000", "seq_length 4096",
             "max_position_embeddings 4096", "position_embedding_type rope",
             "normalization RMSNorm", "use_distributed_optimizer True"]
    body = "\n".join(
        f"[default0]:[2024-05-01 10:00:00] {n} {'.' * (40 - len(n))} {v}"
        for n, v in (line.split(" ", 1) for line in lines)
    )
    text = (
        "[default0]:using world size: 16, data-parallel size: 16\n"
        "[default0]:------------------------ arguments ------------------------\n"
        f"{body}\n"
        "[default0]:-------------------- end of arguments ---------------------\n"
        " [2024-05-01 10:01:00] iteration 1/1000 | lm loss: 1.0E+01 |\n"
    )
    src = _read(tmp_path, text, "train.log")
    d, m = src.data, src.data["model"]
    assert (m["num_layers"], m["ffn_hidden_size"], m["vocab_size"]) == (32, 11008, 32000)
    assert m["activation"] == "swiglu" and m["norm_type"] == "rmsnorm"
    assert d["hardware"] == {"num_gpus": 16} and d["parallel"]["zero_stage"] == 1
    assert d["schedule"]["warmup_steps"] == 100 and d["precision"]["grad_dtype"] == "fp32"
    assert not [f for f in src.findings if f.code == "C005"]  # a dump has no typos


#: The Megatron-DeepSpeed Llama run of the log, as a sapper plan written from its dump.
LOG_PLAN = """
framework: deepspeed
model:
  implementation: megatron
  num_layers: 24
  hidden_size: 2048
  num_heads: 16
  num_kv_heads: 16
  head_dim: 128
  ffn_hidden_size: 5504
  activation: swiglu
  hidden_act: silu
  vocab_size: 32000
  max_position_embeddings: 2048
  position_encoding: rope
  rope_theta: 10000
  norm_type: rmsnorm
  tied_embeddings: false
  attention_bias: false
  mlp_bias: false
  dropout: 0.0
precision:
  dtype: fp16
optimizer:
  type: adamw
  lr: 3.0e-4
  betas: [0.9, 0.95]
  eps: 1.0e-8
  weight_decay: 0.1
schedule:
  type: cosine
  warmup_steps: 2000
  total_steps: 2500
  min_lr: 3.0e-5
init:
  std: 0.02
  residual_scaling: depth
batch:
  micro_batch_size: 4
  global_batch_size: 32
  seq_len: 2048
parallel:
  tp: 2
  pp: 2
  ep: 1
  pipeline_scatter_gather: false
hardware:
  num_gpus: 8
unresolved: [data.path, clipping.max_norm, precision.loss_scaling.mode, parallel.zero_stage]
"""


def test_log_verdicts_equal_the_hand_written_plan(tmp_path: Path) -> None:
    plan = tmp_path / "llama.yaml"
    plan.write_text(LOG_PLAN)
    for gpu in ([], ["--gpu", "A100-40GB"]):
        from_log = _verdicts(check_json("--config", str(LOG), *gpu))
        by_hand = _verdicts(check_json(str(plan), *gpu))
        assert from_log[0] == by_hand[0] and from_log[2] == by_hand[2]
        assert [c for c in from_log[1] if not c.startswith("C")] == by_hand[1]


def test_mixtral_moe_example() -> None:
    src = read_config(MIXTRAL)
    d = src.data
    assert d["parallel"]["ep"] == 8 and d["parallel"]["pp"] == 4
    assert d["parallel"]["sequence_parallel"] is False  # Megatron turns it off with TP 1
    assert d["parallel"]["zero_stage"] == 1  # --use-distributed-optimizer
    assert d["parallel"]["overlap_dp_comm"] is True and d["parallel"]["overlap_param_gather"]
    assert d["hardware"]["gpus_per_node"] == 8
    assert "hardware.nodes" in src.unresolved  # NNODES=${SLURM_NNODES:-"1"}
    assert "model.vocab_size" in src.unresolved  # Llama2Tokenizer's file
    out = check_json("--config", str(MIXTRAL))
    assert out["summary"]["items"]["memory"] == "unknown"
    assert "pass" not in (out["summary"]["items"]["parallel"],)
    assert any("$LOGGING_ARGS" in f["message"] for f in out["findings"] if f["code"] == "C006")


def test_mixtral_model_with_the_vocabulary_from_a_plan(tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.yaml"
    vocab.write_text("model:\n  vocab_size: 32000\n")
    plan = load_plan(configs=[vocab, MIXTRAL]).plan
    m = plan.model
    assert m is not None and m.num_experts == 8 and m.experts_top_k == 2
    assert (m.num_heads, m.num_kv_heads, m.ffn_hidden_size) == (32, 8, 14336)
    assert m.norm_type.value == "rmsnorm" and m.position_encoding.value == "rope"
    assert m.rope_theta == 1_000_000 and m.tied_embeddings is False
    assert m.attention_bias is False and m.mlp_bias is False
    assert total_params(architecture_from_plan(plan)) == pytest.approx(46.7e9, rel=0.01)


def test_llama3_fp8_branches_follow_the_scripts_own_values() -> None:
    src = read_config(LLAMA3)
    d = src.data
    assert d["precision"]["dtype"] == "fp8"  # if [[ "$DTYPE" == "fp8" ]] with DTYPE="fp8"
    assert d["precision"]["grad_dtype"] == "bf16"  # --grad-reduce-in-bf16
    assert d["parallel"]["zero_stage"] == 1
    # the data arguments depend on $3/$4 (script arguments): both branches stay unknown
    assert "model.vocab_size" in src.unresolved


def test_nvlm_branches_on_numbers_the_script_sets() -> None:
    """DEBUG=0 then ``if [[ $DEBUG -eq 1 ]] ... else BZ=2048``: the else branch runs."""
    src = read_config(NVLM)
    d = src.data
    assert d["batch"]["global_batch_size"] == 2048
    assert d["batch"]["micro_batch_size"] == 1
    assert d["parallel"]["tp"] == 8
    assert d["hardware"] == {"gpus_per_node": 8, "nodes": 1}
    script = read_script(NVLM.read_text())
    assert [w.text for w in script.variables["AD"]] == ["0.1"]
    # $BATCH is the environment's: the branch naming the model stays undecided
    assert script.variables["MODEL_NAME"][0].unknown == ("$MODEL_NAME",)


def test_megatron_v2_example_with_torch_distributed_launch() -> None:
    src = read_config(V26)
    d = src.data
    assert d["hardware"] == {"gpus_per_node": 8, "nodes": 1}
    assert (d["parallel"]["tp"], d["parallel"]["pp"]) == (2, 2)
    assert d["schedule"]["warmup_steps"] == 3200  # .01 × 320000
    assert "data.path" in src.unresolved  # DATA_PATH=<Specify path ...>
    assert not [f for f in src.findings if f.code == "C005"]


# ---- defaults -----------------------------------------------------------------------
def _read(tmp_path: Path, text: str, name: str = "train.sh"):
    path = tmp_path / name
    path.write_text(text)
    return read_config(path)


MINIMAL = (
    "torchrun --nproc_per_node 4 pretrain_gpt.py --num-layers 2 --hidden-size 4096 "
    "--num-attention-heads 32 --seq-length 1024 --max-position-embeddings 1024 "
    "--micro-batch-size 2 --vocab-size 50257 --tokenizer-type NullTokenizer {extra}\n"
)


def test_megatron_defaults_fill_what_the_launch_leaves_out(tmp_path: Path) -> None:
    src = _read(tmp_path, MINIMAL.format(extra="--fp16 --train-iters 10"))
    d = src.data
    assert d["clipping"]["max_norm"] == 1.0
    assert d["init"] == {"std": 0.02, "residual_scaling": "depth"}
    assert d["optimizer"] == {"type": "adamw", "betas": [0.9, 0.999], "eps": 1e-8,
                              "weight_decay": 0.01}
    assert d["schedule"] == {"type": "linear", "min_lr": 0.0, "total_steps": 10,
                             "warmup_steps": 0}
    assert d["model"]["ffn_hidden_size"] == 4 * 4096 and d["model"]["activation"] == "gelu"
    assert d["model"]["position_encoding"] == "learned" and d["model"]["dropout"] == 0.1
    assert d["model"]["norm_type"] == "layernorm" and d["model"]["tied_embeddings"] is True
    assert d["model"]["attention_bias"] is True and d["model"]["mlp_bias"] is True
    assert d["model"]["vocab_size"] == 50304  # padded to a multiple of 128 × TP 1
    assert d["hardware"] == {"gpus_per_node": 4, "nodes": 1}  # torchrun's --nnodes 1
    assert d["parallel"]["overlap_dp_comm"] is False and d["parallel"]["zero_stage"] == 0
    assert src.origin["clipping.max_norm"] == "--clip-grad (Megatron default)"
    assert d["precision"]["loss_scaling"]["initial_scale"] == 2.0**32


def test_swiglu_ffn_and_gqa_defaults(tmp_path: Path) -> None:
    src = _read(tmp_path, MINIMAL.format(
        extra="--swiglu --group-query-attention --num-query-groups 8 "
        "--tensor-model-parallel-size 2 --position-embedding-type rope --bf16"))
    m = src.data["model"]
    assert m["ffn_hidden_size"] == int((4 * 4096 * 2 / 3) / 64) * 64 == 10880
    assert m["num_kv_heads"] == 8 and m["activation"] == "swiglu"
    assert m["position_encoding"] == "rope" and m["rope_theta"] == 10000.0
    assert m["vocab_size"] == 50432  # multiple of 128 × TP 2 = 256
    assert src.data["precision"]["grad_dtype"] == "fp32"  # bf16 grads accumulate in fp32


def test_samples_become_steps_and_interleaving(tmp_path: Path) -> None:
    src = _read(tmp_path, MINIMAL.format(
        extra="--global-batch-size 64 --train-samples 6400 --lr-warmup-samples 640 "
        "--num-layers 8 --num-layers-per-virtual-pipeline-stage 2 "
        "--pipeline-model-parallel-size 2 "
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2 "
        "--loss-scale 1024 --fp16"))
    d = src.data
    assert d["schedule"]["total_steps"] == 100 and d["schedule"]["warmup_steps"] == 10
    assert d["parallel"]["virtual_pipeline_stages"] == 2  # 8 layers / (PP 2 × 2 per chunk)
    assert d["parallel"]["pipeline_schedule"] == "interleaved"
    assert d["parallel"]["checkpointing"] == {"granularity": "full", "every_k_layers": 2}
    assert d["precision"]["loss_scaling"] == {"mode": "static", "static_scale": 1024.0}


def test_deepspeed_json_next_to_the_script_is_read(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.5,
        "zero_optimization": {"stage": 1}, "fp16": {"enabled": True, "loss_scale": 0}}))
    script = MINIMAL.format(extra="--fp16 --deepspeed --deepspeed_config ds.json")
    path = tmp_path / "train.sh"
    path.write_text(script)
    src = read_config(path)
    assert src.refs["deepspeed"] == tmp_path / "ds.json"
    assert src.data["framework"] == "deepspeed" and "clipping" not in src.data
    plan = load_plan(configs=[path]).plan
    assert plan.clipping.max_norm == 0.5 and plan.parallel.zero_stage == 1
    assert plan.precision.loss_scaling.mode == "dynamic"
    assert plan.model is not None and plan.model.num_layers == 2


def test_plain_text_arguments_and_a_dataset_on_this_machine(tmp_path: Path) -> None:
    (tmp_path / "corpus_text_document.bin").write_bytes(b"")
    (tmp_path / "corpus_text_document.idx").write_bytes(b"")
    args = MINIMAL.split("pretrain_gpt.py", 1)[1].format(extra="")
    src = _read(tmp_path, f"{args.strip()} --data-path=corpus_text_document\n", "args.txt")
    assert src.data["model"]["num_layers"] == 2 and "hardware" not in src.data
    assert src.data["data"] == {"path": str(tmp_path / "corpus_text_document.bin"),
                                "format": "megatron"}


@pytest.mark.parametrize(
    ("launcher", "hardware", "unresolved"),
    [
        ("deepspeed --num_gpus 8 --num_nodes 2", {"gpus_per_node": 8, "nodes": 2}, []),
        ("deepspeed --hostfile hosts", {}, ["hardware.gpus_per_node", "hardware.nodes"]),
        ("torchrun --nproc-per-node=gpu --nnodes=1:4", {},
         ["hardware.gpus_per_node", "hardware.nodes"]),
        ("python -m torch.distributed.launch --nproc_per_node=2", {"gpus_per_node": 2,
                                                                    "nodes": 1}, []),
        ("python", {"num_gpus": 1}, []),
        ("srun python", {}, ["hardware.num_gpus"]),
    ],
)
def test_launchers(tmp_path: Path, launcher: str, hardware: dict, unresolved: list) -> None:
    text = MINIMAL.replace("torchrun --nproc_per_node 4", launcher).format(extra="")
    src = _read(tmp_path, text)
    assert src.data.get("hardware", {}) == hardware
    assert set(unresolved) <= set(src.unresolved)


# ---- bash, as bash runs it -----------------------------------------------------------
SHELL = r"""#!/bin/bash
# comments, continuations, quotes
export GPUS=4   # per node
NODES=2
LAYERS=${LAYERS:-12}
: ${HEADS:=16}
WIDTH=$((64 * HEADS))
MODEL=( --num-layers $LAYERS
        --hidden-size $WIDTH   # a comment inside
        "--num-attention-heads" "${HEADS}" )
if [ "$NODES" = 2 ]; then
    PAR="--tensor-model-parallel-size 2"
else
    PAR="--tensor-model-parallel-size 8"
fi
LAUNCH="torchrun --nproc_per_node $GPUS --nnodes $NODES"
$LAUNCH \
    pretrain_gpt.py ${MODEL[@]} $PAR \
    --micro-batch-size 1 --seq-length '2048' --max-position-embeddings 2048 \
    --lr 1e-4 --vocab-size 1000 --tokenizer-type NullTokenizer
"""


def test_bash_variables_arrays_arithmetic_and_branches(tmp_path: Path) -> None:
    d = _read(tmp_path, SHELL).data
    assert (d["model"]["num_layers"], d["model"]["hidden_size"]) == (12, 1024)
    assert d["model"]["num_heads"] == 16
    assert d["parallel"]["tp"] == 2
    assert d["hardware"] == {"gpus_per_node": 4, "nodes": 2}
    assert d["batch"]["seq_len"] == 2048


@pytest.mark.parametrize(
    ("text", "word", "unknown"),
    [
        ('A=3\nB=4\necho "$((A*B+1))"', "13", ()),
        ("A=( x y )\nA+=( z )\necho ${A[@]}", "x y z", ()),
        ('echo "${N:-5}" ${M:=7} $M', "5 7 7", ()),
        ("echo $((NNODES*8))", None, ("$NNODES",)),
        ("echo $SLURM_NNODES ${SLURM_NNODES:-1}", None, ("$SLURM_NNODES",)),
        ("echo $1 $(hostname)", None, ("$1", "$(hostname)")),
        ("if [ -z \"$X\" ]; then Y=1; fi\necho $Y", None, ("$Y",)),
        ("cat <<EOT > f\n--num-layers 3\nEOT\necho done", "done", ()),
        ('echo "a b" c\\\n d', "a b c d", ()),
        ("echo $((2**80))", None, ("$((2**80))",)),
        ("X=1\ncat <<'EOF' > f\n$X\nEOF\necho ok", "ok", ()),
        ("false && A=1\necho ${A:-unset} 2>&1", "unset", ()),
        # tests the script decides: numbers, [[ ]] with && || ! ( ), patterns, -a/-o
        ("D=0\nif [[ $D -eq 1 ]]; then B=1; else B=2048; fi\necho $B", "2048", ()),
        ("N=4\nif [ $N -gt 2 ]; then B=a; elif [ $N -lt 9 ]; then B=b; fi\necho $B", "a", ()),
        ("X=fp8\nif [[ $X == fp* && -n $X ]]; then Y=a; else Y=b; fi\necho $Y", "a", ()),
        ('X=fp8\nif [[ $X == "fp*" ]]; then Y=a; else Y=b; fi\necho $Y', "b", ()),
        ('X=""\nif [[ -n $X ]]; then Y=a; else Y=b; fi\necho $Y', "b", ()),
        ('X=""\nif [ -n $X ]; then Y=a; else Y=b; fi\necho $Y', "a", ()),  # [ -n ] is true
        ('X=1\nif ! [ "$X" = 1 ]; then Y=a; else Y=b; fi\necho $Y', "b", ()),
        ("A=2\n[ $A -gt 1 -a 3 -lt 2 ] && Y=a || Y=b\necho $Y", "b", ()),
        ("X=1\nif [[ ( $X == 1 ) && ! ( $X == 2 ) ]]; then Y=a; fi\necho $Y", "a", ()),
        ('D=MOCK\nif [[ "$1" == MOCK ]] || [[ $D == MOCK ]]; then Y=a; else Y=b; fi\necho $Y',
         "a", ()),
        ("M=1.7B\nif [ ${M} == 3.6B ]; then L=30\nelif [ ${M} == 1.7B ]; then L=24\nfi\n"
         "echo $L", "24", ()),
        # ... and those the environment, the arguments or the machine decide
        ("if [[ $BATCH -eq 0 ]]; then Y=a; else Y=b; fi\necho $Y", None, ("$Y",)),
        ('if [ "$1" = "-d" ]; then Y=a; else Y=b; fi\necho $Y', None, ("$Y",)),
        ("if [ -f pretrain_gpt.py ]; then Y=a; fi\necho $Y", None, ("$Y",)),
        ("X=ab\nif [[ $X =~ ^a ]]; then Y=a; fi\necho $Y", None, ("$Y",)),
        ("X=ab\nif [[ $X == $P* ]]; then Y=a; fi\necho $Y", None, ("$Y",)),
        ("X=v2\nif [ $X -eq 2 ]; then Y=a; fi\necho $Y", None, ("$Y",)),
        ("X=1\nif [[ $X == 1 && $Z == 1 ]]; then Y=a; fi\necho $Y", None, ("$Y",)),
    ],
)
def test_shell_expansion(text: str, word: str | None, unknown: tuple[str, ...]) -> None:
    script = read_script(text)
    echo = [c for c in script.commands if c.words[0].text == "echo"][-1]
    words = echo.words[1:]
    if word is not None:
        assert " ".join(w.text for w in words) == word
    found = tuple(dict.fromkeys(n for w in words for n in w.unknown))
    assert found == unknown
    for name in unknown:
        assert script.reasons[name]


def test_a_heredoc_is_the_text_written_to_its_file() -> None:
    script = read_script("S=3\ncat <<EOT > ds_$S.json\n{\"stage\": $S}\nEOT\n"
                         "cat <<'EOT' > raw.json\n{\"stage\": $S}\nEOT\n")
    assert script.files["ds_3.json"].text == '{"stage": 3}\n'
    assert script.files["raw.json"].text == '{"stage": $S}\n'


def test_scheduler_variables_stay_unknown_never_their_fallback(tmp_path: Path) -> None:
    src = _read(tmp_path, "NNODES=${SLURM_NNODES:-1}\n" + MINIMAL.replace(
        "torchrun --nproc_per_node 4", "torchrun --nproc_per_node 4 --nnodes $NNODES"
    ).format(extra=""))
    assert "hardware.nodes" in src.unresolved
    finding = next(f for f in src.findings if f.code == "C006")
    assert "$SLURM_NNODES is set by the scheduler" in finding.message
    out = check_json("--config", str(tmp_path / "train.sh"))
    assert "hardware.nodes" in out["summary"]["unresolved"]


# ---- typos, unknowns, bad values ------------------------------------------------------
@pytest.mark.parametrize(
    ("typo", "meant"),
    [("--num-layer", "--num-layers"), ("--hidden_size", "--hidden-size"),
     ("--micro-batch-sizes", "--micro-batch-size"), ("--clip-grads", "--clip-grad")],
)
def test_misspelled_arguments_are_c005_with_the_argument_meant(
    tmp_path: Path, typo: str, meant: str
) -> None:
    src = _read(tmp_path, MINIMAL.format(extra=f"{typo} 4"))
    found = [f for f in src.findings if f.code == "C005"]
    assert len(found) == 1 and found[0].data["suggestion"] == meant
    assert "unrecognized arguments" in found[0].message


def test_programs_with_their_own_arguments_are_not_checked_for_typos(tmp_path: Path) -> None:
    text = MINIMAL.format(extra="--my-own-flag 3").replace(
        "pretrain_gpt.py", "-m examples.mine.train")
    src = _read(tmp_path, text)
    assert src.data["model"]["num_layers"] == 2
    assert not [f for f in src.findings if f.code == "C005"]


def test_a_settings_file_for_another_script_to_source(tmp_path: Path) -> None:
    src = _read(tmp_path, 'MODEL_ARGS="--num-layers 4 --hidden-size 256 '
                '--num-attention-heads 4 --seq-length 128"\nTRAIN_ARGS="--lr 1e-3"\n')
    assert src.data["model"]["num_layers"] == 4 and src.data["batch"]["seq_len"] == 128


def test_shape_from_the_checkpoint(tmp_path: Path) -> None:
    src = _read(tmp_path, MINIMAL.replace("--num-layers 2", "--num-layers -1").format(
        extra=""))
    assert "model" not in src.data and "model" in src.unresolved


def test_options_of_older_releases_and_the_deepspeed_fork_are_known() -> None:
    for option in ("--checkpoint-activations", "--pad-vocab-size-to", "--zero-stage",
                   "--deepspeed_config", "--use-rotary-position-embeddings",
                   "--activations-checkpoint-method", "--num-layers", "--fp8-format"):
        assert option in OPTIONS, option
    assert OPTIONS["--disable-bias-linear"] == ("add_bias_linear", "f")
    assert {"num_layers", "add_bias_linear", "world_size"} - DESTS <= {"world_size"}
    for option, (dest, kind) in OPTIONS.items():
        assert option.startswith("--") and re.fullmatch(r"\w+", dest) and kind in "vtfb"


@pytest.mark.parametrize(
    ("extra", "parts"),
    [
        ("--num-layers abc", ["train.sh", "--num-layers", "'abc'", "a whole number ≥ 1"]),
        ("--lr 1e-4x", ["--lr", "'1e-4x'", "a number"]),
        ("--lr-decay-style cosinus", ["--lr-decay-style", "cosine"]),
        ("--fp16 --bf16", ["--fp16", "--bf16", "refuses to start"]),
        ("--hidden-size 4095", ["--hidden-size", "--num-attention-heads (32)"]),
        ("--num-layers " + "9" * 200, ["--num-layers", "a whole number"]),
    ],
)
def test_bad_values_are_one_line_naming_file_and_argument(
    tmp_path: Path, extra: str, parts: list[str]
) -> None:
    path = tmp_path / "train.sh"
    path.write_text(MINIMAL.format(extra=extra))
    with pytest.raises(InputError):
        read_config(path)
    res = check("--config", str(path))
    assert res.exit_code == 2, res.output
    line = " ".join(res.output.split())
    assert "Traceback" not in res.output
    for part in parts:
        assert part in line, (part, line)


def test_no_arguments_at_all(tmp_path: Path) -> None:
    path = tmp_path / "empty.log"
    path.write_text("------------------------ arguments ------------------------\n")
    res = check("--config", str(path), "--config-format", "megatron")
    assert res.exit_code == 2 and "no Megatron arguments found" in res.output


# ---- hostile input --------------------------------------------------------------------
_SOURCES = {p: p.read_bytes() for p in sorted(MEG.glob("*")) if p.suffix != ".md"}
_TOKENS = [b"$(", b"${", b"$((", b"))", b'"', b"'", b"\\", b"\n", b"\x00", b"<<EOF\n",
           b"9" * 400, b"$((2**62*2**62))", b"${A[@]}", b"A=(", b")", b"if [ x ]; then",
           b"fi", b"bash -c \"", b"--num-layers", b"-1", b"0", b"nan", b"1e999"]


@st.composite
def _mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(p.name for p in _SOURCES)))
    out = bytearray(_SOURCES[MEG / name])
    for _ in range(draw(st.integers(1, 3))):
        pos = draw(st.integers(0, max(len(out) - 1, 0)))
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "repeat"]))
        if kind == "flip" and out:
            out[pos] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            out[pos:pos] = draw(st.sampled_from(_TOKENS))
        elif kind == "delete":
            del out[pos : pos + draw(st.integers(1, 80))]
        elif kind == "truncate":
            del out[pos:]
        else:
            out[pos:pos] = bytes(out[pos : pos + draw(st.integers(1, 30))]) * draw(
                st.integers(2, 500))
    return name, bytes(out)


@given(case=_mutated())
@stable_settings(150)
def test_mutated_launches_never_crash(tmp_path_factory: pytest.TempPathFactory,
                                      case: tuple[str, bytes]) -> None:
    name, data = case
    path = tmp_path_factory.mktemp("meg") / name
    path.write_bytes(data)
    with time_limit(20):
        res = runner.invoke(app, ["check", "--config", str(path), "--config-format",
                                  "megatron", "-f", "json"])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"{name}: exit 3") from res.exception
    assert res.exit_code in (0, 1, 2), res.output[:500]
    assert "Traceback" not in res.output


def test_a_doubling_array_and_deep_bash_c_are_bounded() -> None:
    text = "A=(x)\n" + "A=( ${A[@]} ${A[@]} )\n" * 40 + "echo ${A[@]}\n"
    with time_limit(10):
        script = read_script(text)
    assert len(script.commands[-1].words) <= 20_001
    nested = 'bash -c "bash -c \\"' * 30 + "echo --num-layers 1"
    with time_limit(10):
        read_script(nested)


# ---- the tokenizer's vocabulary --------------------------------------------------------
GPT2_SCRIPT = ROOT / "tests" / "fixtures" / "megatron" / "selfgenerate-1.3b-unconditional.sh"
TOKENIZER = (
    "torchrun --nproc_per_node 4 pretrain_gpt.py --num-layers 2 --hidden-size 4096 "
    "--num-attention-heads 32 --seq-length 1024 --max-position-embeddings 1024 "
    "--micro-batch-size 2 --tensor-model-parallel-size 2 {extra}\n"
)


def test_gpt2_bpe_is_gpt2s_vocabulary_whatever_the_files_path() -> None:
    """Megatron-LM's detoxify generation script: GPT2BPETokenizer with the vocab file in a
    variable, TP 1: 50,257 padded to a multiple of 128."""
    src = read_config(GPT2_SCRIPT)
    assert src.data["model"]["vocab_size"] == 50304
    assert "GPT2BPETokenizer" in src.origin["model.vocab_size"]
    assert "model.vocab_size" not in src.unresolved


@pytest.mark.parametrize(
    ("extra", "vocab"),
    [
        ("--tokenizer-type GPT2BPETokenizer --vocab-file $3 --merge-file $4", 50432),
        ("--tokenizer-type GPT2BPETokenizer --make-vocab-size-divisible-by 64", 50304),
        ("--tokenizer-type GPT2BPETokenizer --tokenizer-special-tokens '<a>'", None),
        ("--tokenizer-type GPT2BPETokenizer --vocab-extra-ids 100", None),
        ("--tokenizer-type BertWordPieceLowerCase --vocab-file vocab.txt", None),
        ("--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Llama-3.1-8B", None),
        ("--tokenizer-type Llama2Tokenizer --tokenizer-model $TOKENIZER_MODEL", None),
        ("--tokenizer-type Llama2Tokenizer --tokenizer-model missing.model", None),
        ("--tokenizer-type $TOK --vocab-size 32000", None),
    ],
)
def test_the_vocabulary_a_tokenizer_type_decides(
    tmp_path: Path, extra: str, vocab: int | None
) -> None:
    src = _read(tmp_path, TOKENIZER.format(extra=extra))
    if vocab is None:
        assert "vocab_size" not in src.data.get("model", {})
        assert "model.vocab_size" in src.unresolved
    else:
        assert src.data["model"]["vocab_size"] == vocab


def _sentencepiece_model(pieces: int) -> bytes:
    """A SentencePiece ModelProto: ``pieces`` SentencePiece messages (field 1: piece,
    score) and a trainer_spec (field 2), as sentencepiece writes them."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    def field(number: int, body: bytes) -> bytes:
        return varint(number << 3 | 2) + varint(len(body)) + body

    data = b"".join(
        field(1, field(1, f"▁t{i}".encode()) + b"\x15\x00\x00\x80\xbf") for i in range(pieces)
    )
    return data + field(2, b"\x08\x02" + field(1, b"corpus.txt"))


def test_a_sentencepiece_model_on_this_machine_gives_its_piece_count(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.model").write_bytes(_sentencepiece_model(32003))
    src = _read(tmp_path, TOKENIZER.format(
        extra="--tokenizer-type Llama2Tokenizer --tokenizer-model tokenizer.model"))
    assert src.data["model"]["vocab_size"] == 32256  # 32,003 padded to 128 × TP 2
    assert "32,003 SentencePiece pieces" in src.origin["model.vocab_size"]
    (tmp_path / "bad.model").write_bytes(b"\xff" * 64)
    src = _read(tmp_path, TOKENIZER.format(
        extra="--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model bad.model"))
    assert "model.vocab_size" in src.unresolved


def test_a_hugging_face_tokenizer_folder_gives_len_tokenizer(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"t{i}": i for i in range(1000)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0"))
    tok.add_special_tokens(["<|begin|>", "<|end|>", "t5"])  # t5 is in the vocabulary
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    expected = tok.get_vocab_size(with_added_tokens=True)
    assert expected == 1002
    src = _read(tmp_path, TOKENIZER.format(
        extra="--tokenizer-type HuggingFaceTokenizer --tokenizer-model tok"))
    assert src.data["model"]["vocab_size"] == 1024  # 1,002 padded to 256
    (tmp_path / "tok" / "tokenizer.json").write_text('{"model": {}}')
    src = _read(tmp_path, TOKENIZER.format(
        extra="--tokenizer-type HuggingFaceTokenizer --tokenizer-model tok"))
    assert "model.vocab_size" in src.unresolved
