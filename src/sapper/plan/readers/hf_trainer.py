"""What the Hugging Face Trainer makes of its settings, shared by the readers of configs
that end in one: TrainingArguments (JSON, YAML or command line), Axolotl YAML (Axolotl
builds TrainingArguments from its own keys) and accelerate configs.

Three things live here: typed access to a config mapping whose errors name the user's
key (:class:`Values`); the translation of the Trainer's names (``optim``,
``lr_scheduler_type``, the ``fsdp`` option string) into Plan values; and the Trainer's own
defaults, read from the installed transformers' ``TrainingArguments`` dataclass
(transformers/training_args.py) rather than written down here, so they are the defaults
of the version that will run the job.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from sapper.errors import InputError
from sapper.plan.sources import PlanSource

__all__ = [
    "MISSING",
    "Values",
    "fsdp_options",
    "optimizer_fields",
    "schedule_type",
    "trainer_defaults",
    "trainer_version",
]

#: A key the file does not have (``None`` is a value: YAML's empty ``key:``).
MISSING: Any = object()

_KIND_WORDS = {
    "int": "an integer",
    "number": "a number",
    "bool": "true or false",
    "str": "a string",
}
_TRUE = ("true", "yes", "1", "on")
_FALSE = ("false", "no", "0", "off")


class Values:
    """Typed access to one config mapping: a wrong type or a value out of range is an
    :class:`InputError` naming the file and the user's key, and every value stored in the
    Plan carries that key as its origin.

    ``lenient`` accepts the strings a command line gives (``"8"``, ``"2e-5"``, ``"True"``),
    as argparse and HfArgumentParser would convert them."""

    def __init__(self, raw: dict[str, Any], src: PlanSource, *, lenient: bool = False) -> None:
        self.raw, self.src, self.file, self.lenient = raw, src, src.name, lenient

    def get(self, key: str) -> Any:
        node: Any = self.raw
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return MISSING
            node = node[part]
        return node

    def has(self, key: str) -> bool:
        return self.get(key) not in (MISSING, None)

    def error(self, key: str, value: Any, expected: str) -> InputError:
        return InputError(
            "invalid value", file=self.file, field=key, value=value, has_value=True,
            expected=expected,
        )

    def section(self, key: str) -> dict[str, Any]:
        """A nested mapping (empty when absent or null)."""
        value = self.get(key)
        if value is MISSING or value is None:
            return {}
        if not isinstance(value, dict):
            raise self.error(key, value, "a mapping of settings")
        return value

    def value(
        self,
        key: str,
        kind: str,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        above: float | None = None,
    ) -> Any:
        """The value of ``key`` as ``kind`` (int, number, bool, str), or None when absent
        or null; ``above`` is an exclusive lower bound."""
        value = self.get(key)
        if value is MISSING or value is None:
            return None
        value = self._convert(value, kind)
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value),
            "bool": isinstance(value, bool),
            "str": isinstance(value, str),
        }[kind]
        if ok and minimum is not None and value < minimum:
            ok = False
        if ok and maximum is not None and value > maximum:
            ok = False
        if ok and above is not None and value <= above:
            ok = False
        if not ok:
            words = _KIND_WORDS[kind]
            bounds = [f"> {above:g}"] if above is not None else []
            bounds += [f"≥ {minimum:g}"] if minimum is not None else []
            bounds += [f"≤ {maximum:g}"] if maximum is not None else []
            if bounds:
                words += " " + ", ".join(bounds)
            raise self.error(key, self.get(key), words)
        return value

    def _convert(self, value: Any, kind: str) -> Any:
        if kind == "number" and isinstance(value, str):
            # YAML 1.1 reads 2e-5 (no dot) as a string; PyYAML users write it all the time,
            # and the frameworks convert it with float().
            try:
                return float(value.strip())
            except ValueError:
                return value
        if not self.lenient or not isinstance(value, str):
            return value
        text = value.strip()
        if kind == "int":
            try:
                return int(text) if len(text) <= 30 else value
            except ValueError:
                return value
        if kind == "bool":
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
        return value

    def set(self, field: str, value: Any, key: str) -> None:
        self.src.set(field, value, origin=key)

    def take(self, key: str, field: str, kind: str, **bounds: float) -> Any:
        value = self.value(key, kind, **bounds)
        if value is not None:
            self.set(field, value, key)
        return value


# ---- the Trainer's names ----------------------------------------------------------------
#: ``optim`` values (transformers.training_args.OptimizerNames) whose Plan type is not the
#: name's first word; the rest map by their first word (adamw_torch -> adamw).
_OPTIM_TYPES = {
    "adafactor": "adafactor",
    "sgd": "sgd",
    "adagrad": "adagrad",
    "rmsprop": "rmsprop",
    "lomo": "lomo",
    "adalomo": "adalomo",
    "grokadamw": "adamw",
    "stable_adamw": "adamw",
}


def optimizer_fields(name: str) -> dict[str, Any]:
    """Plan ``optimizer.*`` values for the Trainer's ``optim`` name: the update rule, and
    whether its states are 8-bit (bitsandbytes ``*_8bit``, torchao ``adamw_torch_8bit``)
    or its step fused (``adamw_torch_fused``, ``adamw_apex_fused``)."""
    low = name.strip().lower()
    words = [w for w in low.replace("-", "_").split("_") if w]
    if low in _OPTIM_TYPES:
        kind = _OPTIM_TYPES[low]
    else:
        core = [w for w in words if w not in ("paged", "galore", "apollo", "schedule", "free")]
        kind = core[0] if core else low
    out: dict[str, Any] = {"type": kind}
    if "8bit" in words:
        out["eight_bit"] = True
    if "fused" in words:
        out["fused"] = True
    return out


#: ``lr_scheduler_type`` (transformers.trainer_utils.SchedulerType) -> Plan schedule.type.
_SCHEDULES = {
    "constant_with_warmup": "constant",
    "warmup_stable_decay": "wsd",
    "cosine_with_min_lr": "cosine",
    "cosine_warmup_with_min_lr": "cosine",
    "cosine_with_restarts": "cosine_with_restarts",
}


def schedule_type(name: str) -> str:
    low = name.strip().lower()
    return _SCHEDULES.get(low, low)


def fsdp_options(value: Any) -> list[str]:
    """The Trainer's ``fsdp`` setting as a list of options: ``"full_shard auto_wrap"``
    (the string TrainingArguments takes), or a list (Axolotl's YAML)."""
    if isinstance(value, bool):
        return ["full_shard"] if value else []
    if isinstance(value, str):
        return [w.lower() for w in value.split() if w]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [w.lower() for v in value for w in v.split()]
    raise TypeError(value)


#: ``fsdp`` options (transformers.trainer_utils.FSDPOption) -> ZeRO-equivalent stage.
FSDP_STAGES = {"full_shard": 3, "shard_grad_op": 2, "hybrid_shard": 3, "hybrid_shard_zero2": 2,
               "no_shard": 0}


# ---- the Trainer's defaults -------------------------------------------------------------
@cache
def trainer_defaults() -> dict[str, Any]:
    """Every TrainingArguments field of the installed transformers with its default
    (``MISSING`` for the required ``output_dir`` in older versions). Imported only when a
    Trainer config is read: transformers takes seconds to import."""
    from transformers import TrainingArguments

    out: dict[str, Any] = {}
    for f in dataclasses.fields(TrainingArguments):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = MISSING  # a mutable default: not one sapper reads
        else:
            out[f.name] = MISSING
    return out


@cache
def trainer_version() -> str:
    import transformers

    return str(transformers.__version__)


def local_path(value: Any, base: Path) -> Path | None:
    """A file a config names, resolved against the config's folder, when it exists."""
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        return None
    path = Path(value.strip()).expanduser()
    if not path.is_absolute():
        path = base / path
    try:
        return path if path.is_file() else None
    except OSError:
        return None


# ---- one Trainer configuration into the Plan ---------------------------------------------
@dataclasses.dataclass
class TrainerKeys:
    """The user's key for each TrainingArguments setting (Axolotl spells several
    differently: ``micro_batch_size``, ``optimizer``, ``lr_scheduler``, ``num_epochs``),
    and the defaults that apply when a key is absent: canonical name -> (value, where the
    default comes from)."""

    framework_word: str
    names: dict[str, str]
    defaults: dict[str, tuple[Any, str]]
    #: How the warmup is derived, when not the Trainer's way (Axolotl has its own).
    warmup: Callable[[Values, TrainerKeys, int | None], None] | None = None

    def key(self, name: str) -> str:
        return self.names.get(name, name)


def apply_trainer(v: Values, keys: TrainerKeys) -> None:
    """Batch, optimizer, schedule, clipping, precision and checkpointing as the Trainer
    runs them. DeepSpeed and FSDP are left to the caller (their files differ)."""
    _batch(v, keys)
    _optimizer(v, keys)
    _schedule(v, keys)
    _clipping(v, keys)
    _checkpointing(v, keys)


def _resolve(v: Values, keys: TrainerKeys, name: str, kind: str, **bounds: float
             ) -> tuple[Any, str]:
    """The user's value of ``name`` and its key, or the framework's default for it and
    where that default comes from; (None, key) when neither is known."""
    key = keys.key(name)
    value = v.value(key, kind, **bounds)
    if value is None and name in keys.defaults:
        default, where = keys.defaults[name]
        if default is not None and default is not MISSING:
            return default, f"{key} ({where})"
    return value, key


def _default(v: Values, keys: TrainerKeys, name: str, field: str, kind: str, **bounds: float
             ) -> Any:
    """Set ``field`` from the user's value of ``name`` or the framework's default."""
    value, origin = _resolve(v, keys, name, kind, **bounds)
    if value is not None:
        v.set(field, value, origin)
    return value


def _batch(v: Values, keys: TrainerKeys) -> None:
    _default(v, keys, "per_device_train_batch_size", "batch.micro_batch_size", "int", minimum=1)
    _default(v, keys, "gradient_accumulation_steps", "batch.gradient_accumulation_steps", "int",
             minimum=1)


def _optimizer(v: Values, keys: TrainerKeys) -> None:
    key = keys.key("optim")
    name = v.value(key, "str")
    origin = key
    if name is None and "optim" in keys.defaults:
        name, where = keys.defaults["optim"]
        origin = f"{key} ({where})"
    if isinstance(name, str) and name.strip():
        for field, value in optimizer_fields(name).items():
            v.set(f"optimizer.{field}", value, origin)
        if "8bit" in name.lower():
            v.set("precision.optimizer_states", "int8", origin)
    _default(v, keys, "learning_rate", "optimizer.lr", "number", above=0)
    _default(v, keys, "weight_decay", "optimizer.weight_decay", "number", minimum=0)
    _default(v, keys, "adam_epsilon", "optimizer.eps", "number", above=0)
    b1, o1 = _resolve(v, keys, "adam_beta1", "number", minimum=0, maximum=1)
    b2, o2 = _resolve(v, keys, "adam_beta2", "number", minimum=0, maximum=1)
    if b1 is not None and b2 is not None:
        v.set("optimizer.betas", [float(b1), float(b2)], o1 if o1 == o2 else f"{o1}, {o2}")


def _schedule(v: Values, keys: TrainerKeys) -> None:
    key = keys.key("lr_scheduler_type")
    kind = v.value(key, "str")
    origin = key
    if kind is None and "lr_scheduler_type" in keys.defaults:
        kind, where = keys.defaults["lr_scheduler_type"]
        origin = f"{key} ({where})"
    if isinstance(kind, str) and kind.strip():
        v.set("schedule.type", schedule_type(kind), origin)
    steps_key = keys.key("max_steps")
    max_steps = v.value(steps_key, "int")
    total = max_steps if max_steps is not None and max_steps > 0 else None
    if total is not None:
        v.set("schedule.total_steps", total, steps_key)
    else:
        from sapper.plan.readers.base import unresolved_finding

        epochs_key = keys.key("num_train_epochs")
        epochs = v.value(epochs_key, "number", minimum=0)
        if epochs is None and "num_train_epochs" in keys.defaults:
            epochs = keys.defaults["num_train_epochs"][0]
        unresolved_finding(
            v.src, epochs_key, "schedule.total_steps",
            f"{epochs:g} epoch(s): the step count depends on the dataset's size, which the "
            "file does not give" if isinstance(epochs, (int, float)) else
            "the step count depends on the dataset's size, which the file does not give",
            f"set {steps_key} to the run's length in optimizer steps",
        )
    (keys.warmup or _warmup)(v, keys, total)
    if isinstance(kind, str) and kind.strip().lower() == "constant":
        # transformers' get_scheduler (optimization.py) builds CONSTANT without the warmup
        # arguments: whatever warmup the file asks for, the LR starts at its peak.
        v.src.unresolved = [u for u in v.src.unresolved if u != "schedule.warmup_steps"]
        v.src.findings = [f for f in v.src.findings
                          if not (f.code == "C006" and "warmup" in str(f.data.get("key")))]
        v.set("schedule.warmup_steps", 0, f"{origin} (the Trainer's constant schedule has no "
              "warmup: use constant_with_warmup)")


def _warmup(v: Values, keys: TrainerKeys, total: int | None) -> None:
    """transformers' ``TrainingArguments.get_warmup_steps``: ``warmup_steps`` ≥ 1 is a step
    count, below 1 a fraction of the run (transformers 5), as ``warmup_ratio`` was before;
    the fraction is rounded up (``math.ceil``)."""
    from sapper.plan.readers.base import unresolved_finding

    steps_key, ratio_key = keys.key("warmup_steps"), keys.key("warmup_ratio")
    steps = v.value(steps_key, "number", minimum=0)
    ratio = v.value(ratio_key, "number", minimum=0, maximum=1)
    if steps is not None and steps >= 1:
        if steps != int(steps):
            raise v.error(steps_key, v.get(steps_key), "a whole number of steps, or a fraction < 1")
        v.set("schedule.warmup_steps", int(steps), steps_key)
        return
    key = steps_key if steps else ratio_key
    fraction = steps if steps else ratio
    if not fraction:
        if steps == 0 or ratio == 0:
            v.set("schedule.warmup_steps", 0, steps_key if steps == 0 else ratio_key)
        elif "warmup_steps" in keys.defaults:
            default, where = keys.defaults["warmup_steps"]
            if isinstance(default, (int, float)) and (default >= 1 or default == 0):
                v.set("schedule.warmup_steps", int(default), f"{steps_key} ({where})")
        return
    if total is not None:
        v.set("schedule.warmup_steps", math.ceil(total * fraction), f"{key} × max_steps")
        return
    unresolved_finding(
        v.src, key, "schedule.warmup_steps",
        f"{fraction:g} of a run whose length in steps the file does not give",
        f"set {keys.key('max_steps')}, or give the warmup in steps (--warmup N)",
    )


def _clipping(v: Values, keys: TrainerKeys) -> None:
    """The Trainer clips when ``max_grad_norm`` is positive; 0 or null is off."""
    norm = _default(v, keys, "max_grad_norm", "clipping.max_norm", "number", minimum=0)
    if norm == 0:
        v.set("clipping.max_norm", None, keys.key("max_grad_norm"))


def _checkpointing(v: Values, keys: TrainerKeys) -> None:
    key = keys.key("gradient_checkpointing")
    value = v.get(key)
    if value is MISSING or value is None:
        return
    if isinstance(value, str) and value.lower() in ("offload", "offload_disk"):
        # Axolotl: checkpoints kept in host memory (or on disk) between forward and backward.
        v.set("parallel.checkpointing.granularity", "full", key)
        v.set("parallel.checkpointing.cpu_offload", True, key)
        return
    if v.value(key, "bool"):
        v.set("parallel.checkpointing.granularity", "full", key)
    else:
        v.set("parallel.checkpointing.granularity", "none", key)


def apply_precision(
    v: Values, keys: TrainerKeys, *, deepspeed: bool, autocast: bool = True
) -> None:
    """``bf16`` / ``fp16`` / ``tf32``: mixed precision by autocast over fp32 weights (the
    Trainer through accelerate, without DeepSpeed), or the flags DeepSpeed's config copies
    when ``deepspeed`` (the engine then keeps the weights in the compute dtype)."""
    from sapper.plan.readers.base import unresolved_finding
    from sapper.plan.rules import BOTH_FP16_BF16

    bf16_key, fp16_key, tf32_key = keys.key("bf16"), keys.key("fp16"), keys.key("tf32")
    raw_bf16 = v.get(bf16_key)
    if isinstance(raw_bf16, str) and raw_bf16.strip().lower() == "auto":
        if v.value(fp16_key, "bool"):
            bf16 = False  # Axolotl: fp16 given with bf16 "auto" turns bf16 off
        elif deepspeed:
            return  # the DeepSpeed config's bf16/fp16 sections decide (or are "auto": C002)
        else:
            unresolved_finding(
                v.src, bf16_key, "precision.dtype",
                '"auto" is bf16 on a GPU that has it (Ampere and newer), else fp16: the '
                "GPU decides at launch",
                "pass --dtype bf16 (or fp16), or write bf16: true",
            )
            return
    else:
        bf16 = v.value(bf16_key, "bool")
    fp16 = v.value(fp16_key, "bool")
    if bf16 and fp16:
        v.src.findings.append(
            BOTH_FP16_BF16.finding(
                f"{fp16_key} and {bf16_key} are both true: {keys.framework_word} refuses to "
                "start with both",
                fix=f"keep one: {bf16_key} on GPUs with bf16 (A100, H100 and later), else "
                f"{fp16_key}",
                source=f"{v.file}: {fp16_key}, {bf16_key}",
            )
        )
        return
    mixed = "bf16" if bf16 else "fp16" if fp16 else None
    if mixed is not None:
        key = bf16_key if bf16 else fp16_key
        v.set("precision.dtype", mixed, key)
        if bf16:
            v.set("precision.loss_scaling.mode", "none", key)
        if not deepspeed and autocast:
            v.set("precision.autocast", True, key)
        return
    if deepspeed:
        return  # the DeepSpeed config's own fp16/bf16 sections decide
    raw_tf32 = v.get(tf32_key)
    tf32 = None if isinstance(raw_tf32, str) and raw_tf32.lower() == "auto" else v.value(
        tf32_key, "bool"
    )
    where = f"{bf16_key}, {fp16_key}"
    if not v.has(bf16_key) and not v.has(fp16_key):
        where += f" ({keys.framework_word} default: off)"
    v.set("precision.dtype", "tf32" if tf32 else "fp32", tf32_key if tf32 else where)


def apply_deepspeed(v: Values, key: str, base: Path) -> bool:
    """A ``deepspeed`` setting: a path to the JSON (read first, as ``refs["deepspeed"]``,
    so this file's own keys win) or an inline dict, read with the DeepSpeed reader's
    semantics. A path that is not on this machine leaves the ZeRO layout unknown (C006).
    True when the job runs under DeepSpeed."""
    from sapper.plan.readers.base import unresolved_finding
    from sapper.plan.readers.deepspeed import read_deepspeed_dict

    value = v.get(key)
    if value is MISSING or value is None or value == "":
        return False
    if isinstance(value, dict):
        inline = read_deepspeed_dict(value, v.file, prefix=f"{key}.")
        from sapper.plan.sources import leaves

        inline.data.pop("framework", None)
        for field, item in leaves(inline.data).items():
            v.set(field, item, inline.origin.get(field, key))
        v.src.findings += inline.findings
        v.src.unresolved += [u for u in inline.unresolved if u not in v.src.unresolved]
        return True
    if not isinstance(value, str):
        raise v.error(key, value, "the path of a DeepSpeed JSON config, or its settings")
    # Relative to the config's folder, or to where the job is launched from (Axolotl's
    # examples name deepspeed_configs/... relative to the repository root).
    path = local_path(value, base) or local_path(value, Path.cwd())
    if path is not None:
        v.src.refs["deepspeed"] = path
    else:
        unresolved_finding(
            v.src, key, "parallel.zero_stage",
            f"{clip_path(value)} is not on this machine, and it holds the DeepSpeed settings",
            "pass --deepspeed ds.json",
        )
    return True


def clip_path(value: str) -> str:
    from sapper.errors import clip

    return repr(clip(value))


def apply_fsdp(v: Values, options_key: str, config_key: str, *, config_enables: bool,
               version_key: str | None = None) -> bool:
    """The Trainer's FSDP: the ``fsdp`` options (``full_shard``/``shard_grad_op``/
    ``hybrid_shard``/``no_shard``, ``offload``, ``auto_wrap``) and ``fsdp_config``, whose
    keys may carry an ``fsdp_`` prefix (TrainingArguments strips it). Without a sharding
    option the strategy follows accelerate's defaults: FSDP1 FULL_SHARD, FSDP2
    ``reshard_after_forward: true`` (ZeRO-3), false keeping parameters gathered after
    forward (ZeRO-2). ``offload`` is FSDP's CPUOffload: parameters, gradients and the
    optimizer step on the CPU. True when the job runs under FSDP."""
    raw = v.get(options_key)
    try:
        options = [] if raw in (MISSING, None) else fsdp_options(raw)
    except TypeError:
        raise v.error(options_key, raw, 'FSDP options such as "full_shard auto_wrap"') from None
    cfg = v.section(config_key)
    if not options and not (config_enables and cfg):
        return False

    def key(name: str) -> str:
        return f"{config_key}.fsdp_{name}" if f"fsdp_{name}" in cfg else f"{config_key}.{name}"

    sharding = [o for o in options if o in FSDP_STAGES]
    unknown = [o for o in options if o not in FSDP_STAGES and o not in ("offload", "auto_wrap")]
    if unknown:
        raise v.error(options_key, raw, "full_shard, shard_grad_op, hybrid_shard, "
                      "hybrid_shard_zero2 or no_shard, with offload and auto_wrap")
    if len(sharding) > 1:
        raise v.error(options_key, raw, "one sharding strategy")
    if sharding:
        v.set("parallel.zero_stage", FSDP_STAGES[sharding[0]], options_key)
    else:
        reshard = v.get(key("reshard_after_forward"))
        if isinstance(reshard, str) and reshard.lower() in ("true", "false"):
            reshard = reshard.lower() == "true"
        if isinstance(reshard, bool):
            v.set("parallel.zero_stage", 3 if reshard else 2, key("reshard_after_forward"))
        elif isinstance(reshard, str) and reshard.lower() in FSDP_STAGES:
            v.set("parallel.zero_stage", FSDP_STAGES[reshard.lower()],
                  key("reshard_after_forward"))
        elif reshard in (MISSING, None):
            where = version_key if version_key and v.has(version_key) else key("version")
            v.set("parallel.zero_stage", 3, f"{where} (accelerate default: FULL_SHARD / "
                  "reshard_after_forward true)")
        else:
            raise v.error(key("reshard_after_forward"), reshard, "true or false")
    if "offload" in options or v.value(key("offload_params"), "bool"):
        where = options_key if "offload" in options else key("offload_params")
        v.set("parallel.offload_params", "cpu", where)
        v.set("parallel.offload_optimizer", "cpu", where)
    ckpt = v.value(key("activation_checkpointing"), "bool")
    if ckpt:
        v.set("parallel.checkpointing.granularity", "full", key("activation_checkpointing"))
    return True


def settled(src: PlanSource) -> None:
    """Fields a later key of the same file set are no longer unresolved."""
    from sapper.plan.sources import leaves

    leaves = leaves(src.data)
    src.unresolved = [u for u in src.unresolved if u not in leaves]
