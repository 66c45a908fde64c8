"""Writes the example logs in this folder (synthetic runs in each tool's exact format).

Each log replays a failure sapper should name: a loss spike with a NaN gradient norm and
an eval loss that turns up (HF Trainer), an fp16 run whose loss scale collapses with
skipped and NaN iterations (Megatron-LM), a run whose LR never warms up and whose loss
stalls (W&B CSV export), and a healthy run recorded by sapper's own monitor. Re-run with
``python examples/logs/make_examples.py``; the seed is fixed so the files do not change.
"""

from __future__ import annotations

import csv
import json
import math
import random
from pathlib import Path

HERE = Path(__file__).parent


def cosine_lr(step: int, peak: float, warmup: int, total: int, floor: float = 0.0) -> float:
    if step < warmup:
        return peak * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def trainer_state(rng: random.Random) -> None:
    """Llama-style SFT, 600 steps, logging every 10, eval every 50: a spike at 330, a NaN
    gradient norm at 340, eval loss bottoming out at 350 and rising after (overfitting)."""
    history = []
    total, per_epoch = 600, 200
    for step in range(10, total + 1, 10):
        lr = cosine_lr(step, 2e-5, 30, total)
        loss = 0.95 + 1.25 * math.exp(-step / 90) - 0.00045 * step + rng.gauss(0, 0.025)
        grad = 0.9 * math.exp(-step / 300) + 0.35 + abs(rng.gauss(0, 0.05))
        if step == 330:
            loss, grad = 3.874, 41.7
        if step == 340:
            grad = math.nan
        entry = {
            "epoch": round(step / per_epoch, 4),
            "grad_norm": grad,
            "learning_rate": lr,
            "loss": round(loss, 4),
            "step": step,
        }
        history.append(entry)
        if step % 50 == 0:
            eval_loss = 1.05 + 0.9 * math.exp(-step / 110) + max(0.0, step - 350) * 0.0011
            history.append({
                "epoch": round(step / per_epoch, 4),
                "eval_loss": round(eval_loss + rng.gauss(0, 0.004), 4),
                "eval_runtime": round(41.3 + rng.gauss(0, 0.4), 3),
                "eval_samples_per_second": 48.4,
                "eval_steps_per_second": 3.03,
                "step": step,
            })
    history.append({
        "epoch": 3.0, "step": total, "total_flos": 1.9112846655438848e17,
        "train_loss": 0.8841, "train_runtime": 5321.77,
        "train_samples_per_second": 14.43, "train_steps_per_second": 0.113,
    })
    state = {
        "best_global_step": 350,
        "best_metric": min(e["eval_loss"] for e in history if "eval_loss" in e),
        "best_model_checkpoint": "out/llama-sft/checkpoint-350",
        "epoch": 3.0,
        "eval_steps": 50,
        "global_step": total,
        "is_hyper_param_search": False,
        "is_local_process_zero": True,
        "is_world_process_zero": True,
        "log_history": history,
        "logging_steps": 10,
        "max_steps": total,
        "num_input_tokens_seen": 0,
        "num_train_epochs": 3,
        "save_steps": 50,
        "stateful_callbacks": {"TrainerControl": {"args": {"should_save": True}}},
        "total_flos": 1.9112846655438848e17,
        "train_batch_size": 4,
        "trial_name": None,
        "trial_params": None,
    }
    # Python's json writes the NaN grad norm as NaN, as the Trainer's file does.
    (HERE / "hf-llama-sft" / "trainer_state.json").parent.mkdir(exist_ok=True)
    (HERE / "hf-llama-sft" / "trainer_state.json").write_text(json.dumps(state, indent=2) + "\n")


def megatron(rng: random.Random) -> None:
    """GPT-345M in fp16, log interval 10, 3000 iterations: the loss scale starts at 2^32
    and backs off; at 1800 gradients blow up, the scale collapses to 1 with skipped and
    NaN iterations."""
    lines = [
        "using world size: 8, data-parallel size: 8, context-parallel size: 1, "
        "tensor-model-parallel size: 1, pipeline-model-parallel size: 1",
        "------------------------ arguments ------------------------",
    ]
    args = {
        "fp16": True, "bf16": False, "clip_grad": 1.0, "global_batch_size": 256,
        "hidden_size": 1024, "initial_loss_scale": 4294967296, "log_interval": 10,
        "lr": 0.00015, "lr_decay_style": "cosine", "lr_warmup_iters": 300, "min_lr": 1e-05,
        "micro_batch_size": 4, "num_attention_heads": 16, "num_layers": 24,
        "seq_length": 1024, "train_iters": 3000,
    }
    lines += [f"  {k} {'.' * (40 - len(k))} {v}" for k, v in args.items()]
    lines += ["-------------------- end of arguments ---------------------",
              "[before the start of training step] datetime: 2024-05-14 10:02:11 "]
    scale, clean, skipped_total = 2.0**32, 0, 0
    consumed, t0 = 0, 1715680931
    for it in range(1, 3001):
        grad_max = 0.12 * math.exp(-it / 800) + 0.02
        if 1800 <= it < 1840:
            grad_max *= 4000.0  # the blow-up
        overflow = scale * grad_max > 65504.0 or (1800 <= it < 1819)
        if overflow:
            scale = max(1.0, scale / 2)
            clean = 0
        else:
            clean += 1
            if clean == 1000:
                scale, clean = scale * 2, 0
        if it == 1:
            window = {"skip": 0, "nan": 0, "loss": [], "gn": [], "advanced": 0}
        consumed += 256
        if overflow:
            window["skip"] += 1
        else:
            window["advanced"] += 1
            base = 10.9 * math.exp(-it / 140) + 3.15 + 0.9 * math.exp(-it / 1500)
            loss = base + rng.gauss(0, 0.03)
            if 1819 <= it < 1840:
                loss = base + 3.6 * math.exp(-(it - 1819) / 25)
            if it == 1822:
                loss, window["nan"] = math.nan, window["nan"] + 1
            window["loss"].append(loss)
            window["gn"].append(
                (40 * grad_max) if 1800 <= it < 1840 else 0.35 + 2.5 * math.exp(-it / 200)
            )
        if it % 10 == 0:
            skipped_total += window["skip"]
            stamp = t0 + int(it * 0.861)
            day = f"2024-05-14 {10 + stamp // 3600 % 24 - 10:02d}"
            clock = f"{day}:{stamp // 60 % 60:02d}:{stamp % 60:02d}"
            parts = [
                f" [{clock}] iteration {it:8d}/{3000:8d}",
                f" consumed samples: {consumed:12d}",
                f" elapsed time per iteration (ms): {861.2 + rng.gauss(0, 9):.1f}",
                f" throughput per GPU (TFLOP/s/GPU): {97.4 + rng.gauss(0, 1):.1f}",
                f" learning rate: {cosine_lr(it, 1.5e-4, 300, 3000, 1e-5):.6E}",
                f" global batch size: {256:5d}",
            ]
            losses = window["loss"]
            avg = sum(losses) / len(losses) if losses else 0.0
            if losses and avg > 0:
                parts.append(f" lm loss: {avg:.6E}")
            parts.append(f" loss scale: {scale:.1f}")
            if window["gn"]:
                parts.append(f" grad norm: {sum(window['gn']) / len(window['gn']):.3f}")
            parts.append(f" num zeros: {rng.randint(0, 40):.1f}")
            parts.append(f" number of skipped iterations: {window['skip']:3d}")
            parts.append(f" number of nan iterations: {window['nan']:3d}")
            lines.append(" |".join(parts) + " |")
            if it == 10:
                lines.append(
                    "[Rank 0] (after 10 iterations) memory (MB) | allocated: 6518.5048828125 | "
                    "max allocated: 21587.7734375 | reserved: 23412.0 | max reserved: 23412.0"
                )
            window = {"skip": 0, "nan": 0, "loss": [], "gn": [], "advanced": 0}
        if it % 500 == 0:
            val = 10.9 * math.exp(-it / 140) + 3.3 + 0.9 * math.exp(-it / 1500)
            text = (f" validation loss at iteration {it} | lm loss value: {val:.6E} | "
                    f"lm loss PPL: {math.exp(val):.6E} | ")
            lines += ["-" * len(text), text, "-" * len(text)]
        if it % 1000 == 0:
            lines.append(f"saving checkpoint at iteration {it:7d} to /checkpoints/gpt-345m")
            lines.append(
                f"  successfully saved checkpoint from iteration {it:7d} to /checkpoints/gpt-345m"
            )
    (HERE / "megatron-gpt345m-fp16.log").write_text("\n".join(lines) + "\n")


def wandb_csv(rng: random.Random) -> None:
    """A W&B history export (``run.history()``) of a run whose LR never warmed up past a
    tiny value: the loss barely moves, the gradient norm stays tiny."""
    rows = []
    for i, step in enumerate(range(0, 2000, 5)):
        row = {
            "_step": i,
            "_runtime": round(step * 0.43, 2),
            "_timestamp": 1716000000 + step * 0.43,
            "train/global_step": step,
            "train/loss": round(7.9 - 0.00012 * step + rng.gauss(0, 0.02), 4),
            "train/grad_norm": round(0.0021 + abs(rng.gauss(0, 0.0003)), 5),
            "train/learning_rate": 3e-8,
            "train/epoch": round(step / 4000, 4),
            "perf/tokens_per_sec": round(151000 + rng.gauss(0, 1500), 1),
            "perf/gpu_mem_peak": "",
            "eval/loss": "",
        }
        if step % 250 == 0:
            row["perf/gpu_mem_peak"] = round(61.2 + rng.gauss(0, 0.1), 2)
        rows.append(row)
        if step % 500 == 0 and step:
            rows.append({
                "_step": i, "_runtime": row["_runtime"], "_timestamp": row["_timestamp"],
                "train/global_step": step, "eval/loss": round(7.88 - 0.00011 * step, 4),
            })
    cols = list(rows[0])
    with (HERE / "wandb-history-lr-stuck.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, cols, restval="")
        writer.writeheader()
        writer.writerows(rows)


def sapper_runlog(rng: random.Random) -> None:
    """A healthy bf16 run recorded by the monitor (every 10 steps, 2000 steps)."""
    lines = [json.dumps({"kind": "meta", "version": 1, "started": 1716100000.0,
                         "run": "gpt2-small-bf16", "log_every": 10})]
    for step in range(10, 2001, 10):
        rec = {
            "kind": "step",
            "step": step,
            "loss": round(3.1 + 7.6 * math.exp(-step / 180) + rng.gauss(0, 0.02), 4),
            "grad_norm": round(0.3 + 1.8 * math.exp(-step / 150) + abs(rng.gauss(0, 0.03)), 4),
            "clip_threshold": 1.0,
            "lr": cosine_lr(step, 6e-4, 200, 2000, 6e-5),
            "memory_allocated_gib": 14.2,
            "memory_peak_gib": round(31.8 + rng.gauss(0, 0.05), 3),
            "memory_limit_gib": 79.6,
            "step_time_s": round(0.212 + abs(rng.gauss(0, 0.004)), 4),
            "data_time_s": round(0.002 + abs(rng.gauss(0, 0.0005)), 5),
            "tokens": 491520 // 8,
            "tokens_per_s": round(61440 / 0.214 + rng.gauss(0, 800), 1),
            "time": 1716100000.0 + step * 0.214,
        }
        lines.append(json.dumps(rec))
    (HERE / "sapper-gpt2-healthy.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    trainer_state(random.Random(7))
    megatron(random.Random(11))
    wandb_csv(random.Random(13))
    sapper_runlog(random.Random(17))
