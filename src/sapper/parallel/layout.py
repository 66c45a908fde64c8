"""A parallel layout and where its communication groups land on the cluster.

Ranks are laid out in a mixed radix: the rank order (Megatron's ``tp-cp-ep-dp-pp``,
fastest-varying first) decides which ranks form each group. With 8 GPUs per node and
TP first, a TP-8 group is one node; put DP first instead and every TP group spans eight
nodes, so its all-reduces run at the network's speed instead of NVLink's (seed §4.2,
§5.1 item 6: "communication groups initialized correctly").

Expert parallelism is carved out of data parallelism (each EP group holds different
experts, the rest of DP replicates them), so the world size is TP·CP·DP·PP and the order's
``ep`` and ``dp`` positions split DP into EP x DP/EP.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np

from sapper.plan.schema import Plan

__all__ = [
    "DEFAULT_RANK_ORDER",
    "GroupSpan",
    "Layout",
    "Placement",
    "group_span",
    "parse_rank_order",
    "placement",
    "split_layers",
]

DEFAULT_RANK_ORDER = "tp-cp-ep-dp-pp"
RANK_DIMS = ("tp", "cp", "ep", "dp", "pp")
CHECKPOINTING = ("none", "selective", "full")


@functools.lru_cache(maxsize=64)
def parse_rank_order(order: str) -> tuple[str, ...] | None:
    """The dimensions of a rank order, fastest first; None unless it names tp, cp, dp and
    pp exactly once each (ep optional, then placed just before dp)."""
    dims = tuple(d.strip().lower() for d in order.replace(",", "-").split("-") if d.strip())
    if len(set(dims)) != len(dims) or not set(dims) <= set(RANK_DIMS):
        return None
    if not {"tp", "cp", "dp", "pp"} <= set(dims):
        return None
    if "ep" not in dims:
        i = dims.index("dp")
        dims = (*dims[:i], "ep", *dims[i:])
    return dims


def split_layers(
    layers: int, pp: int, first: int | None = None, last: int | None = None
) -> list[int] | None:
    """Layers on each pipeline stage, first to last; None when the explicit first/last
    counts leave a remainder the other stages cannot share evenly (Megatron's rule).

    Without explicit counts the split is as even as possible, the extra layers going to
    the first stages (so the last one, which also runs the output head, gets fewer)."""
    if pp == 1:
        return [layers]
    if first is None and last is None:
        base, extra = divmod(layers, pp)
        return [base + (1 if i < extra else 0) for i in range(pp)]
    fixed = [x for x in (first, last) if x is not None]
    rest, stages = layers - sum(fixed), pp - len(fixed)
    if rest < 0 or (stages == 0 and rest != 0):
        return None
    if stages == 0:
        return [first or 0, last or 0]
    if rest % stages or rest == 0:
        return None
    mid = [rest // stages] * stages
    return ([first] if first is not None else []) + mid + ([last] if last is not None else [])


@dataclass(frozen=True)
class Layout:
    """One way to split a job over GPUs. ``grad_accum`` is micro-batches per optimizer
    step per data-parallel replica (the pipeline's m)."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp: int = 1
    ep: int = 1
    zero: int = 0
    checkpointing: str = "none"
    #: With full checkpointing, one block in ``checkpoint_every`` is recomputed.
    checkpoint_every: int = 1
    micro_batch: int = 1
    grad_accum: int = 1
    virtual_stages: int = 1
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    rank_order: str = DEFAULT_RANK_ORDER
    offload_optimizer: bool = False
    overlap_dp_comm: bool = True
    overlap_param_gather: bool = True
    tp_comm_overlap: bool = False
    pipeline_scatter_gather: bool = True
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def interleaved(self) -> bool:
        return self.virtual_stages > 1

    def describe(self) -> str:
        """Short label, e.g. ``TP8 PP4 DP32 ZeRO-1 mb2 v3 full``."""
        parts = [f"TP{self.tp}"]
        if self.sequence_parallel:
            parts[0] += "+SP"
        parts += [f"PP{self.pp}"] + ([f"CP{self.cp}"] if self.cp > 1 else [])
        parts += [f"DP{self.dp}"] + ([f"EP{self.ep}"] if self.ep > 1 else [])
        parts += [f"ZeRO-{self.zero}", f"mb{self.micro_batch}", f"GA{self.grad_accum}"]
        if self.virtual_stages > 1:
            parts.append(f"v{self.virtual_stages}")
        ckpt = {"none": "no-ckpt", "selective": "sel-ckpt", "full": "full-ckpt"}
        parts.append(ckpt[self.checkpointing])
        if self.checkpointing == "full" and self.checkpoint_every > 1:
            parts[-1] += f"/{self.checkpoint_every}"
        return " ".join(parts)

    @classmethod
    def from_plan(cls, plan: Plan) -> Layout | None:
        """The plan's layout, or None while its DP degree cannot be inferred."""
        par = plan.parallel
        dp = plan.dp_degree
        if dp is None:
            return None
        return cls(
            tp=par.tp,
            pp=par.pp,
            cp=par.cp,
            dp=dp,
            ep=par.ep,
            zero=par.zero_stage,
            checkpointing=par.checkpointing.granularity,
            checkpoint_every=par.checkpointing.every_k_layers,
            micro_batch=plan.batch.micro_batch_size or 1,
            grad_accum=plan.grad_accum or 1,
            virtual_stages=par.virtual_pipeline_stages,
            sequence_parallel=par.sequence_parallel,
            schedule=par.pipeline_schedule,
            rank_order=par.rank_order,
            offload_optimizer=par.offload_optimizer != "none",
            overlap_dp_comm=par.overlap_dp_comm,
            overlap_param_gather=par.overlap_param_gather,
            tp_comm_overlap=par.tp_comm_overlap,
            pipeline_scatter_gather=par.pipeline_scatter_gather,
            first_stage_layers=par.first_stage_layers,
            last_stage_layers=par.last_stage_layers,
        )

    def with_(self, **changes: object) -> Layout:
        return replace(self, **changes)  # type: ignore[arg-type]

    def apply(self, plan: Plan) -> Plan:
        """``plan`` with this layout (global batch kept as micro x GA x DP). Built with
        ``model_copy`` (no re-validation): the planner makes thousands of these."""
        par = plan.parallel
        ckpt = par.checkpointing.model_copy(
            update={"granularity": self.checkpointing, "every_k_layers": self.checkpoint_every}
        )
        parallel = par.model_copy(
            update={
                "tp": self.tp,
                "pp": self.pp,
                "cp": self.cp,
                "dp": self.dp,
                "ep": self.ep,
                "zero_stage": self.zero,
                "sequence_parallel": self.sequence_parallel,
                "virtual_pipeline_stages": self.virtual_stages,
                "pipeline_schedule": self.schedule,
                "checkpointing": ckpt,
                "rank_order": self.rank_order,
                "overlap_dp_comm": self.overlap_dp_comm,
                "overlap_param_gather": self.overlap_param_gather,
                "tp_comm_overlap": self.tp_comm_overlap,
                "pipeline_scatter_gather": self.pipeline_scatter_gather,
                "first_stage_layers": self.first_stage_layers,
                "last_stage_layers": self.last_stage_layers,
                "offload_optimizer": par.offload_optimizer if self.offload_optimizer else "none",
            }
        )
        batch = plan.batch.model_copy(
            update={
                "micro_batch_size": self.micro_batch,
                "gradient_accumulation_steps": self.grad_accum,
                "global_batch_size": self.micro_batch * self.grad_accum * self.dp,
            }
        )
        hardware = plan.hardware.model_copy(update={"num_gpus": self.world})
        return plan.model_copy(update={"parallel": parallel, "batch": batch, "hardware": hardware})


@dataclass(frozen=True)
class GroupSpan:
    """Where one kind of group lands: its size, how many nodes one group touches, and the
    fewest of its members that share a node."""

    size: int
    nodes: int
    per_node: int

    @property
    def intra_node(self) -> bool:
        return self.nodes <= 1


def _radix(layout: Layout) -> tuple[tuple[str, ...], dict[str, int]]:
    order = parse_rank_order(layout.rank_order) or parse_rank_order(DEFAULT_RANK_ORDER)
    assert order is not None
    ep = layout.ep if layout.ep > 0 and layout.dp % layout.ep == 0 else 1
    degrees = {"tp": layout.tp, "cp": layout.cp, "ep": ep, "dp": layout.dp // ep,
               "pp": layout.pp}
    return order, degrees


@functools.lru_cache(maxsize=8192)
def _span(order: tuple[str, ...], degrees: tuple[int, ...], dims: frozenset[str],
          gpn: int) -> GroupSpan:
    deg = dict(zip(order, degrees, strict=True))
    size = math.prod(deg[d] for d in order if d in dims)
    if size <= 1:
        return GroupSpan(1, 1, 1)
    idx = [i for i, d in enumerate(order) if d in dims and deg[d] > 1]
    stride = math.prod(deg[d] for d in order[: idx[0]])
    contiguous = all(deg[order[i]] == 1 or order[i] in dims for i in range(idx[0], idx[-1] + 1))
    if contiguous:
        block = stride * size
        if block <= gpn and gpn % block == 0:
            return GroupSpan(size, 1, size)
        if stride >= gpn and stride % gpn == 0:
            return GroupSpan(size, size, 1)
        if gpn % stride == 0 and block % gpn == 0:
            per = gpn // stride
            return GroupSpan(size, size // per, per)
    return _exact_span(order, deg, dims, gpn)


def _exact_span(order: tuple[str, ...], deg: dict[str, int], dims: frozenset[str],
                gpn: int) -> GroupSpan:
    """Place every group rank by rank (for degrees that do not tile the nodes evenly)."""
    strides, s = {}, 1
    for d in order:
        strides[d] = s
        s *= deg[d]

    members = np.zeros(1, dtype=np.int64)
    for d in order:
        if d in dims:
            step = np.arange(deg[d], dtype=np.int64) * strides[d]
            members = np.add.outer(members, step).ravel()
    # (base + m) // gpn == base // gpn + (base % gpn + m) // gpn: a group's node pattern
    # depends only on its first rank's offset within a node, so at most gpn distinct
    # groups need placing (not every group of a 32k-GPU job). The offsets i·stride mod
    # gpn repeat after at most gpn steps.
    starts = {0}
    for d in order:
        if d not in dims:
            starts = {(a + i * strides[d]) % gpn for a in starts for i in range(min(deg[d], gpn))}
    first = np.array(sorted(starts), dtype=np.int64)
    nodes = np.sort((first[:, None] + members[None, :]) // gpn, axis=1)
    change = np.diff(nodes, axis=1) != 0
    distinct = 1 + change.sum(axis=1)
    # run lengths of equal node ids in each sorted row: the members sharing a node
    bounds = np.concatenate(
        [np.ones((len(nodes), 1), bool), change, np.ones((len(nodes), 1), bool)], axis=1
    )
    cols = bounds.shape[1]
    idx = np.flatnonzero(bounds)
    runs = np.diff(idx)[idx[:-1] % cols != cols - 1]  # skip row-end -> next-row-start
    fewest = int(runs.min())
    return GroupSpan(len(members), int(distinct.max()), fewest)


def group_span(layout: Layout, dims: tuple[str, ...], gpus_per_node: int) -> GroupSpan:
    """Placement of the groups formed by ``dims`` (e.g. ``("tp",)``, or ``("cp", "ep",
    "dp")`` for the gradient reduction) under the layout's rank order."""
    order, deg = _radix(layout)
    return _span(order, tuple(deg[d] for d in order), frozenset(dims), gpus_per_node)


@dataclass(frozen=True)
class Placement:
    """The groups a step communicates over."""

    tp: GroupSpan
    cp: GroupSpan
    ep: GroupSpan
    #: Dense gradients are reduced over data x context parallel ranks (same weights).
    grad: GroupSpan
    #: Experts' gradients over the data-parallel ranks that hold the same experts.
    expert_grad: GroupSpan
    pp: GroupSpan


def placement(layout: Layout, gpus_per_node: int) -> Placement:
    g = gpus_per_node
    return Placement(
        tp=group_span(layout, ("tp",), g),
        cp=group_span(layout, ("cp",), g),
        ep=group_span(layout, ("ep",), g),
        grad=group_span(layout, ("cp", "ep", "dp"), g),
        expert_grad=group_span(layout, ("cp", "dp"), g),
        pp=group_span(layout, ("pp",), g),
    )
