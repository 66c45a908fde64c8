"""S007/S008 over a real gloo group of two processes: DDP equals one process for a correct
step and sharded data; an unsharded loader and a per-rank loss normalisation are caught."""

from __future__ import annotations

import pytest
from smoke_planted import (
    FailsOnRankOne,
    LocalTokenCount,
    NoWorldSizeFactor,
    PerRankTokens,
    sharded_loader,
    unsharded_loader,
)

from sapper.smoke.batches import LoaderFactory
from sapper.smoke.context import SmokeConfig
from sapper.smoke.runner import run_smoke

pytestmark = pytest.mark.distributed


def _by_code(report) -> dict[str, object]:
    return {f.code: f for f in report.findings}


def test_ddp_equals_one_process(llama) -> None:
    found = _by_code(run_smoke(llama, checks=["data_parallel"]))
    s007, s008 = found["S007"], found["S008"]
    assert s007.data["status"] == "pass", s007.message
    assert s007.value < 1e-4
    assert s007.data["ranks_max_abs_diff"] == 0.0
    assert s008.data["status"] == "pass"
    assert s008.data["whole_epoch"] is False  # synthetic tokens are a stream
    assert s008.data["overlap"] == s008.data["missing"] == 0


def test_users_sharded_loader_passes(llama) -> None:
    report = run_smoke(llama, source=LoaderFactory(sharded_loader), checks=["data_parallel"])
    assert {f.code: f.data["status"] for f in report.findings} == {"S007": "pass", "S008": "pass"}


def test_unsharded_sampler_is_caught(llama) -> None:
    report = run_smoke(llama, source=LoaderFactory(unsharded_loader), checks=["data_parallel"])
    s008 = _by_code(report)["S008"]
    assert s008.data["status"] == "fail"
    assert s008.data["whole_epoch"] is True
    assert s008.data["overlap"] == s008.data["single_process_samples"] == 64
    assert s008.data["read_by_several_ranks"] == 64
    assert "64 extra read(s)" in s008.message
    assert report.exit_code() == 1


def test_per_rank_loss_normalisation_is_caught(llama) -> None:
    report = run_smoke(llama, step=PerRankTokens(), checks=["data_parallel"])
    s007 = _by_code(report)["S007"]
    assert s007.data["status"] == "fail"
    assert s007.value > 1e-3
    assert s007.data["cause"] == "per-rank normalisation"


@pytest.mark.parametrize(
    ("step", "cause", "ratio"),
    [
        (NoWorldSizeFactor(), "no world-size factor", 0.5),
        (LocalTokenCount(), "token count not all-reduced", 2.0),
    ],
)
def test_the_size_of_the_update_names_the_normalisation(llama, step, cause, ratio) -> None:
    s007 = _by_code(run_smoke(llama, step=step, checks=["data_parallel"]))["S007"]
    assert s007.data["status"] == "fail"
    assert s007.data["cause"] == cause, s007.message
    assert abs(s007.data["norm_ratio"] / ratio - 1) < 0.25


def test_a_rank_that_crashes_is_reported_not_hung(llama) -> None:
    report = run_smoke(llama, step=FailsOnRankOne(), checks=["data_parallel"])
    s007, s008 = report.findings
    assert s007.data["status"] == "fail"
    assert "shape mismatch on rank 1" in s007.message
    assert s008.code == "S008" and s008.data["status"] == "pass"  # sharding is still read


@pytest.mark.slow
def test_spawned_ranks_rebuild_everything(llama) -> None:
    """Clean interpreters (the start method off Linux): model factory, loader and step are
    pickled and rebuilt in each rank."""
    config = SmokeConfig(dp_start_method="spawn")
    report = run_smoke(
        llama, source=LoaderFactory(sharded_loader), config=config, checks=["data_parallel"]
    )
    assert {f.code: f.data["status"] for f in report.findings} == {"S007": "pass", "S008": "pass"}


def test_a_forward_around_ddp_is_not_all_reduced(llama) -> None:
    """Real DDP confirms what the contract check (S012) infers from its wrapper."""
    from smoke_planted import ForwardThroughModule

    report = run_smoke(llama, step=ForwardThroughModule(), checks=["data_parallel"])
    s007 = _by_code(report)["S007"]
    assert s007.data["status"] == "fail"
    assert s007.data["ranks_max_abs_diff"] > 0
    assert "not all-reduced" in s007.message
