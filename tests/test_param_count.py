"""One parameter count: `check`, `memory` and `plan` print the same number for a real
config.json, and it is the count of the Hugging Face model built from that config (on
the meta device: no weights, no download)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app

CONFIGS = sorted((Path(__file__).parent / "fixtures" / "hf").glob("*.json"))
runner = CliRunner()
_register_commands()


def _json(*args: str) -> dict:
    res = runner.invoke(app, [*args, "--format", "json"])
    assert res.exit_code in (0, 1), res.output
    return json.loads(res.stdout)


def _hf_count(path: Path) -> int:
    transformers = pytest.importorskip("transformers")
    import torch

    try:
        cfg = transformers.AutoConfig.from_pretrained(str(path), trust_remote_code=False)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    except (ValueError, KeyError) as exc:  # a config that needs the repository's code
        pytest.skip(f"transformers cannot build {path.name} without remote code: {exc}")
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_check_memory_and_plan_count_the_hf_models_parameters(path: Path) -> None:
    expected = _hf_count(path)
    model = ["--model", str(path)]
    job = ["--micro-batch", "1", "--seq-len", "512", "--gpu", "A100-80GB"]
    checked = _json("check", *model)["summary"]["derived"]["parameters"]
    estimated = _json("memory", *model, *job)["estimate"]["num_params"]
    planned = _json("plan", *model, *job, "--gpus", "8", "--global-batch", "64")
    # the plan's own layout (TP1 PP1): every GPU holds the whole model
    per_gpu = planned["current"]["cost"]["details"]["params_per_gpu"]
    assert checked == estimated == round(per_gpu) == expected
