"""Helpers of the watch tests: a real fault run, its log formats, the writer processes
that replay it next to a watcher, and a watcher on a thread that records when each
finding was emitted.

The run is trained here, once per session, on the CPU: a two-layer causal transformer
language model in fp16 autocast learns a cyclic token pattern for 50 steps; at step 51 a
misconfigured schedule multiplies the LR by 3,000 (the kind of bug a wrong warmup unit
causes), the loss spikes, and from the next step on fp16 overflows and the loss is NaN.
Its records are written as the formats ``sapper watch`` follows (sapper run log,
Megatron-LM lines, TensorBoard events) by a separate writer process while the watcher
runs.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sapper.rules.model import Finding
from sapper.runtime.records import StepRecord
from sapper.watch import Watcher, WatchSink

HERE = Path(__file__).parent
FAULT_STEP = 51  # the first update with the broken LR
SPIKE_STEP = FAULT_STEP + 1  # the first loss computed after it
STEPS = 60


def train_fault_run(steps: int = STEPS, fault_step: int = FAULT_STEP) -> list[StepRecord]:
    import torch
    from torch import nn

    vocab, dim, seq, batch = 96, 32, 32, 8

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, dim)
            self.pos = nn.Embedding(seq, dim)
            layer = nn.TransformerEncoderLayer(
                dim, 2, 4 * dim, dropout=0.0, batch_first=True, norm_first=True
            )
            self.body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, vocab)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
            h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
            return self.head(self.norm(self.body(h, mask=mask, is_causal=True)))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: threads only contend
    try:
        torch.manual_seed(0)
        model = TinyLM()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        gen = torch.Generator().manual_seed(1)
        pattern = torch.randint(0, vocab, (16,), generator=gen)
        records = []
        for step in range(1, steps + 1):
            shifts = torch.randint(0, 16, (batch,), generator=gen)
            x = torch.stack([torch.roll(pattern, int(s)) for s in shifts]).repeat(1, 2)
            lr = 3e-3 * (3000.0 if step >= fault_step else 1.0)
            for group in opt.param_groups:
                group["lr"] = lr
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.float16):
                logits = model(x[:, :-1])
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, vocab),
                                               x[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
            opt.step()
            elapsed = time.perf_counter() - start
            tokens = batch * (x.shape[1] - 1)
            records.append(StepRecord(
                step=step, loss=loss.item(), grad_norm=grad_norm.item(), lr=lr,
                tokens=tokens, step_time_s=elapsed, tokens_per_s=tokens / elapsed,
                time=time.time(),
            ))
        return records
    finally:
        torch.set_num_threads(threads)


def first_nonfinite(records: list[StepRecord]) -> StepRecord:
    return next(r for r in records if r.loss is not None and not math.isfinite(r.loss))


def runlog_lines(records: list[StepRecord]) -> list[str]:
    """A sapper run log: meta, then one step line per record."""
    meta = {"kind": "meta", "version": 1, "started": records[0].time, "run": "tiny-lm-fault"}
    return [json.dumps(meta)] + [json.dumps({"kind": "step", **r.to_json()}) for r in records]


def megatron_line(r: StepRecord, total: int = STEPS) -> str:
    """An iteration line as Megatron-LM prints it (a NaN loss is left out of the average
    and counted in 'number of nan iterations')."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.time or 0))
    nan = r.loss is None or not math.isfinite(r.loss)
    parts = [
        f" [{stamp}] iteration {r.step:8d}/{total:8d}",
        f" consumed samples: {8 * r.step:12d}",
        f" elapsed time per iteration (ms): {1000 * (r.step_time_s or 0):.1f}",
        f" learning rate: {r.lr:.6E}",
        " global batch size:     8",
    ]
    if not nan:
        parts.append(f" lm loss: {r.loss:.6E}")
    parts += [
        " loss scale: 1.0",
        f" grad norm: {r.grad_norm:.3f}",
        " number of skipped iterations:   0",
        f" number of nan iterations: {int(nan):3d}",
    ]
    return "|".join(parts) + " |"


def megatron_lines(records: list[StepRecord]) -> list[str]:
    head = [
        "using world size: 1, data-parallel size: 1, tensor-model-parallel size: 1",
        "------------------------ arguments ------------------------",
        "  fp16 .................................... True",
        "  lr ...................................... 0.003",
        "-------------------- end of arguments ---------------------",
    ]
    return head + [megatron_line(r) for r in records]


@dataclass
class Emitted:
    finding: Finding
    at: float  # wall-clock time the watcher emitted it


class Recorder(WatchSink):
    """Keeps each finding with the wall-clock time it was emitted, and the records seen."""

    def __init__(self) -> None:
        self.emitted: list[Emitted] = []
        self.seen: list[StepRecord] = []
        self.notes: list[str] = []
        self.lock = threading.Lock()

    def records(self, records: list[StepRecord]) -> None:
        self.seen.extend(records)

    def finding(self, finding: Finding) -> None:
        with self.lock:
            self.emitted.append(Emitted(finding, time.time()))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def first(self, code: str, step: int | None = None) -> Emitted | None:
        with self.lock:
            for e in self.emitted:
                if e.finding.code == code and (step is None or e.finding.step == step):
                    return e
        return None


class Running:
    """A watcher on a background thread; ``stop()`` ends it and returns its result."""

    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher
        self.stop_event = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.watcher.run(self.stop_event)
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return True
            if not self.thread.is_alive():
                return bool(predicate())
            time.sleep(0.02)
        return False

    def stop(self, timeout: float = 10.0) -> Any:
        self.stop_event.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the watcher did not stop"
        if self.error is not None:
            raise self.error
        return self.result


def start_writer(src: Path, dst: str | Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(HERE / "writer.py"), str(src), str(dst), *args])


def start_tb_writer(records: Path, logdir: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "tb_writer.py"), str(records), str(logdir), *args]
    )
