"""S003: accumulation equals the large batch for a correct step; the per-micro-batch mean
(the 2024 trainer bug) is caught, on padded data, and only there."""

from __future__ import annotations

from smoke_planted import PerMicroBatchMean

from sapper.smoke.batches import SyntheticTokens
from sapper.smoke.context import SmokeConfig, SmokeContext
from sapper.smoke.runner import run_smoke
from sapper.smoke.step import DefaultTrainStep

TOL = SmokeConfig().tolerances.fp32_rel_err


def test_correct_step_is_equivalent(llama) -> None:
    (s003,) = run_smoke(llama, checks=["accumulation"]).findings
    assert s003.data["status"] == "pass"
    for case in ("as given", "uneven padding"):
        assert s003.data[case]["rel_err"] < TOL
    given = s003.data["uneven padding"]["tokens_per_micro_batch"]
    assert len(set(given)) == len(given), "the re-cut must give uneven token counts"


def test_per_micro_batch_mean_is_caught(llama) -> None:
    report = run_smoke(llama, step=PerMicroBatchMean(), checks=["accumulation"])
    (s003,) = report.findings
    assert s003.data["status"] == "fail"
    assert s003.data["uneven padding"]["rel_err"] > 100 * TOL
    assert "averaged per micro-batch" in s003.message
    assert report.exit_code() == 1


def test_packed_data_alone_hides_the_bug(llama) -> None:
    """Why the check re-cuts the data: fixed-length sequences without padding give every
    micro-batch the same token count, and the buggy mean is then exact."""
    from sapper.smoke.accumulation import accumulation_vs_batch

    packed = SyntheticTokens(512, 32, 4, variable_length=False)
    ctx = SmokeContext.create(llama, packed, PerMicroBatchMean(), SmokeConfig())
    assert accumulation_vs_batch(ctx, ctx.batches(2)).rel_err < TOL
    ctx.step = DefaultTrainStep()
    assert accumulation_vs_batch(ctx, ctx.batches(2)).rel_err < TOL


def test_each_cause_is_named_by_its_probe(llama) -> None:
    """Four different bugs fail S003; the probes tell them apart and give each its fix."""
    from smoke_planted import TargetsFromInputIds, ZeroGradEachMicroBatch, stateful_lm

    from sapper.smoke.toy import user_factory

    cases = [
        (llama, PerMicroBatchMean(), "per-micro-batch average", "averaged per micro-batch"),
        (llama, TargetsFromInputIds(), "unmasked padding", "padding reaches the loss"),
        (user_factory(stateful_lm), DefaultTrainStep(), "stateful layer", "carries state"),
        (llama, ZeroGradEachMicroBatch(), "not summed", "zero_grad"),
    ]
    for factory, step, cause, words in cases:
        (s003,) = run_smoke(factory, step=step, checks=["accumulation"]).findings
        assert s003.data["status"] == "fail", (cause, s003.message)
        assert s003.data["cause"] == cause, (cause, s003.data["probes"], s003.message)
        assert words in s003.message
        if cause != "per-micro-batch average":
            assert "num_items_in_batch" not in s003.fix  # the fix of the cause, not the rule's
