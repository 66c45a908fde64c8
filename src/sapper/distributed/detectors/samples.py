"""X004: the same samples fed to several data-parallel ranks (seed §5.3)."""

from __future__ import annotations

from sapper.distributed.detectors._common import fmt_ranks, table_of, window_text
from sapper.distributed.rules import DUPLICATE_SAMPLES_ACROSS_RANKS
from sapper.distributed.sampling import jaccard
from sapper.rules.model import Finding
from sapper.runtime.detector import Detector
from sapper.runtime.records import StepRecord

__all__ = ["DUPLICATE_SAMPLES_ACROSS_RANKS", "DuplicateSamplesDetector"]


class DuplicateSamplesDetector(Detector):
    """Within each data group, ranks whose window sketches overlap by ``min_overlap`` or
    more (estimated Jaccard) are clustered; each cluster is reported once."""

    rules = (DUPLICATE_SAMPLES_ACROSS_RANKS,)

    def __init__(self, min_overlap: float = 0.5) -> None:
        self.min_overlap = min_overlap
        self.reported: list[list[int]] = []

    def update(self, record: StepRecord) -> list[Finding]:
        table = table_of(record)
        if table is None or not table.sketches:
            return []
        hashed = table.col("samples_hashed")
        out = []
        for group in table.data_groups:
            ranks = [r for r in group if r < len(table.sketches) and (hashed[r] or 0) > 0]
            parent = {r: r for r in ranks}
            overlaps: list[float] = []
            for i, a in enumerate(ranks):
                for b in ranks[i + 1 :]:
                    j = jaccard(table.sketches[a], table.sketches[b])
                    if j is not None and j >= self.min_overlap:
                        parent[_root(parent, b)] = _root(parent, a)
                        overlaps.append(j)
            clusters: dict[int, list[int]] = {}
            for r in ranks:
                clusters.setdefault(_root(parent, r), []).append(r)
            for members in clusters.values():
                if len(members) < 2 or members in self.reported:
                    continue
                self.reported.append(members)
                share = min(overlaps) if overlaps else 1.0
                every = len(members) == len(group)
                msg = (
                    f"{fmt_ranks(members)} were fed the same samples in {window_text(table)} "
                    f"(estimated overlap ≥ {share:.0%}"
                    + (", every data-parallel rank" if every else "")
                    + f", {len(group)} ranks expected to be disjoint)"
                )
                out.append(
                    DUPLICATE_SAMPLES_ACROSS_RANKS.finding(
                        msg,
                        step=table.step,
                        rank=members[1],
                        value=share,
                        threshold=self.min_overlap,
                        ranks=members,
                        group=group,
                    )
                )
        return out


def _root(parent: dict[int, int], r: int) -> int:
    while parent[r] != r:
        r = parent[r]
    return r
