"""The per-rank table: what one exchange gathered, as the detectors and the run log see it.

Every rank packs the same columns into one float64 vector (unknown values are flagged in
a presence mask, so a NaN loss stays a NaN loss); the gathered ``(world, n)`` tensor
becomes a :class:`RankTable`, which rides on the main run log's step record as
``extra["dist"]``. The cross-rank detectors read only that, so they run the same live (on
rank 0) and offline (from a run log).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import torch

from sapper.distributed.stats import JobStats, stats_from_rows

__all__ = [
    "COLUMNS",
    "DIST_KEY",
    "EVIDENCE_COLUMNS",
    "RankTable",
    "SparseColumn",
    "pack_row",
]

#: Key of the table in ``StepRecord.extra``.
DIST_KEY = "dist"

#: Scalar columns, in vector order; units in the names.
COLUMNS: tuple[str, ...] = (
    "step",
    "steps",  # optimizer steps this rank observed in the window
    "loss",
    "grad_norm",
    "step_time_s",
    "data_time_s",
    "forward_time_s",
    "memory_peak_gib",
    "memory_reserved_gib",
    "tokens",
    "samples",
    "tokens_per_s",
    "samples_per_s",
    "nonfinite_loss_step",  # first step in the window with a non-finite loss
    "nonfinite_grad_step",  # ... with a non-finite gradient norm
    "nonfinite_steps",  # steps in the window with either
    "checksum",  # parameter fingerprint (fp64)
    "samples_hashed",
    "time",  # wall clock when the rank entered the exchange (Unix seconds)
)

#: X001's per-rank evidence, measured before the gradient all-reduce mixes the ranks
#: (sapper.distributed.evidence); appended so the columns above keep their places.
EVIDENCE_COLUMNS: tuple[str, ...] = (
    "loss_peak",  # largest finite |loss| in the window
    "output_absmax",  # largest |model output| of the window's forwards, until non-finite
    "output_nonfinite_step",  # first step the output was non-finite (-1: never)
    "local_grad_norm",  # largest local gradient norm before the all-reduce (DDP), ditto
    "local_grad_nonfinite_step",  # first step that local norm was non-finite (-1: never)
    "loss_peak_step",  # the step of loss_peak (X010)
    "local_grad_peak_step",  # the step of local_grad_norm (X010)
)
COLUMNS = COLUMNS + EVIDENCE_COLUMNS
_MASK = len(COLUMNS)  # presence bits, then the sketch


def pack_row(values: dict[str, Any], sketch: torch.Tensor) -> torch.Tensor:
    """One rank's vector: the columns (device scalars are copied to the host in one go —
    the exchange's only sync point), the presence mask, the sample sketch."""
    present = 0
    device_vals: list[torch.Tensor] = []
    device_pos: list[int] = []
    host = [0.0] * len(COLUMNS)
    for i, name in enumerate(COLUMNS):
        v = values.get(name)
        if v is None:
            continue
        present |= 1 << i
        if isinstance(v, torch.Tensor):
            device_vals.append(v.detach().reshape(()).to(torch.float64))
            device_pos.append(i)
        else:
            host[i] = float(v)
    sketch = sketch.detach().to(torch.float64).reshape(-1)
    if device_vals:
        dev = device_vals[0].device
        # note: this is a device-to-host sync point (once per exchange, every N steps)
        moved = torch.cat([torch.stack([t.to(dev) for t in device_vals]), sketch.to(dev)])
        moved = moved.cpu()
        for pos, val in zip(device_pos, moved[: len(device_pos)].tolist(), strict=True):
            host[pos] = val
        sketch = moved[len(device_pos) :]
    head = torch.tensor([*host, float(present)], dtype=torch.float64)
    return torch.cat([head, sketch.cpu()])


class SparseColumn(Sequence[float | None]):
    """A world-long column that holds values only for some ranks (the reduced exchange
    fetches the rows of the ranks the statistics name): None elsewhere, O(named) memory."""

    def __init__(self, world: int, values: dict[int, float | None]) -> None:
        self.world = world
        self.values = values

    def __len__(self) -> int:
        return self.world

    @overload
    def __getitem__(self, r: int) -> float | None: ...
    @overload
    def __getitem__(self, r: slice) -> list[float | None]: ...
    def __getitem__(self, r: int | slice) -> float | list[float | None] | None:
        if isinstance(r, slice):
            return [self.values.get(i) for i in range(*r.indices(self.world))]
        if r < 0:
            r += self.world
        if not 0 <= r < self.world:
            raise IndexError(r)
        return self.values.get(r)

    def __iter__(self) -> Iterator[float | None]:
        return (self.values.get(i) for i in range(self.world))

    def items(self) -> list[tuple[int, float | None]]:
        return sorted(self.values.items())


@dataclass
class RankTable:
    """Per-rank columns of one exchange (None where a rank did not know the value), and
    the job's statistics over them (:class:`JobStats`). Under the reduced exchange the
    columns are :class:`SparseColumn` s holding the named ranks only; :attr:`stats`
    always covers every rank."""

    step: int
    columns: dict[str, Sequence[float | None]]
    sketches: list[list[float]] = field(default_factory=list)
    #: Ranks that must see different samples / hold identical parameters.
    data_groups: list[list[int]] = field(default_factory=list)
    param_groups: list[list[int]] = field(default_factory=list)
    layout_source: str = ""
    #: The previous exchange's step (None for the first): the window is (prev, step].
    prev_step: int | None = None
    stats: JobStats | None = None
    #: Per-rank detail fetched after the exchange for the ranks a detector will name
    #: (``replica_params``: rank -> the parameters that differ from its replicas).
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return len(self.columns["step"])

    @property
    def sparse(self) -> bool:
        return isinstance(self.columns.get("step"), SparseColumn)

    def col(self, name: str) -> Sequence[float | None]:
        return self.columns.get(name) or [None] * self.world_size

    def known(self, name: str) -> list[tuple[int, float]]:
        """(rank, value) for the ranks whose value this table holds."""
        c = self.columns.get(name)
        if isinstance(c, SparseColumn):
            return [(r, v) for r, v in c.items() if v is not None]
        return [(r, v) for r, v in enumerate(c or []) if v is not None]

    def job(self) -> JobStats:
        """The job's statistics (computed from the rows of a full table when absent)."""
        if self.stats is None:
            group_of = [-1] * self.world_size
            for g, ranks in enumerate(self.param_groups):
                for r in ranks:
                    if r < self.world_size:
                        group_of[r] = g
            self.stats = stats_from_rows(
                self.columns, self.world_size, group_of, len(self.param_groups)
            )
        return self.stats

    @classmethod
    def from_rows(
        cls,
        rows: dict[int, list[float]],
        world: int,
        stats: JobStats,
        **kw: Any,
    ) -> RankTable:
        """The reduced exchange's table: packed rows (columns + mask) of named ranks."""
        cols: dict[str, dict[int, float | None]] = {name: {} for name in COLUMNS}
        for r, row in rows.items():
            mask = int(row[_MASK])
            for i, name in enumerate(COLUMNS):
                cols[name][r] = row[i] if mask >> i & 1 else None
        step = stats.col("step")
        return cls(
            step=int(step.max) if step.finite else -1,
            columns={k: SparseColumn(world, v) for k, v in cols.items()},
            stats=stats,
            **kw,
        )

    @classmethod
    def from_tensor(
        cls,
        table: torch.Tensor,
        *,
        data_groups: list[list[int]],
        param_groups: list[list[int]],
        layout_source: str = "",
        prev_step: int | None = None,
        stats: JobStats | None = None,
    ) -> RankTable:
        rows = table.tolist()
        cols: dict[str, list[float | None]] = {name: [] for name in COLUMNS}
        sketches = []
        for row in rows:
            mask = int(row[_MASK])
            for i, name in enumerate(COLUMNS):
                cols[name].append(row[i] if mask >> i & 1 else None)
            sketches.append(row[_MASK + 1 :])
        steps = [int(s) for s in cols["step"] if s is not None]
        return cls(
            step=max(steps) if steps else -1,
            columns=cols,
            sketches=sketches,
            data_groups=data_groups,
            param_groups=param_groups,
            layout_source=layout_source,
            prev_step=prev_step,
            stats=stats,
        )

    # ---- run-log form ---------------------------------------------------------------
    def to_extra(self, max_ranks: int = 256) -> dict[str, Any]:
        """JSON-ready; beyond ``max_ranks`` only a summary per column is kept (the
        detectors already ran on the full table)."""
        out: dict[str, Any] = {"step": self.step, "world_size": self.world_size}
        if self.prev_step is not None:
            out["prev_step"] = self.prev_step
        if self.stats is not None:
            out["stats"] = self.stats.to_json()
        if self.sparse:
            named: dict[str, dict[str, float | None]] = {}
            for name, c in self.columns.items():
                assert isinstance(c, SparseColumn)
                for r, v in c.items():
                    if v is not None:
                        named.setdefault(str(r), {})[name] = v
            out["named"] = named
        elif self.world_size <= max_ranks:
            out["ranks"] = {k: v for k, v in self.columns.items() if any(x is not None for x in v)}
            out["sketches"] = [[v for v in s if v >= 0] for s in self.sketches]
        else:
            out["summary"] = {k: _summary(list(v)) for k, v in self.columns.items()}
        if self.world_size <= max_ranks:
            out["data_groups"] = self.data_groups
            out["param_groups"] = self.param_groups
        out["layout"] = self.layout_source
        if self.detail:
            out["detail"] = self.detail
        return out

    @classmethod
    def from_extra(cls, data: dict[str, Any]) -> RankTable | None:
        """The table from a logged record (None when only a summary was logged)."""
        stats = JobStats.from_json(data["stats"]) if isinstance(data.get("stats"), dict) else None
        named = data.get("named")
        if isinstance(named, dict) and stats is not None:
            world = int(data.get("world_size", stats.world_size))
            cols: dict[str, dict[int, float | None]] = {name: {} for name in COLUMNS}
            for r, row in named.items():
                for name, v in row.items():
                    cols.setdefault(name, {})[int(r)] = _num(v)
            return cls(
                step=int(data.get("step", -1)),
                columns={k: SparseColumn(world, v) for k, v in cols.items()},
                data_groups=[list(g) for g in data.get("data_groups") or []],
                param_groups=[list(g) for g in data.get("param_groups") or []],
                layout_source=str(data.get("layout", "")),
                prev_step=data.get("prev_step"),
                stats=stats,
            )
        ranks = data.get("ranks")
        if not isinstance(ranks, dict) or "step" not in ranks:
            return None
        n = len(ranks["step"])
        full: dict[str, Sequence[float | None]] = {}
        for name in COLUMNS:
            vals = ranks.get(name) or [None] * n
            full[name] = [_num(v) for v in vals]
        k = max((len(s) for s in data.get("sketches") or []), default=0)
        sketches = [list(s) + [-1.0] * (k - len(s)) for s in data.get("sketches") or []]
        return cls(
            step=int(data.get("step", -1)),
            columns=full,
            sketches=sketches,
            data_groups=[list(g) for g in data.get("data_groups") or []],
            param_groups=[list(g) for g in data.get("param_groups") or []],
            layout_source=str(data.get("layout", "")),
            prev_step=data.get("prev_step"),
            stats=stats,
            detail=dict(data.get("detail") or {}),
        )


def _num(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, str):
        return float(v)  # "nan" / "inf" from the JSONL writer
    return float(v)


def _summary(values: list[float | None]) -> dict[str, Any]:
    known = [(v, r) for r, v in enumerate(values) if v is not None and not math.isnan(v)]
    if not known:
        return {}
    lo, hi = min(known), max(known)
    vals = sorted(v for v, _ in known)
    return {
        "min": lo[0],
        "min_rank": lo[1],
        "max": hi[0],
        "max_rank": hi[1],
        "median": vals[len(vals) // 2],
    }
