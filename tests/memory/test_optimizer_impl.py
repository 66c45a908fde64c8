"""Every optimizer implementation is expressible (``optimizer.impl``,
``--optimizer-impl``), the estimate says which one it assumed and why, and ``--device cpu``
counts what a CPU run allocates."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.memory import MemoryOptions, estimate
from sapper.plan.schema import Plan

runner = CliRunner()
_register_commands()
CPU = MemoryOptions(context_bytes=0, nccl_bytes=0, fragmentation=0.0, device="cpu")


def _plan(**optimizer: object) -> Plan:
    return Plan.model_validate({
        "model": {"hidden_size": 256, "num_layers": 2, "num_heads": 4, "vocab_size": 1000},
        "batch": {"micro_batch_size": 1, "seq_len": 16},
        "optimizer": {"type": "adamw", **optimizer},
    })


def _step_temporaries(plan: Plan, options: MemoryOptions | None = None) -> int:
    est = estimate(plan, options)
    return est.stages[0].phases["optimizer"]["temporaries"]


def test_each_implementation_has_its_own_temporaries() -> None:
    loop = _step_temporaries(_plan(impl="for_loop"))
    multi = _step_temporaries(_plan(impl="foreach"))
    fused = _step_temporaries(_plan(impl="fused"))
    assert fused < loop < multi  # none; the largest tensor's; every parameter's
    assert _step_temporaries(_plan(impl="deepspeed_fused")) == fused
    assert _step_temporaries(_plan(impl="apex")) == fused


def test_auto_is_torchs_default_for_the_device_and_says_so() -> None:
    cuda, cpu = estimate(_plan()), estimate(_plan(), CPU)
    assert "foreach, torch's default on CUDA" in cuda.notes[0]
    assert "for_loop, torch's default on CPU" in cpu.notes[0]
    assert _step_temporaries(_plan(), CPU) == _step_temporaries(_plan(impl="for_loop"), CPU)
    assert "fused" in estimate(_plan(fused=True)).notes[0]
    assert "bnb_8bit" in estimate(_plan(impl="bnb_8bit")).notes[0]


def test_8bit_states_and_the_host_step() -> None:
    full = estimate(_plan()).breakdown["optimizer"]
    assert estimate(_plan(impl="bnb_8bit")).breakdown["optimizer"] < full / 3
    host = estimate(_plan(impl="deepspeed_cpu"))  # CPUAdam: states and step on the host
    assert host.breakdown["optimizer"] < full and host.host_bytes_per_node > 0


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_cli_takes_the_implementation_and_the_device(device: str) -> None:
    res = runner.invoke(app, ["memory", "--model", "tests/fixtures/hf/gpt2.json",
                              "--micro-batch", "1", "--seq-len", "64", "--device", device,
                              "--optimizer-impl", "for_loop", "--format", "json"])
    assert res.exit_code == 0, res.output
    est = json.loads(res.stdout)["estimate"]
    assert "for_loop" in est["notes"][0]
    overheads = est["breakdown"].get("overheads", 0)
    assert (overheads == 0) == (device == "cpu")
    bad = runner.invoke(app, ["memory", "--model", "tests/fixtures/hf/gpt2.json",
                              "--optimizer-impl", "turbo"])
    assert bad.exit_code == 2 and "optimizer.impl" in bad.output
