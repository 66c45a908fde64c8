"""Cross-rank detectors (X rules): plain detectors over step records that carry the
per-rank table of an exchange (``record.extra["dist"]``), so they run the same live on
rank 0 and offline over a run log; plus the start-of-run process-group checks."""

from sapper.distributed.detectors.groups import (
    RANKS_PER_NODE,
    TP_ACROSS_NODES,
    WORLD_SIZE_MISMATCH,
    check_process_groups,
    check_world_size,
)
from sapper.distributed.detectors.lost import RANK_LOST, lost_rank_finding
from sapper.distributed.detectors.nonfinite import NONFINITE_ON_RANK, NonFiniteRankDetector
from sapper.distributed.detectors.replicas import REPLICAS_DIVERGED, ReplicaDivergenceDetector
from sapper.distributed.detectors.samples import (
    DUPLICATE_SAMPLES_ACROSS_RANKS,
    DuplicateSamplesDetector,
)
from sapper.distributed.detectors.skew import RANKS_OUT_OF_STEP, StepSkewDetector
from sapper.distributed.detectors.spike import (
    SPIKE_ON_RANK,
    SPIKE_RATIO,
    SpikeRankDetector,
    spike_suspects,
)
from sapper.distributed.detectors.straggler import STRAGGLER_RANK, StragglerDetector
from sapper.runtime.detector import Detector

__all__ = [
    "DUPLICATE_SAMPLES_ACROSS_RANKS",
    "NONFINITE_ON_RANK",
    "RANKS_OUT_OF_STEP",
    "RANKS_PER_NODE",
    "RANK_LOST",
    "REPLICAS_DIVERGED",
    "SPIKE_ON_RANK",
    "SPIKE_RATIO",
    "STRAGGLER_RANK",
    "TP_ACROSS_NODES",
    "WORLD_SIZE_MISMATCH",
    "DuplicateSamplesDetector",
    "NonFiniteRankDetector",
    "ReplicaDivergenceDetector",
    "SpikeRankDetector",
    "StepSkewDetector",
    "StragglerDetector",
    "check_process_groups",
    "check_world_size",
    "default_distributed_detectors",
    "lost_rank_finding",
    "spike_suspects",
]


def default_distributed_detectors() -> list[Detector]:
    """One of each cross-rank detector, default thresholds."""
    return [
        NonFiniteRankDetector(),
        StragglerDetector(),
        ReplicaDivergenceDetector(),
        DuplicateSamplesDetector(),
        StepSkewDetector(),
        SpikeRankDetector(),
    ]
