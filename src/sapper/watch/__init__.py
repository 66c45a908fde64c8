"""``sapper watch``: guard a run from the side, following its log while it trains.

For jobs launched through scripts the user does not own (Megatron-LM, DeepSpeed
examples, ``run_clm.py``, a cluster template), nothing can be added to the training
loop, but the log is there. A follower (:mod:`.follow`, :mod:`.events`,
:mod:`.snapshot`, :mod:`.poll`, chosen by :mod:`.resolve`) reads only what the log gained since the
last poll; the :class:`Watcher` feeds the new records to the live monitor's detectors,
whose state carries over between polls; sinks show the findings (:mod:`.live`), append
them to a JSONL file and run a command on them (:mod:`.actions`).
"""

from sapper.watch.actions import ActionRun, ExecAction, FindingsFile
from sapper.watch.events import EventsFollower
from sapper.watch.follow import FileFollower, Follower, StreamFollower
from sapper.watch.live import JsonView, LiveView, PlainView, make_view
from sapper.watch.metrics import MetricBoard, sparkline
from sapper.watch.poll import PollFollower
from sapper.watch.resolve import AutoFollower, open_follower
from sapper.watch.snapshot import SnapshotFollower
from sapper.watch.watcher import Watcher, WatchResult, WatchSink, watch_detectors

__all__ = [
    "ActionRun",
    "AutoFollower",
    "EventsFollower",
    "ExecAction",
    "FileFollower",
    "FindingsFile",
    "Follower",
    "JsonView",
    "LiveView",
    "MetricBoard",
    "PlainView",
    "PollFollower",
    "SnapshotFollower",
    "StreamFollower",
    "WatchResult",
    "WatchSink",
    "Watcher",
    "make_view",
    "open_follower",
    "sparkline",
    "watch_detectors",
]
