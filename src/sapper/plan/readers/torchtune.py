"""Read a torchtune recipe config (``tune run <recipe> --config <file>``) into the Plan.

A torchtune config is an OmegaConf YAML of ``_component_`` trees that a recipe (its own
PyTorch training loop, so the framework is ``torch``) instantiates: the model builder, the
optimizer, the LR schedule. ``${...}`` interpolations into the same file are resolved
(:mod:`sapper.plan.readers.interpolation`); one into anything else leaves the field unknown
(C006). Which recipe runs the file is on the command line, not in it: the keys are read as
the distributed recipes read them (FSDP2 over every GPU the other dimensions leave), which
on one GPU is what the single-device recipes run.

Defaults are torchtune's, from pytorch/torchtune at commit
bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1 (Apr 2026), ``recipes/full_finetune_distributed.py``
and the other recipes (``cfg.get(key, default)``): ``enable_activation_checkpointing``
False, ``enable_activation_offloading`` False, ``fsdp_cpu_offload`` False,
``fsdp_reshard_after_forward`` True, ``tensor_parallel_dim`` 1, ``context_parallel_dim`` 1,
``data_parallel_shard_dim`` -1 (infer), ``data_parallel_replicate_dim`` 1,
``optimizer_in_bwd`` False, ``clip_grad_norm`` None (no clipping), no ``lr_scheduler``
(a constant LR). ``batch_size``, ``gradient_accumulation_steps``, ``dtype`` and ``epochs``
are read as ``cfg.<key>``: without them the recipe stops at start, so sapper reports them
unknown (C006). ``dtype: null`` is fp32 (``training/precision.py`` ``get_dtype``).

Precision: torchtune trains in ``dtype`` itself, without autocast: with bf16 the weights,
gradients, activations and optimizer states are all bf16 and there is no fp32 master copy
(the recipes' docstrings; the model is built under ``set_default_dtype``), which the Plan
says as ``master_weights``/``optimizer_states``/``grad_dtype`` bf16 with ``autocast``
false. Every training recipe refuses fp16. Optimizer defaults are their constructors':
``torch.optim.AdamW`` (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01, torch
2.13) and bitsandbytes' AdamW family (the same, ``bitsandbytes/optim/adamw.py`` at commit
95f9af30), whose 32-bit states stay fp32 whatever the weights' dtype
(``bitsandbytes/optim/optimizer.py`` ``init_state``). The cosine schedule is
``training/lr_schedulers.py`` ``get_cosine_schedule_with_warmup``: linear warmup from 0
over ``num_warmup_steps``, then half a cosine to 0.

The model is the builder's shape (:mod:`sapper.plan.readers.torchtune_models`); a builder
sapper does not know leaves it unknown (C006), unless ``checkpointer.checkpoint_dir`` is a
local Hugging Face folder, whose config.json is read. A LoRA/QLoRA/DoRA builder trains
only adapters, and the KD, DPO and PPO recipes hold further models beside the trained one:
the Plan describes full training of one model, so ``model.trainable_parameters`` is
unresolved and the memory verdict unknown, as for an Axolotl adapter. The step count
depends on the dataset's size (C006).
"""

from __future__ import annotations

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
from sapper.plan.readers.interpolation import MISSING, Unresolved
from sapper.plan.readers.keyed import Keyed
from sapper.plan.readers.torchtune_keys import OPTIMIZER_ARGS, SCHEDULER_ARGS, TOP_LEVEL
from sapper.plan.readers.torchtune_models import BUILDER_PARAMS, find_builder, model_fields
from sapper.plan.readers.typed import bad_value, check_kind
from sapper.plan.sources import PlanSource

__all__ = ["FORMAT", "read_torchtune_config"]

#: What an adapter or multi-model recipe leaves unknown (the memory check honours it).
TRAINABLE = "model.trainable_parameters"
_FIX = (
    "write the value into the file, or give it as a plan option (--micro-batch, --seq-len, "
    "--dtype ...) or in a sapper plan given after this file; sapper reads neither the "
    "command line of `tune run` nor the environment"
)
_MEMORY_FIX = (
    "estimate the run's memory with `sapper smoke` on the real model, or read `sapper "
    "memory` as an upper bound (full training of one model)"
)
_TORCH = "torch.optim default"
_BNB = "bitsandbytes default"
#: Optimizer components sapper maps: Plan type, 8-bit states, paged, defaults' origin.
_OPTIMIZERS: dict[str, tuple[str, bool, bool, str]] = {
    "torch.optim.AdamW": ("adamw", False, False, _TORCH),
    "torch.optim.Adam": ("adam", False, False, _TORCH),
    "torch.optim.SGD": ("sgd", False, False, _TORCH),
    "bitsandbytes.optim.AdamW": ("adamw", False, False, _BNB),
    "bitsandbytes.optim.AdamW32bit": ("adamw", False, False, _BNB),
    "bitsandbytes.optim.AdamW8bit": ("adamw", True, False, _BNB),
    "bitsandbytes.optim.PagedAdamW": ("adamw", False, True, _BNB),
    "bitsandbytes.optim.PagedAdamW32bit": ("adamw", False, True, _BNB),
    "bitsandbytes.optim.PagedAdamW8bit": ("adamw", True, True, _BNB),
}
#: Constructor defaults: lr, weight_decay (torch.optim.Adam and SGD: 0).
_LR_DEFAULT = 1e-3
_COSINE = (
    "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
    "torchtune.training.get_cosine_schedule_with_warmup",
    "torchtune.modules.get_cosine_schedule_with_warmup",  # torchtune 0.1-0.2
)
#: FSDP1 sharding strategies of torchtune 0.3-0.4 (``fsdp_sharding_strategy``).
_FSDP1 = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "NO_SHARD": 0, "HYBRID_SHARD": 3,
          "_HYBRID_SHARD_ZERO2": 2}


def read_torchtune_config(sniff: Sniff) -> PlanSource:
    """A Plan source from a torchtune recipe config, with C005/C006 findings."""
    doc = sniff.yaml
    if not isinstance(doc, dict):
        raise bad_value(sniff.name, "(the whole file)", type(doc).__name__,
                        "a mapping of settings with model, optimizer and batch_size")
    r = _Reader(doc, PlanSource(name=sniff.name), sniff.path.parent)
    r.src.set("framework", "torch", "(a torchtune recipe config: torchtune's training loop)")
    r.check_keys()
    _model(r)
    _batch(r)
    _parallel(r)
    _precision(r)
    _optimizer(r)
    _schedule(r)
    _clipping(r)
    _checkpointing(r)
    _extra_models(r)
    return r.src


class _Reader(Keyed):
    """Typed, interpolation-resolving access to the config; every value reaches the Plan
    with its torchtune key as origin."""

    def __init__(self, doc: dict[str, Any], src: PlanSource, base: Path) -> None:
        super().__init__(doc, src, fix=_FIX, max_number=None)
        self.base = base

    def component(self, section: str) -> str | None:
        """The ``_component_`` path of a section, None when the section is absent or null;
        a section that is not a mapping, or a path that is not text, is an error."""
        node = self.raw(section)
        if node is MISSING or node is None or isinstance(node, Unresolved):
            return None
        if not isinstance(node, dict):
            raise bad_value(self.file, section, node, "a mapping with _component_")
        path = self.value(f"{section}._component_", section, "str")
        if path is None and not self.given(f"{section}._component_"):
            raise bad_value(self.file, f"{section}._component_", None,
                            "the dotted path of what to build, e.g. torch.optim.AdamW")
        return path

    def arguments(self, section: str) -> list[str]:
        node = self.raw(section)
        return [str(k) for k in node if k != "_component_"] if isinstance(node, dict) else []

    def check_args(self, section: str, known: frozenset[str], what: str) -> None:
        self.src.findings.extend(unknown_key_findings(
            [f"{section}.{k}" for k in self.arguments(section)],
            {f"{section}.{k}" for k in known}, file=self.file, framework="torchtune",
            effect=f"(torchtune's config.instantiate passes it to {what}, which refuses it "
            "at start: TypeError, unexpected keyword argument)",
        ))

    def check_keys(self) -> None:
        self.src.findings.extend(unknown_key_findings(
            [str(k) for k in self.doc], TOP_LEVEL, file=self.file, framework="torchtune",
            effect="(torchtune's recipes never read it: no effect)",
        ))

    def required(self, key: str, field: str, kind: str, *, store: bool = True,
                 **bounds: float) -> Any:
        """A key the recipes read as ``cfg.<key>``: absent, the recipe stops at start.
        ``store`` false only checks the value (it does not become ``field`` itself)."""
        if not self.given(key):
            unresolved_finding(self.src, key, field,
                               "not given: torchtune's recipes read it and stop at start "
                               "without it", f"set {key}")
            return None
        if not store:
            return self.value(key, field, kind, **bounds)
        return self.take(key, field, kind, **bounds)


# ---- model ------------------------------------------------------------------------------
def _model(r: _Reader) -> None:
    path = r.component("model")
    if path is None:
        if not r.given("model"):
            unresolved_finding(r.src, "model", "model", "not given: the recipe builds the "
                               "model this section names", "pass --model config.json")
        return
    found = find_builder(path)
    if r.component("checkpointer") is not None or r.given("checkpointer.checkpoint_dir"):
        # Every training recipe loads the base weights through the checkpointer.
        r.src.set("init.from_pretrained", True, "checkpointer")
    if found is None:
        _unknown_builder(r, path)
        return
    key, shape, adapter = found
    name = path.rsplit(".", 1)[-1]
    r.check_args("model", BUILDER_PARAMS[key], name)
    tied = r.value("model.tie_word_embeddings", "model.tied_embeddings", "bool")
    origin = f"model._component_ ({name} in torchtune's source)"
    for field, value in model_fields(shape, tied=tied).items():
        r.src.set(f"model.{field}", value, origin)
    if tied is not None:
        r.src.set("model.tied_embeddings", tied, "model.tie_word_embeddings")
    quantized = r.value("model.quantize_base", TRAINABLE, "bool")
    if adapter is not None or quantized:
        kind = "qlora" if adapter == "qlora" or quantized else "lora"
        dora = r.value("model.use_dora", TRAINABLE, "bool")
        what = ("DoRA" if dora else "LoRA") + (" over NF4-quantized base weights"
                                               if kind == "qlora" else "")
        unresolved_finding(
            r.src, "model._component_", TRAINABLE,
            f"{name} trains only {what} adapters over a frozen base: a sapper plan "
            "describes full training of every parameter, so it cannot say which weights "
            "carry gradients and optimizer states"
            + (", nor the quantized weights' size" if kind == "qlora" else "")
            + ": the memory verdict is left unknown", _MEMORY_FIX,
        )


def _unknown_builder(r: _Reader, path: str) -> None:
    """A builder outside the table: the checkpoint's config.json when it is on this
    machine, else unknown."""
    folder = r.raw("checkpointer.checkpoint_dir")
    local = local_model_config(folder, r.base) if isinstance(folder, str) else None
    if local is not None:
        r.src.refs["hf_config"] = local
    else:
        unresolved_finding(
            r.src, "model._component_", "model",
            f"{clip(path, 100)!r} is not a model builder sapper knows the shape of (it "
            "knows torchtune's Llama 2/3/3.1/3.2/3.3, Mistral, Qwen 2/2.5/3, Gemma 1/2, "
            "Phi 3/4 and SmolLM2 builders)",
            "pass --model config.json (the model's Hugging Face config)",
        )
    name = path.rsplit(".", 1)[-1]
    if name.startswith(("lora_", "qlora_")):
        unresolved_finding(
            r.src, "model._component_", TRAINABLE,
            f"{clip(name, 80)} trains only adapters over a frozen base: the memory verdict "
            "is left unknown", _MEMORY_FIX,
        )


def _extra_models(r: _Reader) -> None:
    """Recipes that hold more than the model they train."""
    for key, what in (
        ("teacher_model", "the knowledge-distillation recipes hold a teacher model beside "
         "the student they train"),
        ("reward_and_value_model", "the PPO recipe holds a reference policy, a reward "
         "model and a value model beside the policy it trains"),
        ("ref_checkpointer", "the DPO recipe holds a frozen reference copy of the model "
         "beside the one it trains"),
    ):
        if r.given(key) and TRAINABLE not in r.src.unresolved:
            unresolved_finding(
                r.src, key, TRAINABLE,
                f"{what}; a sapper plan describes one model, so the memory verdict is "
                "left unknown", _MEMORY_FIX,
            )
            return


# ---- batch and layout -------------------------------------------------------------------
def _batch(r: _Reader) -> None:
    r.required("batch_size", "batch.micro_batch_size", "int", minimum=1)
    r.required("gradient_accumulation_steps", "batch.gradient_accumulation_steps", "int",
               minimum=1)
    packed = r.value("dataset.packed", "batch.seq_len", "bool")
    seq = r.raw("tokenizer.max_seq_len")
    if isinstance(seq, Unresolved) or seq is MISSING or seq is None:
        why = seq.why if isinstance(seq, Unresolved) else (
            "null: samples are not cut, so a row is as long as the longest sample in its "
            "batch (the dataset decides)" if seq is None else
            "not given: the tokenizer's max_seq_len defaults to None, so a row is as long "
            "as the longest sample in its batch (the dataset decides)")
        if packed:
            why += "; a packed dataset needs it and stops at start without it"
        unresolved_finding(r.src, "tokenizer.max_seq_len", "batch.seq_len", why,
                           "set tokenizer.max_seq_len, or pass --seq-len N")
    else:
        value = check_kind(r.file, "tokenizer.max_seq_len", seq, "int", minimum=1)
        r.src.set("batch.seq_len", value, "tokenizer.max_seq_len" + (
            " (dataset.packed: every row filled to it)" if packed else
            " (samples cut to it; rows padded to the longest in each batch)"))
    epochs = r.required("epochs", "schedule.total_steps", "int", store=False, minimum=0)
    per_epoch = r.value("max_steps_per_epoch", "schedule.total_steps", "int", minimum=1)
    bound = ""
    if epochs is not None and per_epoch is not None:
        bound = f" (at most epochs × max_steps_per_epoch = {epochs * per_epoch})"
    if "schedule.total_steps" not in r.src.unresolved:
        unresolved_finding(
            r.src, "epochs", "schedule.total_steps",
            f"{epochs if epochs is not None else '?'} epoch(s) of the dataset{bound}: the "
            "step count depends on the dataset's size, which the file does not give",
            "write the run's length in a sapper plan given after this file "
            "(schedule: {total_steps: N})",
        )


def _degree(r: _Reader, key: str, default: int, *, minimum: int = 1) -> tuple[int, str]:
    value = r.value(key, f"parallel ({key})", "int", minimum=minimum)
    if value is None:
        return default, f"{key} (torchtune default {default})"
    return value, key


def _parallel(r: _Reader) -> None:
    tp, tp_key = _degree(r, "tensor_parallel_dim", 1)
    cp, cp_key = _degree(r, "context_parallel_dim", 1)
    shard, shard_key = _degree(r, "data_parallel_shard_dim", -1, minimum=-1)
    replicate, rep_key = _degree(r, "data_parallel_replicate_dim", 1)
    if shard == 0:
        raise bad_value(r.file, "data_parallel_shard_dim", 0, "a positive integer or -1 (infer)")
    if tp > 1 and r.raw("tensor_parallel_plan") in (MISSING, None):
        raise InputError(
            "tensor_parallel_dim > 1 without tensor_parallel_plan", file=r.file,
            field="tensor_parallel_dim", value=tp, has_value=True,
            expected="a tensor_parallel_plan component (torchtune refuses TP without one), "
            "or tensor_parallel_dim 1",
        )
    r.src.set("parallel.tp", tp, tp_key)
    r.src.set("parallel.cp", cp, cp_key)
    if tp > 1:
        # torchtune's TP plans put SequenceParallel on the norms (models/llama3/_parallelism.py).
        r.src.set("parallel.sequence_parallel", True, f"{tp_key} (torchtune's TP plan)")
    if shard == -1 and replicate == 1:
        r.src.set("parallel.dp", -1, shard_key)
    elif shard == -1:
        unresolved_finding(r.src, "data_parallel_shard_dim", "parallel.dp",
                           f"-1 with data_parallel_replicate_dim {replicate}: the "
                           "data-parallel degree follows the GPU count, given at launch",
                           "give --dp (replicate × shard)")
    else:
        r.src.set("parallel.dp", replicate * shard, f"{rep_key} × {shard_key}")
    # ParallelDims: FSDP2 fully_shard over the shard (and CP) dimension when it is not 1;
    # reshard_after_forward true is FULL_SHARD (ZeRO-3), false SHARD_GRAD_OP (ZeRO-2).
    # With HSDP (replicate > 1) the states are sharded within the shard group only.
    if shard != 1 or cp > 1:
        stage, origin = 3, f"{shard_key} (FSDP2 fully_shard)"
        reshard = r.value("fsdp_reshard_after_forward", "parallel.zero_stage", "bool")
        if reshard is False:
            stage, origin = 2, "fsdp_reshard_after_forward"
        strategy = r.value("fsdp_sharding_strategy", "parallel.zero_stage", "str")
        if strategy is not None:
            if strategy not in _FSDP1:
                raise bad_value(r.file, "fsdp_sharding_strategy", strategy, " / ".join(_FSDP1))
            stage, origin = _FSDP1[strategy], "fsdp_sharding_strategy"
        r.src.set("parallel.zero_stage", stage, origin)
    else:
        r.src.set("parallel.zero_stage", 0, shard_key)
    if r.value("fsdp_cpu_offload", "parallel.offload_params", "bool"):
        # CPUOffloadPolicy: parameters, gradients and the optimizer step on the host.
        r.src.set("parallel.offload_params", "cpu", "fsdp_cpu_offload")
        r.src.set("parallel.offload_optimizer", "cpu", "fsdp_cpu_offload")


# ---- precision, optimizer, schedule -----------------------------------------------------
def _precision(r: _Reader) -> None:
    if not r.given("dtype"):
        r.required("dtype", "precision.dtype", "str")
        return
    raw = r.raw("dtype")
    if isinstance(raw, Unresolved):
        r.value("dtype", "precision.dtype", "str")
        return
    if raw is None:
        r.src.set("precision.dtype", "fp32", "dtype (null: torchtune's get_dtype gives fp32)")
        return
    dtype = check_kind(r.file, "dtype", raw, "str")
    if dtype == "fp16":
        raise InputError(
            "fp16 is refused by every torchtune training recipe", file=r.file, field="dtype",
            value=dtype, has_value=True,
            expected="bf16 or fp32 (torchtune has no fp16 loss scaling: \"full fp16 training "
            "is not supported\")",
        )
    if dtype == "fp64":
        unresolved_finding(r.src, "dtype", "precision.dtype",
                           "fp64 has no counterpart in sapper's precision model",
                           "pass --dtype fp32 for an estimate at half its size")
        return
    if dtype not in ("bf16", "fp32"):
        raise bad_value(r.file, "dtype", dtype, "bf16 / fp32 (or fp16, fp64)")
    r.src.set("precision.dtype", dtype, "dtype")
    r.src.set("precision.loss_scaling.mode", "none", "dtype (torchtune has no loss scaling)")
    if dtype == "bf16":
        origin = "dtype (torchtune trains in bf16 itself: no autocast, no fp32 copy)"
        for field in ("master_weights", "optimizer_states", "grad_dtype"):
            r.src.set(f"precision.{field}", "bf16", origin)
        r.src.set("precision.autocast", False, origin)


def _optimizer(r: _Reader) -> None:
    path = r.component("optimizer")
    o = "optimizer"
    if path is None:
        if not r.given(o):
            unresolved_finding(r.src, o, "optimizer.type", "not given: torchtune's recipes "
                               "read it and stop at start without it", "set optimizer")
        return
    known = _OPTIMIZERS.get(path)
    if known is None:
        unresolved_finding(
            r.src, f"{o}._component_", "optimizer.type",
            f"{clip(path, 100)!r} is not an optimizer sapper maps (torch.optim AdamW, Adam, "
            "SGD and bitsandbytes' AdamW family)",
            "set optimizer in a sapper plan given after this file",
        )
        r.take(f"{o}.lr", "optimizer.lr", "number", minimum=0)
        return
    kind, eight_bit, paged, where = known
    r.check_args(o, OPTIMIZER_ARGS[path], path.rsplit(".", 1)[-1])
    comp = f"{o}._component_"
    r.src.set("optimizer.type", kind, comp)
    origin = f"{o}.lr ({where})"
    if r.take(f"{o}.lr", "optimizer.lr", "number", minimum=0) is None:
        r.src.set("optimizer.lr", _LR_DEFAULT, origin)
    decay = 0.0 if path in ("torch.optim.Adam", "torch.optim.SGD") else 0.01
    if r.take(f"{o}.weight_decay", "optimizer.weight_decay", "number", minimum=0) is None:
        r.src.set("optimizer.weight_decay", decay, f"{o}.weight_decay ({where})")
    if kind == "sgd":
        if r.take(f"{o}.momentum", "optimizer.momentum", "number", minimum=0) is None:
            r.src.set("optimizer.momentum", 0.0, f"{o}.momentum ({where})")
    else:
        if r.take(f"{o}.eps", "optimizer.eps", "number", minimum=0) is None:
            r.src.set("optimizer.eps", 1e-8, f"{o}.eps ({where})")
        _betas(r, f"{o}.betas", where)
    if path.startswith("bitsandbytes."):
        if eight_bit:
            r.src.set("optimizer.eight_bit", True, comp)
            r.src.set("optimizer.impl", "bnb_8bit", comp)
            r.src.set("precision.optimizer_states", "int8", comp)
        else:
            r.src.set("precision.optimizer_states", "fp32",
                      f"{comp} (bitsandbytes keeps 32-bit states whatever the weights' dtype)")
        if paged:
            _paged(r, path)
        return
    fused = r.value(f"{o}.fused", "optimizer.fused", "bool")
    foreach = r.value(f"{o}.foreach", "optimizer.impl", "bool")
    if fused:
        r.src.set("optimizer.fused", True, f"{o}.fused")
        r.src.set("optimizer.impl", "fused", f"{o}.fused")
    elif foreach is not None:
        r.src.set("optimizer.impl", "foreach" if foreach else "for_loop", f"{o}.foreach")


def _betas(r: _Reader, key: str, where: str) -> None:
    betas = r.raw(key)
    if isinstance(betas, Unresolved):
        r.value(key, "optimizer.betas", "number")
        return
    if betas is MISSING or betas is None:
        r.src.set("optimizer.betas", [0.9, 0.999], f"{key} ({where})")
        return
    if not isinstance(betas, list) or len(betas) != 2:
        raise bad_value(r.file, key, betas, "two numbers, e.g. [0.9, 0.95]")
    pair = [check_kind(r.file, f"{key}[{i}]", r.raw(f"{key}.{i}"), "number", minimum=0,
                       maximum=1) for i in range(2)]
    r.src.set("optimizer.betas", [float(b) for b in pair], key)


def _paged(r: _Reader, path: str) -> None:
    """Paged optimizers keep their states in CUDA unified memory, which the driver moves
    to the host when the GPU runs short: the states' GPU share is not fixed."""
    unresolved_finding(
        r.src, "optimizer._component_", "optimizer.paged",
        f"{path.rsplit('.', 1)[-1]} pages its states out to host memory when the GPU runs "
        "short, so how much of them stays on the GPU is decided at run time: the memory "
        "verdict is left unknown",
        "read `sapper memory` as an upper bound (it counts the states wholly on the GPU)",
    )


def _schedule(r: _Reader) -> None:
    s = "lr_scheduler"
    path = r.component(s)
    if path is None:
        if not isinstance(r.raw(s), Unresolved):
            origin = f"{s} (none: torchtune's recipes keep the LR constant)"
            r.src.set("schedule.type", "constant", origin)
            r.src.set("schedule.warmup_steps", 0, origin)
        return
    if path not in _COSINE:
        unresolved_finding(
            r.src, f"{s}._component_", "schedule.type",
            f"{clip(path, 100)!r} is not a schedule sapper maps (torchtune's "
            "get_cosine_schedule_with_warmup)",
            "set schedule in a sapper plan given after this file (or --warmup N)",
        )
        return
    r.check_args(s, SCHEDULER_ARGS, "get_cosine_schedule_with_warmup")
    cycles = r.value(f"{s}.num_cycles", "schedule.type", "number", minimum=0)
    if cycles is not None and cycles != 0.5:
        unresolved_finding(r.src, f"{s}.num_cycles", "schedule.type",
                           f"{cycles:g} cosine waves, not one half-cosine down to 0",
                           "set schedule.type in a sapper plan given after this file")
    else:
        r.src.set("schedule.type", "cosine", f"{s}._component_")
        r.src.set("schedule.min_lr", 0.0, f"{s}._component_ (a cosine down to 0)")
    if r.given(f"{s}.num_warmup_steps"):
        r.take(f"{s}.num_warmup_steps", "schedule.warmup_steps", "int", minimum=0)
    else:
        unresolved_finding(r.src, f"{s}.num_warmup_steps", "schedule.warmup_steps",
                           "not given: get_cosine_schedule_with_warmup requires it, so the "
                           "recipe stops at start", f"set {s}.num_warmup_steps")


def _clipping(r: _Reader) -> None:
    norm = r.value("clip_grad_norm", "clipping.max_norm", "number")
    in_bwd = r.value("optimizer_in_bwd", "optimizer.in_backward", "bool")
    if norm is None:
        if not isinstance(r.raw("clip_grad_norm"), Unresolved):
            r.src.set("clipping.max_norm", None, "clip_grad_norm (null: no clipping)"
                      if r.given("clip_grad_norm") else "clip_grad_norm (torchtune default: "
                      "no clipping)")
    elif not math.isfinite(norm) or norm <= 0:
        raise bad_value(r.file, "clip_grad_norm", r.raw("clip_grad_norm"),
                        "a positive number, or null for no clipping (0 scales every "
                        "gradient to zero)")
    else:
        r.src.set("clipping.max_norm", float(norm), "clip_grad_norm")
    if not in_bwd:
        return
    ga = r.src.data.get("batch", {}).get("gradient_accumulation_steps")
    for bad, what in ((norm is not None, "clip_grad_norm"),
                      (isinstance(ga, int) and ga > 1, "gradient_accumulation_steps > 1")):
        if bad:
            raise InputError(
                f"optimizer_in_bwd with {what}", file=r.file, field="optimizer_in_bwd",
                value=True, has_value=True,
                expected=f"optimizer_in_bwd: false, or no {what.split(' ')[0]} (torchtune "
                "refuses both at start)",
            )
    unresolved_finding(
        r.src, "optimizer_in_bwd", "optimizer.in_backward",
        "each parameter is stepped as soon as its gradient is ready and the gradient freed, "
        "so the whole set of gradients is never held: the memory verdict is left unknown",
        "read `sapper memory` as an upper bound (it counts a whole set of gradients)",
    )


def _checkpointing(r: _Reader) -> None:
    """``enable_activation_checkpointing`` wraps every TransformerSelfAttentionLayer; with
    it off, ``ac_mode``/``ac_option`` (the distributed full fine-tune only) checkpoint every
    k-th layer ("selective" with an integer) or chosen ops ("selective" with "op")."""
    field = "parallel.checkpointing"
    ac = r.value("enable_activation_checkpointing", f"{field}.granularity", "bool")
    offload = r.value("enable_activation_offloading", f"{field}.cpu_offload", "bool")
    if ac:
        r.src.set(f"{field}.granularity", "full", "enable_activation_checkpointing")
    else:
        mode = r.value("ac_mode", f"{field}.granularity", "str")
        if mode in (None, "none"):
            origin = "enable_activation_checkpointing" + (
                "" if ac is not None else " (torchtune default: off)")
            r.src.set(f"{field}.granularity", "none", origin)
        elif mode == "full":
            r.src.set(f"{field}.granularity", "full", "ac_mode")
        elif mode == "selective":
            option = r.raw("ac_option")
            if option == "op":
                r.src.set(f"{field}.granularity", "selective", "ac_option")
            else:
                every = check_kind(r.file, "ac_option", option, "int", minimum=0)
                r.src.set(f"{field}.granularity", "full", "ac_option")
                r.src.set(f"{field}.every_k_layers", max(every, 1), "ac_option")
        else:
            raise bad_value(r.file, "ac_mode", mode, "none / full / selective")
    if offload:
        if not ac:
            raise InputError(
                "enable_activation_offloading without enable_activation_checkpointing",
                file=r.file, field="enable_activation_offloading", value=True,
                has_value=True, expected="enable_activation_checkpointing: true as well "
                "(torchtune refuses offloading alone at start)",
            )
        r.src.set(f"{field}.cpu_offload", True, "enable_activation_offloading")


# ---- recognition ------------------------------------------------------------------------
def _components(doc: dict[str, Any]) -> list[str]:
    return [v["_component_"] for v in doc.values()
            if isinstance(v, dict) and isinstance(v.get("_component_"), str)]


def _recognise(sniff: Sniff) -> float:
    """A YAML mapping whose sections name torchtune components (``_component_:
    torchtune.models...``, ``torchtune.datasets...``), most keys torchtune's. Hydra and
    NeMo configs say ``_target_``, LitGPT ``class_path``."""
    doc = sniff.yaml
    if sniff.json is not None or not isinstance(doc, dict) or not doc:
        return 0.0
    ours = [c for c in _components(doc) if c.startswith("torchtune.")]
    if not ours:
        return 0.0
    keys = {str(k) for k in doc}
    share = len(keys & TOP_LEVEL) / len(keys)
    model = doc.get("model")
    if isinstance(model, dict) and str(model.get("_component_", "")).startswith(
        "torchtune.models."
    ):
        return 0.6 + 0.35 * share
    return 0.45 + 0.4 * share if len(ours) >= 2 and share >= 0.5 else 0.0


FORMAT = ConfigFormat(
    name="torchtune",
    title="a torchtune recipe config (YAML)",
    looks_for="sections with _component_: torchtune.models..., batch_size, optimizer, "
    "tokenizer, checkpointer",
    recognise=_recognise,
    read=read_torchtune_config,
)
