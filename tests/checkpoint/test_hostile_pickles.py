"""Pickles from untrusted checkpoints: nothing in them runs, nothing outside the folder is
read, no bomb expands, whichever command reaches the reader (inspect, the compare of two,
diagnose --checkpoint, report --checkpoint) and whichever format holds it (torch files,
a Distributed Checkpoint's ``.metadata``, DeepSpeed's stand-ins)."""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from dcpgen import write_dcp
from hypothesis import example, given
from hypothesis import strategies as st
from tests.fuzz import stable_settings, time_limit
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex
from typer.testing import CliRunner

from sapper.checkpoint import inspect_paths
from sapper.checkpoint.dcp import DcpSource
from sapper.checkpoint.plain import MAX_OBJECTS
from sapper.checkpoint.torchfile import MAX_INFLATED_BYTES, load_torch_file
from sapper.cli.app import _register_commands, app
from sapper.errors import InputError

runner = CliRunner()
_register_commands()
LOG = Path(__file__).parents[2] / "examples" / "logs" / "sapper-gpt2-healthy.jsonl"


class Evil:
    """Runs ``touch marker`` when unpickled by ``pickle.load``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _tensors() -> dict[str, torch.Tensor]:
    return {"model.embed.weight": torch.randn(8, 4), "model.norm.weight": torch.ones(6)}


def _invoke(*args: object) -> tuple[int, str]:
    start = time.monotonic()
    res = runner.invoke(app, [str(a) for a in args])
    assert time.monotonic() - start < 60
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output
    return res.exit_code, res.output


def test_a_distributed_checkpoint_reads_as_torch_reads_it(tmp_path: Path) -> None:
    import warnings

    import torch.distributed.checkpoint as dcp

    tensors = {**_tensors(), "b": torch.arange(11, dtype=torch.bfloat16)}
    write_dcp(tmp_path / "dcp", tensors, pieces=3)
    target = {k: torch.empty_like(v) for k, v in tensors.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(target, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    source = DcpSource(tmp_path / "dcp")
    assert source.keys() == list(tensors)
    for key, tensor in tensors.items():
        mine = torch.cat(list(source.chunks(key)))
        assert torch.equal(mine, target[key].reshape(-1)) and torch.equal(mine, tensor.reshape(-1))
        assert source.info(key).shape == tuple(tensor.shape)


def _evil_dcp(folder: Path, marker: Path) -> Path:
    """A valid DCP save whose metadata carries a command in its planner data."""

    def plant(meta) -> None:
        meta.planner_data = {"model.embed.weight": Evil(marker)}

    write_dcp(folder, _tensors(), edit=plant)
    return folder


def test_dcp_metadata_that_would_run_a_command_never_runs_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    folder = _evil_dcp(tmp_path / "dcp", marker)
    with pytest.raises(InputError, match=r"refused to unpickle.*system"):
        inspect_paths([folder])
    healthy = tmp_path / "healthy"
    write_dcp(healthy, _tensors())
    hf = tmp_path / "hf"  # an HF-style folder holding a DCP save instead of weights
    _evil_dcp(hf, marker)
    (hf / "config.json").write_text("{}")
    for args in (
        ("inspect", folder),
        ("inspect", healthy, folder),
        ("inspect", hf),
        ("diagnose", LOG, "--checkpoint", folder),
        ("report", LOG, "-o", tmp_path / "r.html", "--checkpoint", folder),
    ):
        code, out = _invoke(*args)
        assert code == 2, (args, out)
        assert "refused to unpickle" in out
    assert not marker.exists()


def test_a_planted_callable_changes_nothing_the_reader_does(tmp_path: Path, monkeypatch) -> None:
    """An OrderedDict whose pickle sets ``items``/``get`` on the instance: the reader sees
    the dict's own items; a stand-in given a method from the file is refused as data."""

    class Planted:
        def __reduce__(self):
            return (
                collections.OrderedDict,
                (),
                {"items": collections.OrderedDict, "get": collections.OrderedDict},
                None,
                iter([("w", torch.ones(3)), ("step", 4)]),
            )

    torch.save({"model": Planted()}, tmp_path / "planted.pt")
    loaded = load_torch_file(tmp_path / "planted.pt")
    assert type(loaded["model"]) is dict
    assert list(loaded["model"].items())[1] == ("step", 4)
    assert loaded["model"].get("step") == 4

    # DeepSpeed's module, faked only while the file is written (monkeypatch restores all).
    fake = type(sys)("deepspeed.utils.tensor_fragment")
    for name in ("deepspeed", "deepspeed.utils"):
        monkeypatch.setitem(sys.modules, name, type(sys)(name))
    monkeypatch.setitem(sys.modules, fake.__name__, fake)

    class fragment_address:  # DeepSpeed's name, as pickled
        def __reduce__(self):
            planted = {"numel": 4, "start": 0, "to_dict": collections.OrderedDict}
            return (fragment_address, (), planted)

    fragment_address.__module__ = fake.__name__
    fragment_address.__qualname__ = "fragment_address"
    fake.fragment_address = fragment_address
    torch.save({"mapping": fragment_address()}, tmp_path / "stand_in.pt")
    monkeypatch.undo()
    with pytest.raises(InputError, match="does not read"):
        load_torch_file(tmp_path / "stand_in.pt")


@pytest.mark.parametrize(
    "where", ["../outside.distcp", "/etc/hostname", "sub/../../x.distcp", "a\\..\\b"]
)
def test_dcp_piece_paths_outside_the_folder_are_refused(tmp_path: Path, where: str) -> None:
    outside = tmp_path / "outside.distcp"
    outside.write_bytes(b"secret")

    def escape(meta) -> None:
        for info in meta.storage_data.values():
            info.relative_path = where

    write_dcp(tmp_path / "dcp", _tensors(), edit=escape)
    code, out = _invoke("inspect", tmp_path / "dcp")
    assert code == 2 and "relative_path" in out and "secret" not in out


def test_dcp_piece_through_a_symlink_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    write_dcp(tmp_path / "dcp", _tensors())
    piece = tmp_path / "dcp" / "__0_0.distcp"
    os.replace(piece, tmp_path / "elsewhere.distcp")
    piece.symlink_to(tmp_path / "elsewhere.distcp")
    code, out = _invoke("inspect", tmp_path / "dcp")
    assert code == 2 and "outside its folder" in out


def test_fifo_missing_and_truncated_dcp_shards(tmp_path: Path) -> None:
    for case in ("fifo", "missing", "truncated"):
        folder = tmp_path / case
        write_dcp(folder, _tensors())
        piece = folder / "__1_0.distcp"
        data = piece.read_bytes()
        piece.unlink()
        if case == "fifo":
            os.mkfifo(piece)
        elif case == "truncated":
            piece.write_bytes(data[: len(data) // 2])
        code, out = _invoke("inspect", folder)
        assert code == 2, (case, out)
        assert "__1_0.distcp" in out


def _bomb_zip(path: Path, inflated: int) -> None:
    """A torch zip whose pickle record is deflated: ``inflated`` bytes in a few MB."""
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buffer)
    with zipfile.ZipFile(buffer) as src:
        records = [(i, src.read(i)) for i in src.infolist() if not i.filename.endswith("data.pkl")]
        pkl_name = next(i.filename for i in src.infolist() if i.filename.endswith("data.pkl"))
    with zipfile.ZipFile(path, "w") as out:
        pkl = zipfile.ZipInfo(pkl_name)
        pkl.compress_type = zipfile.ZIP_DEFLATED
        block = b"\x00" * (1 << 24)
        with out.open(pkl, "w", force_zip64=True) as fh:
            for _ in range(inflated >> 24):
                fh.write(block)
        for info, data in records:
            out.writestr(info, data)


_PEAK_PROBE = """
import json, sys
try:  # Linux keeps the forking parent's peak across fork and exec: start this one afresh
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
except OSError:
    pass
from sapper.cli.app import main
sys.argv = ["sapper", *json.loads(sys.argv[1])]
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code
with open("/proc/self/status") as fh:
    hwm = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
sys.__stdout__.write("\\n" + json.dumps({"code": code, "peak_mb": hwm / 1024}) + "\\n")
"""


def _peak_rss_of(*args: object) -> tuple[int, float]:
    """Exit code and peak RSS (MB, VmHWM) of ``sapper ARGS`` in a fresh interpreter."""
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK_PROBE, json.dumps([str(a) for a in args])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    probe = json.loads(proc.stdout.strip().splitlines()[-1])
    return probe["code"], probe["peak_mb"]


def test_compression_bomb_is_refused_before_it_inflates(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.pt"
    _bomb_zip(bomb, 3 << 30)
    assert bomb.stat().st_size < 16 << 20
    code, peak_mb = _peak_rss_of("inspect", bomb)
    assert code == 2
    assert peak_mb < 1500  # a few hundred MB of imports; inflating it would take 3 GB
    with pytest.raises(InputError, match="inflates past the bound"):
        load_torch_file(bomb)
    small = tmp_path / "small.pt"  # under the bound: inflated, then read (or refused) as usual
    _bomb_zip(small, MAX_INFLATED_BYTES // 2)
    with pytest.raises(InputError, match="not a readable pickle"):
        load_torch_file(small)


def test_shared_reference_bomb_is_refused_in_bounded_work(tmp_path: Path) -> None:
    leaf: list = [torch.ones(1)]
    for _ in range(30):  # 4**30 leaves in a few KB on disk, nested well under the depth bound
        leaf = [leaf, leaf, leaf, leaf]
    torch.save({"state": {"0": {"exp_avg": leaf}}}, tmp_path / "bomb.pt")
    assert (tmp_path / "bomb.pt").stat().st_size < 64 << 10
    start = time.monotonic()
    with pytest.raises(InputError, match="expand past the bound") as err:
        load_torch_file(tmp_path / "bomb.pt")
    assert time.monotonic() - start < 60
    assert str(MAX_OBJECTS) in str(err.value)
    shared = torch.ones(3)  # ordinary sharing (a tied weight) is read as usual
    torch.save({"a": shared, "b": shared, "groups": [[0, 1]] * 4}, tmp_path / "tied.pt")
    loaded = load_torch_file(tmp_path / "tied.pt")
    assert torch.equal(loaded["a"], loaded["b"]) and loaded["groups"] == [[0, 1]] * 4


def _field_values() -> st.SearchStrategy:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.sampled_from([2**2000, -1, 0, 1 << 62, 10**400]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=12),
        st.sampled_from(["../x", "/etc/hostname", "", ".", "__0_0.distcp", "a\x00b"]),
        st.lists(st.integers(min_value=-3, max_value=2**50), max_size=3).map(tuple),
        st.lists(st.integers(min_value=0, max_value=9), max_size=3).map(torch.Size),
        st.sampled_from([torch.float32, torch.int8, torch.strided]),
    )


_TARGETS = [
    "tensor.size",
    "tensor.chunks",
    "tensor.properties",
    "chunk.offsets",
    "chunk.sizes",
    "storage.relative_path",
    "storage.offset",
    "storage.length",
    "index.fqn",
    "index.offset",
    "meta.state_dict_metadata",
    "meta.storage_data",
]


def _plant(target: str, value: object):
    def edit(meta) -> None:
        key = "model.embed.weight"
        tensor = meta.state_dict_metadata[key]
        owner, name = target.split(".")
        if owner == "tensor":
            setattr(tensor, name, value)
        elif owner == "chunk":
            setattr(tensor.chunks[0], name, value)
        elif owner == "storage":
            info = next(v for k, v in meta.storage_data.items() if k.fqn == key)
            setattr(info, name, value)
        elif owner == "index":
            index, info = next((k, v) for k, v in meta.storage_data.items() if k.fqn == key)
            del meta.storage_data[index]
            bad = MetadataIndex(key)
            object.__setattr__(bad, name, value)
            meta.storage_data[bad] = info
        else:
            setattr(meta, name, value)

    return edit


@stable_settings(120)
@given(target=st.sampled_from(_TARGETS), value=_field_values())
@example(target="storage.length", value=2**2000)
@example(target="storage.relative_path", value="../x")
@example(target="chunk.sizes", value=torch.Size([10**6, 4]))
def test_odd_values_in_dcp_metadata_never_crash(tmp_path_factory, target, value) -> None:
    folder = tmp_path_factory.mktemp("odd") / "dcp"
    try:
        write_dcp(folder, _tensors(), edit=_plant(target, value))
    except (pickle.PicklingError, TypeError, ValueError, AttributeError):
        return  # not a value pickle can write
    with time_limit(30):
        res = runner.invoke(app, ["inspect", str(folder)])
    assert res.exit_code in (0, 1, 2), res.output
    assert "Traceback" not in res.output and "internal error" not in res.output


def test_storage_info_lengths_must_hold_the_piece(tmp_path: Path) -> None:
    def shrink(meta) -> None:
        for index, info in meta.storage_data.items():
            meta.storage_data[index] = _StorageInfo(info.relative_path, info.offset, 3)

    write_dcp(tmp_path / "dcp", _tensors(), edit=shrink)
    code, out = _invoke("inspect", tmp_path / "dcp")
    assert code == 2 and "length" in out


@given(data=st.binary(max_size=400))
@stable_settings(150)
@example(data=b"\x80\x04\x95")
@example(data=pickle.dumps({"state_dict_metadata": {}}))
def test_arbitrary_metadata_bytes_never_crash(tmp_path_factory, data: bytes) -> None:
    folder = tmp_path_factory.mktemp("bytes") / "dcp"
    write_dcp(folder, _tensors())
    (folder / ".metadata").write_bytes(data)
    with time_limit(30):
        res = runner.invoke(app, ["inspect", str(folder)])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
