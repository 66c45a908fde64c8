"""The search contains every layout the validator accepts without a warning, and the
user's own layout is always a candidate: ``sapper plan`` never reports that nothing fits
while the given layout fits, and never ranks a layout below one it predicts slower."""

from __future__ import annotations

import math
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.memory import estimate
from sapper.parallel import search
from sapper.parallel.candidate import layout_at
from sapper.parallel.cost import evaluate, predict_step
from sapper.parallel.layout import Layout, split_layers
from sapper.parallel.published import PUBLISHED_RUNS, PublishedRun
from sapper.parallel.search import enumerate_layouts, stage_splits
from sapper.parallel.validate import validate
from sapper.plan.schema import Plan
from sapper.rules.model import Severity

from .conftest import gpt_plan

_register_commands()
runner = CliRunner()

#: BLOOM 176B as BigScience trained it: 70 layers over PP12 with 5 layers (plus the
#: embedding and the head) on the first and last stages, TP4, 384 A100-80GB.
BLOOM: dict[str, Any] = {
    "model": {
        "family": "bloom", "hidden_size": 14336, "num_layers": 70, "num_heads": 112,
        "vocab_size": 250880, "max_position_embeddings": 2048, "position_encoding": "alibi",
        "activation": "gelu", "norm_type": "layernorm", "attention_bias": True,
        "mlp_bias": True, "attention_impl": "eager", "dropout": 0.1,
        "tied_embeddings": True, "implementation": "megatron",
    },
    "precision": {"dtype": "bf16", "grad_dtype": "fp32"},
    "optimizer": {"type": "adam"},
    "batch": {"seq_len": 2048, "micro_batch_size": 2, "global_batch_size": 2048},
    "parallel": {
        "tp": 4, "pp": 12, "dp": 8, "zero_stage": 1, "checkpointing": {"granularity": "full"},
        "pipeline_schedule": "1f1b", "first_stage_layers": 5, "last_stage_layers": 5,
        "overlap_dp_comm": False, "overlap_param_gather": False,
        "pipeline_scatter_gather": False,
    },
    "hardware": {"gpu": "A100-80GB", "num_gpus": 384, "gpus_per_node": 8,
                 "internode_gbps": 6.25},
}


def _ids(run: PublishedRun) -> str:
    return run.name.replace(" ", "-")


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=_ids)
def test_published_layout_ranked_or_beaten(run: PublishedRun) -> None:
    plan = run.to_plan()
    res = search(plan, top=1, explain=False)
    current = res.current
    assert current is not None, "a published layout is complete and valid"
    if current.fits:
        assert not any("no layout fits" in n for n in res.notes), res.notes
        assert res.best is not None or res.current_is_best
    if res.current_is_best:
        assert current.fits is not False
        assert any("your layout is the best" in n for n in res.notes)
    else:
        assert res.best is not None
        assert res.best.cost.step_time_s <= current.cost.step_time_s * 1.0001


def test_bloom_config_is_the_published_one() -> None:
    run = next(r for r in PUBLISHED_RUNS if r.flops == "bloom")
    mine = Plan.model_validate(BLOOM)
    assert mine.model == run.to_plan().model
    assert mine.parallel == run.to_plan().parallel
    assert mine.batch == run.to_plan().batch


def test_bloom_176b_searched_and_beaten() -> None:
    plan = Plan.model_validate(BLOOM)
    assert estimate(plan).fits
    res = search(plan, top=3, explain=True)
    assert not any("no layout fits" in n for n in res.notes)
    assert res.current is not None and res.current.fits
    assert res.best is not None
    assert res.best.cost.step_time_s <= res.current.cost.step_time_s
    # the published layout is in the space (with sequence parallelism, which the search
    # always turns on with TP), costed as predict_step costs it
    batch, work, cluster = enumerate_layouts(plan)
    assert batch.first is not None and batch.last is not None
    hit = (
        (batch.tp == 4) & (batch.pp == 12) & (batch.dp == 8) & (batch.micro == 2)
        & (batch.zero == 1) & (batch.ckpt == 2) & (batch.v == 1)
        & (batch.first == 5) & (batch.last == 5)
    )
    assert hit.sum() == 1
    (i,) = hit.nonzero()[0]
    lay = layout_at(batch, int(i), plan.parallel.rank_order)
    given = Layout.from_plan(plan)
    assert given is not None and lay.with_(sequence_parallel=False) == given
    step = evaluate(work, cluster, batch)["step_time"][i]
    assert step == pytest.approx(predict_step(lay.apply(plan)).step_time_s, rel=1e-9)
    # every layout proposed passes sapper's own checks
    for cand in res.top:
        chosen = cand.layout.apply(plan)
        assert not [x for x in validate(chosen) if x.severity != Severity.INFO]


def test_bloom_176b_cli(tmp_path) -> None:
    path = tmp_path / "bloom.yaml"
    path.write_text(yaml.safe_dump(BLOOM))
    res = runner.invoke(app, ["plan", str(path), "--top", "2"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "no layout fits" not in res.output
    assert "yours" in res.output


@pytest.mark.parametrize("layers", [70, 48, 30, 105, 126, 7])
def test_stage_splits_cover_validated_splits(layers: int) -> None:
    """Every first/last split that validate accepts and that leaves no stage fuller than
    ⌈L/PP⌉ is searched; every split searched is accepted without a warning."""
    for pp in range(2, min(layers, 17) + 1):
        cap = math.ceil(layers / pp)
        searched = {
            tuple(split_layers(layers, pp, f or None, last or None) or ())
            for f, last, *_ in stage_splits(layers, pp)
        }
        for f in (None, *range(1, cap + 1)):
            for last in (None, *range(1, cap + 1)):
                stages = split_layers(layers, pp, f, last)
                if stages is None or max(stages) > cap:
                    continue
                if (f, last) == (None, None) and layers % pp:
                    continue  # the default uneven split: P107 warns about it
                assert tuple(stages) in searched, (layers, pp, f, last)
        for f, last, l_max, l_last, chunks in stage_splits(layers, pp):
            if not f and not last:
                continue
            stages = split_layers(layers, pp, f, last)
            assert stages is not None and max(stages[:-1]) == l_max and stages[-1] == l_last
            for v in (1, *chunks):
                plan = gpt_plan(
                    model={"hidden_size": 1024, "num_layers": layers, "num_heads": 16,
                           "vocab_size": 50304, "max_position_embeddings": 1024},
                    parallel={"tp": 1, "pp": pp, "dp": 1, "first_stage_layers": f,
                              "last_stage_layers": last, "virtual_pipeline_stages": v},
                    batch={"seq_len": 1024, "micro_batch_size": 1,
                           "global_batch_size": 4 * pp},
                    hardware={"gpu": "A100-80GB", "num_gpus": pp, "gpus_per_node": 8},
                )
                assert not [x for x in validate(plan) if x.code == "P107"], (layers, pp, f, v)


def _only(layout: Layout):
    """A memory check under which only ``layout`` (its split and micro-batch) fits."""

    def check(plan: Plan) -> tuple[bool, float]:
        lay = Layout.from_plan(plan)
        assert lay is not None
        same = (lay.tp, lay.pp, lay.dp, lay.micro_batch, lay.zero, lay.checkpointing) == (
            layout.tp, layout.pp, layout.dp, layout.micro_batch, layout.zero,
            layout.checkpointing,
        )
        return same, 10.0 if same else 1e6

    return check


def test_given_layout_best_when_nothing_else_fits() -> None:
    plan = gpt_plan(parallel={"tp": 1, "pp": 1, "dp": 8, "rank_order": "dp-tp-cp-pp"})
    plan = plan.model_copy(update={"hardware": plan.hardware.model_copy(
        update={"num_gpus": 8})})
    lay = Layout.from_plan(plan)
    assert lay is not None
    res = search(plan, top=3, memory=lambda p: (False, 1e6) if Layout.from_plan(p) != lay
                 else (True, 10.0))
    assert res.current is not None and res.current.fits
    assert res.current_is_best
    assert res.notes == ["your layout is the best sapper finds: no other layout that passes "
                         "sapper's checks fits in memory"]
    assert res.to_json()["current_is_best"] is True


def test_no_fit_when_given_layout_does_not_fit() -> None:
    plan = gpt_plan()
    res = search(plan, top=3, memory=lambda p: (False, 1e6))
    assert not res.top and not res.current_is_best
    assert res.notes == ["no layout fits in memory: add GPUs, or a GPU with more memory"]
