"""Read an Axolotl YAML config into the Plan.

Axolotl builds Hugging Face TrainingArguments from its own keys and runs the HF Trainer, so
the framework is ``transformers`` (``deepspeed`` when a DeepSpeed config is given: the
engine then runs the step). Its defaults are those of its config schema
(src/axolotl/utils/schemas/training.py and config.py at axolotl commit 067b021c):
``micro_batch_size`` 1, ``gradient_accumulation_steps`` 1, ``sequence_len`` 512,
``optimizer`` adamw_torch_fused, ``lr_scheduler`` cosine, ``weight_decay`` 0.0,
``num_epochs`` 1. Where the schema leaves a value unset (``max_grad_norm``, the Adam
betas and epsilon) Axolotl does not pass it on and the installed transformers'
TrainingArguments default applies (:func:`sapper.plan.readers.hf_trainer.trainer_defaults`).

The warmup is Axolotl's own (``HFCausalTrainerBuilder._configure_warmup_and_logging``,
src/axolotl/core/builders/base.py): ``warmup_steps`` as given, else ``warmup_ratio`` ×
the step count rounded down, else min(3 % of the steps, 100); one warmup step becomes two.
The step count is known only from ``max_steps``: with ``num_epochs`` it depends on the
dataset (C006).

``base_model`` is a hub id or a local folder: a folder with a config.json (or
``base_model_config`` naming one) is read as ``refs["hf_config"]``; a hub id leaves the
model unknown (C006), never downloaded. ``bf16: auto`` is bf16 on a GPU that has it and
fp16 otherwise (``resolve_dtype``, src/axolotl/utils/config/__init__.py): the GPU decides,
so the dtype stays unknown. With ``sample_packing`` every row of a micro-batch is filled to
``sequence_len`` tokens; without it rows are padded to the longest in the batch, so
``sequence_len`` is an upper bound on the tokens per row.

What the Plan cannot express yet is said, not left silent: a LoRA/QLoRA ``adapter`` trains
only the adapter weights (gradients and optimizer states for them alone) over a frozen base
that ``load_in_8bit``/``load_in_4bit`` keeps quantized. sapper's memory model trains every
parameter, so ``model.trainable_parameters`` is unresolved (C006) and the memory check
says unknown rather than fail the job on an upper bound.
"""

from __future__ import annotations

import math
from typing import Any

from sapper.errors import InputError
from sapper.plan.readers.axolotl_keys import FSDP_CONFIG, PLUGINS, TOP_LEVEL
from sapper.plan.readers.base import (
    ConfigFormat,
    Sniff,
    local_model_config,
    unknown_key_findings,
    unresolved_finding,
)
from sapper.plan.readers.hf_trainer import (
    MISSING,
    TrainerKeys,
    Values,
    apply_deepspeed,
    apply_fsdp,
    apply_precision,
    apply_trainer,
    settled,
    trainer_defaults,
)
from sapper.plan.sources import PlanSource

__all__ = ["FORMAT", "read_axolotl_config"]

_AXOLOTL = "Axolotl default"
#: What an adapter run leaves unknown: which parameters train (the memory check needs it).
TRAINABLE = "model.trainable_parameters"
_TRAINER = "HF Trainer default"
#: Axolotl's schema defaults (schemas/training.py, schemas/config.py).
_DEFAULTS: dict[str, tuple[Any, str]] = {
    "per_device_train_batch_size": (1, _AXOLOTL),
    "gradient_accumulation_steps": (1, _AXOLOTL),
    "optim": ("adamw_torch_fused", _AXOLOTL),
    "lr_scheduler_type": ("cosine", _AXOLOTL),
    "weight_decay": (0.0, _AXOLOTL),
    "num_train_epochs": (1.0, _AXOLOTL),
}
_NAMES = {
    "per_device_train_batch_size": "micro_batch_size",
    "optim": "optimizer",
    "lr_scheduler_type": "lr_scheduler",
    "num_train_epochs": "num_epochs",
}


def read_axolotl_config(sniff: Sniff) -> PlanSource:
    raw = sniff.mapping
    if raw is None:
        raise InputError(
            "an Axolotl config must be a mapping of settings", file=sniff.name,
            expected="keys such as base_model, datasets, micro_batch_size, sequence_len",
        )
    src = PlanSource(name=sniff.name)
    v = Values(raw, src)
    src.findings += unknown_key_findings(
        [str(k) for k in raw], TOP_LEVEL | PLUGINS, file=src.name, framework="Axolotl",
        effect="(Axolotl's config schema drops keys it does not define: no effect)",
    )
    fsdp_cfg = v.section("fsdp_config")
    src.findings += unknown_key_findings(
        [f"fsdp_config.{k}" for k in fsdp_cfg],
        {f"fsdp_config.{p}{k}" for k in FSDP_CONFIG for p in ("", "fsdp_")},
        file=src.name, framework="Axolotl",
        effect="(Axolotl's FSDPConfig drops keys it does not define: no effect)",
    )
    deepspeed = apply_deepspeed(v, "deepspeed", sniff.path.parent)
    fsdp = apply_fsdp(v, "fsdp", "fsdp_config", config_enables=True, version_key="fsdp_version")
    if deepspeed and fsdp:
        raise InputError(
            "deepspeed and fsdp are both set", file=src.name, field="deepspeed, fsdp_config",
            expected="one of them (Axolotl refuses both)",
        )
    v.set("framework", "deepspeed" if deepspeed else "transformers",
          "deepspeed" if deepspeed else "(an Axolotl config: the HF Trainer)")
    _model(v, sniff)
    _layout(v, fsdp)
    defaults = dict(_DEFAULTS)
    hf = trainer_defaults()
    for name in ("adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm"):
        defaults[name] = (hf.get(name, MISSING), _TRAINER)
    keys = TrainerKeys("Axolotl", _NAMES, defaults, warmup=_warmup)
    apply_trainer(v, keys)
    if not v.has("learning_rate"):
        unresolved_finding(src, "learning_rate", "optimizer.lr",
                           "not given: Axolotl requires it and refuses to start",
                           "set learning_rate")
    apply_precision(v, keys, deepspeed=deepspeed)
    _pure_half(v)
    ratio = v.value("cosine_min_lr_ratio", "number", minimum=0, maximum=1)
    lr = v.src.data.get("optimizer", {}).get("lr")
    if ratio is not None and isinstance(lr, float | int):
        # Axolotl's cosine decays to cosine_min_lr_ratio × the peak LR (schemas/training.py).
        v.set("schedule.min_lr", ratio * lr, "cosine_min_lr_ratio × learning_rate")
    seq = v.take("sequence_len", "batch.seq_len", "int", minimum=1)
    if seq is None:
        v.set("batch.seq_len", 512, f"sequence_len ({_AXOLOTL})")
    _adapter(v)
    settled(src)
    return src


def _model(v: Values, sniff: Sniff) -> None:
    """The base model: read from a local config.json, else unknown."""
    for key in ("base_model_config", "base_model"):
        value = v.get(key)
        if value in (MISSING, None):
            continue
        if not isinstance(value, str):
            raise v.error(key, value, "a hub model id or a local model folder")
        path = local_model_config(value, sniff.path.parent)
        if path is not None:
            v.src.refs["hf_config"] = path
            break
    else:
        value = v.get("base_model")
        if value in (MISSING, None):
            unresolved_finding(v.src, "base_model", "model",
                               "not given: Axolotl requires it", "set base_model")
        else:
            unresolved_finding(
                v.src, "base_model", "model",
                f"{value!r} is a hub model id; its config.json is not on this machine",
                "pass --model config.json (the model's config from the hub)",
            )
    if v.has("base_model"):
        # Axolotl fine-tunes from the base model's weights.
        v.set("init.from_pretrained", True, "base_model")


def _layout(v: Values, fsdp: bool) -> None:
    """Axolotl's device mesh (``build_parallelism_config`` in src/axolotl/utils/distributed.py,
    accelerate's ParallelismConfig): ``tensor_parallel_size`` is TP, ``context_parallel_size``
    (formerly ``sequence_parallel_degree``) CP, and the data-parallel degree is
    ``dp_shard_size`` × ``dp_replicate_size`` when both are given; with one of them, the
    other takes the GPUs TP and CP leave, which is sapper's dp -1. ``dp_shard_size`` > 1
    without FSDP is refused at start. With a replicate degree the FSDP states are sharded
    over the shard group only, so the memory estimate (sharded over all of DP) is a lower
    bound there."""
    v.take("tensor_parallel_size", "parallel.tp", "int", minimum=1)
    cp_key = "context_parallel_size"
    if not v.has(cp_key) or v.get(cp_key) is None:
        cp_key = "sequence_parallel_degree"
    v.take(cp_key, "parallel.cp", "int", minimum=1)
    shard = v.value("dp_shard_size", "int", minimum=1)
    replicate = v.value("dp_replicate_size", "int", minimum=1)
    if shard is not None and shard > 1 and not fsdp:
        raise v.error("dp_shard_size", shard, "1 without fsdp_config (Axolotl refuses "
                      "dp_shard_size > 1 without FSDP)")
    if shard is not None and replicate is not None:
        v.set("parallel.dp", shard * replicate, "dp_shard_size × dp_replicate_size")


def _pure_half(v: Values) -> None:
    """``bfloat16``/``float16``: the model is loaded in that dtype and trained without AMP
    (schemas/config.py: "No AMP"), so the optimizer updates 16-bit weights."""
    for key, dtype in (("bfloat16", "bf16"), ("float16", "fp16")):
        if v.value(key, "bool"):
            v.set("precision.dtype", dtype, key)
            v.set("precision.master_weights", dtype, key)
            v.set("precision.autocast", False, key)
            if dtype == "bf16":
                v.set("precision.loss_scaling.mode", "none", key)
            return


def _warmup(v: Values, keys: TrainerKeys, total: int | None) -> None:
    steps = v.value("warmup_steps", "number", minimum=0)
    ratio = v.value("warmup_ratio", "number", minimum=0, maximum=1)
    if steps is not None:
        if steps >= 1 and steps != int(steps):
            raise v.error("warmup_steps", steps, "a whole number of steps")
        if 0 < steps < 1:
            key, fraction = "warmup_steps", steps  # transformers 5 reads it as a fraction
        else:
            v.set("schedule.warmup_steps", 2 if steps == 1 else int(steps), "warmup_steps")
            return
    elif ratio is not None:
        key, fraction = "warmup_ratio", ratio
    else:
        key, fraction = "warmup_ratio (Axolotl default: 3% of the steps, at most 100)", None
    if total is None:
        unresolved_finding(
            v.src, key, "schedule.warmup_steps",
            "a share of a run whose length in steps the file does not give",
            "set max_steps, or warmup_steps (or pass --warmup N)",
        )
        return
    warm = int(fraction * total) if fraction is not None else min(int(0.03 * total), 100)
    v.set("schedule.warmup_steps", 2 if warm == 1 else max(warm, 0), f"{key} × max_steps")


def _adapter(v: Values) -> None:
    adapter = v.value("adapter", "str")
    bits = "4-bit" if v.value("load_in_4bit", "bool") else (
        "8-bit" if v.value("load_in_8bit", "bool") else None
    )
    if adapter is None and bits is None:
        return
    if adapter is not None and adapter.lower() not in ("lora", "qlora", "llama-adapter"):
        raise v.error("adapter", adapter, "lora, qlora or llama-adapter")
    what = []
    if adapter:
        what.append(f"adapter {adapter} trains only the adapter weights over a frozen base")
    if bits:
        what.append(f"the base weights are loaded {bits}")
    key = "adapter" if adapter else f"load_in_{bits[0]}bit"
    unresolved_finding(
        v.src, key, TRAINABLE,
        f"{'; '.join(what)}: a sapper plan describes full training of every parameter, so "
        "it cannot say which weights carry gradients and optimizer states, nor the "
        "quantized weights' size: the memory verdict is left unknown",
        "estimate the adapter run's memory with `sapper smoke` on the real model, or "
        "read `sapper memory` as an upper bound (full fine-tuning)",
    )


#: Keys only Axolotl's configs have (besides base_model).
_SIGNATURE = frozenset({
    "base_model", "datasets", "micro_batch_size", "sequence_len", "num_epochs",
    "sample_packing", "adapter", "lora_r", "lora_alpha", "val_set_size",
    "dataset_prepared_path", "special_tokens", "lora_target_modules", "tokenizer_type",
    "eval_sample_packing", "pad_to_sequence_len", "evals_per_epoch", "saves_per_epoch",
    "wandb_project", "lr_scheduler", "train_on_inputs", "chat_template", "plugins",
})


def _recognise(sniff: Sniff) -> float:
    """A YAML mapping with Axolotl's ``base_model`` or several keys only Axolotl uses
    (``micro_batch_size``, ``sequence_len``, ``datasets``...), most keys Axolotl's. An HF
    config.json is JSON, and a sapper plan has none of these."""
    doc = sniff.mapping
    if sniff.json is not None or not isinstance(doc, dict) or not doc:
        return 0.0
    keys = {str(k) for k in doc}
    hits = len(keys & _SIGNATURE)
    if "base_model" not in keys and hits < 3:
        return 0.0
    share = len(keys & (TOP_LEVEL | PLUGINS)) / len(keys)
    base = 0.55 if "base_model" in keys else 0.4
    return base + 0.43 * share * min(1.0, math.log2(1 + hits) / 3)


FORMAT = ConfigFormat(
    name="axolotl",
    title="an Axolotl config (YAML)",
    looks_for="base_model, datasets, micro_batch_size, sequence_len and Axolotl's other keys",
    recognise=_recognise,
    read=read_axolotl_config,
)
