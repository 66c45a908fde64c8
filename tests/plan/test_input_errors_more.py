"""Input errors that once ended as internal errors or as findings: a path that is a
symbolic link to itself, given to any option that opens a file, is one line naming the
file (exit 2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.errors import InputError
from sapper.plan.load import load_plan

ROOT = Path(__file__).parent.parent.parent
EXAMPLES = ROOT / "examples"
LLAMA = EXAMPLES / "hf" / "llama-2-7b.json"
RUNLOG = EXAMPLES / "logs" / "sapper-gpt2-healthy.jsonl"
runner = CliRunner()
_register_commands()


def one_line_exit_2(args: list[str], *parts: str) -> str:
    res = runner.invoke(app, args)
    assert res.exit_code == 2, (args, res.output)
    assert not isinstance(res.exception, RuntimeError)
    line = res.output.strip()
    assert "\n" not in line and "Traceback" not in line, line
    for part in parts:
        assert part in line, line
    return line


# ---- symbolic link loops -------------------------------------------------------------
@pytest.fixture
def loop(tmp_path: Path) -> Path:
    """``ln -s loop loop``, and a two-link cycle beside it."""
    path = tmp_path / "loop"
    os.symlink("loop", path)
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    return path


@pytest.mark.parametrize("args", [
    ["check", "{loop}"],
    ["check", "--config", "{loop}"],
    ["check", "--model", "{loop}"],
    ["check", "--deepspeed", "{loop}"],
    ["check", "--model", str(LLAMA), "--deepspeed", "{loop}"],
    ["check", "--model", "{cycle}"],
    ["memory", "--model", "{loop}"],
    ["plan", "--model", "{loop}"],
    ["analyze", "{loop}"],
    ["analyze", str(RUNLOG), "--model", "{loop}"],
    ["analyze", str(RUNLOG), "--plan", "{loop}"],
    ["diagnose", str(RUNLOG), "--deepspeed", "{loop}"],
])
def test_a_symlink_loop_is_an_input_error_naming_the_file(loop: Path,
                                                          args: list[str]) -> None:
    cycle = loop.parent / "a"
    argv = [a.format(loop=loop, cycle=cycle) for a in args]
    named = str(cycle) if "{cycle}" in args else str(loop)
    one_line_exit_2(argv, named, "symbolic links")


def test_load_plan_refuses_a_loop_for_every_kind_of_file(loop: Path) -> None:
    for kwargs in ({"hf_config": loop}, {"deepspeed": loop}, {"configs": [loop]}):
        with pytest.raises(InputError, match="symbolic links") as err:
            load_plan(**kwargs)  # type: ignore[arg-type]
        assert str(loop) in str(err.value)


def test_a_watched_log_replaced_by_a_loop_is_an_input_error(tmp_path: Path) -> None:
    from sapper.watch import FileFollower

    log = tmp_path / "run.jsonl"
    log.write_text(RUNLOG.read_text())
    follower = FileFollower(log)
    assert follower.poll()
    log.unlink()
    os.symlink(log.name, log)
    with pytest.raises(InputError, match="symbolic links") as err:
        follower.poll()
    assert "run.jsonl" in str(err.value)
