"""DTensor values in the monitor's slots, in one process (a one-rank gloo group).

A loss under TP loss-parallel, a norm ``clip_grad_norm_`` returns under FSDP2, a
gradient: the monitor stores each as a plain local tensor (a pending sum reduced first),
so packing and the host copy never meet a DTensor. The multi-rank arithmetic is in
``test_sharded_monitor.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from distlaunch import free_port
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from sapper.monitor import Monitor
from sapper.monitor.collect import StepCollector, StepSlot
from sapper.monitor.dtensor import Shards, global_norm, is_dtensor, local_value


@pytest.fixture
def mesh() -> Iterator[DeviceMesh]:
    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_dtensors_are_stored_as_plain_local_tensors(mesh: DeviceMesh) -> None:
    rep = DTensor.from_local(torch.tensor(2.5), mesh, [Replicate()])
    pending = DTensor.from_local(torch.tensor(1.5), mesh, [Partial()])
    assert is_dtensor(rep) and not is_dtensor(torch.tensor(1.0))
    for value, expected in ((rep, 2.5), (pending, 1.5)):
        local = local_value(value)
        assert type(local) is torch.Tensor and float(local) == expected
    slot = StepSlot(step=0)
    slot.add_f("user_loss", rep)
    slot.add_f("grad_norm", pending)
    collector = StepCollector()
    collector.add(slot)
    (rec,) = collector.read()  # before: aten.cat got mixed Tensor and DTensor
    assert rec.loss == 2.5 and rec.grad_norm == 1.5


def test_shards_count_replicas_once(mesh: DeviceMesh) -> None:
    grads = [
        DTensor.from_local(torch.full((4,), 3.0), mesh, [Shard(0)]),
        DTensor.from_local(torch.full((2,), 4.0), mesh, [Replicate()]),
        torch.zeros(3),
    ]
    shards = Shards(grads, settle=True)
    assert shards.sharded and shards.owner == [0, 0, -1] and shards.copies == [1, 1, 1]
    squares = shards.reduce(shards.norms().square())
    assert squares.tolist() == pytest.approx([36.0, 32.0, 0.0])
    assert float(global_norm(grads)) == pytest.approx(68**0.5)


def test_monitor_reads_a_dtensor_loss(mesh: DeviceMesh) -> None:
    """A loss-parallel loss is a DTensor: read like any loss, no R190."""
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = Monitor(model, opt, log_every=2, console=False)
    for _ in range(4):
        loss = model(torch.ones(2, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.step(DTensor.from_local(loss.detach(), mesh, [Replicate()]))
    mon.close()
    assert [f.code for f in mon.findings if f.code == "R190"] == []
    assert len(mon.history) == 4 and all(rec.loss is not None for rec in mon.history)
