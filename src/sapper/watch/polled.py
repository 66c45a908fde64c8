"""Following a run folder whose reader opens its own files (a W&B or MLflow run).

Their parsers (:class:`sapper.logs.wandb.WandbParser`, :class:`sapper.logs.mlflow.MlflowParser`)
keep an offset per file and return what is new on each ``poll()``, as LogFormat's
``read_mode="poll"`` says; this follower waits for the folder to hold a run, builds the
parser then, and hands each poll to it.
"""

from __future__ import annotations

import time
from pathlib import Path

from sapper.errors import InputError
from sapper.logs.base import LogParser
from sapper.logs.fields import FieldMap
from sapper.logs.formats import LogFormat
from sapper.runtime.records import StepRecord
from sapper.watch.follow import Follower

__all__ = ["RunFolderFollower", "polled_format", "run_to_follow"]


def polled_format(name: str) -> LogFormat | None:
    """The LogFormat of a folder format read with ``poll()``, by name."""
    from sapper.logs import mlflow, wandb

    return {"wandb": wandb.FORMAT, "mlflow": mlflow.FORMAT}.get(name)


def run_to_follow(path: Path) -> tuple[Path, str] | None:
    """The W&B or MLflow run ``path`` names: the run folder itself, its ``.wandb`` file,
    or a parent holding exactly one run (``wandb/latest-run`` when it holds several).
    None while there is none yet; an InputError when several runs leave it open."""
    from sapper.logs import mlflow, wandb

    if path.is_file() and path.suffix == ".wandb":
        return path, "wandb"
    if not path.is_dir():
        return None
    for fmt, module in (("wandb", wandb), ("mlflow", mlflow)):
        runs = module.runs_in(path)
        if len(runs) == 1:
            return runs[0], fmt
        if fmt == "wandb" and runs:
            for base in (path, path / "wandb"):
                latest = base / "latest-run"
                if latest.is_dir():
                    return latest, fmt
        if runs:
            raise InputError(
                f"holds {len(runs)} {fmt} runs; watch one of them",
                file=str(path),
                expected=", ".join(str(r) for r in runs[:5]),
            )
    return None


class RunFolderFollower(Follower):
    """A W&B or MLflow run, followed through its parser's own ``poll()``."""

    def __init__(self, path: Path, fmt: str, mapping: dict[str, FieldMap] | None = None) -> None:
        super().__init__(str(path))
        found = polled_format(fmt)
        if found is None:
            raise InputError("not a folder format", field="--log-format", value=fmt,
                             expected="wandb / mlflow")
        self.path = path
        self._format = found
        self.mapping = dict(mapping or {})
        self._parser: LogParser | None = None
        self.waiting = f"waiting for a {fmt} run in {path}"

    @property
    def format(self) -> str | None:
        return self._format.name

    @property
    def parser(self) -> LogParser | None:
        return self._parser

    def poll(self) -> list[StepRecord]:
        if self._parser is None:
            if not self.path.exists():
                return []
            recognise = self._format.recognise_dir
            if self.path.is_dir() and recognise is not None and recognise(self.path) < 0.9:
                return []  # the tracker has made the folder but not its files yet
            self._parser = self._format.parser(self.path, self.mapping)
        records = self._parser.poll()  # type: ignore[attr-defined]
        if records:
            self._saw_data(time.monotonic())
        return records

    def close(self) -> list[StepRecord]:
        if self._parser is None:
            raise InputError(f"no {self._format.name} run appeared before the watch ended",
                             file=self.name)
        return self._parser.finish()
