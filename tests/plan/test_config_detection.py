"""Every shipped example of every launch-config format is recognised as its own format
by content, so formats that share keys (a NeMo YAML's ``model:``, a plan's ``model:``,
a DeepSpeed JSON's batch keys) do not take each other's files."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapper.plan.readers.base import Sniff
from sapper.plan.readers.registry import detect_config

EXAMPLES = Path(__file__).parent.parent.parent / "examples"
#: examples/<folder> -> the format its files are in.
FOLDERS = {
    "plans": "sapper",
    "hf": "hf",
    "deepspeed": "deepspeed",
    "smoke": "hf",
    "nemo": "nemo",
    "torchtitan": "torchtitan",
}
CASES = [
    (path, fmt)
    for folder, fmt in FOLDERS.items()
    for path in sorted((EXAMPLES / folder).glob("*"))
    if path.suffix in (".yaml", ".yml", ".json", ".toml")
]


@pytest.mark.parametrize(("path", "fmt"), CASES, ids=lambda c: str(c)[-40:])
def test_each_example_is_read_as_its_own_format(path: Path, fmt: str) -> None:
    assert detect_config(Sniff.of(path)).name == fmt
