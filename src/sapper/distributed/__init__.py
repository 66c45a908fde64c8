"""sapper under torch.distributed: the monitor's cross-rank half (DDP, FSDP2, DeepSpeed).

Per rank, a :class:`RankTracker` keeps cheap device-side accumulators; every N steps one
small fused all-gather over a bounded gloo side group brings every rank's numbers to
rank 0, where the X-rule detectors name the rank and step of what went wrong: a
non-finite value, a straggler, replicas that drifted apart, samples duplicated across
data-parallel ranks, a lost rank; and, once at start, the process group against the
Plan. :func:`global_grad_norm` gives the right norm for sharded gradients.

The public names load lazily: ``sapper rules`` imports only :mod:`sapper.distributed.rules`
(and so this package), which must stay free of torch so listing rules is instant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapper.lazy import lazy_exports

if TYPE_CHECKING:
    from sapper.distributed.checksum import ParamChecksum, mesh_replica_groups
    from sapper.distributed.context import DistContext, NodeInfo, discover
    from sapper.distributed.detectors import (
        check_process_groups,
        default_distributed_detectors,
    )
    from sapper.distributed.gradnorm import engine_grad_norm, global_grad_norm, to_global
    from sapper.distributed.layout import RankGrid, ReplicaLayout
    from sapper.distributed.reduce import ChannelLost, SideChannel
    from sapper.distributed.sampling import BottomKSketch, jaccard, sample_hashes
    from sapper.distributed.table import DIST_KEY, RankTable
    from sapper.distributed.timing import ForwardTimer, unwrap_module
    from sapper.distributed.tracker import RankTracker

__all__ = [
    "DIST_KEY",
    "BottomKSketch",
    "ChannelLost",
    "DistContext",
    "ForwardTimer",
    "NodeInfo",
    "ParamChecksum",
    "RankGrid",
    "RankTable",
    "RankTracker",
    "ReplicaLayout",
    "SideChannel",
    "check_process_groups",
    "default_distributed_detectors",
    "discover",
    "engine_grad_norm",
    "global_grad_norm",
    "jaccard",
    "mesh_replica_groups",
    "sample_hashes",
    "to_global",
    "unwrap_module",
]

_HOME = {
    "ParamChecksum": "checksum",
    "mesh_replica_groups": "checksum",
    "DistContext": "context",
    "NodeInfo": "context",
    "discover": "context",
    "check_process_groups": "detectors",
    "default_distributed_detectors": "detectors",
    "engine_grad_norm": "gradnorm",
    "global_grad_norm": "gradnorm",
    "to_global": "gradnorm",
    "RankGrid": "layout",
    "ReplicaLayout": "layout",
    "ChannelLost": "reduce",
    "SideChannel": "reduce",
    "BottomKSketch": "sampling",
    "jaccard": "sampling",
    "sample_hashes": "sampling",
    "DIST_KEY": "table",
    "RankTable": "table",
    "ForwardTimer": "timing",
    "unwrap_module": "timing",
    "RankTracker": "tracker",
}


__getattr__, __dir__ = lazy_exports(__name__, _HOME, __all__)
