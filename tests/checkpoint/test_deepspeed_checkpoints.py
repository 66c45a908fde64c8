"""DeepSpeed ZeRO checkpoints written by DeepSpeed itself (0.19.8 on CPU, gloo; see
tests/fixtures/SOURCES.md): ZeRO 1 fp32 on one rank, ZeRO 2 and ZeRO 3 bf16 on two.
ZeRO 2 and 3 also with frozen parameters (every layer's q_proj and k_proj outside the
optimizer). Parameter names and fp32 masters are checked against what DeepSpeed's own
``zero_to_fp32`` reconstructs from the same files; faults are planted into copies
re-saved under DeepSpeed's class names (the shipped files are never modified)."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import math
import shutil
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import stable_settings, time_limit

from sapper.checkpoint import inspect_paths
from sapper.checkpoint.deepspeed import read_deepspeed
from sapper.errors import InputError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "checkpoints" / "deepspeed"
CASES = ["zero1-fp32-dp1", "zero2-bf16-dp2", "zero3-bf16-dp2"]


@contextlib.contextmanager
def _deepspeed_names() -> Iterator[dict[str, type]]:
    """Stand-in modules under DeepSpeed's names, so a test can load a real file with
    plain pickle and save it back with the same global names (DeepSpeed is absent)."""

    class LossScaler:
        pass

    class DynamicLossScaler(LossScaler):
        pass

    class ZeroStageEnum(int, enum.Enum):
        disabled = 0
        optimizer_states = 1
        gradients = 2
        weights = 3

    @dataclasses.dataclass
    class fragment_address:
        numel: int
        start: int

    homes = {
        "deepspeed.runtime.fp16.loss_scaler": [LossScaler, DynamicLossScaler],
        "deepspeed.runtime.zero.config": [ZeroStageEnum],
        "deepspeed.utils.tensor_fragment": [fragment_address],
    }
    modules = {
        name: types.ModuleType(name)
        for name in ("deepspeed", "deepspeed.runtime", "deepspeed.runtime.fp16",
                     "deepspeed.runtime.zero", "deepspeed.utils")
    }  # fmt: skip
    classes = {}
    for module_name, members in homes.items():
        module = modules.setdefault(module_name, types.ModuleType(module_name))
        for cls in members:
            cls.__module__, cls.__qualname__ = module_name, cls.__name__
            setattr(module, cls.__name__, cls)
            classes[cls.__name__] = cls
    with mock.patch.dict(sys.modules, modules):
        yield classes


@pytest.fixture
def deepspeed_names() -> Iterator[dict[str, type]]:
    with _deepspeed_names() as classes:
        yield classes


def _copy(case: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / case, tmp_path / case))


def _optim_files(root: Path) -> list[Path]:
    return sorted((root / "global_step3").glob("*_optim_states.pt"))


def _rewrite(path: Path, change) -> None:  # type: ignore[no-untyped-def]
    obj = torch.load(path, weights_only=False)
    change(obj["optimizer_state_dict"])
    torch.save(obj, path)


@pytest.mark.parametrize("case", CASES)
def test_masters_are_what_zero_to_fp32_reconstructs(case: str) -> None:
    ckpt = read_deepspeed(FIXTURES / case / "global_step3")
    reference = torch.load(FIXTURES / f"{case}.zero_to_fp32.pt", weights_only=True)
    # zero_to_fp32 adds the tied head back as a copy of the embedding it shares
    assert set(ckpt.masters.keys()) == set(reference) - {"lm_head.weight"}
    for name in ckpt.masters.keys():
        assert torch.equal(ckpt.masters.tensor(name), reference[name]), name
    assert ckpt.zero_stage == int(case[4]) and ckpt.world == int(case[-1])
    assert set(ckpt.moments) == {"exp_avg", "exp_avg_sq"}
    for name in ckpt.masters.keys():
        assert ckpt.moments["exp_avg_sq"].tensor(name).shape == reference[name].shape


@pytest.mark.parametrize("case", CASES)
def test_healthy_deepspeed_saves_inspect_silently(case: str) -> None:
    for path in (FIXTURES / case, FIXTURES / case / "global_step3"):  # root or tag folder
        result = inspect_paths([path])
        assert [f.code for f in result.findings] == [], [f.message for f in result.findings]
        summary = result.to_json()["summary"]["checkpoints"][0]
        assert summary["format"] == "deepspeed"
        assert summary["steps"] == {"optimizer": 3.0, "trainer": 3.0}
        assert summary["pieces"]["optimizer"] and summary["pieces"]["scheduler"]
        assert len(result.checkpoints[0].updates) == 19  # every trained parameter, by name
        assert all(not u.name.startswith("optimizer") for u in result.checkpoints[0].updates)


FROZEN = tuple(f"model.layers.{i}.self_attn.{p}_proj.weight" for i in (0, 1) for p in "qk")


@pytest.mark.parametrize("case", ["zero2-bf16-dp2-frozen", "zero3-bf16-dp2-frozen"])
def test_frozen_parameters_are_read_as_zero_to_fp32_reads_them(case: str) -> None:
    """ZeRO 3 keeps frozen weights apart, a piece per rank in frozen_param_fragments;
    ZeRO 2 keeps them in module: either way they are the weights zero_to_fp32 returns
    (in the 16-bit dtype they were saved in), not trained, and inspected like the rest."""
    reference = torch.load(FIXTURES / f"{case}.zero_to_fp32.pt", weights_only=True)
    result = inspect_paths([FIXTURES / case])
    assert result.findings == [], [f.message for f in result.findings]
    rep = result.checkpoints[0]
    weights = {s.key: s for s in rep.weights}
    assert set(FROZEN) <= set(weights)
    assert len(rep.updates) == 19 - len(FROZEN)  # moments for the trained ones only
    ckpt = read_deepspeed(FIXTURES / case / "global_step3")
    frozen = ckpt.frozen
    for name in FROZEN:
        got = frozen.tensor(name) if frozen is not None else ckpt.module[name]
        assert got.dtype == torch.bfloat16 and got.shape == reference[name].shape
        assert torch.equal(got.float(), reference[name].float()), name
        rms = float(reference[name].float().pow(2).mean().sqrt())
        assert weights[name].rms == pytest.approx(rms)
    assert (frozen is not None) == case.startswith("zero3")


def test_nan_in_one_ranks_master_partition_names_the_parameter(
    tmp_path: Path, deepspeed_names: dict[str, type]
) -> None:
    root = _copy("zero2-bf16-dp2", tmp_path)
    rank1 = _optim_files(root)[1]
    mapping = read_deepspeed(root / "global_step3")
    # element 130 of rank 1's partition: inside layers.1.input_layernorm.bias (starts at 128)
    pieces = mapping.masters.pieces("model.layers.1.input_layernorm.bias")
    assert [(s, n) for _, s, n in pieces] == [(128, 8)]

    def plant(sd: dict) -> None:
        sd["single_partition_of_fp32_groups"][0].data[130] = float("nan")

    _rewrite(rank1, plant)
    result = inspect_paths([root])
    k001 = [f for f in result.findings if f.code == "K001"]
    assert len(k001) == 1
    assert k001[0].data["tensor"] == "model.layers.1.input_layernorm.bias"
    assert "fp32 master weight" in k001[0].message and k001[0].data["first_index"] == [2]
    assert result.exit_code() == 1


def test_underflowed_second_moment_under_zero3_names_the_parameter(
    tmp_path: Path, deepspeed_names: dict[str, type]
) -> None:
    root = _copy("zero3-bf16-dp2", tmp_path)
    name = "model.layers.1.mlp.down_proj.weight"
    pieces = read_deepspeed(root / "global_step3").masters.pieces(name)
    files = _optim_files(root)
    for rank, (path, (_, start, numel)) in enumerate(zip(files, pieces, strict=True)):

        def plant(sd: dict, start: int = start, numel: int = numel) -> None:
            sd["optimizer_state_dict"]["state"][0]["exp_avg_sq"].data[start : start + numel] = 0.0

        _rewrite(path, plant)
        assert rank < 2
    result = inspect_paths([root])
    k004 = [f for f in result.findings if f.code == "K004"]
    assert [f.data["tensor"] for f in k004] == [name]


def test_fp16_loss_scaler_at_its_floor_and_a_healthy_one(
    tmp_path: Path, deepspeed_names: dict[str, type]
) -> None:
    dynamic = deepspeed_names["DynamicLossScaler"]
    for scale, codes in ((1.0, ["K006"]), (65536.0, [])):
        root = _copy("zero1-fp32-dp1", tmp_path / str(scale))

        def plant(sd: dict, scale: float = scale) -> None:
            scaler = dynamic()
            scaler.__dict__.update(cur_scale=scale, cur_iter=3, last_overflow_iter=2,
                                   scale_factor=2.0, scale_window=1000, min_scale=1.0,
                                   delayed_shift=1, dynamic=True)  # fmt: skip
            sd["loss_scaler"], sd["dynamic_loss_scale"] = scaler, True

        _rewrite(_optim_files(root)[0], plant)
        result = inspect_paths([root])
        assert [f.code for f in result.findings] == codes
        assert result.to_json()["summary"]["checkpoints"][0]["pieces"]["scaler"]


def test_older_saves_without_slice_mappings_walk_param_shapes(
    tmp_path: Path, deepspeed_names: dict[str, type]
) -> None:
    root = _copy("zero2-bf16-dp2", tmp_path)
    for path in _optim_files(root):
        _rewrite(path, lambda sd: sd.pop("param_slice_mappings"))
    ckpt = read_deepspeed(root / "global_step3")
    reference = torch.load(FIXTURES / "zero2-bf16-dp2.zero_to_fp32.pt", weights_only=True)
    for name in ckpt.masters.keys():
        assert torch.equal(ckpt.masters.tensor(name), reference[name]), name
    # the parameter that straddles the two ranks comes back in two pieces
    assert len(ckpt.masters.pieces("model.layers.0.mlp.down_proj.weight")) == 2


TP = "zero2-bf16-tp2-dp2"


def test_model_parallel_ranks_are_read_apart_as_zero_to_fp32_reads_each() -> None:
    """Megatron-DeepSpeed's tensor-parallel layout: one mp_rank_XX set of files per
    model-parallel rank, the same names in each. Each rank's masters are what zero_to_fp32
    rebuilds from that rank's files alone; names are kept apart as mp_rank_XX/<name>."""
    ckpt = read_deepspeed(FIXTURES / TP / "global_step3")
    reference = torch.load(FIXTURES / f"{TP}.zero_to_fp32.pt", weights_only=True)
    assert set(ckpt.masters.keys()) == set(reference) - {"mp_rank_00/lm_head.weight"}
    for name in ckpt.masters.keys():
        assert torch.equal(ckpt.masters.tensor(name), reference[name]), name
    assert ckpt.world == 2 and ckpt.engine["model_parallel"] == 2
    a, b = (ckpt.masters.tensor(f"mp_rank_0{r}/model.layers.0.mlp.up_proj.weight") for r in (0, 1))
    assert not torch.equal(a, b)  # each rank's own slice
    result = inspect_paths([FIXTURES / TP])
    assert result.findings == [], [f.message for f in result.findings]
    assert len(result.checkpoints[0].updates) == 38


def test_nan_in_the_second_model_parallel_rank_names_it(
    tmp_path: Path, deepspeed_names: dict[str, type]
) -> None:
    root = _copy(TP, tmp_path)
    name = "mp_rank_01/model.layers.1.mlp.down_proj.weight"
    (flat, start, _), *_ = read_deepspeed(root / "global_step3").masters.pieces(name)
    def partition(path: Path) -> torch.Tensor:
        sd = torch.load(path, weights_only=False)["optimizer_state_dict"]
        return sd["single_partition_of_fp32_groups"][0]

    # the data rank whose partition holds the parameter's first piece
    path = next(
        p for p in _optim_files(root) if "mp_rank_01" in p.name and torch.equal(partition(p), flat)
    )

    def plant(sd: dict) -> None:
        sd["single_partition_of_fp32_groups"][0].data[start] = float("inf")

    _rewrite(path, plant)
    k001 = [f for f in inspect_paths([root]).findings if f.code == "K001"]
    assert [f.data["tensor"] for f in k001] == [name]


def test_a_zero3_frozen_fragment_missing_on_one_rank_is_named(tmp_path: Path) -> None:
    root = _copy("zero3-bf16-dp2-frozen", tmp_path)
    path = root / "global_step3" / "zero_pp_rank_1_mp_rank_00_model_states.pt"
    obj = torch.load(path, weights_only=False)
    del obj["frozen_param_fragments"][FROZEN[2]]
    torch.save(obj, path)
    with pytest.raises(InputError) as err:
        inspect_paths([root])
    assert str(path) in str(err.value) and FROZEN[2] in str(err.value)


def test_hf_trainer_folder_around_a_deepspeed_save_checks_the_step(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-3"
    shutil.copytree(FIXTURES / "zero2-bf16-dp2", folder)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 5, "log_history": []}))
    result = inspect_paths([folder])
    summary = result.to_json()["summary"]["checkpoints"][0]
    assert summary["format"] == "hf-trainer" and summary["steps"]["trainer"] == 5.0
    assert "K007" in [f.code for f in result.findings]  # Adam says 3, the Trainer 5


@pytest.mark.parametrize(
    ("case", "dtype", "flagged"),
    [("zero3-bf16-dp2", "bfloat16", False), ("zero2-bf16-dp2", "bfloat16", False),
     ("zero2-bf16-dp2", "float16", True)],
)  # fmt: skip
def test_dtype_against_config_reads_the_model_weights_not_the_masters(
    tmp_path: Path, case: str, dtype: str, flagged: bool
) -> None:
    """ZeRO 3 keeps only fp32 masters: fp32 there is not a dtype the config disagrees
    with; ZeRO 2's 16-bit module weights are compared as usual."""
    folder = Path(shutil.copytree(FIXTURES / case, tmp_path / "checkpoint-3"))
    (folder / "config.json").write_text(json.dumps({"torch_dtype": dtype}))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 3}))
    codes = [f.code for f in inspect_paths([folder]).findings]
    assert ("K012" in codes) is flagged, codes


@pytest.mark.parametrize(
    ("latest", "why"),
    [("../outside", "names no saved tag folder"), ("global_step9", "names no saved tag folder")],
)
def test_latest_that_points_nowhere_is_one_input_error(
    tmp_path: Path, latest: str, why: str
) -> None:
    root = _copy("zero1-fp32-dp1", tmp_path)
    (root / "latest").write_text(latest)
    with pytest.raises(InputError, match=why):
        inspect_paths([root])


def test_fragment_past_its_partition_is_one_input_error(
    tmp_path: Path, deepspeed_names: dict[str, type]
) -> None:
    root = _copy("zero2-bf16-dp2", tmp_path)
    address = deepspeed_names["fragment_address"]

    def plant(sd: dict) -> None:
        sd["param_slice_mappings"][0]["model.norm.bias"] = address(numel=8, start=10_000)

    _rewrite(_optim_files(root)[1], plant)
    with pytest.raises(InputError, match="past the end of its flat partition"):
        inspect_paths([root])


def test_a_stand_in_called_like_a_function_is_refused(tmp_path: Path) -> None:
    """A pickle that calls DeepSpeed's LossScaler with arguments (REDUCE) gets the plain
    stand-in, which takes none: refused as unloadable, nothing of DeepSpeed runs."""
    import pickle

    class Call:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (types.SimpleNamespace, ("rm -rf /",))

    data = pickle.dumps({"optimizer_state_dict": Call()}, protocol=2).replace(
        b"types\nSimpleNamespace", b"deepspeed.runtime.fp16.loss_scaler\nLossScaler"
    )
    bad = _copy("zero1-fp32-dp1", tmp_path)
    target = _optim_files(bad)[0]
    target.write_bytes(data)
    with pytest.raises(InputError) as info:
        inspect_paths([bad])
    assert str(target) in str(info.value)


_ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.lists(st.integers(-3, 10**6), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(-3, 10**6), max_size=3),
    st.sampled_from([torch.zeros(0), torch.ones(3), torch.ones(2, 2), torch.arange(5)]),
    st.lists(
        st.sampled_from([torch.ones(3), torch.full((700,), math.nan), torch.ones(2, 2)]), max_size=2
    ),
    st.lists(
        st.dictionaries(
            st.sampled_from(["state", "param_groups", "model.norm.bias"]),
            st.integers(0, 700),
            max_size=2,
        ),
        max_size=2,
    ),
)
_OPTIM_KEYS = ("zero_stage", "partition_count", "single_partition_of_fp32_groups",
               "base_optimizer_state", "param_slice_mappings", "loss_scaler",
               "fp32_flat_groups", "optimizer_state_dict")  # fmt: skip
_MODEL_KEYS = ("param_shapes", "module", "global_steps", "lr_scheduler", "skipped_steps")


@given(
    case=st.sampled_from(CASES),
    in_optim=st.booleans(),
    pick=st.integers(0, 7),
    value=_ODD,
)
@stable_settings(120)
def test_odd_values_in_deepspeed_state_never_crash(
    tmp_path_factory: pytest.TempPathFactory, case: str, in_optim: bool, pick: int, value: object
) -> None:
    root = _copy(case, tmp_path_factory.mktemp("ds"))
    with _deepspeed_names():
        if in_optim:
            key = _OPTIM_KEYS[pick % len(_OPTIM_KEYS)]
            _rewrite(_optim_files(root)[-1], lambda sd: sd.__setitem__(key, value))
        else:
            key = _MODEL_KEYS[pick % len(_MODEL_KEYS)]
            path = sorted((root / "global_step3").glob("*model_states.pt"))[0]
            obj = torch.load(path, weights_only=False)
            obj[key] = value
            torch.save(obj, path)
    with time_limit(20):
        try:
            inspect_paths([root])
        except InputError as exc:
            assert str(root) in str(exc)


def test_a_fifo_in_the_tag_folder_is_one_input_error_not_a_hang(tmp_path: Path) -> None:
    import os

    root = _copy("zero2-bf16-dp2", tmp_path)
    rank1 = _optim_files(root)[1]
    rank1.unlink()
    os.mkfifo(rank1)
    with time_limit(20), pytest.raises(InputError, match="FIFO"):
        inspect_paths([root])
