"""The ledger of runs: concurrent writers, filters, matching a plan that blew up before,
and a ledger that cannot be used never stopping anything."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
from pathlib import Path

import pytest

from sapper.launch.ledger import LedgerError, add_run, fingerprint, list_runs, matches
from sapper.plan.load import load_plan

ROOT = Path(__file__).resolve().parents[2]
WRITERS, ROWS = 8, 25


def _writer(path: str, writer: int) -> None:
    for i in range(ROWS):
        add_run(outcome="failed" if i % 2 else "ok", run_dir=f"runs/w{writer}-{i}",
                command=f"python train.py --writer {writer}", fingerprint={"family": "llama"},
                cause="lr-too-high" if i % 2 else None, check="lr" if i % 2 else None,
                path=Path(path))


@pytest.mark.slow
def test_eight_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), w)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    rows = list_runs(path=path)
    assert len(rows) == WRITERS * ROWS
    assert len({r.run_dir for r in rows}) == WRITERS * ROWS
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    assert len(list_runs(outcome="failed", cause="lr", path=path)) == WRITERS * (ROWS // 2)


def test_a_plan_that_repeats_the_setting_of_an_old_cause_matches(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    plan = load_plan(configs=[ROOT / "examples/plans/healthy-llama-7b.yaml"]).plan
    fp = fingerprint(plan)
    add_run(outcome="failed", run_dir="runs/old", command="x", fingerprint=fp,
            cause="lr-too-high", check="lr", path=path)
    found = matches(fp, path=path)
    assert [m.row.run_dir for m in found] == ["runs/old"]
    assert "lr-too-high" in found[0].line() and "runs/old" in found[0].line()
    changed = dict(fp, lr=fp["lr"] / 10)  # the setting the cause named moved: no match
    assert matches(changed, path=path) == []
    other = dict(fp, family="gpt2")  # another model family: no match
    assert matches(other, path=path) == []


def test_healthy_and_causeless_runs_never_match(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    fp = {"family": "llama", "lr": 1e-4, "warmup_steps": 10, "schedule": "cosine"}
    add_run(outcome="ok", run_dir="runs/a", command="x", fingerprint=fp, path=path)
    add_run(outcome="failed", run_dir="runs/b", command="x", fingerprint=fp, path=path)
    assert matches(fp, path=path) == []


def test_missing_or_broken_ledger(tmp_path: Path) -> None:
    assert matches({"family": "llama"}, path=tmp_path / "none.sqlite") == []
    with pytest.raises(LedgerError):
        list_runs(path=tmp_path / "none.sqlite")
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(b"this is not a database" * 100)
    with pytest.raises(LedgerError):
        add_run(outcome="ok", run_dir="r", command="x", fingerprint={}, path=broken)
    blocked = tmp_path / "file"
    blocked.write_text("a file where the ledger's folder should be")
    with pytest.raises(LedgerError):
        add_run(outcome="ok", run_dir="r", command="x", fingerprint={},
                path=blocked / "runs.sqlite")


def test_check_names_the_run_a_plan_repeats(tmp_path: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from sapper.cli.app import _register_commands, app

    monkeypatch.setenv("SAPPER_HOME", str(tmp_path))
    plan_file = ROOT / "examples/plans/healthy-llama-7b.yaml"
    fp = fingerprint(load_plan(configs=[plan_file]).plan)
    add_run(outcome="failed", run_dir="runs/exp41", command="x", fingerprint=fp,
            cause="lr-too-high", check="lr")
    _register_commands()
    out = CliRunner().invoke(app, ["check", str(plan_file)]).output
    assert "history:" in out and "runs/exp41" in out and "lr-too-high" in out
