"""The rank grid from a Plan and the replica groups that follow from it."""

from __future__ import annotations

import pytest

from sapper.distributed import RankGrid, discover
from sapper.errors import InputError
from sapper.plan.schema import Plan


def plan(**parallel: object) -> Plan:
    return Plan.model_validate({"parallel": parallel})


def test_megatron_order_tp_fastest() -> None:
    grid = RankGrid.from_plan(plan(tp=2, pp=2), world_size=8)
    assert grid is not None and grid.sizes == {"tp": 2, "cp": 1, "dp": 2, "pp": 2}
    assert grid.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert grid.coords(5) == {"tp": 1, "cp": 0, "dp": 0, "pp": 1}
    assert all(grid.rank_of(grid.coords(r)) == r for r in range(8))


def test_custom_order_puts_dp_fastest() -> None:
    grid = RankGrid.from_plan(plan(tp=2, dp=2, rank_order="dp-tp-pp"), world_size=4)
    assert grid is not None
    assert grid.groups("tp") == [[0, 2], [1, 3]]
    assert grid.groups("dp") == [[0, 1], [2, 3]]


def test_dp_inferred_only_when_it_divides() -> None:
    assert RankGrid.from_plan(plan(tp=4), world_size=6) is None
    grid = RankGrid.from_plan(plan(tp=2), world_size=6)
    assert grid is not None and grid.sizes["dp"] == 3


def test_bad_rank_order_is_an_input_error() -> None:
    with pytest.raises(InputError) as err:
        RankGrid.from_plan(plan(tp=2, rank_order="tp-xp-dp"), world_size=4)
    assert err.value.field == "parallel.rank_order"
    assert "tp-xp-dp" in str(err.value)


def test_single_process_context() -> None:
    ctx = discover(plan(tp=1))
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.distributed) == (0, 1, True, False)
    assert ctx.layout.data_groups == [[0]]
