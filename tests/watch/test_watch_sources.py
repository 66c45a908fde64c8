"""TensorBoard event files and Trainer states followed incrementally; the reader additions
``sapper watch`` relies on (StepMerger.settle, detect_text, TensorBoardParser.feed_events)."""

from __future__ import annotations

import json
import math
import os
import shutil
import struct

import pytest

from sapper.errors import InputError
from sapper.logs import MegatronParser, TensorBoardParser
from sapper.logs.base import StepMerger
from sapper.logs.detect import detect_text
from sapper.watch import EventsFollower, SnapshotFollower, open_follower
from sapper.watch.events import is_event_header, masked_crc32c


def _steps(records):
    return [r.step for r in records]


def _event_run(logdir, steps, new_style=False):
    """A run written by torch's SummaryWriter: loss, grad norm and LR per step."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(logdir), flush_secs=3600)
    for step, loss in steps:
        writer.add_scalar("train/loss", loss, step, new_style=new_style)
        writer.add_scalar("train/grad_norm", 0.5, step, new_style=new_style)
        writer.add_scalar("train/learning_rate", 1e-4, step, new_style=new_style)
    writer.close()
    (path,) = [p for p in logdir.iterdir() if "tfevents" in p.name]
    return path


# ---- TensorBoard ----------------------------------------------------------------------
def test_masked_crc32c_matches_tensorboard():
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as reference

    for data in (b"", b"a", struct.pack("<Q", 42), os.urandom(100)):
        assert masked_crc32c(data) == reference(data)


def test_event_file_read_frame_by_frame_across_partial_writes(tmp_path):
    source = _event_run(tmp_path / "src", [(s, 3.0 - 0.01 * s) for s in range(1, 21)])
    data = source.read_bytes()
    assert is_event_header(data[:12])
    run = tmp_path / "run"
    run.mkdir()
    target = run / source.name
    fol = open_follower(run)
    assert fol.poll() == []  # an empty folder: waiting
    got = []
    for cut in (len(data) // 3 + 5, 2 * len(data) // 3 - 3, len(data)):  # cuts inside frames
        with open(target, "ab") as fh:
            fh.write(data[os.path.getsize(target) if target.exists() else 0 : cut])
        got += fol.poll()
    got += fol.close()
    assert fol.format == "tensorboard"
    assert _steps(got) == list(range(1, 21))
    assert got[4].loss == pytest.approx(2.95, rel=1e-6) and got[4].grad_norm == 0.5
    assert got[4].lr == pytest.approx(1e-4, rel=1e-6)  # float32 on disk


def test_new_event_files_in_the_run_folder_are_followed(tmp_path):
    first = _event_run(tmp_path / "a", [(s, 2.0) for s in range(1, 6)])
    second = _event_run(tmp_path / "b", [(s, 2.0) for s in range(6, 11)])
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(first, run / first.name)
    fol = EventsFollower(run)
    assert _steps(fol.poll()) == [1, 2, 3, 4]
    shutil.copy(second, run / (first.name + ".restart"))  # sorts after the first
    assert _steps(fol.poll()) == [5, 6, 7, 8, 9]
    assert any("new event file" in e for e in fol.events)
    assert _steps(fol.close()) == [10]


def test_a_folder_holding_one_run_follows_it_and_several_runs_are_refused(tmp_path):
    runs = tmp_path / "output" / "runs"
    _event_run(runs / "May14_10-02-11_node3", [(s, 2.0) for s in range(1, 4)])
    fol = open_follower(runs)
    assert _steps(fol.poll() + fol.close()) == [1, 2, 3]
    assert any("May14_10-02-11_node3" in e for e in fol.events)
    _event_run(runs / "May15_08-00-00_node3", [(1, 2.0)])
    with pytest.raises(InputError, match="holds 2 TensorBoard runs"):
        open_follower(runs).poll()


def test_damaged_event_file_is_reported_not_waited_on(tmp_path):
    source = _event_run(tmp_path / "src", [(s, 1.0) for s in range(1, 4)])
    data = bytearray(source.read_bytes())
    run = tmp_path / "run"
    run.mkdir()
    frame = 12 + struct.unpack("<Q", data[:8])[0] + 4  # the file_version event
    data[frame + 8] ^= 0xFF  # break the length checksum of the second frame
    (run / source.name).write_bytes(bytes(data))
    fol = EventsFollower(run)
    assert fol.poll() == []
    assert any("damaged record" in e for e in fol.events)


def test_feed_events_reads_tensor_scalars_written_new_style(tmp_path):
    source = _event_run(tmp_path / "src", [(1, 2.0), (2, math.nan), (3, 1.5)], new_style=True)
    fol = EventsFollower(source)  # a single event file
    got = fol.poll() + fol.close()
    assert _steps(got) == [1, 2, 3]
    assert math.isnan(got[1].loss) and got[2].loss == 1.5


def test_feed_events_maps_tags_like_the_offline_reader(tmp_path):
    source = _event_run(tmp_path / "src", [(s, 1.0 + s) for s in range(1, 6)])
    offline = TensorBoardParser(source).finish()
    followed = EventsFollower(source)
    online = followed.poll() + followed.close()
    assert [(r.step, r.loss, r.grad_norm, r.lr) for r in online] == [
        (r.step, r.loss, r.grad_norm, r.lr) for r in offline
    ]


# ---- trainer_state.json ---------------------------------------------------------------
def _state(steps, eval_every=0):
    history = []
    for s in steps:
        history.append({"epoch": s / 100, "grad_norm": 0.5, "learning_rate": 1e-5,
                        "loss": 2.0 - s / 100, "step": s})
        if eval_every and s % eval_every == 0:
            history.append({"epoch": s / 100, "eval_loss": 2.1 - s / 100, "step": s})
    return {"global_step": steps[-1], "max_steps": 100, "log_history": history}


def _save(folder, step, state):
    ckpt = folder / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps(state, indent=2))


def test_output_folder_follows_the_newest_checkpoint_without_repeating_steps(tmp_path):
    out = tmp_path / "output"
    fol = open_follower(out)
    assert fol.poll() == []
    out.mkdir()
    assert fol.poll() == []
    _save(out, 20, _state(list(range(5, 21, 5)), eval_every=10))
    got = fol.poll()
    assert fol.format == "trainer_state"
    assert _steps(got) == [5, 10, 15, 20]
    assert got[1].eval_loss == pytest.approx(2.0)
    assert fol.poll() == []  # unchanged: not read again
    _save(out, 40, _state(list(range(5, 41, 5)), eval_every=10))
    assert _steps(fol.poll()) == [25, 30, 35, 40]
    assert any("checkpoint-40" in e for e in fol.events)


def test_half_written_state_is_read_again_before_it_is_salvaged(tmp_path):
    path = tmp_path / "trainer_state.json"
    text = json.dumps(_state(list(range(1, 11))), indent=2)
    path.write_text(text[: len(text) // 2])
    fol = SnapshotFollower(path)
    assert fol.poll() == []  # being written: look again next time
    path.write_text(text)
    assert _steps(fol.poll()) == list(range(1, 11))
    broken = json.dumps(_state(list(range(1, 16))), indent=2)
    path.write_text(broken[: int(len(broken) * 0.9)])
    assert fol.poll() == []
    salvaged = fol.poll()  # unchanged and still broken: read what is complete
    assert salvaged and salvaged[0].step == 11
    assert any("truncated" in n for n in fol.notes)


def test_a_json_file_that_is_not_a_trainer_state_is_an_input_error(tmp_path):
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"hello": 1}))
    with pytest.raises(InputError, match="log_history"):
        SnapshotFollower(path).poll()


# ---- reader additions -----------------------------------------------------------------
def test_settle_releases_the_last_step_and_keeps_late_values_apart():
    notes: list[str] = []
    merger = StepMerger(notes)
    merger.put(10, {"loss": 2.0})
    assert merger.ready() == []
    (rec,) = merger.settle()
    assert rec.step == 10 and rec.loss == 2.0
    merger.put(10, {"eval_loss": 2.2})  # Megatron's validation line after the quiet spell
    merger.put(20, {"loss": 1.9})
    (late,) = merger.ready()
    assert late.step == 10 and late.eval_loss == 2.2 and late.loss is None
    assert notes == []
    merger.put(10, {"loss": 5.0})  # a real repeat: the run restarted from a checkpoint
    assert _steps(merger.flush()) == [20, 10]
    assert [(a.number, a.first_step, a.last_step) for a in merger.tracker.attempts] == [
        (1, 10, 20), (2, 10, 10)
    ]


def test_megatron_validation_after_a_settled_step_is_not_lost():
    parser = MegatronParser()
    lines = [
        " iteration      100/     1000 | lm loss: 2.0E+00 | grad norm: 0.5 |",
        " validation loss at iteration 100 | lm loss value: 2.1E+00 | lm loss PPL: 8.1 |",
        " iteration      110/     1000 | lm loss: 1.9E+00 | grad norm: 0.5 |",
    ]
    assert parser.feed(lines[:1]) == []
    (first,) = parser.merger.settle()
    assert first.loss == 2.0 and first.eval_loss is None
    assert parser.feed(lines[1:])[0].eval_loss == 2.1
    assert _steps(parser.finish()) == [110]
    assert not any("again" in n for n in parser.notes)


def test_detect_text_on_complete_lines():
    assert detect_text('{"kind": "meta", "version": 1}\n') == "sapper"
    assert detect_text('{"step": 1, "loss": 2.0}\n') == "jsonl"
    assert detect_text(" iteration        1/     100 | lm loss: 2.0 |\n") == "megatron"
    assert detect_text("step,loss\n1,2.0\n2,1.9\n") == "csv"
    with pytest.raises(InputError, match="no complete line"):
        detect_text("\n \n")
