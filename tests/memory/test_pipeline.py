"""Pipeline stages: the layer split, the micro-batches each stage holds, the fast path.

The in-flight count is checked against an op-by-op simulation of Megatron-LM's schedules
(``forward_backward_pipelining_with_interleaving``: warm-up ``2(p-r-1) + (v-1)p`` chunk
forwards capped at ``m·v``, micro-batches in groups of ``p`` through each chunk in turn,
backwards in the same order with the chunks reversed; 1F1B: ``p-r-1`` warm-up forwards).
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from memory_plans import LLAMA_7B, make_plan

from sapper.errors import InputError
from sapper.memory import MemoryOptions, estimate
from sapper.memory.inputs import Shape, shape_from_plan
from sapper.memory.pipeline import (
    InFlight,
    _forward_chunk,
    _forward_counts,
    chunk_layers,
    in_flight,
    layers_per_stage,
    peak_candidates,
    warmup_forwards,
)
from sapper.parallel.published import PUBLISHED_RUNS

LLAMA3 = [r for r in PUBLISHED_RUNS if "Llama" in r.name]


def _shape(**changes: object) -> Shape:
    return replace(shape_from_plan(make_plan()), **changes)


def _plan(parallel: dict, ga: int = 8, model: dict | None = None):  # type: ignore[no-untyped-def]
    pp = parallel.get("pp", 1)
    return make_plan(
        model or LLAMA_7B,
        parallel=parallel,
        batch={"gradient_accumulation_steps": ga},
        hardware={"gpu": "A100-80GB", "num_gpus": pp * parallel.get("tp", 1)},
    )


def _simulated_peak(p: int, r: int, v: int, m: int, weights: list[int]) -> int:
    """The heaviest set of (micro-batch, chunk) activations rank ``r`` holds, running
    Megatron's schedule op by op."""
    table: list[tuple[int, int]] = []
    for start in range(0, m, p):
        group = range(start, m) if start + p >= m else range(start, start + p)
        table += [(mb, c) for c in range(v) for mb in group]
    backward = [(mb, v - 1 - c) for mb, c in table]
    total = m * v
    if v == 1:
        warm = min(p - r - 1, m)
    else:
        warm = min(2 * (p - r - 1) + (v - 1) * p, total)
    ops = [("F", k) for k in range(warm)]
    for k in range(total - warm):
        ops += [("F", warm + k), ("B", k)]
    ops += [("B", k) for k in range(total - warm, total)]
    held: set[tuple[int, int]] = set()
    top = 0
    for kind, k in ops:
        if kind == "F":
            held.add(table[k])
        else:
            assert backward[k] in held  # a backward only ever follows its forward
            held.remove(backward[k])
        top = max(top, sum(weights[c] for _, c in held))
    assert not held
    return top


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("v", [1, 2, 3])
def test_in_flight_matches_megatrons_schedule(p: int, v: int) -> None:
    rng = random.Random(p * 10 + v)
    for m in sorted({p, p + 1, 2 * p, 2 * p + 2, 3 * p}):
        sh = _shape(pp=p, vpp=v, micro_batches=m, layers=p * v * 4,
                    schedule="interleaved" if v > 1 else "1f1b")
        for r in range(p):
            for weights in ([1] * v, [rng.randint(1, 9) for _ in range(v)]):
                fl = in_flight(sh, r, tuple(weights))
                held = sum(k * w for k, w in zip(fl.counts, weights, strict=True))
                assert held == _simulated_peak(p, r, v, m, weights), (m, r, weights)


def _scanned(sh: Shape, r: int, weights: tuple[int, ...]) -> InFlight:
    """in_flight's scan with _forward_chunk's general table (any last group)."""
    p, m, v = sh.pp, sh.micro_batches, len(weights)
    total, w = m * v, warmup_forwards(sh, r)
    held = min(w + 1, total)
    counts = _forward_counts(held, p, v, m)
    best = (tuple(counts), _forward_chunk(held - 1, p, v, m), v - 1 - _forward_chunk(0, p, v, m))
    if held == total or len(set(weights)) == 1:
        return InFlight(*best)
    load = top = sum(c * x for c, x in zip(counts, weights, strict=True))
    for t in range(1, total - w if m % p else min(total - w, p * v + 1)):
        b, f = v - 1 - _forward_chunk(t - 1, p, v, m), _forward_chunk(w + t, p, v, m)
        counts[b] -= 1
        counts[f] += 1
        load += weights[f] - weights[b]
        if load > top:
            top = load
            best = (tuple(counts), f, v - 1 - _forward_chunk(t, p, v, m))
    return InFlight(*best)


def test_in_flight_whole_groups_scan_is_the_general_one() -> None:
    """With whole groups of p micro-batches in_flight inlines the chunk table; the held
    counts and the chunks it names are those of the general table."""
    rng = random.Random(7)
    for _ in range(300):
        p, v = rng.randint(2, 16), rng.randint(2, 9)
        sh = _shape(pp=p, vpp=v, micro_batches=p * rng.randint(1, 8), layers=p * v * 2,
                    schedule="interleaved")
        r = rng.randrange(p)
        weights = tuple(rng.choice([3, 5, 8, 13, 100]) for _ in range(v))
        assert in_flight(sh, r, weights) == _scanned(sh, r, weights)


def test_interleaved_warmup_is_megatrons() -> None:
    sh = _shape(pp=4, vpp=2, micro_batches=8, schedule="interleaved")
    assert [warmup_forwards(sh, r) for r in range(4)] == [10, 8, 6, 4]  # 2(p-r-1) + (v-1)p
    few = sh.replace(micro_batches=2)  # capped at m·v chunk forwards
    assert [warmup_forwards(few, r) for r in range(4)] == [4, 4, 4, 4]
    assert [warmup_forwards(sh.replace(schedule="1f1b"), r) for r in range(4)] == [3, 2, 1, 0]


def test_interleaved_chunks_hold_a_share_of_the_stage() -> None:
    """Each held chunk micro-batch keeps L/(p·v) layers: the first stage of p=4, v=2,
    m=8 holds 11 chunk micro-batches, 5.5 stages' worth (1F1B: 4)."""
    base = {"pp": 4, "virtual_pipeline_stages": 2, "pipeline_schedule": "interleaved"}
    inter = estimate(_plan(base))
    plain = estimate(_plan({"pp": 4}))
    assert [s.in_flight for s in inter.stages] == [5.5, 4.5, 3.5, 2.5]
    assert [s.in_flight for s in plain.stages] == [4, 3, 2, 1]
    a_inter = inter.stages[1].phases["forward"]["activations"]  # no embedding, no head
    a_plain = plain.stages[1].phases["forward"]["activations"]
    assert a_inter / a_plain == pytest.approx(4.5 / 3, rel=0.02)


def test_stage_split_reads_first_and_last_stage_layers() -> None:
    run = LLAMA3[0].to_plan()
    sh = shape_from_plan(run)
    assert layers_per_stage(sh) == (7, *[8] * 14, 7)
    assert [s.layers for s in estimate(run).stages] == [7, *[8] * 14, 7]
    even = sh.replace(first_layers=None, last_layers=None)
    assert layers_per_stage(even) == (*[8] * 14, 7, 7)  # 126 = 16·7 + 14
    only_last = shape_from_plan(_plan({"pp": 4, "last_stage_layers": 5}))
    assert layers_per_stage(only_last) == (9, 9, 9, 5)


def test_impossible_stage_split_is_an_input_error() -> None:
    with pytest.raises(InputError) as err:
        estimate(_plan({"pp": 4, "first_stage_layers": 7}))  # 25 layers over 3 stages
    assert err.value.field == "parallel.first_stage_layers"


def test_chunks_are_lighter_where_the_stage_was_shortened() -> None:
    """Llama 3: "the first model chunk on the first stage has only the embedding"."""
    sh = shape_from_plan(LLAMA3[0].to_plan()).replace(vpp=8)
    assert chunk_layers(sh, 0) == (0, *[1] * 7)
    assert chunk_layers(sh, 15) == (*[1] * 7, 0)
    assert chunk_layers(sh, 3) == (1,) * 8
    assert chunk_layers(sh.replace(vpp=2), 0) == (3, 4)
    assert chunk_layers(sh.replace(vpp=2), 15) == (4, 3)
    assert chunk_layers(sh.replace(schedule="1f1b"), 0) == (7,)
    # with one layer per chunk, the emptied first chunk leaves the first stage holding
    # what plain 1F1B would (16 micro-batches of 7 layers)
    assert in_flight(sh, 0, tuple(chunk_layers(sh, 0))).counts[1:] == (16,) * 7


def test_explicit_split_may_leave_a_chunk_without_layers() -> None:
    llama = LLAMA3[0].plan
    plan = {**llama, "parallel": {**llama["parallel"], "virtual_pipeline_stages": 8}}
    from sapper.plan.schema import Plan

    assert estimate(Plan.model_validate(plan)).peak_bytes > 0  # 16 × 8 chunks > 126 layers
    with pytest.raises(InputError):  # an even split would leave chunks empty
        estimate(_plan({"pp": 8, "virtual_pipeline_stages": 8,
                        "pipeline_schedule": "interleaved"}))


_FAST_CASES = [
    {"pp": 1},
    {"pp": 1, "zero_stage": 3},
    {"pp": 2},
    {"pp": 4, "checkpointing": {"granularity": "full"}},
    {"pp": 4, "pipeline_schedule": "gpipe"},
    {"pp": 8, "zero_stage": 1},
    {"pp": 4, "virtual_pipeline_stages": 2, "pipeline_schedule": "interleaved"},
    {"pp": 4, "virtual_pipeline_stages": 4, "pipeline_schedule": "interleaved"},
    {"pp": 4, "first_stage_layers": 6, "last_stage_layers": 6},
    {"pp": 8, "first_stage_layers": 3, "last_stage_layers": 5},
    {"pp": 4, "first_stage_layers": 11},
    {"pp": 2, "first_stage_layers": 15, "last_stage_layers": 17},
    {"pp": 4, "first_stage_layers": 6, "last_stage_layers": 6, "virtual_pipeline_stages": 2,
     "pipeline_schedule": "interleaved"},
    {"pp": 6},  # 32 layers: 6, 6, 5, 5, 5, 5
]


@pytest.mark.parametrize("ga", [3, 8, 13])
@pytest.mark.parametrize("parallel", _FAST_CASES, ids=lambda p: "-".join(map(str, p.values())))
def test_worst_only_gives_the_same_peak(parallel: dict, ga: int) -> None:
    plans = [_plan(parallel, ga), _plan(parallel, ga, {**LLAMA_7B, "vocab_size": 256000})]
    for plan in plans:
        full = estimate(plan)
        fast = estimate(plan, MemoryOptions(worst_only=True))
        assert (fast.peak_bytes, fast.peak_stage, fast.peak_phase, fast.breakdown) == (
            full.peak_bytes, full.peak_stage, full.peak_phase, full.breakdown
        )
        assert (fast.fits, fast.host_bytes_per_node) == (full.fits, full.host_bytes_per_node)
        assert len(fast.stages) <= 3
        assert [s.stage for s in fast.stages] == list(peak_candidates(shape_from_plan(plan)))


@pytest.mark.parametrize("run", LLAMA3, ids=lambda r: r.name)
def test_worst_only_finds_the_shortened_first_stages_neighbour(run) -> None:  # type: ignore[no-untyped-def]
    """With one layer fewer on the first stage, the second stage (8 layers, two fewer
    warm-up chunks) holds the most: the fast path must evaluate it."""
    plan = run.to_plan()
    full = estimate(plan)
    fast = estimate(plan, MemoryOptions(worst_only=True))
    assert [s.stage for s in fast.stages] == [0, 1, 15]
    assert fast.peak_bytes == full.peak_bytes and fast.peak_stage == full.peak_stage == 1
