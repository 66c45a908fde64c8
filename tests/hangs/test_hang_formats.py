"""The recorded dumps rewritten the ways other torch versions and backends write them
(NCCL's pg_config with ranks, explicit states, the older ``seq_id``), and edited into the
kinds of hang no small gloo job produces on its own (a dtype mismatch, a rank ahead, every
rank inside the same collective, paths that parted earlier)."""

from __future__ import annotations

import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sapper.hangs import diagnose_hang
from sapper.unpickle import Vocabulary, restricted_loads

DATA = Path(__file__).parent / "data"


def load(path: Path) -> dict[str, Any]:
    return restricted_loads(path.read_bytes(), Vocabulary(), str(path))


def rewrite(tmp: Path, scenario: str, edit: Callable[[int, dict[str, Any]], None]) -> Path:
    """The scenario's pickled dumps, each edited by ``edit(rank, dump)``."""
    out = tmp / scenario
    out.mkdir()
    for src in sorted((DATA / scenario).glob("nccl_trace_rank_*")):
        rank = int(src.name.rsplit("_", 1)[1])
        dump = load(src)
        edit(rank, dump)
        (out / src.name).write_bytes(pickle.dumps(dump))
    return out


def entry(dump: dict[str, Any], seq: int, pg: str = "0") -> dict[str, Any]:
    return next(e for e in dump["entries"]
                if e["collective_seq_id"] == seq and e["process_group"][0] == pg)


def answer(folder: Path) -> dict[str, Any]:
    verdict = diagnose_hang(folder)
    assert verdict is not None
    out = verdict.to_json()
    return out["causes"][0] if out["causes"] else {}


def test_nccl_style_dumps_with_pg_config_states_and_old_seq_ids(tmp_path):
    """pg_config declares 5 ranks (rank 4 wrote nothing), completion is the entry's state,
    and the sequence number is the pre-2.4 ``seq_id``."""
    def nccl(rank: int, dump: dict[str, Any]) -> None:
        dump["version"] = "2.2"
        dump["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3, 4]"}}
        dump.pop("pg_status")
        for e in dump["entries"]:
            e["seq_id"] = e.pop("collective_seq_id")
            e["state"] = "completed" if e.pop("retired") else "started"
            e["profiling_name"] = e["profiling_name"].replace("gloo:", "nccl:")

    c = answer(rewrite(tmp_path, "skip_allreduce", nccl))
    assert (c["cause"], c["suspects"]) == ("hang-not-entered", [1])
    assert c["collective"]["ranks"] == [0, 1, 2, 3, 4]
    assert c["collective"]["ranks_from"] == "pg_config" and c["missing"] == [4]
    assert any("no dump from rank(s) 4" in n for n in c["notes"])


def test_a_dtype_mismatch(tmp_path):
    def bf16(rank: int, dump: dict[str, Any]) -> None:
        e = entry(dump, 3)
        e["input_sizes"] = e["output_sizes"] = [[8]]
        if rank == 3:
            e["input_dtypes"] = e["output_dtypes"] = ["BFloat16"]

    c = answer(rewrite(tmp_path, "size_mismatch", bf16))
    assert (c["cause"], c["suspects"]) == ("hang-dtype-mismatch", [3])


def test_a_rank_ahead(tmp_path):
    """Rank 0 called a collective the other three never call (rank 1 skipped it already
    in the recording; ranks 2 and 3 are made to skip it too)."""
    def extra(rank: int, dump: dict[str, Any]) -> None:
        if rank in (2, 3):
            dump["entries"] = [e for e in dump["entries"] if e["collective_seq_id"] != 3]
            dump["pg_status"] = {k: {**v, "last_enqueued_collective": 2}
                                 for k, v in dump["pg_status"].items()}  # fmt: skip

    c = answer(rewrite(tmp_path, "skip_allreduce", extra))
    assert (c["cause"], c["suspects"]) == ("hang-ahead", [0])
    assert {e["rank"]: e["role"] for e in c["evidence"]} == {
        0: "waiting", 1: "behind", 2: "behind", 3: "behind"}


def test_every_rank_inside_the_same_collective_is_undecided(tmp_path):
    def same(rank: int, dump: dict[str, Any]) -> None:
        e = entry(dump, 3)
        e["input_sizes"] = e["output_sizes"] = [[8]]
        e["retired"] = False
        dump["pg_status"] = {k: {**v, "last_completed_collective": 2}
                             for k, v in dump["pg_status"].items()}  # fmt: skip

    c = answer(rewrite(tmp_path, "size_mismatch", same))
    assert (c["cause"], c["mismatch"]) == ("unknown", "stuck-inside")
    assert c["suspects"] == [0, 1, 2, 3] and c["confidence"] is None


def test_where_the_paths_parted_is_kept(tmp_path):
    """Rank 2 all-gathered at #2 where the others all-reduced, then went on: the hang at
    #3 is a size mismatch, and the answer says the paths parted at #2."""
    def parted(rank: int, dump: dict[str, Any]) -> None:
        if rank == 2:
            entry(dump, 2)["profiling_name"] = "gloo:all_gather"

    c = answer(rewrite(tmp_path, "size_mismatch", parted))
    assert c["cause"] == "hang-size-mismatch"
    assert any("already differ at #2" in n and "ranks 2 " in n for n in c["notes"])


def test_many_suspects_are_summarised_not_listed(tmp_path):
    """A 64-rank job whose ranks 1..40 all skipped: the evidence lists 32 ranks and counts
    the rest."""
    src = DATA / "skip_allreduce"
    out = tmp_path / "wide"
    out.mkdir()
    for rank in range(64):
        model = src / f"nccl_trace_rank_{1 if 1 <= rank <= 40 else 0}"
        shutil.copy(model, out / f"nccl_trace_rank_{rank}")
    c = answer(out)
    assert c["cause"] == "hang-ahead" and c["suspects"] == [0, *range(41, 64)]
    assert len(c["evidence"]) == 33 and "more ranks" in c["evidence"][-1]["message"]


def test_ranks_waiting_in_sends_and_receives_are_no_healthy_job(tmp_path):
    """Gloo records no point-to-point ops; NCCL does (``nccl:send 1->0``). A job whose
    collectives all completed but whose rank 1 waits in a send is not called healthy."""
    def send(rank: int, dump: dict[str, Any]) -> None:
        if rank == 1:
            last = dump["entries"][-1]
            dump["entries"].append({**last, "is_p2p": True, "p2p_seq_id": 1,
                                    "profiling_name": "nccl:send 1->0", "retired": False,
                                    "time_created_ns": last["time_created_ns"] + 1})  # fmt: skip

    verdict = diagnose_hang(rewrite(tmp_path, "slow_healthy", send))
    assert verdict is not None and not verdict.hung and verdict.exit_code() == 1
    c = verdict.to_json()["causes"][0]
    assert (c["cause"], c["mismatch"]) == ("unknown", "p2p")
    assert [e["rank"] for e in c["evidence"]] == [1] and "send 1->0" in c["evidence"][0]["message"]


def test_dumps_without_a_collective_say_what_is_missing(tmp_path):
    def off(rank: int, dump: dict[str, Any]) -> None:
        dump["entries"], dump["pg_status"] = [], {}

    verdict = diagnose_hang(rewrite(tmp_path, "skip_allreduce", off))
    assert verdict is not None and verdict.exit_code() == 1
    c = verdict.to_json()["causes"][0]
    assert c["cause"] == "unknown" and "TORCH_FR_BUFFER_SIZE" in c["next_test"]
