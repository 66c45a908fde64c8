"""The ``sapper`` command: parses, calls the library, maps errors to one line and a code.

Exit codes: 0 no errors, 1 errors found (warnings too under ``--strict``), 2 invalid input,
3 an internal error in sapper itself.

The command modules (``*_cmd.py``) define plain functions and import only what sits below
them (:mod:`sapper.cli.output`, :mod:`sapper.cli.options`); this module imports them and
registers each under its name, so no command module imports the app.
"""

from __future__ import annotations

import sys

import typer

from sapper.cli import (
    analyze_cmd,
    check_cmd,
    diagnose_cmd,
    inspect_cmd,
    memory_cmd,
    plan_cmd,
    report_cmd,
    rules_cmd,
    run_cmd,
    runs_cmd,
    smoke_cmd,
    watch_cmd,
)
from sapper.cli.output import err_console
from sapper.errors import clip
from sapper.report.safe import safe_markup

__all__ = ["app", "main"]

app = typer.Typer(
    name="sapper",
    help="Clears the mines in large-model training before they go off.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_registered = False


def _register_commands() -> None:
    """Add every command to ``app``, once: registration is an explicit call, not a side
    effect of importing a command module (tests and ``main`` may both call this)."""
    global _registered
    if _registered:
        return
    # In the order ``sapper --help`` has always listed them.
    for name, command in (
        ("analyze", analyze_cmd.analyze),
        ("check", check_cmd.check),
        ("diagnose", diagnose_cmd.diagnose),
        ("inspect", inspect_cmd.inspect),
        ("memory", memory_cmd.memory),
        ("plan", plan_cmd.plan),
        ("report", report_cmd.report),
        ("rules", rules_cmd.rules),
        ("explain", rules_cmd.explain),
        ("run", run_cmd.run),
        ("runs", runs_cmd.runs),
        ("smoke", smoke_cmd.smoke),
        ("watch", watch_cmd.watch),
    ):
        # ``run`` takes a whole command after its own options: the first word that is
        # not one of them starts it, whatever options the command has.
        settings = (
            {"allow_interspersed_args": False, "ignore_unknown_options": True}
            if name == "run" else None
        )
        app.command(name, context_settings=settings)(command)
    _registered = True


#: BaseException subclasses libraries raise for a file they cannot read.
_LIBRARY_INPUT_ERRORS = frozenset({"CheckpointException"})


def main() -> None:
    # A long log's read begins before the arguments are parsed and the command's modules
    # imported, which then run while polars decodes it (sapper.logs.columnar.early).
    analyze_cmd.start_early_read(sys.argv[1:])
    _register_commands()
    try:
        app()
    except (SystemExit, KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:  # never a traceback for the user
        # Some libraries raise BaseException subclasses (torch's CheckpointException): a
        # reader's error about a file is still the user's input, and still one line.
        what = safe_markup(clip(str(exc)))
        if type(exc).__name__ in _LIBRARY_INPUT_ERRORS:
            err_console.print(f"[bold red]error:[/] {what}", highlight=False, soft_wrap=True)
            sys.exit(2)
        err_console.print(
            f"[bold red]internal error:[/] {type(exc).__name__}: {what} "
            "(a bug in sapper; rerun with SAPPER_DEBUG=1 for the traceback)",
            highlight=False,
        )
        import os

        if os.environ.get("SAPPER_DEBUG"):
            raise
        sys.exit(3)
