"""Following a growing log: byte offsets, torn lines held back, snapshots re-read."""

from __future__ import annotations

import json
from pathlib import Path

from sapper.logs import LogSource


def test_text_log_grows_line_by_line(examples: Path, tmp_path: Path) -> None:
    text = (examples / "megatron-gpt345m-fp16.log").read_bytes()
    path = tmp_path / "train.log"
    path.write_bytes(b"")
    source = LogSource(path, fmt="megatron")
    seen = []
    # append in odd-sized pieces that cut lines (and UTF-8 characters) anywhere
    for start in range(0, len(text), 9973):
        with path.open("ab") as fh:
            fh.write(text[start : start + 9973])
        seen += source.poll()
    seen += source.close()
    assert [r.step for r in seen] == list(range(10, 3001, 10))
    assert source.notes == []


def test_torn_line_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text('{"kind": "step", "step": 1, "loss": 2.0}\n{"kind": "step", "st')
    source = LogSource(path)
    assert [r.step for r in source.poll()] == [1]
    with path.open("a") as fh:
        fh.write('ep": 2, "loss": 1.9}\n')
    assert [(r.step, r.loss) for r in source.poll()] == [(2, 1.9)]
    assert source.close() == [] and source.notes == []


def test_trainer_state_snapshot_is_reread_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    history = [{"loss": 2.0, "step": 10}]
    path.write_text(json.dumps({"log_history": history}))
    source = LogSource(path)
    assert [r.step for r in source.poll()] == [10]
    assert source.poll() == []  # unchanged
    history += [{"loss": 1.8, "step": 20}, {"loss": 1.7, "step": 30}]
    path.write_text(json.dumps({"log_history": history}, indent=1))
    assert [r.step for r in source.poll()] == [20, 30]
