"""Published training runs the cost model is checked against.

Each run is a plan (model, batch, layout, cluster) plus the per-GPU throughput its
authors measured. Sources:

* Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", Table 1: GPT models on A100-80GB (Selene: 8 GPUs per node, 8 x 200
  Gb/s HDR InfiniBand per node), fp16, sequence 2048, vocabulary 51200, full activation
  recomputation. Micro-batch sizes, virtual pipeline stages and the DDP implementation
  are those of the paper's reproduction script (Megatron-LM
  ``examples/sc21/run_table_1.sh``): PyTorch DDP (gradient all-reduce overlapped with the
  backward) up to 18.4B, Megatron's "local" DDP (all-reduce after the backward) above.
  The paper counts FLOPs as 96·B·s·l·h²·(1 + s/6h + V/16lh), recomputation included:
  the *hardware* FLOP rate.
* Llama Team 2024, "The Llama 3 Herd of Models", Table 4: Llama 3 405B on H100 (400 Gb/s
  RoCE per GPU), bf16, sequence 8192, 16M tokens per batch, TP8 (sequence parallel) CP1
  PP16, groups ordered [TP, CP, PP, DP], sharded data parallelism. Reported as BF16 MFU:
  the *model* FLOP rate. The paper states an interleaved schedule, one layer fewer on the
  first and last stages (126 = 7 + 14 x 8 + 7) and 8K-token training without activation
  checkpointing. It does not state the number of virtual stages: v = 2 is assumed, the
  smallest interleaving (so the bubble is not understated).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sapper.plan.schema import Plan

__all__ = ["PUBLISHED_RUNS", "PublishedRun"]


@dataclass(frozen=True)
class PublishedRun:
    name: str
    source: str
    #: The measured TFLOP/s per GPU, and which convention it is in.
    tflops: float
    convention: Literal["hardware", "model"]
    plan: dict[str, Any]

    def to_plan(self) -> Plan:
        return Plan.model_validate(self.plan)


def _gpt(
    name: str, heads: int, hidden: int, layers: int, tp: int, pp: int, gpus: int,
    batch: int, micro: int, v: int, ddp: str, tflops: float,
) -> PublishedRun:
    plan = {
        "name": f"narayanan2021-{name}",
        "model": {
            "family": "gpt2",
            "hidden_size": hidden,
            "num_layers": layers,
            "num_heads": heads,
            "vocab_size": 51200,
            "max_position_embeddings": 2048,
            "position_encoding": "learned",
            "activation": "gelu",
            "norm_type": "layernorm",
            "attention_bias": True,
            "mlp_bias": True,
            "attention_impl": "eager",
            "dropout": 0.1,
            "tied_embeddings": True,
            "implementation": "megatron",
        },
        "precision": {"dtype": "fp16", "loss_scaling": {"mode": "dynamic"}},
        "optimizer": {"type": "adam"},
        "batch": {"seq_len": 2048, "micro_batch_size": micro, "global_batch_size": batch},
        "parallel": {
            "tp": tp,
            "pp": pp,
            "dp": gpus // (tp * pp),
            "zero_stage": 0,
            "checkpointing": {"granularity": "full"},
            "virtual_pipeline_stages": v,
            "pipeline_schedule": "interleaved" if v > 1 else "1f1b",
            "overlap_dp_comm": ddp == "torch",
        },
        "hardware": {"gpu": "A100-80GB", "num_gpus": gpus, "gpus_per_node": 8},
    }
    return PublishedRun(
        name=f"GPT {name}",
        source="Narayanan et al. 2021, Table 1",
        tflops=tflops,
        convention="hardware",
        plan=plan,
    )


def _llama3(gpus: int, dp: int, tflops: float) -> PublishedRun:
    plan = {
        "name": f"llama3-405b-{gpus}",
        "model": {
            "family": "llama",
            "hidden_size": 16384,
            "num_layers": 126,
            "num_heads": 128,
            "num_kv_heads": 8,
            "ffn_hidden_size": 53248,
            "vocab_size": 128256,
            "max_position_embeddings": 8192,
            "position_encoding": "rope",
            "rope_theta": 500000.0,
            "activation": "swiglu",
            "norm_type": "rmsnorm",
            "attention_impl": "flash",
            "implementation": "megatron",
        },
        "precision": {"dtype": "bf16"},
        "optimizer": {"type": "adamw"},
        "batch": {"seq_len": 8192, "micro_batch_size": 1, "global_batch_size": 2048},
        "parallel": {
            "tp": 8,
            "pp": 16,
            "cp": 1,
            "dp": dp,
            "sequence_parallel": True,
            "zero_stage": 1,
            "checkpointing": {"granularity": "none"},
            "virtual_pipeline_stages": 2,
            "pipeline_schedule": "interleaved",
            "first_stage_layers": 7,
            "last_stage_layers": 7,
            "rank_order": "tp-cp-pp-dp",
        },
        "hardware": {"gpu": "H100", "num_gpus": gpus, "gpus_per_node": 8},
    }
    return PublishedRun(
        name=f"Llama 3 405B, {gpus} GPUs",
        source="Llama Team 2024, Table 4",
        tflops=tflops,
        convention="model",
        plan=plan,
    )


PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    _gpt("1.7B", 24, 2304, 24, 1, 1, 32, 512, 16, 1, "torch", 137),
    _gpt("3.6B", 32, 3072, 30, 2, 1, 64, 512, 16, 1, "torch", 138),
    _gpt("7.5B", 32, 4096, 36, 4, 1, 128, 512, 16, 1, "torch", 142),
    _gpt("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 8, 1, "torch", 135),
    _gpt("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 4, 1, "local", 138),
    _gpt("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 2, 3, "local", 140),
    _gpt("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 2, 2, "local", 148),
    _gpt("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 1, 2, "local", 155),
    _gpt("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 1, 3, "local", 163),
    _gpt("1008B", 160, 25600, 128, 8, 64, 3072, 3072, 1, 1, "local", 163),
    _llama3(8192, 64, 430),
    _llama3(16384, 128, 400),
)
