"""How a pipeline splits the layers, and which micro-batches a stage holds at once (§4.1).

Layers: an even split (the first stages take one more when it does not divide), unless
the plan gives the first and/or last stage's count (Megatron
``--decoder-first/last-pipeline-num-layers``; Llama 3 405B ran 126 layers as 7 + 14 × 8
+ 7) and the other stages share the rest. Under the interleaved schedule each stage's
layers form ``v`` model chunks; a stage whose count does not divide by ``v`` has lighter
chunks where the reduction was made: the first chunks of a shortened first stage (Llama
3: "the first model chunk on the first stage has only the embedding"), the last chunks
elsewhere.

In flight: under 1F1B stage ``r`` of ``p`` runs ``p - r - 1`` warm-up forwards, then one
more forward before its first backward, so it holds ``min(p - r, m)`` micro-batches; GPipe
holds all ``m``. Megatron's interleaved schedule runs ``2(p - r - 1) + (v - 1)·p`` warm-up
chunk forwards (capped at ``m·v``), micro-batches taken in groups of ``p`` through every
chunk in turn, and backwards in the same order with the chunks reversed. What a stage
holds is counted per chunk — each held chunk micro-batch keeps only its chunk's layers,
the embedding only on the first chunk of the first stage, the loss's tensors only on the
last chunk of the last stage — and the peak is the schedule's heaviest moment.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sapper.memory.inputs import Shape
from sapper.model.stages import stage_split

__all__ = [
    "InFlight",
    "chunk_layers",
    "in_flight",
    "interleaved",
    "layers_per_stage",
    "peak_candidates",
    "warmup_forwards",
]


def interleaved(sh: Shape) -> bool:
    """Whether the stage's layers run as several model chunks (virtual stages)."""
    return sh.pp > 1 and sh.schedule == "interleaved" and sh.vpp > 1


def layers_per_stage(sh: Shape) -> tuple[int, ...]:
    """Blocks on each pipeline stage, first to last (all chunks of a stage together)."""
    return stage_split(sh.layers, sh.pp, sh.first_layers, sh.last_layers)


@lru_cache(maxsize=4096)
def _chunks(n: int, v: int, light_first: bool) -> tuple[int, ...]:
    base, extra = divmod(n, v)
    if light_first:
        return (base,) * (v - extra) + (base + 1,) * extra
    return (base + 1,) * extra + (base,) * (v - extra)


def chunk_layers(sh: Shape, stage: int) -> tuple[int, ...]:
    """Blocks of each model chunk of ``stage`` (one chunk unless interleaved)."""
    n = layers_per_stage(sh)[stage]
    if not interleaved(sh):
        return (n,)
    return _chunks(n, sh.vpp, stage == 0 and sh.first_layers is not None)


def warmup_forwards(sh: Shape, stage: int) -> int:
    """Forwards (chunk forwards when interleaved) ``stage`` runs before its first
    backward, as Megatron schedules them; the one that follows is still held then."""
    p, m = sh.pp, sh.micro_batches
    if p == 1:
        return 0
    if sh.schedule == "gpipe":
        return m
    if interleaved(sh):
        return min(2 * (p - stage - 1) + (sh.vpp - 1) * p, m * sh.vpp)
    return min(p - stage - 1, m)


def _forward_chunk(k: int, p: int, v: int, m: int) -> int:
    """Model chunk of the ``k``-th chunk forward: micro-batches in groups of ``p`` (the
    last group takes what is left) run through chunk 0, then 1, ... (Megatron's table)."""
    groups = -(-m // p)
    full = (groups - 1) * p * v
    if k < full:
        return (k % (p * v)) // p
    return (k - full) // (m - (groups - 1) * p)


def _forward_counts(n: int, p: int, v: int, m: int) -> list[int]:
    """How many of the first ``n`` chunk forwards ran on each chunk."""
    groups = -(-m // p)
    full = (groups - 1) * p * v
    if n <= full:
        rounds, rem = divmod(n, p * v)
        return [rounds * p + min(max(rem - c * p, 0), p) for c in range(v)]
    last = m - (groups - 1) * p
    return [(groups - 1) * p + min(max(n - full - c * last, 0), last) for c in range(v)]


@dataclass(frozen=True)
class InFlight:
    """What a stage holds at its heaviest moment of the schedule."""

    counts: tuple[int, ...]  # micro-batches held per model chunk (the running one included)
    fwd_chunk: int  # the chunk whose forward has just run
    bwd_chunk: int  # the chunk whose backward runs next


def in_flight(sh: Shape, stage: int, weights: tuple[int, ...]) -> InFlight:
    """The heaviest moment of ``stage``'s schedule, given the bytes one micro-batch keeps
    on each of its chunks (``weights``). Under 1F1B (interleaved or not) that is the end
    of a forward in the steady phase, just before the next backward; the composition of
    the held chunks repeats every ``p·v`` steps, so one period is scanned (the whole
    steady phase when the last group of micro-batches is smaller than ``p``)."""
    p, m, v = sh.pp, sh.micro_batches, len(weights)
    if p == 1:
        return InFlight((1,), 0, 0)
    if v == 1:
        held = m if sh.schedule == "gpipe" else min(p - stage, m)
        return InFlight((held,), 0, 0)
    total = m * v
    w = warmup_forwards(sh, stage)
    held = min(w + 1, total)
    counts = _forward_counts(held, p, v, m)
    best = (tuple(counts), _forward_chunk(held - 1, p, v, m), v - 1 - _forward_chunk(0, p, v, m))
    if held == total or len(set(weights)) == 1:
        return InFlight(*best)
    load = top = sum(c * x for c, x in zip(counts, weights, strict=True))
    # With whole groups of p micro-batches the steady phase repeats every p·v steps;
    # a last, smaller group changes the pattern, so then the whole phase is scanned.
    steps = total - w if m % p else min(total - w, p * v + 1)
    if m % p == 0:
        # whole groups: the k-th chunk forward runs chunk (k mod p·v) // p, the last group
        # included (_forward_chunk inlined: the search calls this hundreds of times)
        pv = p * v
        for t in range(1, steps):
            b = v - 1 - ((t - 1) % pv) // p
            f = ((w + t) % pv) // p
            counts[b] -= 1
            counts[f] += 1
            load += weights[f] - weights[b]
            if load > top:
                top = load
                best = (tuple(counts), f, v - 1 - (t % pv) // p)
        return InFlight(*best)
    for t in range(1, steps):
        b = v - 1 - _forward_chunk(t - 1, p, v, m)
        f = _forward_chunk(w + t, p, v, m)
        counts[b] -= 1
        counts[f] += 1
        load += weights[f] - weights[b]
        if load > top:
            top = load
            best = (tuple(counts), f, v - 1 - _forward_chunk(t, p, v, m))
    return InFlight(*best)


@lru_cache(maxsize=1024)
def _candidates(
    layers: int, pp: int, first: int | None, last: int | None, v: int
) -> tuple[int, ...]:
    split = stage_split(layers, pp, first, last)
    out: list[int] = []
    seen: list[tuple[int, ...]] = []
    for i, n in enumerate(split[:-1]):
        ch = _chunks(n, v, i == 0 and first is not None) if v > 1 else (n,)
        if not any(all(a >= b for a, b in zip(s, ch, strict=True)) for s in seen):
            out.append(i)
            seen.append(ch)
    return (*out, pp - 1) if pp > 1 else (0,)


def peak_candidates(sh: Shape) -> tuple[int, ...]:
    """The stages that can hold the peak: the last (output head and loss) and every other
    stage not dominated by an earlier one. An earlier stage holds at least as many
    micro-batches in flight at every moment of the schedule (more warm-up forwards, the
    same chunk order), so with at least as many layers in every chunk it keeps at least
    as many activations next to at least as many weights (the first stage adds the
    embedding): an even split leaves the first and the last, Llama 3's shortened first
    stage adds the second."""
    v = sh.vpp if interleaved(sh) else 1
    return _candidates(sh.layers, sh.pp, sh.first_layers, sh.last_layers, v)
