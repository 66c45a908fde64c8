"""Layout validation names the rule and shows the arithmetic."""

from __future__ import annotations

from typing import Any

from sapper.parallel import validate
from sapper.rules.model import Severity

from .conftest import gpt_plan


def _issues(**over: Any) -> dict[str, list]:
    out: dict[str, list] = {}
    for i in validate(gpt_plan(**over)):
        out.setdefault(i.code, []).append(i)
    return out


def test_healthy_plan_is_clean() -> None:
    assert {c for c, v in _issues().items() if v[0].severity != Severity.INFO} == set()


def test_world_size_arithmetic() -> None:
    (i,) = _issues(parallel={"tp": 2, "pp": 1, "dp": 4})["P101"]
    assert i.message == "tp(2) * pp(1) * cp(1) * dp(4) = 8 != GPUs(16)"
    assert i.fix == "set dp to 8 (or -1 to infer it)"


def test_dp_not_inferable() -> None:
    (i,) = _issues(parallel={"tp": 3})["P102"]
    assert i.message == "dp=-1 cannot be inferred: GPUs(16) % (tp(3) * pp(1) * cp(1) = 3) = 1"


def test_heads_and_gqa() -> None:
    model = {"hidden_size": 4096, "num_layers": 32, "num_heads": 32, "num_kv_heads": 8,
             "vocab_size": 32000}
    hw = {"gpu": "H100", "num_gpus": 48}
    (i,) = _issues(model=model, parallel={"tp": 6}, hardware=hw)["P104"]
    assert i.message.startswith("num_heads(32) % tp(6) = 2")
    model["num_heads"] = 48
    (i,) = _issues(model=model, parallel={"tp": 6}, hardware=hw)["P104"]
    assert "num_kv_heads(8) vs tp(6): neither 8 % 6 == 0 nor 6 % 8 == 0" in i.message
    model["num_kv_heads"] = 2
    (i,) = _issues(model=model, parallel={"tp": 6}, hardware=hw)["P104"]
    assert i.severity == Severity.INFO and "replicated on 3 ranks" in i.message


def test_tp_beyond_node_names_both_bandwidths() -> None:
    (i,) = _issues(parallel={"tp": 16})["P103"]
    assert "tp(16) > gpus_per_node(8)" in i.message
    assert "300 GB/s (NVLink) to 200 GB/s (network, 8 NIC(s) per node)" in i.message


def test_micro_batches_below_stages_shows_the_bubble() -> None:
    got = _issues(parallel={"pp": 8, "dp": 2}, batch={"seq_len": 1024, "micro_batch_size": 4,
                                                      "gradient_accumulation_steps": 4})
    (i,) = got["P108"]
    assert i.severity == Severity.ERROR
    assert "micro-batches per step(4) < pp(8)" in i.message
    assert "(p-1)/(m+p-1) = 7/11 = 64% of the step" in i.message


def test_large_bubble_warns_with_the_fix() -> None:
    got = _issues(parallel={"pp": 8, "dp": 2}, batch={"seq_len": 1024, "micro_batch_size": 1,
                                                      "gradient_accumulation_steps": 8})
    (i,) = got["P108"]
    assert i.severity == Severity.WARNING
    assert "(p-1)/(m+p-1) = 7/15: 47% of the step idle" in i.message
    assert i.fix is not None and "≥ 63 micro-batches" in i.fix


def test_layers_and_virtual_stages() -> None:
    (i,) = _issues(parallel={"pp": 5, "dp": -1}, hardware={"gpu": "A100-80GB",
                                                          "num_gpus": 20})["P107"]
    assert i.message.startswith("num_layers(48) % pp(5) = 3: chunks hold 10 or 9 layers")
    (i,) = _issues(parallel={"pp": 1, "virtual_pipeline_stages": 2})["P107"]
    assert i.severity == Severity.ERROR
    (i,) = _issues(parallel={"pp": 16, "virtual_pipeline_stages": 4})["P107"]
    assert "pp(16) * virtual_pipeline_stages(4) = 64 > num_layers(48)" in i.message
    (i,) = _issues(parallel={"pp": 4, "first_stage_layers": 10, "last_stage_layers": 9})[
        "P107"
    ]
    assert "the other 48 - 19 = 29 layers do not split evenly over the remaining 2" in i.message
    assert "P107" not in _issues(parallel={"pp": 4, "first_stage_layers": 11,
                                           "last_stage_layers": 11})


def test_sequence_and_context_parallel() -> None:
    assert "P109" in _issues(parallel={"sequence_parallel": True})
    (i,) = _issues(parallel={"cp": 4}, batch={"seq_len": 1020, "micro_batch_size": 1})["P110"]
    assert i.message.startswith("seq_len(1020) % (2 * cp(4)) = 4: ")
    assert "P110" not in _issues(parallel={"cp": 4}, batch={"seq_len": 1024,
                                                             "micro_batch_size": 1})


def test_zero_with_pipeline_and_rank_order() -> None:
    (i,) = _issues(parallel={"pp": 2, "zero_stage": 3})["P111"]
    assert "zero_stage(3) with pp(2)" in i.message and "each of the 8 micro-batches" in i.message
    (i,) = _issues(parallel={"rank_order": "tp-dp"})["P112"]
    assert i.severity == Severity.ERROR
    (i,) = _issues(parallel={"tp": 8, "rank_order": "dp-tp-cp-pp"})["P112"]
    assert "puts each TP group of 8 on 2 nodes (4 rank(s) per node)" in i.message


def test_expert_parallel() -> None:
    (i,) = _issues(parallel={"ep": 2})["P113"]
    assert "dense model" in i.message
    moe = {"hidden_size": 1024, "num_layers": 8, "num_heads": 16, "vocab_size": 32000,
           "num_experts": 8, "experts_top_k": 2}
    (i,) = _issues(model=moe, parallel={"ep": 3})["P113"]
    assert i.message.startswith("dp(16) % ep(3) = 1")
    assert "P105" in _issues(model=moe, parallel={"ep": 3})
