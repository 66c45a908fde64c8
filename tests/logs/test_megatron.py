"""Megatron-LM text logs: iteration lines, validation and memory lines, prefixes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sapper.logs import MegatronParser, read_log


def test_example_skips_scale_drops_and_nan(examples: Path) -> None:
    log = read_log(examples / "megatron-gpt345m-fp16.log")
    assert log.format == "megatron"
    assert log.meta["train_iters"] == 3000
    assert [r.step for r in log.records] == list(range(10, 3001, 10))
    by_step = {r.step: r for r in log.records}
    first = by_step[10]
    # every iteration of the first interval overflowed: no loss, ten skipped steps
    assert first.loss is None and first.skipped is True and first.skipped_total == 10
    assert first.loss_scale == 4194304.0
    assert first.samples == 256
    assert first.step_time_s == pytest.approx(0.8502)
    assert first.extra["tflops_per_gpu"] == pytest.approx(97.8)
    # the memory report after iteration 10, MB -> GiB
    assert first.memory_allocated_gib == pytest.approx(6518.5048828125 / 1024)
    assert first.memory_peak_gib == pytest.approx(21587.7734375 / 1024)
    assert by_step[1820].loss_scale == 1.0
    assert math.isnan(by_step[1830].loss)  # "number of nan iterations: 1", no lm loss
    assert by_step[1830].extra["nan_iterations"] == 1
    assert by_step[500].eval_loss is not None
    assert sum(r.eval_loss is not None for r in log.records) == 6
    assert by_step[3000].skipped_total == max(r.skipped_total for r in log.records)
    assert by_step[30].time - by_step[20].time == pytest.approx(8, abs=1)


LINES = [
    "[default3]: iteration       10/ 3125000 | consumed samples:          960 | elapsed time "
    "per iteration (s): 7.2310 | learning rate: 4.438E-07 | global batch size:    96 | lm loss:"
    " 1.010967E+01 | loss scale: 4096.0 | grad norm: 178.553 | number of skipped iterations:   "
    "0 | number of nan iterations:   0 | samples per second: 13.276 | TFLOPs: 101.54 |",
    "[default3]: iteration       20/ 3125000 | consumed samples:         1920 | elapsed time "
    "per iteration (s): 5.3551 | learning rate: 8.876E-07 | global batch size:    96 | lm loss:"
    " 8.861832E+00 | loss scale: 4096.0 | grad norm: 46.241 | number of skipped iterations:   "
    "0 | number of nan iterations:   0 | samples per second: 17.927 | TFLOPs: 137.10 |",
    "time (ms) | forward-compute: 92.25 | backward-compute: 239.82 | optimizer: 42.31",
    "-" * 60,
    " validation loss at iteration 20 on validation set | lm loss value: 8.712E+00 | lm loss "
    "PPL: 6.07E+03 | ",
    " validation loss at iteration 20 on test set | lm loss value: 9.9E+00 | ",
    "successfully saved checkpoint from iteration      20 to /ckpt",
    "0: iteration       30/ 3125000 | lm loss: 8.1E+00 | mtp_1 loss: 8.3E+00 | grad norm: 12.0"
    " | number of skipped iterations:   0 | number of nan iterations:   0 |",
]


def test_megatron_deepspeed_format_with_prefixes() -> None:
    parser = MegatronParser()
    records = parser.feed(LINES) + parser.finish()
    assert [r.step for r in records] == [10, 20, 30]
    a, b, c = records
    assert a.step_time_s == pytest.approx(7.231)
    assert a.samples_per_s == pytest.approx(13.276)
    assert a.loss == pytest.approx(10.10967)
    assert b.eval_loss == pytest.approx(8.712)  # the test-set line is not the eval curve
    assert c.loss == pytest.approx(8.1) and c.extra["mtp_1_loss"] == pytest.approx(8.3)


def test_incremental_feed_equals_one_shot(examples: Path) -> None:
    lines = (examples / "megatron-gpt345m-fp16.log").read_text().splitlines()
    whole = MegatronParser()
    expected = whole.feed(lines) + whole.finish()
    chunked = MegatronParser()
    got = []
    for i in range(0, len(lines), 7):
        got += chunked.feed(lines[i : i + 7])
    got += chunked.finish()
    assert [r.to_json() for r in got] == [r.to_json() for r in expected]


def test_restart_from_checkpoint_starts_a_new_attempt() -> None:
    def line(it: int, loss: float) -> str:
        return f" iteration {it:8d}/ 100 | lm loss: {loss:.6E} | number of skipped iterations: 0 |"

    parser = MegatronParser()
    lines = [line(10, 5.0), line(20, 4.0), line(30, 3.0), line(20, 9.0), line(30, 9.0),
             line(40, 2.0)]
    records = parser.feed(lines) + parser.finish()
    assert [(r.step, r.loss) for r in records] == [
        (10, 5.0), (20, 4.0), (30, 3.0), (20, 9.0), (30, 9.0), (40, 2.0)
    ]
    assert [(a.number, a.start, a.stop, a.first_step, a.last_step) for a in parser.attempts] == [
        (1, 0, 3, 10, 30), (2, 3, 6, 20, 40)
    ]


def test_restart_at_the_last_step_and_validation_of_the_printed_iteration() -> None:
    def line(it: int, loss: float) -> str:
        return f" iteration {it:8d}/ 100 | lm loss: {loss:.6E} |"

    valid = " validation loss at iteration 20 | lm loss value: 3.5E+00 | lm loss PPL: 33.1 |"
    parser = MegatronParser()
    got = parser.feed([line(10, 5.0), line(20, 4.0), valid])
    got += parser.merger.settle()  # the writer went quiet during the evaluation
    got += parser.feed([line(20, 4.5), valid, line(30, 3.0)]) + parser.finish()
    assert [(r.step, r.loss, r.eval_loss) for r in got] == [
        (10, 5.0, None), (20, 4.0, 3.5), (20, 4.5, 3.5), (30, 3.0, None)
    ]
    assert [a.first_step for a in parser.attempts] == [10, 20]


def test_garbled_values_are_counted_not_fatal() -> None:
    parser = MegatronParser()
    records = parser.feed(
        [" iteration 10/ 20 | lm loss: 1.0E+00 | grad norm: n/a |",
         " iteration 20/ 20 | lm loss: 0.9E+00 |"]
    ) + parser.finish()
    assert [r.grad_norm for r in records] == [None, None]
    assert any("not numbers" in n for n in parser.notes)
