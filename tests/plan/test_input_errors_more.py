"""Input errors that once ended as internal errors or as findings: a path that is a
symbolic link to itself, given to any option that opens a file, and a value outside what
it can mean (a negative clipping threshold, more pipeline stages than layers) are one
line naming the file or option, the value and the valid range (exit 2). What is valid
but a bad idea stays a finding (exit 1)."""

from __future__ import annotations

import json
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


# ---- values outside what they can mean ----------------------------------------------
def test_a_negative_max_norm_on_the_command_line_is_an_input_error() -> None:
    one_line_exit_2(["check", "--model", str(LLAMA), "--max-norm", "-1"],
                    "command line", "--max-norm", "clipping.max_norm", "got -1.0",
                    "expected a number ≥ 0")


def test_a_negative_max_norm_in_a_plan_is_an_input_error(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("clipping: {max_norm: -0.5}\n")
    for command in ("check", "memory"):
        one_line_exit_2([command, str(plan)], str(plan), "clipping.max_norm", "got -0.5",
                        "≥ 0")


@pytest.mark.parametrize("value", ["0", "0.05", "50"])
def test_clipping_off_or_far_from_one_stays_a_finding(value: str) -> None:
    res = runner.invoke(app, ["check", "--model", str(LLAMA), "--max-norm", value,
                              "-f", "json"])
    assert res.exit_code in (0, 1), res.output
    codes = {f["code"] for f in json.loads(res.stdout)["findings"]}
    assert ("N202" in codes) == (value != "0")


def test_more_stages_than_layers_on_the_command_line_is_an_input_error() -> None:
    for command in ("check", "memory", "plan"):
        one_line_exit_2([command, "--model", str(LLAMA), "--pp", "64", "--gpus", "64"],
                        "command line", "--pp", "parallel.pp", "got 64",
                        "from 1 to num_layers (32", "llama-2-7b.json")


def test_more_stages_than_layers_in_a_plan_is_an_input_error(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("model: {hidden_size: 1024, num_layers: 6, num_heads: 8, "
                    "vocab_size: 32000}\nparallel: {pp: 8}\n")
    one_line_exit_2(["check", str(plan)], str(plan), "parallel.pp", "got 8",
                    "from 1 to num_layers (6")


def test_as_many_stages_as_layers_is_valid() -> None:
    res = runner.invoke(app, ["check", "--model", str(LLAMA), "--pp", "32", "--gpus", "32",
                              "-f", "json"])
    assert res.exit_code in (0, 1), res.output


def test_pipeline_splits_that_run_but_are_a_bad_idea_stay_findings(tmp_path: Path) -> None:
    """Layers that do not split evenly, or more interleaved chunks than layers: P107."""
    res = runner.invoke(app, ["check", "--model", str(LLAMA), "--pp", "5", "--gpus", "40",
                              "-f", "json"])
    assert res.exit_code in (0, 1), res.output
    assert "P107" in {f["code"] for f in json.loads(res.stdout)["findings"]}
    plan = tmp_path / "plan.yaml"
    plan.write_text("model: {hidden_size: 1024, num_layers: 8, num_heads: 8, "
                    "vocab_size: 32000}\nparallel: {pp: 4, virtual_pipeline_stages: 4}\n")
    res = runner.invoke(app, ["check", str(plan), "-f", "json"])
    assert res.exit_code == 1, res.output
    [p107] = [f for f in json.loads(res.stdout)["findings"] if f["code"] == "P107"]
    assert "16 > num_layers(8)" in p107["message"]


def test_declared_stage_sizes_are_judged_by_the_layout_check(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("model: {hidden_size: 1024, num_layers: 6, num_heads: 8, "
                    "vocab_size: 32000}\nparallel: {pp: 8, first_stage_layers: 1, "
                    "last_stage_layers: 1}\n")
    res = runner.invoke(app, ["check", str(plan), "-f", "json"])
    assert res.exit_code == 1, res.output
    assert "P107" in res.stdout
