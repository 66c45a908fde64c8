"""Numbers in a checkpoint's metadata that no framework writes: a loss scale of 2**2000, a
step or a learning rate of 10**400, a 400-digit ``global_step``, a JSON ``1e400``, a ZeRO
shape of 10**200. Each is one InputError line (exit 2) naming the file, the field, the
value and the valid range; whatever such a field holds, ``sapper inspect`` exits 0, 1 or
2, never with a traceback."""

from __future__ import annotations

import argparse
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from ckptgen import plant_json, plant_torch
from hypothesis import example, given
from hypothesis import strategies as st
from test_deepspeed_checkpoints import FIXTURES as DEEPSPEED
from test_deepspeed_checkpoints import _deepspeed_names
from test_megatron_checkpoints import _save as save_megatron
from tests.fuzz import stable_settings, time_limit
from typer.testing import CliRunner, Result

from sapper.checkpoint.numbers import MAX_COUNT, checked_number, checked_shape
from sapper.cli.app import _register_commands, app
from sapper.errors import InputError

runner = CliRunner()
_register_commands()

ZERO2 = "zero2-bf16-dp2"
FIRST = "model.embed_tokens.weight"  # the first parameter of the DeepSpeed fixtures


def _inspect(path: Path, *options: str) -> Result:
    """``sapper inspect`` in process: exit 0, 1 or 2, nothing raised past the CLI."""
    res = runner.invoke(app, ["inspect", *options, str(path)])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"sapper inspect raised {res.exception!r}") from res.exception
    assert res.exit_code in (0, 1, 2), res.output
    assert "Traceback" not in res.output
    return res


def _refused(path: Path, *needles: str) -> str:
    res = _inspect(path)
    assert res.exit_code == 2, res.output
    for needle in needles:
        assert needle in res.output, (needle, res.output)
    return res.output


# -- where each kind of checkpoint keeps its numbers -------------------------------------


def _hf(folder: Path, piece: str, key: str, value: Any) -> None:
    """Plant ``value`` at ``key`` of one piece of an HF Trainer checkpoint folder."""
    if piece == "scaler.pt":
        torch.save({"scale": 65536.0, "_growth_tracker": 0, key: value}, folder / piece)
    elif piece == "trainer_state.json":
        _plant_json_text(folder / piece, key, value)
    else:

        def edit(obj: dict) -> None:
            if key == "state.step":
                for entry in obj["state"].values():
                    entry["step"] = value
            elif key.startswith("param_groups."):
                field = key.split(".")[1]
                group = obj["param_groups"][0]
                group[field] = (value, 0.999) if field == "betas" else value
            elif key == "_last_lr":
                obj[key] = [value]
            else:
                obj[key] = value

        plant_torch(folder / piece, edit)


def _plant_json_text(path: Path, key: str, value: Any) -> None:
    """``value`` as JSON text (a str is written verbatim: ``1e400``, 400 digits, NaN)."""
    text = value if isinstance(value, str) else json.dumps(value)

    def edit(state: dict) -> None:
        if key.startswith("log_history."):
            entry = next(e for e in state["log_history"] if "learning_rate" in e)
            entry[key.split(".")[1]] = "@@VALUE@@"
        else:
            state[key] = "@@VALUE@@"

    plant_json(path, edit)
    path.write_text(path.read_text().replace('"@@VALUE@@"', text))


def _deepspeed(root: Path, where: str, key: str, value: Any) -> None:
    """Plant ``value`` in the first model states or optimizer partition of a ZeRO save,
    re-saved under DeepSpeed's class names."""
    tag = root / "global_step3"
    with _deepspeed_names() as classes:
        if where == "model":
            path = sorted(tag.glob("*model_states.pt"))[0]
            obj = torch.load(path, weights_only=False)
            if key == "param_shapes":
                obj[key][0][FIRST] = [value, 8]
            else:
                obj[key] = value
        else:
            path = sorted(tag.glob("*optim_states.pt"))[0]
            obj = torch.load(path, weights_only=False)
            sd = obj["optimizer_state_dict"]
            inner = sd["base_optimizer_state"]
            if key == "cur_scale":
                scaler = classes["DynamicLossScaler"]()
                scaler.__dict__.update(cur_scale=value, cur_iter=3, scale_factor=2.0,
                                       scale_window=1000, min_scale=1.0, dynamic=True)  # fmt: skip
                sd["loss_scaler"], sd["dynamic_loss_scale"] = scaler, True
            elif key == "step":
                for entry in inner["state"].values():
                    entry["step"] = value
            elif key == "lr":
                inner["param_groups"][0]["lr"] = value
            else:  # a fragment address's numel or start
                addr = sd["param_slice_mappings"][0][FIRST]
                fields = {"numel": addr.numel, "start": addr.start, key: value}
                sd["param_slice_mappings"][0][FIRST] = classes["fragment_address"](**fields)
        torch.save(obj, path)


def _megatron(root: Path, key: str, value: Any) -> None:
    """Plant ``value`` in every rank's model_optim_rng.pt of a Megatron-LM save."""
    for path in sorted(root.glob("iter_0000002/mp_rank_*/model_optim_rng.pt")):
        _megatron_file(path, key, value)


def _megatron_file(path: Path, key: str, value: Any) -> None:
    obj = torch.load(path, weights_only=False)
    if key.startswith("args."):
        setattr(obj["args"], key.removeprefix("args."), value)
    elif key == "grad_scaler.scale":
        obj["optimizer"]["grad_scaler"]["scale"] = value
    elif key == "state.step":
        for entry in obj["optimizer"]["optimizer"]["state"].values():
            entry["step"] = value
    elif key == "lr":
        obj["optimizer"]["optimizer"]["param_groups"][0]["lr"] = value
    elif key == "num_steps":
        obj["opt_param_scheduler"]["num_steps"] = value
    else:
        obj[key] = value
    torch.save(obj, path)


@pytest.fixture(scope="module")
def megatron_save(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_megatron(tmp_path_factory.mktemp("megatron") / "ckpt")


# -- the four named cases, and one per kind of field --------------------------------------


def test_loss_scale_of_2_to_the_2000(hf_run, tmp_path: Path, megatron_save: Path) -> None:
    folder = shutil.copytree(hf_run[1], tmp_path / "hf")
    _hf(folder, "scaler.pt", "scale", 2**2000)
    out = _refused(folder, "scaler.pt: scale", "number too large for a float", "602 digits")
    assert "1.8e308" in out
    root = shutil.copytree(DEEPSPEED / ZERO2, tmp_path / "ds")
    _deepspeed(root, "optim", "cur_scale", 2**2000)
    _refused(root, "optim_states.pt", "loss_scaler.cur_scale", "number too large for a float")
    mega = shutil.copytree(megatron_save, tmp_path / "megatron")
    _megatron(mega, "grad_scaler.scale", 2**2000)
    _refused(mega, "model_optim_rng.pt: optimizer.grad_scaler: scale", "too large for a float")


def test_step_and_learning_rate_of_10_to_the_400(hf_run, tmp_path: Path) -> None:
    for key, field in (("state.step", "state.0.step"), ("param_groups.lr", "param_groups.0.lr")):
        folder = shutil.copytree(hf_run[1], tmp_path / key)
        _hf(folder, "optimizer.pt", key, 10**400)
        _refused(folder, f"optimizer.pt: {field}", "about 400 digits")
    folder = shutil.copytree(hf_run[1], tmp_path / "sched")
    _hf(folder, "scheduler.pt", "last_epoch", 10**400)
    _refused(folder, "scheduler.pt: last_epoch", "an integer in -1 … 2^63-1")


def test_global_step_of_400_digits_or_1e400(hf_run, tmp_path: Path) -> None:
    for name, text, problem in (
        ("digits", "1" * 400, "count out of range"),
        ("exponent", "1e400", "not an integer count (got inf)"),
        ("nan", "NaN", "not an integer count (got nan)"),
        ("fraction", "2.5", "not an integer count (got 2.5)"),
        ("negative", "-3", "count out of range (got -3)"),
    ):
        folder = shutil.copytree(hf_run[1], tmp_path / name)
        _hf(folder, "trainer_state.json", "global_step", text)
        out = _refused(folder, "trainer_state.json: global_step", problem)
        assert "expected an integer in 0 … 2^63-1" in out
    folder = shutil.copytree(hf_run[1], tmp_path / "history")
    _hf(folder, "trainer_state.json", "log_history.step", "1e400")
    _refused(folder, "trainer_state.json: log_history.0.step", "not an integer count")


def test_zero_param_shape_of_10_to_the_200(tmp_path: Path) -> None:
    root = shutil.copytree(DEEPSPEED / ZERO2, tmp_path / "ds")
    _deepspeed(root, "model", "param_shapes", 10**200)
    _refused(root, f"param_shapes.{FIRST}.0", "about 200 digits", "0 … 2^48-1")
    for case in ("zero3-bf16-dp2", "zero1-fp32-dp1"):  # and under ZeRO 3, and 2^40 x 2^40
        root = shutil.copytree(DEEPSPEED / case, tmp_path / case)
        with _deepspeed_names():
            path = sorted((root / "global_step3").glob("*model_states.pt"))[0]
            obj = torch.load(path, weights_only=False)
            obj["param_shapes"][0][FIRST] = [2**40, 2**40, 2**40]
            torch.save(obj, path)
        _refused(root, f"param_shapes.{FIRST}", "more elements than a tensor can")


def test_megatron_iteration_and_deepspeed_counters(tmp_path: Path, megatron_save: Path) -> None:
    mega = shutil.copytree(megatron_save, tmp_path / "megatron")
    _megatron(mega, "iteration", 10**400)
    _refused(mega, "model_optim_rng.pt: iteration", "count out of range")
    for where, key, field in (
        ("model", "global_steps", "global_steps"),
        ("optim", "step", "state.step"),
        ("optim", "numel", f"param_slice_mappings.0.{FIRST}.numel"),
    ):
        root = shutil.copytree(DEEPSPEED / ZERO2, tmp_path / key)
        _deepspeed(root, where, key, 10**400)
        _refused(root, field, "about 400 digits")


def test_what_the_fields_hold_when_healthy_is_untouched(hf_run) -> None:
    res = _inspect(hf_run[1], "--format", "json")
    assert res.exit_code == 0
    assert json.loads(res.stdout)["summary"]["checkpoints"][0]["steps"] == {
        "optimizer": 4.0, "scheduler": 4.0, "trainer": 4.0,
    }  # fmt: skip


# -- the helper itself --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "integer", "want"),
    [
        (3, True, 3.0), (torch.tensor(4.0), True, 4.0), (np.int64(5), True, 5.0),
        (np.array(6.0), True, 6.0), (torch.tensor([7]), True, 7.0), (2.5, False, 2.5),
        (math.inf, False, math.inf), (-math.inf, False, -math.inf), (1e308, False, 1e308),
        (None, True, None), (True, True, None), ("12", True, None), ([1], True, None),
        (torch.ones(2), True, None), (torch.tensor(True), True, None),
        (torch.empty(1, device="meta"), True, None), (np.float32(0.5), False, 0.5),
    ],
)  # fmt: skip
def test_checked_number_accepts(value: Any, integer: bool, want: float | None) -> None:
    bounds = {"low": 0, "high": MAX_COUNT} if integer else {}
    assert checked_number(value, file="f", field="x", integer=integer, **bounds) == want


@pytest.mark.parametrize(
    ("value", "integer", "problem"),
    [
        (2**2000, False, "number too large for a float"),
        (-(10**400), False, "number too large for a float"),
        (2**2000, True, "count out of range"), (2**63, True, "count out of range"),
        (-1, True, "count out of range"), (math.nan, True, "not an integer count"),
        (math.inf, True, "not an integer count"), (2.5, True, "not an integer count"),
        (torch.tensor(math.nan), True, "not an integer count"),
        (torch.tensor(1 + 2j), False, "not a real number"), (3j, False, "not a real number"),
        (np.longdouble("1e400"), False, "number too large for a float"),
        (torch.tensor(1e30), True, "count out of range"),
    ],
)  # fmt: skip
def test_checked_number_refuses(value: Any, integer: bool, problem: str) -> None:
    if isinstance(value, np.longdouble) and not np.isfinite(value):
        pytest.skip("long double is a double here")
    high = MAX_COUNT if integer else math.inf
    low = 0 if integer else -math.inf
    with pytest.raises(InputError, match=problem) as info:
        checked_number(value, file="state.pt", field="a.b", low=low, high=high, integer=integer)
    assert str(info.value).startswith("state.pt: a.b: ")
    assert "expected " in str(info.value)


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ([2**48], "not a tensor size"), ([-1], "not a tensor size"), ([True], "not a tensor size"),
        ([2.0], "not a tensor size"), ([10**200], "not a tensor size"),
        ("12", "not a tensor shape"), ([1] * 65, "not a tensor shape"),
        ([2**40, 2**40], "more elements than a tensor can"),
    ],
)  # fmt: skip
def test_checked_shape(bad: Any, problem: str) -> None:
    assert checked_shape(torch.Size([2, 3]), file="f", field="s") == (2, 3)
    assert checked_shape([0, 2**48 - 1], file="f", field="s") == (0, 2**48 - 1)
    with pytest.raises(InputError, match=problem):
        checked_shape(bad, file="f", field="s")


# -- whatever such a field holds ----------------------------------------------------------

_HUGE = st.one_of(
    st.integers(64, 3000).map(lambda k: 2**k),
    st.integers(64, 3000).map(lambda k: -(2**k)),
    st.sampled_from([10**400, 2**2000, 10**200, 2**63, 2**64 - 1, 2**1024]),
)
_ODD_SCALARS = [
    torch.tensor(True), torch.tensor(1 + 2j), torch.tensor([3.0]), torch.ones(2),
    torch.tensor(math.inf).half(), torch.tensor(5.0, dtype=torch.bfloat16), torch.empty(0),
    np.array(2.0**70), np.array(-3), np.array(math.nan),
]  # fmt: skip
_PICKLED = st.one_of(
    _HUGE,
    _HUGE,  # drawn twice as often: the values no framework writes
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        [math.inf, -math.inf, math.nan, -1, 0, 1, True, False, None, "1e400", "", 2.5, 1e308, 3j]
    ),
    st.text(max_size=5),
    st.floats(allow_nan=True, allow_infinity=True, width=32).map(torch.tensor),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: torch.tensor(v, dtype=torch.int64)),
    st.sampled_from(_ODD_SCALARS),
)
_JSON_TEXT = st.one_of(
    st.sampled_from(["1e400", "-1e400", "1" * 400, "-" + "9" * 500, "1e-400", "NaN", "Infinity",
                     "-Infinity", "-0", "2.5", "3", "true", '"7"', "null", "[1]", "{}"]),
    st.integers(-(2**200), 2**200).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(json.dumps),
)  # fmt: skip

_HF_FIELDS = [
    ("scaler.pt", "scale"), ("scaler.pt", "_growth_tracker"), ("optimizer.pt", "state.step"),
    ("optimizer.pt", "param_groups.lr"), ("optimizer.pt", "param_groups.eps"),
    ("optimizer.pt", "param_groups.betas"), ("scheduler.pt", "last_epoch"),
    ("scheduler.pt", "_last_lr"), ("trainer_state.json", "global_step"),
    ("trainer_state.json", "log_history.step"), ("trainer_state.json", "log_history.learning_rate"),
]  # fmt: skip
_DS_FIELDS = [
    ("model", "global_steps"), ("model", "skipped_steps"), ("model", "param_shapes"),
    ("optim", "cur_scale"), ("optim", "step"), ("optim", "lr"), ("optim", "numel"),
    ("optim", "start"),
]  # fmt: skip
_MEGATRON_FIELDS = [
    "iteration", "args.lr", "args.train_iters", "grad_scaler.scale", "state.step", "lr",
    "num_steps", "checkpoint_version",
]  # fmt: skip
_FIELDS = (
    [("hf", *f) for f in _HF_FIELDS]
    + [("deepspeed", *f) for f in _DS_FIELDS]
    + [("megatron", "", f) for f in _MEGATRON_FIELDS]
)


@given(
    field=st.sampled_from(_FIELDS),
    pickled=_PICKLED,
    text=_JSON_TEXT,
    as_json=st.booleans(),
)
@example(field=("hf", "scaler.pt", "scale"), pickled=2**2000, text="1", as_json=False)
@example(field=("hf", "trainer_state.json", "global_step"), pickled=0, text="1e400", as_json=True)
@example(field=("deepspeed", "model", "param_shapes"), pickled=10**200, text="1", as_json=False)
@example(field=("deepspeed", "optim", "cur_scale"), pickled=math.nan, text="1", as_json=True)
@example(field=("megatron", "", "args.lr"), pickled=10**400, text="1", as_json=False)
@stable_settings(120)
def test_any_number_in_any_field_exits_0_1_or_2(
    hf_run, megatron_save: Path, tmp_path_factory: pytest.TempPathFactory,
    field: tuple[str, str, str], pickled: Any, text: str, as_json: bool,
) -> None:  # fmt: skip
    kind, where, key = field
    base = tmp_path_factory.mktemp("n")
    plant: Callable[[Path], None]
    if kind == "hf":
        folder = shutil.copytree(hf_run[1], base / "ckpt")
        value = text if where.endswith(".json") else pickled
        plant = lambda f: _hf(f, where, key, value)  # noqa: E731
    elif kind == "deepspeed":
        folder = shutil.copytree(DEEPSPEED / ZERO2, base / "ckpt")
        plant = lambda f: _deepspeed(f, where, key, pickled)  # noqa: E731
    else:
        folder = shutil.copytree(megatron_save, base / "ckpt")
        plant = lambda f: _megatron(f, key, pickled)  # noqa: E731
    try:
        plant(folder)
    except (OverflowError, ValueError, RuntimeError, TypeError):
        return  # a value the writing library itself cannot store there
    with time_limit(60):
        res = _inspect(folder, *(["--format", "json"] if as_json else []))
    if res.exit_code == 2:
        assert str(folder) in res.output, res.output
    elif as_json:
        json.loads(res.stdout)  # strict JSON whatever the numbers


def test_megatron_args_are_not_read(tmp_path: Path, megatron_save: Path) -> None:
    mega = shutil.copytree(megatron_save, tmp_path / "megatron")
    _megatron(mega, "args.train_iters", 10**400)
    assert _inspect(mega).exit_code == 0
    assert isinstance(torch.load(mega / "iter_0000002/mp_rank_00/model_optim_rng.pt",
                                 weights_only=False)["args"], argparse.Namespace)  # fmt: skip
