"""Format detection from content first, names second; refusals are one clear line."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sapper.errors import InputError
from sapper.logs import detect_format, expand_paths


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("hf-llama-sft/trainer_state.json", "trainer_state"),
        ("megatron-gpt345m-fp16.log", "megatron"),
        ("wandb-history-lr-stuck.csv", "csv"),
        ("sapper-gpt2-healthy.jsonl", "sapper"),
    ],
)
def test_content_decides_not_the_name(examples: Path, tmp_path: Path, name: str, fmt: str) -> None:
    assert detect_format(examples / name) == fmt
    renamed = tmp_path / "log.txt"
    shutil.copy(examples / name, renamed)
    assert detect_format(renamed) == fmt


def test_event_file_by_its_checksum(tmp_path: Path) -> None:
    writer = pytest.importorskip("torch.utils.tensorboard").SummaryWriter(str(tmp_path))
    writer.add_scalar("loss", 1.0, 1)
    writer.close()
    (event,) = tmp_path.iterdir()
    renamed = tmp_path / "metrics.bin"
    event.rename(renamed)
    assert detect_format(renamed) == "tensorboard"


def test_refusals(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("")
    with pytest.raises(InputError, match="the file is empty"):
        detect_format(empty)
    garbage = tmp_path / "dump.log"
    garbage.write_bytes(os.urandom(4096))
    with pytest.raises(InputError, match="binary data, not a training log"):
        detect_format(garbage)
    fake = tmp_path / "events.out.tfevents.123.host"
    fake.write_bytes(b"not really an event file at all")
    with pytest.raises(InputError, match="first record is damaged"):
        detect_format(fake)
    prose = tmp_path / "notes.txt"
    prose.write_text("training went fine\nloss went down\n")
    with pytest.raises(InputError, match="not a log sapper can read"):
        detect_format(prose)
    other_json = tmp_path / "config.json"
    other_json.write_text('{\n  "hidden_size": 4096\n}\n')
    with pytest.raises(InputError, match=r"neither a trainer_state\.json"):
        detect_format(other_json)
    with pytest.raises(InputError, match="no such file"):
        detect_format(tmp_path / "missing.log")
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "README.md").write_text("nothing here")
    with pytest.raises(InputError, match="no log found in this folder"):
        expand_paths([folder])


def test_hf_output_folder_uses_the_latest_checkpoint(examples: Path, tmp_path: Path) -> None:
    state = (examples / "hf-llama-sft" / "trainer_state.json").read_text()
    for n in (50, 500, 100):
        (tmp_path / f"checkpoint-{n}").mkdir()
        (tmp_path / f"checkpoint-{n}" / "trainer_state.json").write_text(state)
    ((path, fmt),) = expand_paths([tmp_path])
    assert path == tmp_path / "checkpoint-500" / "trainer_state.json" and fmt == "trainer_state"


def test_nul_blocks_from_a_crash_keep_a_text_log_readable(examples: Path, tmp_path: Path) -> None:
    text = (examples / "megatron-gpt345m-fp16.log").read_bytes()
    damaged = tmp_path / "train.log"
    damaged.write_bytes(text[:40000] + b"\x00" * 512 + text[40000:])
    assert detect_format(damaged) == "megatron"


def test_plain_folder_expands_to_the_logs_in_it(examples: Path) -> None:
    expanded = expand_paths([examples])
    assert [(p.relative_to(examples).as_posix(), fmt) for p, fmt in expanded] == [
        ("hf-llama-sft/trainer_state.json", "trainer_state"),
        ("megatron-gpt345m-fp16.log", "megatron"),
        ("sapper-gpt2-healthy.jsonl", "sapper"),
        ("wandb-history-lr-stuck.csv", "csv"),
    ]  # make_examples.py is not a log and is passed over
