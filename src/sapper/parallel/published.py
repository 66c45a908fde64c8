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
  smallest interleaving (so the bubble is not understated). The paper gives no FLOP
  formula; PaLM's MFU definition (6N plus the full s x s attention square, causal masking
  not halving it) is assumed, the convention its MFU figures are usually compared in.
  The long-context row (Table 4's third: 131,072 tokens, CP16, DP8, the same 16M tokens
  per batch) uses all-gather context parallelism, which the model prices as ring
  attention overlapped with the attention kernel.

Held out (added to test the model beyond the rows it was first built on; no constant is
fitted to them, but their errors showed which physical effects the model lacked: GEMM
shape, the flash kernels' rates, TP overlap, the loss's memory traffic):

* Megatron-LM README (July 2024, "Training Speed and Scalability"), the weak-scaling
  table: GPT models of 1.7B to 462B parameters on H100 (NVIDIA's EOS: 8 x 400 Gb/s per
  node), bf16, sequence 4096, vocabulary 131072, untied embeddings, data parallel size
  48, with ``--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap``
  (distributed optimizer: ZeRO-1; sequence parallelism, which TP overlap needs). The
  per-GPU TFLOP/s are Megatron-Core's ``num_floating_point_operations``: *model* FLOPs
  (no recomputation counted), the full attention square, the padded vocabulary. Not
  stated, so Megatron's defaults are assumed: micro-batch 1 (the batch per replica is
  4·PP micro-batches, which keeps the 1F1B bubble near 1/5), the non-interleaved 1F1B
  schedule (119B's 92 layers over PP4 leave 23 per stage, which no interleaving
  divides), no recomputation, learned positions, dropout 0.1, fp32 gradient reduction
  (Megatron forces it for bf16).
* BigScience 2022, BLOOM 176B (``train/tr11-176B-ml`` README and slurm script of the
  bigscience repository; Le Scao et al. 2022): 384 A100-80GB on Jean Zay (8 per node, 4 x
  100 Gb/s Omni-Path per node: 6.25 GB/s per GPU), TP4 PP12 DP8, micro-batch 2, global
  batch 2048, sequence 2048, bf16, full recomputation, ALiBi, fused softmax (eager
  attention), dropout 0.1, DeepSpeed's pipeline engine (1F1B, whole activations sent from
  every TP rank, gradients reduced after the pipeline flush), its BF16 optimizer (ZeRO-1
  with fp32 gradient accumulation), 5 layers plus the embedding on the first and last
  stages. About 150 TFLOP/s per GPU in Megatron-DeepSpeed's count: Narayanan et al.'s
  formula with the recomputation factor, *hardware* FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sapper.plan.schema import Plan

__all__ = ["FLOP_DEFINITIONS", "PUBLISHED_RUNS", "PublishedRun"]


#: How each source counts FLOPs (what its TFLOP/s divide).
FLOP_DEFINITIONS = {
    "narayanan": "hardware: 96·B·s·l·h²(1 + s/6h + V/16lh), recomputed forward counted, "
    "full s² attention",
    "llama3": "model (BF16 MFU): 6N + full s² attention assumed (PaLM's MFU; the paper "
    "gives no formula)",
    "mcore": "model: Megatron-Core num_floating_point_operations, no recomputation, full "
    "s² attention, padded vocabulary",
    "bloom": "hardware: Narayanan et al.'s formula with the recomputation factor "
    "(Megatron-DeepSpeed's log)",
}


@dataclass(frozen=True)
class PublishedRun:
    name: str
    source: str
    #: The measured TFLOP/s per GPU, and which convention it is in.
    tflops: float
    convention: Literal["hardware", "model"]
    plan: dict[str, Any]
    #: Key of :data:`FLOP_DEFINITIONS`: how the source counts FLOPs.
    flops: str = "narayanan"
    #: True for the rows added to test the model beyond the ones it was built on.
    held_out: bool = False

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


def _llama3(gpus: int, dp: int, tflops: float, cp: int = 1, seq: int = 8192) -> PublishedRun:
    plan = {
        "name": f"llama3-405b-{gpus}" + (f"-{seq // 1024}k" if cp > 1 else ""),
        "model": {
            "family": "llama",
            "hidden_size": 16384,
            "num_layers": 126,
            "num_heads": 128,
            "num_kv_heads": 8,
            "ffn_hidden_size": 53248,
            "vocab_size": 128256,
            "max_position_embeddings": seq,
            "position_encoding": "rope",
            "rope_theta": 500000.0,
            "activation": "swiglu",
            "norm_type": "rmsnorm",
            "attention_impl": "flash",
            "implementation": "megatron",
        },
        "precision": {"dtype": "bf16"},
        "optimizer": {"type": "adamw"},
        "batch": {
            "seq_len": seq, "micro_batch_size": 1, "global_batch_size": 16 * 2**20 // seq
        },
        "parallel": {
            "tp": 8,
            "pp": 16,
            "cp": cp,
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
        name=f"Llama 3 405B, {gpus} GPUs" + (f", {seq // 1024}K context" if cp > 1 else ""),
        source="Llama Team 2024, Table 4",
        tflops=tflops,
        convention="model",
        plan=plan,
        flops="llama3",
        held_out=cp > 1,
    )


def _mcore(
    name: str, heads: int, hidden: int, layers: int, tp: int, pp: int, batch: int,
    tflops: float,
) -> PublishedRun:
    dp = 48
    plan = {
        "name": f"megatron-core-weak-scaling-{name.lower()}",
        "model": {
            "family": "gpt",
            "hidden_size": hidden,
            "num_layers": layers,
            "num_heads": heads,
            "vocab_size": 131072,
            "max_position_embeddings": 4096,
            "position_encoding": "learned",
            "activation": "gelu",
            "norm_type": "layernorm",
            "attention_bias": True,
            "mlp_bias": True,
            "attention_impl": "flash",
            "dropout": 0.1,
            "tied_embeddings": False,
            "implementation": "megatron",
        },
        "precision": {"dtype": "bf16", "grad_dtype": "fp32"},
        "optimizer": {"type": "adam"},
        "batch": {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": batch},
        "parallel": {
            "tp": tp,
            "pp": pp,
            "dp": dp,
            "sequence_parallel": tp > 1,
            "zero_stage": 1,
            "checkpointing": {"granularity": "none"},
            "pipeline_schedule": "1f1b",
            "overlap_dp_comm": True,
            "overlap_param_gather": True,
            "tp_comm_overlap": tp > 1,
        },
        "hardware": {"gpu": "H100", "num_gpus": tp * pp * dp, "gpus_per_node": 8},
    }
    return PublishedRun(
        name=f"MCore GPT {name}",
        source="Megatron-LM README (2024-07), weak-scaling table",
        tflops=tflops,
        convention="model",
        plan=plan,
        flops="mcore",
        held_out=True,
    )


def _bloom() -> PublishedRun:
    plan = {
        "name": "bloom-176b",
        "model": {
            "family": "bloom",
            "hidden_size": 14336,
            "num_layers": 70,
            "num_heads": 112,
            "vocab_size": 250880,
            "max_position_embeddings": 2048,
            "position_encoding": "alibi",
            "activation": "gelu",
            "norm_type": "layernorm",
            "attention_bias": True,
            "mlp_bias": True,
            "attention_impl": "eager",
            "dropout": 0.1,
            "tied_embeddings": True,
            "implementation": "megatron",
        },
        "precision": {"dtype": "bf16", "grad_dtype": "fp32"},
        "optimizer": {"type": "adam"},
        "batch": {"seq_len": 2048, "micro_batch_size": 2, "global_batch_size": 2048},
        "parallel": {
            "tp": 4,
            "pp": 12,
            "dp": 8,
            "zero_stage": 1,
            "checkpointing": {"granularity": "full"},
            "pipeline_schedule": "1f1b",
            "first_stage_layers": 5,
            "last_stage_layers": 5,
            "overlap_dp_comm": False,
            "overlap_param_gather": False,
            "pipeline_scatter_gather": False,
        },
        "hardware": {
            "gpu": "A100-80GB",
            "num_gpus": 384,
            "gpus_per_node": 8,
            "internode_gbps": 6.25,
        },
    }
    return PublishedRun(
        name="BLOOM 176B",
        source="BigScience 2022, tr11-176B-ml README and slurm script",
        tflops=150,
        convention="hardware",
        plan=plan,
        flops="bloom",
        held_out=True,
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
    # held out (see the module doc)
    _mcore("1.7B", 16, 2048, 24, 1, 1, 192, 408.8),
    _mcore("7.1B", 32, 4096, 30, 2, 1, 192, 465.9),
    _mcore("16B", 48, 6144, 32, 4, 1, 192, 489.1),
    _mcore("32B", 56, 7168, 48, 8, 1, 192, 459.6),
    _mcore("70B", 64, 8192, 84, 8, 2, 384, 419.7),
    _mcore("119B", 80, 10240, 92, 8, 4, 768, 420.5),
    _mcore("177B", 96, 12288, 96, 8, 6, 1152, 432.8),
    _mcore("314B", 128, 16384, 96, 8, 8, 1536, 474.4),
    _mcore("462B", 144, 18432, 112, 8, 16, 3072, 459.9),
    _bloom(),
    _llama3(16384, 8, 380, cp=16, seq=131072),
)
