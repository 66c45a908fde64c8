"""``sapper report`` in-process: writes one page, exit codes, bad input."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app

from .conftest import page_data

runner = CliRunner()
_register_commands()


def invoke(*args: object):
    return runner.invoke(app, ["report", *map(str, args)])


def test_writes_one_page(examples: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.html"
    res = invoke(examples / "megatron-gpt345m-fp16.log", "-o", out, "--lr", "1.5e-4",
                 "--warmup", "300", "--gpu", "A100-80GB", "--expected-tokens-per-s", "2e5")
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output and "error(s)" in res.output
    data = page_data(out.read_text())
    assert data["checklist"] is not None
    assert data["source"]["format"] == "megatron"


def test_sapper_log_without_plan(examples: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = invoke(examples / "sapper-gpt2-healthy.jsonl", "--output", out, "--title", "gpt2")
    assert res.exit_code == 0, res.output
    data = page_data(out.read_text())
    assert data["checklist"] is None and data["title"] == "gpt2"
    charts = {c["id"]: c for c in data["charts"]}
    assert charts["memory"]["lines"] == [{"name": "device limit", "y": 79.6}]
    assert charts["grad_norm"]["lines"] == [{"name": "clip threshold", "y": 1.0}]
    assert charts["throughput"]["unit"] == "tokens/s"


FAULTS = Path(__file__).resolve().parents[1] / "fixtures" / "diagnose"


def test_the_diagnosis_heads_the_page(tmp_path: Path) -> None:
    """The page carries diagnose's answer: the same cause and evidence as the command."""
    out = tmp_path / "leak.html"
    res = invoke(FAULTS / "leak.jsonl", "-o", out)
    assert res.exit_code == 0, res.output
    (cause,) = page_data(out.read_text())["diagnosis"]["causes"]
    assert cause["cause"] == "memory" and cause["first_step"] == 11
    assert [e["code"] for e in cause["evidence"]] == ["R051"]


def test_a_healthy_run_has_no_diagnosis(examples: Path, tmp_path: Path) -> None:
    out = tmp_path / "ok.html"
    res = invoke(examples / "sapper-gpt2-healthy.jsonl", "-o", out, "--select", "R00")
    assert res.exit_code == 0, res.output
    assert page_data(out.read_text())["diagnosis"]["causes"] == []


def test_bad_input_and_unwritable_output(examples: Path, tmp_path: Path) -> None:
    empty = tmp_path / "e.log"
    empty.write_text("")
    res = invoke(empty, "-o", tmp_path / "x.html")
    assert res.exit_code == 2 and "the file is empty" in res.output
    res = invoke(examples / "hf-llama-sft", "-o", tmp_path / "no" / "such" / "dir.html")
    assert res.exit_code == 2 and "cannot write the report" in res.output


def test_a_folder_of_runs_is_refused(examples: Path, tmp_path: Path) -> None:
    res = invoke(examples, "-o", tmp_path / "x.html")
    assert res.exit_code == 2 and "holds 4 runs" in res.output


DEEPSPEED = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints" / "deepspeed"


def test_checkpoint_is_drawn_per_layer(examples: Path, tmp_path: Path) -> None:
    """``--checkpoint``: the page carries what ``sapper inspect`` says of it, per layer in
    layer order; a healthy DeepSpeed save of two layers has RMS and update for both."""
    out = tmp_path / "ck.html"
    ckpt = DEEPSPEED / "zero2-bf16-dp2"
    res = invoke(examples / "sapper-gpt2-healthy.jsonl", "-o", out, "--checkpoint", ckpt)
    assert res.exit_code == 0, res.output
    section = page_data(out.read_text())["checkpoint"]
    assert section["format"] == "deepspeed" and section["path"] == str(ckpt)
    assert [r["layer"] for r in section["layers"]] == [0, 1]
    assert all(r["rms"] > 0 and r["max_update"] > 0 for r in section["layers"])
    assert section["findings"] == [] and section["steps"] == {"optimizer": 3, "trainer": 3}


def test_unreadable_checkpoint_is_exit_2(examples: Path, tmp_path: Path) -> None:
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\x00" * 3)
    res = invoke(examples / "sapper-gpt2-healthy.jsonl", "-o", tmp_path / "x.html",
                 "--checkpoint", bad)
    assert res.exit_code == 2 and str(bad) in res.output
    assert not (tmp_path / "x.html").exists()
