"""The ``sapper`` command: parses, calls the library, maps errors to one line and a code.

Exit codes: 0 no errors, 1 errors found (warnings too under ``--strict``), 2 invalid input,
3 an internal error in sapper itself.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any

import typer
from rich.console import Console

from sapper.errors import SapperError, clip
from sapper.report.safe import safe_markup

__all__ = ["OutputFormat", "app", "console", "emit_json", "main", "run_guarded"]

app = typer.Typer(
    name="sapper",
    help="Clears the mines in large-model training before they go off.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


class OutputFormat(str, Enum):
    text = "text"
    json = "json"


FormatOpt = Annotated[OutputFormat, typer.Option("--format", "-f", help="text or json.")]
SelectOpt = Annotated[
    list[str] | None,
    typer.Option("--select", help="Only these codes or prefixes (repeat or comma-separate)."),
]
IgnoreOpt = Annotated[
    list[str] | None,
    typer.Option("--ignore", help="Skip these codes or prefixes (repeat or comma-separate)."),
]


def split_codes(values: list[str] | None, option: str = "--select") -> list[str]:
    """The codes of a repeated, comma-separated ``option``, each checked to be a rule code
    or prefix (exit 2 naming the bad one, not a silent PASS)."""
    codes = [c.strip() for v in values or [] for c in v.split(",") if c.strip()]
    if codes:
        from sapper.rules.registry import check_patterns

        check_patterns(codes, option)
    return codes


def emit_json(payload: Any) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


def run_guarded(body: Callable[[], int]) -> None:
    """Run a command body; user errors become one red line and their exit code."""
    try:
        code = body()
    except SapperError as exc:
        # Escaped: the line quotes user values, and "[/x]" in one is not rich markup.
        line = safe_markup(str(exc))
        err_console.print(f"[bold red]error:[/] {line}", highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    raise typer.Exit(code)


def _register_commands() -> None:
    # Each command module adds itself to ``app`` on import.
    from sapper.cli import (  # noqa: F401
        analyze_cmd,
        check_cmd,
        memory_cmd,
        plan_cmd,
        report_cmd,
        rules_cmd,
        smoke_cmd,
        watch_cmd,
    )


def main() -> None:
    _register_commands()
    try:
        app()
    except SystemExit:
        raise
    except Exception as exc:  # never a traceback for the user
        what = safe_markup(clip(str(exc)))
        err_console.print(
            f"[bold red]internal error:[/] {type(exc).__name__}: {what} "
            "(a bug in sapper; rerun with SAPPER_DEBUG=1 for the traceback)",
            highlight=False,
        )
        import os

        if os.environ.get("SAPPER_DEBUG"):
            raise
        sys.exit(3)
