"""The log-format registry: every reader is a LogFormat, detection takes the most
confident, folders expand by recognise_dir and runs_in, and a ``poll`` format that
opens its own files (a folder or one file) is read like TensorBoard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sapper.errors import InputError
from sapper.logs import LogParser, detect_format, expand_paths, read_log, registry
from sapper.logs.detect import FORMATS, SUPPORTED
from sapper.logs.formats import LogFormat
from sapper.logs.framework import FORMAT_FRAMEWORKS, framework_of_format
from sapper.runtime.records import StepRecord


def test_every_reader_module_exposes_its_formats() -> None:
    names = [f.name for f in registry.log_formats()]
    assert tuple(names) == FORMATS
    assert names[:6] == ["sapper", "trainer_state", "tensorboard", "csv", "jsonl", "megatron"]
    assert {"hf_console", "keyvalue"} <= set(names)
    assert len(set(names)) == len(names)
    for fmt in registry.log_formats():
        assert fmt.title and fmt.looks_for, fmt.name
        assert fmt.title in SUPPORTED
        assert fmt.recognise_text or fmt.recognise_bytes or fmt.recognise_dir, fmt.name


def test_frameworks_come_from_the_formats() -> None:
    assert FORMAT_FRAMEWORKS == {
        "trainer_state": "hf-trainer", "megatron": "megatron", "hf_console": "hf-trainer"
    }
    assert framework_of_format("hf_console+trainer_state") == "hf-trainer"
    assert framework_of_format("keyvalue") == "unknown"


def test_unknown_format_names_the_valid_ones() -> None:
    with pytest.raises(InputError, match="unknown log format") as info:
        registry.find_log_format("wandb-ish")
    assert "keyvalue" in (info.value.expected or "")


def test_unrecognised_file_lists_what_each_format_looks_for(tmp_path: Path) -> None:
    prose = tmp_path / "notes.txt"
    prose.write_text("training went fine\nloss went down\n")
    with pytest.raises(InputError, match="not a log sapper can read") as info:
        detect_format(prose)
    listed = "\n".join(info.value.choices)
    for fmt in registry.log_formats():
        assert f"{fmt.name}: {fmt.title}, from {fmt.looks_for}" in listed


def _fixed(name: str, score: float) -> LogFormat:
    return LogFormat(name=name, title=name, looks_for="anything",
                     parser=lambda path, mapping: LogParser(str(path), mapping),
                     recognise_text=lambda text, path: score)


def test_most_confident_wins_and_ties_go_to_the_first(monkeypatch, tmp_path: Path) -> None:
    path = tmp_path / "x.log"
    path.write_text("whatever\n")
    formats = (_fixed("low", 0.3), _fixed("high", 0.7), _fixed("also-high", 0.7))
    monkeypatch.setattr(registry, "log_formats", lambda: formats)
    assert detect_format(path) == "high"
    monkeypatch.setattr(registry, "log_formats", lambda: (_fixed("maybe", 0.1),))
    with pytest.raises(InputError, match="not a log sapper can read"):
        detect_format(path)  # below MIN_CONFIDENCE


# ---- a "poll" format with runs under a parent folder (the W&B / MLflow layout) --------

class _ToyParser(LogParser):
    """Reads ``metrics.toy`` (``step loss`` lines) of a run folder, or that one file."""

    format = "toy"

    def __init__(self, path: Path, mapping=None) -> None:
        super().__init__(str(path), mapping)
        self.file = path / "metrics.toy" if path.is_dir() else path
        self.done = 1  # lines read so far (the first is the TOY1 mark)

    def poll(self) -> list[StepRecord]:
        """Only the lines added since the last call, as a real poll reader does."""
        lines = self.file.read_text().splitlines()
        for line in lines[self.done:]:
            step, loss = line.split()
            self.merger.put(int(step), {"loss": float(loss)})
        self.done = max(self.done, len(lines))
        return self.merger.ready()


def _toy_runs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("run-*") if (p / "metrics.toy").is_file())


TOY = LogFormat(
    name="toy", title="a toy run folder", looks_for="metrics.toy files",
    parser=_ToyParser, read_mode="poll",
    recognise_bytes=lambda head, path: 1.0 if head.startswith(b"TOY1") else 0.0,
    recognise_dir=lambda folder: 1.0 if (folder / "metrics.toy").is_file() else 0.0,
    runs_in=_toy_runs,
)


@pytest.fixture
def toy(monkeypatch) -> None:
    formats = (*registry.log_formats(), TOY)
    monkeypatch.setattr(registry, "log_formats", lambda: formats)


def _toy_run(folder: Path, losses: list[float]) -> Path:
    folder.mkdir(parents=True)
    rows = "".join(f"{i} {v}\n" for i, v in enumerate(losses, 1))
    (folder / "metrics.toy").write_text("TOY1\n" + rows)
    return folder


def test_a_parent_of_runs_expands_to_one_entry_per_run(toy, tmp_path: Path) -> None:
    a = _toy_run(tmp_path / "runs" / "run-a", [2.0, 1.5])
    b = _toy_run(tmp_path / "runs" / "run-b", [3.0, 2.5, 2.0])
    assert expand_paths([tmp_path / "runs"]) == [(a, "toy"), (b, "toy")]
    assert detect_format(a) == "toy"
    log = read_log(a)
    assert log.format == "toy" and [(r.step, r.loss) for r in log.records] == [(1, 2.0), (2, 1.5)]


def test_a_poll_format_reads_one_of_its_files(toy, tmp_path: Path) -> None:
    run = _toy_run(tmp_path / "run-x", [2.0, 1.0])
    assert detect_format(run / "metrics.toy") == "toy"
    log = read_log(run / "metrics.toy")
    assert [r.step for r in log.records] == [1, 2]


# ---- a plain folder: what was passed over, and why -------------------------------------

def test_folder_names_the_files_it_passed_over(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_text("step: 1  loss: 2.0\nstep: 2  loss: 1.9\n")
    (tmp_path / "README.md").write_text("# notes\n")
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "config.json").write_text('{\n  "hidden_size": 8\n}\n')
    skipped: list[str] = []
    expanded = expand_paths([tmp_path], skipped)
    assert expanded == [(tmp_path / "train.log", "keyvalue")]
    assert sorted(skipped) == sorted([
        f"skipped {tmp_path / 'README.md'}: not a log sapper can read (first line: '# notes')",
        f"skipped {tmp_path / 'config.json'}: JSON, but neither a trainer_state.json (no "
        "log_history) nor JSON lines",
        f"skipped {tmp_path / 'empty.csv'}: the file is empty",
    ])


def test_one_unreadable_file_does_not_stop_the_rest(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text("step: 1  loss: 2.0\nstep: 2  loss: 1.9\n")
    fifo = tmp_path / "b.pipe"
    import os

    os.mkfifo(fifo)
    (tmp_path / "c.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    skipped: list[str] = []
    expanded = expand_paths([tmp_path], skipped)
    assert [p.name for p, _ in expanded] == ["a.log", "c.jsonl"]
    assert len(skipped) == 1 and "b.pipe" in skipped[0] and "FIFO" in skipped[0].upper()


def test_a_parent_of_runs_inside_a_folder_of_logs(toy, tmp_path: Path) -> None:
    """``out/train.log`` next to ``out/wandb/run-*``: the log and each run."""
    (tmp_path / "train.log").write_text("step: 1  loss: 2.0\nstep: 2  loss: 1.9\n")
    a = _toy_run(tmp_path / "wandb" / "run-a", [2.0, 1.5])
    assert expand_paths([tmp_path]) == [(tmp_path / "train.log", "keyvalue"), (a, "toy")]
