"""Shared paths: the example logs shipped in ``examples/logs`` are the realistic fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "logs"


@pytest.fixture
def examples() -> Path:
    return EXAMPLES
