"""The HF Trainer's console output: real pasted logs, progress bars, value spellings."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sapper.errors import InputError
from sapper.logs import detect_format, read_log
from sapper.logs.console import ConsoleParser, log_dict

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs" / "hf_console"


def _fields(log, *names):
    return [tuple(getattr(r, n) for n in names) for r in log.records]


def test_pasted_trainer_dicts_are_numbered_in_order() -> None:
    """huggingface/transformers#35207: no bar was pasted, so the steps are the dicts'
    order, and a note says so."""
    path = FIXTURES / "transformers-35207-scale-loss-before-backward.txt"
    assert detect_format(path) == "hf_console"
    log = read_log(path)
    assert log.format == "hf_console"
    assert _fields(log, "step", "loss", "grad_norm", "lr")[:3] == [
        (1, 2.119, 37.657958984375, 4.5833333333333334e-05),
        (2, 1.6462, 17.54932403564453, 4.166666666666667e-05),
        (3, 1.5798, 14.871335983276367, 3.7500000000000003e-05),
    ]
    assert [r.step for r in log.records] == [1, 2, 3, 4, 5, 6]
    assert log.records[-1].extra["epoch"] == 1.5
    assert any("logged dicts' order" in n for n in log.notes)


def test_nan_grad_norm_is_kept_as_nan() -> None:
    """SY-Xuan/Pink#6: 'grad_norm': nan (a bare name, not a literal) on every line."""
    log = read_log(FIXTURES / "pink-6-stage1-grad-norm-nan.txt")
    assert len(log.records) == 13
    assert all(math.isnan(r.grad_norm) and r.loss == 0.0 for r in log.records)
    assert log.records[-1].lr == 0.00020714285714285716


def test_named_eval_sets_before_the_first_training_dict() -> None:
    """sentence-transformers#2449: eval dicts of two named sets, then training dicts
    without a grad norm."""
    log = read_log(FIXTURES / "sentence-transformers-2449-eval-sets.txt")
    first = log.records[0]
    assert first.step == 0
    assert first.extra["eval_losses"] == {"snli": 1.0761278867721558, "stsb": 0.05780908837914467}
    assert [(r.step, r.loss) for r in log.records[1:3]] == [(1, 0.0601), (2, 1.0932)]


BAR_LOG = (
    "***** Running training *****\n"
    "  Num examples = 1,000\n"
    "  Total optimization steps = 40\n"
    "  0%|          | 0/40 [00:00<?, ?it/s]\r  2%|▎         | 1/40 [00:01<00:40, 1.02s/it]"
    "\r 25%|██▌       | 10/40 [00:10<00:30,  1.00it/s]\r" + " " * 40 + "\r"
    "{'loss': 2.119, 'grad_norm': 37.66, 'learning_rate': 4.58e-05, 'epoch': 0.25}\n"
    "\r 25%|██▌       | 10/40 [00:10<00:30,  1.00it/s]\r 50%|█████     | 20/40 "
    "[00:20<00:20,  1.00it/s]\r{'loss': '1.646', 'grad_norm': 'nan', "
    "'learning_rate': '4.167e-05', 'epoch': '0.5'}\n"
    "\r  0%|          | 0/5 [00:00<?, ?it/s]\r100%|██████████| 5/5 [00:01<00:00, 4.1it/s]"
    "\r{'eval_loss': 1.52, 'eval_runtime': 3.2, 'eval_samples_per_second': 31.1, "
    "'epoch': 0.5}\n"
    "\x1b[33mUserWarning: something\x1b[0m\n"
    "\r 75%|███████▌  | 30/40 [00:30<00:10,  1.00it/s]{'loss': np.float64(1.5798), "
    "'grad_norm': 14.87, 'learning_rate': 3.75e-05, 'epoch': 0.75}\n"
    "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
    "{'train_runtime': 95.1, 'train_samples_per_second': 10.5, "
    "'train_steps_per_second': 0.42, 'train_loss': 1.4, 'epoch': 1.0}\n"
)


def test_steps_come_from_the_training_bar(tmp_path: Path) -> None:
    """The bar's n/total (max_steps) gives the step; an eval bar (5 batches) does not;
    newer Trainers print '%.4g' strings, numpy scalars print as np.float64(...)."""
    path = tmp_path / "train.out"
    path.write_text(BAR_LOG, encoding="utf-8")
    assert detect_format(path) == "hf_console"
    log = read_log(path)
    rows = _fields(log, "step", "loss", "lr", "eval_loss")
    assert rows == [(10, 2.119, 4.58e-05, None), (20, 1.646, 4.167e-05, 1.52),
                    (30, 1.5798, 3.75e-05, None)]
    assert math.isnan(log.records[1].grad_norm)
    assert log.meta["max_steps"] == 40
    assert log.meta["summary"]["train_runtime"] == 95.1
    assert any("progress bar" in n for n in log.notes)


def test_dict_is_read_not_evaluated() -> None:
    """A printed dict is never evaluated: code in it is text that is not a number."""
    pairs = log_dict("{'loss': __import__('os').system('x'), 'lr': 1e-3}")
    assert pairs is not None and pairs["lr"] == "1e-3"
    parser = ConsoleParser()
    records = parser.feed(["{'loss': __import__('os').system('x'), 'grad_norm': 2.0}"])
    records += parser.finish()
    assert [(r.step, r.loss, r.grad_norm) for r in records] == [(1, None, 2.0)]
    assert any("not numbers" in n for n in parser.notes)


def test_other_dicts_are_not_training_logs(tmp_path: Path) -> None:
    """A printed config is no log: refused with what each format looks for."""
    path = tmp_path / "out.txt"
    path.write_text("{'architectures': ['LlamaForCausalLM'], 'hidden_size': 4096}\n")
    with pytest.raises(InputError, match="neither a trainer_state") as info:
        detect_format(path)
    assert any("printed log dicts" in choice for choice in info.value.choices)
