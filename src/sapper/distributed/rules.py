"""The X family: the cross-rank rules of the distributed monitor, documentation only.

Kept free of torch (and of the detectors) so ``sapper rules`` and ``sapper explain X005``
stay instant: this module is what the ``sapper.rules`` entry point names, while the
detectors and start-of-run checks that fire these rules live in
:mod:`sapper.distributed.detectors` and import them from here.
"""

from __future__ import annotations

from sapper.rules.model import Rule, Severity
from sapper.rules.registry import register

__all__ = [
    "DUPLICATE_SAMPLES_ACROSS_RANKS",
    "NONFINITE_ON_RANK",
    "RANKS_OUT_OF_STEP",
    "RANKS_PER_NODE",
    "RANK_LOST",
    "REPLICAS_DIVERGED",
    "SPIKE_ON_RANK",
    "STRAGGLER_RANK",
    "TP_ACROSS_NODES",
    "WORLD_SIZE_MISMATCH",
]

NONFINITE_ON_RANK = register(
    Rule(
        code="X001",
        name="nonfinite-on-rank",
        check="distributed",
        severity=Severity.ERROR,
        title="A rank produced a non-finite loss or gradient",
        why="""\
An fp16 overflow, a bad sample or a broken kernel on one rank makes that rank's loss
Inf/NaN. The gradient all-reduce then spreads it to every replica within the same step,
so all ranks' gradient norms read NaN and the rank where it began is lost from view —
and a monitor that only watches rank 0 may see nothing at all until the weights are
poisoned.""",
        signs="""\
One rank's loss is non-finite while the others' are finite; a step later every rank's
gradient norm is NaN, or the fp16 loss scale collapses on every rank at once.""",
        fix="""\
Look at the named rank's batch for that step (its shard of the data, its sequence
lengths), and at its GPU (ECC errors, clocks). Keep dynamic loss scaling on for fp16, clip
gradients, and make the loop skip a step whose global norm is non-finite.""",
        seed="§2.1, §2.2, §5.2",
    )
)

STRAGGLER_RANK = register(
    Rule(
        code="X002",
        name="straggler-rank",
        check="distributed",
        severity=Severity.WARNING,
        title="One rank is persistently slower than the others",
        why="""\
Synchronous training runs at the pace of its slowest rank: every collective waits for it,
so one slow GPU, one node with a slow disk or a starved data loader, or one rank with
longer sequences makes the whole job slower — hundreds of GPUs idling for one. Nothing
fails; throughput is simply far below what the cluster should deliver.""",
        signs="""\
Tokens/s well below the estimate and flat as GPUs are added; one rank's data-wait or
forward time is several times the others'; the other ranks' step time is mostly spent
inside the all-reduce.""",
        fix="""\
Look at the named rank's node: data-loader workers and storage (data wait), GPU clocks,
temperature and ECC errors (forward time), other jobs on the host. Give the loader more
workers or prefetch; balance sequence lengths across ranks; drain or replace the node if
its hardware is slow.""",
        seed="§4.1, §5.1 (7), §5.2",
    )
)

REPLICAS_DIVERGED = register(
    Rule(
        code="X003",
        name="replicas-diverged",
        check="distributed",
        severity=Severity.ERROR,
        title="Data-parallel replicas hold different parameters",
        why="""\
Data parallelism assumes every replica holds the same weights: each applies the same
averaged gradient to the same parameters. Once one replica differs — a checkpoint loaded
on rank 0 only, a weight edited outside the optimizer, an update skipped on one rank, a
buffer that is not synchronized, a bit flipped in one GPU's memory — the replicas compute
gradients for different models, the average belongs to none of them, and the saved
checkpoint (usually rank 0's) is not the model that was trained.""",
        signs="""\
Full-tensor parameter checksums differ across data-parallel ranks; evaluation of
checkpoints saved from different ranks disagrees; loss curves of ranks drift apart
although they see data from the same distribution.""",
        fix="""\
Load checkpoints on every rank (or broadcast from rank 0 after loading); change weights
only through the optimizer step on all ranks; wrap the model in DDP/FSDP before training
so the initial weights are broadcast; with manual gradient sync, make sure every
parameter is reduced and every rank takes the same step.""",
        seed="§4.1, §5.1 (6)",
    )
)

DUPLICATE_SAMPLES_ACROSS_RANKS = register(
    Rule(
        code="X004",
        name="duplicate-samples-across-ranks",
        check="distributed",
        severity=Severity.ERROR,
        title="Several data-parallel ranks are fed the same samples",
        why="""\
Each data-parallel rank must see a different shard of the data. A loader without a
DistributedSampler (or an iterable dataset that does not split by rank, or the same
shard index on every rank) gives every replica the same batches: N GPUs do one GPU's
work, the effective batch is N times smaller than planned, and the model sees each
sample N times as often — it memorizes instead of generalizing. Nothing raises an
error.""",
        signs="""\
The training loss falls unusually fast while the validation loss does not follow; the
epoch ends after the same number of steps whatever the number of GPUs; sample ids or
hashes repeat across ranks within a step.""",
        fix="""\
Use a DistributedSampler (num_replicas = DP degree, rank = DP rank) and call
sampler.set_epoch(epoch) each epoch; for iterable/streaming datasets split by DP rank
(e.g. datasets.distributed.split_dataset_by_node); with TP/PP shard by the DP rank, not
the global rank.""",
        seed="§5.3",
    )
)

RANK_LOST = register(
    Rule(
        code="X005",
        name="rank-lost",
        check="distributed",
        severity=Severity.ERROR,
        title="A rank stopped answering: crashed, hung or unreachable",
        why="""\
When one rank dies (out of memory, a segfault, a lost node) or hangs (a deadlock, a
stuck filesystem read, a mismatched collective), the other ranks block in their next
collective until its timeout — NCCL's default is 10 minutes, often raised to hours — and
then die with an error that names no culprit. A monitor whose own collective waited
forever would add one more hang.""",
        signs="""\
Throughput drops to zero on every rank at once; GPU utilization falls to 0 or sits at
100% in an NCCL kernel; the launcher reports a failed child long after the fact.""",
        fix="""\
Read the named rank's own log and exit status (OOM killer, segfault, Python traceback)
and its node's health; with torchrun the agent restarts the group
(--max-restarts) from the last checkpoint. Set a collective timeout that fits the job
(init_process_group(timeout=...)) and enable TORCH_NCCL_ASYNC_ERROR_HANDLING so a hang
becomes an error.""",
        seed="§4.3, §5.1 (6)",
    )
)

WORLD_SIZE_MISMATCH = register(
    Rule(
        code="X006",
        name="world-size-mismatch",
        check="parallel",
        severity=Severity.ERROR,
        title="The launched world size does not match the Plan's TP·CP·DP·PP",
        why="""\
The parallel degrees fix which ranks form each TP, PP and DP group. Launched on another
number of ranks, the groups are built differently from the plan: a framework that infers
DP silently trains with another global batch (and learning rate relation), and one that
does not fails at initialization or — worse — builds groups over the wrong ranks.""",
        signs="""\
A global batch or tokens/step in the logs that differs from the plan; an error at startup
about a world size not divisible by the model-parallel size; fewer or more steps per
epoch than expected.""",
        fix="""\
Launch exactly TP·CP·DP·PP ranks (torchrun --nnodes N --nproc-per-node G gives N·G), or
change the degrees in the plan to tile the world size you have.""",
        seed="§4.4, §5.1 (6)",
    )
)

RANKS_PER_NODE = register(
    Rule(
        code="X007",
        name="ranks-per-node",
        check="parallel",
        severity=Severity.WARNING,
        title="Ranks are spread unevenly or unexpectedly over the nodes",
        why="""\
Parallel layouts assume the same number of ranks on every node, placed in rank order
(node k holds ranks k·G ... k·G+G-1): TP groups of G adjacent ranks then sit inside one
node. Uneven nodes, a GPU count per node other than the plan's, or ranks interleaved
across nodes (a hand-written hostfile, a scheduler that round-robins tasks) break that
assumption and put high-traffic groups on the network.""",
        signs="""\
Some nodes run fewer processes than they have GPUs; LOCAL_WORLD_SIZE differs between
nodes; rank r and rank r+1 report different hostnames within one node's range.""",
        fix="""\
Launch the same --nproc-per-node on every node and let torchrun assign ranks in node
order; set the plan's hardware.gpus_per_node to the real count; with a scheduler, use
block (not cyclic) task distribution.""",
        seed="§4.2, §4.4, §5.1 (6)",
    )
)

TP_ACROSS_NODES = register(
    Rule(
        code="X008",
        name="tp-group-across-nodes",
        check="parallel",
        severity=Severity.WARNING,
        title="A tensor-parallel group spans several nodes",
        why="""\
Tensor parallelism exchanges activations (all-gather / reduce-scatter or all-reduce)
twice per layer in both passes, so it needs NVLink-class bandwidth. A TP group with ranks
on two nodes sends that traffic over the network, which is an order of magnitude slower:
the step time grows several-fold while everything stays correct.""",
        signs="""\
Step time several times the estimate; low GPU utilization with high network traffic
between nodes; the slowdown vanishes when TP ≤ GPUs per node.""",
        fix="""\
Keep TP within a node (TP ≤ GPUs per node) and put PP and DP across nodes; keep TP the
fastest-varying dimension of the rank order (Megatron's tp-cp-ep-dp-pp) and launch ranks
in node order.""",
        seed="§4.2, §4.4",
    )
)

RANKS_OUT_OF_STEP = register(
    Rule(
        code="X009",
        name="ranks-out-of-step",
        check="distributed",
        severity=Severity.WARNING,
        title="Ranks count optimizer steps differently",
        why="""\
Every rank must take the same optimizer steps. A rank whose step counter runs ahead or
behind has skipped or repeated a step (a per-rank early exit, an uneven number of batches
per rank, gradient accumulation counted differently): with collectives in the step it
soon deadlocks on a mismatched all-reduce; without them the ranks silently train
different models.""",
        signs="""\
Ranks log different step numbers at the same moment; the job hangs at the end of an
epoch when one rank runs out of batches first (uneven shards, drop_last=False).""",
        fix="""\
Give every rank the same number of batches (DistributedSampler with drop_last=True, or
pad the last shard); count steps the same way on every rank; under an uneven loader use
DDP's join() context manager.""",
        seed="§5.1 (6), §5.1 (7)",
    )
)

SPIKE_ON_RANK = register(
    Rule(
        code="X010",
        name="spike-on-rank",
        check="distributed",
        severity=Severity.WARNING,
        title="One rank's batch made a huge but finite loss or gradient",
        why="""\
A bad batch on one data-parallel rank (a corrupt or truncated sample, a sequence of one
repeated token, an input that drives an embedding row or an activation wild) gives that
rank a huge but finite loss and local gradient. The gradient all-reduce averages it into
every replica's gradient within the same step, so every rank sees the same gradient-norm
spike (R013 on rank 0) and nothing in the global numbers says which rank, or which
samples, caused it. Left alone, the same samples come back every epoch.""",
        signs="""\
A gradient-norm or loss spike that every rank shows at the same step; before the
all-reduce, one rank's local gradient norm or loss was many times the other ranks' at that
step and many times its own recent level, while the others stayed at theirs.""",
        fix="""\
Inspect the named rank's samples of that step (the ids or fingerprints the finding lists):
drop or repair them, filter the data set for the same fault (repeated tokens, empty or
truncated sequences, out-of-range values). Clip gradients so one batch cannot move the
weights far, and consider skipping steps whose loss is far above its running level.""",
        seed="§2.2, §2.3, §5.2",
    )
)
