"""S005/S006: bf16 and fp16 gradients agree with fp32 on a correct toy; a model whose
activations pass 65504 is caught by the headroom check and by fp16 agreement."""

from __future__ import annotations

import math

import smoke_planted

from sapper.smoke.precision import FP16_MAX
from sapper.smoke.runner import run_smoke
from sapper.smoke.toy import user_factory


def test_low_precision_agrees_on_a_correct_toy(llama) -> None:
    report = run_smoke(llama, checks=["precision"])
    agree = [f for f in report.findings if f.code == "S005"]
    assert [f.data["precision"] for f in agree] == ["bf16", "fp16"]
    for f in agree:
        assert f.data["status"] == "pass", f.message
        assert f.data["min_layer_cosine"] > 0.999
    (headroom,) = [f for f in report.findings if f.code == "S006"]
    assert headroom.data["status"] == "pass"
    assert headroom.value < FP16_MAX / 1000  # a healthy toy is far from the limit
    assert report.exit_code() == 0


def test_fp16_overflow_is_caught() -> None:
    report = run_smoke(user_factory(smoke_planted.overflowing_lm), checks=["precision"])
    by = {(f.code, f.data.get("precision")): f for f in report.findings}
    headroom = by[("S006", None)]
    assert headroom.data["status"] == "fail"
    assert headroom.value > FP16_MAX
    assert headroom.data["largest_module"].startswith("blocks.")
    assert headroom.data["first_nonfinite_in_fp16"] is not None
    fp16 = by[("S005", "fp16")]
    assert fp16.data["status"] == "fail"
    # bf16 has fp32's range: the same model is fine there
    bf16 = by[("S005", "bf16")]
    assert math.isfinite(bf16.data["rel_err"])
    assert report.exit_code() == 1


def test_a_loss_that_overflows_fp16_is_named_as_the_loss_not_the_scale() -> None:
    """The model's activations fit fp16; the hand-written loss's exp does not. S005 says the
    loss overflowed (no loss scale helps), S006 covers the loss computation."""
    report = run_smoke(
        user_factory(smoke_planted.tiny_lm),
        step=smoke_planted.SharpenedLossInHalf(),
        checks=["precision"],
    )
    by = {(f.code, f.data.get("precision")): f for f in report.findings}
    fp16 = by[("S005", "fp16")]
    assert fp16.data["status"] == "fail"
    assert fp16.data["first_nonfinite_phase"] == "loss"
    assert fp16.data["first_nonfinite_op"] == "exp"
    assert "loss computation" in fp16.message and "even at loss scale" not in fp16.message
    assert "logits.float()" in fp16.fix
    assert by[("S005", "bf16")].data["status"] == "pass"  # bf16 has the range
    headroom = by[("S006", None)]
    assert headroom.data["status"] == "fail"
    assert headroom.data["loss_first_nonfinite_op"] == "exp"
    assert headroom.value < 100  # the model's own activations are small
    assert "the loss computation overflows fp16" in headroom.message


def test_a_forward_overflow_is_named_by_its_module() -> None:
    report = run_smoke(user_factory(smoke_planted.overflowing_lm), checks=["precision"])
    fp16 = next(f for f in report.findings if f.data.get("precision") == "fp16")
    assert fp16.data["first_nonfinite_phase"] == "forward"
    assert fp16.data["first_nonfinite_module"] == "blocks.0"
    assert "before any loss scaling" in fp16.message


def test_the_trace_of_a_healthy_step_is_finite(llama) -> None:
    from sapper.smoke.batches import SyntheticTokens, take
    from sapper.smoke.step import DefaultTrainStep
    from sapper.smoke.trace import trace_step

    batch = take(SyntheticTokens(512, 32, 2), 1)
    trace = trace_step(llama.build(0).eval(), DefaultTrainStep(), batch, "fp16", 1.0)
    assert trace.phase is None and math.isfinite(trace.loss)
    assert 0 < trace.loss_max_low < 100  # the fp16 logits sliced before .float()
