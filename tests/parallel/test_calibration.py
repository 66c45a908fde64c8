"""Calibration against published runs (issues 4 and 12: within ±20% on every row).

Narayanan et al. 2021 Table 1 (hardware FLOP rate, recomputation counted), Llama 3 405B
at 8K and 128K context (model FLOP rate), and the held-out rows: Megatron-Core's H100
weak-scaling table from 1.7B to 462B (model FLOPs) and BLOOM 176B on A100 (hardware
FLOPs). Every published layout must validate; the planner's choice must be predicted at
least as fast as the published layout.
"""

from __future__ import annotations

import pytest

from sapper.memory import estimate
from sapper.model import architecture_from_plan, total_params
from sapper.parallel import predict_step, search, validate
from sapper.parallel.published import FLOP_DEFINITIONS, PUBLISHED_RUNS, PublishedRun
from sapper.rules.model import Severity

ids = [r.name for r in PUBLISHED_RUNS]


def _predicted(run: PublishedRun) -> float:
    cost = predict_step(run.to_plan())
    return cost.hardware_tflops_per_gpu if run.convention == "hardware" else (
        cost.model_tflops_per_gpu
    )


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=ids)
def test_within_20_percent(run: PublishedRun) -> None:
    assert _predicted(run) == pytest.approx(run.tflops, rel=0.20)


def test_held_out_rows_span_sizes_gpus_and_context() -> None:
    held = [r for r in PUBLISHED_RUNS if r.held_out]
    mcore = [r for r in held if r.flops == "mcore"]
    assert len(mcore) == 9  # 1.7B ... 462B on H100
    sizes = [total_params(architecture_from_plan(r.to_plan())) for r in mcore]
    assert sizes == sorted(sizes) and sizes[0] < 2e9 and sizes[-1] > 4.5e11
    assert any(r.flops == "bloom" and r.to_plan().gpu.name == "A100-80GB" for r in held)  # type: ignore[union-attr]
    assert any(r.to_plan().batch.seq_len == 131072 for r in held)


def test_small_and_long_context_errors_are_within_the_band() -> None:
    """The cases the issue found +25-40% off: the small end of the weak-scaling table and
    the 128K-context layout; and the TP8 layouts it under-predicted."""
    by = {r.name: r for r in PUBLISHED_RUNS}
    for name in ("MCore GPT 1.7B", "MCore GPT 7.1B", "Llama 3 405B, 16384 GPUs, 128K context",
                 "MCore GPT 32B", "MCore GPT 70B"):
        assert abs(_predicted(by[name]) / by[name].tflops - 1) < 0.20, name


def test_every_row_states_its_flop_convention() -> None:
    for run in PUBLISHED_RUNS:
        assert run.flops in FLOP_DEFINITIONS
        assert FLOP_DEFINITIONS[run.flops].startswith(run.convention)


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=ids)
def test_published_layout_validates(run: PublishedRun) -> None:
    errors = [i.message for i in validate(run.to_plan()) if i.severity == Severity.ERROR]
    assert errors == []


_LLAMA_MEMORY = pytest.mark.xfail(
    strict=True,
    reason="the memory model (7/8/.../8/7 layers, Megatron's interleaved schedule at the "
    "assumed v=2, Megatron activation profile, SP, bf16, ZeRO-1) peaks on stage 1: 8 "
    "layers, 2(p-2)+(v-1)p+1 = 45 chunk micro-batches (22.5 stages' worth) at 8192 GPUs "
    "(m=32) → 109.1 GiB; all 32 chunks (16 micro-batches) at 16384 GPUs (m=16) → 81.7 GiB "
    "> 80 GiB (the 128K-context layout, CP16, holds the same 8192 tokens per GPU: the same "
    "81.7 GiB). Plain 1F1B fits (77.9 / 77.6 GiB). The paper trained it without "
    "checkpointing under its own schedule (tunable micro-batches per round, tensors freed "
    "early), which the estimate does not model",
)


@pytest.mark.parametrize(
    "run",
    [pytest.param(r, marks=_LLAMA_MEMORY) if "Llama" in r.name else r for r in PUBLISHED_RUNS],
    ids=ids,
)
def test_published_layout_fits(run: PublishedRun) -> None:
    assert estimate(run.to_plan()).fits


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=ids)
def test_planner_at_least_as_fast(run: PublishedRun) -> None:
    """As fast as the published layout wherever sapper's own checks pass that layout;
    where they flag it (no 10% memory headroom, TP across nodes ...) the planner must not
    propose it, so its choice is compared only with the checks."""
    plan = run.to_plan()
    res = search(plan, top=1, explain=False)
    # every published layout is searched (BLOOM's lighter first and last stages too),
    # so the search always finds a layout that fits
    assert res.best is not None
    est = estimate(plan)
    flagged = [x.code for x in validate(plan) if x.severity != Severity.INFO]
    if est.headroom_bytes is not None and est.headroom_bytes < 0.1 * (est.gpu_bytes or 0):
        flagged.append("M003")
    if not flagged:
        assert res.best.cost.step_time_s <= predict_step(plan).step_time_s * 1.0001
    chosen = res.best.layout.apply(plan)
    assert not [x for x in validate(chosen) if x.severity != Severity.INFO]
