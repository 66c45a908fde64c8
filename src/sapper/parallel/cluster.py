"""The machine a plan runs on: GPU model, GPUs per node, and the bandwidth of each link."""

from __future__ import annotations

from dataclasses import dataclass

from sapper.errors import InputError
from sapper.parallel.efficiency import LINK_FRACTION, NETWORK_FRACTION
from sapper.parallel.layout import GroupSpan
from sapper.plan.hardware import GpuSpec
from sapper.plan.schema import Plan

__all__ = ["Cluster"]


@dataclass(frozen=True)
class Cluster:
    gpu: GpuSpec
    gpus: int
    gpus_per_node: int
    #: Network bandwidth per GPU per direction (GB/s): the plan's override or the GPU's.
    internode_gbps: float
    dtype: str

    @classmethod
    def from_plan(cls, plan: Plan) -> Cluster:
        gpu = plan.gpu
        if gpu is None:
            raise InputError(
                "no GPU model in the plan", field="hardware.gpu", expected="e.g. A100-80GB, H100"
            )
        gpus = plan.hardware.total_gpus
        if gpus is None:
            raise InputError(
                "no GPU count in the plan", field="hardware.num_gpus", expected="GPUs in the job"
            )
        return cls(
            gpu=gpu,
            gpus=gpus,
            gpus_per_node=plan.hardware.gpus_per_node,
            internode_gbps=plan.hardware.internode_gbps or gpu.internode_gbps,
            dtype=plan.precision.dtype,
        )

    @property
    def peak_flops(self) -> float:
        """Datasheet dense peak for the compute dtype (FLOP/s)."""
        return self.gpu.peak_tflops(self.dtype) * 1e12

    def _local_gbps(self, span: GroupSpan) -> float:
        """Raw per-GPU rate inside a node: NVLink when the group's members in one node fit
        one NVLink domain (all 8 of an HGX board; a bridged pair of PCIe cards), else the
        PCIe host link."""
        gpu = self.gpu
        local = span.size if span.intra_node else span.per_node
        return gpu.nvlink_gbps if local <= gpu.nvlink_domain else gpu.pcie_gbps

    def link_gbps(self, span: GroupSpan) -> float:
        """Raw per-GPU link rate (GB/s) a group's collectives are limited by: NVLink inside
        a node (PCIe beyond the NVLink domain); across nodes the NICs of the members sharing
        a node work in parallel (NCCL runs one ring per NIC), capped by the local links."""
        local = self._local_gbps(span)
        if span.intra_node:
            return local
        return min(local, span.per_node * self.internode_gbps)

    def bus_gbps(self, span: GroupSpan) -> float:
        """Sustained bus bandwidth (GB/s) of a group's collectives: the NVLink or network
        rate, whichever limits, at the fraction NCCL sustains on it."""
        local = LINK_FRACTION * self._local_gbps(span)
        if span.intra_node:
            return local
        return min(local, NETWORK_FRACTION * span.per_node * self.internode_gbps)
