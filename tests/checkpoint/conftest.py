"""One real HF Trainer run per session; each test plants its fault into a copy."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import ckptgen


@pytest.fixture(scope="session")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """checkpoint-2 and checkpoint-4 of a 4-step HF Trainer run of a 4-layer Llama."""
    return ckptgen.hf_trainer_checkpoints(tmp_path_factory.mktemp("hf") / "run")


@pytest.fixture
def copy_of(tmp_path: Path) -> Callable[[Path], Path]:
    def make(src: Path) -> Path:
        return ckptgen.copy_checkpoint(src, tmp_path / src.name)

    return make
