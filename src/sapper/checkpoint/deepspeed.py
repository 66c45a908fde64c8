"""A DeepSpeed ZeRO checkpoint folder, read the way DeepSpeed's own ``zero_to_fp32`` reads it.

What DeepSpeed's engine writes (``engine.save_checkpoint``, DeepSpeed 0.9–0.19): a
``latest`` file naming a tag folder (``global_stepN``), which holds

* the model states — ``mp_rank_XX_model_states.pt`` (ZeRO 0–2: the 16-bit ``module``
  weights in full) or ``zero_pp_rank_R_mp_rank_XX_model_states.pt`` (ZeRO 3: one per data
  rank, the ``module`` tensors empty placeholders) — with ``param_shapes`` (per param
  group, name → shape, in the order the optimizer flattened them), ``global_steps``,
  ``skipped_steps``, ``lr_scheduler`` and ``ds_version``;
* one ``*_optim_states.pt`` per data rank (``bf16_`` prefixed under the bf16 optimizer):
  ``optimizer_state_dict`` with ``zero_stage``, ``partition_count``, the ``loss_scaler``
  object, the rank's flat fp32 master partition per group
  (``single_partition_of_fp32_groups``; ZeRO 3: ``fp32_flat_groups``, one per sub-group)
  and the inner optimizer's state over those flat tensors (``base_optimizer_state``; ZeRO
  3: ``optimizer_state_dict``).

Parameter names come back as ``deepspeed/utils/zero_to_fp32.py`` maps them: ZeRO 1/2
by the ``param_slice_mappings`` each rank saves (name → ``fragment_address(numel,
start)`` in its partition), or, from older versions without them, by walking
``param_shapes`` along the ranks' partitions laid end to end; ZeRO 3 by giving every
parameter ``ceil(numel / world)`` elements in each rank's flat vector, the last rank's
piece padded. Moments sit at the same offsets as the master weights. Every piece is a
view of a memory-mapped file: nothing is concatenated until one parameter is read.

Parameters left out of the optimizer (frozen: adapter training's base model) are not in
the partitions. Under ZeRO 0–2 they are in ``module`` like every weight; under ZeRO 3 each
rank's model states keep its ``ceil(numel / world)`` piece of them in
``frozen_param_fragments`` (their shapes in rank 0's ``frozen_param_shapes``), joined in
rank order as ``zero_to_fp32``'s ``_zero3_merge_frozen_params`` joins them.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sapper.checkpoint.layout import (
    DEEPSPEED_MODEL_STATES,
    DEEPSPEED_OPTIM_STATES,
    listing,
    regular_file,
)
from sapper.checkpoint.numbers import MAX_COUNT, checked_int, checked_number, checked_shape
from sapper.checkpoint.pages import streamed
from sapper.checkpoint.source import TensorInfo, TensorSource
from sapper.checkpoint.stats import CHUNK_ELEMENTS
from sapper.checkpoint.torchfile import PickledObject, load_torch_file, mapped
from sapper.errors import InputError

__all__ = ["DeepSpeedCheckpoint", "FragmentSource", "LazyMoments", "read_deepspeed"]

#: A piece of one parameter: (flat tensor, start, numel) in one rank's partition.
Piece = tuple[torch.Tensor, int, int]


class FragmentSource(TensorSource):
    """Named tensors assembled from their pieces in the ranks' flat partitions; with
    ``mapped`` (the files were memory-mapped) each piece's pages are given back once read,
    as :class:`~sapper.checkpoint.source.TorchSource` does."""

    def __init__(self, pieces: dict[str, list[Piece]], shapes: dict[str, tuple[int, ...]],
                 file: str, mapped: bool = False) -> None:  # fmt: skip
        self._pieces = pieces
        self._shapes = shapes
        self._file = file
        self.mapped = mapped

    def keys(self) -> list[str]:
        return list(self._pieces)

    def info(self, key: str) -> TensorInfo:
        dtype = self._pieces[key][0][0].dtype if self._pieces[key] else torch.float32
        return TensorInfo(str(dtype).removeprefix("torch."), self._shapes[key], self._file)

    def chunks(self, key: str) -> Iterator[torch.Tensor]:
        for flat, start, numel in self._pieces[key]:
            yield from streamed(flat.narrow(0, start, numel), CHUNK_ELEMENTS, self.mapped)

    def pieces(self, key: str) -> list[Piece]:
        """Where one parameter lies: (flat tensor, start, numel) per rank, in order."""
        return list(self._pieces[key])

    def prefixed(self, prefix: str) -> FragmentSource:
        """The same tensors, each name with ``prefix`` in front."""
        return FragmentSource({prefix + k: v for k, v in self._pieces.items()},
                              {prefix + k: v for k, v in self._shapes.items()},
                              self._file, self.mapped)  # fmt: skip

    def joined(self, other: FragmentSource) -> FragmentSource:
        """Both sources' tensors in one (``other``'s first), its files named too."""
        return FragmentSource.union([other, self])

    @staticmethod
    def union(sources: list[FragmentSource]) -> FragmentSource:
        """The sources' tensors in one, in their order (a later name replaces an earlier
        one), every file named: one pass, whatever the number of sources."""
        pieces: dict[str, list[Piece]] = {}
        shapes: dict[str, tuple[int, ...]] = {}
        for source in sources:
            pieces.update(source._pieces)
            shapes.update(source._shapes)
        files = ", ".join(s._file for s in sources if s._file)
        return FragmentSource(pieces, shapes, files, all(s.mapped for s in sources))

    def tensor(self, key: str) -> torch.Tensor:
        """One parameter whole, in its shape (a view when it lies in one partition)."""
        parts = [flat.narrow(0, start, numel) for flat, start, numel in self._pieces[key]]
        joined = parts[0] if len(parts) == 1 else torch.cat(parts)
        return joined.view(self._shapes[key])


class LazyMoments(dict):  # type: ignore[type-arg]
    """One parameter's Adam state whose moments are joined from their ZeRO pieces only
    when read, so a scan over all parameters holds one parameter's moments at a time."""

    def __init__(self, step: Any, moments: dict[str, FragmentSource], name: str) -> None:
        super().__init__({"step": step, **dict.fromkeys(moments)})
        self._moments = moments
        self._name = name

    def __getitem__(self, key: str) -> Any:
        if key in self._moments:
            return self._moments[key].tensor(self._name)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default


@dataclass
class DeepSpeedCheckpoint:
    folder: Path
    zero_stage: int
    world: int
    #: The 16-bit weights of the model states (ZeRO 0–2); empty under ZeRO 3.
    module: dict[str, torch.Tensor]
    module_file: str
    #: The model states file was memory-mapped (a zip-format torch file).
    module_mapped: bool
    masters: FragmentSource
    #: ``exp_avg``/``exp_avg_sq`` by name (empty for an optimizer without them).
    moments: dict[str, FragmentSource]
    step: Any
    param_groups: list[dict[str, Any]]
    groups_of: dict[str, int]
    optim_file: str
    loss_scaler: dict[str, Any] | None
    engine: dict[str, Any] = field(default_factory=dict)
    lr_scheduler: dict[str, Any] | None = None
    #: ``lr_scheduler`` saved as None: save_checkpoint's value when the engine has none.
    no_lr_scheduler: bool = False
    #: ZeRO 3's frozen parameters, joined from every rank's model states (empty otherwise).
    frozen: FragmentSource | None = None


def _natural(path: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def _bad(file: Path | str, why: str, field_path: str = "") -> InputError:
    return InputError(
        f"not a DeepSpeed checkpoint sapper can read: {why}",
        file=str(file),
        field=field_path or None,
        expected="the layout DeepSpeed's engine.save_checkpoint writes",
    )


def _tensor_list(value: Any, file: Path, where: str) -> list[torch.Tensor]:
    items = value if isinstance(value, (list, tuple)) else [value]
    if not items or not all(
        isinstance(t, torch.Tensor) and t.dim() == 1 and t.is_floating_point() for t in items
    ):
        raise _bad(file, "expected a list of flat floating-point tensors", where)
    return [t.detach() for t in items]


def _shapes(value: Any, file: Path, key: str = "param_shapes") -> list[dict[str, tuple[int, ...]]]:
    """Per param group, name -> shape; each size an integer in 0 … 2^48-1 (InputError
    naming the parameter and the size otherwise, as a safetensors header's are checked)."""
    groups = value if isinstance(value, (list, tuple)) else [value]
    out: list[dict[str, tuple[int, ...]]] = []
    for g, group in enumerate(groups):
        if not isinstance(group, dict):
            raise _bad(file, f"{key} is not a list of name -> shape maps", f"{key}.{g}")
        shapes: dict[str, tuple[int, ...]] = {}
        for name, shape in group.items():
            shapes[str(name)] = checked_shape(shape, file=str(file), field=f"{key}.{name}")
        out.append(shapes)
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` in integers (no float: ``a`` may exceed the float range's precision)."""
    return -(-a // b)


class _Segments:
    """Flat tensors laid end to end, with their start offsets, so the pieces of a range
    are found by bisection rather than by a walk over every segment."""

    def __init__(self, segments: list[torch.Tensor]) -> None:
        self.segments = segments
        self.starts = [0, *itertools.accumulate(t.numel() for t in segments)]

    def cut(self, start: int, numel: int, file: Path, name: str) -> list[Piece]:
        """The pieces of ``[start, start + numel)``."""
        pieces: list[Piece] = []
        end = start + numel
        if numel and end > self.starts[-1]:
            raise _bad(file, f"{name} lies past the end of its flat partition", name)
        i = max(bisect.bisect_right(self.starts, start) - 1, 0)
        while i < len(self.segments) and self.starts[i] < end:
            base = self.starts[i]
            lo, hi = max(start, base), min(end, self.starts[i + 1])
            if lo < hi:
                pieces.append((self.segments[i], lo - base, hi - lo))
            i += 1
        return pieces


def _cut(
    segments: list[torch.Tensor], start: int, numel: int, file: Path, name: str
) -> list[Piece]:
    """The pieces of ``[start, start + numel)`` in the segments laid end to end."""
    return _Segments(segments).cut(start, numel, file, name)


def _slice_mappings(sd: dict[str, Any], flats: list[list[torch.Tensor]], rank: int,
                    file: Path, pieces: dict[str, list[Piece]]) -> bool:  # fmt: skip
    """Add one rank's pieces from its ``param_slice_mappings``; False where it has none."""
    mappings = sd.get("param_slice_mappings")
    if not isinstance(mappings, (list, tuple)) or len(mappings) != len(flats[rank]):
        return False
    for g, mapping in enumerate(mappings):
        if not isinstance(mapping, dict):
            return False
        segment = _Segments([flats[rank][g]])
        for name, addr in mapping.items():
            fields = addr.to_dict() if isinstance(addr, PickledObject) else addr
            if not isinstance(fields, dict):
                raise _bad(
                    file, "a fragment address is not (numel, start)", f"param_slice_mappings.{name}"
                )
            where = f"param_slice_mappings.{g}.{name}"
            start = checked_int(
                fields.get("start"), file=str(file), field=f"{where}.start", low=0, high=MAX_COUNT
            )
            numel = checked_int(
                fields.get("numel"), file=str(file), field=f"{where}.numel", low=1, high=MAX_COUNT
            )
            pieces.setdefault(str(name), []).extend(segment.cut(start, numel, file, str(name)))
    return True


def _zero2_walk(shapes: list[dict[str, tuple[int, ...]]], flats: list[list[torch.Tensor]],
                file: Path) -> dict[str, list[Piece]]:  # fmt: skip
    """zero_to_fp32's ZeRO 1/2 protocol: a group's parameters follow one another along the
    ranks' partitions of that group, concatenated in rank order."""
    pieces: dict[str, list[Piece]] = {}
    for g, group in enumerate(shapes):
        segments = _Segments([rank_flats[g] for rank_flats in flats if g < len(rank_flats)])
        offset = 0
        for name, shape in group.items():
            pieces[name] = segments.cut(offset, _numel(shape), file, name)
            offset += _numel(shape)
    return pieces


def _zero3_walk(shapes: list[dict[str, tuple[int, ...]]], flats: list[list[torch.Tensor]],
                file: Path) -> dict[str, list[Piece]]:  # fmt: skip
    """zero_to_fp32's ZeRO 3 protocol: every parameter has ``ceil(numel / world)`` elements
    at the same offset of each rank's flat vector (its sub-groups end to end)."""
    world = len(flats)
    ranks = [_Segments(rank_flats) for rank_flats in flats]
    pieces: dict[str, list[Piece]] = {}
    offset = 0
    for group in shapes:
        for name, shape in group.items():
            numel = _numel(shape)
            part = _ceil_div(numel, world)
            got: list[Piece] = []
            left = numel
            for segments in ranks:
                take = min(part, left)
                if not take:
                    break
                got += segments.cut(offset, take, file, name)
                left -= take
            pieces[name] = got
            offset += part
    return pieces


def _zero3_frozen(model_files: list[Path], first: dict[str, Any]) -> FragmentSource | None:
    """ZeRO 3's frozen parameters: rank 0's ``frozen_param_shapes``, each rank's
    ``ceil(numel / world)`` piece from its ``frozen_param_fragments`` (the last padded)."""
    key = "frozen_param_shapes"
    shapes = _shapes(first.get(key) or {}, model_files[0], key)[0]
    if not shapes:
        return None
    ranks = [first] + [load_torch_file(p) for p in model_files[1:]]
    world = len(ranks)
    pieces: dict[str, list[Piece]] = {}
    for name, shape in shapes.items():
        numel = _numel(shape)
        part, left = _ceil_div(numel, world), numel
        got: list[Piece] = []
        for rank, path in zip(ranks, model_files, strict=True):
            frags = rank.get("frozen_param_fragments") if isinstance(rank, dict) else None
            frag = frags.get(name) if isinstance(frags, dict) else None
            where = f"frozen_param_fragments.{name}"
            if not (isinstance(frag, torch.Tensor) and frag.is_floating_point()):
                raise _bad(path, "a frozen parameter's fragment is missing", where)
            take = min(part, left)
            if take:
                got += _cut([frag.detach().reshape(-1)], 0, take, path, name)
            left -= take
        pieces[name] = got
    files = ", ".join(str(p) for p in model_files)
    return FragmentSource(pieces, shapes, files, all(mapped(p) for p in model_files))


def _moment_segments(state: Any, key: str, count: int) -> list[torch.Tensor] | None:
    """A rank's ``key`` moment per flat group, from a torch state dict (``state`` by
    index) or DeepSpeed's older list of per-group states."""
    entries = state.get("state") if isinstance(state, dict) else state
    if isinstance(entries, dict):
        entries = [entries.get(i) for i in sorted(k for k in entries if isinstance(k, int))]
    if not isinstance(entries, (list, tuple)) or len(entries) != count:
        return None
    out = []
    for entry in entries:
        t = entry.get(key) if isinstance(entry, dict) else None
        if not isinstance(t, torch.Tensor) or t.dim() != 1:
            return None
        out.append(t.detach())
    return out


def _first_step(state: Any) -> Any:
    entries = state.get("state") if isinstance(state, dict) else state
    values = list(entries.values()) if isinstance(entries, dict) else entries
    for entry in values if isinstance(values, (list, tuple)) else []:
        if isinstance(entry, dict) and "step" in entry:
            return entry["step"]
    return None


def _remap(pieces: dict[str, list[Piece]], flats: list[list[torch.Tensor]],
           moments: list[list[torch.Tensor]]) -> dict[str, list[Piece]]:  # fmt: skip
    """The same pieces, in the moment tensors at the masters' positions."""
    where = {id(t): (r, g) for r, rank in enumerate(flats) for g, t in enumerate(rank)}
    return {
        name: [(moments[where[id(t)][0]][where[id(t)][1]], s, n) for t, s, n in plist]
        for name, plist in pieces.items()
    }


def read_deepspeed(folder: Path) -> DeepSpeedCheckpoint:
    """The tag folder's model states and ZeRO partitions, parameters named; InputError
    naming the file for anything DeepSpeed's layout does not explain. With several
    model-parallel ranks (``mp_rank_00``, ``mp_rank_01``: Megatron-DeepSpeed's tensor
    slices, under the same names) each is read as one model and its names are kept apart
    as ``mp_rank_XX/<name>``, as Megatron saves are."""
    files = sorted(listing(folder).values(), key=_natural)
    model_of: dict[str, list[Path]] = {}
    optim_of: dict[str, list[Path]] = {}
    for path in files:  # one pass: each model-parallel rank's files, in natural order
        if m := DEEPSPEED_MODEL_STATES.match(path.name):
            model_of.setdefault(m.group(2), []).append(path)
        elif m := DEEPSPEED_OPTIM_STATES.match(path.name):
            optim_of.setdefault(m.group(2), []).append(path)
    if not model_of:
        raise _bad(folder, "no *model_states.pt in the folder")
    ranks = sorted(model_of, key=int)
    parts = [_read_mp_rank(folder, model_of[rank], optim_of.get(rank, [])) for rank in ranks]
    return parts[0] if len(parts) == 1 else _merged(parts, ranks)


def _merged(parts: list[DeepSpeedCheckpoint], ranks: list[str]) -> DeepSpeedCheckpoint:
    """The model-parallel ranks' checkpoints as one, each name prefixed by its rank."""
    prefixes = [f"mp_rank_{rank}/" for rank in ranks]
    ranked = list(zip(parts, prefixes, strict=True))
    first = parts[0]

    def join(sources: list[FragmentSource | None]) -> FragmentSource | None:
        present = [s.prefixed(pre) for s, pre in zip(sources, prefixes, strict=True) if s]
        return FragmentSource.union(present) if present else None

    moments = {
        key: join([p.moments[key] for p in parts])
        for key in first.moments
        if all(key in p.moments for p in parts)
    }
    return dataclasses.replace(
        first,
        module={pre + k: v for p, pre in ranked for k, v in p.module.items()},
        module_file=", ".join(p.module_file for p in parts),
        module_mapped=all(p.module_mapped for p in parts),
        masters=join([p.masters for p in parts]) or first.masters,
        moments={k: v for k, v in moments.items() if v is not None},
        groups_of={pre + k: g for p, pre in ranked for k, g in p.groups_of.items()},
        optim_file=", ".join(p.optim_file for p in parts if p.optim_file),
        engine={**first.engine, "model_parallel": len(parts)},
        frozen=join([p.frozen for p in parts]),
    )  # fmt: skip


def _read_mp_rank(folder: Path, model_paths: list[Path],
                  optim_paths: list[Path]) -> DeepSpeedCheckpoint:  # fmt: skip
    """One model-parallel rank: its data ranks' partitions are one model's."""
    model_files = [regular_file(p) for p in model_paths]
    optim_files = [regular_file(p) for p in optim_paths]
    model = load_torch_file(model_files[0])
    if not isinstance(model, dict):
        raise _bad(model_files[0], "model states are not a dict")
    module = model.get("module")
    weights = {
        str(k): v.detach()
        for k, v in (module.items() if isinstance(module, dict) else [])
        if isinstance(v, torch.Tensor) and v.numel() > 0
    }
    engine = {
        k: model.get(k)
        for k in ("global_steps", "skipped_steps", "global_samples", "dp_world_size", "ds_version")
        if isinstance(model.get(k), (int, str)) and not isinstance(model.get(k), bool)
    }
    for key, value in engine.items():  # the engine's counters: 64-bit counts
        if key != "ds_version":
            checked_number(value, file=str(model_files[0]), field=key, low=0, high=MAX_COUNT,
                           integer=True)  # fmt: skip
    sched = model.get("lr_scheduler")
    shapes = _shapes(model.get("param_shapes", []), model_files[0])
    empty = FragmentSource({}, {}, str(folder))
    ckpt = DeepSpeedCheckpoint(
        folder, 0, len(optim_files), weights, str(model_files[0]), mapped(model_files[0]),
        empty, {}, None, [], {},
        str(optim_files[0]) if optim_files else "", None, engine,
        sched if isinstance(sched, dict) else None,
        no_lr_scheduler="lr_scheduler" in model and sched is None,
    )  # fmt: skip
    if not optim_files:
        return ckpt
    states = []
    for path in optim_files:
        obj = load_torch_file(path)
        sd = obj.get("optimizer_state_dict") if isinstance(obj, dict) else None
        if not isinstance(sd, dict):
            raise _bad(path, "no optimizer_state_dict", "optimizer_state_dict")
        states.append(sd)
    stage = states[0].get("zero_stage")
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in (1, 2, 3):
        raise _bad(optim_files[0], "zero_stage is not 1, 2 or 3", "optimizer_state_dict.zero_stage")
    flat_key, inner_key = (
        ("fp32_flat_groups", "optimizer_state_dict") if stage == 3
        else ("single_partition_of_fp32_groups", "base_optimizer_state")
    )  # fmt: skip
    flats = [
        _tensor_list(sd.get(flat_key), path, f"optimizer_state_dict.{flat_key}")
        for sd, path in zip(states, optim_files, strict=True)
    ]
    if stage == 3:
        pieces = _zero3_walk(shapes, flats, optim_files[0])
    else:
        pieces = {}
        if not all(
            _slice_mappings(sd, flats, r, optim_files[r], pieces) for r, sd in enumerate(states)
        ):
            pieces = _zero2_walk(shapes, flats, optim_files[0])
    all_shapes = {n: s for group in shapes for n, s in group.items()}
    missing = [n for n in pieces if n not in all_shapes]
    if missing:
        raise _bad(optim_files[0], "a partition names a parameter param_shapes lacks", missing[0])
    for name, plist in pieces.items():
        if sum(n for _, _, n in plist) != _numel(all_shapes[name]):
            raise _bad(
                optim_files[0],
                f"the fragments of {name} do not add up to its shape {list(all_shapes[name])}",
                f"param_slice_mappings.{name}",
            )
    files = ", ".join(str(p) for p in optim_files)
    in_place = all(mapped(p) for p in optim_files)
    ckpt.zero_stage, ckpt.masters = stage, FragmentSource(pieces, all_shapes, files, in_place)
    if stage == 3:
        ckpt.frozen = _zero3_frozen(model_files, model)
    for key in ("exp_avg", "exp_avg_sq"):
        per_rank = [
            _moment_segments(sd.get(inner_key), key, len(flat))
            for sd, flat in zip(states, flats, strict=True)
        ]
        segs = [m for m in per_rank if m is not None]
        if len(segs) == len(flats):
            moved = _remap(pieces, flats, segs)
            if all(s + n <= t.numel() for plist in moved.values() for t, s, n in plist):
                ckpt.moments[key] = FragmentSource(moved, all_shapes, files, in_place)
    inner = states[0].get(inner_key)
    groups = inner.get("param_groups") if isinstance(inner, dict) else None
    ckpt.param_groups = (
        [dict(g) for g in groups if isinstance(g, dict)] if isinstance(groups, list) else []
    )
    ckpt.step = _first_step(inner)
    checked_number(ckpt.step, file=str(optim_files[0]), low=0, high=MAX_COUNT, integer=True,
                   field=f"optimizer_state_dict.{inner_key}.state.step")  # fmt: skip
    for g, group in enumerate(shapes):
        for name in group:
            ckpt.groups_of[name] = min(g, len(ckpt.param_groups) - 1) if ckpt.param_groups else 0
    scaler = states[0].get("loss_scaler")
    if isinstance(scaler, PickledObject):
        ckpt.loss_scaler = {"type": scaler.qualname, **scaler.to_dict()}
        checked_number(ckpt.loss_scaler.get("cur_scale"), file=str(optim_files[0]),
                       field="optimizer_state_dict.loss_scaler.cur_scale")  # fmt: skip
    return ckpt
