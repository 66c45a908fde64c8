"""The live training monitor (seed §5.2, §5.3, §2): attach it with two lines.

``Monitor`` needs only torch; the framework adapters are optional modules:
:mod:`sapper.monitor.hf` (transformers ``TrainerCallback``) and
:mod:`sapper.monitor.lightning` (Lightning ``Callback``).

The public names load lazily: ``sapper run``'s bootstrap imports
:mod:`sapper.monitor.attach` in every process that imports torch, and a process that
never trains must not pay for the monitor (the plan schema, the detectors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapper.lazy import lazy_exports

if TYPE_CHECKING:
    from sapper.monitor.halt import HaltPolicy, SapperHalt
    from sapper.monitor.monitor import Monitor

__all__ = ["HaltPolicy", "Monitor", "SapperHalt"]

_HOME = {"HaltPolicy": "halt", "Monitor": "monitor", "SapperHalt": "halt"}

__getattr__, __dir__ = lazy_exports(__name__, _HOME, __all__)
