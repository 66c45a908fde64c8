"""A dump made now by torch itself (the recorded data could be stale against the installed
torch): a gloo job whose rank 1 skips an all-reduce, dumped by each rank, diagnosed."""

from __future__ import annotations

import pytest

from sapper.hangs import diagnose_hang


@pytest.mark.slow
@pytest.mark.distributed
def test_a_live_gloo_job_is_dumped_and_diagnosed(tmp_path):
    from make_dumps import make

    folder = make("skip_allreduce", tmp_path, json_ranks=frozenset({2}))
    verdict = diagnose_hang(folder)
    assert verdict is not None and verdict.hung
    c = verdict.to_json()["causes"][0]
    assert (c["cause"], c["suspects"]) == ("hang-not-entered", [1])
    assert (c["collective"]["process_group"], c["collective"]["seq"]) == ("0", 3)
    rank1 = next(e for e in c["evidence"] if e["rank"] == 1)
    assert rank1["frame"].endswith("in _after_work")
