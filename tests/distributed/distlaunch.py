"""Launch real multi-process jobs (gloo on CPU) the way torchrun does: one process per rank
with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(**extra: Any) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


@dataclass
class Job:
    results: dict[int, dict[str, Any]]
    returncodes: list[int | None]
    logs: list[str]
    elapsed_s: float
    killed: list[int] = field(default_factory=list)

    def rank(self, r: int) -> dict[str, Any]:
        if r not in self.results:
            raise AssertionError(f"rank {r} wrote no result:\n{self.logs[r][-3000:]}")
        return self.results[r]

    def codes(self, r: int = 0) -> list[str]:
        return [f["code"] for f in self.rank(r)["findings"]]

    def explain(self) -> str:
        return "\n".join(
            f"--- rank {r} (rc={rc})\n{log[-2000:]}"
            for r, (rc, log) in enumerate(zip(self.returncodes, self.logs, strict=True))
        )


def _collect(
    out: Path,
    world: int,
    codes: list[int | None],
    logs: list[str],
    elapsed: float,
    killed: list[int],
) -> Job:
    results = {}
    for r in range(world):
        path = out / f"rank{r}.json"
        if path.exists():
            results[r] = json.loads(path.read_text())
    return Job(results, codes, logs, elapsed, killed)


def run_job(
    tmp: Path,
    world: int,
    opts: dict[str, Any],
    *,
    timeout_s: float = 90.0,
    node_of: list[int] | None = None,
    worker: Path = WORKER,
) -> Job:
    """Start ``world`` worker processes (``worker.py`` unless told), wait at most
    ``timeout_s``, kill the stragglers (only the processes started here, by their own
    handles)."""
    out = tmp / "out"
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs, files = [], []
    per_node = world if node_of is None else world // len(set(node_of))
    for r in range(world):
        node = 0 if node_of is None else node_of[r]
        env = child_env(
            RANK=r,
            WORLD_SIZE=world,
            LOCAL_RANK=r % per_node,
            LOCAL_WORLD_SIZE=per_node,
            GROUP_RANK=node,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )
        log = open(tmp / f"log{r}.txt", "w+")
        files.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(worker), "job", str(out), json.dumps(opts)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    start = time.monotonic()
    killed = []
    for r, p in enumerate(procs):
        left = max(0.1, timeout_s - (time.monotonic() - start))
        try:
            p.wait(timeout=left)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            killed.append(r)
    elapsed = time.monotonic() - start
    logs = []
    for f in files:
        f.seek(0)
        logs.append(f.read())
        f.close()
    return _collect(out, world, [p.returncode for p in procs], logs, elapsed, killed)


def run_torchrun(tmp: Path, world: int, opts: dict[str, Any], timeout_s: float = 120.0) -> Job:
    """The same worker under the real launcher (``python -m torch.distributed.run``)."""
    out = tmp / "out"
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world}",
        str(WORKER),
        "job",
        str(out),
        json.dumps(opts),
    ]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=timeout_s)
    return _collect(
        out, world, [proc.returncode], [proc.stdout + proc.stderr], time.monotonic() - start, []
    )
