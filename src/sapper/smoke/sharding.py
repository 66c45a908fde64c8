"""S008 over a whole epoch: every sample is read exactly once across the data-parallel ranks.

The few micro-batches the DDP run reads say little about sharding: a sampler built with the
wrong ``num_replicas`` reads disjoint samples and only leaves some unseen, and ranks whose
shuffles differ (a per-rank seed) collide only somewhere later in the epoch. So the data
source is read here, in the parent process, for every rank to its end, and compared with
one process's epoch (``world_size=1``) as a multiset of sample fingerprints:

- read more often across ranks than in one process's epoch: overlap (the same sample twice
  per epoch, its gradient counted twice);
- read less often: missing (never trained on);
- the epoch tail of a correct sampler is allowed: ``DistributedSampler`` repeats up to
  ``world_size - 1`` samples to give every rank as many, and ``drop_last`` drops fewer than
  one micro-batch per rank.

A source that does not end within ``epoch_max_batches`` micro-batches per rank (a stream,
or sapper's synthetic tokens) is compared over that many micro-batches per rank against
the same number of samples of one process's stream. A source whose one-process epoch
differs between two reads (its first micro-batches are read twice: random crops, masking
drawn in the collator) has no stable sample identity; the counts are then reported as
inconclusive.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import islice

from sapper.rules.model import Finding
from sapper.smoke.batches import BatchSource, fingerprints, normalize_batch
from sapper.smoke.context import SmokeContext, verdict
from sapper.smoke.rules import UNSHARDED_SAMPLER

__all__ = ["EpochCoverage", "epoch_coverage", "run_epoch_check"]

#: Micro-batches read a second time to see whether samples keep their identity.
_REREAD_BATCHES = 8


@dataclass
class EpochCoverage:
    """What the ranks read over one epoch (or the first ``cap`` micro-batches of a stream)
    against one process."""

    world_size: int
    complete: bool  # every rank's iterator ended within the cap
    batches_per_rank: list[int] = field(default_factory=list)
    samples_per_rank: list[int] = field(default_factory=list)
    single_samples: int = 0
    overlap: int = 0  # reads beyond one process's count of that sample
    missing: int = 0  # samples one process reads that no rank read
    foreign: int = 0  # samples read by a rank that one process never reads
    read_by_several_ranks: int = 0  # distinct samples that more than one rank read
    reproducible: bool = True
    micro_batch: int = 0
    #: ``len(loader.dataset)`` when the loader exposes it: one process's epoch is then
    #: checked against it too (a sampler wrong for every world size reads part of it).
    dataset_size: int | None = None

    @property
    def single_short(self) -> int:
        """Samples of the dataset one process's epoch leaves out."""
        if not self.complete or self.dataset_size is None:
            return 0
        return max(0, self.dataset_size - self.single_samples)

    @property
    def samples(self) -> int:
        return sum(self.samples_per_rank)

    @property
    def tail_overlap(self) -> int:
        """Repeats a correct ``DistributedSampler`` adds to even out the ranks."""
        return self.world_size - 1 if self.complete else 0

    @property
    def tail_missing(self) -> int:
        """Samples ``drop_last`` may drop: fewer than one micro-batch per rank."""
        return self.world_size * max(0, self.micro_batch - 1) if self.complete else 0


def _read(source: BatchSource, rank: int, world: int, cap: int) -> tuple[list[str], int, bool]:
    """Fingerprints of up to ``cap`` micro-batches of a rank, their count, and whether the
    iterator ended on its own."""
    fps: list[str] = []
    n = 0
    for item in islice(source.batches(rank, world), cap + 1):
        if n == cap:
            return fps, n, False
        fps.extend(fingerprints(normalize_batch(item)))
        n += 1
    return fps, n, True


def epoch_coverage(
    source: BatchSource, world: int, cap: int, dataset_size: int | None = None
) -> EpochCoverage:
    """Read every rank's epoch and one process's, and count overlap and missing samples
    (against ``dataset_size`` too when it is known)."""
    per_rank = [_read(source, r, world, cap) for r in range(world)]
    ranks_fps = [fps for fps, _, _ in per_rank]
    single, _, single_done = _read(source, 0, 1, cap * world + world)
    # sample identity: the first micro-batches of a second read must be the same samples
    again, _, _ = _read(source, 0, 1, _REREAD_BATCHES)
    complete = single_done and all(done for _, _, done in per_rank)
    if not complete:  # a stream: compare against as many of one process's samples
        single = single[: sum(len(f) for f in ranks_fps)]
    cov = EpochCoverage(
        world_size=world,
        complete=complete,
        batches_per_rank=[n for _, n, _ in per_rank],
        samples_per_rank=[len(f) for f in ranks_fps],
        single_samples=len(single),
        reproducible=single[: len(again)] == again[: len(single)],
        dataset_size=dataset_size,
    )
    sizes = [len(f) // n for f, n, _ in per_rank if n]
    cov.micro_batch = max(sizes, default=0)
    expected = Counter(single)
    read = Counter(fp for fps in ranks_fps for fp in fps)
    owners = Counter(fp for fps in ranks_fps for fp in set(fps))
    cov.read_by_several_ranks = sum(1 for c in owners.values() if c > 1)
    for fp, count in read.items():
        want = expected.get(fp, 0)
        if want == 0:
            cov.foreign += count
        elif count > want:
            cov.overlap += count - want
    cov.missing = sum(max(0, want - read.get(fp, 0)) for fp, want in expected.items())
    if cov.single_short:  # the distinct samples the ranks read, against the dataset
        cov.missing = max(cov.missing, dataset_size - (cov.samples - cov.overlap))
        cov.foreign = 0  # one process's epoch is no reference: it is short itself
    return cov


def run_epoch_check(ctx: SmokeContext) -> Finding:
    """S008: the ranks' epochs against one process's."""
    tol = ctx.config.tolerances
    world = ctx.config.dp_world_size
    size = getattr(ctx.source, "dataset_size", None)
    cov = epoch_coverage(
        ctx.source, world, tol.epoch_max_batches, size() if callable(size) else None
    )
    scope = (
        "one epoch"
        if cov.complete
        else f"the first {tol.epoch_max_batches} micro-batches per rank (the source did not "
        "end: a stream)"
    )
    numbers = dict(
        value=(cov.overlap + cov.missing) / cov.single_samples if cov.single_samples else 0.0,
        threshold=0.0,
        world_size=world,
        whole_epoch=cov.complete,
        batches_per_rank=cov.batches_per_rank,
        samples_per_rank=cov.samples_per_rank,
        samples=cov.samples,
        single_process_samples=cov.single_samples,
        overlap=cov.overlap,
        missing=cov.missing,
        foreign=cov.foreign,
        read_by_several_ranks=cov.read_by_several_ranks,
        allowed_tail_overlap=cov.tail_overlap,
        allowed_tail_missing=cov.tail_missing,
        reproducible=cov.reproducible,
        dataset_size=cov.dataset_size,
        single_process_short=cov.single_short,
    )
    counts = (
        f"over {scope}: {world} ranks read {cov.samples} samples "
        f"({'/'.join(map(str, cov.samples_per_rank))}), one process {cov.single_samples}"
        + (f", dataset {cov.dataset_size}" if cov.dataset_size is not None else "")
    )
    if not cov.reproducible:
        return verdict(
            UNSHARDED_SAMPLER,
            True,
            f"{counts}; one process's epoch differs between two reads (random crops or "
            "masking in the loader?), so samples cannot be matched across ranks: sharding "
            "not verified",
            warn=True,
            **numbers,
        )
    over = cov.overlap > cov.tail_overlap
    lost = cov.missing > cov.tail_missing or cov.single_short > cov.tail_missing
    if over or lost or cov.foreign:
        parts = []
        if cov.overlap:
            parts.append(
                f"{cov.overlap} extra read(s) of samples read by several ranks "
                f"({cov.read_by_several_ranks} distinct samples)"
            )
        if cov.missing:
            parts.append(f"{cov.missing} of {cov.single_samples} samples read by no rank")
        if cov.foreign:
            parts.append(f"{cov.foreign} sample(s) that one process never reads")
        if cov.single_short:
            parts.append(
                f"even one process reads only {cov.single_samples} of the dataset's "
                f"{cov.dataset_size} samples (num_replicas not the world size?)"
            )
        return verdict(
            UNSHARDED_SAMPLER,
            False,
            f"the ranks do not read every sample exactly once {counts}: " + "; ".join(parts),
            **numbers,
        )
    tail = ""
    if cov.overlap or cov.missing:
        tail = (
            f" (epoch tail: {cov.overlap} repeat(s) to even out the ranks, {cov.missing} "
            "dropped with the last partial micro-batch)"
        )
    uneven = len(set(cov.batches_per_rank)) > 1
    if uneven:
        tail += (
            f"; the ranks read different numbers of micro-batches "
            f"({'/'.join(map(str, cov.batches_per_rank))}): the last step of the epoch waits "
            "forever on a rank that has none left"
        )
    return verdict(
        UNSHARDED_SAMPLER,
        True,
        f"every sample read exactly once {counts}{tail}",
        warn=uneven,
        **numbers,
    )
