"""Hangs: the collective a stuck job waits in and the rank that keeps it, from PyTorch's
flight-recorder dumps (one per rank) and the ranks' ``faulthandler`` stacks.

Usage::

    from sapper.hangs import diagnose_hang
    verdict = diagnose_hang(Path("dumps/"))      # None: no dumps there
    verdict.to_json()                            # diagnose's contract, check "distributed"

Dumps are pickles: they go through sapper's restricted unpickler (:mod:`sapper.unpickle`),
never ``pickle.load``.
"""

from __future__ import annotations

from sapper.lazy import lazy_exports

__all__ = ["HangVerdict", "diagnose_hang"]

_HOME = dict.fromkeys(__all__, "verdict")

__getattr__, __dir__ = lazy_exports(__name__, _HOME, __all__)
