"""``sapper watch`` on console logs that grow: the HF Trainer's printed dicts among
progress bars, and key/value lines (a nanoGPT run pasted by its user)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.watch import open_follower

_register_commands()
FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"
FAST = ["--poll", "0.05", "--idle-timeout", "0.4"]


def _append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)


def _dict(step: int, loss: str) -> str:
    bar = f"\r {step}%|#  | {step}/100 [00:{step:02d}<01:00,  1.00it/s]"
    return (
        f"{bar}\r{' ' * 30}\r{{'loss': {loss}, 'grad_norm': 1.5, 'learning_rate': 1e-05, "
        f"'epoch': {step / 100}}}\n"
    )


def test_a_growing_trainer_console_log_is_followed(tmp_path: Path) -> None:
    log = tmp_path / "train.out"
    _append(log, "Some weights of the model were not initialized\n")
    fol = open_follower(log)
    assert fol.poll() == []  # a warning only: not recognised yet, waiting
    _append(log, _dict(10, "2.5") + _dict(20, "2.4"))
    assert [r.step for r in fol.poll()] == [10]
    assert fol.format == "hf_console"
    _append(log, _dict(30, "nan"))
    assert [(r.step, r.loss) for r in fol.poll()] == [(20, 2.4)]
    (last,) = fol.close()
    assert last.step == 30 and last.loss != last.loss


def test_watch_reports_the_nan_of_a_nanogpt_log(tmp_path: Path) -> None:
    log = tmp_path / "train.txt"
    log.write_text((FIXTURES / "nanogpt" / "nanogpt-215-gpt2-fp16-nan-3010.txt").read_text())
    res = CliRunner().invoke(app, ["watch", str(log), "--format", "plain", *FAST])
    assert res.exit_code == 1, res.output
    assert f"reading {log} as a keyvalue log" in res.output
    assert "step 3010: R001 error: loss is nan" in res.output
