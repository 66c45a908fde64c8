"""Runtime detectors over step records: shared by the live monitor, the offline
analyzer, ``sapper watch`` and distributed runs."""

from sapper.runtime.detector import Detector, DetectorSet
from sapper.runtime.records import StepRecord

__all__ = ["Detector", "DetectorSet", "StepRecord"]
