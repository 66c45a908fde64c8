"""``sapper analyze LOG...``: the live monitor's detectors over logs that already exist.

Reads each log (sapper run log, ``trainer_state.json``, TensorBoard, CSV/JSONL, Megatron,
console output; every format in :mod:`sapper.logs.registry`),
feeds its records to the same detector objects the monitor runs in the training loop,
and reports the findings like ``sapper check``: text or ``--format json``, exit 1 on
errors (or warnings under ``--strict``), 2 when an input cannot be read. A log that can
be read only in part is analyzed as far as it goes, with notes saying what was skipped.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sapper.cli.options import PlanInputs, load_from_options, with_plan_options
from sapper.cli.output import (
    FormatOpt,
    IgnoreOpt,
    OutputFormat,
    SelectOpt,
    console,
    emit_json,
    err_console,
    run_guarded,
    split_codes,
)

# Readers, detectors, pydantic and the renderers are imported where they are used:
# ``sapper --help`` imports this module (and report/watch import its helpers), and a
# command's start-up should pay only for what that command runs.
if TYPE_CHECKING:
    from sapper.logs import LogData
    from sapper.plan.schema import Plan

__all__ = [
    "LOG_FORMATS",
    "LogFormatOpt",
    "MapOpt",
    "has_plan_inputs",
    "plan_for",
    "with_log_plan_options",
]

#: ``sapper.logs.FORMATS``, spelled out so the option's help does not import every log
#: reader; tests/test_startup.py checks that the two agree.
LOG_FORMATS: tuple[str, ...] = (
    "sapper",
    "trainer_state",
    "tensorboard",
    "csv",
    "jsonl",
    "megatron",
    "hf_console",
    "keyvalue",
    "wandb",
    "mlflow",
)

LogFormatOpt = Annotated[
    str | None,
    typer.Option(
        "--log-format",
        help=f"Read the logs as this format instead of detecting it: {', '.join(LOG_FORMATS)}.",
        show_default=False,
    ),
]
MapOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--map",
        help="Map a column or tag to a record field: COLUMN=FIELD or COLUMN=FIELD*FACTOR "
        "(e.g. --map 'mem_mb=memory_peak_gib*0.0009765625', --map iter=step, --map x=ignore).",
        show_default=False,
    ),
]
_PlanFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--plan", help="A sapper plan file (YAML) describing the run.", show_default=False
    ),
]


def with_log_plan_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``with_plan_options`` for commands whose positional arguments are logs: the plan
    file becomes ``--plan``; every other plan option (``--model``, ``--max-norm`` ...)
    stays as ``sapper check`` has it."""
    wrapped = with_plan_options(fn)
    sig = wrapped.__signature__  # type: ignore[attr-defined]
    params = [
        p.replace(annotation=_PlanFileOpt) if p.name == "plan" else p
        for p in sig.parameters.values()
    ]
    wrapped.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapped.__annotations__["plan"] = _PlanFileOpt
    return wrapped


def has_plan_inputs(inputs: PlanInputs) -> bool:
    given = [inputs.plan, inputs.model, inputs.deepspeed, *inputs.values.values()]
    return bool(inputs.configs) or any(v is not None for v in given)


def plan_for(inputs: PlanInputs, logs: list[LogData]) -> Plan | None:
    """The Plan from the command line, else the one a sapper run log carries, else None."""
    if has_plan_inputs(inputs):
        return load_from_options(inputs).plan
    from sapper.pipeline.logs import stored_plan

    return stored_plan(logs)


#: ``sapper.logs.columnar.DEFAULT_MIN_BYTES``, spelled out so the command line can tell
#: a log worth reading early without importing the readers; tests/test_startup.py checks
#: that the two agree.
EARLY_READ_BYTES = 4 << 20
#: Options after which the logs are not read into columns as they are (merged, mapped,
#: another format forced), or nothing is read at all (help).
_NO_EARLY_READ = ("--merge", "--map", "--log-format", "--help", "-h")
#: The longest the command line waits for the early read to start (it then goes on).
_EARLY_IMPORT_WAIT_S = 30.0


def start_early_read(argv: list[str]) -> None:
    """For ``sapper analyze`` of a large file, begin reading it into columns in a thread
    now (:mod:`sapper.logs.columnar.early`), before the command line is parsed and the
    detectors are imported: polars decodes the log on the other core while this thread
    imports. Returns once polars is decoding the first blocks (or the read is turned
    down), so this thread's imports do not race the read's start for the interpreter's
    lock. The first argument that is a regular file of at least
    :data:`EARLY_READ_BYTES` is the one; the reader takes the result only for that very
    file, so a wrong guess (an option's value) costs work, never a different answer.
    Does nothing for other commands, small files, or the options of
    :data:`_NO_EARLY_READ`."""
    if not argv or argv[0] != "analyze":
        return
    args = argv[1:]
    if any(a.split("=", 1)[0] in _NO_EARLY_READ for a in args):
        return
    import os
    import stat

    for arg in args:
        if arg.startswith("-"):
            continue
        try:
            st = os.stat(arg)
        except (OSError, ValueError):
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size < EARLY_READ_BYTES:
            continue
        import threading

        if "numpy" not in sys.modules:
            # numpy's OpenBLAS starts a thread per core that spins on start-up (some 0.1 s
            # of CPU); analyze multiplies no matrices. The user's setting stands.
            os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        ready = threading.Event()

        def read(path: str = arg, ready: threading.Event = ready) -> None:
            try:
                from sapper.logs.columnar.early import read_ahead

                read_ahead(path, ready)
            except Exception:  # the command reads the file itself and says what is wrong
                pass
            finally:
                ready.set()

        threading.Thread(target=read, name="sapper-early-read", daemon=True).start()
        ready.wait(_EARLY_IMPORT_WAIT_S)
        return


#: glibc's ``mallopt`` parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def _reuse_freed_memory() -> None:
    """Let glibc keep the memory numpy frees for the next array instead of returning it
    to the kernel at once, for the vectorised detectors over a long log's columns:
    their temporaries are arrays of megabytes, each freed and soon allocated again;
    returned and taken back, every page of each was faulted in afresh (some 45,000
    faults, a quarter of a second of system time on a million steps). What the read
    freed is handed back first (the detectors start ~25 MB lower); then arrays under
    32 MB come from the heap, and its top is given back only past 512 MB free. Set after
    the read (set before it, the read's pieces of every size left holes in the heap and
    the peak grew by some 70 MB). Nothing where the C library has no ``mallopt`` (not
    glibc)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt, trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError, ImportError):
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)  # what the read freed goes back first: the detectors start ~25 MB lower
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, 512 << 20)


_exit_unswept = False


def _skip_exit_sweeps() -> None:
    """Once the answer is out, spare the exit the cyclic garbage collector's sweeps.
    The interpreter's shutdown runs full collections over every object still alive (the
    command line's modules, the readers', numpy's and polars' wrappers), some 0.08 s on
    two cores, to find cycles in memory the process is about to hand back whole. An exit
    handler moves every object out of the collector's reach first (``gc.freeze``); the
    objects are still released as the modules are torn down, and nothing is left to
    write (the output is flushed before). Registered once per process."""
    global _exit_unswept
    if _exit_unswept:
        return
    import atexit
    import gc

    atexit.register(gc.freeze)
    _exit_unswept = True


#: Inputs at least this large take over a second: a progress bar on a terminal.
PROGRESS_BYTES = 32 << 20


class _Progress:
    """A transient rich progress bar on stderr for a long analysis, or nothing (not a
    terminal, JSON output, small inputs)."""

    def __init__(self, paths: list[Path], enabled: bool) -> None:
        self.bar: Any = None
        if not enabled or not err_console.is_terminal:
            return
        size = 0
        for p in paths:
            try:
                size += sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if (
                    p.is_dir()
                ) else p.stat().st_size
            except OSError:
                continue
        if size < PROGRESS_BYTES:
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        )
        self.reading = self.bar.add_task("reading", total=None)
        self.detecting: Any = None

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def read(self, path: str) -> None:
        if self.bar is not None:
            self.bar.update(self.reading, description=f"reading {Path(path).name}")

    def detectors(self, logs: int, per_log: int) -> Callable[[int], None] | None:
        if self.bar is None:
            return None
        self.bar.update(self.reading, total=1, completed=1)
        self.detecting = self.bar.add_task("detectors", total=logs * per_log)
        return lambda n: self.bar.advance(self.detecting, n)


@with_log_plan_options
def analyze(
    inputs: PlanInputs,
    logs: Annotated[
        list[Path],
        typer.Argument(
            help="Logs: sapper run log (.jsonl), trainer_state.json or a HF output folder, "
            "TensorBoard event files or run folders, CSV/JSONL tables, Megatron text logs, "
            "HF Trainer console output, 'step N | loss X' console logs (nanoGPT, torchtitan).",
            show_default=False,
        ),
    ],
    log_format: LogFormatOpt = None,
    mapping: MapOpt = None,
    merge: bool = typer.Option(
        False, "--merge", help="Treat all logs as one run (a run resumed into new files)."
    ),
    fmt: FormatOpt = OutputFormat.text,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
    strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings too."),
) -> None:
    """Run the monitor's detectors over existing training logs and name what went wrong."""

    def body() -> int:
        from sapper.pipeline.logs import (
            analyses_json,
            analyze_logs,
            column_mapping,
            count,
            cross_rank_analysis,
            detectors_for,
            load_logs,
            merge_logs,
            prepare_while_reading,
        )
        from sapper.report.safe import safe_markup as escape
        from sapper.rules.model import Severity

        columns = column_mapping(mapping)
        prepare_while_reading()
        with _Progress(logs, fmt != OutputFormat.json) as bar:
            loaded, failed = load_logs(
                logs, log_format, columns, columnar=not merge, progress=bar.read
            )
            if not loaded:
                raise failed[0]
            if any(getattr(log, "columns", None) is not None for log in loaded):
                _reuse_freed_memory()  # a long log: the detectors' arrays ahead
            if merge and len(loaded) > 1:
                loaded = [merge_logs(loaded)]
            plan = plan_for(inputs, loaded)
            tick = bar.detectors(len(loaded), len(detectors_for(plan)))
            analyses = analyze_logs(
                loaded, plan, split_codes(select), split_codes(ignore, "--ignore"), progress=tick
            )
            if not merge:
                cross = cross_rank_analysis(
                    loaded, split_codes(select), split_codes(ignore, "--ignore")
                )
                if cross is not None:
                    analyses.append(cross)
        for exc in failed:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
        if fmt == OutputFormat.json:
            emit_json(analyses_json(analyses, failed))
        else:  # the renderer (and the checklist's it builds on) only for text
            from sapper.report.analyses import render_analyses

            console.print(render_analyses(analyses))
        _skip_exit_sweeps()
        if failed:
            return 2
        errors, warnings = count(analyses, Severity.ERROR), count(analyses, Severity.WARNING)
        return 1 if errors or (strict and warnings) else 0

    run_guarded(body)
