"""S011 on the user's own batches: a collator that copies input_ids into the labels without
-100 at padding is caught (with and without an attention mask); transformers'
DataCollatorForLanguageModeling, a packed loader and a step that masks padding itself pass."""

from __future__ import annotations

import torch
from smoke_planted import (
    MasksByAttention,
    hf_collator_loader,
    sharded_loader,
    unmasked_labels_loader,
    unmasked_labels_no_mask_loader,
)

from sapper.smoke.batches import LoaderFactory, SyntheticTokens
from sapper.smoke.padding import padded_positions
from sapper.smoke.runner import run_smoke
from sapper.smoke.step import DefaultTrainStep
from sapper.smoke.toy import ModelFactory


def _s011(factory: ModelFactory, source, step=None):
    report = run_smoke(factory, source=source, step=step, checks=["padding"])
    (s011,) = report.findings
    assert s011.code == "S011"
    return s011, report


def test_labels_copied_from_padded_ids_are_caught(llama) -> None:
    s011, report = _s011(llama, LoaderFactory(unmasked_labels_loader))
    assert s011.data["status"] == "fail", s011.message
    assert s011.data["padded_positions"] > 0
    assert s011.data["padded_with_labels"] == s011.data["padded_positions"]
    assert s011.data["loss_rel_change"] > 1e-3
    assert s011.data["grad_rel_err"] > 1e-3
    assert "labels = input_ids" in s011.message
    assert report.exit_code() == 1


def test_without_an_attention_mask_the_pad_id_finds_the_padding(llama) -> None:
    factory = _with_pad_id(llama, 0)
    s011, _ = _s011(factory, LoaderFactory(unmasked_labels_no_mask_loader))
    assert s011.data["status"] == "fail", s011.message
    assert s011.data["padding_found_by"] == "trailing pad id 0"


def test_hf_data_collator_is_silent(llama) -> None:
    s011, _ = _s011(llama, LoaderFactory(hf_collator_loader))
    assert s011.data["status"] == "pass", s011.message
    assert s011.data["padded_positions"] > 0 and s011.data["padded_with_labels"] == 0


def test_a_step_that_masks_padding_itself_passes(llama) -> None:
    s011, _ = _s011(llama, LoaderFactory(unmasked_labels_loader), MasksByAttention())
    assert s011.data["status"] == "pass", s011.message
    assert s011.data["padded_with_labels"] > 0
    assert s011.data["grad_rel_err"] == 0.0
    assert "ignores them" in s011.message


def test_correct_and_packed_sources_pass(llama) -> None:
    s011, _ = _s011(llama, LoaderFactory(sharded_loader))
    assert s011.data["status"] == "pass" and s011.data["padded_with_labels"] == 0
    packed = SyntheticTokens(512, 32, 4, variable_length=False)
    s011, _ = _s011(llama, packed, DefaultTrainStep())
    assert s011.data["status"] == "pass" and s011.data["padded_positions"] == 0
    assert "no padding" in s011.message


def test_trailing_pad_run_only() -> None:
    batch = {
        "input_ids": torch.tensor([[5, 0, 7, 0, 0], [1, 2, 3, 4, 5]]),
        "attention_mask": torch.ones(2, 5, dtype=torch.long),
    }
    assert padded_positions(batch, 0).tolist() == [
        [False, False, False, True, True],
        [False] * 5,
    ]
    assert not padded_positions(batch, None).any()


def _with_pad_id(factory: ModelFactory, pad: int) -> ModelFactory:
    import functools

    from sapper.smoke.toy import build_hf_model

    config = dict(factory.hf_config or {}, pad_token_id=pad)
    return ModelFactory(functools.partial(build_hf_model, config), "llama toy, pad 0", config)


def test_a_steps_own_negative_ignore_label_is_not_perturbed() -> None:
    """A collator that marks padding with -1 for a step using ignore_index=-1 is correct:
    negative labels are never changed into targets."""
    from sapper.smoke.padding import perturb_padded_labels

    batch = {
        "input_ids": torch.tensor([[5, 6, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 0, 0]]),
        "labels": torch.tensor([[5, 6, -1, 0]]),
    }
    out, changed = perturb_padded_labels(batch, padded_positions(batch, None), 8)
    assert changed == 1
    assert out["labels"].tolist() == [[5, 6, -1, 1]]
