"""Every shipped config example is recognised as its own format and as no other: the
readers see the same files (an Axolotl YAML has a model_type, a training_args.json shares
keys with DeepSpeed, an accelerate config has mixed_precision), so each is scored by every
reader and the right one must win."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapper.plan.readers.base import Sniff
from sapper.plan.readers.registry import MIN_CONFIDENCE, detect_config, formats

EXAMPLES = Path(__file__).parent.parent.parent / "examples"
#: Example folder -> the format of its files; JSON files beside a launch config are the
#: DeepSpeed configs it names.
FOLDERS = {
    "hf": "hf", "deepspeed": "deepspeed", "plans": "sapper", "accelerate": "accelerate",
    "axolotl": "axolotl", "training_args": "training_args",
}
CASES = [
    (path, fmt if not (path.suffix == ".json" and fmt in ("accelerate", "axolotl"))
     else "deepspeed")
    for folder, fmt in FOLDERS.items()
    for path in sorted((EXAMPLES / folder).rglob("*"))
    if path.is_file() and path.suffix in (".json", ".yaml", ".yml", ".sh", ".toml")
]


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize(("path", "fmt"), CASES, ids=lambda c: getattr(c, "name", c))
def test_example_is_its_own_format(path: Path, fmt: str) -> None:
    sniff = Sniff.of(path)
    assert detect_config(sniff).name == fmt
    scores = {f.name: f.recognise(sniff) for f in formats()}
    runner_up = max(s for name, s in scores.items() if name != fmt)
    assert scores[fmt] >= MIN_CONFIDENCE and scores[fmt] > runner_up + 0.05, scores


def test_there_are_examples_of_each_new_format() -> None:
    found = {fmt for _, fmt in CASES}
    assert {"accelerate", "axolotl", "training_args"} <= found
