"""``sapper diagnose`` over real flight-recorder dumps (tests/hangs/data, made by torch
under gloo): each names the stuck collective and the rank that keeps it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sapper.cli.app import _register_commands, app
from sapper.hangs import diagnose_hang
from sapper.hangs.dumps import read_folder

DATA = Path(__file__).parent / "data"
runner = CliRunner()
_register_commands()


def cause(name: str | Path) -> dict[str, Any]:
    verdict = diagnose_hang(DATA / name if isinstance(name, str) else name)
    assert verdict is not None
    out = verdict.to_json()
    assert out["summary"]["check"] == "distributed"
    return out["causes"][0] if out["causes"] else {}


def by_rank(c: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {e["rank"]: e for e in c["evidence"] if e["rank"] is not None}


@pytest.mark.parametrize(
    ("scenario", "kind", "suspects", "group", "seq", "op"),
    [
        ("skip_allreduce", "hang-not-entered", [1], "0", 3, "all_reduce"),
        ("python_loop", "hang-not-entered", [0], "0", 3, "all_reduce"),
        ("op_mismatch", "hang-op-mismatch", [2], "0", 3, "all_reduce"),
        ("size_mismatch", "hang-size-mismatch", [3], "0", 3, "all_reduce"),
        ("rank_died", "unknown", [2], "0", 3, "all_reduce"),
        ("two_groups", "hang-not-entered", [3], "2", 3, "all_reduce"),
    ],
)
def test_each_hang_names_its_rank_and_collective(scenario, kind, suspects, group, seq, op):
    c = cause(scenario)
    assert c["check"] == "distributed"
    assert (c["cause"], c["suspects"]) == (kind, suspects)
    col = c["collective"]
    assert (col["process_group"], col["seq"], col["op"]) == (group, seq, op)
    assert col["input_sizes"] == [[8]] and col["dtypes"] == ["Float"]
    assert [e["rank"] for e in c["evidence"] if e["suspect"]] == suspects


def test_a_rank_that_skipped_is_shown_where_it_went_instead():
    c = cause("skip_allreduce")
    rank1 = by_rank(c)[1]
    assert rank1["role"] == "behind"
    assert rank1["last_in_group"]["seq"] == 2 and rank1["last_in_group"]["completed"]
    assert rank1["frame"].endswith("in _after_work") and rank1["frame_source"] == "faulthandler"
    assert not rank1["in_collective"]
    for r in (0, 2, 3):  # the others wait inside the all-reduce, called from the scenario
        assert by_rank(c)[r]["role"] == "waiting" and by_rank(c)[r]["in_collective"]
        assert "in skip_allreduce" in by_rank(c)[r]["frame"]


def test_a_rank_stuck_in_python_is_named_with_its_loop():
    rank0 = by_rank(cause("python_loop"))[0]
    assert rank0["role"] == "behind" and rank0["frame"].endswith("in _spin_forever")


def test_mismatches_show_the_odd_record():
    op = by_rank(cause("op_mismatch"))[2]
    assert op["mismatch"] == "op-mismatch" and op["entry"]["op"] == "all_gather"
    size = by_rank(cause("size_mismatch"))[3]
    assert size["entry"]["input_sizes"] == [[5]] and "5 Float" in size["message"]


def test_a_dead_rank_is_the_first_suspect_and_the_answer_says_what_is_missing():
    c = cause("rank_died")
    assert c["confidence"] is None and c["missing"] == [2]
    assert by_rank(c)[2]["role"] == "missing"
    assert "left no dump" in c["notes"][0] and "missing" in c["next_test"]


def test_only_the_stuck_group_of_two_is_named():
    verdict = diagnose_hang(DATA / "two_groups")
    assert verdict is not None
    states = {g["process_group"]: g["state"] for g in verdict.to_json()["summary"]["groups"]}
    assert states == {"1": "healthy", "2": "not-entered", "3": "healthy", "4": "healthy"}
    c = cause("two_groups")
    assert c["collective"]["ranks"] == [2, 3]
    assert by_rank(c)[3]["last_elsewhere"]["process_group"] == "4"


def test_a_slow_healthy_job_is_no_hang():
    verdict = diagnose_hang(DATA / "slow_healthy")
    assert verdict is not None and not verdict.hung and verdict.exit_code() == 0
    assert verdict.to_json()["summary"]["verdict"] == "healthy"


def test_json_and_pickle_dumps_read_the_same():
    found = read_folder(DATA / "op_mismatch")
    assert found is not None
    assert found.dumps[1].path.endswith(".json") and found.dumps[0].version == "2.10"
    json_rank, pickle_rank = found.dumps[1].collectives["0"], found.dumps[0].collectives["0"]
    assert [e.signature() for e in json_rank.values()] == [
        e.signature() for e in pickle_rank.values()]
    assert [e.done for e in json_rank.values()] == [True, True, False]
    assert not json_rank[3].frames and pickle_rank[3].frames  # the JSON form has no stacks
    ops = {r: d.collectives["0"][3].op for r, d in found.dumps.items()}
    assert ops == {0: "all_reduce", 1: "all_reduce", 2: "all_gather", 3: "all_reduce"}


def test_no_dumps_is_none(tmp_path):
    (tmp_path / "train.log").write_text("step 1 | loss 2.0\n")
    (tmp_path / "rank_0.json").write_text('{"loss": 1}')
    assert diagnose_hang(tmp_path) is None


def test_cli_exit_codes_and_json(tmp_path):
    hung = runner.invoke(app, ["diagnose", str(DATA / "python_loop"), "--format", "json"])
    assert hung.exit_code == 1, hung.output
    out = json.loads(hung.output)
    assert out["causes"][0]["suspects"] == [0]
    assert out["summary"]["verdict"] == "hang-not-entered"
    text = runner.invoke(app, ["diagnose", str(DATA / "size_mismatch")])
    assert text.exit_code == 1 and "rank 3 called all_reduce #3" in " ".join(text.output.split())
    healthy = runner.invoke(app, ["diagnose", str(DATA / "slow_healthy")])
    assert healthy.exit_code == 0 and "No hang" in healthy.output


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("nccl_trace_rank_12", 12),
        ("nccl_trace_rank_12.json", 12),
        ("rank_7", 7),  # sapper run's fr/
        ("rank3-4711.txt", 3),  # sapper run's stacks/: the pid follows the rank
        ("nccl_trace_rank_container-node02_5", 5),  # hostname and rank (pytorch#140879)
        ("stacks_rank_0.txt", 0),
        ("trainer_state.json", None),
    ],
)
def test_the_rank_comes_from_the_file_name(name, rank):
    from sapper.hangs.dumps import _rank_of

    assert _rank_of(Path(name)) == rank


def test_a_json_log_with_entries_is_no_dump(tmp_path):
    (tmp_path / "metrics_3.json").write_text('{"entries": [{"loss": 1.0}], "step": 3}')
    assert diagnose_hang(tmp_path) is None


def test_other_binary_files_beside_the_dumps_are_left_alone(tmp_path):
    """A legacy torch checkpoint (a pickle naming torch's globals) and an event file
    beside the dumps: the dumps are read, the others are not taken for dumps."""
    import pickle

    folder = tmp_path / "run"
    shutil.copytree(DATA / "skip_allreduce", folder)
    (folder / "optimizer_1.pkl").write_bytes(pickle.dumps(Path("/x")))  # names pathlib
    (folder / "events.out.tfevents.1700000000.host.7").write_bytes(b"\x80\x10" + b"\0" * 64)
    assert cause(folder)["suspects"] == [1]


def test_a_run_folder_that_dumped_without_hanging_is_diagnosed_from_its_logs(tmp_path):
    """Ranks that dump on the way out of a crash leave dumps with no collective stuck: the
    run did not hang, so `diagnose RUN_DIR` answers from its logs; a hung run folder still
    gets the hang answer."""
    run = tmp_path / "run"
    shutil.copytree(DATA / "slow_healthy", run / "fr")
    (run / "logs").mkdir()
    fixtures = Path(__file__).parents[1] / "fixtures" / "diagnose"
    shutil.copy(fixtures / "overflow.jsonl", run / "logs" / "rank0.jsonl")
    (run / "console.log").write_text("")
    crashed = runner.invoke(app, ["diagnose", str(run), "--format", "json"])
    out = json.loads(crashed.output)
    assert out["summary"].get("check") != "distributed"
    assert out["causes"], crashed.output
    shutil.rmtree(run / "fr")
    shutil.copytree(DATA / "python_loop", run / "fr")
    hung = runner.invoke(app, ["diagnose", str(run), "--format", "json"])
    assert hung.exit_code == 1
    assert json.loads(hung.output)["summary"]["check"] == "distributed"
