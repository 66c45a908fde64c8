"""The detector protocol: a plain object over a stream of step records.

Detectors keep their own state and never touch the training loop (Lightning's
``fabric/utilities/spike.py`` pattern): the live monitor, the framework callbacks, the
offline analyzer and ``sapper watch`` are thin feeders of the same objects, so live and
offline share one code path. A detector declares the rules it can fire; its findings
carry the step and the numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from sapper.rules.model import Finding, Rule
from sapper.runtime.records import StepRecord

__all__ = ["Detector", "DetectorSet"]


class Detector:
    """Base class: override :meth:`update` (and :meth:`finish` for end-of-stream checks)."""

    #: The rules this detector can fire (registered by the module that defines them).
    rules: ClassVar[tuple[Rule, ...]] = ()

    def update(self, record: StepRecord) -> list[Finding]:
        """Consume one record; return the findings it triggers (usually none)."""
        raise NotImplementedError

    def finish(self) -> list[Finding]:
        """The stream ended (end of a log, end of training)."""
        return []

    def state_dict(self) -> dict[str, Any]:
        """State to resume from (``sapper watch`` restarts, checkpoints)."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        vars(self).update(state)


class DetectorSet:
    """Runs many detectors over one stream; one broken detector never stops the others."""

    def __init__(self, detectors: Iterable[Detector]) -> None:
        self.detectors = list(detectors)
        #: Detectors that raised, with the error, reported once and then skipped.
        self.failed: dict[str, str] = {}

    def _guard(self, det: Detector, call: Any, *args: Any) -> list[Finding]:
        name = type(det).__name__
        if name in self.failed:
            return []
        try:
            return list(call(*args))
        except Exception as exc:  # a detector bug must not break the run it watches
            self.failed[name] = f"{type(exc).__name__}: {exc}"
            return []

    def update(self, record: StepRecord) -> list[Finding]:
        out: list[Finding] = []
        for det in self.detectors:
            out.extend(self._guard(det, det.update, record))
        return out

    def finish(self) -> list[Finding]:
        out: list[Finding] = []
        for det in self.detectors:
            out.extend(self._guard(det, det.finish))
        return out

    def run(self, records: Iterable[StepRecord]) -> list[Finding]:
        """Feed a whole stream and finish it (the offline path)."""
        out: list[Finding] = []
        for rec in records:
            out.extend(self.update(rec))
        out.extend(self.finish())
        return out
