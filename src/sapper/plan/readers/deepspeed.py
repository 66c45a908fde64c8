"""Read a DeepSpeed JSON config into the Plan: precision, clipping, batch, ZeRO, optimizer,
scheduler, activation checkpointing.

Every value is stored with its DeepSpeed key path as ``origin``, so a validation error
names the user's key (``zero_optimization.stage``), not sapper's field. Values follow
DeepSpeed's semantics, not their look: ``"loss_scale": 0`` means dynamic scaling,
``initial_scale_power: 16`` means 2^16, DeepSpeed's ``Adam`` is AdamW unless
``adam_w_mode`` is false, ``WarmupLR``'s ``warmup_max_lr`` replaces the optimizer's LR.

What the file does not decide is not guessed. ``"auto"`` (as the Hugging Face Trainer
writes it) leaves the field unresolved and says so (C002). Defaults are filled in only
where DeepSpeed's are the same in every version (fp16 loss_scale_window 1000, hysteresis
2; warmup_num_steps 1000). Every key is checked against DeepSpeed's documented keys
(:mod:`sapper.plan.readers.deepspeed_keys`); unknown ones become C001 with the likely intended key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sapper.errors import InputError, clip
from sapper.plan.readers.base import ConfigFormat, Sniff
from sapper.plan.readers.deepspeed_keys import DEPRECATED, SECTIONS, STRICT_SECTIONS, suggest
from sapper.plan.rules import BOTH_FP16_BF16, DEPRECATED_KEY, UNKNOWN_KEY, UNRESOLVED_AUTO
from sapper.plan.schema import MAX_BUCKET
from sapper.plan.sources import PlanSource, read_json_object

__all__ = ["FORMAT", "read_deepspeed_config", "read_deepspeed_dict"]

_MISSING = object()
_AUTO = "auto"

#: DeepSpeed scheduler type -> Plan schedule.type.
_SCHEDULES = {
    "WarmupLR": "constant",
    "WarmupDecayLR": "linear",
    "WarmupCosineLR": "cosine",
    "OneCycle": "onecycle",
    "LRRangeTest": "lr_range_test",
}
_OFFLOAD_DEVICES = ("none", "cpu", "nvme")
#: Unknown keys reported one by one; past this a file is not a DeepSpeed config with
#: typos but something else, and one summary finding says how many more there are.
MAX_UNKNOWN_REPORTED = 20
_KIND_WORDS = {
    "int": "an integer",
    "number": "a number",
    "bool": "true or false",
    "str": "a string",
}


def read_deepspeed_config(path: str | Path) -> PlanSource:
    """A Plan source from a DeepSpeed JSON config, with its C0xx findings attached."""
    raw = read_json_object(
        path, "a DeepSpeed config", "keys such as train_batch_size, bf16, zero_optimization"
    )
    return read_deepspeed_dict(raw, str(path))


def read_deepspeed_dict(raw: dict[str, Any], name: str, prefix: str = "") -> PlanSource:
    """A Plan source from a DeepSpeed config already parsed (a Trainer's or Axolotl's
    inline ``deepspeed`` dict); ``prefix`` (``deepspeed.``) goes before every key the
    messages and origins name, so they point into the file that holds the dict."""
    try:
        reader = _Reader(raw, PlanSource(name=name))
        reader.set("framework", "deepspeed", "(a DeepSpeed config)")
        reader.check_keys(raw, "")
        _batch(reader)
        _precision(reader)
        _clipping(reader)
        _zero(reader)
        _optimizer(reader)
        _scheduler(reader)
        _checkpointing(reader)
        _tensor_parallel(reader)
        _optimizer_wrapper(reader)
        _overlap(reader)
        src = reader.finish()
    except InputError as exc:
        if not prefix:
            raise
        raise InputError(
            exc.problem, file=exc.file, field=prefix + (exc.field or ""), value=exc.value,
            expected=exc.expected, has_value=exc.has_value,
        ) from None
    if prefix:
        src.origin = {k: prefix + v for k, v in src.origin.items()}
    return src


class _Reader:
    """Typed access to the DeepSpeed dict: each value lands in the Plan with its key path
    as origin, ``"auto"`` becomes an unresolved field, a wrong type an InputError."""

    def __init__(self, raw: dict[str, Any], src: PlanSource) -> None:
        self.raw, self.src, self.file = raw, src, src.name
        self.autos: dict[str, str] = {}  # DeepSpeed key -> Plan field it would set
        self.unknown = 0  # unknown keys seen

    # -- access --------------------------------------------------------------------
    def get(self, key: str) -> Any:
        node: Any = self.raw
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return _MISSING
            node = node[part]
        return node

    def section(self, key: str) -> dict[str, Any] | None:
        value = self.get(key)
        if value is _MISSING or value is None:
            return None
        if not isinstance(value, dict):
            raise self.error(key, value, "a JSON object")
        return value

    def error(self, key: str, value: Any, expected: str) -> InputError:
        return InputError(
            "invalid value",
            file=self.file,
            field=key,
            value=value,
            has_value=True,
            expected=expected,
        )

    def is_auto(self, key: str, field: str) -> bool:
        if self.get(key) != _AUTO:
            return False
        self.autos[key] = field
        return True

    def value(
        self,
        key: str,
        field: str,
        kind: str,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> Any:
        """The value of ``key`` checked against ``kind`` (int, number, bool, str) and the
        bounds, or None when absent or "auto"."""
        value = self.get(key)
        if value is _MISSING or value is None or self.is_auto(key, field):
            return None
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, (int, float)) and not isinstance(value, bool),
            "bool": isinstance(value, bool),
            "str": isinstance(value, str),
        }[kind]
        if ok and minimum is not None and value < minimum:
            ok = False
        if ok and maximum is not None and value > maximum:
            ok = False
        if not ok:
            words = _KIND_WORDS[kind]
            bounds = [f"≥ {minimum:g}"] if minimum is not None else []
            bounds += [f"≤ {maximum:g}"] if maximum is not None else []
            if bounds:
                words += " " + ", ".join(bounds)
            raise self.error(key, value, f'{words} or "auto"')
        return value

    def set(self, field: str, value: Any, key: str) -> None:
        self.src.set(field, value, origin=key)

    def take(self, key: str, field: str, kind: str, *, minimum: float | None = None) -> Any:
        value = self.value(key, field, kind, minimum=minimum)
        if value is not None:
            self.set(field, value, key)
        return value

    def take_or_default(self, key: str, field: str, kind: str, default: Any) -> Any:
        """Like :meth:`take`; an absent key gets DeepSpeed's default (used only where that
        default is the same in every DeepSpeed version)."""
        if self.get(key) is _MISSING:
            self.set(field, default, f"{key} (DeepSpeed default)")
            return default
        return self.take(key, field, kind, minimum=0)

    # -- documented keys -------------------------------------------------------------
    def check_keys(self, node: dict[str, Any], section: str) -> None:
        known = SECTIONS.get(section)
        if known is None:
            return
        for key, value in node.items():
            path = f"{section}.{key}" if section else key
            if key not in known:
                self._unknown(key, section, path)
                continue
            if path in DEPRECATED:
                self.src.findings.append(
                    DEPRECATED_KEY.finding(
                        f"{path} is deprecated; DeepSpeed documents {DEPRECATED[path]} instead",
                        source=f"{self.file}: {path}",
                        key=path,
                        replacement=DEPRECATED[path],
                    )
                )
            if isinstance(value, dict) and path in SECTIONS:
                self.check_keys(value, path)

    def _unknown(self, key: str, section: str, path: str) -> None:
        self.unknown += 1
        if self.unknown > MAX_UNKNOWN_REPORTED:
            return
        path = clip(path)
        hint = suggest(key, section)
        where = f"in {section}" if section else "at the top level"
        did_you_mean = f"did you mean {hint}? " if hint else ""
        effect = (
            "older DeepSpeed versions ignore it silently, recent ones refuse to start"
            if section in STRICT_SECTIONS
            else "DeepSpeed ignores it silently, so the setting has no effect"
        )
        self.src.findings.append(
            UNKNOWN_KEY.finding(
                f"{path} is not a DeepSpeed key {where}: {did_you_mean}{effect}",
                fix=f"rename it to {hint}" if hint else "delete it or use a documented key",
                source=f"{self.file}: {path}",
                key=path,
                suggestion=hint,
            )
        )

    def finish(self) -> PlanSource:
        """Report the "auto" values once; a field stays unresolved unless another key of
        the file set it."""
        if self.autos:
            keys = ", ".join(self.autos)
            self.src.findings.append(
                UNRESOLVED_AUTO.finding(
                    f'{len(self.autos)} value(s) are "auto" and set at launch, so the checks '
                    f"that need them are skipped: {keys}",
                    source=f"{self.file}: {keys}",
                    value=len(self.autos),
                    keys=dict(self.autos),
                )
            )
        if self.unknown > MAX_UNKNOWN_REPORTED:
            more = self.unknown - MAX_UNKNOWN_REPORTED
            self.src.findings.append(
                UNKNOWN_KEY.finding(
                    f"{more} more keys are not DeepSpeed keys (only the first "
                    f"{MAX_UNKNOWN_REPORTED} are listed): is this a DeepSpeed config?",
                    fix="delete them or use documented keys",
                    source=self.file,
                    value=more,
                )
            )
        fields = dict.fromkeys(self.autos.values())
        self.src.unresolved = [f for f in fields if not _has(self.src.data, f)]
        return self.src


def _has(tree: dict[str, Any], path: str) -> bool:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


# ---- sections ------------------------------------------------------------------------
def _batch(r: _Reader) -> None:
    """Keep the triple as given: the batch-arithmetic rule checks their relation."""
    r.take("train_micro_batch_size_per_gpu", "batch.micro_batch_size", "int", minimum=1)
    r.take("gradient_accumulation_steps", "batch.gradient_accumulation_steps", "int", minimum=1)
    r.take("train_batch_size", "batch.global_batch_size", "int", minimum=1)


def _enabled(r: _Reader, section: str) -> bool | str:
    """True / False / "auto" for a section's ``enabled`` flag (absent section = False)."""
    if r.section(section) is None:
        return False
    value = r.get(f"{section}.enabled")
    if value is _MISSING:
        return False
    if value == _AUTO:
        return _AUTO
    if not isinstance(value, bool):
        raise r.error(f"{section}.enabled", value, 'true, false or "auto"')
    return value


def _precision(r: _Reader) -> None:
    fp16 = _enabled(r, "fp16")
    bf16_key = "bf16" if r.section("bf16") is not None else "bfloat16"
    bf16 = _enabled(r, bf16_key)
    amp = _enabled(r, "amp")
    if fp16 is True and bf16 is True:
        r.src.findings.append(
            BOTH_FP16_BF16.finding(
                f"fp16.enabled and {bf16_key}.enabled are both true: DeepSpeed refuses "
                "to start with both",
                source=f"{r.file}: fp16.enabled, {bf16_key}.enabled",
            )
        )
        return
    for key, flag in (("fp16.enabled", fp16), (f"{bf16_key}.enabled", bf16)):
        if flag == _AUTO:
            r.is_auto(key, "precision.dtype")
    if fp16 is True:
        _fp16(r)
    elif bf16 is True:
        r.set("precision.dtype", "bf16", f"{bf16_key}.enabled")
        r.set("precision.loss_scaling.mode", "none", f"{bf16_key}.enabled")
        master = f"{bf16_key}.bf16_master_weights_and_grads"
        if r.value(master, "precision.master_weights", "bool"):
            r.set("precision.master_weights", "bf16", master)
        if r.value(f"{bf16_key}.bf16_optimizer_states", "precision.optimizer_states", "bool"):
            r.set("precision.optimizer_states", "bf16", f"{bf16_key}.bf16_optimizer_states")
    elif amp is True:
        _apex_amp(r)
    elif _enabled(r, "torch_autocast") is True:
        dtype = r.value("torch_autocast.dtype", "precision.dtype", "str")
        if dtype in ("bfloat16", "bf16", "torch.bfloat16"):
            r.set("precision.dtype", "bf16", "torch_autocast.dtype")


def _fp16(r: _Reader) -> None:
    r.set("precision.dtype", "fp16", "fp16.enabled")
    scaling = "precision.loss_scaling"
    scale = r.value("fp16.loss_scale", f"{scaling}.mode", "number", minimum=0)
    if scale is None and r.get("fp16.loss_scale") == _AUTO:
        return
    if scale:  # DeepSpeed: any positive value is a fixed scale
        r.set(f"{scaling}.mode", "static", "fp16.loss_scale")
        r.set(f"{scaling}.static_scale", float(scale), "fp16.loss_scale")
    else:  # 0 or absent: dynamic
        r.set(f"{scaling}.mode", "dynamic", "fp16.loss_scale")
        # 2**127 is already past fp16's range; a larger power would overflow a float.
        power = r.value(
            "fp16.initial_scale_power", f"{scaling}.initial_scale", "int", maximum=127
        )
        if power is not None:
            r.set(f"{scaling}.initial_scale", 2.0**power, "fp16.initial_scale_power")
        r.take_or_default("fp16.loss_scale_window", f"{scaling}.growth_interval", "int", 1000)
        r.take_or_default("fp16.hysteresis", f"{scaling}.hysteresis", "int", 2)
        r.take("fp16.min_loss_scale", f"{scaling}.min_scale", "number")
    if r.value("fp16.fp16_master_weights_and_grads", "precision.master_weights", "bool"):
        r.set("precision.master_weights", "fp16", "fp16.fp16_master_weights_and_grads")


def _apex_amp(r: _Reader) -> None:
    """Apex AMP: fp16 with its own dynamic scaler unless ``loss_scale`` is a number;
    opt_level O3 is pure fp16, without fp32 master weights."""
    r.set("precision.dtype", "fp16", "amp.enabled")
    scale = r.get("amp.loss_scale")
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0:
        r.set("precision.loss_scaling.mode", "static", "amp.loss_scale")
        r.set("precision.loss_scaling.static_scale", float(scale), "amp.loss_scale")
    else:
        r.set("precision.loss_scaling.mode", "dynamic", "amp.loss_scale")
    if r.get("amp.opt_level") == "O3":
        r.set("precision.master_weights", "fp16", "amp.opt_level")


def _clipping(r: _Reader) -> None:
    r.take("gradient_clipping", "clipping.max_norm", "number", minimum=0)


def _zero(r: _Reader) -> None:
    zero = r.get("zero_optimization")
    if zero is _MISSING or zero is None:
        return
    if isinstance(zero, bool):  # the deprecated boolean form means stage 1
        r.set("parallel.zero_stage", 1 if zero else 0, "zero_optimization")
        return
    if not isinstance(zero, dict):
        raise r.error("zero_optimization", zero, "a JSON object")
    stage = r.value("zero_optimization.stage", "parallel.zero_stage", "int")
    if stage is not None:
        if stage not in (0, 1, 2, 3):
            raise r.error("zero_optimization.stage", stage, "0, 1, 2 or 3 (the ZeRO stage)")
        r.set("parallel.zero_stage", stage, "zero_optimization.stage")
    for block, field, legacy in (
        ("offload_optimizer", "parallel.offload_optimizer", "cpu_offload"),
        ("offload_param", "parallel.offload_params", "cpu_offload_param"),
    ):
        key = f"zero_optimization.{block}"
        if r.section(key) is not None:
            device = r.value(f"{key}.device", field, "str")
            if device is not None:
                if device not in _OFFLOAD_DEVICES:
                    raise r.error(f"{key}.device", device, "cpu, nvme or none")
                r.set(field, device, f"{key}.device")
        elif r.value(f"zero_optimization.{legacy}", field, "bool"):
            r.set(field, "cpu", f"zero_optimization.{legacy}")
    _buckets(r)


#: ``zero_optimization`` size keys -> ``parallel.deepspeed`` fields. DeepSpeedZeroConfig
#: (deepspeed/runtime/zero/config.py) takes each stage-3 knob under its ``stage3_`` alias or
#: its bare field name (``populate_by_name``); the alias is the documented spelling.
_BUCKET_KEYS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("reduce_bucket_size",), "reduce_bucket_size"),
    (("allgather_bucket_size",), "allgather_bucket_size"),
    (("stage3_prefetch_bucket_size", "prefetch_bucket_size"), "prefetch_bucket_size"),
    (("stage3_max_live_parameters", "max_live_parameters"), "max_live_parameters"),
    (("stage3_max_reuse_distance", "max_reuse_distance"), "max_reuse_distance"),
    (
        ("stage3_param_persistence_threshold", "param_persistence_threshold"),
        "param_persistence_threshold",
    ),
    (("sub_group_size",), "sub_group_size"),
)


def _buckets(r: _Reader) -> None:
    """ZeRO's buffer sizes, in elements. JSON configs write them as ``5e8``, a float with
    no fraction, which DeepSpeedZeroConfig's integer fields accept (pydantic's lax mode);
    a fraction (``1.5e3`` is fine, ``0.5`` is not), a negative or a non-number is refused
    there, and is an error naming the key here. ``"auto"`` stays unresolved: the HF
    Trainer fills it from the model's hidden size at launch."""
    for keys, name in _BUCKET_KEYS:
        field = f"parallel.deepspeed.{name}"
        for key in (f"zero_optimization.{k}" for k in keys):
            value = r.value(key, field, "number", minimum=0, maximum=MAX_BUCKET)
            if value is not None:
                if isinstance(value, float) and not value.is_integer():
                    raise r.error(key, value, 'a whole number of elements, e.g. 5e8, or "auto"')
                r.set(field, int(value), key)
                break
            if r.get(key) is not _MISSING:
                break  # "auto" or null: the alias does not override it
    r.take(
        "zero_optimization.contiguous_gradients", "parallel.deepspeed.contiguous_gradients",
        "bool",
    )


def _optimizer(r: _Reader) -> None:
    if r.section("optimizer") is None:
        return
    r.section("optimizer.params")
    kind = r.value("optimizer.type", "optimizer.type", "str")
    if kind is not None:
        name = kind.lower()
        adam_w_mode = r.get("optimizer.params.adam_w_mode")
        if name == "adam" and adam_w_mode is not False:
            name = "adamw"  # DeepSpeed's Adam decouples weight decay unless told not to
        r.set("optimizer.type", name, "optimizer.type")
    p = "optimizer.params"
    r.take(f"{p}.lr", "optimizer.lr", "number")
    r.take(f"{p}.eps", "optimizer.eps", "number")
    r.take(f"{p}.weight_decay", "optimizer.weight_decay", "number", minimum=0)
    r.take(f"{p}.momentum", "optimizer.momentum", "number", minimum=0)
    betas = r.get(f"{p}.betas")
    if betas is not _MISSING and not r.is_auto(f"{p}.betas", "optimizer.betas"):
        ok = (
            isinstance(betas, list)
            and len(betas) == 2
            and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas)
        )
        if not ok:
            raise r.error(f"{p}.betas", betas, 'two numbers, e.g. [0.9, 0.95], or "auto"')
        r.set("optimizer.betas", [float(b) for b in betas], f"{p}.betas")


def _scheduler(r: _Reader) -> None:
    if r.section("scheduler") is None:
        return
    r.section("scheduler.params")
    kind = r.value("scheduler.type", "schedule.type", "str")
    if kind is None:
        return
    r.set("schedule.type", _SCHEDULES.get(kind, kind.lower()), "scheduler.type")
    if kind not in ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR"):
        return
    p = "scheduler.params"
    r.take_or_default(f"{p}.warmup_num_steps", "schedule.warmup_steps", "int", 1000)
    if kind != "WarmupLR":
        r.take(f"{p}.total_num_steps", "schedule.total_steps", "int", minimum=1)
    if kind in ("WarmupLR", "WarmupDecayLR"):
        # The warmup ramps to warmup_max_lr, which replaces the optimizer's own LR.
        r.take(f"{p}.warmup_max_lr", "optimizer.lr", "number")
    if kind == "WarmupDecayLR":  # decays linearly back to warmup_min_lr
        r.take(f"{p}.warmup_min_lr", "schedule.min_lr", "number", minimum=0)
    if kind == "WarmupCosineLR":
        ratio = r.value(f"{p}.cos_min_ratio", "schedule.min_lr", "number", minimum=0)
        lr = r.get("optimizer.params.lr")
        if ratio is not None and isinstance(lr, (int, float)) and not isinstance(lr, bool):
            r.set("schedule.min_lr", ratio * lr, f"{p}.cos_min_ratio × optimizer.params.lr")


def _checkpointing(r: _Reader) -> None:
    """DeepSpeed's block configures how checkpoints are stored; whether blocks are
    recomputed at all is decided in the model code, so granularity is not set here."""
    if r.section("activation_checkpointing") is None:
        return
    ac, field = "activation_checkpointing", "parallel.checkpointing"
    r.take(f"{ac}.partition_activations", f"{field}.partition_activations", "bool")
    r.take(f"{ac}.cpu_checkpointing", f"{field}.cpu_offload", "bool")


def _tensor_parallel(r: _Reader) -> None:
    if r.section("tensor_parallel") is None:
        return
    size = r.value("tensor_parallel.autotp_size", "parallel.tp", "int", minimum=0)
    if size:  # 0 disables AutoTP
        r.set("parallel.tp", size, "tensor_parallel.autotp_size")


def _optimizer_wrapper(r: _Reader) -> None:
    """The optimizer wrapper DeepSpeed's engine picks, for what it keeps per GPU.

    ``DeepSpeedEngine._do_optimizer_sanity_check`` and ``get_data_types``
    (deepspeed/runtime/engine.py, checked at commit 38327e07, Feb 2025; the same since
    DeepSpeed 0.8.1, PR #2742): gradients accumulate in ``data_types.grad_accum_dtype``,
    by default fp32 for bf16 without ZeRO and the model's dtype otherwise. bf16 with fp32
    accumulation and no ZeRO, or with ZeRO stage 1 and no offload, runs ``BF16_Optimizer``
    (runtime/bf16_optimizer.py): bf16 weights and a full fp32 gradient buffer on every
    GPU, the fp32 master weights and optimizer states partitioned over data parallelism.
    bf16 without ZeRO and bf16 accumulation runs ``BF16_Optimizer`` under the pipeline
    engine and refuses to start otherwise; fp16 without ZeRO runs ``FP16_Optimizer``,
    which replicates everything (16 bytes/param); any ZeRO stage runs the ZeRO optimizer.
    """
    if r.raw.get("data_types") is not None:
        r.section("data_types")
    accum = r.value("data_types.grad_accum_dtype", "precision.grad_dtype", "str")
    dtype = r.src.data.get("precision", {}).get("dtype")
    if dtype != "bf16":
        return
    stage = r.src.data.get("parallel", {}).get("zero_stage", 0)
    offload = r.src.data.get("parallel", {}).get("offload_optimizer", "none") != "none"
    word = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "bf16": "bf16",
            "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16"}
    grad = word.get(str(accum).lower()) if accum is not None else None
    if accum is not None and grad is None:
        raise r.error("data_types.grad_accum_dtype", accum, "fp32, bf16 or fp16")
    if grad is None:
        grad = "fp32" if stage == 0 else "bf16"
    key = "data_types.grad_accum_dtype" if accum is not None else (
        "data_types.grad_accum_dtype (DeepSpeed default)"
    )
    if accum is not None or grad != "bf16":  # bf16 is the weights' dtype, the Plan default
        r.set("precision.grad_dtype", grad, key)
    if (stage == 0 and grad == "fp32") or (stage == 1 and grad == "fp32" and not offload):
        r.set("parallel.optimizer_partitioned", True, "bf16.enabled (BF16_Optimizer)")
    elif stage == 0 and grad == "bf16":
        # BF16_Optimizer under the pipeline engine; without PP DeepSpeed refuses to start.
        r.set("parallel.optimizer_partitioned", True, "bf16.enabled (BF16_Optimizer)")


def _overlap(r: _Reader) -> None:
    """Whether DeepSpeed overlaps the data-parallel gradient reduction with backward.

    ``zero_optimization.overlap_comm`` (DeepSpeedZeroConfig, runtime/zero/config.py:
    ``None`` resolves to true for stage 3 only); without ZeRO the engine all-reduces the
    gradients after backward (``DeepSpeedEngine.allreduce_gradients``), not overlapped.
    """
    stage = r.src.data.get("parallel", {}).get("zero_stage", 0)
    key = "zero_optimization.overlap_comm"
    given = r.value(key, "parallel.overlap_dp_comm", "bool") if stage else None
    if given is not None:
        r.set("parallel.overlap_dp_comm", given, key)
    elif stage == 0:
        r.set("parallel.overlap_dp_comm", False, "zero_optimization.stage 0 (DeepSpeed reduces "
              "gradients after backward)")
    elif r.get(key) != _AUTO:
        r.set("parallel.overlap_dp_comm", stage == 3, f"{key} (DeepSpeed default)")


def _recognise(sniff: Sniff) -> float:
    """A JSON object most of whose top-level keys DeepSpeed documents. A Trainer's
    training_args.json shares a few of them (fp16, bf16, gradient_accumulation_steps)
    among a hundred others, so the share counts, not one hit."""
    doc = sniff.json
    if not isinstance(doc, dict) or not doc:
        return 0.0
    known = SECTIONS[""] or frozenset()
    share = sum(k in known for k in doc) / len(doc)
    return 0.3 + 0.65 * share if share else 0.0


FORMAT = ConfigFormat(
    name="deepspeed",
    title="a DeepSpeed JSON config",
    looks_for="a JSON object with DeepSpeed keys such as train_batch_size, "
    "zero_optimization, bf16, fp16",
    recognise=_recognise,
    read=lambda sniff: read_deepspeed_config(sniff.path),
)
