"""X006–X008: the launched process group against the Plan, from every rank's node."""

from __future__ import annotations

from sapper.distributed import DistContext, NodeInfo, RankGrid, check_process_groups, discover
from sapper.distributed.layout import ReplicaLayout
from sapper.plan.schema import Plan


def ctx_for(world: int, nodes: list[int], plan: Plan | None = None, lws: int = -1,
            hosts: list[str] | None = None) -> DistContext:
    grid = RankGrid.from_plan(plan, world) if plan is not None else None
    if grid is not None and grid.world_size != world:
        grid = None
    infos = [
        NodeInfo(host=hosts[r] if hosts else f"gpu{nodes[r]}",
                 group_rank=-1 if hosts else nodes[r], local_rank=r, local_world_size=lws)
        for r in range(world)
    ]
    layout = ReplicaLayout.from_grid(grid or RankGrid.data_parallel(world), "test")
    return DistContext(rank=0, world_size=world, local_rank=0, local_world_size=None,
                       nodes=infos, layout=layout, grid=grid)


def codes(findings: list) -> list[str]:
    return [f.code for f in findings]


def test_world_size_vs_plan_shows_the_arithmetic() -> None:
    p = Plan.model_validate({"parallel": {"tp": 2, "dp": 4}})
    found = check_process_groups(ctx_for(4, [0, 0, 0, 0], p), p)
    assert codes(found) == ["X006"]
    assert found[0].message == "world 4 ≠ tp 2 × pp 1 × cp 1 × dp 4 = 8 (step 0)"
    assert found[0].step == 0
    later = check_process_groups(ctx_for(4, [0, 0, 0, 0], p), p, step=120)
    assert later[0].message.endswith("(step 120)") and later[0].step == 120
    ok = Plan.model_validate({"parallel": {"tp": 2, "dp": 2}})
    assert check_process_groups(ctx_for(4, [0, 0, 0, 0], ok), ok) == []


def test_inferred_dp_that_does_not_divide_or_differs_from_the_plan() -> None:
    p = Plan.model_validate({"parallel": {"tp": 4}})
    found = check_process_groups(ctx_for(6, [0] * 6, p), p)
    assert codes(found) == ["X006"]
    assert "world 6 is not a multiple of tp 4 × pp 1 × cp 1 = 4" in found[0].message
    q = Plan.model_validate({"parallel": {"tp": 2}, "hardware": {"num_gpus": 64}})
    found = check_process_groups(ctx_for(8, [0] * 8, q), q)
    assert codes(found) == ["X006"] and (
        "world 8 ≠ the plan's 64 GPUs: tp 2 × pp 1 × cp 1 × dp 4 = 8 launched, "
        "tp 2 × pp 1 × cp 1 × dp 32 = 64 planned (step 0)"
    ) == found[0].message


def test_uneven_nodes_and_wrong_gpus_per_node() -> None:
    found = check_process_groups(ctx_for(4, [0, 0, 0, 1]))
    assert codes(found) == ["X007"] and "different numbers of ranks" in found[0].message
    p = Plan.model_validate({"hardware": {"gpus_per_node": 8}})
    found = check_process_groups(ctx_for(8, [0] * 4 + [1] * 4, p), p)
    assert codes(found) == ["X007"] and "8 GPUs per node, the job runs 4" in found[0].message
    assert check_process_groups(ctx_for(8, [0] * 4 + [1] * 4)) == []


def test_shared_hostname_is_flagged_as_ambiguous() -> None:
    found = check_process_groups(ctx_for(4, [0, 0, 1, 1], lws=2, hosts=["pod"] * 4))
    assert codes(found) == ["X007"] and "ambiguous" in found[0].message


def test_tp_group_across_nodes() -> None:
    p = Plan.model_validate({"parallel": {"tp": 4}})
    found = check_process_groups(ctx_for(8, [0, 0, 1, 1, 2, 2, 3, 3], p), p)
    assert codes(found) == ["X008"]
    assert found[0].data["group"] == [0, 1, 2, 3] and "2 of 2 TP group(s)" in found[0].message
    inside = check_process_groups(ctx_for(8, [0] * 4 + [1] * 4, p), p)
    assert inside == []


def test_interleaved_ranks_put_tp_groups_across_nodes() -> None:
    p = Plan.model_validate({"parallel": {"tp": 2}})
    found = check_process_groups(ctx_for(4, [0, 1, 0, 1], p), p)
    assert codes(found) == ["X007", "X008"] and "not contiguous" in found[0].message


def test_single_process_has_no_nodes() -> None:
    assert check_process_groups(discover()) == []
