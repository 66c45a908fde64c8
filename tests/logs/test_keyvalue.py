"""Key/value console lines: nanoGPT and torchtitan logs pasted by their users, units,
field names shared with the table reader, and what the reader must not claim."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapper.logs import detect_format, read_log
from sapper.logs.detect import detect_text
from sapper.logs.keyvalue import KeyValueParser, read_line

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"


def test_nanogpt_iterations_and_eval() -> None:
    """karpathy/nanoGPT#178: ``iter N: loss X, time Yms, mfu Z%`` then the eval line."""
    path = FIXTURES / "nanogpt" / "nanogpt-178-shakespeare-char-healthy.txt"
    assert detect_format(path) == "keyvalue"
    log = read_log(path)
    first, second = log.records[:2]
    assert (first.step, first.loss, first.step_time_s, first.mfu) == (0, 4.2648, 9.37181, None)
    assert (second.step, second.loss) == (10, 3.2202)
    assert second.step_time_s == pytest.approx(0.89376)
    assert second.mfu == pytest.approx(0.1668)  # nanoGPT's -100% placeholder is left out
    last = log.records[-1]
    assert (last.step, last.loss, last.eval_loss) == (250, 1.544, 1.722)


def test_nanogpt_nan_with_time_stamps() -> None:
    """karpathy/nanoGPT#215: a date in front of each line; the loss turns nan."""
    log = read_log(FIXTURES / "nanogpt" / "nanogpt-215-gpt2-fp16-nan-3010.txt")
    by_step = {r.step: r for r in log.records}
    assert by_step[3000].loss == 4.249 and by_step[3000].eval_loss == 4.0427
    assert by_step[3010].loss != by_step[3010].loss  # nan
    assert by_step[2920].time == 1679477439.0  # 2023-03-22 09:30:39 UTC


def test_torchtitan_prefix_units_and_thousands() -> None:
    """pytorch/torchtitan#3393: ``[rank0]:[titan] ... - INFO - step: 14  loss: ...``."""
    path = FIXTURES / "torchtitan" / "torchtitan-3393-checkpoint-steps-14-21.txt"
    assert detect_format(path) == "keyvalue"
    log = read_log(path)
    rec = log.records[0]
    assert (rec.step, rec.loss, rec.grad_norm) == (14, 3.24405, 0.8319)
    assert rec.memory_reserved_gib == 9.46  # torchtitan prints the peak reserved memory
    assert rec.tokens_per_s == 7282.0
    assert rec.mfu == pytest.approx(0.0017)
    assert rec.extra["tflops"] == 0.52
    assert [r.step for r in log.records] == list(range(14, 22))


def test_every_ranks_copy_of_a_line_is_one_step() -> None:
    """pytorch/torchtitan#2389: seven ranks printed step 4 without a rank prefix."""
    log = read_log(FIXTURES / "torchtitan" / "torchtitan-2389-moe-gate-ranks-unprefixed.txt")
    assert [(r.step, r.loss, r.grad_norm) for r in log.records] == [
        (4, 7.62585, 26.625), (5, 7.07623, 46.5)
    ]
    assert len(log.attempts) <= 1


def test_other_ranks_are_passed_over_with_a_note() -> None:
    parser = KeyValueParser()
    records = parser.feed([
        "[rank0]:step: 1  loss: 2.0",
        "[rank1]:step: 1  loss: 2.1",
        "[rank0]:step: 2  loss: 1.9",
    ])
    records += parser.finish()
    assert [(r.step, r.loss) for r in records] == [(1, 2.0), (2, 1.9)]
    assert any("rank 0" in n and "1 line(s)" in n for n in parser.notes)


@pytest.mark.parametrize(
    ("line", "step", "expected"),
    [
        ("step 500 | loss 2.1 | lr 3e-4 | grad_norm 1.25", 500,
         {"loss": 2.1, "lr": 3e-4, "grad_norm": 1.25}),
        ("global_step=12, learning_rate=1.0e-05, gnorm=0.5, train_loss=3.3", 12,
         {"lr": 1e-05, "grad_norm": 0.5, "loss": 3.3}),
        ("Step 7/100 | loss: 0.25 | step_time: 120ms | mem: 3.5GiB", 7,
         {"loss": 0.25, "step_time_s": 0.12, "memory_reserved_gib": 3.5}),
        ("iteration 3; loss=1.5; tokens/s=12,345; dt 2.5s", 3,
         {"loss": 1.5, "tokens_per_s": 12345.0, "step_time_s": 2.5}),
    ],
)
def test_separators_and_units(line: str, step: int, expected: dict[str, float]) -> None:
    read = read_line(line)
    assert read is not None
    assert read[0] == step
    assert {k: read[1][k] for k in expected} == pytest.approx(expected)


@pytest.mark.parametrize(
    "line",
    [
        "Epoch 3 step 100 done",  # a step, no metric
        "loss 2.3 lr 1e-4",  # metrics, no step
        "    print(f'step {step}: loss {loss:.4f}')",  # code
        "2025-01-01 12:00:00,000 - root - INFO - Saving checkpoint at step 200",
    ],
)
def test_lines_without_a_step_and_a_metric_do_not_count(line: str) -> None:
    assert read_line(line) is None


def test_specific_formats_keep_their_logs() -> None:
    """A Megatron log's iteration line holds step and loss pairs too: Megatron's reader
    is more confident; a numeric CSV stays a CSV."""
    megatron = (
        " iteration      100/    1000 | consumed samples: 1600 | elapsed time per iteration"
        " (ms): 500.0 | learning rate: 1.0E-04 | lm loss: 2.5E+00 | loss scale: 1.0 |\n"
    ) * 3
    assert detect_text(megatron) == "megatron"
    assert detect_text("step,loss,lr\n1,2.0,1e-4\n2,1.9,1e-4\n") == "csv"
    assert detect_text("step: 1  loss: 2.0\nstep: 2  loss: 1.9\n") == "keyvalue"


def test_lightning_progress_bar_postfix() -> None:
    """Lightning-AI/pytorch-lightning#4225: each batch drawn twice, the second time with
    its loss; bars without metrics (``Training: 0it``) are passed over."""
    path = FIXTURES / "lightning" / "lightning-4225-progress-bar-epoch-0.txt"
    assert detect_format(path) == "keyvalue"
    log = read_log(path)
    assert [(r.step, r.loss) for r in log.records] == [
        (1, 10.473), (2, 10.224), (3, 10.047), (4, 9.926), (5, 9.847)
    ]
    assert "v_num" not in log.records[0].extra  # the logger's version, no metric
    assert any("progress bars" in n for n in log.notes)


def test_progress_bar_steps_count_over_epochs() -> None:
    """Epoch 2 of a 100-batch epoch, redrawn after carriage returns on one line."""
    parser = KeyValueParser()
    line = "\r".join(
        f"Epoch 2:  {n}%|####      | {n}/100 [00:10<00:12,  4.50it/s, train_loss={3 - n / 100}]"
        for n in (40, 41)
    )
    records = parser.feed([line]) + parser.finish()
    assert [(r.step, r.loss) for r in records] == [(240, 2.6), (241, 2.59)]
