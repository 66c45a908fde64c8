"""One checkpoint read into what the checks need: its weights as a tensor source, and its
optimizer, scheduler, scaler and trainer state as plain data.

The pieces are found by :func:`sapper.checkpoint.layout.detect`; torch files are split
by their content (an optimizer state dict has ``state`` and ``param_groups``; a
Lightning checkpoint has ``state_dict`` and ``optimizer_states``; a custom loop's file
often ``model``/``optimizer``/``scheduler``/``scaler``), not by their names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sapper.checkpoint.layout import Layout, detect, read_json
from sapper.checkpoint.source import SafetensorsSource, TensorSource, TorchSource
from sapper.errors import InputError

if TYPE_CHECKING:
    from types import ModuleType

    import torch

__all__ = ["OptimizerState", "Scan", "load_scan"]

_WEIGHT_KEYS = ("state_dict", "model", "model_state_dict", "module", "model_state")
_OPTIM_KEYS = ("optimizer", "optimizer_state_dict", "optim", "optimizer_states")
_SCHED_KEYS = (
    "lr_schedulers", "scheduler", "lr_scheduler", "scheduler_state_dict", "opt_param_scheduler",
)  # fmt: skip
_SCALER_KEYS = ("scaler", "grad_scaler", "native_amp_scaling_state", "MixedPrecision")


@dataclass
class OptimizerState:
    """A torch optimizer ``state_dict()`` and the file it came from."""

    state: dict[Any, dict[str, Any]]
    param_groups: list[dict[str, Any]]
    file: str
    #: Loaded with ``mmap=True`` (its tensors' pages may be dropped after reading).
    mapped: bool = False
    #: Parameter names by state index where the format records them (DeepSpeed's ZeRO
    #: partitions); None where they must be inferred from the weights' order.
    names: dict[Any, str] | None = None


@dataclass
class Scan:
    layout: Layout
    weights: TensorSource
    weights_file: str
    optimizers: list[OptimizerState] = field(default_factory=list)
    schedulers: list[dict[str, Any]] = field(default_factory=list)
    #: Why the checkpoint needs no scheduler state, where its framework shows it: the
    #: scheduler's key saved empty (the run had none), or an LR the loop computes from a
    #: saved step counter (nanoGPT's and LitGPT's ``iter_num``).
    schedule_without_state: str | None = None
    scaler: dict[str, Any] | None = None
    scaler_file: str = ""
    trainer_state: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    rng: bool = False
    #: Lightning's top-level bookkeeping (global_step, epoch, loops), when present.
    lightning: dict[str, Any] | None = None
    #: Megatron-LM's iteration and whether its RNG state is saved, when present.
    megatron: dict[str, Any] | None = None
    #: Whether this checkpoint carries training state at all (not a weights export).
    training: bool = False
    #: fp32 master weights kept apart from the weights (DeepSpeed ZeRO 1/2 partitions).
    masters: TensorSource | None = None
    #: DeepSpeed's engine counters (global_steps, skipped_steps, zero_stage, ...).
    deepspeed: dict[str, Any] | None = None
    #: The weights are fp32 masters (ZeRO 3 keeps no 16-bit copy): their dtype is not the
    #: model's.
    weights_are_masters: bool = False
    #: The file each piece of state was read from (``scheduler``: the first scheduler's,
    #: ``lightning``, ``megatron``, ``deepspeed``), to name it when a value is refused.
    origins: dict[str, str] = field(default_factory=dict)
    #: What the checks work out once per checkpoint (by the module's own keys).
    memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def origin(self, piece: str) -> str:
        return self.origins.get(piece, str(self.layout.path))

    @property
    def kind(self) -> str:
        if self.lightning is not None:
            return "lightning"
        return "megatron" if self.megatron is not None else self.layout.kind

    def close(self) -> None:
        self.weights.close()


def _is_optimizer(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("state"), dict)
        and isinstance(obj.get("param_groups"), list)
    )


def _torchfile() -> ModuleType:
    """The torch file reader, imported (with torch) where a torch file is read: a
    safetensors checkpoint is read without either."""
    from sapper.checkpoint import torchfile

    return torchfile


def _tensor_dict(obj: Any) -> bool:
    import torch

    return (
        isinstance(obj, dict)
        and bool(obj)
        and all(isinstance(v, torch.Tensor) for v in obj.values())
    )


def _optimizers(obj: Any, file: str) -> list[OptimizerState]:
    items = obj if isinstance(obj, list) else [obj]
    # Megatron-LM wraps the torch optimizer's state: {"optimizer": {...}, "grad_scaler": ...}
    items = [
        o["optimizer"] if isinstance(o, dict) and _is_optimizer(o.get("optimizer")) else o
        for o in items
    ]
    is_mapped = _torchfile().mapped(Path(file))
    return [
        OptimizerState(o["state"], o["param_groups"], file, is_mapped)
        for o in items
        if _is_optimizer(o)
    ]


def _split_torch(scan_kw: dict[str, Any], obj: Any, file: str) -> dict[str, torch.Tensor]:
    """Weights of a torch file's object; its optimizer/scheduler/scaler go to scan_kw."""
    if _is_optimizer(obj):
        scan_kw["optimizers"] += _optimizers(obj, file)
        return {}
    if not isinstance(obj, dict):
        raise InputError(
            "torch file holds no state dict",
            file=file,
            value=type(obj).__name__,
            expected="a dict of tensors or of training state",
        )
    if _tensor_dict(obj):
        return dict(_torchfile().iter_tensors(obj))
    weights: dict[str, torch.Tensor] = {}
    for key in _WEIGHT_KEYS:
        if isinstance(obj.get(key), dict):
            weights = {k: v for k, v in _torchfile().iter_tensors(obj[key])}
            break
    for key in _OPTIM_KEYS:
        if key in obj:
            scan_kw["optimizers"] += _optimizers(obj[key], file)
    for key in _SCHED_KEYS:
        value = obj.get(key)
        found = [s for s in (value if isinstance(value, list) else [value]) if isinstance(s, dict)]
        if found:
            scan_kw["origins"].setdefault("scheduler", f"{file}: {key}")
        elif key in obj and value in (None, []):  # saved empty: the run had no scheduler
            scan_kw["schedule_without_state"] = f"{key} saved empty: the run had no LR scheduler"
        scan_kw["schedulers"] += found
    if "iter_num" in obj and not any(k in obj for k in _SCHED_KEYS):
        # nanoGPT's train.py and LitGPT's pretrain/finetune compute the LR from the step
        # (get_lr(iter_num)) and save iter_num: the schedule resumes exactly.
        scan_kw["schedule_without_state"] = "the LR follows the saved iter_num"
    for key in _SCALER_KEYS:
        if isinstance(obj.get(key), dict) and "scale" in obj[key]:
            scan_kw["scaler"], scan_kw["scaler_file"] = obj[key], f"{file}: {key}"
    wrapped = obj.get("optimizer")
    if isinstance(wrapped, dict) and isinstance(wrapped.get("grad_scaler"), dict):
        if "scale" in wrapped["grad_scaler"]:  # Megatron-LM's DynamicGradScaler state
            scan_kw["scaler"] = wrapped["grad_scaler"]
            scan_kw["scaler_file"] = f"{file}: optimizer.grad_scaler"
    if "iteration" in obj and "model" in obj:  # Megatron-LM's model_optim_rng.pt
        scan_kw["megatron"] = {"iteration": obj.get("iteration"), "rng": "rng_state" in obj}
        scan_kw["origins"]["megatron"] = file
    if "state_dict" in obj and ("loops" in obj or "pytorch-lightning_version" in obj):
        scan_kw["lightning"] = {
            k: obj.get(k) for k in ("global_step", "epoch", "loops") if k in obj
        }
        scan_kw["origins"]["lightning"] = file
    if not weights and not scan_kw["optimizers"]:
        weights = {k: v for k, v in _torchfile().iter_tensors(obj)}
    return weights


def _weights_source(layout: Layout, scan_kw: dict[str, Any]) -> tuple[TensorSource, str]:
    if layout.weights and layout.weights_format == "safetensors":
        return SafetensorsSource(layout.weights), ", ".join(str(p) for p in layout.weights)
    if layout.weights:
        merged: dict[str, torch.Tensor] = {}
        for path in layout.weights:
            part = _split_torch(scan_kw, _torchfile().load_torch_file(path), str(path))
            if layout.kind == "megatron" and len(layout.weights) > 1:
                # tensor-parallel ranks hold slices under the same keys: keep them apart
                part = {f"{path.parent.name}/{k}": v for k, v in part.items()}
            merged.update(part)
        files = ", ".join(str(p) for p in layout.weights)
        is_mapped = all(_torchfile().mapped(p) for p in layout.weights)
        return TorchSource(merged, files, is_mapped), files
    if layout.dcp is not None:
        from sapper.checkpoint.dcp import DcpSource

        return DcpSource(layout.dcp), str(layout.dcp)
    return TorchSource({}, str(layout.path)), str(layout.path)


def _deepspeed(
    tag: Path, weights: TensorSource, weights_file: str, kw: dict[str, Any]
) -> tuple[TensorSource, str]:
    """A DeepSpeed save's pieces into ``kw``; its weights where the folder has no others:
    the 16-bit module weights with the fp32 masters apart (ZeRO 0–2), or the masters
    themselves (ZeRO 3 keeps only empty placeholders in the module)."""
    from sapper.checkpoint.deepspeed import LazyMoments, read_deepspeed

    ds = read_deepspeed(tag)
    kw["deepspeed"] = {**ds.engine, "zero_stage": ds.zero_stage, "data_parallel": ds.world}
    kw["origins"]["deepspeed"] = ds.module_file
    if not weights.keys():
        if ds.module:
            weights = TorchSource(ds.module, ds.module_file, ds.module_mapped)
            weights_file = ds.module_file
        elif ds.masters.keys():
            # ZeRO 3: the fp32 masters stand in for the trained weights, beside the frozen
            # ones' 16-bit fragments
            weights, weights_file = ds.masters, ds.optim_file
            if ds.frozen is not None:
                weights = ds.masters.joined(ds.frozen)
            kw["weights_are_masters"] = True
    if weights is not ds.masters and ds.masters.keys():
        kw["masters"] = ds.masters
    if {"exp_avg", "exp_avg_sq"} <= set(ds.moments):
        names = ds.masters.keys()
        members: dict[Any, list[str]] = {}
        for n in names:  # one pass, however many groups the file lists
            members.setdefault(ds.groups_of.get(n), []).append(n)
        groups = [
            {**g, "params": members.get(i, [])} for i, g in enumerate(ds.param_groups or [{}])
        ]
        state: dict[Any, dict[str, Any]] = {n: LazyMoments(ds.step, ds.moments, n) for n in names}
        kw["optimizers"].append(
            OptimizerState(state, groups, ds.optim_file, ds.masters.mapped, {n: n for n in names})
        )
    scaler = ds.loss_scaler or {}
    if scaler.get("dynamic") is True or str(scaler.get("type", "")).endswith("DynamicLossScaler"):
        kw["scaler"] = {"scale": scaler.get("cur_scale"), **scaler}
        kw["scaler_file"] = f"{ds.optim_file}: loss_scaler"
    if ds.lr_scheduler is not None:
        kw["origins"].setdefault("scheduler", f"{ds.module_file}: lr_scheduler")
        kw["schedulers"].append(ds.lr_scheduler)
    elif ds.no_lr_scheduler:
        kw["schedule_without_state"] = "lr_scheduler saved as None: the run had no LR scheduler"
    return weights, weights_file


def load_scan(path: Path) -> Scan:
    """Read the layout of ``path`` and the small pieces of state; tensors stay unread."""
    layout = detect(path)
    kw: dict[str, Any] = {
        "megatron": None,
        "optimizers": [],
        "schedulers": [],
        "scaler": None,
        "scaler_file": "",
        "lightning": None,
        "masters": None,
        "deepspeed": None,
        "weights_are_masters": False,
        "origins": {},
    }
    weights, weights_file = _weights_source(layout, kw)
    if layout.deepspeed is not None:
        weights, weights_file = _deepspeed(layout.deepspeed, weights, weights_file, kw)
    if layout.optimizer is not None:
        obj = _torchfile().load_torch_file(layout.optimizer)
        kw["optimizers"] += _optimizers(obj, str(layout.optimizer))
        if not kw["optimizers"]:
            raise InputError(
                "optimizer file holds no optimizer state_dict",
                file=str(layout.optimizer),
                expected="'state' and 'param_groups'",
            )
    if layout.scheduler is not None:
        obj = _torchfile().load_torch_file(layout.scheduler)
        if isinstance(obj, dict):
            kw["origins"].setdefault("scheduler", str(layout.scheduler))
            kw["schedulers"].append(obj)
    if layout.scaler is not None:
        obj = _torchfile().load_torch_file(layout.scaler)
        if isinstance(obj, dict):
            kw["scaler"], kw["scaler_file"] = obj, str(layout.scaler)
    for rng in layout.rng:
        _torchfile().load_torch_file(rng)  # proves it loads (and needs nothing unsafe)
    trainer_state = read_json(layout.trainer_state) if layout.trainer_state else None
    config = read_json(layout.config) if layout.config else None
    scan = Scan(
        layout=layout,
        weights=weights,
        weights_file=weights_file,
        trainer_state=trainer_state,
        config=config,
        rng=bool(layout.rng) or bool((kw["megatron"] or {}).get("rng")),
        **kw,
    )
    scan.training = bool(
        scan.optimizers
        or trainer_state is not None
        or scan.lightning
        or scan.megatron
        or scan.deepspeed
    )
    return scan
