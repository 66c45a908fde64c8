"""Text taken from a log never reaches the terminal or the HTML page raw.

A key, a tag, a W&B run name or a file name can hold ESC sequences (``\\x1b[2J`` clears
the screen, ``\\x1b]0;...`` retitles the terminal), bidi overrides that reorder what is
shown (U+202E), C0/C1 controls and NULs, or rich markup (``[bold red]``) that rich would
apply. One helper, :func:`sapper.errors.printable`, escapes the characters; the terminal
adds rich's markup escape (:func:`sapper.report.terminal.safe_markup`), the HTML report
applies it to every string of its data (:func:`sapper.report.html_data.page_text`).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tempfile
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text
from tests.logs.hostile import HOSTILE_CHARS, fast_settings, runner

from sapper.cli.app import app
from sapper.errors import printable
from sapper.report.html_data import page_text
from sapper.report.terminal import render_findings, safe_markup
from sapper.rules.model import Finding, Severity

#: Characters that must never reach a terminal or a page as they are.
_RAW = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
    "\ufeff\ud800-\udfff]"
)
hostile_text = st.lists(
    st.one_of(st.characters(), st.sampled_from(HOSTILE_CHARS)), max_size=20
).map("".join)


def _category_ok(text: str, keep: str = "") -> bool:
    return all(
        c in keep or c == " " or unicodedata.category(c)[0] not in "CZ" for c in text
    )


@fast_settings(1000)
@given(text=hostile_text)
def test_printable_leaves_nothing_that_drives_a_terminal(text: str) -> None:
    out = printable(text)
    assert out.isprintable() and _category_ok(out)
    assert not _RAW.search(out)
    assert printable(out) == out  # already safe: unchanged
    kept = printable(text, keep="\n")
    assert _category_ok(kept, keep="\n") and kept.count("\n") == text.count("\n")


@fast_settings(1000)
@given(text=st.text(alphabet=st.characters(blacklist_categories=("C", "Z")), max_size=40))
def test_printable_text_is_unchanged(text: str) -> None:
    assert printable(text) == text


def _rendered(renderable: object) -> str:
    buf = io.StringIO()
    Console(file=buf, force_terminal=True, color_system=None, width=400).print(renderable)
    return buf.getvalue()


@fast_settings(1500)
@given(text=hostile_text, slashes=st.sampled_from(("", "\\", "\\\\")))
def test_safe_markup_prints_literally(text: str, slashes: str) -> None:
    """Inside markup, the text shows exactly as ``printable`` makes it (a trailing
    backslash as ``\\x5c``): its brackets are not markup, its backslashes are kept,
    the tag after it still closes, and no control character reaches the terminal."""
    text = slashes + text
    shown = printable(text)
    if shown.endswith("\\"):
        shown = shown[:-1] + "\\x5c"
    safe = safe_markup(text)
    assert Text.from_markup(f"key: {safe} end", emoji=False).plain == f"key: {shown} end"
    assert Text.from_markup(f"[bold]{safe}[/]", emoji=False).plain == shown
    out = _rendered(Text.from_markup(f"[bold]key:[/] {safe} end"))
    assert not _RAW.search(out.replace("\n", ""))


def test_markup_in_a_key_prints_as_written() -> None:
    finding = Finding(
        code="R001", severity=Severity.ERROR, message="tag [bold red]boom[/] \x1b[2J\u202eabc",
        fix="see [link=http://x]here[/link]", check="loss", title="loss spike",
    )
    out = _rendered(render_findings([finding]))
    assert "[bold red]boom[/]" in out and "[link=http://x]here[/link]" in out
    assert "\\x1b[2J\\u202eabc" in out and "\x1b[2J" not in out and "\u202e" not in out


@fast_settings(400)
@given(tree=st.recursive(
    hostile_text | st.floats() | st.integers(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4),
    max_leaves=20,
))
def test_page_text_escapes_every_string(tree: object) -> None:
    out = page_text({"x": tree})
    text = json.dumps(out, ensure_ascii=False, allow_nan=True)
    assert not _RAW.search(text.replace("\n", ""))


# ---- through the commands ---------------------------------------------------------------
@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="sapper-escaping-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _table(name: str) -> str:
    """A W&B panel export of two runs, the first named ``name``: sapper notes both run
    names, so the name reaches the terminal and the page."""
    quoted = name.replace('"', '""')
    header = f'Step,"{quoted} - train/loss","other - train/loss"'
    rows = [f"{i},{2.0 - i / 100},{2.0}" for i in range(1, 15)]
    return "\n".join([header, *rows]) + "\n"


@fast_settings(100)
@given(name=hostile_text.filter(lambda t: t.strip() and "\n" not in t and "\r" not in t))
def test_hostile_run_name_in_analyze_and_report(work: Path, name: str) -> None:
    path = work / "export.csv"
    path.write_text(_table(name), encoding="utf-8", errors="surrogatepass")
    res = runner.invoke(app, ["analyze", str(path)])
    assert res.exit_code in (0, 1), res.output
    assert not _RAW.search(res.output.replace("\n", "")), ascii(res.output)
    page_path = work / "report.html"
    res = runner.invoke(app, ["report", str(path), "-o", str(page_path)])
    assert res.exit_code == 0, res.output
    page = page_path.read_text(encoding="utf-8")
    assert not _RAW.search(page.replace("\n", "")), "raw control or bidi character in the page"
    assert page.count("<script") == 2 and page.count("</script>") == 2
    assert page.count("</html>") == 1
    data = re.search(r'<script type="application/json" id="sapper-data">(.*?)</script>', page, re.S)
    assert data is not None
    notes = json.loads(data.group(1))["notes"]
    assert any("the table holds 2 runs" in n for n in notes), notes  # the name is shown


def test_hostile_file_name_in_analyze(work: Path) -> None:
    path = work / "run\x1b[31m[bold red]\u202e.csv"
    path.write_text(_table("a"))
    res = runner.invoke(app, ["analyze", str(path)])
    assert res.exit_code in (0, 1)
    assert "\x1b[31m" not in res.output and "\u202e" not in res.output
    assert "[bold red]" in res.output
