"""What a checkpoint path is, from its content and layout, not its name's extension.

A file is sniffed by its first bytes (a safetensors length prefix followed by ``{``, a
zip archive or a pickle for torch, JSON with a ``weight_map`` for a shard index); a
folder by the files in it (an HF Trainer ``checkpoint-N/`` folder, a sharded
safetensors model, a torch Distributed Checkpoint's ``.metadata`` + ``*.distcp``, a
DeepSpeed save's ``latest`` + ``global_stepN/``).
Every file is checked to be a regular file before it is opened: a FIFO would block a
reader forever, and a symlink loop fails ``stat`` — both become one InputError line.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from sapper.errors import InputError

__all__ = [
    "DEEPSPEED_MODEL_STATES",
    "DEEPSPEED_OPTIM_STATES",
    "MAX_FOLDER_ENTRIES",
    "MAX_INDEX_ENTRIES",
    "MAX_MEGATRON_RANKS",
    "MAX_SHARDS",
    "Layout",
    "detect",
    "listing",
    "regular_file",
    "sniff",
]

#: Entries of a folder looked at, at most: a folder of a million files is not a checkpoint.
MAX_FOLDER_ENTRIES = 100_000
#: Tensors a shard index may name (the largest public models name under 200k) and the
#: distinct shard files (they hold under 2,000): both checked before any entry is used.
MAX_INDEX_ENTRIES = 1_000_000
MAX_SHARDS = 10_000
#: Megatron-LM rank folders (``mp_rank_XX[_YYY]``) of one iteration, at most.
MAX_MEGATRON_RANKS = 16_384
_MAX_JSON_BYTES = 64 << 20
#: The file names DeepSpeed's ``engine.save_checkpoint`` gives a tag folder's model states
#: (``zero_pp_rank_R_`` under ZeRO 3) and each data rank's ZeRO optimizer partition.
DEEPSPEED_MODEL_STATES = re.compile(r"^(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt$")
DEEPSPEED_OPTIM_STATES = re.compile(
    r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$"
)


@dataclass
class Layout:
    """The pieces of one checkpoint, each a file that exists and is regular."""

    path: Path
    kind: str
    weights: list[Path] = field(default_factory=list)
    #: Which format ``weights`` are in: ``safetensors`` or ``torch``.
    weights_format: str = "safetensors"
    optimizer: Path | None = None
    scheduler: Path | None = None
    scaler: Path | None = None
    trainer_state: Path | None = None
    rng: list[Path] = field(default_factory=list)
    config: Path | None = None
    #: A torch Distributed Checkpoint folder.
    dcp: Path | None = None
    #: A DeepSpeed save's tag folder (``global_stepN``: model states, ZeRO partitions).
    deepspeed: Path | None = None


def regular_file(path: Path) -> Path:
    """``path`` when it is a readable regular file (symlinks followed), else InputError."""
    try:
        info = path.stat()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise InputError(f"cannot open: {reason}", file=str(path)) from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "not a regular file"
        raise InputError(
            f"not a checkpoint file ({kind})", file=str(path), expected="a regular file"
        )
    return path


def sniff(path: Path) -> str:
    """``safetensors``, ``torch``, ``index`` (a shard index) or ``json``, from the bytes."""
    regular_file(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(9)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":
        return "torch"
    if len(head) == 9 and head[8:9] == b"{":
        return "safetensors"
    if head.lstrip()[:1] == b"{":
        data = read_json(path)
        return "index" if isinstance(data.get("weight_map"), dict) else "json"
    if len(head) < 9:
        raise InputError(
            "truncated or empty file: not a checkpoint",
            file=str(path),
            value=len(head),
            expected="at least 9 bytes",
        )
    raise InputError(
        "not a checkpoint file",
        file=str(path),
        value=head[:9],
        expected="safetensors, a torch zip or pickle, or a shard index",
    )


def read_json(path: Path) -> dict:
    regular_file(path)
    if path.stat().st_size > _MAX_JSON_BYTES:
        raise InputError(
            "JSON file too large", file=str(path), expected=f"at most {_MAX_JSON_BYTES} bytes"
        )
    try:
        data = json.loads(path.read_bytes())
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InputError("not valid JSON", file=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    if not isinstance(data, dict):
        raise InputError("JSON is not an object", file=str(path), value=type(data).__name__)
    return data


def _shards(index: Path) -> list[Path]:
    """The shard files an index names, each in the index's folder (no path escapes), in
    the order first named; the counts are bounded before any entry is looked at."""
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError("shard index has no weight_map", file=str(index), field="weight_map")
    if len(weight_map) > MAX_INDEX_ENTRIES:
        raise InputError(
            "shard index names too many tensors to be a checkpoint's",
            file=str(index),
            field="weight_map",
            value=len(weight_map),
            expected=f"at most {MAX_INDEX_ENTRIES} entries",
        )
    names: dict[str, None] = {}  # insertion-ordered set
    for key, name in weight_map.items():
        if isinstance(name, str) and name in names:
            continue
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise InputError(
                "shard name is not a file in the index's folder",
                file=str(index),
                field=f"weight_map.{key}",
                value=name,
            )
        names[name] = None
        if len(names) > MAX_SHARDS:
            raise InputError(
                f"shard index names more than {MAX_SHARDS} distinct shard files",
                file=str(index),
                field=f"weight_map.{key}",
                value=name,
                expected=f"at most {MAX_SHARDS} shard files",
            )
    return [regular_file(index.parent / n) for n in names]


def listing(folder: Path) -> dict[str, Path]:
    """A folder's entries by name, at most MAX_FOLDER_ENTRIES; InputError otherwise."""
    entries: dict[str, Path] = {}
    try:
        with os.scandir(folder) as it:
            for i, entry in enumerate(it):
                if i >= MAX_FOLDER_ENTRIES:
                    raise InputError(
                        "folder has too many entries to be a checkpoint",
                        file=str(folder),
                        expected=f"at most {MAX_FOLDER_ENTRIES}",
                    )
                entries[entry.name] = Path(entry.path)
    except OSError as exc:
        raise InputError(f"cannot list folder: {exc.strerror or exc}", file=str(folder)) from None
    return entries


def detect(path: Path) -> Layout:
    """The layout of ``path`` (file or folder); InputError when it is no checkpoint."""
    try:
        is_dir = path.is_dir()
    except OSError as exc:
        raise InputError(f"cannot open: {exc.strerror or exc}", file=str(path)) from None
    if not is_dir:
        kind = sniff(path)
        if kind == "safetensors":
            return Layout(path, "safetensors", [path])
        if kind == "torch":
            return Layout(path, "torch", [path], weights_format="torch")
        if kind == "index":
            return Layout(path, "safetensors-sharded", _shards(path))
        raise InputError(
            "JSON file is not a safetensors shard index",
            file=str(path),
            field="weight_map",
            expected="an object mapping tensor names to files",
        )
    return _folder(path)


def _megatron(path: Path, files: dict[str, Path], depth: int) -> Layout | None:
    """A Megatron-LM save folder (``latest_checkpointed_iteration.txt`` naming an
    ``iter_NNNNNNN``/``release`` folder) or one iteration's folder of
    ``mp_rank_XX[_YYY]/model_optim_rng.pt`` files, as its checkpointing code writes them."""
    marker = files.get("latest_checkpointed_iteration.txt")
    if marker is not None and depth == 0:
        regular_file(marker)
        text = marker.read_bytes()[:64].decode("ascii", "replace").strip()
        name = (
            "release" if text == "release" else f"iter_{int(text):07d}" if text.isdigit() else None
        )
        if name is None or name not in files:
            raise InputError(
                "latest_checkpointed_iteration.txt names no iteration folder",
                file=str(marker),
                value=text,
                expected="an iteration saved here",
            )
        return _folder(files[name], depth + 1)
    ranks = sorted(n for n in files if n.startswith("mp_rank_") and files[n].is_dir())
    if not ranks:
        return None
    if len(ranks) > MAX_MEGATRON_RANKS:
        raise InputError(
            "too many Megatron rank folders (mp_rank_*) to be one checkpoint's",
            file=str(path),
            value=len(ranks),
            expected=f"at most {MAX_MEGATRON_RANKS}",
        )
    layout = Layout(path, "megatron", weights_format="torch")
    for rank in ranks:
        for name in ("model_optim_rng.pt", "model_rng.pt"):
            candidate = files[rank] / name
            if candidate.exists() or candidate.is_symlink():
                layout.weights.append(regular_file(candidate))
                break
    if not layout.weights:
        raise InputError("Megatron rank folders hold no model_optim_rng.pt", file=str(path))
    return layout


def _is_tag_folder(files: dict[str, Path]) -> bool:
    return any(DEEPSPEED_MODEL_STATES.match(n) for n in files)


def _deepspeed_tag(path: Path, files: dict[str, Path]) -> Path | None:
    """The tag folder of a DeepSpeed save: the one ``latest`` names (as DeepSpeed's
    ``load_checkpoint`` and ``zero_to_fp32`` read it), or this folder when it is one."""
    marker = files.get("latest")
    if marker is not None and not marker.is_dir():
        regular_file(marker)
        tag = marker.read_bytes()[:256].decode("utf-8", "replace").strip()
        folder = files.get(tag) if Path(tag).name == tag and tag not in (".", "..") else None
        if folder is None or not folder.is_dir() or not _is_tag_folder(listing(folder)):
            raise InputError(
                "DeepSpeed's 'latest' names no saved tag folder here",
                file=str(marker),
                value=tag[:80],
                expected="the name of a folder beside it holding *model_states.pt",
            )
        return folder
    return path if _is_tag_folder(files) else None


def _folder(path: Path, depth: int = 0) -> Layout:
    files = listing(path)
    megatron = _megatron(path, files, depth)
    if megatron is not None:
        return megatron
    layout = Layout(path, "folder")
    layout.deepspeed = _deepspeed_tag(path, files)
    if ".metadata" in files and any(n.endswith(".distcp") for n in files):
        regular_file(files[".metadata"])
        layout.kind, layout.dcp = "torch-dcp", path
    indexes = sorted(n for n in files if n.endswith(".safetensors.index.json"))
    if indexes:
        layout.weights = _shards(files[indexes[0]])
    elif "model.safetensors" in files:
        layout.weights = [regular_file(files["model.safetensors"])]
    elif "pytorch_model.bin.index.json" in files:
        layout.weights, layout.weights_format = (
            _shards(files["pytorch_model.bin.index.json"]),
            "torch",
        )
    elif "pytorch_model.bin" in files:
        layout.weights, layout.weights_format = [regular_file(files["pytorch_model.bin"])], "torch"
    else:
        layout.weights = [
            regular_file(p) for n, p in sorted(files.items()) if n.endswith(".safetensors")
        ]
    for attr, name in (
        ("optimizer", "optimizer.pt"),
        ("scheduler", "scheduler.pt"),
        ("scaler", "scaler.pt"),
        ("trainer_state", "trainer_state.json"),
        ("config", "config.json"),
    ):
        if name in files:
            setattr(layout, attr, regular_file(files[name]))
    layout.rng = [
        regular_file(p)
        for n, p in sorted(files.items())
        if n.startswith("rng_state") and n.endswith(".pth")
    ]
    if layout.trainer_state is not None or layout.optimizer is not None:
        layout.kind = "hf-trainer"
    elif layout.deepspeed is not None:
        layout.kind = "deepspeed"
    elif layout.kind == "folder" and layout.weights:
        layout.kind = "safetensors-folder" if layout.weights_format == "safetensors" else "torch"
    if (
        not layout.weights
        and layout.dcp is None
        and layout.optimizer is None
        and layout.deepspeed is None
    ):
        raise InputError(
            "no checkpoint files in the folder",
            file=str(path),
            expected="model*.safetensors, a *.safetensors.index.json, "
            "pytorch_model.bin, optimizer.pt, .metadata + *.distcp, "
            "or a DeepSpeed save (latest + global_stepN/)",
        )
    return layout
