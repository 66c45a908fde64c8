"""A CSV log with a damaged row loses that row only: a carriage return inside an unquoted
field, a quote that never closes, a NUL, a field past the csv module's size limit. The
row is counted in a note and every other row is read; a header that cannot be read is
one line naming the file (exit 2), never an internal error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.logs import read_log

runner = CliRunner()
_register_commands()

HEADER = "step,loss,grad_norm"
ROWS = [f"{i},{3 - i * 0.001:.3f},1.0" for i in range(1, 201)]
BAD_AT = 50  # the row of step 50, line 51 of the file


def write(tmp_path: Path, bad: str, *, header: str = HEADER) -> Path:
    rows = list(ROWS)
    rows[BAD_AT - 1] = bad
    path = tmp_path / "metrics.csv"
    path.write_text("\n".join([header, *rows]) + "\n", newline="")
    return path


def analyze(path: Path):
    return runner.invoke(app, ["analyze", str(path), "-f", "json"])


@pytest.mark.parametrize("bad", [
    "50,2.950\r7,1.0",  # a carriage return inside an unquoted field
    '50,"2.950,1.0',  # a quote that never closes
    '50,"2.950\r,1.0',  # both
    "50," + "x" * 200_000 + ",1.0",  # past the csv module's field limit
    '"' * 1001,
    "50,2.950,1.0,9,9",  # too wide
])
def test_a_bad_row_costs_only_itself(tmp_path: Path, bad: str) -> None:
    log = read_log(write(tmp_path, bad))
    steps = [r.step for r in log.records]
    assert steps == [s for s in range(1, 201) if s != BAD_AT]
    assert any("1 line(s) were malformed rows and were skipped: 51" in n for n in log.notes), (
        log.notes)


@pytest.mark.parametrize("bad", ["50,2.950\x00,1.0", "50,2.950,1.0\x00\x00"])
def test_a_nul_loses_nothing(tmp_path: Path, bad: str) -> None:
    log = read_log(write(tmp_path, bad))
    assert [r.step for r in log.records] == list(range(1, 201))


def test_rows_after_an_unclosed_quote_are_read_through_the_cli(tmp_path: Path) -> None:
    res = analyze(write(tmp_path, '50,"2.950,1.0'))
    assert res.exit_code in (0, 1), res.output
    (log,) = json.loads(res.stdout)["summary"]["logs"]
    assert log["records"] == 199 and log["last_step"] == 200
    assert any("malformed rows" in n for n in log["notes"])


def test_several_bad_rows_each_cost_one_row(tmp_path: Path) -> None:
    rows = list(ROWS)
    for k in (10, 11, 100, 150):
        rows[k - 1] = f'{k},"open' if k % 2 else f"{k},1\r2,3"
    path = tmp_path / "metrics.csv"
    path.write_text("\n".join([HEADER, *rows]) + "\n", newline="")
    log = read_log(path)
    assert len(log.records) == 196
    assert any(n.startswith("4 line(s) were malformed rows") for n in log.notes), log.notes


@pytest.mark.parametrize(("header", "said"), [
    ("step,loss\r,grad_norm", "carriage return"),
    ('step,"loss,grad_norm', "does not close"),
    ('"' + "x" * 200_000 + '",loss', "field limit"),
])
def test_an_unreadable_header_is_one_line_exit_2(tmp_path: Path, header: str,
                                                  said: str) -> None:
    path = write(tmp_path, ROWS[BAD_AT - 1], header=header)
    res = analyze(path)
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert "\n" not in line and "Traceback" not in line
    assert str(path) in line and "line 1" in line and said in line, line
