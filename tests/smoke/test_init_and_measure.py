"""S009 init health on a healthy toy and on a 50× too large init; S010 measured memory
next to the estimator's numbers, and the saved-tensor meter on its own."""

from __future__ import annotations

import json

import smoke_planted
import torch
from tests_smoke_paths import LLAMA_TOY

from sapper.smoke.measure import SavedTensorMeter
from sapper.smoke.runner import run_smoke
from sapper.smoke.toy import hf_toy_factory, user_factory


def test_healthy_init_passes(llama) -> None:
    (s009,) = run_smoke(llama, checks=["init_health"]).findings
    assert s009.data["status"] == "pass", s009.message
    assert len(s009.data["activation_std"]) == 4
    assert s009.data["amplification"] < 2


def test_too_large_init_is_caught(tmp_path) -> None:
    config = json.loads(LLAMA_TOY.read_text()) | {"initializer_range": 1.0}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    (s009,) = run_smoke(hf_toy_factory(path), checks=["init_health"]).findings
    assert s009.data["status"] == "fail"
    assert s009.data["amplification"] > 100
    assert s009.severity.value == "warning"


def test_measured_memory_matches_the_estimate(llama) -> None:
    (s010,) = run_smoke(llama, checks=["measure"]).findings
    assert s010.data["status"] == "pass", s010.message
    measured, estimated = s010.data["measured"], s010.data["estimated"]
    for cat in ("params", "grads", "optimizer"):
        assert measured[cat] == estimated[cat]
    assert measured["params"] == sum(p.numel() * 4 for p in llama.build(0).parameters())
    assert 0.5 < measured["activations"] / estimated["activations"] < 2
    assert measured["step_time_s"] > 0


def test_a_factory_model_is_measured_without_estimate() -> None:
    (s010,) = run_smoke(user_factory(smoke_planted.tiny_lm), checks=["measure"]).findings
    assert s010.data["estimated"] is None
    assert s010.data["measured"]["activations"] > 0
    assert "no estimate" in s010.message


def test_a_factory_hf_model_is_estimated_from_its_config() -> None:
    """--factory returning a Hugging Face model: S010 reads model.config."""
    (s010,) = run_smoke(user_factory(smoke_planted.hf_llama_lm), checks=["measure"]).findings
    estimated, measured = s010.data["estimated"], s010.data["measured"]
    assert estimated is not None, s010.message
    for cat in ("params", "grads", "optimizer"):
        assert measured[cat] == estimated[cat]
    assert s010.data["status"] == "pass", s010.message


def test_saved_tensor_meter_counts_activations_once() -> None:
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64)
    with SavedTensorMeter(exclude=[w]) as meter:
        h = torch.tanh(x @ w)  # saves x (matmul) and tanh's output; w excluded
        y = (h * h).sum()  # saves h twice: one storage
    assert meter.peak_bytes == 2 * 32 * 64 * 4
    y.backward()
    del h, y
    assert meter.live_bytes == 0
