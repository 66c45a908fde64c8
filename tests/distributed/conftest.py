"""Fixtures of the multi-process tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from distlaunch import Job, run_job


@pytest.fixture
def job(tmp_path: Path) -> Callable[..., Job]:
    """``job(world, options, node_of=..., timeout_s=...)`` runs the worker on every rank."""

    def launch(world: int, opts: dict[str, Any], **kw: Any) -> Job:
        return run_job(tmp_path, world, opts, **kw)

    return launch
