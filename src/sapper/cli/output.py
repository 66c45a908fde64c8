"""What every command shares: the consoles, the ``--format``/``--select``/``--ignore``
options, JSON output and the guard that turns a user error into one line and an exit code.

Below both ``app`` and the command modules: a command imports these, ``app`` imports the
commands, and nothing here imports either, so the command line has no import cycle.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any

import typer
from rich.console import Console

from sapper.errors import SapperError
from sapper.jsontext import dumps
from sapper.report.safe import safe_markup

__all__ = [
    "FormatOpt",
    "IgnoreOpt",
    "OutputFormat",
    "SelectOpt",
    "attach_json",
    "console",
    "emit_json",
    "err_console",
    "run_guarded",
    "split_codes",
]

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


#: Top-level keys the next :func:`emit_json` adds to its document (``--show-plan``).
_ATTACHED: dict[str, Any] = {}


def attach_json(extra: dict[str, Any]) -> None:
    """Add ``extra``'s keys to the JSON document this command prints (the command's own
    keys win): options every command shares print through the command's one document."""
    _ATTACHED.update(extra)


def emit_json(payload: Any) -> None:
    if isinstance(payload, dict) and _ATTACHED:
        payload = {**_ATTACHED, **payload}
    _ATTACHED.clear()
    sys.stdout.write(dumps(payload, indent=2) + "\n")


def run_guarded(body: Callable[[], int]) -> None:
    """Run a command body; user errors become one red line and their exit code."""
    _ATTACHED.clear()
    try:
        code = body()
    except SapperError as exc:
        # Escaped: the line quotes user values, and "[/x]" in one is not rich markup. The
        # error's detail lines (what would have been accepted) follow it, each escaped.
        err_console.print(
            f"[bold red]error:[/] {safe_markup(str(exc))}", highlight=False, soft_wrap=True
        )
        for line in exc.details:
            err_console.print(safe_markup(line), highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    raise typer.Exit(code)
