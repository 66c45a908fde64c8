"""The job's view of one exchange as reductions: per-column statistics, not per-rank rows.

An all-gather hands every rank a ``(world, n)`` table: O(world) bytes and Python work per
rank and exchange. What the cross-rank detectors need is smaller: per column the count,
sum, sum of squares, the largest and smallest finite value *and which rank holds them*,
how many ranks hold exactly the extreme, and how many values were non-finite (and where
the first is). All of that is a sum, a max or a min over ranks, so it travels in a few
fixed-size all-reduces (O(log world) latency on a tree, O(1) bytes per rank):

* round A, SUM: per column count, sum, sum of squares, non-finite count; the sample
  buckets (see :class:`SampleBuckets`). MAX (launched with it): per column max and -min;
  per replica group the checksum's max and -min; per bucket the largest and -smallest
  contributing rank.
* round B, MIN: per column the lowest rank holding the max, the min, a non-finite value;
  per replica group the lowest and (as -rank) highest rank holding its max and its min.
* round C, SUM: the full rows of the ranks round B named (at most ``max_named``): every
  rank writes its row into its slot, the others write zeros; and per column how many
  ranks hold exactly the max, the min.

Argmax without precision games: round B compares each rank's own value with the reduced
max (``value == max``, exact in float64, both sides the same bits) and reduces the rank
with MIN, so ties resolve to the lowest rank. The same :func:`stats_from_rows` computes
the statistics from a full table (the all-gather "detail" mode, offline logs), so both
paths give the detectors the same numbers.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "ColumnStats",
    "JobStats",
    "SampleBuckets",
    "absent_below_zero",
    "default_buckets",
    "named_ranks",
    "stats_from_rows",
]

_NONE = -1


def absent_below_zero(name: str) -> bool:
    """Columns whose negative values mean "never" (``nonfinite_*_step`` = -1): they are
    left out of the statistics, so the min and argmin are the earliest real step."""
    return name.startswith("nonfinite_") and name.endswith("_step")


@dataclass
class ColumnStats:
    """One column over the ranks that knew it. ``argmax``/``argmin``: the lowest rank
    holding the extreme (-1: no finite value); ``n_max``/``n_min``: ranks holding it."""

    count: int = 0
    sum: float = 0.0
    sumsq: float = 0.0
    max: float = -math.inf
    min: float = math.inf
    argmax: int = _NONE
    argmin: int = _NONE
    n_max: int = 0
    n_min: int = 0
    nonfinite: int = 0
    first_nonfinite: int = _NONE

    @property
    def finite(self) -> int:
        return self.count - self.nonfinite

    @property
    def mean(self) -> float | None:
        return self.sum / self.finite if self.finite else None

    @property
    def std(self) -> float | None:
        if not self.finite:
            return None
        m = self.sum / self.finite
        return math.sqrt(max(self.sumsq / self.finite - m * m, 0.0))

    def mean_without_max(self) -> float | None:
        """The mean of the other ranks' finite values (the slowest one left out)."""
        if self.finite < 2:
            return None
        return (self.sum - self.max) / (self.finite - 1)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not _empty(v)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ColumnStats:
        out = cls()
        for k, v in data.items():
            if hasattr(out, k):
                setattr(out, k, type(getattr(out, k))(v))
        return out


def _empty(v: Any) -> bool:
    return v in (0, _NONE) or (isinstance(v, float) and math.isinf(v))


@dataclass
class JobStats:
    """The reduced view of one exchange: per-column statistics over the world, the
    replica groups' checksum agreement, the sample buckets."""

    world_size: int
    columns: dict[str, ColumnStats]
    #: Per replica group: (max, min, lowest/highest rank at max, lowest/highest at min).
    groups: list[dict[str, float]] = field(default_factory=list)
    #: Sample buckets summed over ranks (count, sum g, sum g², lowest, highest rank).
    buckets: dict[str, list[float]] = field(default_factory=dict)

    def col(self, name: str) -> ColumnStats:
        return self.columns.get(name) or ColumnStats()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "world_size": self.world_size,
            "columns": {k: v.to_json() for k, v in self.columns.items() if v.count},
        }
        if self.groups:
            out["groups"] = self.groups
        if self.buckets:
            occupied = [i for i, c in enumerate(self.buckets["count"]) if c > 0]
            out["buckets"] = {
                "size": len(self.buckets["count"]),
                "at": occupied,
                **{k: [v[i] for i in occupied] for k, v in self.buckets.items()},
            }
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobStats:
        buckets: dict[str, list[float]] = {}
        raw = data.get("buckets")
        if isinstance(raw, dict):
            size, at = int(raw["size"]), [int(i) for i in raw["at"]]
            for k in SampleBuckets.FIELDS:
                full = [0.0] * size
                for i, v in zip(at, raw.get(k) or [], strict=False):
                    full[i] = float(v)
                buckets[k] = full
        return cls(
            world_size=int(data["world_size"]),
            columns={k: ColumnStats.from_json(v) for k, v in data["columns"].items()},
            groups=[dict(g) for g in data.get("groups") or []],
            buckets=buckets,
        )


# ---- sample buckets (X004 under a reduce) ---------------------------------------------
def default_buckets(world: int) -> int:
    """64 buckets per rank (a power of two, 1,024 to 65,536): at the 1/8 load the stride
    keeps, each rank still contributes about 8 samples a window up to 1,024 ranks and
    half a sample at 16,384 (a job-wide duplication is then seen within two windows).
    65,536 buckets are 2.5 MiB per exchange: a reduce's bandwidth term, not latency."""
    want = 64 * max(world, 1)
    return min(1 << 16, max(1024, 1 << (want - 1).bit_length()))


class SampleBuckets:
    """A fixed-size sum sketch of the window's distinct sample hashes.

    Each kept hash lands in a bucket chosen from its bits and its data group; the bucket
    adds 1, a second hash ``g`` in (0, 1] and ``g²``. Summed over ranks, a bucket whose
    ``count·Σg² == (Σg)²`` holds one sample (or copies of one sample): "pure". A pure
    bucket with count ≥ 2 is the same sample on several ranks of one data group; a
    collision of different samples shows as a spread of ``g`` and is left out. Ranks
    whose windows are large keep only hashes with ``hash % stride == 0`` (``stride`` a
    power of two: the kept sets of two strides nest, so a shared sample is kept on both
    ranks or compared at the coarser stride), holding the load near 1/8 per bucket.
    """

    FIELDS = ("count", "g", "g2", "hi_rank", "lo_rank")

    def __init__(self, size: int = 1024) -> None:
        self.size = int(size)

    def stride(self, samples: int, world: int) -> int:
        load = samples * max(world, 1) / max(self.size / 8, 1)
        return 1 << max(0, math.ceil(math.log2(load))) if load > 1 else 1

    def local(
        self, hashes: torch.Tensor | None, group: int, rank: int, world: int
    ) -> dict[str, torch.Tensor]:
        """This rank's contribution (float64, on the hashes' device). The three sums
        are one ``index_add`` into the rows of one ``(3, size)`` tensor."""
        dev = hashes.device if hashes is not None else torch.device("cpu")
        if hashes is None or hashes.numel() == 0:
            z = torch.zeros(self.size, dtype=torch.float64, device=dev)
            return {
                "count": z,
                "g": z.clone(),
                "g2": z.clone(),
                "hi_rank": torch.full_like(z, -1.0),
                "lo_rank": torch.full_like(z, -math.inf),
            }
        h = torch.unique(hashes.reshape(-1).to(torch.int64))
        stride = self.stride(int(h.numel()), world)
        h = h[(h >> 8) % stride == 0]
        salt = (group * 0x9E3779B1) & ((1 << 31) - 1)
        idx = ((h ^ salt) % self.size).long()
        g = (((h >> 30) & 0xFFFFF) + 1).to(torch.float64) / float(1 << 20)
        sums = torch.zeros((3, self.size), dtype=torch.float64, device=dev).index_add(
            1, idx, torch.stack([torch.ones_like(g), g, g * g])
        )
        occupied = sums[0] > 0
        return {
            "count": sums[0],
            "g": sums[1],
            "g2": sums[2],
            "hi_rank": torch.where(occupied, float(rank), -1.0),
            "lo_rank": torch.where(occupied, -float(rank), -math.inf),
        }

    def summed(
        self, hashes: Sequence[torch.Tensor | None], group_of: Sequence[int]
    ) -> dict[str, list[float]]:
        """What the reduce yields, from every rank's hashes at once (tests, offline)."""
        world = len(hashes)
        parts = [self.local(h, group_of[r], r, world) for r, h in enumerate(hashes)]
        out = {k: torch.stack([p[k] for p in parts]).sum(0) for k in ("count", "g", "g2")}
        out["hi_rank"] = torch.stack([p["hi_rank"] for p in parts]).amax(0)
        out["lo_rank"] = -torch.stack([p["lo_rank"] for p in parts]).amax(0)
        return {k: v.tolist() for k, v in out.items()}

    @classmethod
    def flat(cls, local: dict[str, torch.Tensor]) -> torch.Tensor:
        """A rank's :meth:`local` contribution as one float64 host vector, the fields
        in :attr:`FIELDS` order (to travel in the rank's gathered row)."""
        return torch.cat([local[k].to("cpu", torch.float64) for k in cls.FIELDS])

    @classmethod
    def fold_gathered(cls, rows: torch.Tensor) -> dict[str, list[float]]:
        """What the reduce yields, from every rank's :meth:`flat` vector gathered as
        ``(world, 5 * size)`` rows: the sums and the rank extremes, the same numbers
        (counts and dyadic ``g`` sums are exact in float64 whatever the order)."""
        world = rows.shape[0]
        parts = rows.reshape(world, len(cls.FIELDS), -1)
        sums = parts[:, :3].sum(0).tolist()
        ranks = parts[:, 3:].amax(0)
        return {
            "count": sums[0],
            "g": sums[1],
            "g2": sums[2],
            "hi_rank": ranks[0].tolist(),
            "lo_rank": (-ranks[1]).tolist(),
        }

    @staticmethod
    def pure(buckets: dict[str, list[float]]) -> torch.Tensor:
        """Mask of occupied buckets that hold one sample (on one or several ranks)."""
        return _pure(*_bucket_tensors(buckets))

    @classmethod
    def duplicates(cls, buckets: dict[str, list[float]]) -> tuple[list[int], int]:
        """Indices of pure buckets holding one sample on ≥ 2 ranks, and the number of
        pure buckets (single or shared)."""
        dup, pure = cls.classify(buckets)
        return dup, len(pure)

    @staticmethod
    def shared(buckets: dict[str, list[float]]) -> list[int]:
        """:meth:`duplicates`' indices alone, in Python over the buckets counted twice or
        more (a few dozen of thousands: what X004 asks first at every exchange, and most
        often the whole answer). The purity test is :meth:`pure`'s, the same float64
        operations in the same order."""
        c, s, s2 = buckets["count"], buckets["g"], buckets["g2"]
        out = []
        for i, n in enumerate(c):
            if n >= 2:
                spread = abs(n * s2[i] - s[i] * s[i])
                if spread <= 1e-9 * max(n * s2[i], 1e-30):
                    out.append(i)
        return out

    @staticmethod
    def classify(buckets: dict[str, list[float]]) -> tuple[list[int], list[int]]:
        """Indices of the pure buckets holding one sample on ≥ 2 ranks, and of every
        pure bucket: :meth:`duplicates` and :meth:`pure` from one conversion of the
        summed lists (X004 reads both at every exchange)."""
        c, s, s2 = _bucket_tensors(buckets)
        pure = _pure(c, s, s2)
        dup = torch.nonzero(pure & (c >= 2)).reshape(-1).tolist()
        return dup, torch.nonzero(pure).reshape(-1).tolist()


def _bucket_tensors(buckets: dict[str, list[float]]) -> tuple[torch.Tensor, ...]:
    """Summed count, Σg and Σg² as float64 tensors: one conversion for the three, through
    a float array (a third of ``torch.tensor``'s time on a list of thousands of floats)."""
    c, s, s2 = buckets["count"], buckets["g"], buckets["g2"]
    if not c:
        empty = torch.zeros(0, dtype=torch.float64)
        return empty, empty, empty
    both = torch.frombuffer(array("d", [*c, *s, *s2]), dtype=torch.float64).view(3, len(c))
    return both[0], both[1], both[2]


def _pure(c: torch.Tensor, s: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
    spread = (c * s2 - s * s).abs()
    return (c >= 1) & (spread <= 1e-9 * (c * s2).clamp(min=1e-30))


# ---- from a full table (detail mode, offline) -----------------------------------------
def stats_from_rows(
    columns: dict[str, Sequence[float | None]],
    world: int,
    group_of: Sequence[int] | None = None,
    n_groups: int = 0,
    buckets: dict[str, list[float]] | None = None,
) -> JobStats:
    """The same statistics the reduce computes, from per-rank columns."""
    out: dict[str, ColumnStats] = {}
    for name, values in columns.items():
        cs = ColumnStats()
        skip = absent_below_zero(name)
        finite: list[tuple[float, int]] = []
        for r, v in enumerate(values):
            if v is None or (skip and v < 0):
                continue
            cs.count += 1
            if not math.isfinite(v):
                cs.nonfinite += 1
                if cs.first_nonfinite < 0:
                    cs.first_nonfinite = r
                continue
            cs.sum += v
            cs.sumsq += v * v
            finite.append((v, r))
        if finite:
            cs.max = max(v for v, _ in finite)
            cs.min = min(v for v, _ in finite)
            cs.argmax = min(r for v, r in finite if v == cs.max)
            cs.argmin = min(r for v, r in finite if v == cs.min)
            cs.n_max = sum(1 for v, _ in finite if v == cs.max)
            cs.n_min = sum(1 for v, _ in finite if v == cs.min)
        out[name] = cs
    groups: list[dict[str, float]] = []
    if group_of is not None and n_groups:
        sums = columns.get("checksum") or [None] * world
        for g in range(n_groups):
            vals = [(v, r) for r, v in enumerate(sums) if v is not None and group_of[r] == g]
            groups.append(_group_stats(vals))
    return JobStats(world, out, groups, buckets or {})


def _group_stats(vals: list[tuple[float, int]]) -> dict[str, float]:
    """Checksum agreement of one replica group; a NaN counts as larger than any value."""
    if not vals:
        return {}

    def key(v: float) -> float:
        return math.inf if math.isnan(v) else v

    hi = max(key(v) for v, _ in vals)
    lo = min(key(v) for v, _ in vals)
    at_hi = [r for v, r in vals if key(v) == hi]
    at_lo = [r for v, r in vals if key(v) == lo]
    return {
        "max": hi,
        "min": lo,
        "max_lo": min(at_hi),
        "max_hi": max(at_hi),
        "min_lo": min(at_lo),
        "min_hi": max(at_lo),
    }


def named_ranks(stats: JobStats, max_named: int) -> list[int]:
    """The ranks whose rows the detectors may read, in order of need: where a value
    went non-finite first, each column's argmin/argmax, the replica groups' extremes."""
    want: list[int] = []
    order: list[Callable[[ColumnStats], int]] = [
        lambda c: c.first_nonfinite,
        lambda c: c.argmin,
        lambda c: c.argmax,
    ]
    for pick in order:
        for cs in stats.columns.values():
            want.append(pick(cs))
    for g in stats.groups:
        if g and g["max"] != g["min"]:
            want.extend(int(g[k]) for k in ("min_lo", "min_hi", "max_lo", "max_hi"))
    seen: list[int] = []
    for r in want:
        if 0 <= r < stats.world_size and r not in seen:
            seen.append(r)
        if len(seen) >= max_named:
            break
    return sorted(seen)
