"""Sequences against the positions the model has: the live half of R090 / R091.

The limit is the plan's ``model.max_position_embeddings``, else the model's config
(``n_positions`` for GPT-2, ``max_position_embeddings`` for BERT/Llama, ``block_size`` for
nanoGPT, on the model or a module inside it), else the rows of its position embedding
(an ``nn.Embedding`` named ``wpe`` / ``position_embeddings`` / ``pos_emb`` ...). A learned
table makes the kind ``learned``; rotary modules or RoPE settings make it ``rope``, and
the RoPE limit is what the configured ``rope_scaling`` supports.

The largest position id alone misses a script that wraps or clamps its positions
(``arange(T) % max_pos``, ``.clamp(max=max_pos - 1)``) or a model that does it inside:
no index ever passes the table, nothing fails, the loss just suffers. So the sequence
length is compared too, where the model receives it and where it reaches the position
table or the rotary embedding (host-known shapes: no sync). A sequence longer than the
limit is then judged once per length and site, from its position ids: an id past the
limit is R090; ids that are exactly ``i mod limit`` or ``min(i, limit - 1)`` are R091
(wrapped / clamped); anything else (per-document positions of packed sequences, padding)
is legitimate. HF models on flash-attention read restarting ids as document boundaries,
so wrapped ids there are taken for packing. Position ids on an accelerator are copied to
the host for that judgement, once per new over-long length: that is the only sync, and
only for a sequence already longer than the model's positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from sapper.monitor.inputs import BatchView

__all__ = ["PositionLimit", "PositionWatch", "position_limit", "position_tables"]

#: Config attributes that hold the context length, by family (first found wins).
_LIMIT_ATTRS = (
    "n_positions",  # GPT-2
    "max_position_embeddings",  # BERT, Llama, OPT, NeoX ...
    "n_ctx",
    "block_size",  # nanoGPT
    "max_seq_len",
    "max_sequence_length",
    "seq_length",
)
_ROPE_ATTRS = ("rope_theta", "rope_parameters", "rope_scaling", "rotary_dim", "rotary_pct")
_BY_SCRIPT = "by the training script in the position_ids it passes"
_INT = (torch.int64, torch.int32, torch.int16, torch.uint8)


@dataclass(frozen=True)
class PositionLimit:
    """The positions a model can represent."""

    limit: int
    kind: str  # "learned" | "rope"
    #: Where the limit was read (``config.n_positions``, ``transformer.wpe``, the plan).
    source: str
    #: RoPE with scaling configured: its factor and the context it was trained at.
    factor: float | None = None
    trained: int | None = None


def _config(model: nn.Module) -> Any:
    cfg = getattr(model, "config", None)
    if cfg is not None and not isinstance(cfg, nn.Module):
        return cfg
    for mod in model.modules():
        cfg = getattr(mod, "config", None)
        if cfg is not None and not isinstance(cfg, nn.Module):
            return cfg
    return None


def _is_position_name(name: str) -> bool:
    last = name.rsplit(".", 1)[-1].lower()
    if "token_type" in last:
        return False
    return last == "wpe" or "position" in last or last.startswith("pos") or "embed_pos" in last


def position_tables(model: nn.Module) -> list[tuple[str, nn.Embedding]]:
    """Learned position tables: plain ``nn.Embedding`` modules named for positions (a
    subclass with its own forward, like OPT's offset table, is not indexed by positions
    directly and is left out)."""
    return [
        (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Embedding)
        and type(mod).forward is nn.Embedding.forward
        and _is_position_name(name)
    ]


def _rotary_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if "rotary" in type(m).__name__.lower()]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def position_limit(model: nn.Module, declared: int | None = None) -> PositionLimit | None:
    """The model's positions (see the module docstring); ``None`` when it has no limit
    sapper can find (relative or ALiBi positions, an unknown layout)."""
    cfg = _config(model)
    if getattr(cfg, "alibi", False) is True:
        return None
    tables = position_tables(model)
    rotary = _rotary_modules(model)
    limit, source = _int(declared), "the plan's model.max_position_embeddings"
    if limit is None:
        attr = next((a for a in _LIMIT_ATTRS if _int(getattr(cfg, a, None))), None)
        if attr is not None:
            limit, source = getattr(cfg, attr), f"config.{attr}"
    if limit is None and tables:
        name, table = tables[0]
        limit, source = table.num_embeddings, name
    if limit is None:
        return None
    rope = not tables and (
        bool(rotary)
        or any(getattr(cfg, a, None) for a in _ROPE_ATTRS)
        or getattr(cfg, "position_embedding_type", None) == "rotary"
    )
    if not rope:
        if tables or declared:
            return PositionLimit(limit, "learned", source)
        return None
    scaling = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None)
    scaling = scaling if isinstance(scaling, dict) else {}
    kind = scaling.get("rope_type") or scaling.get("type")
    factor = scaling.get("factor")
    if kind in (None, "default") or not isinstance(factor, (int, float)) or factor <= 1:
        return PositionLimit(limit, "rope", source)
    trained = _int(scaling.get("original_max_position_embeddings")) or limit
    supported = max(int(trained * factor), limit)
    return PositionLimit(supported, "rope", source, factor=float(factor), trained=trained)


def _reuse(rows: torch.Tensor, top: int, limit: int) -> str | None:
    """``wrapped`` when every row is ``i mod limit``, ``clamped`` when it is
    ``min(i, limit - 1)``, else ``None`` (positions restarting per document, padding)."""
    if top != limit - 1:
        return None
    span = torch.arange(rows.shape[-1], dtype=rows.dtype)
    if bool((rows == span % limit).all()):
        return "wrapped"
    if bool((rows == span.clamp(max=top)).all()):
        return "clamped"
    return None


class PositionWatch:
    """Checks each training forward's sequence length and positions (see the module
    docstring); ``report`` receives the facts of a finding, for the position detector."""

    def __init__(
        self,
        model: nn.Module,
        declared: int | None,
        report: Callable[[dict[str, Any]], None],
        guard: Callable[..., Any],
    ) -> None:
        self.info = position_limit(model, declared)
        impl = getattr(_config(model), "_attn_implementation", None)
        self._flash = isinstance(impl, str) and "flash" in impl
        self.report = report
        self.guard = guard
        self._handles: list[Any] = []
        #: A sequence longer than the limit, without position ids, that a hooked position
        #: module is to judge in this forward.
        self._pending: int | None = None
        #: This forward's positions were judged.
        self._settled = False
        self._judged: set[tuple[str, int]] = set()
        if self.info is None:
            return
        sites = position_tables(model) if self.info.kind == "learned" else _rotary_modules(model)
        for name, mod in sites:
            hook = partial(self._pre_hook, name)
            self._handles.append(mod.register_forward_pre_hook(hook, with_kwargs=True))

    @property
    def limit(self) -> int | None:
        return self.info.limit if self.info is not None else None

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # ---- the model's inputs --------------------------------------------------------
    def on_inputs(self, slot: Any, view: BatchView) -> None:
        """The model's forward is about to run on ``view``."""
        self._settled, self._pending = False, None
        info, seq = self.info, view.seq_len
        if info is None or not seq:
            return
        pos = view.position_ids
        if pos is not None:
            if pos.device.type != "cpu" and seq <= info.limit:
                # Short sequences: the largest id is read with the step's other values.
                slot.add_i("position_max", pos.max())
                slot.extra.update(position_limit=info.limit, position_kind=info.kind)
                return
            self._settled = True
            self._judge(seq, pos, _BY_SCRIPT, info.limit)
            return
        if seq <= info.limit:
            return
        if self._handles:
            self._pending = seq  # the position module will see the ids the model makes
            return
        self._settled = True
        self._emit(seq, seq - 1, "with the default positions 0…T-1", info.limit)

    def after_forward(self) -> None:
        """The forward ended without a position module judging its long sequence."""
        seq, self._pending = self._pending, None
        if seq is not None and self.info is not None and not self._settled:
            self._settled = True
            self._emit(seq, seq - 1, "with the default positions 0…T-1", self.info.limit)

    # ---- inside the model ----------------------------------------------------------
    def _pre_hook(self, name: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self._settled or not (module.training and torch.is_grad_enabled()):
            return
        self.guard("positions", self._at_module, name, module, args, kwargs)

    def _at_module(self, name: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        info = self.info
        if info is None:
            return
        limit = info.limit
        if isinstance(module, nn.Embedding):
            pos = args[0] if args else kwargs.get("input")
            limit = min(limit, module.num_embeddings)
        else:
            pos = kwargs.get("position_ids")
            if pos is None and len(args) > 1:
                pos = args[1]
        if not (isinstance(pos, torch.Tensor) and pos.dtype in _INT and pos.dim() >= 1):
            return
        seq = pos.shape[-1]
        if seq <= limit:
            return
        self._settled, self._pending = True, None
        self._judge(seq, pos, f"inside the model at {name}", limit)

    # ---- judgement -----------------------------------------------------------------
    def _judge(self, seq: int, pos: torch.Tensor, site: str, limit: int) -> None:
        if seq <= limit:  # only host ids get here: an id past the table with a short sequence
            top = int(pos.max())
            if top >= limit:
                self._emit(seq, top, site, limit)
            return
        if (site, seq) in self._judged:
            return
        self._judged.add((site, seq))
        rows = pos.detach().reshape(-1, seq).to("cpu", torch.int64)  # one copy per new length
        top = int(rows.max())
        if top >= limit:
            self._emit(seq, top, site, limit)
            return
        reuse = _reuse(rows, top, limit)
        if reuse == "wrapped" and self._flash:
            return  # HF's flash-attention reads restarting ids as packed documents
        if reuse is not None:
            self._emit(seq, top, site, limit, reuse)

    def _emit(self, seq: int, top: int, site: str, limit: int, reuse: str | None = None) -> None:
        info = self.info
        assert info is not None
        facts: dict[str, Any] = {
            "max_position": top,
            "position_limit": limit,
            "position_kind": info.kind,
            "position_seq_len": seq,
            "position_source": info.source,
            "position_site": site,
        }
        if info.factor is not None:
            facts.update(position_rope_factor=info.factor, position_trained=info.trained)
        if reuse is not None:
            facts["position_reuse"] = reuse
        self.report(facts)
