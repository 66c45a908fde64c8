"""The framing of a W&B ``.wandb`` record file: LevelDB's log format, read incrementally.

wandb writes its records as LevelDB's log (wandb's ``wandb/sdk/internal/datastore.py``,
after https://github.com/google/leveldb/blob/main/doc/log_format.md): a 7-byte header
(``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of chunks, each
``crc32 (uint32) | length (uint16) | type (uint8) | data``; a record that does not fit
its block is split into FIRST, MIDDLE ..., LAST chunks; a block's last bytes, too few
for a chunk header, are zero padding. What the records hold (protobuf ``Record``s) is
:mod:`sapper.logs.wandb`'s business; this module only cuts the bytes into records,
bounded, whatever the bytes are.
"""

from __future__ import annotations

import struct
import zlib

__all__ = ["HEADER", "MAX_RECORD_BYTES", "RecordScanner"]

#: The file header: ident ``:W&B``, magic 0xBEE1, version 0 (``<4sHB``).
HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
_BLOCK = 32768
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
#: A chunk's checksum is zlib's CRC-32 of its data, seeded with the CRC of its type byte.
_TYPE_CRC = {t: zlib.crc32(bytes([t])) for t in (_FULL, _FIRST, _MIDDLE, _LAST)}
#: Largest record reassembled from chunks; a history row of scalars is a few KB, one with
#: media a few hundred. Larger ones are skipped and counted.
MAX_RECORD_BYTES = 16 << 20


class RecordScanner:
    """Splits the bytes of a ``.wandb`` file into record payloads, incrementally.

    Bytes are pushed as they are read; what is returned are whole records. A chunk torn
    at the end of what was read waits for more bytes; a chunk that fails its checksum,
    has an unknown type or overruns its block makes the scanner skip to the next block
    boundary, as LevelDB's reader does. :attr:`skipped_bytes` and the counters say what
    was lost."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0  # file offset of _buf[0]
        self._skip_to = 0  # file offset before which bytes are dropped (corruption)
        self._parts: list[bytes] | None = None
        self._parts_size = 0
        self.header: bool | None = None  # None: fewer than 7 bytes seen yet
        #: The format version the header names, when its ident and magic are W&B's.
        self.version: int | None = None
        self.bad_chunks = 0
        self.skipped_bytes = 0
        self.oversized = 0
        self.broken_chains = 0

    @property
    def pending(self) -> int:
        """Bytes held back: a torn chunk, or a record whose last chunk is not read yet."""
        return len(self._buf) + self._parts_size

    def push(self, data: bytes) -> list[bytes]:
        """The records completed by ``data`` (the next bytes of the file)."""
        self._buf += data
        if self.header is None:
            if len(self._buf) < _CHUNK_HEADER:
                return []
            head = bytes(self._buf[:_CHUNK_HEADER])
            self.header = head == HEADER
            if head[:6] == HEADER[:6]:
                self.version = head[6]
            if not self.header:
                return []
            self._consume(_CHUNK_HEADER)
        if not self.header:
            return []
        out: list[bytes] = []
        buf = self._buf
        while True:
            if self._pos < self._skip_to:
                n = min(self._skip_to - self._pos, len(buf))
                self.skipped_bytes += n
                self._consume(n)
                buf = self._buf
                if self._pos < self._skip_to:
                    break
            left = _BLOCK - self._pos % _BLOCK
            if left < _CHUNK_HEADER:  # a block's trailer: zero padding
                if len(buf) < left:
                    break
                self._consume(left)
                buf = self._buf
                continue
            if len(buf) < _CHUNK_HEADER:
                break
            crc, length, kind = struct.unpack_from("<IHB", buf, 0)
            if kind not in _TYPE_CRC or _CHUNK_HEADER + length > left:
                self._corrupt(left)
                buf = self._buf
                continue
            end = _CHUNK_HEADER + length
            if len(buf) < end:
                break
            data_ = bytes(buf[_CHUNK_HEADER:end])
            if zlib.crc32(data_, _TYPE_CRC[kind]) != crc:
                self._corrupt(left)
                buf = self._buf
                continue
            self._consume(end)
            buf = self._buf
            record = self._assemble(kind, data_)
            if record is not None:
                out.append(record)
        return out

    def _consume(self, n: int) -> None:
        del self._buf[:n]
        self._pos += n

    def _corrupt(self, left: int) -> None:
        self.bad_chunks += 1
        self._skip_to = self._pos + left
        self._drop_chain()

    def _drop_chain(self) -> None:
        if self._parts is not None:
            self.broken_chains += 1
        self._parts = None
        self._parts_size = 0

    def _assemble(self, kind: int, data: bytes) -> bytes | None:
        if kind == _FULL:
            self._drop_chain()
            return data
        if kind == _FIRST:
            self._drop_chain()
            self._parts, self._parts_size = [data], len(data)
            return None
        if self._parts is None:  # a MIDDLE or LAST without its FIRST
            self.broken_chains += 1
            return None
        self._parts_size += len(data)
        if self._parts_size > MAX_RECORD_BYTES:
            self.oversized += 1
            self._parts, self._parts_size = None, 0
            return None
        self._parts.append(data)
        if kind == _MIDDLE:
            return None
        record = b"".join(self._parts)
        self._parts, self._parts_size = None, 0
        return record
