"""The analytic estimator: API, input errors, and how layouts move the bytes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from memory_plans import LLAMA_7B, make_plan

from sapper.errors import InputError
from sapper.memory import MemoryEstimate, estimate
from sapper.model import MissingInput
from sapper.plan.load import load_plan

CATS = {"params", "grads", "optimizer", "activations", "temporaries", "overheads"}


def _plan(**sections):  # type: ignore[no-untyped-def]
    hardware = {"gpu": "A100-80GB", "num_gpus": 8, **sections.pop("hardware", {})}
    return make_plan(hardware=hardware, **sections)


def test_public_result_shape() -> None:
    est = estimate(_plan(parallel={"zero_stage": 1}))
    assert isinstance(est, MemoryEstimate)
    assert set(est.breakdown) == CATS
    assert est.peak_bytes == sum(est.breakdown.values())
    assert est.peak_bytes > est.tensor_peak_bytes
    assert est.gpu_bytes == 80 * 2**30
    assert est.fits is (est.peak_bytes <= est.gpu_bytes)
    assert est.headroom_bytes == est.gpu_bytes - est.peak_bytes
    assert len(est.stages) == 1 and est.peak_phase in {"forward", "backward", "optimizer"}
    payload = est.to_json()
    assert payload["peak_bytes"] == est.peak_bytes and payload["dominant"] == est.dominant


def test_no_gpu_means_no_verdict() -> None:
    est = estimate(make_plan())
    assert est.fits is None and est.headroom_bytes is None and est.gpu_bytes is None


def test_estimate_does_not_import_torch() -> None:
    code = (
        "import sys; from sapper.plan.load import load_plan; from sapper.memory import estimate;"
        "estimate(load_plan('examples/plans/healthy-llama-7b.yaml').plan);"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="."
    )
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ({**LLAMA_7B, "num_heads": 30}, "model.num_heads"),  # 4096 % 30 != 0
        ({**LLAMA_7B, "num_kv_heads": 5}, "model.num_kv_heads"),
    ],
)
def test_impossible_architecture_is_an_input_error(model: dict, field: str) -> None:
    with pytest.raises(InputError) as err:
        estimate(make_plan(model))
    assert err.value.field == field


@pytest.mark.parametrize(
    ("yaml_text", "field"),
    [
        ("num_layers: 0", "model.num_layers"),
        ("hidden_size: -4096", "model.hidden_size"),
    ],
)
def test_zero_or_negative_sizes_are_input_errors(tmp_path, yaml_text: str, field: str) -> None:  # type: ignore[no-untyped-def]
    model = "\n".join(
        f"  {k}: {v}" for k, v in {**LLAMA_7B, **dict([yaml_text.split(": ")])}.items()
    )
    path = tmp_path / "plan.yaml"
    path.write_text(f"model:\n{model}\nbatch: {{micro_batch_size: 1, seq_len: 128}}\n")
    with pytest.raises(InputError) as err:
        estimate(load_plan(path).plan)
    assert field in str(err.value)


def test_more_stages_than_layers_is_an_input_error() -> None:
    with pytest.raises(InputError, match="exceeds the 32 layers"):
        estimate(_plan(parallel={"pp": 64}))


def test_missing_batch_is_reported_as_missing() -> None:
    plan = make_plan(batch={"micro_batch_size": None})
    with pytest.raises(MissingInput) as err:
        estimate(plan)
    assert err.value.field == "batch.micro_batch_size"


def test_zero_stages_shard_monotonically() -> None:
    peaks = [estimate(_plan(parallel={"zero_stage": z})).peak_bytes for z in range(4)]
    assert peaks == sorted(peaks, reverse=True) and peaks[0] > 2 * peaks[3]


def test_checkpointing_and_flash_attention_cut_activations() -> None:
    big = {"batch": {"micro_batch_size": 4, "seq_len": 4096}}
    plain = estimate(_plan(**big, parallel={"zero_stage": 3}))
    full = {"zero_stage": 3, "checkpointing": {"granularity": "full"}}
    ckpt = estimate(_plan(**big, parallel=full))
    eager = estimate(_plan(model={**LLAMA_7B, "attention_impl": "eager"}, **big,
                           parallel={"zero_stage": 3}))
    assert ckpt.stages[0].phases["forward"]["activations"] < (
        plain.stages[0].phases["forward"]["activations"] / 5
    )
    assert eager.peak_bytes > plain.peak_bytes


def test_gqa_keeps_fewer_activations_than_mha() -> None:
    gqa = estimate(_plan(model={**LLAMA_7B, "num_kv_heads": 8}))
    mha = estimate(_plan())
    assert gqa.stages[0].phases["forward"]["activations"] < (
        mha.stages[0].phases["forward"]["activations"]
    )


def test_1f1b_first_stage_holds_more_micro_batches() -> None:
    est = estimate(_plan(parallel={"pp": 4}, batch={"gradient_accumulation_steps": 8},
                         hardware={"num_gpus": 32}))
    flights = [s.in_flight for s in est.stages]
    assert flights == [4, 3, 2, 1]
    acts = [s.phases["forward"]["activations"] for s in est.stages]
    assert acts[0] > acts[-1]


def test_interleaved_schedule_holds_more_than_1f1b() -> None:
    base = {"pp": 4, "pipeline_schedule": "interleaved"}
    one = estimate(_plan(parallel=base, batch={"gradient_accumulation_steps": 16}))
    two = estimate(_plan(parallel={**base, "virtual_pipeline_stages": 2},
                         batch={"gradient_accumulation_steps": 16}))
    assert two.stages[0].in_flight > one.stages[0].in_flight


def test_offload_moves_states_to_the_host() -> None:
    on = estimate(_plan(parallel={"zero_stage": 2, "offload_optimizer": "cpu"}))
    off = estimate(_plan(parallel={"zero_stage": 2}))
    assert on.breakdown["optimizer"] == 0 < off.breakdown["optimizer"]
    assert on.host_bytes_per_node > 0 == off.host_bytes_per_node


def test_tensor_and_sequence_parallel_shard_activations() -> None:
    t1 = estimate(_plan(parallel={"tp": 1}, batch={"seq_len": 8192}))
    t8 = estimate(_plan(parallel={"tp": 8}, batch={"seq_len": 8192}))
    sp = estimate(_plan(parallel={"tp": 8, "sequence_parallel": True}, batch={"seq_len": 8192}))
    a = [e.stages[0].phases["forward"]["activations"] for e in (t1, t8, sp)]
    assert a[0] > a[1] > a[2]


def test_exact_parameter_count_is_used() -> None:
    model = {**LLAMA_7B, "num_params": 6_738_415_616}
    assert estimate(make_plan(model)).num_params == 6_738_415_616
