"""Accuracy of sapper's memory estimators against a measured training step.

Ground truth: one real training step (forward with the loss, backward, optimizer step,
zero_grad) of a real transformers model on CPU. Its peak of live tensor bytes is read
from the PyTorch profiler's allocator events (every allocation and free, in order) plus
the bytes alive when the step starts (weights, buffers, optimizer states, the batch) —
independent of sapper's own byte tracker. The step before it creates the optimizer
states, so the measured step is a steady-state one.

Columns: measured; sapper's analytic estimate (``sapper.memory.estimate`` tensor peak,
CPU kernels); sapper's traced estimate (the same model on fake tensors); and, on the
same rows, the library estimates users reach for: DeepSpeed's
``estimate_zero2_model_states_mem_needs`` (1 GPU, no offload) and accelerate's
``estimate-memory`` figure ("Training using Adam": the max of its per-part sizes). The
last two count model states only and assume Adam; they show n/a for SGD and "not
installed" when the library is missing. Neither is a dependency of sapper.

Targets (issue 3): analytic within 5% of measured on every row and within 2% at the
median; traced within 1%.

    python benchmarks/memory_accuracy.py            # 256 rows (foreach; --impl adds the loop)
    python benchmarks/memory_accuracy.py --quick    # 16 rows an implementation (two a family)
    python benchmarks/memory_accuracy.py --impl for_loop --impl foreach   # both loops
    python benchmarks/memory_accuracy.py --family mixtral --family phi   # some families
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile
from transformers import AutoConfig, AutoModelForCausalLM

from sapper.memory import MemoryOptions, estimate
from sapper.memory.traced import StepConfig, build_optimizer, run_step, trace_step
from sapper.plan.load import build_plan
from sapper.plan.readers.hf_config import read_hf_config
from sapper.plan.schema import Plan
from sapper.plan.sources import PlanSource

MIB = 1 << 20

#: Small members of each family, built from configs (no download): dense GQA (llama),
#: MoE (mixtral, transformers' grouped experts; qwen2_moe with a gated shared expert;
#: deepseek_v3 with latent attention, a shared expert and a dense first block), partial
#: rotary with a parallel block (phi, half the head rotated), q/k/v biases (qwen2),
#: learned positions (gpt2), and gemma (tied, scaled embeddings, GeLU-tanh gated MLP,
#: one KV head).
FAMILIES: dict[str, dict[str, Any]] = {
    "gpt2": {
        "model_type": "gpt2",
        "n_embd": 384,
        "n_layer": 4,
        "n_head": 6,
        "vocab_size": 8192,
        "n_positions": 1024,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
    # vocabulary / width as in Llama-2-7B (32000 / 4096 ≈ 8): the blocks, not only the
    # loss, decide the peak
    "llama": {
        "model_type": "llama",
        "hidden_size": 512,
        "intermediate_size": 1376,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,  # GQA
        "vocab_size": 4096,
        "max_position_embeddings": 1024,
    },
    "mixtral": {
        "model_type": "mixtral",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 4096,
        "max_position_embeddings": 1024,
    },
    "phi": {
        "model_type": "phi",
        "hidden_size": 384,
        "intermediate_size": 1536,
        "num_hidden_layers": 4,
        "num_attention_heads": 6,
        "partial_rotary_factor": 0.5,
        "vocab_size": 4096,
        "max_position_embeddings": 1024,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attention_dropout": 0.0,
    },
    "qwen2": {
        "model_type": "qwen2",
        "hidden_size": 384,
        "intermediate_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "vocab_size": 4096,
        "max_position_embeddings": 1024,
    },
    # a shared expert (with its sigmoid gate) beside the routed ones
    "qwen2_moe": {
        "model_type": "qwen2_moe",
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 4096,
        "max_position_embeddings": 1024,
    },
    # multi-head latent attention, a shared expert, one leading dense block
    "deepseek_v3": {
        "model_type": "deepseek_v3",
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "num_hidden_layers": 4,
        "first_k_dense_replace": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "kv_lora_rank": 64,
        "q_lora_rank": 96,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "vocab_size": 4096,
        "max_position_embeddings": 1024,
    },
    "gemma": {
        "model_type": "gemma",
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "vocab_size": 4096,
        "max_position_embeddings": 1024,
    },
}

SIZES = ((4, 256), (2, 1024))  # (micro batch, sequence length)


def model_source(family: str, tmp: Path) -> PlanSource:
    """The Plan's model section as a user gets it: read from the family's config.json."""
    path = tmp / f"{family}.json"
    path.write_text(json.dumps(FAMILIES[family]))
    return read_hf_config(path)


@dataclass(frozen=True)
class Row:
    family: str
    precision: str  # fp32 / bf16 (autocast)
    ckpt: bool
    optimizer: str
    batch: int
    seq: int
    attn: str
    impl: str = "foreach"  # the optimizer's implementation: foreach or for_loop


    def step(self) -> StepConfig:
        return StepConfig(
            micro_batch=self.batch,
            seq_len=self.seq,
            optimizer=self.optimizer,
            autocast="bf16" if self.precision == "bf16" else None,
            checkpointing=self.ckpt,
            momentum=0.9,
            weight_decay=0.01,
            foreach=self.impl == "foreach",
        )

    def plan(self) -> Plan:
        with tempfile.TemporaryDirectory() as tmp:
            model = model_source(self.family, Path(tmp))
        over = PlanSource(name="benchmark")
        for key, value in {
            "model.attention_impl": self.attn,
            "precision.dtype": self.precision,
            "precision.autocast": self.precision == "bf16",
            "optimizer.type": self.optimizer,
            "optimizer.momentum": 0.9 if self.optimizer == "sgd" else 0.0,
            "optimizer.weight_decay": 0.01,
            "optimizer.impl": self.impl,  # as the measured step runs it (StepConfig)
            "batch.micro_batch_size": self.batch,
            "batch.seq_len": self.seq,
            "batch.gradient_accumulation_steps": 1,
            "parallel.checkpointing.granularity": "full" if self.ckpt else "none",
        }.items():
            over.set(key, value)
        return build_plan([model, over]).plan

    def hf_config(self) -> Any:
        data = dict(FAMILIES[self.family])
        model_type = data.pop("model_type")
        return AutoConfig.for_model(model_type, attn_implementation=self.attn, **data)


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st._cdata] = st.nbytes()
    return sum(seen.values())


def measure(row: Row) -> tuple[int, int]:
    """(measured peak bytes, parameter count) of one real steady-state step on CPU."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(row.hf_config())
    model.train()
    cfg = row.step()
    if cfg.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = build_optimizer(model, cfg)
    ids = torch.randint(0, FAMILIES[row.family]["vocab_size"], (row.batch, row.seq))
    run_step(model, opt, ids, cfg)  # creates the optimizer states
    alive = [*model.parameters(), *model.buffers(), ids]
    alive += [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    base = _storage_bytes(alive)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run_step(model, opt, ids, cfg)
    events: list[tuple[int, int]] = []

    def walk(node: Any) -> None:
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        for child in node.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    events.sort()
    current = peak = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return base + peak, sum(p.numel() for p in model.parameters())


def deepspeed_estimate(row: Row, n_params: int) -> int | str:
    if row.optimizer != "adamw":
        return "n/a"
    try:
        from deepspeed.runtime.zero.stage_1_and_2 import (
            estimate_zero2_model_states_mem_needs,
        )
    except Exception as exc:  # not installed, or its import fails on this machine
        return f"import failed: {type(exc).__name__}"
    _, gpu = estimate_zero2_model_states_mem_needs(
        n_params, num_gpus_per_node=1, num_nodes=1, cpu_offload=False
    )
    return int(gpu)


def accelerate_estimate(row: Row) -> int | str:
    if row.optimizer != "adamw":
        return "n/a"
    try:
        from accelerate import init_empty_weights
        from accelerate.commands.estimate import (
            calculate_maximum_sizes,
            estimate_training_usage,
        )
    except Exception as exc:
        return f"import failed: {type(exc).__name__}"
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(row.hf_config())
    total, _ = calculate_maximum_sizes(model)
    usage = estimate_training_usage(total, "bfloat16" if row.precision == "bf16" else "float32")
    return int(max(usage.values()))


def _fmt(value: int | str, truth: int) -> str:
    if isinstance(value, str):
        return value
    return f"{value / MIB:8.2f} ({100 * (value / truth - 1):+6.2f}%)"


def rows(quick: bool, impls: list[str]) -> list[Row]:
    out = [
        Row(fam, prec, ckpt, opt, b, s, attn, impl)
        for impl, fam, prec, ckpt, opt, (b, s), attn in itertools.product(
            impls, FAMILIES, ("fp32", "bf16"), (False, True), ("adamw", "sgd"), SIZES,
            ("eager", "sdpa"),
        )
    ]
    if quick:  # two rows a family: fp32 eager, bf16 autocast SDPA checkpointed
        out = [r for r in out if r.optimizer == "adamw" and r.batch == 2
               and r.ckpt == (r.attn == "sdpa") == (r.precision == "bf16")]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two rows a family")
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES),
                        help="only these families (repeatable)")
    parser.add_argument("--size", action="append", choices=[f"{b}x{s}" for b, s in SIZES],
                        help="only these micro batch × sequence sizes (repeatable)")
    parser.add_argument("--impl", action="append", choices=["foreach", "for_loop"],
                        help="the optimizer's implementations (repeatable; default foreach)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    header = (
        "| family | precision | ckpt | optimizer | b×s | attention | measured MiB "
        "| analytic MiB (err) | traced MiB (err) | DeepSpeed MiB (err) | accelerate MiB (err) |"
    )
    print(header)
    print("|" + "---|" * 11)
    errs_a: list[float] = []
    errs_t: list[float] = []
    timings: list[float] = []
    fams: list[str] = []
    opts = MemoryOptions(device="cpu")
    selected = [
        r for r in rows(args.quick, args.impl or ["foreach"])
        if (not args.family or r.family in args.family)
        and (not args.size or f"{r.batch}x{r.seq}" in args.size)
    ]
    for row in selected:
        truth, n_params = measure(row)
        plan = row.plan()
        t0 = time.perf_counter()
        analytic = estimate(plan, opts).tensor_peak_bytes
        timings.append(time.perf_counter() - t0)
        cfg = row.hf_config()
        traced = trace_step(lambda cfg=cfg: AutoModelForCausalLM.from_config(cfg), row.step(),
                            cfg.vocab_size).peak_bytes
        fams.append(row.family)
        errs_a.append(100 * (analytic / truth - 1))
        errs_t.append(100 * (traced / truth - 1))
        print(
            f"| {row.family} | {row.precision}{' autocast' if row.precision == 'bf16' else ''} "
            f"| {'on' if row.ckpt else 'off'} | {row.optimizer} {row.impl} | {row.batch}×{row.seq} "
            f"| {row.attn} | {truth / MIB:8.2f} | {_fmt(analytic, truth)} "
            f"| {_fmt(traced, truth)} | {_fmt(deepspeed_estimate(row, n_params), truth)} "
            f"| {_fmt(accelerate_estimate(row), truth)} |",
            flush=True,
        )
    print()
    print("| family | rows | analytic worst | analytic median | traced worst | traced median |")
    print("|---|---|---|---|---|---|")
    for fam in dict.fromkeys(fams):
        a = [abs(e) for e, f in zip(errs_a, fams, strict=True) if f == fam]
        t = [abs(e) for e, f in zip(errs_t, fams, strict=True) if f == fam]
        print(f"| {fam} | {len(a)} | {max(a):.2f}% | {statistics.median(a):.2f}% "
              f"| {max(t):.2f}% | {statistics.median(t):.2f}% |")
    worst_a = max(abs(e) for e in errs_a)
    median_a = statistics.median(abs(e) for e in errs_a)
    worst_t = max(abs(e) for e in errs_t)
    median_t = statistics.median(abs(e) for e in errs_t)
    print()
    print(f"rows: {len(errs_a)}")
    print(f"analytic: max |err| {worst_a:.2f}% (target 5%), median |err| {median_a:.2f}% "
          f"(target 2%) -> {'PASS' if worst_a <= 5 and median_a <= 2 else 'FAIL'}")
    print(f"traced:   max |err| {worst_t:.2f}% (target 1%), median |err| {median_t:.2f}% -> "
          f"{'PASS' if worst_t <= 1 else 'FAIL'}")
    print(f"analytic estimate: {1e6 * statistics.median(timings):.0f} µs per call (median)")


if __name__ == "__main__":
    main()
