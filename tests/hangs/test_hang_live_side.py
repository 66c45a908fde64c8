"""The live side: what a rank writes for the hang analysis before the job goes down, and
the heartbeat's watcher asking every rank of a ``sapper run`` for its dumps."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sapper.distributed.heartbeat import DUMP_TRIGGER, Heartbeat, _Seen, recorder_env
from sapper.hangs import diagnose_hang

JOB = textwrap.dedent("""
    import os, socket, sys
    import torch, torch.distributed as dist
    from sapper.distributed.heartbeat import dump_local
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    print("\\n".join(dump_local(0, entry_stacks=False)))
    dist.destroy_process_group()
""")


def run_job(tmp: Path, **env: str) -> list[str]:
    full = {**os.environ, "SAPPER_RUN_DIR": str(tmp), **env}
    for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        if k not in env:
            full.pop(k, None)
    out = subprocess.run([sys.executable, "-c", JOB], env=full, capture_output=True,
                         text=True, timeout=120, check=True)  # fmt: skip
    return out.stdout.split()


def test_recorder_env_never_overrides_the_user():
    assert recorder_env({}) == {"TORCH_FR_BUFFER_SIZE": "2000"}
    assert recorder_env({"TORCH_FR_BUFFER_SIZE": "0"}) == {}
    assert recorder_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "100"}) == {}


@pytest.mark.distributed
def test_a_rank_writes_its_dump_and_stacks_into_the_run_folder(tmp_path):
    written = run_job(tmp_path, TORCH_FR_BUFFER_SIZE="100")
    fr = tmp_path / "fr" / "rank_0"
    assert str(fr) in written and fr.stat().st_size > 0
    stacks = [Path(p) for p in written if "/stacks/" in p]
    assert len(stacks) == 1 and stacks[0].name.startswith("rank0-")
    assert "in <module>" in stacks[0].read_text()
    verdict = diagnose_hang(tmp_path)
    assert verdict is not None and not verdict.hung and verdict.stacks == 1
    assert verdict.to_json()["summary"]["groups"] == [
        {"process_group": "0", "desc": "default_pg", "ranks": 1, "state": "healthy", "seq": 3}]


@pytest.mark.distributed
def test_a_recorder_the_user_set_off_is_left_off(tmp_path):
    written = run_job(tmp_path, TORCH_FR_BUFFER_SIZE="0")
    assert not (tmp_path / "fr").exists()
    assert [Path(p).parent.name for p in written] == ["stacks"]
    assert diagnose_hang(tmp_path) is None  # stacks alone are no dumps


class _Store:
    def set(self, key: str, value: str) -> None:
        pass


def test_the_watcher_naming_a_lost_rank_asks_every_rank_for_its_dumps(tmp_path, monkeypatch):
    monkeypatch.setenv("SAPPER_RUN_DIR", str(tmp_path))
    reported = []
    hb = Heartbeat(_Store(), rank=0, world_size=4, report=reported.extend)
    seen = _Seen(seq=3, step=7, phase="forward", progress=9, beat_at=0.0, moved_at=0.0)
    hb._say([hb._crash(2, seen, 45.0, None)])
    assert [f.rank for f in reported] == [2]
    assert (tmp_path / DUMP_TRIGGER).exists()
    assert hb.dumped and any("/stacks/rank0-" in p for p in hb.dumped)
    before = hb.dumped
    hb._say([hb._crash(3, seen, 45.0, None)])  # this rank's own dump is written once
    assert hb.dumped is before
