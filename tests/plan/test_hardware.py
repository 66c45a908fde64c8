"""The GPU table: ambiguous names are refused with the candidates, datasheet sanity."""

from __future__ import annotations

import pytest

from sapper.errors import InputError
from sapper.plan.hardware import GPUS, ambiguous_gpu, find_gpu, resolve_gpu
from sapper.plan.load import PlanSource, build_plan


@pytest.mark.parametrize(
    ("name", "candidates"),
    [
        ("A100", ("A100-40GB", "A100-80GB")),
        ("a100", ("A100-40GB", "A100-80GB")),
        ("V100", ("V100-16GB", "V100-32GB")),
        ("GH200", ("GH200-96GB", "GH200-144GB")),
    ],
)
def test_ambiguous_names_are_errors_listing_the_candidates(
    name: str, candidates: tuple[str, ...]
) -> None:
    assert find_gpu(name) is None
    assert ambiguous_gpu(name) == candidates
    with pytest.raises(InputError) as err:
        resolve_gpu(name)
    assert err.value.exit_code == 2
    assert all(c in str(err.value) for c in candidates)


def test_an_ambiguous_gpu_in_a_plan_is_an_input_error() -> None:
    src = PlanSource(name="command line", data={"hardware": {"gpu": "A100"}})
    with pytest.raises(InputError) as err:
        build_plan([src])
    assert err.value.exit_code == 2
    assert "A100-40GB" in str(err.value) and "A100-80GB" in str(err.value)


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("H100", "H100"),
        ("h100-sxm", "H100"),
        ("A100-80GB", "A100-80GB"),
        ("A100-SXM4-40GB", "A100-40GB"),
        ("H100-PCIe", "H100-PCIe"),
        ("H100 NVL", "H100-NVL"),
        ("GH200-144GB", "GH200-144GB"),
        ("b200", "B200"),
        ("MI250X", "MI250X"),
        ("L40", "L40"),
        ("L40S", "L40S"),
    ],
)
def test_names_resolve(name: str, canonical: str) -> None:
    assert resolve_gpu(name).name == canonical


@pytest.mark.parametrize("name", ["A10G", "L4", "L40", "H100-PCIe", "H100-NVL", "H20",
                                  "GH200-96GB", "GH200-144GB", "B200", "MI250X"])
def test_new_entries_are_complete(name: str) -> None:
    g = resolve_gpu(name)
    assert g.memory_gib > 0 and g.hbm_gbps > 0 and g.sms > 0
    assert g.tflops_bf16 > 0 and g.tflops_fp16 == g.tflops_bf16
    assert g.nvlink_domain >= 1 and g.interconnect
    # dense figures: no entry quotes a sparse tensor rate above its fp8 dense rate
    assert g.tflops_fp8 == 0 or g.tflops_fp8 == pytest.approx(2 * g.tflops_bf16, rel=0.01)


def _norm(name: str) -> str:
    return "".join(ch for ch in name.upper() if ch.isalnum())


def test_no_name_fits_two_entries() -> None:
    per_gpu = [{_norm(n) for n in (g.name, *g.aliases)} for g in GPUS]
    keys = [k for names in per_gpu for k in names]
    assert len(keys) == len(set(keys))
    assert not {"A100", "V100", "GH200"} & set(keys)
