"""Reading tokenized datasets for D103: every format, chunking, budget, and bad input."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.data import tokens
from sapper.data.tokens import MEGATRON_MAGIC, scan_token_ids
from sapper.errors import InputError

_register_commands()
rng = np.random.default_rng(0)


def _ids(n: int, high: int, dtype: str) -> np.ndarray:
    return rng.integers(0, high, size=n).astype(dtype)


def _expect(ids: np.ndarray, vocab: int) -> tuple[int, int]:
    flat = ids.astype(np.int64).ravel()
    return int(flat.max()), int(np.count_nonzero((flat >= vocab) | (flat < 0)))


def write_megatron(prefix: Path, docs: list[np.ndarray], code: int) -> None:
    """An indexed dataset as Megatron writes it: tokens in .bin, header + sizes +
    byte pointers + document boundaries in .idx."""
    dtype = np.dtype(tokens.MEGATRON_DTYPES[code])
    sizes = np.array([len(d) for d in docs], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1]) * dtype.itemsize]).astype(np.int64)
    with open(prefix.with_suffix(".bin"), "wb") as fh:
        for d in docs:
            fh.write(d.astype(dtype).tobytes())
    with open(prefix.with_suffix(".idx"), "wb") as fh:
        fh.write(MEGATRON_MAGIC)
        fh.write(struct.pack("<Q", 1))
        fh.write(struct.pack("<B", code))
        fh.write(struct.pack("<Q", len(docs)))
        fh.write(struct.pack("<Q", len(docs) + 1))
        fh.write(sizes.tobytes())
        fh.write(pointers.tobytes())
        fh.write(np.arange(len(docs) + 1, dtype=np.int64).tobytes())


def test_npy_two_dimensional(tmp_path: Path) -> None:
    arr = _ids(64 * 128, 50257, "uint16").reshape(64, 128)
    np.save(tmp_path / "train.npy", arr)
    scan = scan_token_ids(tmp_path / "train.npy", 32000)
    assert (scan.max_id, scan.out_of_range) == _expect(arr, 32000)
    assert scan.format == "npy" and scan.dtype == "uint16"
    assert scan.tokens_read == scan.total_tokens == arr.size and scan.complete


def test_npy_fortran_order_and_in_range(tmp_path: Path) -> None:
    arr = np.asfortranarray(_ids(4000, 32000, "int32").reshape(40, 100))
    np.save(tmp_path / "t.npy", arr)
    scan = scan_token_ids(tmp_path / "t.npy", 32000)
    assert scan.out_of_range == 0 and scan.max_id == int(arr.max())


def test_npy_of_floats_is_input_error(tmp_path: Path) -> None:
    np.save(tmp_path / "f.npy", np.zeros(10, dtype=np.float32))
    with pytest.raises(InputError, match=r"data\.path: the array holds float32"):
        scan_token_ids(tmp_path / "f.npy", 100)
    (tmp_path / "bad.npy").write_bytes(b"not numpy at all")
    with pytest.raises(InputError, match=r"bad\.npy: data\.path: not a readable \.npy file"):
        scan_token_ids(tmp_path / "bad.npy", 100)


@pytest.mark.parametrize(("vocab", "dtype"), [(50257, "uint16"), (128256, "uint32")])
def test_raw_bin_dtype_defaults_by_vocab(tmp_path: Path, vocab: int, dtype: str) -> None:
    ids = _ids(10_000, vocab + 500, dtype)
    ids[:3] = [1, 0, 1]  # not every second uint16 is zero, so no uint32 guess
    ids.tofile(tmp_path / "train.bin")
    scan = scan_token_ids(tmp_path / "train.bin", vocab)
    assert scan.dtype == dtype
    assert (scan.max_id, scan.out_of_range) == _expect(ids, vocab)


def test_raw_bin_explicit_dtype_and_uint32_detection(tmp_path: Path) -> None:
    ids = _ids(4096, 32000, "uint32")
    ids.tofile(tmp_path / "t.bin")
    scan = scan_token_ids(tmp_path / "t.bin", 32000, token_dtype="uint32")
    assert scan.tokens_read == 4096 and scan.out_of_range == 0
    # Without a dtype, vocab 32000 suggests uint16, but the zero high halves give it away.
    guessed = scan_token_ids(tmp_path / "t.bin", 32000)
    assert guessed.dtype == "uint32" and guessed.tokens_read == 4096
    assert guessed.notes and "uint32" in guessed.notes[0]


def test_raw_bin_size_not_multiple_of_dtype(tmp_path: Path) -> None:
    (tmp_path / "t.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(InputError, match="3 bytes is not a whole number of uint16 tokens"):
        scan_token_ids(tmp_path / "t.bin", 1000)


def test_bad_token_dtype(tmp_path: Path) -> None:
    (tmp_path / "t.bin").write_bytes(b"\x01\x00")
    with pytest.raises(InputError, match=r"data\.token_dtype: not an integer dtype"):
        scan_token_ids(tmp_path / "t.bin", 1000, token_dtype="float16")


@pytest.mark.parametrize("code", [4, 8])  # int32, uint16
def test_megatron_dtype_from_index(tmp_path: Path, code: int) -> None:
    docs = [_ids(n, 40000, "int64") for n in (17, 300, 5, 1024)]
    write_megatron(tmp_path / "corpus_text_document", docs, code)
    scan = scan_token_ids(tmp_path / "corpus_text_document.bin", 32000)
    assert scan.format == "megatron"
    assert scan.dtype == np.dtype(tokens.MEGATRON_DTYPES[code]).name
    assert (scan.max_id, scan.out_of_range) == _expect(np.concatenate(docs), 32000)
    # The .idx path names the same dataset.
    assert scan_token_ids(tmp_path / "corpus_text_document.idx", 32000).max_id == scan.max_id


def test_megatron_bad_magic(tmp_path: Path) -> None:
    (tmp_path / "d.bin").write_bytes(b"\x00" * 8)
    (tmp_path / "d.idx").write_bytes(b"NOTANIDX" + b"\x00" * 20)
    with pytest.raises(InputError, match=r"d\.idx: data\.path: not a Megatron \.idx file"):
        scan_token_ids(tmp_path / "d.bin", 100)


def test_jsonl_records_and_batches(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [[5, 6, 7], [[1, 2], [3, 40000]], [31999]]
    path.write_text("\n".join(json.dumps({"input_ids": r, "text": "x"}) for r in rows) + "\n\n")
    scan = scan_token_ids(path, 32000)
    assert (scan.max_id, scan.out_of_range, scan.tokens_read) == (40000, 1, 8)
    assert scan.total_tokens is None


def test_jsonl_blocks_neither_lose_nor_repeat_lines(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tokens, "JSONL_BLOCK", 37)  # boundaries inside and between lines
    rows = [list(range(i, i + (i % 7) + 1)) for i in range(200)]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in rows))
    scan = scan_token_ids(path, 150)
    flat = np.concatenate([np.array(r) for r in rows])
    assert scan.tokens_read == flat.size
    assert (scan.max_id, scan.out_of_range) == _expect(flat, 150)


def test_jsonl_untokenized_is_input_error(tmp_path: Path) -> None:
    path = tmp_path / "raw.jsonl"
    path.write_text('{"text": "hello world"}\n')
    with pytest.raises(InputError, match=r"no input_ids \(has: text\)"):
        scan_token_ids(path, 100)
    path.write_text('{"input_ids": [1, 2\n')
    with pytest.raises(InputError, match="malformed JSON in the line at byte 0"):
        scan_token_ids(path, 100)


def test_chunked_scan_and_time_budget(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tokens, "CHUNK_TOKENS", 1000)
    ids = _ids(25_500, 70000, "uint32")
    ids.tofile(tmp_path / "t.bin")
    full = scan_token_ids(tmp_path / "t.bin", 66000)
    assert full.complete and full.tokens_read == ids.size
    assert (full.max_id, full.out_of_range) == _expect(ids, 66000)
    cut = scan_token_ids(tmp_path / "t.bin", 66000, budget_s=0.0)
    assert not cut.complete and cut.tokens_read < ids.size and cut.coverage is not None


def test_van_der_corput_prefixes_spread() -> None:
    order = tokens._van_der_corput(16)
    assert sorted(order) == list(range(16))
    assert sorted(order[:4]) == [0, 4, 8, 12]


def test_folder_of_shards(tmp_path: Path) -> None:
    a = _ids(500, 32000, "uint16")
    np.save(tmp_path / "shard0.npy", a)
    docs = [_ids(100, 33000, "int64")]
    (tmp_path / "sub").mkdir()
    write_megatron(tmp_path / "sub" / "shard1", docs, 8)
    (tmp_path / "README.md").write_text("not data")
    scan = scan_token_ids(tmp_path, 32000)
    assert scan.files == 2 and scan.format == "megatron+npy"
    assert scan.tokens_read == 600
    assert (scan.max_id, scan.out_of_range) == _expect(np.concatenate([a, docs[0]]), 32000)


def test_missing_and_unknown(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nope\.bin: data\.path: dataset not found"):
        scan_token_ids(tmp_path / "nope.bin", 100)
    (tmp_path / "data.parquet").write_bytes(b"PAR1")
    with pytest.raises(InputError, match="cannot tell the dataset format"):
        scan_token_ids(tmp_path / "data.parquet", 100)
    with pytest.raises(InputError, match=r"data\.format: unknown dataset format"):
        scan_token_ids(tmp_path / "data.parquet", 100, fmt="parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no dataset files in folder"):
        scan_token_ids(tmp_path / "empty", 100)


def test_cli_missing_dataset_exits_2(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "model: {hidden_size: 64, num_layers: 2, num_heads: 2, vocab_size: 1000}\n"
        "data: {path: shards/missing.bin}\n"
    )
    res = CliRunner().invoke(app, ["check", str(plan)])
    assert res.exit_code == 2
    assert "data.path: dataset not found" in res.output
    assert str(tmp_path / "shards" / "missing.bin") in res.output.replace("\n", "")
    assert "Traceback" not in res.output


def test_cli_dataset_relative_to_plan(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    np.arange(0, 1200, dtype=np.uint16).tofile(tmp_path / "data" / "train.bin")
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "model: {hidden_size: 64, num_layers: 2, num_heads: 2, vocab_size: 1000}\n"
        "data: {path: data/train.bin}\n"
    )
    res = CliRunner().invoke(app, ["check", str(plan), "--select", "D103", "-f", "json"])
    assert res.exit_code == 1, res.output
    (finding,) = json.loads(res.stdout)["findings"]
    assert finding["value"] == 1199 and finding["data"]["out_of_range"] == 200
