"""``sapper analyze`` in-process: findings on real-format logs, exit codes, bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app

runner = CliRunner()
_register_commands()


def invoke(*args: object):
    return runner.invoke(app, ["analyze", *map(str, args)])


def codes(res) -> set[str]:
    return {f["code"] for f in json.loads(res.stdout)["findings"]}


def test_hf_spike_nan_and_overfitting(examples: Path) -> None:
    res = invoke(examples / "hf-llama-sft", "-f", "json")
    assert res.exit_code == 1, res.output  # a NaN gradient norm is an error
    payload = json.loads(res.stdout)
    found = {(f["code"], f.get("step")) for f in payload["findings"]}
    assert {("R002", 330), ("R010", 340), ("R110", 500)} <= found
    (log,) = payload["summary"]["logs"]
    assert log["format"] == "trainer_state" and log["records"] == 60 and log["interval"] == 10
    assert payload["summary"]["errors"] >= 1


def test_megatron_scale_collapse_and_nan(examples: Path) -> None:
    res = invoke(examples / "megatron-gpt345m-fp16.log", "-f", "json")
    assert res.exit_code == 1
    assert {"R030", "R001", "R002"} <= codes(res)


def test_healthy_run_log_is_clean(examples: Path) -> None:
    res = invoke(examples / "sapper-gpt2-healthy.jsonl", "--strict")
    assert res.exit_code == 0, res.output
    assert "no findings" in res.output and "0 error(s), 0 warning(s)" in res.output


def test_lr_stuck_needs_the_plan_to_name_the_schedule(examples: Path) -> None:
    path = examples / "wandb-history-lr-stuck.csv"
    without = invoke(path, "-f", "json")
    assert without.exit_code == 0 and "R003" in codes(without)
    assert invoke(path, "--strict").exit_code == 1
    with_plan = invoke(path, "-f", "json", "--lr", "3e-4", "--warmup", "100")
    assert "R041" in codes(with_plan) or "R040" in codes(with_plan)


def test_select_and_ignore(examples: Path) -> None:
    path = examples / "megatron-gpt345m-fp16.log"
    assert codes(invoke(path, "-f", "json", "--select", "R03")) == {"R030"}
    assert "R030" not in codes(invoke(path, "-f", "json", "--ignore", "R030,R001"))


def test_several_logs_and_merge(examples: Path, tmp_path: Path) -> None:
    res = invoke(examples / "hf-llama-sft", examples / "sapper-gpt2-healthy.jsonl", "-f", "json")
    assert [log["format"] for log in json.loads(res.stdout)["summary"]["logs"]] == [
        "trainer_state",
        "sapper",
    ]
    lines = (examples / "megatron-gpt345m-fp16.log").read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "iteration     1500/" in line)
    (tmp_path / "part1.log").write_text("".join(lines[:cut]))
    (tmp_path / "part2.log").write_text("".join(lines[cut - 40 :]))  # resumed from 1200
    merged = json.loads(invoke(tmp_path / "part1.log", tmp_path / "part2.log", "--merge",
                               "-f", "json").stdout)
    (log,) = merged["summary"]["logs"]
    # part2 repeats steps 1100-1490: both attempts are kept, in file order
    assert log["records"] == 340 and log["first_step"] == 10 and log["last_step"] == 3000
    spans = [(a["number"], a["first_step"], a["last_step"], a["records"]) for a in log["attempts"]]
    assert spans == [(1, 10, 1490, 149), (2, 1100, 3000, 191)]
    assert "restarted at step 1,490 (attempt 2 resumes from step 1,100)" in log["notes"]
    assert log["interval"] == 10 and log["gaps"] == []
    # the resumed attempt's detectors know the history it resumes from: the same findings
    # as the log read whole (no "loss barely moved over the first steps" at the resume)
    whole = json.loads(invoke(examples / "megatron-gpt345m-fp16.log", "-f", "json").stdout)
    assert {(f["code"], f["step"]) for f in merged["findings"]} == {
        (f["code"], f["step"]) for f in whole["findings"]
    }


def test_text_output_lists_notes_and_findings(examples: Path, tmp_path: Path) -> None:
    text = (examples / "hf-llama-sft" / "trainer_state.json").read_text()
    path = tmp_path / "trainer_state.json"
    path.write_text(text[: text.index('"step": 360') + 8])
    res = invoke(path)
    assert res.exit_code == 1
    assert "note:" in res.output and "truncated" in res.output
    assert "R010 error (step 340)" in res.output


def test_bad_inputs_are_one_line_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("")
    garbage = tmp_path / "core.bin"
    garbage.write_bytes(os.urandom(2048))
    broken = tmp_path / "trainer_state.json"
    broken.write_text('{"log_history": [{"loss": 1.0, "st')
    for path, message in [
        (empty, "the file is empty"),
        (garbage, "binary data, not a training log"),
        (broken, "no training steps found"),
        (tmp_path / "missing.csv", "no such file"),
    ]:
        res = invoke(path)
        assert res.exit_code == 2, (path, res.output)
        assert message in res.output
        assert "Traceback" not in res.output
        assert res.output.count("error:") == 1


def test_one_bad_log_among_good_ones(examples: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("")
    res = invoke(examples / "sapper-gpt2-healthy.jsonl", empty, "-f", "json")
    assert res.exit_code == 2
    payload = json.loads(res.stdout)
    assert len(payload["summary"]["logs"]) == 1
    assert payload["summary"]["unreadable"][0]["file"] == str(empty)


def test_mixed_formats_in_one_file(examples: Path, tmp_path: Path) -> None:
    csv_text = (examples / "wandb-history-lr-stuck.csv").read_text()
    megatron = (examples / "megatron-gpt345m-fp16.log").read_text().splitlines()[25:30]
    path = tmp_path / "mixed.csv"
    path.write_text(csv_text + "\n".join(megatron) + "\n")
    res = invoke(path, "-f", "json")
    assert res.exit_code == 0, res.output
    (log,) = json.loads(res.stdout)["summary"]["logs"]
    assert log["records"] == 400
    assert any("malformed rows" in n for n in log["notes"])


def test_bad_map_and_format_options(examples: Path) -> None:
    path = examples / "wandb-history-lr-stuck.csv"
    res = invoke(path, "--map", "oops")
    assert res.exit_code == 2 and "--map" in res.output
    res = invoke(path, "--log-format", "parquet")
    assert res.exit_code == 2 and "unknown log format" in res.output
    res = invoke(path, "--log-format", "megatron")
    assert res.exit_code == 2 and "no training steps found in this megatron log" in res.output


def test_plan_file_option(examples: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "optimizer: {lr: 2.0e-5}\nschedule: {type: cosine, warmup_steps: 30, total_steps: 600}\n"
        "clipping: {max_norm: 1.0}\n"
    )
    res = invoke(examples / "hf-llama-sft", "--plan", plan, "-f", "json")
    assert res.exit_code == 1, res.output
    bad = invoke(examples / "hf-llama-sft", "--plan", tmp_path / "nope.yaml")
    assert bad.exit_code == 2


FIXTURE_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def test_a_quiet_short_excerpt_says_what_could_not_run() -> None:
    """A real Megatron fp16 excerpt (13 records): no finding, but never a bare
    "no findings" — the rules that lacked history or fields are listed, text and JSON."""
    path = FIXTURE_LOGS / "megatron-examples/megatron-345m-fp16-5000it.log"
    text = invoke(path)
    assert text.exit_code == 0, text.output
    assert "no findings from the rules that could run" in text.output
    assert "not evaluated" in text.output and "R012" in text.output
    payload = json.loads(invoke(path, "-f", "json").stdout)
    assert payload["findings"] == []
    lines = payload["not_evaluated"][str(path)]
    assert any(line.startswith("R032-R033") and "megatron" in line for line in lines)
    (log,) = payload["summary"]["logs"]
    assert log["not_evaluated"] == lines


CONSOLE_FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"


def test_console_logs_are_analyzed_as_their_format() -> None:
    """The Trainer's printed dicts (a NaN grad norm from the first log, SY-Xuan/Pink#6)
    and nanoGPT's lines (nan from iteration 3010, karpathy/nanoGPT#215)."""
    res = invoke(CONSOLE_FIXTURES / "hf_console" / "pink-6-stage1-grad-norm-nan.txt", "-f", "json")
    assert res.exit_code == 1, res.output
    payload = json.loads(res.stdout)
    (log,) = payload["summary"]["logs"]
    assert log["format"] == "hf_console" and log["records"] == 13
    assert ("R010", 1) in {(f["code"], f.get("step")) for f in payload["findings"]}
    assert any("logged dicts' order" in n for n in log["notes"])
    # the Trainer unscales before clipping: the GradScaler-order rules do not apply
    assert any(line.startswith("R032-R033") and "hf-trainer" in line
               for line in log["not_evaluated"])

    res = invoke(CONSOLE_FIXTURES / "nanogpt" / "nanogpt-215-gpt2-fp16-nan-3010.txt")
    assert res.exit_code == 1
    text = " ".join(res.output.split())  # the line wraps wherever the path's length puts it
    assert "keyvalue log, 15 records, steps 2,920–3,060" in text
    assert "R001" in text


def test_folder_notes_name_the_files_passed_over(tmp_path: Path) -> None:
    runs = CONSOLE_FIXTURES / "torchtitan"
    (tmp_path / "titan.log").write_text(
        (runs / "torchtitan-3393-checkpoint-steps-14-21.txt").read_text()
    )
    (tmp_path / "launch.sh").write_text("#!/bin/sh\ntorchrun train.py\n")
    res = invoke(tmp_path, "-f", "json")
    assert res.exit_code == 0, res.output
    (log,) = json.loads(res.stdout)["summary"]["logs"]
    assert log["format"] == "keyvalue"
    assert any(n.startswith(f"skipped {tmp_path / 'launch.sh'}: not a log sapper can read")
               for n in log["notes"]), log["notes"]
    text = invoke(tmp_path)
    assert "note: skipped" in text.output and "launch.sh" in text.output
