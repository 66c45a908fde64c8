"""Scan a tokenized dataset for its largest token id, without loading it.

Formats are the ones training code reads directly:

- ``npy``: a NumPy array of integer ids (any shape), memory-mapped;
- ``bin``: raw little-endian token ids, ``uint16`` or ``uint32`` (nanoGPT and friends);
- ``megatron``: a Megatron-LM / Megatron-core indexed dataset, ``prefix.bin`` + ``prefix.idx``;
  the token dtype comes from the ``.idx`` header;
- ``jsonl``: one JSON object per line with an ``input_ids`` list (or list of lists).

Big files are read in chunks with numpy memmap, in a van der Corput order over the whole
dataset, so when the time budget runs out the part that was read is spread evenly over
all files instead of being only their beginning.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sapper.errors import InputError
from sapper.plan.sources import special_kind

__all__ = ["FORMATS", "MEGATRON_DTYPES", "TokenScan", "detect_files", "scan_token_ids"]

FORMATS = ("npy", "bin", "megatron", "jsonl")
#: Megatron ``.idx`` dtype codes (the index header's one-byte field).
MEGATRON_DTYPES: dict[int, type[np.generic]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
_EXT = {".npy": "npy", ".bin": "bin", ".idx": "megatron", ".jsonl": "jsonl"}
#: Tokens per binary chunk (64 MiB of uint32) and bytes per jsonl block.
CHUNK_TOKENS = 1 << 24
JSONL_BLOCK = 8 << 20
#: Folder entries looked at before giving up: a dataset of 10^5 shards is large, and a
#: mistaken ``data.path: /`` must fail in seconds, not walk the whole disk.
MAX_FOLDER_ENTRIES = 100_000
FIELD = "data.path"


@dataclass
class TokenScan:
    """What a scan found; ``complete`` is False when the time budget cut it short."""

    path: str
    format: str
    dtype: str
    files: int
    total_tokens: int | None
    tokens_read: int = 0
    max_id: int | None = None
    min_id: int | None = None
    out_of_range: int = 0
    complete: bool = True
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def coverage(self) -> float | None:
        if not self.total_tokens:
            return None
        return self.tokens_read / self.total_tokens


@dataclass
class _Source:
    path: Path
    format: str
    dtype: np.dtype | None = None
    tokens: int | None = None
    offset: int = 0  # bytes before the first token (npy header)


def _input_error(problem: str, path: Path | str, expected: str | None = None) -> InputError:
    return InputError(problem, file=str(path), field=FIELD, expected=expected)


def detect_files(path: str | Path, fmt: str | None = None) -> list[tuple[Path, str]]:
    """The dataset files under ``path`` with their format (a file, or a folder's files)."""
    p = Path(path).expanduser()
    if fmt is not None and fmt not in FORMATS:
        raise InputError(
            "unknown dataset format",
            field="data.format",
            value=fmt,
            expected=" / ".join(FORMATS),
        )
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise _input_error("dataset not found", p, "an existing file or folder") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        reason = getattr(exc, "strerror", None) or exc
        raise _input_error(f"cannot read dataset ({reason})", p) from None
    if stat.S_ISDIR(mode):
        found = [(f, _classify(f, fmt)) for f in _folder_files(p)]
        files = [(f, k) for f, k in found if k is not None]
        # A Megatron dataset is one entry per prefix: keep the .bin, drop its .idx.
        files = [(f, k) for f, k in files if not (k == "megatron" and f.suffix == ".idx")]
        if not files:
            raise _input_error(
                "no dataset files in folder",
                p,
                "files ending in .npy, .bin (+ .idx) or .jsonl",
            )
        return files
    special = special_kind(mode)
    if special is not None:  # a FIFO would block the scan, a device never end
        raise _input_error(f"is {special}, not a regular file", p, "a dataset file or folder")
    kind = _classify(p, fmt) or fmt
    if kind is None:
        raise _input_error(
            f"cannot tell the dataset format from the name {p.name!r}",
            p,
            "a .npy, .bin (+ .idx) or .jsonl file, or data.format: " + " / ".join(FORMATS),
        )
    if kind == "megatron" and p.suffix == ".idx":
        p = p.with_suffix(".bin")
    return [(p, kind)]


def _folder_files(folder: Path) -> list[Path]:
    """Regular files under ``folder`` (symlinks to files included, linked folders not
    followed, unreadable sub-folders skipped), sorted; at most MAX_FOLDER_ENTRIES looked at."""
    out: list[Path] = []
    seen = 0
    for root, dirs, names in os.walk(folder):
        seen += len(dirs) + len(names)
        if seen > MAX_FOLDER_ENTRIES:
            raise _input_error(
                f"the folder holds more than {MAX_FOLDER_ENTRIES} entries",
                folder,
                "the folder of the dataset's files (.npy, .bin + .idx, .jsonl)",
            )
        for name in names:
            path = Path(root, name)
            try:
                if stat.S_ISREG(path.stat().st_mode):
                    out.append(path)
            except OSError:  # a dangling link, a file that vanished
                continue
    return sorted(out)


def _classify(path: Path, fmt: str | None) -> str | None:
    ext = _EXT.get(path.suffix.lower())
    if ext == "bin" and path.with_suffix(".idx").exists():
        ext = "megatron"
    if ext == "megatron" and path.suffix == ".idx" and not path.with_suffix(".bin").exists():
        raise _input_error("Megatron index without its .bin", path, path.stem + ".bin")
    if fmt is None:
        return ext
    if fmt == "bin" and ext == "megatron":
        return None if path.suffix == ".idx" else "bin"
    if fmt == ext or (fmt == "megatron" and ext == "bin"):
        return fmt
    return None


def _default_dtype(vocab_size: int, token_dtype: str | None, path: Path) -> np.dtype:
    if token_dtype is None:
        return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
    try:
        dt = np.dtype(token_dtype)
    except TypeError:
        dt = None
    if dt is None or dt.kind not in "iu":
        raise InputError(
            "not an integer dtype",
            field="data.token_dtype",
            value=token_dtype,
            expected="uint16 / uint32 / int32 / int64",
        )
    return dt.newbyteorder("<")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as exc:
        raise _input_error(f"cannot read dataset ({exc.strerror})", path) from None


def _open_npy(path: Path) -> _Source:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise _input_error(f"not a readable .npy file ({exc})", path) from None
    if not isinstance(arr, np.memmap) or arr.dtype.kind not in "iu":
        raise _input_error(
            f"the array holds {arr.dtype} values",
            path,
            "integer token ids (uint16/uint32/int32...)",
        )
    # Order does not matter for min/max/count, so a Fortran-ordered array reads flat too.
    return _Source(path, "npy", arr.dtype, int(arr.size), int(arr.offset))


def _open_raw(path: Path, dtype: np.dtype) -> _Source:
    size = _size(path)
    if size % dtype.itemsize:
        raise _input_error(
            f"{size} bytes is not a whole number of {dtype.name} tokens",
            path,
            f"data.token_dtype matching the file (size a multiple of {dtype.itemsize})",
        )
    return _Source(path, "bin", dtype, size // dtype.itemsize)


def _open_megatron(bin_path: Path) -> _Source:
    idx = bin_path.with_suffix(".idx")
    try:
        if not stat.S_ISREG(idx.stat().st_mode):
            raise _input_error("the Megatron index is not a regular file", idx)
        with idx.open("rb") as fh:
            head = fh.read(len(MEGATRON_MAGIC) + 9)
    except OSError as exc:
        raise _input_error(f"cannot read Megatron index ({exc.strerror})", idx) from None
    if len(head) < len(MEGATRON_MAGIC) + 9 or not head.startswith(MEGATRON_MAGIC):
        raise _input_error(
            "not a Megatron .idx file", idx, "an index starting with the MMIDIDX header"
        )
    (version,) = struct.unpack_from("<Q", head, len(MEGATRON_MAGIC))
    code = head[len(MEGATRON_MAGIC) + 8]
    if version != 1 or code not in MEGATRON_DTYPES:
        raise _input_error(
            f"unsupported Megatron index (version {version}, dtype code {code})",
            idx,
            "version 1 with a dtype code 1-8",
        )
    dtype = np.dtype(MEGATRON_DTYPES[code]).newbyteorder("<")
    if dtype.kind not in "iu":
        raise _input_error(f"the index declares {dtype.name} tokens", idx, "integer token ids")
    src = _open_raw(bin_path, dtype)
    src.format = "megatron"
    return src


def _looks_like_uint32(src: _Source) -> bool:
    """uint16 reading of little-endian uint32 ids below 65536: every odd entry is 0."""
    n = min(src.tokens or 0, 1 << 16)
    if n < 64 or n % 2:
        return False
    try:
        head = np.memmap(src.path, dtype=src.dtype, mode="r", shape=(n,))
    except (OSError, ValueError):
        return False  # the scan itself reports an unreadable file
    return not head[1::2].any() and bool(head[0::2].any())


def _van_der_corput(n: int) -> list[int]:
    """0..n-1 ordered so every prefix is spread evenly over the range."""
    if n <= 2:
        return list(range(n))
    bits = (n - 1).bit_length()
    return sorted(range(n), key=lambda i: int(f"{i:0{bits}b}"[::-1], 2))


def _binary_chunks(src: _Source) -> Iterator[tuple[int, int]]:
    total = src.tokens or 0
    count = -(-total // CHUNK_TOKENS)
    for i in _van_der_corput(count):
        yield i * CHUNK_TOKENS, min(total, (i + 1) * CHUNK_TOKENS)


def _jsonl_ids(record: object, path: Path, where: str) -> list[int]:
    ids = record.get("input_ids") if isinstance(record, dict) else None
    if ids is None:
        keys = ", ".join(list(record)[:5]) if isinstance(record, dict) else type(record).__name__
        raise _input_error(
            f"the record {where} has no input_ids (has: {keys})",
            path,
            'tokenized records like {"input_ids": [...]}',
        )
    if ids and isinstance(ids[0], list):
        ids = [t for row in ids for t in row]
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise _input_error(f"the record {where}: input_ids are not all integers", path)
    return ids


def _jsonl_blocks(path: Path) -> Iterator[list[int]]:
    """Token ids of each block of lines, blocks visited in van der Corput order.

    A line belongs to the block its first byte falls in; block ``i`` starts reading at
    the first line that begins at or after its start.
    """
    size = _size(path)
    count = max(1, -(-size // JSONL_BLOCK))
    with path.open("rb") as fh:
        for i in _van_der_corput(count):
            start, end = i * JSONL_BLOCK, min(size, (i + 1) * JSONL_BLOCK)
            if start:
                fh.seek(start - 1)
                fh.readline()  # finish the line that began before this block
            else:
                fh.seek(0)
            ids: list[int] = []
            while fh.tell() < end:
                at = fh.tell()
                raw = fh.readline()
                if not raw:
                    break
                text = raw.strip()
                if not text:
                    continue
                try:
                    record = json.loads(text)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise _input_error(
                        f"malformed JSON in the line at byte {at}: {exc}", path
                    ) from None
                ids.extend(_jsonl_ids(record, path, f"at byte {at}"))
            yield ids


class _Scanner:
    def __init__(self, result: TokenScan, vocab_size: int, deadline: float) -> None:
        self.r, self.vocab, self.deadline = result, vocab_size, deadline

    def take(self, ids: np.ndarray) -> None:
        if ids.size == 0:
            return
        hi, lo = int(ids.max()), int(ids.min())
        r = self.r
        r.max_id = hi if r.max_id is None else max(r.max_id, hi)
        r.min_id = lo if r.min_id is None else min(r.min_id, lo)
        if hi >= self.vocab:
            r.out_of_range += int(np.count_nonzero(ids >= self.vocab))
        if lo < 0:
            r.out_of_range += int(np.count_nonzero(ids < 0))
        r.tokens_read += int(ids.size)

    def expired(self) -> bool:
        return time.monotonic() > self.deadline


def scan_token_ids(
    path: str | Path,
    vocab_size: int,
    *,
    fmt: str | None = None,
    token_dtype: str | None = None,
    budget_s: float = 20.0,
) -> TokenScan:
    """Largest and smallest token id in the dataset and how many ids fall outside
    ``[0, vocab_size)``. Missing or unreadable files raise :class:`InputError` naming
    ``data.path``. Stops after ``budget_s`` seconds with ``complete=False``."""
    t0 = time.monotonic()
    files = detect_files(path, fmt)
    sources: list[_Source] = []
    for file, kind in files:
        if kind == "npy":
            sources.append(_open_npy(file))
        elif kind == "megatron":
            sources.append(_open_megatron(file))
        elif kind == "bin":
            src = _open_raw(file, _default_dtype(vocab_size, token_dtype, file))
            sources.append(src)
        else:
            _size(file)
            sources.append(_Source(file, "jsonl"))
    notes: list[str] = []
    for src in sources:
        if src.format == "bin" and token_dtype is None and src.dtype == np.uint16:
            if _looks_like_uint32(src):
                src.dtype, src.tokens = np.dtype("<u4"), (src.tokens or 0) // 2
                notes.append(f"{src.path.name}: read as uint32 (every second uint16 was 0)")
    kinds = sorted({s.format for s in sources})
    dtypes = sorted({s.dtype.name for s in sources if s.dtype is not None})
    total = None if "jsonl" in kinds else sum(s.tokens or 0 for s in sources)
    result = TokenScan(str(path), "+".join(kinds), "+".join(dtypes), len(sources), total)
    result.notes = notes
    scanner = _Scanner(result, vocab_size, t0 + budget_s)
    try:
        for piece in _interleave(sources):
            if scanner.expired():
                result.complete = False
                break
            scanner.take(piece)
    except OSError as exc:
        where = exc.filename or path
        raise _input_error(f"cannot read dataset ({exc.strerror or exc})", where) from None
    result.seconds = time.monotonic() - t0
    return result


def _pieces(src: _Source) -> Iterator[np.ndarray]:
    if src.format == "jsonl":
        for ids in _jsonl_blocks(src.path):
            try:
                yield np.asarray(ids, dtype=np.int64)
            except OverflowError:
                raise _input_error("a token id does not fit in 64 bits", src.path) from None
        return
    if not src.tokens:
        return
    assert src.dtype is not None
    try:
        flat = np.memmap(
            src.path, dtype=src.dtype, mode="r", offset=src.offset, shape=(src.tokens,)
        )
    except (OSError, ValueError) as exc:
        raise _input_error(f"cannot map dataset ({exc})", src.path) from None
    for a, b in _binary_chunks(src):
        yield np.asarray(flat[a:b])


def _interleave(sources: list[_Source]) -> Iterator[np.ndarray]:
    """Chunks round-robin over files, so a cut-short scan still saw every file."""
    iters = [_pieces(s) for s in sources]
    while iters:
        alive = []
        for it in iters:
            piece = next(it, None)
            if piece is not None:
                yield piece
                alive.append(it)
        iters = alive
