"""The run folder: everything about one run in one place (docs/run.md).

``preflight.txt`` and ``preflight.json`` (the checklist as ``sapper check`` prints it),
``command.txt``, ``env.json``, ``console.log``, ``logs/rank{R}.jsonl`` (the monitor's run
log of every rank), ``stacks/`` and ``fr/`` (written when a hang is suspected),
``plan.json`` (the checked plan, for the monitors the bootstrap attaches),
``report.html`` after a failure, and ``run.json``, the machine-readable summary, strict
JSON through :func:`sapper.jsontext.dumps`.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sapper.errors import InputError
from sapper.jsontext import dumps
from sapper.runtime.rundir import DUMP_TRIGGER, PLAN_FILE

if TYPE_CHECKING:
    from sapper.launch.preflight import Preflight

__all__ = [
    "is_run_folder",
    "make",
    "node_name",
    "summary",
    "write_env",
    "write_json",
    "write_start",
]

#: Version of run.json's layout.
RUN_JSON_VERSION = 1


def make(out: Path | None, name: str, cwd: Path) -> Path:
    """The run folder, created (``runs/<name>-<YYYYmmdd-HHMMSS>`` by default); absolute,
    since the children resolve it from their own working directories. An existing folder
    is used as it is: each node of a multi-node job writes its part into the same one."""
    if out is None:
        out = Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = out if out.is_absolute() else cwd / out
    path = Path(os.path.abspath(path))
    try:
        for sub in ("", "logs", "stacks", "fr"):
            (path / sub).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"cannot make the run folder ({exc.strerror or exc})", file=str(path),
            field="--out", expected="a folder sapper can create and write",
        ) from None
    return path


def node_name(name: str, node: int) -> str:
    """A file of node ``node`` in a folder several nodes share: node 0 keeps the plain
    name (``run.json``), another node's is ``run-node3.json``, ``console-node3.log``."""
    if not node:
        return name
    stem, dot, ext = name.partition(".")
    return f"{stem}-node{node}{dot}{ext}"


def is_run_folder(path: Path) -> bool:
    """A folder ``sapper run`` wrote (the pipeline's test, which reads it as a run)."""
    from sapper.pipeline.logs import is_run_folder as pipeline_test

    return pipeline_test(path)


def write_json(path: Path, doc: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)


def write_start(run_dir: Path, argv: list[str], cwd: Path, pre: Preflight,
                node: int = 0) -> None:
    """What is known before the launch: the command and the checklist. A trigger file
    left by an earlier run into the same folder is removed by node 0 (it would ask the
    new run's ranks for their stacks at once)."""
    if not node:
        (run_dir / DUMP_TRIGGER).unlink(missing_ok=True)
    (run_dir / node_name("command.txt", node)).write_text(
        f"cd {shlex.quote(str(cwd))}\n{shlex.join(argv)}\n"
    )
    write_json(run_dir / node_name("preflight.json", node), {
        "checklist": pre.to_json(),
        "skipped": pre.skipped,
        "sources": pre.sources,
    })
    (run_dir / node_name("preflight.txt", node)).write_text(_preflight_text(pre))
    if pre.loaded is not None:
        # The plan the checklist judged, for the monitors the bootstrap attaches in the
        # training processes (their detectors read the schedule, clipping, GPU ... from it).
        write_json(run_dir / node_name(PLAN_FILE, node), pre.loaded.plan.model_dump(mode="json"))


def write_env(run_dir: Path, info: dict[str, Any], node: int = 0) -> None:
    """env.json: the versions, GPUs and variables that decide numerics and communication."""
    from sapper.launch.machine import environment

    write_json(run_dir / node_name("env.json", node), environment(info))


def _preflight_text(pre: Preflight) -> str:
    if pre.report is None:
        return f"no checklist: {pre.skipped}\n"
    from io import StringIO

    from rich.console import Console

    from sapper.report.terminal import render_check_report

    buf = StringIO()
    Console(file=buf, width=110, color_system=None, force_terminal=False).print(
        render_check_report(pre.report)
    )
    return f"pre-flight checklist of {', '.join(pre.sources)}\n\n" + buf.getvalue()


def summary(
    argv: list[str],
    cwd: Path,
    exit_code: int,
    program_exit_code: int | None,
    outcome: str,
    started: float,
    ended: float,
    pre: Preflight,
    *,
    findings: list[dict[str, Any]] | None = None,
    diagnosis: dict[str, Any] | None = None,
    hang: dict[str, Any] | None = None,
    history: list[dict[str, Any]] | None = None,
    report: Path | None = None,
    steps: dict[str, int | None] | None = None,
    tokens: dict[str, Any] | None = None,
    notes: list[str] | None = None,
    forwarded: list[str] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """run.json."""
    return {
        "version": RUN_JSON_VERSION,
        "command": list(argv),
        "command_line": shlex.join(argv),
        "cwd": str(cwd),
        "exit_code": exit_code,
        "program_exit_code": program_exit_code,
        "outcome": outcome,
        "started": started,
        "ended": ended,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "ended_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ended)),
        "preflight": pre.to_json(),
        "preflight_skipped": pre.skipped,
        "findings": findings or [],
        "diagnosis": diagnosis,
        "hang": hang,
        "history": history or [],
        "report": str(report) if report is not None else None,
        "steps": steps or {},
        "tokens": tokens or {"measured": None, "predicted": None, "how": None},
        "signals": forwarded or [],
        "error": error,
        "notes": notes or [],
    }
