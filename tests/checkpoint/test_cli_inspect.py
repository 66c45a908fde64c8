"""``sapper inspect`` in-process: the JSON contract, the text view, the exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from ckptgen import plant_torch, plant_weights
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app

runner = CliRunner()
_register_commands()


def test_healthy_checkpoint_exit_0_and_json_contract(hf_run: list[Path]) -> None:
    res = runner.invoke(app, ["inspect", str(hf_run[-1]), "--format", "json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert set(payload) == {"findings", "summary"}
    assert payload["findings"] == []
    (ckpt,) = payload["summary"]["checkpoints"]
    assert ckpt["format"] == "hf-trainer" and ckpt["steps"]["trainer"] == 4.0
    assert sorted(row["layer"] for row in ckpt["layers"]) == [0, 1, 2, 3]


def test_error_finding_exit_1_with_tensor_in_json(hf_run, copy_of) -> None:
    folder = copy_of(hf_run[-1])
    plant_weights(folder, lambda sd: sd["model.layers.0.mlp.up_proj.weight"].fill_(float("nan")))
    res = runner.invoke(app, ["inspect", str(folder), "-f", "json"])
    assert res.exit_code == 1
    (f,) = json.loads(res.stdout)["findings"]
    assert {"code", "severity", "check", "title", "message", "fix", "tensor"} <= set(f)
    assert (f["code"], f["severity"], f["tensor"]) == (
        "K001",
        "error",
        "model.layers.0.mlp.up_proj.weight",
    )


def test_warning_only_exit_0_and_text_view(hf_run, copy_of) -> None:
    folder = copy_of(hf_run[-1])
    plant_torch(folder / "scheduler.pt", lambda s: s.update(_last_lr=[0.5]))
    res = runner.invoke(app, ["inspect", str(folder)])
    assert res.exit_code == 0, res.output
    assert "K008 warning" in res.output
    assert "model.layers" in res.output and "abs max" in res.output
    assert "layers, worst first" in res.output


def test_two_checkpoints_text(hf_run: list[Path]) -> None:
    res = runner.invoke(app, ["inspect", *map(str, hf_run)])
    assert res.exit_code == 0, res.output
    assert "largest relative changes" in res.output and "no findings" in res.output


def test_unreadable_exit_2_one_line(tmp_path: Path) -> None:
    res = runner.invoke(app, ["inspect", str(tmp_path / "missing.safetensors")])
    assert res.exit_code == 2
    assert "missing.safetensors" in res.output and "cannot open" in res.output
    res = runner.invoke(app, ["inspect", str(tmp_path), str(tmp_path), str(tmp_path)])
    assert res.exit_code == 2 and "one or two" in res.output
