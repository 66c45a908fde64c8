"""Helpers for report tests: the example logs and reading the data back out of a page."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "logs"
_DATA = re.compile(r'<script type="application/json" id="sapper-data">(.*?)</script>', re.S)


def page_data(page: str) -> dict[str, Any]:
    """The JSON the page draws from (escapes undone by the JSON parser)."""
    match = _DATA.search(page)
    assert match, "no data block in the page"
    return json.loads(match.group(1))


@pytest.fixture
def examples() -> Path:
    return EXAMPLES
