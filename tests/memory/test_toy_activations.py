"""The analytic activations agree with the traced ones on toy-scale models.

Toys (what ``sapper smoke`` trains) are each family's default Hugging Face config scaled
down: tiny widths, a vocabulary of 512, dropout as the family ships it. At that scale
terms that vanish at full scale dominate (attention scores at head_dim 16, the
embedding's dropout mask, sandwich and query/key norms, soft-capping, MoE routing
bookkeeping, parallel blocks), and PyTorch's CPU attention falls back to its math path
when dropout is on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sapper.memory import MemoryOptions, estimate
from sapper.memory.traced import StepConfig, trace_hf_config
from sapper.plan.load import build_plan
from sapper.plan.readers.hf_config import read_hf_config
from sapper.plan.schema import Plan
from sapper.plan.sources import PlanSource
from sapper.smoke.toy import shrink_hf_config

MICRO, SEQ = 4, 64


def _toy(family: str) -> dict:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    toy, _ = shrink_hf_config(CONFIG_MAPPING[family]().to_dict())
    return toy


def _plan(toy: dict, tmp: Path) -> Plan:
    path = tmp / "config.json"
    path.write_text(json.dumps(toy, default=str))
    over = PlanSource(name="test")
    over.set("batch.micro_batch_size", MICRO)
    over.set("batch.seq_len", SEQ)
    over.set("batch.gradient_accumulation_steps", 1)
    over.set("precision.dtype", "fp32")
    over.set("optimizer.type", "adamw")
    return build_plan([read_hf_config(path), over]).plan


@pytest.mark.parametrize(
    "family",
    [
        "gpt2",  # dropout 0.1: CPU SDPA runs the math path; embedding dropout mask
        "gpt_bigcode",  # multi-query attention, dropout
        "gemma2",  # sandwich norms, soft-capped scores and logits, eager only
        "mixtral",  # routed experts: gathered inputs, expert outputs, routing weights
        "gemma3_text",  # sandwich norms and per-head query/key norms
        "qwen3_moe",  # query/key norms and routed experts
        "gptj",  # parallel block: attention and MLP share one norm
    ],
)
def test_analytic_activations_match_traced_on_toys(family: str, tmp_path: Path) -> None:
    toy = _toy(family)
    # real tensors: a toy step is milliseconds
    traced = trace_hf_config(toy, StepConfig(micro_batch=MICRO, seq_len=SEQ), fake=False)
    measured = traced.phases["forward"]["activations"]
    est = estimate(
        _plan(toy, tmp_path),
        MemoryOptions(context_bytes=0, nccl_bytes=0, fragmentation=0.0, device="cpu"),
    )
    analytic = est.stages[est.peak_stage].phases["forward"]["activations"]
    assert analytic == pytest.approx(measured, rel=0.05), (family, measured, analytic)
