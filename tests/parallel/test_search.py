"""The planner: every valid layout, ranked, memory-checked, explained."""

from __future__ import annotations

import numpy as np
import pytest

from sapper.errors import InputError
from sapper.parallel import search, validate
from sapper.parallel.candidate import layout_at
from sapper.parallel.cost import evaluate
from sapper.parallel.published import PUBLISHED_RUNS
from sapper.parallel.search import _rank, default_memory_check, enumerate_layouts
from sapper.plan.schema import Plan
from sapper.rules.model import Severity

from .conftest import gpt_plan


def test_every_enumerated_layout_is_valid(plan: Plan) -> None:
    batch, _, cluster = enumerate_layouts(plan)
    world = batch.tp * batch.pp * batch.cp * batch.dp
    assert (world == 16).all()
    assert (batch.micro * batch.ga * batch.dp == 256).all()
    assert (25 % batch.tp == 0).all()  # heads
    assert ((batch.pp == 1) | (batch.ga >= batch.pp)).all()
    assert ((batch.v == 1) | (48 % (batch.pp * batch.v) == 0)).all()
    assert cluster.gpus == 16
    # ZeRO 0-3 x {none, full} for each structural layout (flash-style attention)
    assert len(batch) % 8 == 0


def test_ranked_fastest_first_and_valid(plan: Plan) -> None:
    res = search(plan, top=4)
    assert len(res.top) == 4
    times = [c.cost.step_time_s for c in res.top]
    assert times == sorted(times)
    splits = {(c.layout.tp, c.layout.pp, c.layout.cp) for c in res.top}
    assert len(splits) == 4  # one row per split
    for cand in res.top:
        assert cand.fits
        errors = [i for i in validate(cand.layout.apply(plan)) if i.severity == Severity.ERROR]
        assert errors == []
        assert cand.why and "TFLOP/s per GPU" in cand.why[0]
    assert res.current is not None
    assert res.best is not None
    assert res.best.cost.step_time_s <= res.current.cost.step_time_s


def test_best_is_the_fastest_that_fits(plan: Plan) -> None:
    batch, work, cluster = enumerate_layouts(plan)
    fastest = float(np.min(evaluate(work, cluster, batch)["step_time"]))
    unlimited = search(plan, top=1, memory=None, explain=False)
    assert unlimited.best is not None
    assert unlimited.best.cost.step_time_s == pytest.approx(fastest)

    def at_most_20_gib(p: Plan) -> tuple[bool, float]:
        from sapper.memory import estimate

        gib = estimate(p).peak_bytes / 2**30
        return gib <= 20, gib

    tight = search(plan, top=3, memory=at_most_20_gib)
    assert tight.top and all(c.memory_gib is not None and c.memory_gib <= 20 for c in tight.top)
    assert tight.best is not None
    assert tight.best.cost.step_time_s >= unlimited.best.cost.step_time_s
    assert any("(no fit with 10% headroom)" in line for c in tight.top for line in c.why)


def test_nothing_fits(plan: Plan) -> None:
    res = search(plan, memory=lambda p: (False, 1e9), explain=False)
    assert res.top == [] and res.notes


def test_needs_the_global_batch() -> None:
    plan = gpt_plan(batch={"seq_len": 1024})
    with pytest.raises(InputError) as err:
        search(plan)
    assert err.value.field == "batch.global_batch_size"


def test_no_split_fits_the_batch() -> None:
    # 2 GPUs, one sequence per step: DP2 cannot split it, PP2 never fills, CP2 needs
    # a sequence divisible by 4 and TP2 does not divide the 25 heads.
    plan = gpt_plan(batch={"seq_len": 1022, "global_batch_size": 1},
                    hardware={"gpu": "A100-80GB", "num_gpus": 2})
    with pytest.raises(InputError, match="no valid layout"):
        search(plan)


def test_moe_enumerates_expert_parallel() -> None:
    plan = gpt_plan(model={"hidden_size": 1024, "num_layers": 8, "num_heads": 16,
                           "vocab_size": 32000, "num_experts": 8, "experts_top_k": 2,
                           "activation": "swiglu", "implementation": "megatron"})
    batch, _, _ = enumerate_layouts(plan)
    assert set(np.unique(batch.ep)) == {1, 2, 4, 8}
    assert (batch.dp % batch.ep == 0).all()
    res = search(plan, top=2)
    assert res.best is not None and res.best.cost.breakdown["ep_comm"] >= 0


def test_json_shape(plan: Plan) -> None:
    payload = search(plan, top=2).to_json()
    assert {"gpus", "enumerated", "memory_checks", "elapsed_s", "top", "current"} <= set(payload)
    row = payload["top"][0]
    assert {"layout", "tp", "pp", "dp", "zero_stage", "fits", "memory_gib", "cost", "why"} <= set(
        row
    )
    assert set(row["cost"]["breakdown_s"]) >= {"compute", "tp_comm", "bubble", "dp_comm"}


@pytest.mark.parametrize("run", PUBLISHED_RUNS[:5], ids=lambda r: r.name)
def test_pruning_never_changes_the_answer(run) -> None:
    """The memory walk's floors and dominance rules give the same top layouts as
    estimating every layout in ranked order."""
    plan = run.to_plan()
    batch, work, cluster = enumerate_layouts(plan)
    ranking = _rank(evaluate(work, cluster, batch), batch)
    order = plan.parallel.rank_order
    brute: list[str] = []
    splits: set[tuple[int, ...]] = set()
    for i in ranking:
        i = int(i)
        split = (int(batch.tp[i]), int(batch.pp[i]), int(batch.cp[i]), int(batch.ep[i]))
        if split in splits:
            continue
        lay = layout_at(batch, i, order)
        fits, gib = default_memory_check(lay.apply(plan))[:2]
        clean = not [x for x in validate(lay.apply(plan)) if x.severity != Severity.INFO]
        if fits and clean and gib <= 0.9 * plan.gpu.memory_gib:
            brute.append(lay.describe())
            splits.add(split)
            if len(brute) == 3:
                break
    fast = search(plan, top=3, explain=False)
    assert [c.layout.describe() for c in fast.top] == brute
