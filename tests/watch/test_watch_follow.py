"""Followers: files that appear late, torn lines, rotation, truncation, pipes, detection."""

from __future__ import annotations

import json
import os
import threading

import pytest
from watchkit import megatron_line, megatron_lines, runlog_lines

from sapper.errors import InputError
from sapper.watch import FileFollower, StreamFollower, open_follower


def _append(path, lines, end="\n"):
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + end)


def _steps(records):
    return [r.step for r in records]


def test_waits_for_a_file_that_does_not_exist_yet(tmp_path, fault_run):
    log = tmp_path / "later" / "run.jsonl"
    fol = open_follower(log)
    assert fol.poll() == [] and fol.poll() == []
    assert "waiting" in (fol.waiting or "")
    assert fol.last_data is None
    log.parent.mkdir()
    _append(log, runlog_lines(fault_run[:5]))
    assert _steps(fol.poll()) == [1, 2, 3, 4, 5]
    assert fol.format == "sapper" and fol.waiting is None and fol.last_data is not None


def test_torn_last_line_is_held_back_until_complete(tmp_path, fault_run):
    log = tmp_path / "run.jsonl"
    lines = runlog_lines(fault_run[:3])
    _append(log, lines[:3])
    fol = FileFollower(log)
    assert _steps(fol.poll()) == [1, 2]
    head, tail = lines[3][:25], lines[3][25:]
    _append(log, [head], end="")
    assert fol.poll() == []  # half a line: nothing yet, and no "unreadable line" either
    _append(log, [tail])
    assert _steps(fol.poll()) == [3]
    assert fol.close() == []
    assert not any("unreadable" in n or "torn" in n for n in fol.notes)


def test_rotation_reads_the_old_file_to_its_end_then_the_new_one(tmp_path, fault_run):
    log = tmp_path / "train.log"
    lines = [megatron_line(r) for r in fault_run[:12]]
    _append(log, lines[:4])
    fol = open_follower(log)
    assert _steps(fol.poll()) == [1, 2, 3]  # step 4 waits for a later step
    with open(log, "a", encoding="utf-8") as old:  # the writer still holds the old file
        os.rename(log, tmp_path / "train.log.1")
        old.write("\n".join(lines[4:6]) + "\n")
    _append(log, lines[6:12])  # the new file under the old name
    assert _steps(fol.poll()) == [4, 5, 6, 7, 8, 9, 10, 11]
    assert any("rotated" in e for e in fol.events)
    assert _steps(fol.close()) == [12]


def test_rename_without_a_new_file_keeps_reading_the_old_one(tmp_path, fault_run):
    log = tmp_path / "run.jsonl"
    lines = runlog_lines(fault_run[:4])
    _append(log, lines[:2])
    fol = FileFollower(log)
    assert _steps(fol.poll()) == [1]
    with open(log, "a", encoding="utf-8") as old:
        os.rename(log, tmp_path / "run.jsonl.1")
        old.write("\n".join(lines[2:]) + "\n")
    assert _steps(fol.poll()) == [2, 3, 4]


def test_truncation_reads_again_from_the_start_as_a_new_attempt(tmp_path, fault_run):
    log = tmp_path / "run.jsonl"
    _append(log, runlog_lines(fault_run[:10]))
    fol = FileFollower(log)
    assert _steps(fol.poll()) == list(range(1, 11))
    # the job restarted from the checkpoint at step 6 and opened its log with "w"
    log.write_text("\n".join(runlog_lines(fault_run[5:8])) + "\n")
    assert _steps(fol.poll()) == [6, 7, 8]
    assert any("truncated" in e for e in fol.events)
    _append(log, runlog_lines(fault_run[8:14])[1:])
    assert _steps(fol.poll()) == [9, 10, 11, 12, 13, 14]
    assert [(a.number, a.first_step, a.last_step) for a in fol.parser.attempts] == [
        (1, 1, 10), (2, 6, 14)
    ]


def test_stdin_pipe_in_pieces_until_it_closes(fault_run):
    read_fd, write_fd = os.pipe()
    text = "\n".join(megatron_lines(fault_run[:8])) + "\n"
    fol = StreamFollower(os.fdopen(read_fd, "rb", buffering=0))
    writer = os.fdopen(write_fd, "wb", buffering=0)
    data = text.encode()
    cut = len(data) // 2 + 7  # inside a line
    writer.write(data[:cut])
    got = []
    deadline = threading.Event()
    for _ in range(200):
        got += fol.poll()
        if fol.last_data is not None:
            break
        deadline.wait(0.01)
    assert fol.format == "megatron"
    writer.write(data[cut:])
    writer.close()
    for _ in range(200):
        got += fol.poll()
        if fol.ended:
            break
        deadline.wait(0.01)
    assert fol.ended
    got += fol.close()
    assert _steps(got) == list(range(1, 9))


def test_megatron_argument_header_waits_for_the_first_iteration_line(tmp_path, fault_run):
    log = tmp_path / "train.log"
    lines = megatron_lines(fault_run[:3])
    _append(log, lines[:5])  # "using world size ...", the argument block
    fol = open_follower(log)
    assert fol.poll() == []
    assert "not recognized yet" in (fol.waiting or "")
    _append(log, lines[5:])
    assert _steps(fol.poll()) == [1, 2]
    assert fol.format == "megatron"


def test_csv_with_a_header_row(tmp_path):
    log = tmp_path / "metrics.csv"
    _append(log, ["step,train/loss,train/grad_norm", "1,2.5,0.9", "2,2.4,0.8"])
    fol = open_follower(log)
    assert _steps(fol.poll()) == [1]
    _append(log, ["3,nan,0.7"])
    got = fol.poll() + fol.close()
    assert _steps(got) == [2, 3] and got[1].loss != got[1].loss


def test_binary_file_is_an_input_error(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(InputError, match="binary"):
        open_follower(path).poll()


def test_text_that_never_becomes_a_log_is_refused_at_the_end(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello\nthis is not a training log\n")
    fol = FileFollower(path)
    assert fol.poll() == []
    assert "not recognized" in (fol.waiting or "")
    with pytest.raises(InputError, match="not a log sapper can read"):
        fol.close()


def test_unknown_log_format_and_binary_formats_on_a_pipe_are_refused():
    with pytest.raises(InputError, match="unknown log format"):
        open_follower("x.log", fmt="parquet")
    with pytest.raises(InputError, match="cannot be read from a pipe"):
        open_follower("-", fmt="tensorboard")


def test_a_trainer_state_cannot_come_through_a_pipe(fault_run):
    read_fd, write_fd = os.pipe()
    state = {"global_step": 1, "log_history": [{"loss": 1.0, "step": 1}]}
    with os.fdopen(write_fd, "wb") as fh:
        fh.write(json.dumps(state, indent=2).encode())
    fol = StreamFollower(os.fdopen(read_fd, "rb"))
    with pytest.raises(InputError, match="rewritten at each save"):
        for _ in range(200):
            fol.poll()
            if fol.ended:
                fol.close()
            threading.Event().wait(0.01)


def test_a_long_backlog_is_read_over_several_quick_polls(tmp_path, fault_run, monkeypatch):
    from sapper.watch import Watcher, follow

    monkeypatch.setattr(follow, "CHUNK", 2048)
    log = tmp_path / "train.log"
    _append(log, megatron_lines(fault_run))
    size = log.stat().st_size
    watcher = Watcher(open_follower(log), idle_timeout=0)
    waits = [watcher.tick()]
    while waits[-1] == 0.0:
        waits.append(watcher.tick())
    assert len(waits) >= size // 2048  # one chunk per poll, no sleep in between
    result = watcher.close()
    whole = Watcher(open_follower(log), idle_timeout=0)
    monkeypatch.setattr(follow, "CHUNK", 1 << 22)
    whole.tick()
    assert result.records == len(fault_run)
    assert [(f.code, f.step) for f in result.findings] == [
        (f.code, f.step) for f in whole.close().findings
    ]
