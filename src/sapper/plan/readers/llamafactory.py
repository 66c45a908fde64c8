"""Read a LLaMA-Factory training config (``llamafactory-cli train x.yaml``) into the Plan.

LLaMA-Factory parses the YAML (or JSON) into its argument classes and Hugging Face
``Seq2SeqTrainingArguments`` and runs the HF Trainer, so most keys are the Trainer's and go
through :mod:`sapper.plan.readers.hf_trainer`; the framework is ``transformers``
(``deepspeed`` when ``deepspeed`` names a config: the engine then runs the step). The
Trainer's defaults are those of the installed transformers
(:func:`sapper.plan.readers.hf_trainer.trainer_defaults`). LLaMA-Factory's own defaults
are those of its argument classes at commit ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30
(version 0.9.6.dev0) of github.com/hiyouga/LLaMA-Factory:

* ``cutoff_len`` 2048 (src/llamafactory/hparams/data_args.py): the longest tokenized
  example. ``packing`` defaults to on for ``stage: pt`` only (hparams/parser.py
  ``get_train_args``); packed rows are filled to ``cutoff_len``, unpacked ones padded to
  the longest in the batch, so ``cutoff_len`` is an upper bound on the tokens per row.
* ``stage`` sft and ``finetuning_type`` **lora** (hparams/finetuning_args.py): a config
  without ``finetuning_type`` trains a LoRA adapter, not the whole model.
* Gradient checkpointing is **on** unless ``disable_gradient_checkpointing: true``
  (hparams/model_args.py default false; model/model_utils/checkpointing.py
  ``prepare_model_for_training`` enables it on every trainable model that supports it);
  the Trainer's ``gradient_checkpointing`` key turns it on as well, never off.
  ``use_unsloth_gc`` keeps the checkpoints in host memory (Unsloth's offloaded
  checkpointing).
* ``pure_bf16`` trains the bf16 weights without AMP (finetuning_args.py: "purely bf16
  precision (without AMP)"; model/adapter.py keeps the trainable parameters in half
  precision instead of casting them to fp32). ``fp8`` (hparams/training_args.py
  ``Fp8Arguments``) sets accelerate's mixed precision to fp8 (train/fp8_utils.py).

``deepspeed`` names a JSON file, opened by the Trainer relative to the directory
``llamafactory-cli`` is started from (the repository's examples name
``examples/deepspeed/ds_z3_config.json`` from its root); sapper looks beside the YAML
first, then in the current directory. The file is read as ``refs["deepspeed"]`` before
this one, so the ``"auto"`` values the HF integration fills from the Trainer's settings
(micro-batch, accumulation, clipping, bf16) are resolved by this file's keys; a path not
on this machine leaves the ZeRO layout unknown (C006). ``fsdp``/``fsdp_config`` are the
Trainer's. FSDP set in an accelerate config (``accelerate launch --config_file ...``) is
not in this file: give that config too.

``model_name_or_path`` naming a local folder with a config.json is read as
``refs["hf_config"]``; a hub id leaves the model unknown (C006), never downloaded.

What the Plan cannot express is said, not left silent: LoRA, OFT and freeze tuning train a
part of the model over a frozen base (``quantization_bit`` keeps that base quantized);
BAdam trains one block at a time; GaLore, APOLLO, Adam-mini and Muon keep optimizer states
sapper does not model; the ``rm``, ``ppo``, ``dpo`` and ``kto`` stages hold chosen and
rejected sequences in one batch and, most of them, a reference (PPO: reward and value)
model beside the trained one. A sapper plan describes one model trained in full on one
batch, so ``model.trainable_parameters`` is unresolved (C006) and the memory check says
unknown rather than pass or fail on an estimate of another job.

Keys no argument class defines stop LLaMA-Factory at start (C005, with the key meant):
:mod:`sapper.plan.readers.llamafactory_keys`. LLaMA-Factory's v1 configs (``model:``,
``dist_config:``, ``examples/v1/``) are another format and are not read here.
"""

from __future__ import annotations

import math

from sapper.errors import InputError
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
    trainer_version,
)
from sapper.plan.readers.llamafactory_keys import (
    MEGATRON_BRIDGE,
    OWN,
    SEQ2SEQ,
    TRANSFORMERS_4,
)
from sapper.plan.sources import PlanSource

__all__ = ["FORMAT", "read_llamafactory_config"]

_LF = "LLaMA-Factory default"
#: What the memory check cannot know when only part of the model trains, or when the job
#: holds more than one model or batch (the field the memory check reads).
TRAINABLE = "model.trainable_parameters"
#: LLaMA-Factory's own defaults that decide Plan values (hparams/*.py at ff6d4d12).
CUTOFF_LEN = 2048
STAGES = ("pt", "sft", "rm", "ppo", "dpo", "kto")
FINETUNING_TYPES = ("lora", "oft", "freeze", "full")
#: quantization_bit values LLaMA-Factory's backends take (model_utils/quantization.py:
#: bitsandbytes 8/4, HQQ 8..1, EETQ 8).
_BITS = (1, 2, 3, 4, 5, 6, 8)
#: The Trainer settings whose defaults apply (the installed transformers').
_TRAINER_DEFAULTS = (
    "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
    "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "optim", "lr_scheduler_type",
    "warmup_steps", "num_train_epochs", "max_grad_norm",
)
#: Optimizers LLaMA-Factory puts in place of the Trainer's (train/trainer_utils.py
#: ``create_custom_optimizer``): the key and what sapper cannot count.
_OPTIMIZERS = {
    "use_galore": "GaLore keeps low-rank projections of the gradients and their Adam states",
    "use_apollo": "APOLLO keeps low-rank auxiliary optimizer states",
    "use_adam_mini": "Adam-mini keeps one second moment per parameter block",
    "use_muon": "Muon keeps one momentum for matrices and Adam states for the rest",
    "use_badam": "BAdam updates one block of layers at a time",
}
_STAGE_WHY = {
    "rm": "a reward model trains on chosen and rejected sequences in one batch",
    "ppo": "PPO keeps a reward model and a value head beside the policy, and generates",
    "dpo": "DPO puts chosen and rejected sequences in one batch, beside a frozen "
    "reference model (unless the loss needs none)",
    "kto": "KTO scores each batch against a frozen reference model",
}


def read_llamafactory_config(sniff: Sniff) -> PlanSource:
    raw = sniff.mapping
    if raw is None:
        raise InputError(
            "a LLaMA-Factory config must be a mapping of settings", file=sniff.name,
            expected="keys such as model_name_or_path, stage, finetuning_type, dataset, "
            "template, cutoff_len",
        )
    raw = {str(k): value for k, value in raw.items()}
    src = PlanSource(name=sniff.name)
    v = Values(raw, src)
    defaults = trainer_defaults()
    known = OWN | MEGATRON_BRIDGE | SEQ2SEQ | TRANSFORMERS_4 | set(defaults)
    src.findings += unknown_key_findings(
        list(raw), known, file=src.name, framework="LLaMA-Factory",
        effect="(LLaMA-Factory refuses to start on a key its argument classes do not "
        "define, unless ALLOW_EXTRA_ARGS=1)",
    )
    stage = _choice(v, "stage", STAGES, "sft")
    finetuning = _choice(v, "finetuning_type", FINETUNING_TYPES, "lora")
    deepspeed = apply_deepspeed(v, "deepspeed", sniff.path.parent)
    apply_fsdp(v, "fsdp", "fsdp_config", config_enables=False)
    v.set("framework", "deepspeed" if deepspeed else "transformers",
          "deepspeed" if deepspeed else "(a LLaMA-Factory config: the HF Trainer)")
    _model(v, sniff)
    where = f"transformers {trainer_version()} default"
    keys = TrainerKeys(
        "LLaMA-Factory", {},
        {name: (defaults.get(name, MISSING), where) for name in _TRAINER_DEFAULTS},
    )
    apply_trainer(v, keys)
    _checkpointing(v)
    apply_precision(v, keys, deepspeed=deepspeed)
    _pure_bf16(v, deepspeed)
    _fp8(v)
    cutoff = v.take("cutoff_len", "batch.seq_len", "int", minimum=1)
    if cutoff is None:
        v.set("batch.seq_len", CUTOFF_LEN, f"cutoff_len ({_LF})")
    _partial(v, stage, finetuning)
    settled(src)
    return src


def _choice(v: Values, key: str, choices: tuple[str, ...], default: str) -> str:
    value = v.value(key, "str")
    if value is None:
        return default
    if value not in choices:
        raise v.error(key, value, " / ".join(choices))
    return value


def _model(v: Values, sniff: Sniff) -> None:
    """The model: a local folder's config.json, else unknown (a hub id, or none given)."""
    key = "model_name_or_path"
    value = v.get(key)
    if value in (MISSING, None):
        unresolved_finding(v.src, key, "model",
                           "not given: LLaMA-Factory requires it and refuses to start",
                           "set model_name_or_path")
    elif not isinstance(value, str):
        raise v.error(key, value, "a hub model id or a local model folder")
    else:
        path = local_model_config(value, sniff.path.parent)
        if path is not None:
            v.src.refs["hf_config"] = path
        else:
            unresolved_finding(
                v.src, key, "model",
                f"{value!r} is a hub model id or a folder not on this machine; its "
                "config.json is not here",
                "pass --model config.json (the model's config from the hub)",
            )
    if v.value("train_from_scratch", "bool"):
        v.set("init.from_pretrained", False, "train_from_scratch")
    elif value not in (MISSING, None):
        v.set("init.from_pretrained", True, key)


def _checkpointing(v: Values) -> None:
    """On unless ``disable_gradient_checkpointing``; the Trainer's key adds, never removes."""
    disable = v.value("disable_gradient_checkpointing", "bool")
    trainer = v.value("gradient_checkpointing", "bool")
    if disable and not trainer:
        v.set("parallel.checkpointing.granularity", "none", "disable_gradient_checkpointing")
        return
    if disable:
        key = "gradient_checkpointing"
    elif disable is False:
        key = "disable_gradient_checkpointing"
    else:
        key = f"disable_gradient_checkpointing ({_LF}: false, so checkpointing is on)"
    v.set("parallel.checkpointing.granularity", "full", key)
    if v.value("use_unsloth_gc", "bool") and not disable:
        v.set("parallel.checkpointing.cpu_offload", True, "use_unsloth_gc")


def _pure_bf16(v: Values, deepspeed: bool) -> None:
    """``pure_bf16``: the bf16 weights are trained as they are, without an fp32 copy. Under
    DeepSpeed the engine keeps its own master weights: its config decides."""
    if not v.value("pure_bf16", "bool") or deepspeed:
        return
    v.set("precision.dtype", "bf16", "pure_bf16")
    v.set("precision.master_weights", "bf16", "pure_bf16")
    v.set("precision.autocast", False, "pure_bf16")
    v.set("precision.loss_scaling.mode", "none", "pure_bf16")


def _fp8(v: Values) -> None:
    """``fp8`` (or the FSDP float8 all-gather, which turns it on): accelerate's fp8."""
    for key in ("fp8", "fp8_enable_fsdp_float8_all_gather"):
        if v.value(key, "bool"):
            v.set("precision.dtype", "fp8", key)
            return


def _partial(v: Values, stage: str, finetuning: str) -> None:
    """One C006 naming every reason the job is not one model trained in full on one batch
    (the first reason's key heads the message, the others name their own)."""
    why: list[tuple[str, str]] = []
    if finetuning != "full":
        what = {
            "lora": "trains only the LoRA adapter weights over a frozen base",
            "oft": "trains only the OFT adapter weights over a frozen base",
            "freeze": "trains only the last freeze_trainable_layers layers (default 2)",
        }[finetuning]
        absent = "" if v.has("finetuning_type") else f" ({_LF} when the key is absent)"
        why.append(("finetuning_type", f"{finetuning}{absent} {what}"))
    bits = v.get("quantization_bit")
    if bits not in (MISSING, None):
        if isinstance(bits, bool) or not isinstance(bits, int) or bits not in _BITS:
            raise v.error("quantization_bit", bits, "8, 6, 5, 4, 3, 2 or 1 (bits per weight)")
        why.append(("quantization_bit", f"the base weights are loaded {bits}-bit"))
    why += [(name, what) for name, what in _OPTIMIZERS.items() if v.value(name, "bool")]
    if stage in _STAGE_WHY:
        why.append(("stage", f"{stage}: {_STAGE_WHY[stage]}"))
    if not why:
        return
    (key, first), rest = why[0], why[1:]
    text = "; ".join([first, *(f"{k} {w}" if k == "stage" else f"{k}: {w}" for k, w in rest)])
    unresolved_finding(
        v.src, key, TRAINABLE,
        f"{text}: a sapper plan describes one model trained in full on one batch, so it "
        "cannot say which weights carry gradients and optimizer states, nor what else the "
        "job holds: the memory verdict is left unknown",
        "estimate the run's memory with `sapper smoke` on the real model, or read "
        "`sapper memory` as full fine-tuning of one model",
    )


# ---- recognising ------------------------------------------------------------------------
#: Keys only LLaMA-Factory's argument classes have: not TrainingArguments', TRL's or
#: Axolotl's.
SIGNATURE = frozenset({
    "stage", "finetuning_type", "template", "cutoff_len", "dataset", "dataset_dir",
    "lora_target", "lora_rank", "max_samples", "plot_loss", "val_size", "quantization_bit",
    "quantization_method", "pref_beta", "pref_loss", "pref_ftx", "freeze_trainable_layers",
    "freeze_trainable_modules", "disable_gradient_checkpointing", "pure_bf16",
    "use_llama_pro", "neat_packing", "train_on_prompt", "mask_history", "flash_attn",
    "enable_liger_kernel", "use_unsloth", "use_unsloth_gc", "ref_model", "reward_model",
    "eval_dataset", "tokenized_path", "media_dir", "image_max_pixels", "use_badam",
    "use_galore", "use_apollo", "use_adam_mini", "use_muon", "export_dir",
    "adapter_name_or_path", "default_system", "enable_thinking", "mix_strategy",
    "preprocessing_num_workers", "infer_backend", "upcast_layernorm",
})
#: Keys the other formats sapper reads own, never LLaMA-Factory's.
_FOREIGN = frozenset({
    "base_model", "micro_batch_size", "sequence_len", "datasets", "dataset_name",
    "distributed_type", "compute_environment", "model", "hardware", "parallel",
    "zero_optimization", "train_micro_batch_size_per_gpu", "dist_config",
})
#: Keys that only LLaMA-Factory uses and most of its configs have.
_STRONG = frozenset({"stage", "finetuning_type", "template", "cutoff_len", "lora_target",
                     "plot_loss", "pref_beta", "pref_loss"})


def _recognise(sniff: Sniff) -> float:
    """A mapping with several of LLaMA-Factory's own keys (``stage``, ``finetuning_type``,
    ``template``, ``cutoff_len``, ``dataset`` ...), at least one of the keys only it uses,
    and none of Axolotl's, TRL's, accelerate's, DeepSpeed's or a sapper plan's."""
    doc = sniff.mapping
    if not isinstance(doc, dict) or not doc:
        return 0.0
    keys = {str(k) for k in doc}
    if keys & _FOREIGN or not keys & _STRONG:
        return 0.0
    hits = len(keys & SIGNATURE) + ("model_name_or_path" in keys)
    if hits < 3:
        return 0.0
    return min(0.99, 0.6 + 0.39 * min(1.0, math.log2(1 + hits) / 3))


FORMAT = ConfigFormat(
    name="llamafactory",
    title="a LLaMA-Factory training config (YAML)",
    looks_for="model_name_or_path, stage, finetuning_type, dataset, template, cutoff_len "
    "and LLaMA-Factory's other keys",
    recognise=_recognise,
    read=read_llamafactory_config,
)
