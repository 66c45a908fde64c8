"""``sapper diagnose``: the causal map is consistent with the rule catalogue; planted
faults in real tiny training runs are named by their cause; real public logs whose
authors documented no cause get ``unknown`` or nothing, never a confident wrong cause;
healthy runs get no cause and exit 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.rules.causes import BLOW_UP, CAUSES, CHECKS
from sapper.rules.registry import all_rules

ROOT = Path(__file__).parent.parent
FAULTS = ROOT / "fixtures" / "diagnose"
REAL = ROOT / "fixtures" / "logs"
EXAMPLES = ROOT.parent / "examples"
#: An fp16 Megatron fine-tune whose dynamic loss scale fell 64 -> 0.1 before NaN.
SCALE_COLLAPSE = REAL / "megatron-issues" / "thudm-chinese-transformer-xl-7-loss-scale-0.1.log"
runner = CliRunner()
_register_commands()


def diagnose(*args: str) -> tuple[int, dict]:
    res = runner.invoke(app, ["diagnose", *args, "--format", "json"])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout)


def test_every_code_the_map_names_is_a_rule_and_every_check_is_known() -> None:
    codes = {r.code for r in all_rules()}
    for cause in CAUSES:
        assert cause.check in CHECKS
        assert set(cause.signs) <= codes, cause.id
        assert cause.symptoms <= codes, cause.id
        assert cause.fix and cause.next_test
    assert codes >= BLOW_UP
    assert len({c.id for c in CAUSES}) == len(CAUSES)


def test_every_runtime_error_rule_is_a_symptom_or_a_sign() -> None:
    """An error-severity runtime finding nothing in the map knows would leave diagnose
    saying 'healthy' about a run that broke."""
    known = set(BLOW_UP) | {code for c in CAUSES for code in c.signs}
    for rule in all_rules():
        if rule.code[0] in "RX" and rule.severity.value == "error":
            assert rule.code in known, rule.code


@pytest.mark.parametrize(
    ("log", "cause", "check"),
    [
        ("positions.jsonl", "positions", "data"),
        ("postln.jsonl", "post-ln-warmup", "normalization"),
        ("accum.jsonl", "accumulation", "accumulation"),
        ("cycle.jsonl", "data-repeat", "data"),
        ("unscale.jsonl", "clip-before-unscale", "scaler"),
        ("overflow.jsonl", "fp16-overflow", "precision"),
        ("schedule.jsonl", "lr-schedule", "lr"),
        ("leak.jsonl", "memory", "memory"),
        ("setup.jsonl", "optimizer-setup", "init"),
        # A NaN from one corrupt record at step 25; the run resumed from step 11 with
        # the data position restored, and it came back at step 25 ...
        ("restart-same-step.jsonl", "bad-data", "data"),
        # ... or (a transient fault at step 25) it did not, reading the same samples.
        ("restart-gone.jsonl", "hardware", "hardware"),
    ],
)
def test_a_planted_fault_is_named_by_its_cause(log: str, cause: str, check: str) -> None:
    code, doc = diagnose(str(FAULTS / log))
    assert code == 1
    (named,) = doc["causes"]
    assert (named["cause"], named["check"]) == (cause, check)
    assert named["confidence"] >= 0.5 and named["fix"] and named["evidence"]
    assert all({"code", "step", "source", "message"} <= set(e) for e in named["evidence"])


def test_each_attempts_stored_findings_stay_its_own() -> None:
    """A resumed run logs its NaN again at the same step: the run log's stored findings
    are tagged with their attempt, so the second one is not merged into the first."""
    from sapper.pipeline.logs import analyze_logs, load_logs

    loaded, _ = load_logs([FAULTS / "restart-same-step.jsonl"], None, None)
    (analysis,) = analyze_logs(loaded, None, [], [])
    nans = [(f.step, f.data.get("attempt")) for f in analysis.findings if f.code == "R001"]
    assert nans == [(25, 1), (25, 2)]


def test_restart_evidence_says_the_samples_were_the_same() -> None:
    _, doc = diagnose(str(FAULTS / "restart-same-step.jsonl"))
    (named,) = doc["causes"]
    restart = next(e for e in named["evidence"] if "attempts 1-2" in e["source"])
    assert "came back at step 25" in restart["message"]
    assert "the same samples" in restart["message"]


def test_a_healthy_run_has_no_cause_and_exits_0() -> None:
    code, doc = diagnose(str(FAULTS / "healthy.jsonl"))
    assert (code, doc["causes"], doc["summary"]["verdict"]) == (0, [], "healthy")


def test_fp16_scale_collapse_before_the_nan_is_the_precision_cause() -> None:
    _, doc = diagnose(str(SCALE_COLLAPSE))
    (named,) = doc["causes"]
    # The scale fell from its peak of 64 at the record of 500; R030 was sure at 600.
    assert named["cause"] == "fp16-overflow" and named["first_step"] == 500
    assert [e["code"] for e in named["evidence"]] == ["R030", "R001"]  # in time order


@pytest.mark.parametrize(
    "log",
    [
        "bigscience/tr11-176B-spike-31216.log",  # bf16 spike that recovered by itself
        "bigscience/tr8-104B-exp1-exp2-rollback-6210.log",  # spiked again after a rollback
        "bigscience/tr1-13B-spike-29050.log",
        "nanogpt/nanogpt-215-gpt2-fp16-nan-3010.txt",
    ],
)
def test_undocumented_causes_are_unknown_with_a_next_test(log: str) -> None:
    code, doc = diagnose(str(REAL / log))
    assert code == 1
    (answer,) = doc["causes"]
    assert answer["check"] == "unknown" and answer["next_test"]
    assert all(c["confidence"] < 0.5 for c in answer["candidates"])


def test_a_rollback_that_spiked_again_elsewhere_points_at_the_optimisation() -> None:
    _, doc = diagnose(str(REAL / "bigscience" / "tr8-104B-exp1-exp2-rollback-6210.log"))
    lead = doc["causes"][0]["candidates"][0]
    assert lead["cause"] == "lr-too-high"
    assert any("came back" in e["message"] for e in lead["evidence"])


@pytest.mark.parametrize(
    "log",
    [
        "hf/tinyllama-sft-healthy.trainer_state.json",
        "hf/whisper-bashkir-noisy.trainer_state.json",
        "megatron-examples/megatron-345m-fp16-5000it.log",
        "megatron-issues/nvidia-nccl-743-bert-fp16-start.log",
        "nanogpt/nanogpt-178-shakespeare-char-healthy.txt",
        "recorded/noisy-bursts.csv",
        "hf_console/sentence-transformers-2449-eval-sets.txt",
    ],
)
def test_healthy_public_runs_get_no_cause(log: str) -> None:
    code, doc = diagnose(str(REAL / log))
    assert (code, doc["causes"]) == (0, [])


def test_a_config_finding_supports_the_cause_it_predicts() -> None:
    plan = str(EXAMPLES / "plans" / "broken-fp16-static-scale.yaml")
    _, doc = diagnose(str(SCALE_COLLAPSE), "--plan", plan)
    ranked = [*doc["considered"], *doc["causes"], *doc["causes"][0].get("candidates", [])]
    assert "loss-scaling" in {c["cause"] for c in ranked}
    assert doc["summary"]["config"]


def test_text_output_reads_cause_evidence_fix() -> None:
    res = runner.invoke(app, ["diagnose", str(FAULTS / "positions.jsonl")])
    assert res.exit_code == 1
    for word in ("Cause:", "Evidence, in time order:", "Fix:", "To confirm:", "R091"):
        assert word in res.output


def test_an_unreadable_log_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("nothing here\n")
    res = runner.invoke(app, ["diagnose", str(bad)])
    assert res.exit_code == 2 and "Traceback" not in res.output


@pytest.mark.parametrize(("log", "precision"), [("overflow.jsonl", "fp16"),
                                                ("restart-same-step.jsonl", "fp32")])
def test_the_monitors_precision_decides_which_mechanics_are_in_play(
    log: str, precision: str
) -> None:
    """The live monitor records the forward's precision (autocast fp16 over fp32
    weights, or plain fp32): an fp32 run is never offered an fp16 cause."""
    _, doc = diagnose(str(FAULTS / log))
    assert doc["summary"]["precision"] == precision
    offered = {c["cause"] for c in [*doc["causes"], *doc["considered"]]}
    assert ("fp16-overflow" in offered) == (precision == "fp16")


def test_a_field_the_config_never_set_is_no_evidence() -> None:
    """Only --dtype given: clipping is unknown, not off (the HF Trainer clips at 1.0 by
    default), so "clipping is not set" does not point at no-clipping."""
    log = REAL / "hf_console" / "llamafactory-4202-glm4-fp16-v100-nan.txt"
    _, doc = diagnose(str(log), "--dtype", "fp16")
    ranked = [*doc["causes"], *doc["considered"], *doc["causes"][0].get("candidates", [])]
    assert "no-clipping" not in {c["cause"] for c in ranked}
    _, doc = diagnose(str(log), "--dtype", "fp16", "--max-norm", "0")  # stated: off
    ranked = [*doc["causes"], *doc["considered"], *doc["causes"][0].get("candidates", [])]
    assert "no-clipping" in {c["cause"] for c in ranked}
