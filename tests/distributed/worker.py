"""One rank of a multi-process test job (started like torchrun: RANK, WORLD_SIZE, ...).

``python worker.py SCENARIO OUT_DIR OPTIONS_JSON``: trains a small model for a few steps
under DDP, FSDP2, a DeepSpeed engine or no wrapper, with the fault the options ask for
(a NaN on one rank, a slow rank, an unsharded sampler, a replica knocked out of sync, a
rank that dies or hangs), feeding a :class:`RankTracker`; writes ``rank<R>.json`` with
the findings this rank reported and rank 0's logged records.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, TensorDataset
from torch.utils.data.dataloader import default_collate

from sapper.distributed import RankTracker, global_grad_norm
from sapper.plan.schema import Plan

VOCAB, SEQ = 64, 17


class TinyLM(nn.Module):
    """Embedding, two residual MLP blocks, a head: a language model in miniature."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(width),
                nn.Linear(width, 2 * width),
                nn.GELU(),
                nn.Linear(2 * width, width),
            )
            for _ in range(2)
        )
        self.head = nn.Linear(width, VOCAB)
        self.delay = 0.0  # seconds of extra "compute" per forward (a slow GPU)
        self.fault: tuple[str, float] | None = None  # ("die" | "hang", seconds), once

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        if self.fault is not None:  # a crash or a hang in the middle of the forward
            what, seconds = self.fault
            self.fault = None
            if what == "die":
                sys.stdout.flush()
                os._exit(17)
            time.sleep(seconds)
        h = self.emb(ids)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def _hf_model(kind: str) -> nn.Module:
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=2,
            vocab_size=VOCAB,
            n_positions=32,
            bos_token_id=0,
            eos_token_id=0,
        )
        return GPT2LMHeadModel(cfg)
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=32,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg)


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids)
    return out.logits if hasattr(out, "logits") else out


def _loss(model: Any, batch: Any) -> torch.Tensor:
    if isinstance(batch, dict):
        batch = batch["input_ids"]
    logits = _logits(model, batch[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def _loader(opts: dict[str, Any], rank: int, world: int) -> DataLoader:
    data = torch.randint(0, VOCAB, (256, SEQ), generator=torch.Generator().manual_seed(1234))
    with_ids = bool(opts.get("with_ids"))
    ds = TensorDataset(data, torch.arange(len(data))) if with_ids else TensorDataset(data)
    slow = opts.get("slow_data_s", 0.0) if rank == opts.get("slow_rank") else 0.0

    def collate(items: list[Any]) -> torch.Tensor:
        if slow:
            time.sleep(slow)  # a starved loader / slow disk on this rank only
        got = default_collate(items)
        if with_ids:  # a loop whose batches carry their samples' ids
            return {"input_ids": got[0], "sample_ids": got[1]}
        return got[0]

    if opts.get("unsharded"):  # the classic bug: every rank shuffles the same way
        sampler: Any = RandomSampler(ds, generator=torch.Generator().manual_seed(0))
    else:
        replicas, index = (
            opts.get("dp_size", world),
            opts.get("dp_rank_of", {}).get(str(rank), rank),
        )
        sampler = DistributedSampler(ds, num_replicas=replicas, rank=index, seed=0)
    return DataLoader(ds, batch_size=4, sampler=sampler, collate_fn=collate)


def _wrap(model: nn.Module, how: str, opts: dict[str, Any]) -> Any:
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    if how == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        layers = getattr(getattr(model, "model", None), "layers", None) or []
        for layer in layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if how == "deepspeed":
        import deepspeed

        cfg = {
            "train_micro_batch_size_per_gpu": 4,
            "gradient_clipping": 1.0,
            "zero_optimization": {"stage": opts.get("zero", 1)},
        }
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
        return engine
    return model


def _spike_input(model: nn.Module, opts: dict[str, Any], rank: int, step: int) -> Any:
    """One rank's bad batch, this step only: its embeddings scaled by ``spike_factor`` (a
    row gone wild), so its loss and local gradient are huge but finite."""
    if rank == opts.get("spike_rank") and step == opts.get("spike_step"):
        factor = float(opts.get("spike_factor", 1e3))
        return model.emb.register_forward_hook(lambda m, a, out: out * factor)
    return None


def _lr_spike(opt: Any, opts: dict[str, Any], step: int) -> float | None:
    """Every rank's learning rate times ``lr_spike_factor`` for one step (a global spike
    the next step shows on every rank alike); the old rate, to restore."""
    if opt is None or step != opts.get("lr_spike_step"):
        return None
    old = opt.param_groups[0]["lr"]
    for g in opt.param_groups:
        g["lr"] = old * float(opts.get("lr_spike_factor", 300.0))
    return old


def train(rank: int, world: int, opts: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(0)  # the same initial weights on every rank
    kind = opts.get("model", "tiny")
    model = TinyLM() if kind == "tiny" else _hf_model(kind)
    reference = copy.deepcopy(model) if opts.get("check_grad_norm") else None
    if rank == opts.get("slow_forward_rank"):
        model.delay = opts["slow_forward_s"]
    how = opts.get("wrap", "ddp")
    wrapped = _wrap(model, how, opts)
    engine = wrapped if how == "deepspeed" else None
    opt = None if engine else torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    plan = Plan.model_validate(opts["plan"]) if opts.get("plan") else None
    dist_opts = {"timeout_s": opts.get("timeout_s", 20.0), "checksum": opts.get("checksum", True)}
    if "detail_ranks" in opts:  # 0: the reduced exchange only, as above 64 ranks
        dist_opts["detail_ranks"] = opts["detail_ranks"]
    for name in ("heartbeat_s", "lost_after_s", "hang_after_s"):
        if name in opts:
            dist_opts[name] = opts[name]
    if opts.get("monitor"):
        return _with_monitor(wrapped, opt, plan, opts, dist_opts, rank, world)
    tracker = RankTracker(wrapped, plan=plan, every=opts.get("every", 5), **dist_opts)
    findings: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    norms: list[list[float]] = []
    exchange_s: list[float] = []
    steps = opts.get("steps", 15)
    for step, batch in enumerate(tracker.wrap(_loader(opts, rank, world))):
        if step >= steps:
            break
        if engine is not None:
            loss = _loss(engine, batch)
            engine.backward(loss)
            engine.step()
            norm = None
        else:
            _arm_forward_fault(model, opts, rank, step)
            poison = None
            if rank == opts.get("nan_input_rank") and step == opts.get("nan_step"):
                poison = model.emb.register_forward_hook(lambda m, a, out: out * float("nan"))
            spike = _spike_input(model, opts, rank, step)
            loss = _loss(wrapped, batch)
            if poison is not None:  # a NaN in this rank's input activations, this step only
                poison.remove()
            if spike is not None:
                spike.remove()
            if rank == opts.get("scale_rank") and step == opts.get("scale_step"):
                loss = loss * opts["scale"]  # this rank's batch blows up: a huge, finite loss
            if rank == opts.get("nan_rank") and step == opts.get("nan_step"):
                loss = loss * float("nan")  # an overflow on this rank only
            loss.backward()
            if reference is not None:
                norms.append(_compare_norms(wrapped, reference, batch, world))
            norm = nn.utils.clip_grad_norm_(wrapped.parameters(), 1e6)
            assert opt is not None
            old_lr = _lr_spike(opt, opts, step)
            opt.step()
            if old_lr is not None:
                for g in opt.param_groups:
                    g["lr"] = old_lr
            opt.zero_grad(set_to_none=True)
        if rank == opts.get("desync_rank") and step == opts.get("desync_step"):
            with torch.no_grad():  # a weight changed on one replica only
                next(wrapped.parameters()).add_(1e-3)
        if rank == opts.get("flip_rank") and step == opts.get("flip_step"):
            with torch.no_grad():  # one bit of one element on one replica: a memory fault
                p = dict(model.named_parameters())[opts["flip_param"]]
                p.view(-1).view(torch.int32)[opts.get("flip_index", 0)] ^= 1
        if rank == opts.get("die_rank") and step == opts.get("die_step"):
            sys.stdout.flush()
            os._exit(17)  # a crashed rank: no cleanup, no goodbye
        if rank == opts.get("hang_rank") and step == opts.get("hang_step"):
            time.sleep(opts["hang_s"])
        before = tracker.exchanges
        got = tracker.step(step, loss=loss.detach(), grad_norm=norm)
        if tracker.exchanges > before:
            exchange_s.append(tracker.last_exchange_s)
        findings.extend(f.to_json() for f in got)
        if (
            rank == 0
            and tracker.last_record is not None
            and (not records or records[-1]["step"] != tracker.last_record.step)
        ):
            records.append(tracker.last_record.to_json())
    tracker.close()
    return {
        "rank": rank,
        "findings": findings,
        "records": records,
        "norms": norms,
        "exchange_s": exchange_s,
        "active": tracker.active,
        "layout": {
            "data": tracker.layout.data_groups,
            "param": tracker.layout.param_groups,
            "source": tracker.layout.source,
        },
    }


def _with_monitor(model: Any, opt: Any, plan: Plan | None, opts: dict[str, Any],
                  dist_opts: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """The same loop with the live monitor, which runs the cross-rank checks itself."""
    from sapper.monitor import Monitor
    from sapper.runtime.runlog import read_runlog

    run_log = Path(opts["out"]) / f"run-rank{rank}.jsonl"
    pattern = Path(opts["out"]) / "logs" / "rank{rank}.jsonl"  # every rank writes its own
    # the tests count exchanges at exactly every `every` steps unless they ask for the
    # time floor that quick steps get by default
    dist_opts = {**dist_opts, "min_interval_s": opts.get("min_interval_s", 0.0)}
    mon = Monitor(model, opt, plan=plan, log_every=opts.get("every", 5),
                  run_log=str(pattern) if opts.get("per_rank_log") else run_log,
                  console=False, distributed=dist_opts)
    for step, batch in enumerate(_loader(opts, rank, world)):
        if step >= opts.get("steps", 15):
            break
        _arm_forward_fault(getattr(model, "module", model), opts, rank, step)
        spike = _spike_input(getattr(model, "module", model), opts, rank, step)
        loss = _loss(model, batch)
        if spike is not None:
            spike.remove()
        if rank == opts.get("nan_rank") and step == opts.get("nan_step"):
            loss = loss * float("nan")
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == opts.get("die_rank") and step == opts.get("die_step"):
            sys.stdout.flush()
            os._exit(17)  # a crashed rank, just before the monitor's exchange
        if rank == opts.get("hang_rank") and step == opts.get("hang_step"):
            time.sleep(opts["hang_s"])
        mon.step(loss)
    findings = mon.close()
    records = []
    if run_log.exists():
        records = [r.to_json() for r in read_runlog(run_log).steps]
    return {"rank": rank, "findings": [f.to_json() for f in findings], "records": records,
            "norms": [], "exchange_s": [], "active": mon.dist is not None and
            mon.dist.tracker.active, "layout": {}, "run_log": run_log.exists()}


def _arm_forward_fault(model: Any, opts: dict[str, Any], rank: int, step: int) -> None:
    if rank == opts.get("forward_fault_rank") and step == opts.get("forward_fault_step"):
        model.fault = (opts["forward_fault"], opts.get("hang_s", 0.0))


def _compare_norms(
    model: Any, reference: nn.Module, batch: torch.Tensor, world: int
) -> list[float]:
    """FSDP2's global norm vs one process doing the whole batch on the full model, and
    the naive norm of this rank's shards (wrong under sharding)."""
    sapper_norm = float(global_grad_norm(model))
    local_only = float(
        torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(p.grad.to_local()) for p in model.parameters()])
        )
    )
    with torch.no_grad():  # the reference takes the weights this step ran with
        for ref_p, p in zip(reference.parameters(), model.parameters(), strict=True):
            ref_p.copy_(p.full_tensor())
    gathered = [torch.empty_like(batch) for _ in range(world)]
    dist.all_gather(gathered, batch)
    reference.zero_grad(set_to_none=True)
    loss = sum(_loss(reference, b) for b in gathered) / world  # FSDP averages over ranks
    loss.backward()
    ref = float(
        torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(p.grad) for p in reference.parameters()])
        )
    )
    return [sapper_norm, ref, local_only]


def main() -> None:
    scenario, out_dir, raw = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    opts = json.loads(raw)
    opts["out"] = str(out_dir)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t0 = time.perf_counter()
    result = train(rank, world, opts)
    result["scenario"] = scenario
    result["elapsed_s"] = time.perf_counter() - t0
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    if rank == 0:  # like a job that keeps training: the store (hosted here) stays up
        others = [r for r in range(1, world) if r != opts.get("die_rank")]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(
            (out_dir / f"rank{r}.json").exists() for r in others
        ):
            time.sleep(0.05)
    if not result["active"] and world > 1:
        os._exit(0)  # a peer is gone: skip a teardown that would talk to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
