"""The names a ``sapper run`` folder shares between the processes that write it: the
supervisor (``sapper.launch``), the bootstrap in every training process
(``sapper.monitor.attach``) and the heartbeat's watcher (``sapper.distributed``). One
place, so a renamed file cannot leave one writer asking for dumps nobody answers."""

from __future__ import annotations

__all__ = ["DUMP_TRIGGER", "PLAN_FILE"]

#: The file whose creation (or new mtime) asks every training process for its stacks and
#: flight-recorder dump.
DUMP_TRIGGER = ".sapper-dump"
#: The plan ``sapper run`` checked, as JSON, for the monitors the bootstrap attaches.
PLAN_FILE = "plan.json"
