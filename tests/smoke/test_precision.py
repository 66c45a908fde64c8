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
