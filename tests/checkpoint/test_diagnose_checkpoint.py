"""``sapper diagnose LOG --checkpoint PATH``: what ``sapper inspect`` finds in the run's
checkpoint is evidence, weighed at the step the checkpoint was saved."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from ckptgen import plant_json
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app

runner = CliRunner()
_register_commands()


def _diagnose(*args: object) -> tuple[int, dict]:
    res = runner.invoke(app, ["diagnose", *map(str, args), "--format", "json"])
    assert res.exit_code in (0, 1, 2), res.output
    return res.exit_code, (json.loads(res.stdout) if res.exit_code != 2 else {})


def _nan_at_the_end(trainer_state: Path) -> None:
    """The run's own log, its last training loss NaN: the blow-up to explain."""

    def edit(state: dict) -> None:
        last = [h for h in state["log_history"] if "loss" in h][-1]
        last["loss"], last["grad_norm"] = float("nan"), float("nan")

    plant_json(trainer_state, edit)


def test_a_collapsed_scale_saved_before_the_nan_names_the_overflow(hf_run, copy_of) -> None:
    early, late = copy_of(hf_run[0]), copy_of(hf_run[-1])
    _nan_at_the_end(late / "trainer_state.json")
    _, alone = _diagnose(late / "trainer_state.json")
    assert alone["causes"][0]["cause"] == "unknown"  # the log alone cannot tell
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.ones(()))
    state = scaler.state_dict()
    state["scale"] = 0.25  # at checkpoint-2 the fp16 scale had already collapsed
    torch.save(state, early / "scaler.pt")
    code, doc = _diagnose(late / "trainer_state.json", "--checkpoint", early)
    assert code == 1
    (named,) = doc["causes"]
    assert named["cause"] == "fp16-overflow"
    sign = next(e for e in named["evidence"] if e["code"] == "K006")
    assert sign["step"] == 2 and sign["source"].startswith(str(early))
    assert named["first_step"] == 2 and doc["summary"]["checkpoints"] == [str(early)]


def test_a_healthy_checkpoint_adds_nothing(hf_run, copy_of) -> None:
    late = copy_of(hf_run[-1])
    _nan_at_the_end(late / "trainer_state.json")
    _, without = _diagnose(late / "trainer_state.json")
    _, with_it = _diagnose(late / "trainer_state.json", "--checkpoint", late)
    assert with_it["causes"][0]["cause"] == without["causes"][0]["cause"] == "unknown"


def test_an_unreadable_checkpoint_is_exit_2(hf_run, tmp_path: Path) -> None:
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\x00" * 64)
    code, _ = _diagnose(hf_run[-1] / "trainer_state.json", "--checkpoint", bad)
    assert code == 2


def test_a_checkpoint_that_does_not_fit_the_model_is_listed(hf_run, copy_of, tmp_path) -> None:
    """--model is the run's config.json: a checkpoint of another width is reported even
    where no cause of the blow-up explains it."""
    late = copy_of(hf_run[-1])
    config = json.loads((late / "config.json").read_text())
    config["hidden_size"] = 64
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = (late / "trainer_state.json", "--checkpoint", late)
    _, fits = _diagnose(*args, "--model", late / "config.json")
    assert "K013" not in {e["code"] for e in fits["summary"]["other_findings"]}
    _, other = _diagnose(*args, "--model", tmp_path / "config.json")
    (listed,) = [e for e in other["summary"]["other_findings"] if e["code"] == "K013"]
    assert "stored in another shape" in listed["message"]
