"""Rank order decides which groups share a node (seed §4.2, §5.1 item 6)."""

from __future__ import annotations

import pytest

from sapper.parallel.layout import (
    Layout,
    group_span,
    parse_rank_order,
    placement,
    split_layers,
)
from sapper.plan.schema import Plan

from .conftest import gpt_plan


def test_megatron_order_keeps_tp_in_node_and_spreads_dp_pp() -> None:
    pl = placement(Layout(tp=8, pp=4, dp=4), 8)
    assert pl.tp.intra_node and pl.tp.size == 8
    assert (pl.pp.nodes, pl.pp.per_node) == (4, 1)
    assert (pl.grad.nodes, pl.grad.per_node) == (4, 1)


def test_small_tp_leaves_dp_members_sharing_nodes() -> None:
    pl = placement(Layout(tp=2, dp=32), 8)
    assert pl.tp.intra_node
    assert (pl.grad.size, pl.grad.nodes, pl.grad.per_node) == (32, 8, 4)


def test_dp_first_scatters_tp_groups() -> None:
    span = group_span(Layout(tp=8, dp=4, rank_order="dp-tp-cp-pp"), ("tp",), 8)
    assert (span.nodes, span.per_node) == (4, 2)


def test_tp_not_dividing_the_node_straddles() -> None:
    span = group_span(Layout(tp=3, dp=8), ("tp",), 8)
    assert span.nodes == 2 and span.per_node == 1  # ranks 6, 7 | 8


def test_cp_joins_the_gradient_group() -> None:
    pl = placement(Layout(tp=4, cp=2, dp=8), 8)
    assert pl.grad.size == 16


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        ("tp-cp-ep-dp-pp", ("tp", "cp", "ep", "dp", "pp")),
        ("tp-cp-pp-dp", ("tp", "cp", "pp", "ep", "dp")),
        ("TP,DP,CP,PP", ("tp", "ep", "dp", "cp", "pp")),
        ("tp-dp-pp", None),
        ("tp-tp-cp-dp-pp", None),
        ("tp-cp-xp-dp-pp", None),
    ],
)
def test_parse_rank_order(order: str, expected: tuple[str, ...] | None) -> None:
    assert parse_rank_order(order) == expected


def test_split_layers() -> None:
    assert split_layers(32, 4) == [8, 8, 8, 8]
    assert split_layers(30, 4) == [8, 8, 7, 7]
    assert split_layers(126, 16, 7, 7) == [7] + [8] * 14 + [7]
    assert split_layers(126, 16, 8, None) is None  # 118 layers over 15 stages
    assert split_layers(128, 16, 8, None) == [8] * 16
    assert split_layers(10, 2, 4, 6) == [4, 6]
    assert split_layers(10, 2, 4, 5) is None


def test_from_plan_infers_dp_and_apply_round_trips(plan: Plan) -> None:
    lay = Layout.from_plan(plan)
    assert lay is not None and lay.dp == 16 and lay.grad_accum == 4
    other = lay.with_(tp=2, dp=8, micro_batch=8, grad_accum=4, zero=1)
    applied = other.apply(plan)
    assert Layout.from_plan(applied) == other
    assert applied.global_batch == 256


def test_from_plan_none_when_dp_unknown() -> None:
    assert Layout.from_plan(gpt_plan(parallel={"tp": 3})) is None
