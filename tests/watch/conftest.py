"""Fixtures of the watch tests (helpers live in ``watchkit``)."""

from __future__ import annotations

import math

import pytest
from watchkit import FAULT_STEP, train_fault_run

from sapper.runtime.records import StepRecord


@pytest.fixture(scope="session")
def fault_run() -> list[StepRecord]:
    """The fault run, trained once per session (a few seconds on one CPU thread)."""
    records = train_fault_run()
    assert records[FAULT_STEP - 2].loss is not None and records[FAULT_STEP - 2].loss < 1.0
    assert any(not math.isfinite(r.loss or 0.0) for r in records), "the fault run never hit NaN"
    return records
