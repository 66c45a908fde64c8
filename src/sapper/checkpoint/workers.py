"""``--jobs N``: the shards of a sharded safetensors checkpoint reduced by worker processes.

Each worker opens one shard at a time and returns its tensors' statistics (plain
dataclasses); the parent merges them in shard order (the first shard naming a tensor wins,
as in the sequential reader) and runs every check on the merged list, so the findings are
the same as with one process. Workers are spawned, not forked: a forked torch process
inherits the parent's thread pools and locks. Memory per worker is that of the
sequential reader (about one piece resident).
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from sapper.checkpoint.tensorstats import TensorStats
from sapper.errors import InputError

__all__ = ["shard_stats"]


def _one_shard(path: str, threads: int) -> tuple[list[TensorStats], dict[str, Any] | None]:
    """A worker's job: the statistics of one shard, or the fields of its InputError (an
    exception with keyword fields does not survive pickling as itself)."""
    import torch

    from sapper.checkpoint.source import SafetensorsSource

    torch.set_num_threads(threads)
    try:
        source = SafetensorsSource([Path(path)])
        try:
            return [source.stats(k) for k in source.keys()], None
        finally:
            source.close()
    except InputError as exc:
        fields = {k: getattr(exc, k) for k in ("file", "field", "expected")}
        return [], {"problem": exc.problem, "value": repr(exc.value), **fields}


def shard_stats(paths: list[Path], jobs: int, threads: int = 1) -> list[TensorStats]:
    """Every tensor's statistics over ``paths``, ``jobs`` shards at a time."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        results = list(pool.map(_one_shard, map(str, paths), [threads] * len(paths)))
    merged: dict[str, TensorStats] = {}
    for stats, error in results:
        if error is not None:
            raise InputError(error.pop("problem"), has_value=False, **error)
        for s in stats:
            merged.setdefault(s.key, s)
    return list(merged.values())
