"""fairseq's console lines through the key-value reader: the step is ``num_updates`` (the
optimizer updates, not the batch within the epoch), a validation line's loss is the eval
loss, and a progress bar's own step counter beats the bar's position."""

from __future__ import annotations

from pathlib import Path

from sapper.logs import read_log

FAIRSEQ = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "fairseq"


def test_an_epoch_line_and_its_validation_line_are_one_record() -> None:
    log = read_log(FAIRSEQ / "fairseq-1529-fp16-min-loss-scale.log")
    (rec,) = log.records
    assert (rec.step, rec.loss, rec.eval_loss) == (9165, 3.976, 9.329)
    assert (rec.grad_norm, rec.loss_scale, rec.lr) == (0.635, 0.0, 0.000330319)


def test_a_progress_bar_takes_its_step_from_num_updates() -> None:
    log = read_log(FAIRSEQ / "fairseq-1331-progress-bar.log")
    (rec,) = log.records
    assert (rec.step, rec.loss, rec.loss_scale) == (15945, 11.469, 0.016)
    assert not any("progress bars" in note for note in log.notes)


def test_a_named_validation_subset_is_its_own_eval_set(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text(
        "| epoch 001 | loss 7.1 | gnorm 1.2 | num_updates 100 | lr 0.0005\n"
        "| epoch 001 | valid on 'test' subset | loss 7.9 | num_updates 100\n"
    )
    (rec,) = read_log(path).records
    assert rec.loss == 7.1 and rec.eval_loss is None
    assert rec.extra["eval_losses"] == {"test": 7.9}
