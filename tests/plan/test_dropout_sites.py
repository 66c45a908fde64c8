"""Dropout per site: an HF config's attention, hidden, embedding and activation dropouts
are kept apart (OPT drops its hidden states at 0.1 and its attention probabilities not at
all), and the memory model keeps a mask only where a site drops."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapper.memory.activations import attention_kernel
from sapper.memory.inputs import shape_from_plan
from sapper.plan.load import load_plan

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
SITES = ("attention", "hidden", "embedding", "activation")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("opt-350m.json", (0.0, 0.1, 0.1, 0.0)),  # dropout 0.1, attention_dropout 0.0
        ("gpt2.json", (0.1, 0.1, 0.1, 0.0)),  # attn_pdrop, resid_pdrop, embd_pdrop
        ("llama-2-7b.json", (0.0, 0.0, 0.0, 0.0)),  # attention_dropout only, 0.0
    ],
)
def test_each_site_is_read_on_its_own(config: str, expected: tuple[float, ...]) -> None:
    model = load_plan(hf_config=HF / config).plan.model
    assert tuple(model.dropout_at(site) for site in SITES) == expected


def test_no_attention_mask_where_attention_does_not_drop() -> None:
    """OPT on CPU: no attention dropout, so SDPA keeps its fused path (a dropout there
    would send it to the math path that keeps the s×s scores)."""
    plan = load_plan(hf_config=HF / "opt-350m.json").plan
    plan = plan.model_copy(update={"batch": plan.batch.model_copy(
        update={"micro_batch_size": 1, "seq_len": 512})})
    sh = shape_from_plan(plan)
    assert attention_kernel(sh, "cpu") == "sdpa"
    assert attention_kernel(sh.replace(attention_dropout=0.1), "cpu") == "eager"


def test_a_plan_that_sets_only_dropout_drops_everywhere_but_the_activation() -> None:
    from sapper.plan.schema import ModelSpec

    m = ModelSpec.model_validate({"hidden_size": 64, "num_layers": 2, "num_heads": 4,
                                  "vocab_size": 100, "dropout": 0.2})
    assert [m.dropout_at(site) for site in SITES] == [0.2, 0.2, 0.2, 0.0]
