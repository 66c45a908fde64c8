"""Another tool's YAML is never read as a sapper plan: it is refused in one line saying
what it looks like, not with the schema errors of a format the user did not use;
``--config-format`` forces a format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.plan.readers.base import Sniff
from sapper.plan.readers.registry import formats

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
runner = CliRunner()
_register_commands()

FOREIGN = {
    "workflow.yml": ("name: CI\non:\n  push:\n    branches: [main]\njobs:\n  test:\n"
                     "    runs-on: ubuntu-latest\n    steps:\n      - run: pytest\n",
                     "a GitHub Actions workflow"),
    "compose.yaml": ('version: "3.8"\nservices:\n  trainer:\n    image: pytorch/pytorch\n'
                     "    volumes:\n      - ./data:/data\n", "a Docker Compose file"),
    "job.yaml": ("apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: train\nspec:\n"
                 "  template:\n    spec:\n      containers:\n        - name: train\n"
                 "          image: nvcr.io/nvidia/pytorch:24.01-py3\n",
                 "a Kubernetes manifest"),
    # A Hydra config whose ``model`` and ``data`` sections share the Plan's names only.
    "hydra.yaml": ("defaults:\n  - _self_\n  - model: resnet\ntrainer:\n  max_epochs: 10\n"
                   "  devices: 4\nmodel:\n  lr: 0.001\n  backbone: resnet50\ndata:\n"
                   "  batch_size: 64\n  num_workers: 8\n", "a Hydra config"),
    "hydra-no-defaults.yaml": ("model:\n  lr: 0.001\n  backbone: resnet50\ndata:\n"
                               "  batch_size: 64\n", "first line"),
    "other.yaml": ("name: my-tool\nretries: 3\nendpoints:\n  - a\n", "first line"),
}


def sapper_score(path: Path) -> float:
    fmt = next(f for f in formats() if f.name == "sapper")
    return fmt.recognise(Sniff.of(path))


@pytest.mark.parametrize("name", sorted(FOREIGN))
def test_foreign_yaml_is_refused_in_one_line(tmp_path: Path, name: str) -> None:
    text, looks = FOREIGN[name]
    path = tmp_path / name
    path.write_text(text)
    assert sapper_score(path) == 0.0
    res = runner.invoke(app, ["check", str(path)])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    assert "not a config sapper can read" in lines[0] and looks in lines[0]
    assert "missing value" not in res.output and "unknown field" not in res.output
    assert "--config-format" in lines[0]


def test_a_plan_with_a_typo_is_still_a_plan(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text("precison:\n  dtype: bf16\nbatch:\n  micro_batch_size: 1\n")
    res = runner.invoke(app, ["check", str(path)])
    assert res.exit_code == 2 and "precison" in res.output, res.output
    assert "not a config sapper can read" not in res.output


def test_every_shipped_plan_is_still_a_plan() -> None:
    for path in sorted((EXAMPLES / "plans").glob("*.yaml")):
        assert sapper_score(path) >= 0.8, path


def test_config_format_forces_a_reader(tmp_path: Path) -> None:
    path = tmp_path / "hydra.yaml"
    path.write_text(FOREIGN["hydra.yaml"][0])
    # Forced, the file is read as a plan: its errors are then the plan's.
    res = runner.invoke(app, ["check", str(path), "--config-format", "sapper"])
    assert res.exit_code == 2 and "not a config sapper can read" not in res.output
    assert "missing value" in res.output or "unknown field" in res.output, res.output
    # Forcing the format detection would pick gives the same report.
    example = str(EXAMPLES / "llamafactory/qwen3_full_sft.yaml")
    detected = runner.invoke(app, ["check", example, "-f", "json"])
    forced = runner.invoke(app, ["check", example, "-f", "json",
                                 "--config-format", "llamafactory"])
    assert detected.exit_code == forced.exit_code
    assert json.loads(detected.stdout) == json.loads(forced.stdout)
    # An unknown name lists the names.
    bad = runner.invoke(app, ["check", example, "--config-format", "hydra"])
    assert bad.exit_code == 2 and "llamafactory" in bad.output and "megatron" in bad.output
