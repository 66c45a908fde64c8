"""S004: checkpointing leaves gradients unchanged, with dropout replayed; a checkpoint that
does not preserve the RNG state is caught. Non-HF models get their blocks wrapped."""

from __future__ import annotations

import smoke_planted

from sapper.smoke.runner import run_smoke
from sapper.smoke.step import DefaultTrainStep
from sapper.smoke.toy import user_factory


def test_hf_checkpointing_with_dropout_is_exact(gpt2) -> None:
    (s004,) = run_smoke(gpt2, checks=["checkpointing"]).findings
    assert s004.data["status"] == "pass", s004.message
    assert s004.data["stochastic"] is True  # GPT-2's dropout is on: the RNG replay is tested
    assert s004.data["saved_bytes_with"] < s004.data["saved_bytes_without"] / 2


def test_checkpoint_without_rng_state_is_caught(gpt2) -> None:
    step = DefaultTrainStep(
        checkpoint_kwargs={"use_reentrant": False, "preserve_rng_state": False}
    )
    (s004,) = run_smoke(gpt2, step=step, checks=["checkpointing"]).findings
    assert s004.data["status"] == "fail"
    assert s004.value > 0.01
    assert "dropout active" in s004.message


def test_user_model_blocks_are_checkpointed() -> None:
    factory = user_factory(smoke_planted.tiny_lm)
    (s004,) = run_smoke(factory, checks=["checkpointing"]).findings
    assert s004.data["status"] == "pass", s004.message
    assert s004.data["saved_bytes_with"] < s004.data["saved_bytes_without"]
