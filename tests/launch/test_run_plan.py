"""The plan ``sapper run`` checked reaches the monitors the bootstrap attaches: written
into the run folder before the launch, read back as the same Plan, and a damaged file
costs the detectors their plan, never the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sapper.launch import folder
from sapper.launch.preflight import Preflight
from sapper.monitor import attach
from sapper.plan.load import load_plan

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "examples" / "plans" / "healthy-llama-7b.yaml"


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(attach._S, "run_dir", tmp_path)
    return tmp_path


def test_the_checked_plan_is_what_the_attached_monitor_gets(run_dir: Path) -> None:
    loaded = load_plan(PLAN)
    folder.write_start(run_dir, ["python", "train.py"], run_dir, Preflight(loaded))
    assert json.loads((run_dir / "plan.json").read_text())["model"]
    assert attach.run_plan() == loaded.plan


def test_a_launch_without_a_plan_leaves_the_monitor_without_one(run_dir: Path) -> None:
    folder.write_start(run_dir, ["python", "-c", "pass"], run_dir, Preflight())
    assert not (run_dir / "plan.json").exists()
    assert attach.run_plan() is None


def test_a_damaged_plan_file_is_one_line_and_no_plan(run_dir: Path, capsys) -> None:
    (run_dir / "plan.json").write_text('{"model": {"layers": "many"')
    assert attach.run_plan() is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not used" in err[0]
