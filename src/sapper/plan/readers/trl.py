"""Read a TRL command-line config (``trl sft --config x.yaml``, ``trl dpo --config`` ...)
into the Plan.

``trl <command> --config`` parses the YAML into ``ScriptArguments``, ``ModelConfig`` and
the command's trainer config (``SFTConfig``, ``DPOConfig`` ...), which extends Hugging Face
``TrainingArguments``, and hands every other key to ``accelerate launch``. The Trainer's
keys go through :mod:`sapper.plan.readers.hf_trainer`, with the installed transformers'
defaults (:func:`sapper.plan.readers.hf_trainer.trainer_defaults`); the framework is
``transformers`` (``deepspeed`` when DeepSpeed runs the step). TRL's own defaults are those
of its dataclasses at commit f2cd57710ae345ea6428ae95363267fcf38a3dc8 (version
1.10.0.dev0) of github.com/huggingface/trl:

* every trainer config (trl/trainer/base_config.py ``_BaseConfig``): ``gradient_checkpointing``
  **true** and ``bf16`` **true** unless ``fp16`` is set (``bf16 = not fp16`` when left
  unset): TRL trains in bf16 mixed precision with checkpointing unless told otherwise;
* ``learning_rate``: ``SFTConfig`` 2e-5, ``DPOConfig`` 1e-6, ``RewardConfig`` 1e-4,
  ``KTOConfig``, ``GRPOConfig``, ``RLOOConfig`` 1e-6;
* ``max_length`` 1024 (``SFTConfig``, ``DPOConfig``, ``RewardConfig``, ``KTOConfig``): the
  longest tokenized sequence (prompt and completion together); ``null`` truncates nothing.
  With ``packing`` (SFT, default false) rows are filled to ``max_length``, otherwise padded
  to the longest in the batch: ``max_length`` is an upper bound on the tokens per row.
  GRPO and RLOO generate up to ``max_completion_length`` (512) after a prompt whose length
  is the dataset's: the sequence length is unknown (C006);
* ``ModelConfig.dtype`` "float32" (trl/trainer/model_config.py), the dtype the weights are
  loaded in. ``bfloat16``/``float16`` load them in half precision and the optimizer updates
  them as they are (autocast over half weights has no fp32 copy to keep), outside
  DeepSpeed and FSDP, which keep their own fp32 master weights; ``auto`` takes the
  checkpoint's dtype, unknown here (C006).

Which ``trl`` command reads the file is not in it. The keys tell, when they belong to one
command only (``packing`` is SFT's, ``beta`` DPO's, KTO's, GRPO's and RLOO's); a default that
differs between the commands that could read the file is left unknown (C006) rather than
picked. ``trl sft`` trains one model on one batch, as a sapper plan describes it; the others
hold more (DPO's and KTO's frozen reference model, chosen and rejected sequences in one
batch, GRPO's and RLOO's generation), as do ``use_peft`` (LoRA over a frozen base) and
``load_in_4bit``/``load_in_8bit``: ``model.trainable_parameters`` is then unresolved (C006)
and the memory check says unknown rather than pass or fail on an estimate of another job.

Launch: ``num_processes``/``num_machines`` (accelerate launch options, which TRL passes on)
give the GPU count; ``accelerate_config`` names one of the accelerate configs TRL ships
(trl/accelerate_configs/*.yaml: ``zero1``-``zero3``, ``fsdp1``, ``fsdp2``, ``multi_gpu``,
``single_gpu``, read as sapper's accelerate reader reads them) or a file; ``config_file``,
``use_deepspeed``/``zero_stage``/``offload_*_device``/``deepspeed_config_file`` and
``use_fsdp``/``fsdp_*`` are read as accelerate launch reads them. The TrainingArguments
``deepspeed`` key names a DeepSpeed JSON, read first as ``refs["deepspeed"]`` (its
``"auto"`` values are filled from this file, as the HF integration does).

Keys none of TRL's dataclasses define go to ``accelerate launch``, which refuses what it
does not know: C005, with the key meant; keys of older TRL releases (``max_seq_length``,
``torch_dtype``, ``max_prompt_length``) are named as such, and the two whose meaning is
plain are still read (an older release, or a recipe script built on ``TrlParser``, takes
them). ``model_name_or_path`` naming a local folder with a config.json is read as
``refs["hf_config"]``; a hub id leaves the model unknown (C006), never downloaded.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sapper.errors import InputError, clip
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
    local_path,
    settled,
    trainer_defaults,
    trainer_version,
)
from sapper.plan.readers.llamafactory_keys import TRANSFORMERS_4
from sapper.plan.readers.trl_keys import (
    DPO,
    GRPO,
    KTO,
    LAUNCH,
    LEGACY,
    MODEL,
    REWARD,
    RLOO,
    SCRIPT,
    SFT,
)
from sapper.plan.sources import PlanSource, leaves

__all__ = ["FORMAT", "KINDS", "read_trl_config"]

_TRL = "TRL default"
TRAINABLE = "model.trainable_parameters"
#: ``trl`` command -> the keys its trainer config defines (besides TrainingArguments').
_RL_SCRIPT = frozenset({"reward_funcs", "reward_model_name_or_path"})
KINDS: dict[str, frozenset[str]] = {
    "sft": SFT, "dpo": DPO, "reward": REWARD, "kto": KTO, "grpo": GRPO | _RL_SCRIPT,
    "rloo": RLOO | _RL_SCRIPT,
}
#: What each command takes, its older releases' keys included (they tell the command too).
_ACCEPTS = {kind: keys | LEGACY[kind] for kind, keys in KINDS.items()}
_LEGACY_ANY = frozenset().union(*LEGACY.values())
#: Defaults that differ between the commands (trl/trainer/*_config.py at f2cd5771).
_LEARNING_RATE = {"sft": 2e-5, "dpo": 1e-6, "reward": 1e-4, "kto": 1e-6, "grpo": 1e-6,
                  "rloo": 1e-6}
_MAX_LENGTH = {"sft": 1024, "dpo": 1024, "reward": 1024, "kto": 1024}
#: ``max_completion_length`` of GRPOConfig and RLOOConfig.
_COMPLETION = 512
#: What each command holds besides one model trained on one batch.
_HOLDS = {
    "dpo": "a frozen reference model, and chosen and rejected sequences in one batch",
    "kto": "a frozen reference model",
    "reward": "chosen and rejected sequences in one batch",
    "grpo": "generation (and a reference model when beta > 0)",
    "rloo": "generation and a frozen reference model",
}
#: Keys of older TRL releases whose meaning is plain, read as their new name.
_RENAMED = {"max_seq_length": "max_length", "torch_dtype": "dtype"}
#: The accelerate configs TRL ships (trl/accelerate_configs/<name>.yaml at f2cd5771), the
#: keys that decide the Plan.
_PROFILE_COMMON: dict[str, Any] = {"mixed_precision": "bf16", "num_machines": 1,
                                   "num_processes": 8}
PROFILES: dict[str, dict[str, Any]] = {
    "single_gpu": {**_PROFILE_COMMON, "distributed_type": "NO"},
    "multi_gpu": {**_PROFILE_COMMON, "distributed_type": "MULTI_GPU"},
    "zero1": {**_PROFILE_COMMON, "distributed_type": "DEEPSPEED", "deepspeed_config": {
        "deepspeed_multinode_launcher": "standard", "gradient_accumulation_steps": 1,
        "zero3_init_flag": False, "zero_stage": 1}},
    "zero2": {**_PROFILE_COMMON, "distributed_type": "DEEPSPEED", "deepspeed_config": {
        "deepspeed_multinode_launcher": "standard", "offload_optimizer_device": "none",
        "offload_param_device": "none", "zero3_init_flag": False, "zero_stage": 2}},
    "zero3": {**_PROFILE_COMMON, "distributed_type": "DEEPSPEED", "deepspeed_config": {
        "deepspeed_multinode_launcher": "standard", "offload_optimizer_device": "none",
        "offload_param_device": "none", "zero3_init_flag": True,
        "zero3_save_16bit_model": True, "zero_stage": 3}},
    "fsdp1": {**_PROFILE_COMMON, "distributed_type": "FSDP", "fsdp_config": {
        "fsdp_activation_checkpointing": False, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_offload_params": False, "fsdp_reshard_after_forward": "FULL_SHARD",
        "fsdp_version": 1}},
    "fsdp2": {**_PROFILE_COMMON, "distributed_type": "FSDP", "fsdp_config": {
        "fsdp_activation_checkpointing": False, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_offload_params": False, "fsdp_reshard_after_forward": True, "fsdp_version": 2}},
}
_TRAINER_DEFAULTS = (
    "per_device_train_batch_size", "gradient_accumulation_steps", "weight_decay",
    "adam_beta1", "adam_beta2", "adam_epsilon", "optim", "lr_scheduler_type", "warmup_steps",
    "num_train_epochs", "max_grad_norm",
)
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "auto": None}
_SHARDING = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "NO_SHARD": 0, "HYBRID_SHARD": 3,
             "HYBRID_SHARD_ZERO2": 2}
_OFFLOAD = ("none", "cpu", "nvme")


def read_trl_config(sniff: Sniff) -> PlanSource:
    raw = sniff.mapping
    if raw is None:
        raise InputError(
            "a TRL config must be a mapping of settings", file=sniff.name,
            expected="keys such as model_name_or_path, dataset_name, learning_rate",
        )
    raw = {str(k): value for k, value in raw.items()}
    src = PlanSource(name=sniff.name)
    v = Values(raw, src)
    env = v.get("env")
    if env not in (MISSING, None) and not isinstance(env, dict):
        raise v.error("env", env, "a mapping of environment variables (trl refuses others)")
    defaults = trainer_defaults()
    _keys(v, defaults)
    kinds = _kinds(v, set(defaults))
    framework = _launch(v, sniff)
    deepspeed = apply_deepspeed(v, "deepspeed", sniff.path.parent) or framework == "deepspeed"
    fsdp = apply_fsdp(v, "fsdp", "fsdp_config", config_enables=False) or framework == "fsdp"
    v.set("framework", "deepspeed" if deepspeed else "transformers",
          "deepspeed" if deepspeed else "(a TRL config: the HF Trainer)")
    _model(v, sniff)
    where = f"transformers {trainer_version()} default"
    trainer: dict[str, tuple[Any, str]] = {
        name: (defaults.get(name, MISSING), where) for name in _TRAINER_DEFAULTS
    }
    lr = _agreed(_LEARNING_RATE, kinds)
    if lr is not None:
        trainer["learning_rate"] = (lr, f"{_TRL} for trl {'/'.join(kinds)}")
    keys = TrainerKeys("TRL", {}, trainer)
    apply_trainer(v, keys)
    if not v.has("learning_rate") and lr is None:
        unresolved_finding(
            v.src, "learning_rate", "optimizer.lr",
            "not given, and its default is the trl command's: "
            + ", ".join(f"{k} {_LEARNING_RATE[k]:g}" for k in kinds),
            "set learning_rate (or pass --lr)",
        )
    if not v.has("gradient_checkpointing"):
        v.set("parallel.checkpointing.granularity", "full",
              f"gradient_checkpointing ({_TRL}: true)")
    apply_precision(v, keys, deepspeed=deepspeed)
    _bf16_default(v, deepspeed)
    _weights_dtype(v, deepspeed or fsdp)
    _seq_len(v, kinds)
    _partial(v, kinds)
    settled(src)
    return src


def _keys(v: Values, defaults: dict[str, Any]) -> None:
    """C005 for keys no dataclass defines and accelerate launch does not take; keys of older
    TRL releases named as such."""
    own = SCRIPT | MODEL | frozenset().union(*KINDS.values())
    known = own | LAUNCH | set(defaults) | TRANSFORMERS_4
    legacy = [k for k in v.raw if k in _LEGACY_ANY and k not in known]
    v.src.findings += unknown_key_findings(
        [k for k in v.raw if k not in _LEGACY_ANY], known, file=v.file, framework="TRL",
        effect="(trl hands keys its dataclasses do not define to accelerate launch, which "
        "refuses them; a recipe script with its own arguments may define them)",
    )
    from sapper.plan.rules import UNKNOWN_CONFIG_KEY

    for key in legacy:
        new = _RENAMED.get(key)
        then = f"; TRL now calls it {new}" if new else ""
        v.src.findings.append(UNKNOWN_CONFIG_KEY.finding(
            f"{key} is a setting of older TRL releases, not of TRL 1.x{then} (trl hands it "
            "to accelerate launch, which refuses it)" + (
                f"; sapper reads it as {new}" if new else ""),
            source=f"{v.file}: {key}", key=key, suggestion=new,
        ))


def _kinds(v: Values, trainer_fields: set[str]) -> list[str]:
    """The ``trl`` commands whose dataclasses take every trainer key of the file."""
    specific = {k for k in v.raw if k in frozenset().union(*_ACCEPTS.values())
                and k not in trainer_fields}
    kinds = [kind for kind, keys in _ACCEPTS.items() if specific <= keys]
    if kinds:
        return kinds
    by_kind = {kind: sorted(specific - keys) for kind, keys in _ACCEPTS.items()}
    unresolved_finding(
        v.src, ", ".join(sorted(specific)), TRAINABLE,
        "no trl command takes all of these keys (" + "; ".join(
            f"trl {kind} refuses {', '.join(refused)}" for kind, refused in by_kind.items()
        ) + ")",
        "keep the keys of the command that runs the file",
    )
    return list(KINDS)


def _agreed(table: dict[str, Any], kinds: list[str]) -> Any:
    values = {table.get(kind) for kind in kinds}
    return values.pop() if len(values) == 1 else None


def _model(v: Values, sniff: Sniff) -> None:
    key = "model_name_or_path"
    value = v.get(key)
    if value in (MISSING, None):
        unresolved_finding(v.src, key, "model", "not given: trl requires it",
                           "set model_name_or_path")
        return
    if not isinstance(value, str):
        raise v.error(key, value, "a hub model id or a local model folder")
    v.set("init.from_pretrained", True, key)
    path = local_model_config(value, sniff.path.parent)
    if path is not None:
        v.src.refs["hf_config"] = path
        return
    unresolved_finding(
        v.src, key, "model",
        f"{value!r} is a hub model id or a folder not on this machine; its config.json is "
        "not here",
        "pass --model config.json (the model's config from the hub)",
    )


def _bf16_default(v: Values, deepspeed: bool) -> None:
    """TRL's ``bf16``: true unless ``fp16`` when the file leaves it unset."""
    if v.has("bf16") or v.value("fp16", "bool"):
        return
    origin = f"bf16 ({_TRL}: true unless fp16)"
    v.set("precision.dtype", "bf16", origin)
    v.set("precision.loss_scaling.mode", "none", origin)
    if not deepspeed:
        v.set("precision.autocast", True, origin)


def _weights_dtype(v: Values, sharded_engine: bool) -> None:
    """``dtype`` (``torch_dtype`` in older releases): the dtype the weights load in."""
    key = "dtype" if v.has("dtype") or not v.has("torch_dtype") else "torch_dtype"
    name = v.value(key, "str")
    if name is None:
        return
    if name not in _DTYPES:
        raise v.error(key, name, "auto, bfloat16, float16 or float32")
    half = _DTYPES[name]
    if sharded_engine or half == "fp32":
        return  # DeepSpeed and FSDP keep fp32 master weights; fp32 is the default
    if half is None:
        unresolved_finding(
            v.src, key, "precision.master_weights",
            '"auto" loads the weights in the checkpoint\'s dtype, which the file does not say',
            "write dtype: bfloat16 or float32, the dtype the checkpoint holds",
        )
        return
    v.set("precision.dtype", half, key)
    v.set("precision.master_weights", half, key)
    v.set("precision.autocast", False, key)
    if v.src.data.get("precision", {}).get("optimizer_states") != "int8":
        v.set("precision.optimizer_states", half, f"{key} (the optimizer keeps its states in "
              "the weights' dtype)")
    if half == "bf16":
        v.set("precision.loss_scaling.mode", "none", key)


def _seq_len(v: Values, kinds: list[str]) -> None:
    if all(kind in ("grpo", "rloo") for kind in kinds):
        prompt = v.value("max_prompt_length", "int", minimum=1)
        completion = v.value("max_completion_length", "int", minimum=1)
        if prompt is not None:
            # Older releases truncated the prompt to max_prompt_length.
            where = "max_completion_length" if completion is not None else (
                f"max_completion_length ({_TRL}: {_COMPLETION})")
            v.set("batch.seq_len", prompt + (completion or _COMPLETION),
                  f"max_prompt_length + {where}")
            return
        unresolved_finding(
            v.src, "max_completion_length", "batch.seq_len",
            "a prompt from the dataset and up to max_completion_length generated tokens "
            f"(default {_COMPLETION}): the prompt's length is the dataset's",
            "pass --seq-len (the longest prompt plus max_completion_length)",
        )
        return
    for key in ("max_length", "max_seq_length"):
        value = v.get(key)
        if value is MISSING:
            continue
        if value is None:
            unresolved_finding(
                v.src, key, "batch.seq_len",
                "null truncates nothing: the longest example of the dataset decides",
                f"set {key}, or pass --seq-len",
            )
            return
        v.take(key, "batch.seq_len", "int", minimum=1)
        return
    default = _agreed(_MAX_LENGTH, kinds)
    if default is not None:
        v.set("batch.seq_len", default, f"max_length ({_TRL})")
    else:
        unresolved_finding(
            v.src, "max_length", "batch.seq_len",
            "not given, and the trl commands that could read the file differ: "
            + ", ".join(f"{k} {_MAX_LENGTH.get(k, 'prompt + max_completion_length')}"
                        for k in kinds),
            "set max_length, or pass --seq-len",
        )


def _partial(v: Values, kinds: list[str]) -> None:
    """One C006 naming every reason the job is not one model trained in full on one batch."""
    if TRAINABLE in v.src.unresolved:
        return  # the keys of several commands: already said
    why: list[str] = []
    key = None
    if len(kinds) > 1:
        holds = "; ".join(f"{k}: {_HOLDS[k]}" for k in kinds if k in _HOLDS)
        one = ("only trl sft is one model trained on one batch" if "sft" in kinds else
               "none of them is one model trained on one batch")
        why.append(f"the keys fit trl {', '.join(kinds)} and the file does not say which runs "
                   f"it; {one} ({holds})")
        key = "(which trl command)"
    elif kinds != ["sft"]:
        why.append(f"holds {_HOLDS[kinds[0]]}")
        key = f"(trl {kinds[0]})"
    for name, what in (("use_peft", "trains only the LoRA adapter weights over a frozen base"),
                       ("load_in_4bit", "loads the base weights 4-bit"),
                       ("load_in_8bit", "loads the base weights 8-bit")):
        if v.value(name, "bool"):
            why.append(what if key is None else f"{name} {what}")
            key = key or name
    if key is None:
        return
    fix = ("for trl sft, add a key only it takes (packing: false, say), or "
           if len(kinds) > 1 and "sft" in kinds else "")
    unresolved_finding(
        v.src, key, TRAINABLE,
        f"{'; '.join(why)}: a sapper plan describes one model trained in full on one batch, "
        "so the memory verdict is left unknown",
        fix + "estimate the run's memory with `sapper smoke` on the real model, or read "
        "`sapper memory` as full fine-tuning of one model",
    )


# ---- launch -----------------------------------------------------------------------------
def _launch(v: Values, sniff: Sniff) -> str | None:
    """The accelerate launch options in the file: a config (TRL's named ones, or a file),
    then the options themselves, which win. ``deepspeed`` or ``fsdp`` when one runs the
    step, else None."""
    framework = None
    for key in ("accelerate_config", "config_file"):
        value = v.get(key)
        if value in (MISSING, None):
            continue
        if not isinstance(value, str) or not value.strip():
            raise v.error(key, value, "the name of an accelerate config TRL ships ("
                          + ", ".join(PROFILES) + ") or the path of one")
        framework = _accelerate_file(v, sniff, key, value)
        break
    procs = v.value("num_processes", "int", minimum=1)
    machines = v.value("num_machines", "int", minimum=1)
    if procs is None:
        procs = v.src.data.get("hardware", {}).get("num_gpus")
    if isinstance(procs, int):
        nodes = machines or v.src.data.get("hardware", {}).get("nodes") or 1
        if procs % nodes:
            raise InputError(
                "invalid value", file=v.file, field="num_processes", value=procs,
                expected=f"a multiple of num_machines ({nodes}): accelerate counts the "
                "processes of all machines together",
            )
        pkey = "num_processes" if v.has("num_processes") else v.src.origin.get(
            "hardware.num_gpus", "num_processes")
        v.set("hardware.num_gpus", procs, pkey)
        v.set("hardware.nodes", nodes, "num_machines" if machines else v.src.origin.get(
            "hardware.nodes", "num_machines (accelerate default: 1)"))
        v.set("hardware.gpus_per_node", procs // nodes, "num_processes / num_machines")
    if v.value("use_deepspeed", "bool"):
        _launch_deepspeed(v, sniff)
        framework = "deepspeed"
    elif v.value("use_fsdp", "bool"):
        _launch_fsdp(v)
        framework = "fsdp"
    return framework


def _accelerate_file(v: Values, sniff: Sniff, key: str, name: str) -> str | None:
    from sapper.plan.readers.accelerate import read_accelerate_config

    if key == "accelerate_config" and name in PROFILES:
        label = f"{key} {name} (trl/accelerate_configs/{name}.yaml)"
        acc = read_accelerate_config(Sniff(Path(label), json.dumps(PROFILES[name])))
    else:
        # trl and accelerate open the path from where the job starts; the config's folder
        # is tried first.
        path = local_path(name, sniff.path.parent) or local_path(name, Path.cwd())
        if path is None:
            unresolved_finding(
                v.src, key, "parallel.zero_stage",
                f"{clip(name)!r} is neither an accelerate config TRL ships ("
                + ", ".join(PROFILES) + ") nor a file on this machine, and it holds the "
                "launch settings",
                "pass the accelerate config with a second --config",
            )
            return None
        label = f"{key} {clip(name)}"
        acc = read_accelerate_config(Sniff.of(path))
    kind = acc.data.pop("framework", None)
    for field, value in leaves(acc.data).items():
        v.set(field, value, f"{label}: {acc.origin.get(field, field)}")
    v.src.findings += acc.findings
    v.src.unresolved += [u for u in acc.unresolved if u not in v.src.unresolved]
    v.src.refs.update(acc.refs)
    if kind == "deepspeed":
        return "deepspeed"
    distributed = acc.origin.get("framework", "")
    return "fsdp" if "FSDP" in distributed else None


def _launch_deepspeed(v: Values, sniff: Sniff) -> None:
    """``use_deepspeed`` with accelerate launch's options (accelerate's DeepSpeedPlugin:
    ZeRO stage 2 without offload unless told)."""
    file_key = "deepspeed_config_file"
    if v.has(file_key):
        name = v.value(file_key, "str")
        path = local_path(name, sniff.path.parent) or local_path(name, Path.cwd())
        if path is not None:
            v.src.refs["deepspeed"] = path
        else:
            unresolved_finding(
                v.src, file_key, "parallel.zero_stage",
                f"{clip(name)!r} is not on this machine, and it holds the DeepSpeed settings",
                "pass --deepspeed ds.json",
            )
        return
    stage = v.value("zero_stage", "int")
    if stage is not None and stage not in (0, 1, 2, 3):
        raise v.error("zero_stage", stage, "0, 1, 2 or 3 (the ZeRO stage)")
    v.set("parallel.zero_stage", 2 if stage is None else stage,
          "zero_stage" if stage is not None else "zero_stage (accelerate default)")
    for key, field in (("offload_optimizer_device", "parallel.offload_optimizer"),
                       ("offload_param_device", "parallel.offload_params")):
        device = v.value(key, "str")
        if device is None:
            continue
        if device.lower() not in _OFFLOAD:
            raise v.error(key, device, "none, cpu or nvme")
        v.set(field, device.lower(), key)


def _launch_fsdp(v: Values) -> None:
    """``use_fsdp`` with accelerate launch's options (FULL_SHARD unless told)."""
    stage, origin = 3, "fsdp_sharding_strategy (accelerate default: FULL_SHARD)"
    for key in ("fsdp_sharding_strategy", "fsdp_reshard_after_forward"):
        value = v.get(key)
        if value in (MISSING, None):
            continue
        text = str(value).strip().upper()
        names = list(_SHARDING)
        if text.isdigit() and 1 <= int(text) <= len(names):
            text = names[int(text) - 1]
        if text in ("TRUE", "FALSE") and key == "fsdp_reshard_after_forward":
            stage = 3 if text == "TRUE" else 2
        elif text in _SHARDING:
            stage = _SHARDING[text]
        else:
            raise v.error(key, value, " / ".join(_SHARDING) + ", their numbers 1-5, or true/"
                          "false (reshard after forward)")
        origin = key
        break
    v.set("parallel.zero_stage", stage, origin)
    if v.value("fsdp_offload_params", "bool"):
        v.set("parallel.offload_params", "cpu", "fsdp_offload_params")
        v.set("parallel.offload_optimizer", "cpu", "fsdp_offload_params")


# ---- recognising ------------------------------------------------------------------------
#: Keys of other formats sapper reads, and of the Hugging Face example scripts
#: (run_clm.py's DataTrainingArguments), never of a TRL config.
_FOREIGN = frozenset({
    "base_model", "micro_batch_size", "sequence_len", "distributed_type", "compute_environment",
    "model", "hardware", "parallel", "zero_optimization", "train_micro_batch_size_per_gpu",
    "stage", "finetuning_type", "cutoff_len", "template", "dataset", "dataset_mixture",
    "dataset_config_name", "block_size", "max_train_samples", "max_eval_samples",
    "validation_split_percentage", "train_file", "validation_file", "config_name",
    "tokenizer_name", "max_source_length",
})
#: Keys TRL's dataclasses define that TrainingArguments, Axolotl and LLaMA-Factory do not.
_OWN = (SCRIPT | MODEL | frozenset().union(*KINDS.values()) | _LEGACY_ANY) - {
    "learning_rate", "dataset_name", "datasets", "model_name_or_path", "trust_remote_code",
    "model_revision", "attn_implementation", "dataset_num_proc", "remove_unused_columns",
    "logging_steps", "bf16", "gradient_checkpointing", "lr_scheduler_kwargs",
    "use_liger_kernel", "torch_empty_cache_steps", "gradient_checkpointing_use_reentrant",
    "load_in_4bit", "load_in_8bit", "lora_r", "lora_alpha", "lora_dropout",
    "lora_target_modules", "lora_modules_to_save", "lora_target_parameters", "streaming",
    "padding_value", "max_length", "temperature", "top_p", "top_k",
}


def _datasets_list(value: Any) -> bool:
    """TRL's dataset mixture: a list of mappings with a ``path`` (Axolotl's have a type)."""
    return (isinstance(value, list) and bool(value)
            and all(isinstance(d, dict) and "path" in d and "type" not in d for d in value))


def _recognise(sniff: Sniff) -> float:
    """A mapping with TRL's ``model_name_or_path`` and ``dataset_name`` (or its dataset
    mixture), none of the keys of Axolotl, LLaMA-Factory, accelerate, DeepSpeed, a sapper
    plan or the Hugging Face example scripts; more confident with each key only TRL has."""
    doc = sniff.mapping
    if not isinstance(doc, dict) or not doc:
        return 0.0
    keys = {str(k) for k in doc}
    if keys & _FOREIGN or "model_name_or_path" not in keys:
        return 0.0
    if "dataset_name" not in keys and not _datasets_list(doc.get("datasets")):
        return 0.0
    hits = len(keys & _OWN)
    return min(0.99, 0.86 + 0.13 * min(1.0, math.log2(1 + hits) / 3))


FORMAT = ConfigFormat(
    name="trl",
    title="a TRL command-line config (YAML: trl sft/dpo/... --config)",
    looks_for="model_name_or_path with dataset_name (or datasets), and TRL's keys such as "
    "max_length, packing, use_peft, beta",
    recognise=_recognise,
    read=read_trl_config,
)
