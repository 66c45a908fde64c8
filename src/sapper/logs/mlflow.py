"""MLflow runs in a local file store (``mlruns/``), read without the ``mlflow`` package.

The layout is mlflow's ``mlflow/store/tracking/file_store.py`` (``FileStore``):
``mlruns/<experiment id>/meta.yaml`` names the experiment; each run is
``mlruns/<experiment id>/<run id>/`` with a ``meta.yaml`` (``run_id``, ``run_name``,
``status`` as RunStatus's integer, ``start_time``/``end_time`` in ms ...), one file per
metric under ``metrics/`` (a name with ``/`` is a nested folder: ``metrics/train/loss``),
one per param under ``params/`` and per tag under ``tags/``, and ``artifacts/``. A metric
file holds one ``<timestamp ms> <value> <step>`` line per logged value; a line of two
fields is a value logged before steps existed, step 0 (``FileStore._get_metric_from_line``).
Deleted experiments live in ``mlruns/.trash``, the model registry in ``mlruns/models``;
neither holds runs to read.

Metric names map through :mod:`sapper.logs.fields` (``loss``, ``train_loss``,
``learning_rate``, ``grad_norm`` ...). :meth:`MlflowParser.poll` reads what each metric
file gained since the last call, so ``sapper watch`` can follow a live run. A line that
is not two or three numbers, a NUL block or a torn last line costs only itself (counted
per metric in a note); the number of metric files and their size are bounded.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sapper.errors import InputError, clip, quote
from sapper.logs.base import LineBuffer, LogParser, gc_paused, put_mapped, to_float
from sapper.logs.fields import FieldMap
from sapper.logs.formats import LogFormat
from sapper.logs.limits import (
    MAX_LOG_BYTES,
    MAX_NESTING,
    open_log,
    read_json_document,
    to_count,
)
from sapper.rules.model import Finding
from sapper.runtime.records import StepRecord
from sapper.runtime.trackers import MLFLOW_FINDINGS_ARTIFACT

__all__ = ["FINDINGS_ARTIFACT", "FORMAT", "MlflowParser", "run_status", "runs_in"]

#: Where the monitor's MLflow sink leaves its findings, under the run's ``artifacts/``.
FINDINGS_ARTIFACT = MLFLOW_FINDINGS_ARTIFACT
#: Metric files read per run (a run logging per-layer norms of a 100-layer model has a
#: few hundred); the others are counted in a note.
MAX_METRICS = 5000
#: Params and tags kept per run, and the longest value of each.
_MAX_KEYS = 2000
_MAX_VALUE = 64 << 10
_META_BYTES = 1 << 20
_READ = 8 << 20
#: mlflow's ``RunStatus`` enum as the file store keeps it (``mlflow/entities/run_status.py``).
_STATUS = {1: "RUNNING", 2: "SCHEDULED", 3: "FINISHED", 4: "FAILED", 5: "KILLED"}
#: Experiment-level folders that are not runs (``FileStore.RESERVED_EXPERIMENT_FOLDERS``).
_RESERVED = frozenset({"tags", "datasets", "traces", ".trash", "models"})


def run_status(code: Any) -> str | None:
    """``RUNNING`` / ``FINISHED`` / ``FAILED`` ... for the integer a run's meta.yaml holds."""
    return _STATUS.get(code) if isinstance(code, int) else None


class _Metric:
    """One metric file, followed from where the last poll stopped."""

    __slots__ = ("bad", "decided", "lines", "name", "offset", "path", "target")

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = path
        self.offset = 0
        self.lines = LineBuffer()
        self.bad = 0
        self.target: FieldMap | None = None
        self.decided = False


class MlflowParser(LogParser):
    """Incremental reader of one MLflow run folder (``mlruns/<exp>/<run>/``)."""

    format = "mlflow"
    ordered = False  # one file per metric: steps arrive metric by metric

    def __init__(self, path: str | Path, mapping: dict[str, FieldMap] | None = None) -> None:
        path = Path(path)
        if path.is_file() and path.name == "meta.yaml":
            path = path.parent
        super().__init__(str(path), mapping)
        self.run = path
        if not (path / "meta.yaml").is_file() or not (path / "metrics").is_dir():
            raise InputError(
                "not an MLflow run folder",
                file=str(path),
                expected="mlruns/<experiment>/<run>/ with meta.yaml and metrics/",
            )
        self._metrics: dict[str, _Metric] = {}
        self._taken: dict[str, str] = {}
        self._dropped = 0
        self._bytes = 0
        self._read_meta()

    def feed(self, lines: Iterable[str]) -> list[StepRecord]:
        """MLflow runs are read from their folder: use :meth:`poll`."""
        raise TypeError("MLflow run folders are read with poll(), not feed()")

    def poll(self) -> list[StepRecord]:
        """Read the values each metric file gained since the last call."""
        with gc_paused():
            self._discover()
            for metric in self._metrics.values():
                self._read(metric)
        return self.merger.ready()

    def finish(self) -> list[StepRecord]:
        out = self.poll()
        for metric in self._metrics.values():
            self._take(metric, metric.lines.rest())
        bad = {m.name: m.bad for m in self._metrics.values() if m.bad}
        for name, count in list(bad.items())[:10]:
            self.notes.append(
                f"metric {quote(name)}: {count} line(s) were not '<timestamp> <value> <step>' "
                "and were skipped"
            )
        if len(bad) > 10:
            self.notes.append(f"... and {len(bad) - 10} more metrics with unreadable lines")
        for metric in self._metrics.values():
            note = metric.lines.note()
            if note:
                self.notes.append(f"metric {quote(metric.name)}: {note}")
        if self._dropped:
            self.notes.append(
                f"{self._dropped} metric file(s) past the first {MAX_METRICS} were not read"
            )
        self._read_findings()
        return out + super().finish()

    # ---- metric files -------------------------------------------------------------
    def _discover(self) -> None:
        root = self.run / "metrics"
        dropped = 0
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            depth = Path(dirpath).relative_to(root).parts
            if len(depth) >= MAX_NESTING:
                dirnames.clear()
            dirnames.sort()
            for filename in sorted(filenames):
                name = "/".join((*depth, filename))
                if name in self._metrics:
                    continue
                if len(self._metrics) >= MAX_METRICS:
                    dropped += 1
                    continue
                self._metrics[name] = _Metric(name, Path(dirpath) / filename)
        self._dropped = dropped

    def _read(self, metric: _Metric) -> None:
        try:
            fh = open_log(metric.path)
        except InputError:  # a FIFO or a vanished file among the metrics: that file only
            metric.bad += 1
            return
        try:
            with fh:
                fh.seek(metric.offset)
                while chunk := fh.read(_READ):
                    metric.offset += len(chunk)
                    self._bytes += len(chunk)
                    if self._bytes > MAX_LOG_BYTES:
                        raise InputError(
                            f"the metric files hold more than {MAX_LOG_BYTES >> 30} GiB",
                            file=str(self.run / "metrics"),
                            expected="an MLflow run (see Limits in docs/analyze.md)",
                        )
                    text = chunk.decode("utf-8", errors="replace")
                    self._take(metric, metric.lines.push(text))
        except OSError:
            metric.bad += 1

    def _take(self, metric: _Metric, lines: list[str]) -> None:
        if not lines:
            return
        target = self._target(metric)
        put = self.merger.put
        for line in lines:
            parts = line.split()
            if not parts:
                continue
            if len(parts) not in (2, 3):
                metric.bad += 1
                continue
            stamp = to_float(parts[0])
            value = to_float(parts[1])
            step = 0 if len(parts) == 2 else _step(parts[2])
            if stamp is None or value is None or step is None:
                metric.bad += 1
                continue
            values: dict[str, Any] = {"time": stamp / 1000.0}
            if target is None:
                put(step, values, {metric.name: value})
            else:
                extra: dict[str, Any] = {}
                put_mapped(target, value, values, extra)
                put(step, values, extra)

    def _target(self, metric: _Metric) -> FieldMap | None:
        """The record field a metric fills, decided once (as TensorBoard tags are)."""
        if metric.decided:
            return metric.target
        fm = self.series_target(metric.name, "metrics", self._taken)
        metric.target, metric.decided = fm, True
        return fm

    # ---- meta.yaml, params, tags, findings ------------------------------------------
    def _read_meta(self) -> None:
        from sapper.plan.sources import read_yaml_file

        info: dict[str, Any] = {"run_dir": str(self.run)}
        try:
            doc = read_yaml_file(self.run / "meta.yaml")
        except InputError as exc:
            self.notes.append(f"meta.yaml skipped: {exc}")
            doc = None
        if isinstance(doc, dict):
            for key in ("run_id", "run_name", "experiment_id", "lifecycle_stage", "user_id"):
                value = doc.get(key)
                if isinstance(value, (str, int)) and not isinstance(value, bool):
                    info[key] = clip(str(value))
            for key in ("start_time", "end_time"):
                if isinstance(doc.get(key), int):
                    info[key] = doc[key]
            status = run_status(doc.get("status"))
            if status is not None:
                info["status"] = status
        tags = _read_values(self.run / "tags")
        if tags:
            info["tags"] = tags
        self.meta["mlflow"] = info
        params = _read_values(self.run / "params")
        if params:
            self.meta["config"] = params

    def _read_findings(self) -> None:
        path = self.run / "artifacts" / FINDINGS_ARTIFACT
        if not path.is_file():
            return
        try:
            doc = read_json_document(path)
        except InputError as exc:
            self.notes.append(f"{FINDINGS_ARTIFACT} skipped: {exc}")
            return
        entries = doc.get("findings") if isinstance(doc, dict) else doc
        if not isinstance(entries, list):
            self.notes.append(f"{FINDINGS_ARTIFACT} holds no list of findings; skipped")
            return
        bad = 0
        for entry in entries:
            try:
                self.findings.append(Finding.model_validate(entry))
            except Exception:  # pydantic's ValidationError, or worse
                bad += 1
        if bad:
            self.notes.append(f"{bad} entr(y/ies) of {FINDINGS_ARTIFACT} were no findings")


def _step(text: str) -> int | None:
    """A step as mlflow writes it (a decimal integer in 0 … 2^63-1), else None; a
    5000-digit string is refused before ``int()`` sees it."""
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        return None
    return to_count(int(text))


def _read_values(folder: Path) -> dict[str, str]:
    """``params/`` or ``tags/``: one file per key (nested for keys with ``/``), its
    content the value; bounded in count and size, unreadable files passed over."""
    out: dict[str, str] = {}
    if not folder.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        rel = Path(dirpath).relative_to(folder).parts
        if len(rel) >= MAX_NESTING:
            dirnames.clear()
        dirnames.sort()
        for filename in sorted(filenames):
            if len(out) >= _MAX_KEYS:
                return out
            try:
                with open_log(Path(dirpath) / filename, limit=None) as fh:
                    data = fh.read(_MAX_VALUE + 1)
            except (InputError, OSError):
                continue
            if len(data) > _MAX_VALUE:
                continue
            text = data.decode("utf-8", errors="replace").replace("\x00", "")
            out["/".join((*rel, filename))] = text.strip()
    return out


# ---- recognising a run ---------------------------------------------------------------
def _meta_names_run(path: Path) -> bool:
    try:
        with open_log(path / "meta.yaml", limit=None) as fh:
            head = fh.read(_META_BYTES)
    except (InputError, OSError):
        return False
    return b"run_id:" in head or b"run_uuid:" in head


def _recognise_dir(path: Path) -> float:
    if not (path / "meta.yaml").is_file() or not (path / "metrics").is_dir():
        return 0.0
    return 1.0 if _meta_names_run(path) else 0.6


def _is_experiment(path: Path) -> bool:
    return (path / "meta.yaml").is_file() and not (path / "metrics").is_dir()


def _runs_of_experiment(exp: Path) -> list[Path]:
    try:
        entries = sorted(exp.iterdir())
    except OSError:
        return []
    return [
        p for p in entries
        if p.name not in _RESERVED and not p.is_symlink() and p.is_dir()
        and _recognise_dir(p) >= 0.6
    ]


def runs_in(folder: str | Path) -> list[Path]:
    """The MLflow runs under a folder, one entry each: the folder itself when it is a
    run; the runs of an experiment folder (``mlruns/<exp>/``); the runs of every active
    experiment of a store (``mlruns/``, not ``.trash`` or ``models``); the store of a
    project folder holding ``mlruns/``."""
    root = Path(folder)
    if not root.is_dir():
        return []
    if _recognise_dir(root) >= 0.6:
        return [root]
    if _is_experiment(root):
        return _runs_of_experiment(root)
    for store in (root, root / "mlruns"):
        if not store.is_dir():
            continue
        try:
            experiments = sorted(
                p for p in store.iterdir()
                if p.name not in _RESERVED and p.is_dir() and _is_experiment(p)
            )
        except OSError:
            return []
        runs = [run for exp in experiments for run in _runs_of_experiment(exp)]
        if runs:
            return runs
    return []


def _parser(path: Path, mapping: dict[str, FieldMap] | None) -> MlflowParser:
    return MlflowParser(path, mapping)


#: The ``mlflow`` log format (see :class:`sapper.logs.formats.LogFormat`).
FORMAT = LogFormat(
    name="mlflow",
    title="an MLflow run folder (file store)",
    looks_for="an mlruns/<experiment>/<run>/ folder with meta.yaml and metrics/",
    parser=_parser,
    read_mode="poll",
    recognise_dir=_recognise_dir,
    runs_in=runs_in,
)
