"""Flight-recorder dumps read back as plain records, one per rank, without running them.

PyTorch's flight recorder (``TORCH_FR_BUFFER_SIZE``, formerly
``TORCH_NCCL_TRACE_BUFFER_SIZE``) keeps each rank's recent collectives and writes them on a
collective timeout (``TORCH_FR_DUMP_TEMP_FILE``/``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` + rank,
a pickle) or on request (``_dump_fr_trace`` / ``_dump_fr_trace_json``). A dump is a dict:
``version``, ``pg_config`` (process group name → desc and ranks; empty under gloo),
``pg_status`` (per local group id: last enqueued/started/completed sequence number) and
``entries``, each a collective with ``process_group`` (name, desc), ``collective_seq_id``
(``seq_id`` before torch 2.4's format 2.0), ``profiling_name`` (``"nccl:all_reduce"``),
sizes, dtypes, ``state`` and the Python ``frames`` that called it.

The pickle goes through sapper's restricted unpickler with an empty vocabulary: the format
is dicts, lists, tuples, strings and numbers, so a dump naming any global (``os.system``)
is refused before anything is built. The dump's values are then checked field by field
and copied into :class:`Entry`; only the last :data:`KEEP_SEQS` collectives of each group
are kept per rank, so a folder of 16k ranks with full 2000-entry buffers stays small.

The rank is the number after ``rank`` in the file name, else the number that ends it (torch
writes ``<prefix><rank>``); the dump itself does not say it. In a folder, a file is taken
for a dump by its content and its name (or its folder's) saying ``trace``, ``rank``,
``dump``, ``flight`` or ``fr``, so checkpoints and event files beside the dumps are left
alone. A text file of ``faulthandler`` stacks with the same rank in its name is the rank's
Python stacks (:mod:`sapper.hangs.stacks`).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapper.errors import InputError, quote
from sapper.hangs.stacks import Frame, Stacks, parse_stacks
from sapper.unpickle import Vocabulary, restricted_loads

__all__ = [
    "KEEP_SEQS",
    "MAX_DUMP_BYTES",
    "DumpFolder",
    "Entry",
    "RankDump",
    "read_dump",
    "read_folder",
]

#: A dump bigger than this is refused: torch's default buffer (2000 entries with their
#: stacks) writes a few MB; this bounds the memory one hostile file can cost.
MAX_DUMP_BYTES = 256 << 20
#: Entries of one dump read at most (torch's buffer is a ring of TORCH_FR_BUFFER_SIZE).
MAX_ENTRIES = 200_000
#: The last collectives of each process group kept per rank: the stuck one and the ones
#: before it that matching looks at for the first disagreement.
KEEP_SEQS = 16
#: Frames of a stack kept at most (innermost first).
MAX_FRAMES = 64
#: Values looked at in one dump at most (entries, shape dimensions, frames): a pickle's
#: shared references can make a small file a huge structure; reading stops here, in a
#: few seconds. A real 2000-entry dump costs ~100k.
MAX_WORK = 5_000_000
#: Files looked at in a folder at most, and how deep into sub-folders.
MAX_FILES = 1 << 20
MAX_DEPTH = 3

_RANK = re.compile(r"(\d+)$")
_NAMED_RANK = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
#: What the names of dumps (or their folders) say, as torch and sapper run write them
#: (nccl_trace_rank_3, fr/rank_3, a user's TORCH_FR_DUMP_TEMP_FILE such as /fs/dump_3): a
#: pickle in a folder whose name says none of it is not read.
_DUMP_NAME = re.compile(r"trace|rank|dump|flight|fr", re.IGNORECASE)
_SUFFIXES = (".pkl", ".pickle", ".json", ".txt", ".log", ".stacks", ".dump")
_STACK_HEADS = (b"Thread 0x", b"Current thread 0x", b"Stack (most recent call first)",
                b"Fatal Python error")  # fmt: skip
_NO_GLOBALS = Vocabulary()
#: Stacks seen, shared by every entry and rank that recorded the same one (16k ranks
#: calling from the same lines would otherwise hold 16k copies of each).
_STACKS: dict[tuple[tuple[str, int, str], ...], tuple[Frame, ...]] = {}
MAX_SHARED_STACKS = 4096


@dataclass(frozen=True, slots=True)
class Entry:
    """One recorded collective of one rank."""

    pg: str
    pg_desc: str
    seq: int
    op: str
    in_sizes: tuple[tuple[int, ...], ...]
    out_sizes: tuple[tuple[int, ...], ...]
    in_dtypes: tuple[str, ...]
    out_dtypes: tuple[str, ...]
    #: ``scheduled``, ``started`` or ``completed`` as the recorder saw it.
    state: str
    #: Completed: the state says so, or the recorder retired it (gloo marks completion
    #: only this way), or the group's status counts it as completed.
    done: bool
    p2p: bool
    frames: tuple[Frame, ...] = ()
    created_ns: int | None = None

    def signature(self) -> tuple[Any, ...]:
        """What every rank of a group must agree on at one sequence number."""
        return (self.op, self.in_sizes, self.out_sizes, self.in_dtypes, self.out_dtypes)

    def sizes_text(self) -> str:
        return ", ".join("x".join(map(str, s)) or "scalar" for s in self.in_sizes) or "-"


@dataclass
class RankDump:
    """What one rank's dump says, cut to what matching needs."""

    rank: int
    path: str
    version: str
    #: Process group name → its global ranks, from ``pg_config`` (NCCL fills it; gloo not).
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: Process group name → its description (``default_pg``, ``undefined``, a user's).
    descs: dict[str, str] = field(default_factory=dict)
    #: Process group name → {seq: entry} for its last KEEP_SEQS collectives.
    collectives: dict[str, dict[int, Entry]] = field(default_factory=dict)
    #: Process group name → highest sequence number enqueued / completed on this rank.
    enqueued: dict[str, int] = field(default_factory=dict)
    completed: dict[str, int] = field(default_factory=dict)
    #: The last entry recorded, of any group (point-to-point included).
    last: Entry | None = None
    stacks: Stacks | None = None


@dataclass
class DumpFolder:
    """The dumps of one job: the ranks read, the stacks files beside them."""

    folder: str
    dumps: dict[int, RankDump]
    #: Rank → the faulthandler stacks found for it (also for ranks without a dump).
    stacks: dict[int, Stacks]


def _rank_of(path: Path) -> int | None:
    """The rank a file's name gives: the number after ``rank`` (``rank_3``,
    ``rank3-4711.txt``: sapper run's stacks carry the pid after it), else the number that
    ends the name (torch's ``<prefix><rank>``)."""
    stem = path.name
    for suffix in _SUFFIXES:
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    named = _NAMED_RANK.findall(stem)
    digits = named[-1] if named else (m.group(1) if (m := _RANK.search(stem)) else None)
    return int(digits) if digits is not None and len(digits) <= 9 else None


def _files(folder: Path) -> Iterator[Path]:
    count = 0
    for root, dirs, names in os.walk(folder):
        depth = Path(root).relative_to(folder).parts
        if len(depth) >= MAX_DEPTH:
            dirs[:] = []
        dirs.sort()
        for name in sorted(names):
            count += 1
            if count > MAX_FILES:
                return
            yield Path(root) / name


def _kind(path: Path) -> str | None:
    """``pickle``, ``json`` or ``stacks`` from a file's first bytes; None for others."""
    try:
        with path.open("rb") as f:
            head = f.read(64)
    except OSError:
        return None
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "pickle"
    text = head.lstrip()
    if text[:1] == b"{":
        return "json"
    if text.startswith(_STACK_HEADS):
        return "stacks"
    return None


def _looks_like_json_dump(path: Path) -> bool:
    """A JSON file is a dump when its top level holds the recorder's keys (a run log or
    config beside the dumps is not)."""
    with path.open("rb") as f:
        head = f.read(4096)
    return b'"entries"' in head or b'"pg_config"' in head or b'"pg_status"' in head


def read_folder(target: Path) -> DumpFolder | None:
    """The dumps in ``target`` (a folder, searched a few levels deep, or one dump file);
    None when it holds none. Unreadable dumps raise InputError naming the file."""
    paths = [target] if target.is_file() else list(_files(target))
    dumps: dict[int, RankDump] = {}
    stacks: dict[int, Stacks] = {}
    for path in paths:
        rank = _rank_of(path)
        kind = _kind(path)
        if kind is None or (kind == "json" and not _looks_like_json_dump(path)):
            continue
        if kind == "stacks":
            if rank is not None and rank not in stacks:
                stacks[rank] = parse_stacks(_read_bytes(path, MAX_DUMP_BYTES), str(path))
            continue
        if rank is None:  # torch names every dump <prefix><rank>: not one
            continue
        if path is not target and not _DUMP_NAME.search(f"{path.parent.name}/{path.name}"):
            continue  # beside the dumps: a checkpoint, an event file, another pickle
        dump = read_dump(path, rank)
        if dump is None:
            continue
        if rank in dumps:
            raise InputError(
                f"two dumps for rank {rank} (the other: {dumps[rank].path})",
                file=str(path), expected="one dump per rank in the folder")  # fmt: skip
        dumps[rank] = dump
    if not dumps:
        return None
    for rank, st in stacks.items():
        if rank in dumps:
            dumps[rank].stacks = st
    return DumpFolder(str(target), dumps, stacks)


def _read_bytes(path: Path, limit: int) -> bytes:
    try:
        size = path.stat().st_size
        if size > limit:
            raise InputError("file too large for a flight-recorder dump", file=str(path),
                             value=size, expected=f"at most {limit} bytes")  # fmt: skip
        with path.open("rb") as f:
            return f.read(limit + 1)[:limit]
    except OSError as exc:
        raise InputError(f"cannot read ({exc.strerror})", file=str(path)) from None


def read_dump(path: Path, rank: int) -> RankDump | None:
    """One rank's dump (pickle or JSON), checked and cut to what matching needs; None
    when the file holds something else (a dict without the recorder's keys). A pickle
    that names any global is refused (InputError) before anything of it is built."""
    data = _read_bytes(path, MAX_DUMP_BYTES)
    name = str(path)
    if data[:1] == b"\x80":
        raw = restricted_loads(data, _NO_GLOBALS, name)
    else:
        try:
            raw = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"not readable JSON ({str(exc)[:120]})", file=name) from None
    # The recorder writes its entries with a version, a pg_config or a pg_status beside
    # them; a log or config that merely has an "entries" key is not a dump.
    if not isinstance(raw, dict) or not (
        {"entries", "pg_config", "pg_status"} & raw.keys()
        and {"version", "pg_config", "pg_status"} & raw.keys()
    ):
        return None
    return _Reader(name, rank).dump(raw)


class _Reader:
    """Field-by-field checks of one dump; every refusal names the file and the field."""

    def __init__(self, file: str, rank: int) -> None:
        self.file = file
        self.rank = rank
        self.work = 0

    def spend(self, n: int, where: str) -> None:
        self.work += n
        if self.work > MAX_WORK:
            raise InputError("a flight-recorder dump larger than any torch writes",
                             file=self.file, field=where,
                             expected=f"at most {MAX_WORK} values (entries, shapes, frames)")

    def bad(self, fld: str, value: Any, expected: str) -> InputError:
        return InputError("unexpected value in a flight-recorder dump", file=self.file,
                          field=fld, value=value, has_value=True, expected=expected)  # fmt: skip

    def dump(self, raw: Any) -> RankDump:
        if not isinstance(raw, dict):
            raise self.bad("<top>", raw, "a dict with 'version' and 'entries'")
        entries = raw.get("entries", [])
        if not isinstance(entries, list):
            raise self.bad("entries", entries, "a list of collectives")
        if len(entries) > MAX_ENTRIES:
            raise self.bad("entries", entries, f"at most {MAX_ENTRIES} entries")
        out = RankDump(self.rank, self.file, str(raw.get("version", "")))
        self._pg_config(raw.get("pg_config"), out)
        local_ids: dict[str, str] = {}
        # A first pass reads what every entry says about progress (group, number, done);
        # only the entries kept are then read whole (sizes, dtypes, frames).
        kept_at: dict[str, dict[int, int]] = {}
        enqueued, completed = out.enqueued, out.completed
        last_ns, last_i = -1, -1
        self.spend(len(entries), "entries")
        for i, item in enumerate(entries):
            light = _light(item)
            if light is None:  # not the usual shape: the full reading says what is wrong
                self.entry(item, f"entries[{i}]", whole=False)
                continue
            pg, desc, seq, done, p2p, created, pg_id = light
            if pg_id is not None and pg_id not in local_ids:
                local_ids[pg_id] = pg
            if pg not in out.descs:
                out.descs[pg] = desc
            if created >= last_ns:
                last_ns, last_i = created, i
            if p2p:
                continue
            kept = kept_at.get(pg)
            if kept is None:
                kept = kept_at[pg] = {}
            kept[seq] = i
            if len(kept) > 4 * KEEP_SEQS:  # trimmed now and then, not at every entry
                for old in sorted(kept)[:-KEEP_SEQS]:
                    del kept[old]
            if seq > enqueued.get(pg, -1):
                enqueued[pg] = seq
            if done and seq > completed.get(pg, -1):
                completed[pg] = seq
        for pg, kept in kept_at.items():
            out.collectives[pg] = {seq: self.entry(entries[kept[seq]], f"entries[{kept[seq]}]")[0]
                                   for seq in sorted(kept)[-KEEP_SEQS:]}  # fmt: skip
        if last_i >= 0:
            out.last = self.entry(entries[last_i], f"entries[{last_i}]")[0]
        self._pg_status(raw.get("pg_status"), local_ids, out)
        return out

    def _pg_config(self, config: Any, out: RankDump) -> None:
        if config is None:
            return
        if not isinstance(config, dict):
            raise self.bad("pg_config", config, "a dict of process groups")
        for key, pg in list(config.items())[:MAX_ENTRIES]:
            if not isinstance(pg, dict):
                raise self.bad(f"pg_config.{key}", pg, "a dict with name, desc, ranks")
            ranks = _ranks(pg.get("ranks", "[]"))
            if ranks is None:
                raise self.bad(f"pg_config.{key}.ranks", pg.get("ranks"),
                               "a list of ranks such as '[0, 1, 2]'")  # fmt: skip
            name = str(pg.get("name", key))
            if name and ranks:
                out.groups[name] = ranks
                out.descs[name] = str(pg.get("desc", ""))

    def _pg_status(self, status: Any, local_ids: dict[str, str], out: RankDump) -> None:
        """``pg_status`` counts per local group id (the entries' ``pg_id``); it says how
        far a group got even when its entries have rolled out of the buffer."""
        if not isinstance(status, dict):
            return
        for key, st in list(status.items())[:MAX_ENTRIES]:
            pg = local_ids.get(str(key))
            if pg is None or not isinstance(st, dict):
                continue
            enq = _int(st.get("last_enqueued_collective"))
            done = _int(st.get("last_completed_collective"))
            if enq is not None and enq >= 0:
                out.enqueued[pg] = max(out.enqueued.get(pg, -1), enq)
            if done is not None and done >= 0:
                out.completed[pg] = max(out.completed.get(pg, -1), done)
        for pg, kept in out.collectives.items():
            last_done = out.completed.get(pg, -1)
            for seq, e in kept.items():
                if not e.done and seq <= last_done:
                    kept[seq] = _replace_done(e)

    def entry(self, item: Any, where: str, whole: bool = True) -> tuple[Entry, str | None]:
        """The entry at ``where``; without its sizes, dtypes and frames unless ``whole``."""
        self.spend(1, where)
        if not isinstance(item, dict):
            raise self.bad(where, item, "a dict per collective")
        pg = item.get("process_group", ("", ""))
        if (not isinstance(pg, (list, tuple)) or len(pg) != 2
                or not all(isinstance(p, str) for p in pg)):  # fmt: skip
            raise self.bad(f"{where}.process_group", pg, "[name, desc]")
        seq = item.get("collective_seq_id", item.get("seq_id"))
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise self.bad(f"{where}.collective_seq_id", seq, "an integer")
        name = item.get("profiling_name", "")
        if not isinstance(name, str):
            raise self.bad(f"{where}.profiling_name", name, "a string such as 'nccl:all_reduce'")
        state = item.get("state", "")
        if not isinstance(state, str):
            raise self.bad(f"{where}.state", state, "scheduled, started or completed")
        p2p = bool(item.get("is_p2p", False))
        if p2p:
            p2p_seq = item.get("p2p_seq_id")
            seq = p2p_seq if isinstance(p2p_seq, int) and not isinstance(p2p_seq, bool) else seq
        created = item.get("time_created_ns")
        pg_id = item.get("pg_id")
        entry = Entry(
            pg=pg[0][:200],
            pg_desc=pg[1][:200],
            seq=seq,
            op=name.rpartition(":")[2][:80] or "?",
            in_sizes=self.sizes(item.get("input_sizes", []), f"{where}.input_sizes")
            if whole else (),
            out_sizes=self.sizes(item.get("output_sizes", []), f"{where}.output_sizes")
            if whole else (),
            in_dtypes=self.dtypes(item.get("input_dtypes", []), f"{where}.input_dtypes")
            if whole else (),
            out_dtypes=self.dtypes(item.get("output_dtypes", []), f"{where}.output_dtypes")
            if whole else (),
            state=state[:40],
            done=state == "completed" or item.get("retired") is True,
            p2p=p2p,
            frames=self.frames(item.get("frames", []), f"{where}.frames") if whole else (),
            created_ns=created if isinstance(created, int) else None,
        )  # fmt: skip
        return entry, str(pg_id) if isinstance(pg_id, (int, str)) else None

    def sizes(self, value: Any, where: str) -> tuple[tuple[int, ...], ...]:
        if not isinstance(value, list) or len(value) > 4096:
            raise self.bad(where, value, "a list of tensor shapes")
        out = []
        self.spend(len(value), where)
        for shape in value:
            self.spend(len(shape) if isinstance(shape, list) else 1, where)
            if (not isinstance(shape, list) or len(shape) > 64
                    or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)):
                raise self.bad(where, shape, "a shape: a list of integers")  # fmt: skip
            out.append(tuple(shape))
        return tuple(out)

    def dtypes(self, value: Any, where: str) -> tuple[str, ...]:
        if not isinstance(value, list) or len(value) > 4096:
            raise self.bad(where, value, "a list of dtype names")
        self.spend(len(value), where)
        if not all(isinstance(d, str) for d in value):
            raise self.bad(where, value, "dtype names such as 'Float'")
        return tuple(d[:40] for d in value)

    def frames(self, value: Any, where: str) -> tuple[Frame, ...]:
        if not isinstance(value, list):
            raise self.bad(where, quote(value), "a list of {filename, line, name}")
        out: list[tuple[str, int, str]] = []
        self.spend(min(len(value), MAX_FRAMES), where)
        for f in value[:MAX_FRAMES]:
            if not isinstance(f, dict):
                raise self.bad(where, f, "a frame: {filename, line, name}")
            line = f.get("line")
            number = line if isinstance(line, int) and not isinstance(line, bool) else 0
            out.append((str(f.get("filename", "?"))[:500], number, str(f.get("name", "?"))[:200]))
        key = tuple(out)
        frames = _STACKS.get(key)
        if frames is None:  # every rank calls from the same code: one copy of each stack
            if len(_STACKS) > MAX_SHARED_STACKS:
                _STACKS.clear()
            frames = _STACKS[key] = tuple(Frame(*f) for f in key)
        return frames


def _light(item: Any) -> tuple[str, str, int, bool, bool, int, str | None] | None:
    """What one entry says about progress — group, desc, number, done, point-to-point,
    creation time, local group id — read without building an Entry (a 16k-rank folder
    of full buffers has 32M of them); None when the entry is not of the usual shape."""
    if type(item) is not dict:
        return None
    pg = item.get("process_group", ("", ""))
    if type(pg) not in (tuple, list) or len(pg) != 2:
        return None
    name, desc = pg
    if type(name) is not str or type(desc) is not str:
        return None
    seq = item.get("collective_seq_id")
    if seq is None:
        seq = item.get("seq_id")
    state = item.get("state", "")
    if type(seq) is not int or type(state) is not str:
        return None
    p2p = bool(item.get("is_p2p", False))
    if p2p:
        p2p_seq = item.get("p2p_seq_id")
        if type(p2p_seq) is int:
            seq = p2p_seq
    created = item.get("time_created_ns")
    pg_id = item.get("pg_id")
    return (name[:200], desc[:200], seq, state == "completed" or item.get("retired") is True,
            p2p, created if type(created) is int else 0,
            str(pg_id) if type(pg_id) in (int, str) else None)  # fmt: skip


def _replace_done(e: Entry) -> Entry:
    from dataclasses import replace

    return replace(e, done=True)


def _int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit() and len(value) < 19:
        return int(value)
    return None


_RANKS = re.compile(r"\s*\[\s*((?:\d+\s*,\s*)*\d+)?\s*,?\s*\]\s*")


def _ranks(value: Any) -> tuple[int, ...] | None:
    """``pg_config``'s ranks: a list, or the string torch writes (``"[0, 1]"``), read by
    a pattern (torch's own analyzer ``eval``s it)."""
    if isinstance(value, list):
        if all(isinstance(r, int) and not isinstance(r, bool) for r in value):
            return tuple(value)
        return None
    if not isinstance(value, str) or len(value) > 10_000_000:
        return None
    return _ranks_text(value)


@functools.lru_cache(maxsize=256)
def _ranks_text(value: str) -> tuple[int, ...] | None:
    """Cached: every rank's dump repeats the same lists (the default group's is the
    whole world, ~100 kB of text at 16k ranks)."""
    m = _RANKS.fullmatch(value)
    if m is None:
        return None
    return tuple(int(r) for r in m.group(1).split(",")) if m.group(1) else ()
