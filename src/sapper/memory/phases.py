"""The peak of one pipeline stage, modelled over the phases of a training step.

Categories that never coexist are not summed: the loss's fp32 logits are gone before
the optimizer's temporaries appear, and activations are freed block by block while the
gradients appear. Each phase is evaluated where it is worst:

* ``forward``: the end of the last in-flight micro-batch's forward, while the loss runs
  (last stage) or the last block runs (other stages);
* ``backward``: each block's backward in turn, from the last block (all activations, few
  gradients) to the first (few activations, all gradients), with the recompute of a
  checkpointed block and the gradients of its intermediates in flight;
* ``optimizer``: all gradients, the states and the step's temporaries.

Gradients persist across the step (and so are present in the forward) when micro-batches
accumulate into them, the pipeline interleaves forwards and backwards, or the framework
keeps them in preallocated buffers (ZeRO, Megatron); otherwise ``zero_grad`` freed them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sapper.memory.activations import BlockActivations, block_activations, embedding_saved
from sapper.memory.inputs import Shape
from sapper.memory.pipeline import chunk_layers, in_flight
from sapper.memory.states import (
    block_params,
    stage_param_count,
    stage_params,
    stage_states,
)
from sapper.memory.temporaries import (
    comm_buffers,
    head_cost,
    largest_tensor,
    master_grad_elements,
    optimizer_temporaries,
    weight_casts,
)
from sapper.model.params import ParamCount

__all__ = ["CATEGORIES", "PHASES", "StagePeak", "stage_peaks"]

CATEGORIES = ("params", "grads", "optimizer", "activations", "temporaries")
PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class StagePeak:
    """One pipeline stage on one GPU: bytes per category at each phase's worst moment."""

    stage: int
    layers: int
    in_flight: float
    param_count: int
    phases: dict[str, dict[str, int]]
    host_bytes: int
    nvme_bytes: int
    peak_phase: str
    peak: int


def _cats(params: int, opt: int, grads: int, acts: int, tmp: int) -> dict[str, int]:
    return {
        "params": params,
        "grads": grads,
        "optimizer": opt,
        "activations": acts,
        "temporaries": tmp,
    }


@dataclass(frozen=True)
class _Blocks:
    """The blocks of one model chunk, for one checkpointing setting."""

    ck: tuple[bool, ...]  # fully checkpointed blocks (one in ``ckpt_every``)
    kept: tuple[int, ...]  # bytes each block keeps for backward
    total: int  # all of them
    prefix: tuple[int, ...]  # kept by the blocks before j
    plain_after: tuple[int, ...]  # non-checkpointed blocks after j
    #: Blocks are identical, so within each kind (checkpointed or not) a backward
    #: moment's total is linear in the block's index: its first and last bound the rest.
    candidates: tuple[int, ...]


@lru_cache(maxsize=4096)
def _blocks(n: int, every: int, boundary: int, other: int) -> _Blocks:
    """``every``: one block in ``every`` is fully checkpointed (0: none)."""
    ck = tuple(bool(every) and j % every == 0 for j in range(n))
    kept = tuple(boundary if c else other for c in ck)
    prefix = [0]
    for k_j in kept:
        prefix.append(prefix[-1] + k_j)
    plain_after = [0] * (n + 1)
    for j in range(n - 1, -1, -1):
        plain_after[j] = plain_after[j + 1] + (not ck[j])
    cands: set[int] = set()
    for kind in (True, False):
        idx = [j for j in range(n) if ck[j] == kind]
        if idx:
            cands.update((idx[0], idx[-1]))
    return _Blocks(ck, kept, prefix[-1], tuple(prefix), tuple(plain_after), tuple(sorted(cands)))


def _stage(
    sh: Shape, i: int, pc: ParamCount, blk: BlockActivations, device: str = "cuda"
) -> StagePeak:
    st = stage_states(sh, pc)
    chunks = chunk_layers(sh, i)
    v = len(chunks)
    first, last = i == 0, i == sh.pp - 1
    head = head_cost(sh) if last else None
    emb = embedding_saved(sh, device) if first else 0
    other = blk.selective if sh.ckpt == "selective" else blk.saved
    every = sh.ckpt_every if sh.ckpt == "full" else 0
    blocks = [_blocks(n, every, blk.boundary, other) for n in chunks]
    weights = tuple(
        b.total + (emb if c == 0 else 0) + (head.saved if head is not None and c == v - 1 else 0)
        for c, b in enumerate(blocks)
    )
    flight = in_flight(sh, i, weights)
    held = sum(k * w for k, w in zip(flight.counts, weights, strict=True))

    n_stage = sum(chunks)
    persistent_grads = (
        sh.micro_batches > 1 or sh.pp > 1 or sh.zero >= 1 or sh.impl == "megatron"
    )
    g_fwd = st.grads if persistent_grads else 0
    casts = weight_casts(sh, pc, last)
    comm_keep, comm_bwd = comm_buffers(sh, pc, sum(chunks))
    params, opt_states = st.params, st.optimizer

    # forward: what this micro-batch kept, plus the last block running (its own bytes at
    # their peak) or, on the last stage, the loss running
    c = flight.fwd_chunk
    bf, older = blocks[c], held - weights[c]
    ck, kept = bf.ck, bf.kept
    hd = head if c == v - 1 else None
    acts_now = bf.total + (emb if c == 0 else 0) + _held_mask(sh)
    running = (blk.fwd_ckpt if ck[-1] else blk.fwd_extra) if kept else 0
    fwd = (g_fwd, older + acts_now - (kept[-1] if kept else 0) + running, casts + comm_keep)
    if hd is not None:
        at_loss = (g_fwd, older + acts_now + hd.saved,
                   hd.fwd_peak - hd.saved + casts + comm_keep)
        if sum(at_loss) >= sum(fwd):
            fwd = at_loss

    # backward: the loss and head first (all activations, no gradients yet), then each
    # block from the last (its gradients appear, its activations go), then the embedding.
    # After the forward, autocast's cache is gone: only casts saved by non-checkpointed
    # blocks (and the head) stay; a checkpointed block casts again while it recomputes.
    c = flight.bwd_chunk
    bb, older = blocks[c], held - weights[c]
    ck, kept = bb.ck, bb.kept
    hd = head if c == v - 1 else None
    emb_now = emb if c == 0 else 0
    n_layers = len(kept)
    acts_now = bb.total + emb_now + _held_mask(sh)
    cast_block = weight_casts(sh, block_params(sh), False)
    casts_bwd = casts - cast_block * sum(ck)
    g_block = min(int(block_params(sh).total * sh.recipe.grad), st.grads_full)
    head_grads = max(st.grads_full - g_block * n_stage - (_emb_grads(sh) if first else 0), 0)
    moments: list[tuple[int, int, int]] = []
    if hd is not None:
        moments.append((g_fwd, older + acts_now + hd.saved,
                        hd.bwd_peak - hd.saved + casts_bwd + comm_keep))
    const = acts_now - bb.total  # embedding and held mask, kept throughout
    for j in bb.candidates:
        done = n_layers - 1 - j
        casts_j = casts_bwd - cast_block * bb.plain_after[j + 1]
        below = bb.prefix[j] + const  # blocks before j (and the embedding)
        if ck[j]:
            casts_j += cast_block  # the recompute casts its weights again
            if not blk.input_in_saved:
                below += kept[j]  # its input stays while it recomputes and runs backward
        tmp = casts_j + comm_bwd + comm_keep
        extra = blk.ckpt_extra if ck[j] and blk.ckpt_extra else (0,) * len(blk.moments)
        for (alive, share), more in zip(blk.moments, extra, strict=True):
            grads = st.grads if persistent_grads else (
                head_grads + g_block * done + int(g_block * share)
            )
            moments.append((grads, older + below + alive + more, tmp))
    end_tmp = _emb_grads(sh) if (emb_now and sh.tied and sh.pp == 1) else 0
    moments.append((st.grads, older + emb_now, end_tmp + comm_keep + comm_bwd))
    bwd = max(moments, key=sum)

    opt_tmp = optimizer_temporaries(sh, _opt_elements(sh, pc), largest_tensor(sh, pc))
    if sh.recipe.master and sh.recipe.grad != 4 and sh.offload_optimizer == "none":
        # the fp32 gradient of the master shard (ZeRO-3: one sub-group at a time)
        opt_tmp += 4 * master_grad_elements(sh, _opt_elements(sh, pc))
    opt = (st.grads, 0, opt_tmp + comm_keep)  # the pipeline has drained by the step
    phases = {
        "forward": _cats(params, opt_states, *fwd),
        "backward": _cats(params, opt_states, *bwd),
        "optimizer": _cats(params, opt_states, *opt),
    }
    totals = {"forward": sum(fwd), "backward": sum(bwd), "optimizer": sum(opt)}
    peak_phase = max(totals, key=lambda ph: totals[ph])
    # micro-batches of whole-stage activations held (chunks weighted by their blocks)
    if n_stage:
        equiv = sum(k * n for k, n in zip(flight.counts, chunks, strict=True)) / n_stage
    else:
        equiv = float(sum(flight.counts))
    return StagePeak(
        stage=i,
        layers=n_stage,
        in_flight=equiv,
        param_count=pc.total,
        phases=phases,
        host_bytes=st.host,
        nvme_bytes=st.nvme,
        peak_phase=peak_phase,
        peak=params + opt_states + totals[peak_phase],
    )


def _held_mask(sh: Shape) -> int:
    """Eager attention gets a materialized causal mask (b×1×s×s in the residual dtype);
    checkpointed blocks keep it as an input until their backward."""
    if sh.impl != "transformers" or sh.attn_impl != "eager" or sh.ckpt != "full":
        return 0
    s = sh.seq // sh.cp
    return sh.recipe.residual * sh.micro_batch * s * s


def _emb_grads(sh: Shape) -> int:
    """Bytes of the embedding table's gradient (a new tensor when the table is tied to
    the head and its gradient already holds the head's part)."""
    return -(-sh.vocab // sh.tp) * sh.hidden * sh.recipe.grad


def _opt_elements(sh: Shape, pc: ParamCount) -> int:
    if sh.zero >= 1:
        zg = max(sh.dp * sh.cp, 1)
        return -(-pc.dense // zg) + -(-pc.expert // max(zg // sh.ep, 1))
    return pc.total


def stage_peaks(
    sh: Shape, device: str = "cuda", stages: tuple[int, ...] | None = None
) -> list[StagePeak]:
    """The phases of every pipeline stage, or of ``stages`` only (stages differ: the first
    holds more micro-batches under 1F1B and the embeddings, the last the head and the
    loss; :func:`~sapper.memory.pipeline.peak_candidates` names those that can peak)."""
    blk = block_activations(sh, device)
    if stages is None or len(stages) == sh.pp:
        return [_stage(sh, i, pc, blk, device) for i, pc in enumerate(stage_params(sh))]
    return [_stage(sh, i, stage_param_count(sh, i), blk, device) for i in stages]
