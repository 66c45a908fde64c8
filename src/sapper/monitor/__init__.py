"""The live training monitor (seed §5.2, §5.3, §2): attach it with two lines.

``Monitor`` needs only torch; the framework adapters are optional modules:
:mod:`sapper.monitor.hf` (transformers ``TrainerCallback``) and
:mod:`sapper.monitor.lightning` (Lightning ``Callback``).
"""

from sapper.monitor.halt import HaltPolicy, SapperHalt
from sapper.monitor.monitor import Monitor

__all__ = ["HaltPolicy", "Monitor", "SapperHalt"]
