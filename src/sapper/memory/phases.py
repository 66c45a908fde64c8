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
    acts_now = sum(kept) + emb + _held_mask(sh)
    head_saved = head.saved if head else 0
    fwd_tmp = head.fwd_peak - head.saved if head else blk.fwd_extra
    forward = {
        **base,
        "grads": g_fwd,
        "activations": older + acts_now + head_saved,
        "temporaries": fwd_tmp + casts + comm_keep,
    }
    # After the forward, autocast's cache is gone: only casts saved by non-checkpointed
    # blocks (and the head) stay; a checkpointed block casts again while it recomputes.
    n_ckpt = sum(_checkpointed(sh, j) for j in range(n_layers))
    cast_block = weight_casts(sh, block_params(sh), False)
    casts_bwd = casts - cast_block * n_ckpt

    # backward: the loss and head first (all activations, no gradients yet), then each
    # block from the last (its gradients appear, its activations go), then the embedding
    blk_params = block_params(sh)
    g_block = min(int(blk_params.total * sh.recipe.grad), st.grads_full)
    head_grads = max(st.grads_full - g_block * n_layers - (_emb_grads(sh) if first else 0), 0)
    moments = []
    if head is not None:
        moments.append({
            **base,
            "grads": g_fwd,
            "activations": older + acts_now + head.saved,
            "temporaries": head.bwd_peak - head.saved + casts_bwd + comm_keep,
        })
    remaining = acts_now
    for j in range(n_layers - 1, -1, -1):
        done = n_layers - 1 - j
        ckpt_j = _checkpointed(sh, j)
        casts_j = casts_bwd - cast_block * sum(
            not _checkpointed(sh, q) for q in range(j + 1, n_layers)
        )
        below = remaining - kept[j]  # blocks before j (and the embedding)
        if ckpt_j and not blk.input_in_saved:
            below += kept[j]  # its input stays while it recomputes and runs backward
        if ckpt_j:
            casts_j += cast_block  # the recompute casts its weights again
        for alive, share in blk.moments:
            if persistent_grads:
                grads = st.grads
            else:
                grads = head_grads + g_block * done + int(g_block * share)
            moments.append({
                **base,
                "grads": grads,
                "activations": older + below + alive,
                "temporaries": casts_j + comm_bwd + comm_keep,
            })
        remaining -= kept[j]
    end_tmp = _emb_grads(sh) if (first and sh.tied and sh.pp == 1) else 0
    moments.append({
        **base,
        "grads": st.grads,
        "activations": older + emb,
        "temporaries": end_tmp + comm_keep + comm_bwd,
    })
    backward = max(moments, key=lambda c: sum(c.values()))

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


def stage_peaks(sh: Shape, device: str = "cuda") -> list[StagePeak]:
    """Every pipeline stage's phases (stages differ: the first holds more micro-batches
    under 1F1B and the embeddings, the last the head and the loss)."""
    counts = stage_params(sh)
    return [
        _stage(sh, i, n, counts[i], device) for i, n in enumerate(layers_per_stage(sh))
    ]
