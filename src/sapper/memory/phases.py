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

from sapper.memory.activations import block_activations, embedding_saved
from sapper.memory.inputs import Shape
from sapper.memory.pipeline import in_flight
from sapper.memory.states import (
    ParamCount,
    block_params,
    layers_per_stage,
    stage_params,
    stage_states,
)
from sapper.memory.temporaries import (
    comm_buffers,
    head_cost,
    optimizer_temporaries,
    weight_casts,
)

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

    @property
    def phase_totals(self) -> dict[str, int]:
        return {ph: sum(cats.values()) for ph, cats in self.phases.items()}

    @property
    def peak_phase(self) -> str:
        totals = self.phase_totals
        return max(totals, key=lambda k: totals[k])

    @property
    def peak(self) -> int:
        return max(self.phase_totals.values())


def _checkpointed(sh: Shape, j: int) -> bool:
    """Is block ``j`` of a stage fully checkpointed? (one block in ``ckpt_every``)"""
    return sh.ckpt == "full" and j % sh.ckpt_every == 0


def _stage(sh: Shape, i: int, n_layers: int, pc: ParamCount, device: str) -> StagePeak:
    st = stage_states(sh, pc)
    blk = block_activations(sh, device)
    mode = "selective" if sh.ckpt == "selective" else "none"
    kept = [blk.boundary if _checkpointed(sh, j) else blk.kept(mode) for j in range(n_layers)]
    first, last = i == 0, i == sh.pp - 1
    head = head_cost(sh) if last else None
    emb = embedding_saved(sh) if first else 0
    a_mb = sum(kept) + emb + (head.saved if head else 0)
    k = in_flight(sh, i)
    older = int((k - 1) * a_mb)  # other micro-batches in flight
    persistent_grads = (
        sh.micro_batches > 1 or sh.pp > 1 or sh.zero >= 1 or sh.impl == "megatron"
    )
    g_fwd = st.grads if persistent_grads else 0
    casts = weight_casts(sh, pc, last)
    comm_keep, comm_bwd = comm_buffers(sh, pc)
    base = {"params": st.params, "optimizer": st.optimizer}

    # forward: everything this micro-batch kept, plus the loss (or the last block) running
    acts_now = sum(kept) + emb
    fwd_tmp = head.fwd_peak if head else blk.fwd_extra
    forward = {
        **base,
        "grads": g_fwd,
        "activations": older + acts_now,
        "temporaries": fwd_tmp + casts + comm_keep,
    }

    # backward, block by block from the last; gradients of a block appear as it runs
    blk_params = block_params(sh)
    g_block = int(blk_params.total * sh.recipe.grad)
    g_block = min(g_block, st.grads_full)
    grads_sharded = sh.zero >= 2
    cast_block = weight_casts(sh, blk_params, False)
    head_grads = st.grads_full - g_block * n_layers
    backward = None
    best = -1
    remaining = acts_now
    for j in range(n_layers - 1, -1, -1):
        done = n_layers - 1 - j
        if grads_sharded or persistent_grads:
            grads = st.grads
        else:
            grads = max(head_grads, 0) + g_block * (done + 1)
        recompute = blk.saved if _checkpointed(sh, j) else 0
        if sh.ckpt == "selective" and not _checkpointed(sh, j):
            recompute = blk.saved - blk.selective
        tmp = blk.bwd_extra + recompute + comm_bwd + comm_keep
        tmp += casts - cast_block * done
        if j == n_layers - 1 and head is not None:
            tmp = max(tmp, head.bwd_peak - head.saved + casts + comm_bwd + comm_keep)
        cats = {
            **base,
            "grads": grads,
            "activations": older + remaining + (head.saved if head and done == 0 else 0),
            "temporaries": tmp,
        }
        total = sum(cats.values())
        if total > best:
            best, backward = total, cats
        remaining -= kept[j]
    if backward is None:  # a stage without blocks (only embeddings/head)
        backward = {**base, "grads": st.grads, "activations": older + acts_now,
                    "temporaries": (head.bwd_peak if head else 0) + casts + comm_bwd}
    # end of backward: all gradients, nothing of this micro-batch left
    end = {**base, "grads": st.grads, "activations": older, "temporaries": comm_keep + comm_bwd}
    if sum(end.values()) > best:
        backward = end

    opt_tmp = optimizer_temporaries(sh, _opt_elements(sh, pc), pc.largest)
    if sh.recipe.master and sh.zero >= 1 and sh.offload_optimizer == "none":
        opt_tmp += 4 * _opt_elements(sh, pc)  # the fp32 gradient of the master shard
    optimizer = {
        **base,
        "grads": st.grads,
        "activations": older,
        "temporaries": opt_tmp + comm_keep,
    }
    return StagePeak(
        stage=i,
        layers=n_layers,
        in_flight=k,
        param_count=pc.total,
        phases={"forward": forward, "backward": backward, "optimizer": optimizer},
        host_bytes=st.host,
        nvme_bytes=st.nvme,
    )


def _opt_elements(sh: Shape, pc: ParamCount) -> int:
    if sh.zero >= 1:
        zg = max(sh.dp * sh.cp, 1)
        return -(-pc.dense // zg) + -(-pc.expert // max(zg // sh.ep, 1))
    return pc.total


def stage_peaks(sh: Shape, device: str = "cuda") -> list[StagePeak]:
    """Every pipeline stage's phases (stages differ: the first holds more micro-batches
    under 1F1B and the embeddings, the last the head and the loss)."""
    counts = stage_params(sh)
    return [
        _stage(sh, i, n, counts[i], device) for i, n in enumerate(layers_per_stage(sh))
    ]
