"""``sapper run [OPTIONS] -- <launch command>``: guard a training run without touching its
code — the checklist before it starts, the monitor in every training process, the answer
when it ends, and everything in one run folder (docs/run.md).

The plan options ``--config``, ``--model``, ``--gpu``, ``--gpus``, ``--seq-len`` and
``--dataset`` add what the command cannot say (as ``sapper check``'s do, after it).

Exit code: the program's own (128+N for a death by signal N); 1 when a pre-flight error
blocked the launch; 124 when sapper ended a hung job; 127 when the command cannot start.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from sapper.cli.options import ConfigOpt, DatasetOpt, GpuOpt, GpusOpt, ModelOpt, SeqOpt
from sapper.cli.output import console, err_console, run_guarded
from sapper.errors import InputError


def run(
    command: Annotated[
        list[str] | None,
        typer.Argument(
            help="The launch command, after `--`: torchrun ..., deepspeed ..., accelerate "
            "launch ..., llamafactory-cli train x.yaml, python train.py ...",
            show_default=False,
        ),
    ] = None,
    out: Path | None = typer.Option(
        None, "--out", "-o",
        help="The run folder (default runs/<name>-<YYYYmmdd-HHMMSS>).", show_default=False,
    ),
    no_block: bool = typer.Option(
        False, "--no-block", help="Launch even when the pre-flight checklist has errors."
    ),
    check_only: bool = typer.Option(
        False, "--check-only", help="Print the pre-flight checklist and stop."
    ),
    hang_after: float = typer.Option(
        600.0, "--hang-after", metavar="SECONDS",
        help="Call the run hung when no rank logs a new step for this long (0: never).",
    ),
    no_ledger: bool = typer.Option(
        False, "--no-ledger", help="Neither read nor write the ledger of runs."
    ),
    config: ConfigOpt = None,
    model: ModelOpt = None,
    gpu: GpuOpt = None,
    gpus: GpusOpt = None,
    seq_len: SeqOpt = None,
    dataset: DatasetOpt = None,
) -> None:
    """Run a training command under sapper: pre-flight checklist, live monitor in every
    process, post-mortem or hang analysis at the end, one run folder."""

    def body() -> int:
        from sapper.launch.preflight import Given
        from sapper.launch.session import RunOptions, run_launch

        argv = list(command or [])
        if not argv:
            raise InputError(
                "no command to run", field="COMMAND",
                expected="the launch command after `--`, e.g. sapper run -- torchrun "
                "--nproc-per-node 8 train.py",
            )
        if not math.isfinite(hang_after) or hang_after < 0:
            raise InputError("must be 0 (never) or a number of seconds", field="--hang-after",
                             value=hang_after, expected="a number ≥ 0")
        if gpu is not None:
            from sapper.plan.hardware import resolve_gpu

            resolve_gpu(gpu, "--gpu")  # a name the table does not know: exit 2, not a skip
        given = Given(
            {"gpu": gpu, "gpus": gpus, "seq_len": seq_len, "dataset": dataset},
            model=model, configs=list(config or []),
        )
        opts = RunOptions(
            out=out, no_block=no_block, check_only=check_only,
            hang_after=hang_after or None, ledger=not no_ledger, given=given,
        )
        # The program's stdout stays its own (a pipe after `sapper run` sees only it):
        # sapper speaks on stderr, except for --check-only, whose output is the checklist.
        return run_launch(argv, opts, console if check_only else err_console, err_console)

    run_guarded(body)
