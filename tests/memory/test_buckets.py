"""DeepSpeed ZeRO buffer sizes: taken from the user's config, DeepSpeed's defaults where
it sets none, the HF integration's formula for "auto", unknown when that cannot apply.

The configs are real published ones (tests/fixtures/SOURCES.md, examples/deepspeed/).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from memory_plans import LLAMA_7B, TINY_LLAMA, make_plan
from rich.console import Console
from tests.fuzz import stable_settings

from sapper.errors import InputError
from sapper.memory import estimate
from sapper.memory.buckets import DEEPSPEED_DEFAULTS, Bucket, zero_buckets
from sapper.memory.inputs import shape_from_plan
from sapper.memory.report import render_memory
from sapper.memory.states import block_params, stage_param_count
from sapper.memory.temporaries import comm_buffers, master_grad_elements
from sapper.memory.verdict import verdict
from sapper.model import MissingInput
from sapper.plan.load import load_plan
from sapper.plan.readers.deepspeed import read_deepspeed_config
from sapper.plan.schema import Plan

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "deepspeed"
EXAMPLES = ROOT / "examples" / "deepspeed"


def _ds_plan(path: Path, model: dict[str, Any] | None = None, **parallel: Any) -> Plan:
    """The plan of a DeepSpeed config on a known model (8 GPUs, data parallel)."""
    src = read_deepspeed_config(path)
    return make_plan(
        model,
        framework="deepspeed",
        parallel={**src.data.get("parallel", {}), **parallel},
        hardware={"gpu": "A100-80GB", "num_gpus": 8},
        unresolved=src.unresolved,
    )


def _buffers(plan: Plan) -> tuple[int, int]:
    sh = shape_from_plan(plan)
    return comm_buffers(sh, stage_param_count(sh, 0), sh.layers)


def test_defaults_are_deepspeeds_own() -> None:
    zb = zero_buckets(make_plan(parallel={"zero_stage": 3}))
    for b in zb.all():
        assert b.elements == DEEPSPEED_DEFAULTS[b.name]
        assert "DeepSpeed default" in b.source
    assert not zb.deepspeed  # no DeepSpeed in the plan: its buffer rules do not apply


def test_sizes_from_a_real_zero3_config_bound_the_gathered_parameters() -> None:
    """DeepSpeed-Chat's actor config: prefetch and max live parameters 3·10^7, persistence
    threshold 10^4 (above Llama-7B's 4096-wide norms, so those stay whole)."""
    plan = _ds_plan(FIXTURES / "rlhf-actor-zero3-hybrid.json", overlap_dp_comm=True)
    zb = zero_buckets(plan)
    assert (zb.prefetch.elements, zb.max_live.elements, zb.persistence.elements) == (
        3 * 10**7, 3 * 10**7, 10**4,
    )
    assert zb.prefetch.source == "given"
    assert zb.reduce.elements == DEEPSPEED_DEFAULTS["reduce_bucket_size"]
    sh = shape_from_plan(plan)
    block = block_params(sh).total
    assert 2 * block + 3 * 10**7 > 3 * 10**7  # the cap binds
    keep, _ = _buffers(plan)
    default_keep, _ = _buffers(
        make_plan(
            framework="deepspeed",
            parallel={"zero_stage": 3},
            hardware={"gpu": "A100-80GB", "num_gpus": 8},
        )
    )
    w = sh.recipe.weight
    live_default = min(DEEPSPEED_DEFAULTS["max_live_parameters"],
                       2 * block + DEEPSPEED_DEFAULTS["prefetch_bucket_size"])
    # only the gathered parameters differ: the persistent vectors are kept under both
    # thresholds (10^4 and 10^5 exceed every vector of a 4096-wide block)
    assert default_keep - keep == (live_default - 3 * 10**7) * w


def test_hf_auto_sizes_follow_the_hidden_size() -> None:
    """transformers' integration: reduce hidden², stage-3 prefetch 0.9·hidden²,
    persistence 10·hidden."""
    plan = _ds_plan(EXAMPLES / "zero3-offload-hf-auto.json")
    zb = zero_buckets(plan)
    h = LLAMA_7B["hidden_size"]
    assert zb.reduce.elements == h * h
    assert zb.prefetch.elements == int(0.9 * h * h)
    assert zb.persistence.elements == 10 * h
    assert all("transformers" in b.source for b in (zb.reduce, zb.prefetch, zb.persistence))
    # what the file sets explicitly is used as is
    assert zb.sub_group.elements == 10**9 and zb.sub_group.source == "given"


def test_auto_without_a_hidden_size_stays_unknown() -> None:
    plan = Plan.model_validate(
        {"parallel": {"zero_stage": 3}, "unresolved": ["parallel.deepspeed.reduce_bucket_size"]}
    )
    zb = zero_buckets(plan)
    assert zb.reduce.elements is None and "hidden size is unknown" in zb.reduce.source
    assert zb.unknown == ("reduce_bucket_size",)


def test_auto_the_integration_does_not_fill_stops_the_estimate() -> None:
    """HF fills only the three hidden-size keys; "auto" max live parameters reaches
    DeepSpeed as a string, so the estimate names the key rather than assume a size."""
    plan = make_plan(
        framework="deepspeed",
        parallel={"zero_stage": 3},
        unresolved=["parallel.deepspeed.max_live_parameters"],
    )
    assert zero_buckets(plan).unknown == ("stage3_max_live_parameters",)
    with pytest.raises(MissingInput) as err:
        estimate(plan)
    assert err.value.field == "parallel.deepspeed.max_live_parameters"


def test_stage2_reduce_buffer_is_the_full_bucket_doubled_by_overlap_comm() -> None:
    """hf-trainer-zero2.json (the transformers docs' ZeRO-2 example): reduce bucket 2·10^8.
    DeepSpeed allocates the whole bucket each backward, a second one with overlap_comm."""
    grad = 2  # bf16 gradients
    on = _ds_plan(FIXTURES / "hf-trainer-zero2.json", overlap_dp_comm=True)
    off = _ds_plan(FIXTURES / "hf-trainer-zero2.json", overlap_dp_comm=False)
    assert _buffers(on) == (0, 2 * 2 * 10**8 * grad)
    assert _buffers(off) == (0, 2 * 10**8 * grad)
    # the second buffer raises the tensor peak by at most its size (the backward peak
    # moment may shift to another point of the backward)
    rise = estimate(on).tensor_peak_bytes - estimate(off).tensor_peak_bytes
    assert 0 < rise <= 2 * 10**8 * grad


def test_sub_group_size_bounds_the_fp32_gradient_of_the_zero3_step() -> None:
    plan = _ds_plan(FIXTURES / "nvme-infinity-zero3.json", offload_optimizer="none",
                    offload_params="none")
    sh = shape_from_plan(plan)
    assert sh.buckets.sub_group.elements == 10**9
    assert master_grad_elements(sh, 3 * 10**9) == 10**9
    assert master_grad_elements(sh, 10**6) == 10**6
    small = sh.replace(buckets=sh.buckets.__class__(
        *(b if b.name != "sub_group_size" else Bucket(b.name, 10**6, "test")
          for b in sh.buckets.all()),
        deepspeed=True,
    ))
    assert master_grad_elements(small, 3 * 10**9) == 10**6
    # ZeRO-1/2 cast the whole partition at once
    assert master_grad_elements(sh.replace(zero=2), 3 * 10**9) == 3 * 10**9


def test_persistent_tensors_follow_the_threshold() -> None:
    """Under the threshold the block's vectors stay whole on every GPU; at 0 none do."""
    kept = _ds_plan(FIXTURES / "nvme-infinity-zero3.json", offload_params="none",
                    offload_optimizer="none")
    none = kept.model_copy(deep=True)
    none.parallel.deepspeed.param_persistence_threshold = 0
    sh = shape_from_plan(kept)
    block = block_params(sh)
    vectors = (block.total - block.matmul) * sh.layers
    expected = (vectors - vectors // sh.dp) * sh.recipe.weight
    assert _buffers(kept)[0] - _buffers(none)[0] == expected > 0


_SIZE = st.one_of(
    st.integers(-2, 2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, 5e7, 5e8, 1e9, 1e12, 2**63 - 1, 2**63, 0.5, -1.0, "auto", "5e8"]),
    st.none(),
    st.booleans(),
    st.text(max_size=4),
)
_KEYS = [
    "reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
    "prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_param_persistence_threshold", "sub_group_size",
]


@stable_settings(300)
@given(
    stage=st.sampled_from([1, 2, 3]),
    sizes=st.dictionaries(st.sampled_from(_KEYS), _SIZE, max_size=4),
)
def test_any_zero_sizes_estimate_or_name_the_key(
    tmp_path_factory: pytest.TempPathFactory, stage: int, sizes: dict[str, Any]
) -> None:
    """Whatever a config writes for the sizes, reading, estimating and rendering it
    either works or raises one InputError naming a field; never a traceback, and every
    byte count stays a non-negative integer."""
    path = tmp_path_factory.mktemp("ds") / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": stage, **sizes}}))
    try:
        plan = _ds_plan(path)
        est = estimate(plan)
    except InputError as err:
        assert err.field
        return
    assert est.peak_bytes > 0
    for s in est.stages:
        for cats in s.phases.values():
            assert all(isinstance(v, int) and v >= 0 for v in cats.values())
    render_memory(plan, verdict(plan))


def _neox(tmp_path: Path, ds: Path) -> Plan:
    """GPT-NeoX-20B's real config.json with a DeepSpeed config on 8 A100s."""
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(
        "batch: {seq_len: 2048, micro_batch_size: 1}\nhardware: {gpu: A100-80GB, num_gpus: 8}\n"
    )
    return load_plan(
        plan_file, hf_config=ROOT / "tests" / "fixtures" / "hf" / "gpt-neox-20b.json",
        deepspeed=ds,
    ).plan


def test_published_zero3_config_sizes_reach_the_estimate(tmp_path: Path) -> None:
    """DeepSpeedExamples' GPT-NeoX-20B ZeRO-3 config writes every size out; the estimate
    uses them (the gathered parameters and the kept reduce buffer) and says so."""
    plan = _neox(tmp_path, FIXTURES / "gpt-neox-20b-zero3.json")
    zb = zero_buckets(plan)
    assert (zb.reduce.elements, zb.prefetch.elements) == (3 * 10**8, 2 * 10**8)
    assert {b.source for b in zb.all() if b.name != "allgather_bucket_size"
            and b.name != "sub_group_size"} == {"given"}
    sh = shape_from_plan(plan)
    block = block_params(sh).total
    keep, bwd = _buffers(plan)
    gathered = min(10**9, 2 * block + 2 * 10**8) * sh.recipe.weight
    reduce = 3 * 10**8 * sh.recipe.grad
    assert keep - _persistent_bytes(plan) == gathered + reduce
    assert bwd == block * sh.recipe.grad
    text = render_text(plan)
    assert "300,000,000" in text and "200,000,000" in text


def test_hf_auto_sizes_from_a_real_model_config(tmp_path: Path) -> None:
    """The transformers docs' ZeRO-3 "auto" config on GPT-NeoX-20B (hidden 6144)."""
    plan = _neox(tmp_path, EXAMPLES / "zero3-offload-hf-auto.json")
    assert plan.model is not None
    h = plan.model.hidden_size
    assert h == 6144
    zb = zero_buckets(plan)
    assert zb.reduce.elements == h * h and zb.persistence.elements == 10 * h
    text = render_text(plan)
    assert f"{h * h:,}" in text and "6144²" in text


def _persistent_bytes(plan: Plan) -> int:
    """What the threshold keeps whole: the difference a threshold of 0 makes."""
    none = plan.model_copy(deep=True)
    none.parallel.deepspeed.param_persistence_threshold = 0
    return _buffers(plan)[0] - _buffers(none)[0]


def render_text(plan: Plan) -> str:
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(render_memory(plan, verdict(plan)))
    return out.getvalue()


def test_json_verdict_lists_the_sizes_with_their_source() -> None:
    plan = _ds_plan(FIXTURES / "hf-trainer-zero2.json")
    sizes = {b["key"]: b for b in verdict(plan).to_json()["zero_buckets"]}  # type: ignore[union-attr]
    assert sizes["reduce_bucket_size"] == {
        "key": "reduce_bucket_size", "elements": 2 * 10**8, "source": "given",
    }
    assert sizes["stage3_prefetch_bucket_size"]["source"].startswith("DeepSpeed default")
    assert verdict(make_plan(parallel={"zero_stage": 2})).zero_buckets is None  # no DeepSpeed


def test_persistent_tensors_stay_on_the_gpu_under_parameter_offload() -> None:
    """ZeRO-Infinity's example offloads parameters to NVMe: the persisted tensors are
    still allocated on the GPU, whole (partition_parameters.py puts them on the local
    device), while states.py counts no parameter bytes there."""
    plan = _ds_plan(FIXTURES / "nvme-infinity-zero3.json")
    assert plan.parallel.offload_params == "nvme"
    sh = shape_from_plan(plan)
    block = block_params(sh)
    vectors = (block.total - block.matmul) * sh.layers
    assert _persistent_bytes(plan) == vectors * sh.recipe.weight


def test_a_narrow_models_projections_persist_too() -> None:
    """Width 128 (tests' tiny Llama): every 128×128 projection has 16384 elements, under
    DeepSpeed's default threshold of 10^5, and so do its 128×344 MLP matrices: the whole
    block stays on every GPU. At 20000 the three MLP matrices are partitioned again."""
    base = make_plan(TINY_LLAMA, framework="deepspeed", parallel={"zero_stage": 3},
                     hardware={"gpu": "A100-80GB", "num_gpus": 8})
    sh = shape_from_plan(base)
    block = block_params(sh)
    h, f = TINY_LLAMA["hidden_size"], TINY_LLAMA["ffn_hidden_size"]
    assert h * f <= DEEPSPEED_DEFAULTS["param_persistence_threshold"]

    def kept(per_block: int) -> int:
        n = per_block * sh.layers
        return (n - n // sh.dp) * sh.recipe.weight

    assert _persistent_bytes(base) == kept(block.total)
    tighter = base.model_copy(deep=True)
    tighter.parallel.deepspeed.param_persistence_threshold = 20_000
    assert _persistent_bytes(tighter) == kept(block.total - 3 * h * f)


def test_without_contiguous_gradients_only_the_flattened_bucket_is_held() -> None:
    """contiguous_gradients false (as some published ZeRO-1 configs set it): no
    preallocated reduce buffer; each bucket of gradients is flattened while reduced."""
    on = _ds_plan(FIXTURES / "hf-trainer-zero2.json", overlap_dp_comm=True)
    off = on.model_copy(deep=True)
    off.parallel.deepspeed.contiguous_gradients = False
    assert not zero_buckets(off).contiguous
    assert _buffers(off) == (0, 2 * 10**8 * 2)  # the bucket is smaller than the gradients
    z3 = _ds_plan(FIXTURES / "gpt-neox-20b-zero3.json", LLAMA_7B)
    z3_off = z3.model_copy(deep=True)
    z3_off.parallel.deepspeed.contiguous_gradients = False
    keep, bwd = _buffers(z3)
    keep_off, bwd_off = _buffers(z3_off)
    assert keep - keep_off == 3 * 10**8 * 2  # the kept stage-3 reduce buffer is gone
    assert bwd_off - bwd == 3 * 10**8 * 2  # and a flattened bucket appears in backward
    assert "contiguous_gradients false" in render_text(off)
