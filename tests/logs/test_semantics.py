"""Named eval sets, ``--map`` of any source key, per-layer gradient norms: every reader."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.logs import MegatronParser, parse_mapping, read_log
from sapper.logs.analysis import analyze_log
from sapper.runtime.detectors.eval import EvalLossDetector
from sapper.runtime.records import StepRecord

runner = CliRunner()
_register_commands()


def _state(tmp_path: Path, history: list[dict]) -> Path:
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"log_history": history, "global_step": history[-1]["step"]}))
    return path


def _two_sets(steps: range) -> list[dict]:
    """A training loss that falls; eval set 'wiki' falls too, 'code' turns up at 400."""
    out: list[dict] = []
    for step in steps:
        out.append({"step": step, "loss": 3.0 - step / 1000, "learning_rate": 1e-4})
        if step % 100 == 0:
            code = 2.0 - step / 2000 if step <= 400 else 1.8 + (step - 400) / 500
            out.append({"step": step, "eval_wiki_loss": 2.5 - step / 1000,
                        "eval_code_loss": code, "eval_code_runtime": 3.1})
    return out


# ---- named eval sets ---------------------------------------------------------------
def test_trainer_state_reads_each_eval_set(tmp_path: Path) -> None:
    log = read_log(_state(tmp_path, _two_sets(range(10, 1001, 10))))
    by = {r.step: r for r in log.records}
    assert by[100].extra["eval_losses"] == {"wiki": pytest.approx(2.4), "code": pytest.approx(1.95)}
    assert by[100].eval_loss is None and "eval_code_runtime" in by[100].extra


def test_each_eval_set_is_judged_on_its_own(tmp_path: Path) -> None:
    log = read_log(_state(tmp_path, _two_sets(range(10, 1001, 10))))
    analysis = analyze_log(log, [EvalLossDetector()])
    overfit = [f for f in analysis.findings if f.code == "R110"]
    assert [(f.data["eval_set"], f.data["best_step"]) for f in overfit] == [("code", 400)]
    assert "eval loss on 'code'" in overfit[0].message


def test_the_unnamed_eval_loss_keeps_its_message() -> None:
    det = EvalLossDetector()
    out = []
    for i, value in enumerate([2.0, 1.8, 1.9, 2.0, 2.1, 2.2]):
        out += det.update(StepRecord(step=100 * (i + 1), loss=2.0 - 0.1 * i, eval_loss=value))
    assert [f.code for f in out] == ["R110"] and out[0].message.startswith("eval loss 2.")
    assert "eval_set" not in out[0].data


def test_csv_and_jsonl_columns_name_eval_sets(tmp_path: Path) -> None:
    csv = tmp_path / "m.csv"
    csv.write_text(
        "step,train/loss,eval/wiki_loss,run - eval/code_loss\n10,2.0,1.5,1.7\n20,1.9,,\n"
    )
    (first, second) = read_log(csv).records
    assert first.extra["eval_losses"] == {"wiki": 1.5, "code": 1.7}
    assert "eval_losses" not in second.extra
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_text(json.dumps({"step": 5, "eval_wiki/loss": 1.25, "eval/loss": 1.0}) + "\n")
    (rec,) = read_log(jsonl).records
    assert rec.extra["eval_losses"] == {"wiki": 1.25} and rec.eval_loss == 1.0


# ---- --map -------------------------------------------------------------------------
def test_map_applies_to_trainer_state_keys(tmp_path: Path) -> None:
    history = [{"step": 10, "loss": 2.0, "eval_g0_loss": 1.5}, {"step": 20, "loss": 1.9}]
    path = _state(tmp_path, history)
    log = read_log(path, mapping=parse_mapping(["eval_g0_loss=eval_loss", "nope=lr"]))
    assert log.records[0].eval_loss == 1.5 and "eval_losses" not in log.records[0].extra
    (note,) = [n for n in log.notes if n.startswith("--map nope")]
    assert f"no such key in {path}" in note and "eval_g0_loss" in note and "loss" in note


def test_map_applies_to_csv_megatron_and_run_log(tmp_path: Path) -> None:
    csv = tmp_path / "m.csv"
    csv.write_text("iter,my loss,gn\n1,2.0,0.5\n2,1.9,0.4\n")
    log = read_log(csv, mapping=parse_mapping(["My_Loss=loss", "gn=grad_norm*2"]))
    assert [(r.step, r.loss, r.grad_norm) for r in log.records] == [(1, 2.0, 1.0), (2, 1.9, 0.8)]
    parser = MegatronParser(mapping=parse_mapping(["z loss=eval_loss"]))
    recs = parser.feed([" iteration 10/ 100 | lm loss: 2.0 | z loss: 1.5 |"]) + parser.finish()
    assert recs[0].eval_loss == 1.5
    run = tmp_path / "run.jsonl"
    run.write_text('{"kind":"step","step":1,"extra":{"val_ppl_loss":3.0}}\n')
    (rec,) = read_log(run, mapping=parse_mapping(["val_ppl_loss=eval_loss"])).records
    assert rec.eval_loss == 3.0 and "val_ppl_loss" not in rec.extra


def test_map_applies_to_tensorboard_tags(tmp_path: Path) -> None:
    writer = pytest.importorskip("torch.utils.tensorboard").SummaryWriter(str(tmp_path / "tb"))
    for step in (1, 2, 3):
        writer.add_scalar("custom/objective", 2.0 / step, step)
        writer.add_scalar("eval/wiki_loss", 1.0 / step, step)
        writer.add_scalar("grad_norm/layers.0", 0.1 * step, step)
        writer.add_scalar("grad_norm/layers.1", 0.2 * step, step)
    writer.close()
    log = read_log(tmp_path / "tb", mapping=parse_mapping(["custom/objective=loss"]))
    assert [r.loss for r in log.records] == pytest.approx([2.0, 1.0, 2.0 / 3])
    assert log.records[0].extra["eval_losses"] == {"wiki": 1.0}
    assert log.records[2].extra["grad_norm_layers"] == pytest.approx(
        {"layers.0": 0.3, "layers.1": 0.6}
    )


def test_map_to_an_unknown_field_is_an_input_error(tmp_path: Path) -> None:
    csv = tmp_path / "m.csv"
    csv.write_text("step,loss\n1,2.0\n")
    res = runner.invoke(app, ["analyze", str(csv), "--map", "eval_g0_loss=eval_los"])
    assert res.exit_code == 2
    text = " ".join((res.stdout + (res.stderr or "")).split())
    assert "'eval_los' is not a step-record field" in text and "eval_loss" in text


# ---- per-layer gradient norms ------------------------------------------------------
def test_per_layer_columns_are_read_into_a_dict(tmp_path: Path) -> None:
    csv = tmp_path / "m.csv"
    csv.write_text(
        "step,grad_norm,grad_norm/model.layers.0,grad_norm/model.layers.1,layer_2/grad_norm,"
        "grad_norm_layer_3,grad_norm/total,grad_norm/grad_2.0_norm_total\n"
        "1,1.0,0.5,0.25,0.125,0.0,1.0,1.0\n"
    )
    (rec,) = read_log(csv).records
    assert rec.grad_norm == 1.0
    assert rec.extra["grad_norm_layers"] == {
        "model.layers.0": 0.5, "model.layers.1": 0.25, "layer_2": 0.125, "layer_3": 0.0
    }


def test_composer_optimizer_monitor_names(tmp_path: Path) -> None:
    """Composer's OptimizerMonitor logs ``l2_norm/grad/global`` and one key per parameter
    (``l2_norm/grad/model.transformer.layers.0.attention.v``, as pasted in its issues)."""
    jsonl = tmp_path / "m.jsonl"
    row = {"batch": 10, "loss/train/total": 2.1, "l2_norm/grad/global": 0.9,
           "l2_norm/grad/model.transformer.layers.0.attention.v": 0.0002,
           "l2_norm/param/model.transformer.layers.0.attention.v": 51.2,
           "l2_norm/grad/pre_clip_global": 0.95}
    jsonl.write_text(json.dumps(row) + "\n")
    (rec,) = read_log(jsonl, mapping=parse_mapping(["batch=step"])).records
    assert rec.step == 10 and rec.grad_norm == 0.9
    assert rec.extra["grad_norm_layers"] == {"model.transformer.layers.0.attention.v": 0.0002}


def test_per_layer_arrays_and_dicts(tmp_path: Path) -> None:
    jsonl = tmp_path / "m.jsonl"
    rows = [{"step": 1, "grad_norm_layers": [0.5, math.inf]},
            {"step": 2, "grad_norms": {"layers.0": 0.4, "layers.1": 0.3}}]
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    one, two = read_log(jsonl).records
    assert one.extra["grad_norm_layers"] == {"layers.0": 0.5, "layers.1": math.inf}
    assert two.extra["grad_norm_layers"] == {"layers.0": 0.4, "layers.1": 0.3}
    state = _state(tmp_path, [{"step": 1, "loss": 2.0, "grad_norm_layers": [0.1, 0.2]},
                              {"step": 2, "loss": 1.9, "grad_norm/layers.5": 0.3}])
    first, second = read_log(state).records
    assert first.extra["grad_norm_layers"] == {"layers.0": 0.1, "layers.1": 0.2}
    assert second.extra["grad_norm_layers"] == {"layers.5": 0.3}


def test_a_plateau_is_judged_per_set() -> None:
    det = EvalLossDetector()
    out = []
    for i in range(12):
        named = {"flat": 1.5, "improving": 2.0 - 0.1 * i}
        out += det.update(StepRecord(step=100 * (i + 1), loss=2.0, extra={"eval_losses": named}))
    plateaus = [(f.code, f.data["eval_set"]) for f in out]
    assert plateaus == [("R111", "flat")]
    assert "eval loss on 'flat'" in out[0].message
