"""Adam's saved moments: non-finite values (K001), a second moment that underflowed
under a live first moment (K004), and the update they imply (K005).

Adam's next update of an element is ``lr * m̂ / (√v̂ + ε)`` with the bias corrections
``m̂ = m / (1 - β1^t)`` and ``v̂ = v / (1 - β2^t)``; the ratio ``|m̂| / (√v̂ + ε)`` is
that update in learning rates. It is computed here chunk by chunk from the stored
``exp_avg`` and ``exp_avg_sq`` of each parameter.

A torch optimizer's state knows its parameters by index only. The names come from the
order the optimizer received them: the weights' own order (a torch state dict keeps
module order) with, for an HF Trainer checkpoint, the Trainer's split into a decay and a
no-decay group (``Trainer.get_decay_parameter_names``: biases and norms without decay).
An order is accepted only if every index's shape matches; otherwise a parameter is named
by its index (``param 7``).
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sapper.checkpoint.checks import nonfinite_finding
from sapper.checkpoint.naming import parse_name
from sapper.checkpoint.numbers import MAX_COUNT, checked_number
from sapper.checkpoint.rules import ADAM_UPDATE_JUMP, ADAM_V_UNDERFLOW, NO_GRADIENT
from sapper.checkpoint.scan import OptimizerState, Scan
from sapper.checkpoint.tensorstats import CHUNK_ELEMENTS, TensorStats
from sapper.rules.model import Finding

if TYPE_CHECKING:
    import torch

# torch is imported where an optimizer's tensors are read: a checkpoint without an
# optimizer state (a safetensors model) is checked without it.

__all__ = ["JUMP_RATIO", "ParamUpdate", "optimizer_findings", "param_names", "trained_keys"]

#: |m̂|/(√v̂+ε) above this is a jump: with β1=0.9, β2=0.999 steady state stays below ~3.
JUMP_RATIO = 10.0
#: Parameters reported by K005 at most (the worst first); the summary keeps them all.
MAX_JUMP_FINDINGS = 10
#: The keys a parameter without optimizer state may take when names are inferred.
_PARAM = re.compile(r"(?:^|\.)(?:weight|bias)$|_proj$|experts\.")
_NO_DECAY = re.compile(
    r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)|ln_|\.ln\b", re.IGNORECASE
)


@dataclass
class ParamUpdate:
    index: Any
    name: str
    step: float | None
    lr: float | None
    numel: int
    ratio_max: float
    ratio_rms: float
    underflow: int

    def to_json(self) -> dict[str, Any]:
        return {
            "param": str(self.index),
            "tensor": self.name,
            "step": self.step,
            "lr": self.lr,
            "update_ratio_max": self.ratio_max,
            "update_ratio_rms": self.ratio_rms,
            "v_underflow": self.underflow,
        }


class _Order:
    """Weight keys in the order an optimizer may have received them, with the positions
    of each shape (and of the parameter-like keys), so the next key of a shape after a
    position is found by bisection."""

    def __init__(
        self, keys: list[str], shapes: dict[str, tuple[int, ...]], param_like: set[str]
    ) -> None:
        self.keys = keys
        self.by_shape: dict[tuple[int, ...], list[int]] = {}
        self.like: list[int] = []
        for pos, key in enumerate(keys):
            self.by_shape.setdefault(shapes[key], []).append(pos)
            if key in param_like:
                self.like.append(pos)

    def next(self, shape: tuple[int, ...] | None, pos: int) -> int | None:
        """The first position at or after ``pos`` of a key of ``shape`` (None: of a
        parameter-like key)."""
        positions = self.like if shape is None else self.by_shape.get(shape, [])
        i = bisect.bisect_left(positions, pos)
        return positions[i] if i < len(positions) else None


def _match(
    order: _Order, wanted: list[tuple[Any, tuple[int, ...] | None]]
) -> dict[Any, str] | None:
    """Assign ``wanted`` (index, shape) in turn to the next key of ``order`` with that
    shape (keys of other shapes are skipped: buffers, frozen tensors); None if one fails.
    An index without state (shape None: it never had a gradient) takes the next
    parameter-like key (a floating weight or bias, not a buffer's name)."""
    names: dict[Any, str] = {}
    pos = 0
    for index, shape in wanted:
        found = order.next(shape, pos)
        if found is None:
            return None
        names[index] = order.keys[found]
        pos = found + 1
    return names


@dataclass
class _Weights:
    """What naming the optimizers' parameters needs of a checkpoint's weights, worked out
    once per checkpoint (however many optimizers, one per Megatron rank, ask)."""

    shapes: dict[str, tuple[int, ...]]
    param_like: set[str]
    #: Keys in the order the optimizer received them: all (``""``), or one Megatron rank
    #: folder's (``mp_rank_00/``); a safetensors checkpoint's in its config's module order.
    orders: dict[str, list[str]]
    indexed: dict[tuple[str, str], _Order]

    def order(self, rank: str, which: str) -> _Order:
        """The keys of ``rank`` indexed: ``all``, or the Trainer's ``decay``/``no_decay``."""
        if (rank, which) not in self.indexed:
            keys = self.orders[rank]
            if which != "all":
                keys = [k for k in keys if (_NO_DECAY.search(k) is None) == (which == "decay")]
            self.indexed[rank, which] = _Order(keys, self.shapes, self.param_like)
        return self.indexed[rank, which]


def _weights(scan: Scan) -> _Weights:
    cached = scan.memo.get("optim.weights")
    if cached is not None:
        return cached
    infos = {k: scan.weights.info(k) for k in scan.weights.keys()}
    shapes = {k: i.shape for k, i in infos.items()}
    param_like = {
        k for k, i in infos.items() if i.dtype.startswith(("float", "bfloat")) and _PARAM.search(k)
    }
    orders: dict[str, list[str]] = {}
    if scan.layout.weights_format == "safetensors":
        module = _module_order(scan.config) if scan.config is not None else None
        orders[""] = [k for k in module or [] if k in shapes]
    else:
        orders[""] = list(shapes)
        for k in shapes:  # Megatron ranks' weights, kept apart as mp_rank_XX/<name>
            head, sep, _ = k.partition("/")
            if sep:
                orders.setdefault(head + sep, []).append(k)
    weights = _Weights(shapes, param_like, orders, {})
    scan.memo["optim.weights"] = weights
    return weights


def param_names(scan: Scan, opt: OptimizerState) -> dict[Any, str]:
    """Parameter index -> weight key, where an order consistent with every shape exists."""
    if opt.names is not None:
        return opt.names
    wanted_groups: list[list[tuple[Any, tuple[int, ...] | None]]] = []
    for group in opt.param_groups:
        ids = _param_ids(group)
        wanted_groups.append([(i, _moment_shape(opt.state.get(i))) for i in ids])
    if all(shape is None for g in wanted_groups for _, shape in g):
        return {}
    weights = _weights(scan)
    rank = Path(opt.file).parent.name + "/"
    rank = rank if rank in weights.orders else ""  # Megatron ranks: this rank's weights only
    if not weights.orders[rank]:
        return {}
    candidates = [["all"] * len(wanted_groups)]
    if len(wanted_groups) == 2:
        candidates.insert(0, ["decay", "no_decay"])
    for orders in candidates:
        names: dict[Any, str] = {}
        for which, wanted in zip(orders, wanted_groups, strict=True):
            got = _match(weights.order(rank, which), wanted)
            if got is None:
                break
            names.update(got)
        else:
            return names
    return {}


def trained_keys(scan: Scan) -> set[str] | None:
    """The weight keys some optimizer of the checkpoint trains; None when there is no
    optimizer or one of its parameters cannot be named."""
    if not scan.optimizers:
        return None
    keys: set[str] = set()
    for opt in scan.optimizers:
        names = param_names(scan, opt)
        ids = [i for g in opt.param_groups for i in _param_ids(g)]
        if not ids or any(i not in names for i in ids):
            return None
        keys.update(names[i] for i in ids)
    return keys


def _dense(t: Any) -> bool:
    """A dense CPU tensor (what can be streamed); sparse, quantized or meta are skipped."""
    import torch

    return (
        isinstance(t, torch.Tensor)
        and t.layout == torch.strided
        and t.device.type == "cpu"
        and not t.is_quantized
    )


def _param_ids(group: Any) -> list[Any]:
    """The parameter indices of a param group (hashable ones only: a damaged file may put
    anything there)."""
    ids = group.get("params") if isinstance(group, dict) else None
    if not isinstance(ids, (list, tuple)):
        return []
    return [i for i in ids if isinstance(i, (int, str)) and not isinstance(i, bool)]


def _moment_shape(entry: Any) -> tuple[int, ...] | None:
    import torch

    if isinstance(entry, dict):
        for key in ("exp_avg", "exp_avg_sq", "momentum_buffer"):
            if isinstance(entry.get(key), torch.Tensor):
                return tuple(entry[key].shape)
    return None


def _module_order(config: dict[str, Any]) -> list[str] | None:
    """Parameter names in module order of the HF model ``config`` describes, built on the
    meta device (no memory, no weights); None where transformers cannot build it."""
    try:
        import torch
        import transformers

        arch = (config.get("architectures") or [None])[0]
        cls = getattr(transformers, arch, None) if isinstance(arch, str) else None
        model_type = config.get("model_type")
        if cls is None or not isinstance(model_type, str):
            return None
        cfg = transformers.AutoConfig.for_model(
            model_type,
            **{k: v for k, v in config.items() if k not in ("model_type", "transformers_version")},
        )
        with torch.device("meta"):
            model = cls(cfg)
        return [n for n, _ in model.named_parameters()]
    except Exception:  # any config transformers cannot build: names by index then
        return None


@dataclass
class _Hyper:
    """A param group's numbers Adam's update needs, checked (None where not numbers)."""

    lr: float | None
    betas: list[float | None]
    eps: float | None


def _hyper(group: Any, index: int, file: str) -> _Hyper:
    if not isinstance(group, dict):
        return _Hyper(None, [], None)
    where = f"param_groups.{index}"
    betas = group.get("betas")
    pair = betas[:2] if isinstance(betas, (list, tuple)) else []
    return _Hyper(
        checked_number(group.get("lr"), file=file, field=f"{where}.lr"),
        [checked_number(b, file=file, field=f"{where}.betas.{i}") for i, b in enumerate(pair)],
        checked_number(group.get("eps"), file=file, field=f"{where}.eps"),
    )


def _step(entry: dict[str, Any], index: Any, file: str) -> float | None:
    """Adam's step count of one parameter: an integer in 0 … 2^63-1, or None."""
    return checked_number(
        entry.get("step"), file=file, field=f"state.{index}.step", low=0, high=MAX_COUNT,
        integer=True,
    )  # fmt: skip


def _update_stats(
    entry: dict[str, Any], hyper: _Hyper, step: float | None, key: str, file: str, mapped: bool
) -> tuple[ParamUpdate, TensorStats, TensorStats]:
    m, v = entry["exp_avg"], entry["exp_avg_sq"]
    pair = hyper.betas
    b1, b2 = (pair[0], pair[1]) if len(pair) == 2 and None not in pair else (0.9, 0.999)
    eps = hyper.eps
    eps = eps if eps is not None and math.isfinite(eps) and eps > 0 else 1e-8
    t = step if step is not None and math.isfinite(step) and step > 0 else 1.0
    bc1 = 1 - b1**t if 0 <= b1 < 1 else 1.0  # type: ignore[operator]
    bc2 = 1 - b2**t if 0 <= b2 < 1 else 1.0  # type: ignore[operator]
    bc1, bc2 = (bc1 if bc1 > 0 else 1.0), (bc2 if bc2 > 0 else 1.0)
    import torch

    from sapper.checkpoint.pages import streamed
    from sapper.checkpoint.stats import StatsAccumulator

    m_acc = StatsAccumulator(
        TensorStats(f"{key}.exp_avg", str(m.dtype).removeprefix("torch."), tuple(m.shape), file)
    )
    v_acc = StatsAccumulator(
        TensorStats(f"{key}.exp_avg_sq", str(v.dtype).removeprefix("torch."), tuple(v.shape), file)
    )
    ratio_max, ratio_sq, underflow, count = 0.0, 0.0, 0, 0
    pieces = zip(
        streamed(m, CHUNK_ELEMENTS, mapped), streamed(v, CHUNK_ELEMENTS, mapped), strict=True
    )
    for mc, vc in pieces:
        seen = m_acc.stats.nonfinite + v_acc.stats.nonfinite
        m_acc.add(mc)
        v_acc.add(vc)
        if not mc.numel():
            continue
        # The accumulators have just counted the pieces' non-finite values: without any,
        # the masks (two isfinite passes and a where, a third of the time) are not needed.
        clean = m_acc.stats.nonfinite + v_acc.stats.nonfinite == seen
        mf, vf = mc.float(), vc.float()
        if clean:
            if float(vf.min()) <= 0:
                underflow += int(((vf <= 0) & (mf != 0)).sum())
            denom = vf.clamp(min=0).div_(bc2).sqrt_().add_(eps)
            ratio = mf.abs().div_(bc1).div_(denom)
            count += ratio.numel()
        else:
            ok = torch.isfinite(mf) & torch.isfinite(vf)
            underflow += int(((vf <= 0) & (mf != 0) & ok).sum())
            ratio = (mf.abs() / bc1) / (torch.sqrt(vf.clamp(min=0) / bc2) + eps)
            ratio = torch.where(ok, ratio, torch.zeros(()))
            count += int(ok.sum())
        ratio_max = max(ratio_max, float(ratio.max()))
        ratio_sq += float(torch.dot(ratio.reshape(-1), ratio.reshape(-1)))
    upd = ParamUpdate(
        index=None,
        name=key,
        step=step,
        lr=hyper.lr,
        numel=m.numel(),
        ratio_max=ratio_max,
        ratio_rms=math.sqrt(ratio_sq / count) if count else 0.0,
        underflow=underflow,
    )
    return upd, m_acc.stats, v_acc.stats


def optimizer_findings(scan: Scan) -> tuple[list[Finding], list[ParamUpdate], list[TensorStats]]:
    """K001 on moments, K004 and K005 for every Adam-like parameter state."""
    findings: list[Finding] = []
    updates: list[ParamUpdate] = []
    moment_stats: list[TensorStats] = []
    if not scan.optimizers:
        return findings, updates, moment_stats
    import torch

    for n_opt, opt in enumerate(scan.optimizers):
        # every group's and every state's numbers are checked before a tensor is read
        hypers = [_hyper(g, i, opt.file) for i, g in enumerate(opt.param_groups)]
        steps = {
            index: _step(entry, index, opt.file)
            for index, entry in opt.state.items()
            if isinstance(entry, dict)
        }
        names = param_names(scan, opt)
        group_of = {i: hypers[n] for n, g in enumerate(opt.param_groups) for i in _param_ids(g)}
        unnamed = f"optimizer{'' if n_opt == 0 else n_opt}.param "
        silent = [names.get(i, f"{unnamed}{i}") for i in group_of if i not in opt.state]
        for index, entry in opt.state.items():
            if not isinstance(entry, dict):
                continue
            label = names.get(index, f"{unnamed}{index}")
            if not all(isinstance(entry.get(k), torch.Tensor) for k in ("exp_avg", "exp_avg_sq")):
                for k, t in entry.items():
                    if _dense(t) and t.is_floating_point() and t.numel() > 1:
                        s = _plain_stats(f"{label}.{k}", t, opt.file)
                        moment_stats.append(s)
                        if s.nonfinite:
                            findings.append(nonfinite_finding(s, "optimizer state "))
                continue
            m, v = entry["exp_avg"], entry["exp_avg_sq"]
            if m.shape != v.shape or not (_dense(m) and _dense(v)):
                continue
            hyper = group_of.get(index, _Hyper(None, [], None))
            upd, ms, vs = _update_stats(entry, hyper, steps.get(index), label, opt.file, opt.mapped)

            upd.index = index
            updates.append(upd)
            moment_stats += [ms, vs]
            if upd.step and ms.zeros == ms.numel and vs.zeros == vs.numel:
                silent.append(label)
            for s in (ms, vs):
                if s.nonfinite:
                    findings.append(nonfinite_finding(s, "optimizer state "))
            if upd.underflow:
                findings.append(
                    ADAM_V_UNDERFLOW.finding(
                        f"{label} ({parse_name(label).describe()}): exp_avg_sq is zero "
                        f"where exp_avg is not in {upd.underflow} of {upd.numel} elements "
                        f"({upd.underflow / upd.numel:.1%}); the update there is m/eps",
                        value=upd.underflow / upd.numel,
                        source=opt.file,
                        tensor=label,
                        param=str(index),
                        dtype=vs.dtype,
                    )
                )
        findings += _no_gradient(opt, silent, steps)
    jumps = sorted(
        (u for u in updates if u.ratio_max > JUMP_RATIO), key=lambda u: u.ratio_max, reverse=True
    )
    for u in jumps[:MAX_JUMP_FINDINGS]:
        lr = f" (lr {u.lr:.3g}: a step of {u.ratio_max * u.lr:.3g})" if u.lr else ""
        findings.append(
            ADAM_UPDATE_JUMP.finding(
                f"{u.name} ({parse_name(u.name).describe()}): the stored moments imply an update "
                f"of up to {u.ratio_max:.3g} learning rates{lr}, RMS {u.ratio_rms:.3g}; "
                f"{len(jumps)} parameter(s) over {JUMP_RATIO:g}",
                value=u.ratio_max,
                threshold=JUMP_RATIO,
                source=scan.optimizers[0].file,
                tensor=u.name,
                param=str(u.index),
            )
        )
    return findings, updates, moment_stats


def _no_gradient(
    opt: OptimizerState, silent: list[str], steps: dict[Any, float | None]
) -> list[Finding]:
    """K016: parameters of the optimizer's groups without state, or with all-zero moments,
    once the optimizer has stepped (any state with step > 0; ``steps`` checked)."""
    stepped = max((s for s in steps.values() if s is not None), default=0)
    if not silent or stepped <= 0:
        return []
    shown = ", ".join(silent[:5]) + (f" and {len(silent) - 5} more" if len(silent) > 5 else "")
    return [
        NO_GRADIENT.finding(
            f"{len(silent)} of the optimizer's {sum(len(_param_ids(g)) for g in opt.param_groups)} "
            f"parameters never had a non-zero gradient in {stepped:g} steps: {shown}",
            value=float(len(silent)),
            source=opt.file,
            tensor=silent[0],
            parameters=silent[:50],
            step=stepped,
        )
    ]


def _plain_stats(key: str, t: torch.Tensor, file: str) -> TensorStats:
    from sapper.checkpoint.stats import StatsAccumulator, flat_chunks

    acc = StatsAccumulator(
        TensorStats(key, str(t.dtype).removeprefix("torch."), tuple(t.shape), file)
    )
    for chunk in flat_chunks(t):
        acc.add(chunk)
    return acc.stats
