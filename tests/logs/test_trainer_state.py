"""HF Trainer ``trainer_state.json``: log_history entries, eval merged by step, damage."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sapper.errors import InputError
from sapper.logs import TrainerStateParser, read_log


def test_example_spike_nan_and_eval(examples: Path) -> None:
    log = read_log(examples / "hf-llama-sft")
    assert log.format == "trainer_state"
    assert log.path.endswith("trainer_state.json")
    steps = [r.step for r in log.records]
    assert steps == list(range(10, 601, 10))
    by_step = {r.step: r for r in log.records}
    assert by_step[330].loss == pytest.approx(3.874)
    assert by_step[330].grad_norm == pytest.approx(41.7)
    assert math.isnan(by_step[340].grad_norm)
    # eval entries share the step of a training entry and are merged into it
    assert by_step[50].eval_loss is not None and by_step[50].loss is not None
    assert sum(r.eval_loss is not None for r in log.records) == 12
    assert by_step[10].lr == pytest.approx(2e-5 * 10 / 30)
    assert by_step[10].extra["epoch"] == pytest.approx(0.05)
    # the closing summary is not a step
    assert log.meta["summary"]["train_loss"] == pytest.approx(0.8841)
    assert log.meta["logging_steps"] == 10 and log.meta["max_steps"] == 600
    assert log.notes == []


def _state(history: list[dict]) -> str:
    return json.dumps({"global_step": history[-1]["step"], "log_history": history}, indent=2)


def test_eval_between_logging_steps_is_its_own_record(tmp_path: Path) -> None:
    history = [
        {"loss": 2.0, "learning_rate": 1e-4, "grad_norm": 1.0, "epoch": 0.1, "step": 20},
        {"eval_loss": 1.9, "epoch": 0.12, "step": 25},
        {"loss": 1.8, "learning_rate": 1e-4, "grad_norm": 0.9, "epoch": 0.2, "step": 40},
        {"loss": 1.7, "step": 60, "num_input_tokens_seen": 123456},
    ]
    path = tmp_path / "trainer_state.json"
    path.write_text(_state(history))
    log = read_log(path)
    assert [(r.step, r.loss, r.eval_loss) for r in log.records] == [
        (20, 2.0, None),
        (25, None, 1.9),
        (40, 1.8, None),
        (60, 1.7, None),
    ]
    assert log.records[-1].extra["tokens_seen"] == 123456


def test_truncated_file_keeps_complete_entries(examples: Path, tmp_path: Path) -> None:
    text = (examples / "hf-llama-sft" / "trainer_state.json").read_text()
    cut = text.index('"step": 200') + 5  # inside the entry of step 200
    path = tmp_path / "trainer_state.json"
    path.write_text(text[:cut])
    log = read_log(path)
    assert log.records[-1].step == 190
    assert len(log.records) == 19
    assert any("truncated" in n and "entries" in n for n in log.notes)


def test_snapshot_parse_returns_only_new_steps() -> None:
    parser = TrainerStateParser("trainer_state.json")
    first = [{"loss": 2.0, "step": 10}, {"loss": 1.9, "step": 20}]
    assert [r.step for r in parser.parse(_state(first))] == [10, 20]
    later = [*first, {"loss": 1.8, "step": 30}, {"loss": 1.7, "step": 40}]
    assert [r.step for r in parser.parse(_state(later))] == [30, 40]
    assert parser.parse(_state(later)) == []


def test_json_without_log_history_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text('{"global_step": 3,\n "best_metric": null}\n')
    with pytest.raises(InputError, match="no log_history") as err:
        read_log(path, fmt="trainer_state")
    assert err.value.file == str(path)


def test_entries_without_integer_step_are_noted(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text(_state([{"loss": 2.0, "step": "ten"}, {"loss": 1.0, "step": 20}]))
    log = read_log(path)
    assert [r.step for r in log.records] == [20]
    assert any("integer step" in n for n in log.notes)
