"""Bad input: one InputError line (exit 2) naming the file and the reason, in bounded time,
never a traceback and never a command run from a pickle."""

from __future__ import annotations

import json
import math
import os
import struct
import time
from pathlib import Path

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from safetensors.torch import save_file
from tests.fuzz import stable_settings, time_limit
from typer.testing import CliRunner

from sapper.checkpoint import inspect_paths
from sapper.cli.app import _register_commands, app
from sapper.errors import InputError

runner = CliRunner()
_register_commands()


def _exit2(path: Path, reason: str) -> None:
    start = time.monotonic()
    res = runner.invoke(app, ["inspect", str(path)])
    assert res.exit_code == 2, res.output
    assert time.monotonic() - start < 20
    assert "Traceback" not in res.output
    assert reason in res.output
    assert str(path.name) in res.output


def _safetensors_bytes() -> bytes:
    from safetensors.torch import save

    return save({"a.weight": torch.arange(12.0).reshape(3, 4), "b": torch.ones(5).half()})


class Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_that_runs_a_command_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    for name in ("evil.pt", "pytorch_model.bin"):
        torch.save({"w": torch.ones(2), "x": Evil(marker)}, tmp_path / name)
    with pytest.raises(InputError, match=r"refused to unpickle.*(posix|os)\.system"):
        inspect_paths([tmp_path / "evil.pt"])
    _exit2(tmp_path / "evil.pt", "refused to unpickle")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    torch.save({"state": {}, "param_groups": [], "x": Evil(marker)}, folder / "optimizer.pt")
    save_file({"w": torch.ones(2)}, folder / "model.safetensors")
    _exit2(folder, "optimizer.pt")
    assert not marker.exists()


def test_truncated_safetensors(tmp_path: Path) -> None:
    data = _safetensors_bytes()
    (tmp_path / "t.safetensors").write_bytes(data[:-3])
    _exit2(tmp_path / "t.safetensors", "outside the file")
    (tmp_path / "short.safetensors").write_bytes(data[:5])
    _exit2(tmp_path / "short.safetensors", "truncated")


def test_header_that_lies_about_offsets(tmp_path: Path) -> None:
    header = {"w": {"dtype": "F32", "shape": [1000, 1000], "data_offsets": [0, 4_000_000]}}
    raw = json.dumps(header).encode()
    (tmp_path / "lie.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 64)
    _exit2(tmp_path / "lie.safetensors", "outside the file")
    header = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}
    raw = json.dumps(header).encode()
    (tmp_path / "size.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 8)
    _exit2(tmp_path / "size.safetensors", "does not match its shape")


def test_offsets_with_a_gap_or_an_overlap(tmp_path: Path) -> None:
    for name, header, data in (
        ("gap", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, 16),
        (
            "overlap",
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            },
            8,
        ),
    ):
        raw = json.dumps(header).encode()
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * data)
        _exit2(path, "invalid offset")


def test_header_of_100_mb(tmp_path: Path) -> None:
    path = tmp_path / "huge.safetensors"
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", 100_000_000) + b"{")
        fh.truncate(8 + 100_000_000)  # sparse: no 100 MB written to the test disk
    _exit2(path, "header too large")


def test_fifo_and_symlink_loop(tmp_path: Path) -> None:
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    _exit2(fifo, "FIFO")
    _exit2(tmp_path, "FIFO")
    loop = tmp_path / "loop"
    os.symlink(tmp_path / "loop2", loop)
    os.symlink(loop, tmp_path / "loop2")
    _exit2(loop, "cannot open")
    folder = tmp_path / "f"
    folder.mkdir()
    os.symlink(folder / "model.safetensors", folder / "model.safetensors")
    _exit2(folder, "cannot open")


def test_folder_of_10000_empty_files(tmp_path: Path) -> None:
    for i in range(10_000):
        (tmp_path / f"f{i}.txt").touch()
    _exit2(tmp_path, "no checkpoint files")
    (tmp_path / "x.safetensors").touch()
    _exit2(tmp_path, "truncated")


def test_shard_index_escaping_its_folder(tmp_path: Path) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "../../etc/passwd"}}))
    _exit2(index, "not a file in the index's folder")


@given(
    cut=st.integers(0, 400),
    flips=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4),
)
@stable_settings(150)
def test_corrupted_safetensors_never_crash(tmp_path_factory, cut: int, flips) -> None:
    data = bytearray(_safetensors_bytes())
    for pos, byte in flips:
        if pos < len(data):
            data[pos] = byte
    data = data[: len(data) - cut] if cut < len(data) else data[:1]
    path = tmp_path_factory.mktemp("c") / "m.safetensors"
    path.write_bytes(bytes(data))
    with time_limit(20):
        try:
            inspect_paths([path])
        except InputError as exc:
            assert str(path) in str(exc)


@given(
    cut=st.integers(1, 2000),
    flips=st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 255)), max_size=3),
)
@stable_settings(80)
def test_corrupted_torch_files_never_crash(tmp_path_factory, cut: int, flips) -> None:
    folder = tmp_path_factory.mktemp("t")
    torch.save({"w": torch.arange(64.0).reshape(8, 8), "n": 3}, folder / "x.pt")
    data = bytearray((folder / "x.pt").read_bytes())
    for pos, byte in flips:
        if pos < len(data):
            data[pos] = byte
    (folder / "x.pt").write_bytes(bytes(data[: max(1, len(data) - cut)]))
    with time_limit(20):
        try:
            inspect_paths([folder / "x.pt"])
        except InputError as exc:
            assert "x.pt" in str(exc)


def test_sparse_and_meta_tensors_are_skipped_not_crashed_on(tmp_path: Path) -> None:
    sd = {
        "dense": torch.ones(4, 4),
        "sparse": torch.eye(4).to_sparse(),
        "meta": torch.empty(3, device="meta"),
    }
    torch.save(sd, tmp_path / "odd.pt")
    result = inspect_paths([tmp_path / "odd.pt"])
    assert [s.key for s in result.checkpoints[0].weights] == ["dense"]


_JSONISH = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=8),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
_PIECES = {
    "trainer_state.json": ("global_step", "log_history", "best_metric"),
    "config.json": ("tie_word_embeddings", "dtype", "architectures", "model_type"),
    "scheduler.pt": ("last_epoch", "_last_lr", "base_lrs"),
    "optimizer.pt": ("param_groups", "state"),
    "scaler.pt": ("scale", "_growth_tracker"),
}


@given(piece=st.sampled_from(sorted(_PIECES)), pick=st.integers(0, 3), value=_JSONISH)
@example(piece="scheduler.pt", pick=1, value=5)
@example(piece="optimizer.pt", pick=0, value=[{"params": 3, "betas": "x", "eps": [1]}])
@example(piece="optimizer.pt", pick=0, value=[{"params": [[0]], "lr": "high"}])
@example(piece="optimizer.pt", pick=1, value={0: {"exp_avg": 1, "step": [2]}})
@example(piece="trainer_state.json", pick=1, value=[{"step": 4, "learning_rate": "x"}, 7])
@example(piece="config.json", pick=2, value=17)
@example(piece="scaler.pt", pick=0, value=math.nan)
@stable_settings(200)
def test_odd_values_in_training_state_never_crash(
    hf_run, tmp_path_factory, piece: str, pick: int, value
) -> None:
    import shutil

    from ckptgen import plant_json, plant_torch

    folder = tmp_path_factory.mktemp("odd") / "ckpt"
    shutil.copytree(hf_run[0], folder)
    keys = _PIECES[piece]
    key = keys[pick % len(keys)]
    if piece.endswith(".json"):
        plant_json(folder / piece, lambda d: d.update({key: value}))
    elif piece == "scaler.pt":
        torch.save({"scale": 65536.0, "_growth_tracker": 0, key: value}, folder / piece)
    else:
        plant_torch(folder / piece, lambda d: d.update({key: value}))
    with time_limit(30):
        try:
            inspect_paths([folder]).to_json()
        except InputError as exc:
            assert str(folder) in str(exc)


_MODEL_KEYS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "vocab_size", "initializer_range", "tie_word_embeddings",
    "model_type", "architectures", "head_dim", "num_local_experts",
)  # fmt: skip


@given(pick=st.integers(0, len(_MODEL_KEYS) - 1), value=_JSONISH)
@example(pick=1, value=10_000)
@example(pick=0, value=2**40)
@example(pick=6, value=-1.0)
@example(pick=8, value="mixtral")
@stable_settings(60)
def test_odd_values_in_the_given_config_never_crash(hf_run, tmp_path_factory, pick, value) -> None:
    """``--config``: whatever a config.json holds, the checkpoint is compared with the
    model it builds, or the file is refused naming itself."""
    import json

    config = json.loads((hf_run[0] / "config.json").read_text())
    config[_MODEL_KEYS[pick]] = value
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(config))
    with time_limit(60):
        try:
            inspect_paths([hf_run[0]], config=path).to_json()
        except InputError as exc:
            assert str(path) in str(exc)
