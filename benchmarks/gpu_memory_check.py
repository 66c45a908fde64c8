"""On a CUDA machine: sapper's estimate against ``torch.cuda.max_memory_allocated``.

Builds real transformers models on the GPU, runs two training steps (the first creates
the optimizer states), resets the peak counter and measures the third. Prints measured,
the analytic estimate (CUDA kernels: bool dropout masks, GPU attention) and the traced
one (fake tensors, CPU kernels) per row. CI does not run it (no GPU there).

    python benchmarks/gpu_memory_check.py [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import sys
import warnings
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from sapper.memory import MemoryOptions, estimate
from sapper.memory.traced import StepConfig, build_optimizer, run_step, trace_step
from sapper.plan.schema import Plan

MIB = 1 << 20

CONFIGS: dict[str, dict[str, Any]] = {
    "llama-1b": {
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
    },
    "gpt2-medium": {
        "model_type": "gpt2",
        "n_embd": 1024,
        "n_layer": 12,
        "n_head": 16,
        "vocab_size": 50257,
        "n_positions": 2048,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    },
}


def _plan(name: str, cfg: dict[str, Any], b: int, s: int, amp: bool, ckpt: bool) -> Plan:
    if cfg["model_type"] == "gpt2":
        model = {
            "family": "gpt2", "hidden_size": cfg["n_embd"], "num_layers": cfg["n_layer"],
            "num_heads": cfg["n_head"], "vocab_size": cfg["vocab_size"],
            "max_position_embeddings": cfg["n_positions"], "position_encoding": "learned",
            "activation": "gelu", "hidden_act": "gelu_new", "norm_type": "layernorm",
            "tied_embeddings": True, "attention_bias": True, "mlp_bias": True,
        }
    else:
        model = {
            "family": "llama", "hidden_size": cfg["hidden_size"],
            "num_layers": cfg["num_hidden_layers"], "num_heads": cfg["num_attention_heads"],
            "num_kv_heads": cfg["num_key_value_heads"],
            "ffn_hidden_size": cfg["intermediate_size"], "vocab_size": cfg["vocab_size"],
            "max_position_embeddings": cfg["max_position_embeddings"],
            "position_encoding": "rope", "activation": "swiglu", "hidden_act": "silu",
            "norm_type": "rmsnorm",
        }
    return Plan.model_validate({
        "name": name,
        "model": {**model, "attention_impl": "sdpa"},
        "precision": {"dtype": "bf16" if amp else "fp32", "autocast": amp},
        "optimizer": {"type": "adamw", "weight_decay": 0.01},
        "batch": {"micro_batch_size": b, "seq_len": s},
        "parallel": {"checkpointing": {"granularity": "full" if ckpt else "none"}},
    })


def measure(cfg: dict[str, Any], step: StepConfig) -> int:
    data = dict(cfg)
    config = AutoConfig.for_model(data.pop("model_type"), attn_implementation="sdpa", **data)
    model = AutoModelForCausalLM.from_config(config).cuda().train()
    if step.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = build_optimizer(model, step)
    ids = torch.randint(0, config.vocab_size, (step.micro_batch, step.seq_len), device="cuda")
    for _ in range(2):
        run_step(model, opt, ids, step)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    run_step(model, opt, ids, step)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del model, opt, ids
    torch.cuda.empty_cache()
    return peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU")
        return 1
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print("| model | precision | ckpt | b×s | measured MiB | analytic MiB (err) | "
          "traced MiB (err) |")
    print("|---|---|---|---|---|---|---|")
    sizes = ((2, 1024),) if args.quick else ((2, 1024), (4, 2048))
    for (name, cfg), amp, ckpt, (b, s) in itertools.product(
        CONFIGS.items(), (False, True), (False, True), sizes
    ):
        step = StepConfig(micro_batch=b, seq_len=s, autocast="bf16" if amp else None,
                          checkpointing=ckpt, weight_decay=0.01)
        measured = measure(cfg, step)
        plan = _plan(name, cfg, b, s, amp, ckpt)
        analytic = estimate(plan, MemoryOptions(device="cuda")).tensor_peak_bytes
        data = dict(cfg)
        config = AutoConfig.for_model(data.pop("model_type"), attn_implementation="sdpa", **data)
        traced = trace_step(lambda c=config: AutoModelForCausalLM.from_config(c), step,
                            config.vocab_size).peak_bytes

        def cell(x: int, m: int = measured) -> str:
            return f"{x / MIB:9.1f} ({100 * (x / m - 1):+.2f}%)"

        print(f"| {name} | {'bf16 autocast' if amp else 'fp32'} | {'on' if ckpt else 'off'} "
              f"| {b}×{s} | {measured / MIB:9.1f} | {cell(analytic)} | {cell(traced)} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
