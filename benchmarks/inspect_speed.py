"""``sapper inspect`` against the naive route on a ~1 GB checkpoint: time and peak memory.

The naive route is what people do in a notebook: ``safetensors.torch.load_file`` (or
``torch.load``) of the whole file, then a loop of ``torch.isnan(t).any()`` over the
tensors. The inspect route is :func:`sapper.checkpoint.inspect_paths`, which computes far
more per tensor (NaN/Inf counts, first index, zeros, abs-max, RMS, saturation, subnormals,
peer outliers). Each route runs in fresh subprocesses that import only what they need (best
and median of ``--repeat`` runs) and report wall time and peak RSS (``ru_maxrss``), with
the RSS after the imports so the reading can be told from torch's own footprint.
``cat FILE > /dev/null`` in the same run gives the disk (or page cache) speed. The files
are generated here: a Llama-like fp32 state dict, the embedding the largest tensor, as
safetensors and as a torch file; and the same model as a DeepSpeed ZeRO 2 bf16 save of two
data ranks (``global_step3/``: the 16-bit module in the model states, each rank's fp32
master partition and Adam moments, ``param_slice_mappings``), laid out with the keys
DeepSpeed 0.19 writes (plain dicts where DeepSpeed pickles its own small classes). Its
naive route loads every file of the folder and loops ``isnan`` over every tensor in them
(masters and moments are what a DeepSpeed post-mortem must read; DeepSpeed's
``zero_to_fp32`` only rebuilds the masters). The page cache is warmed once by the first
``cat``; every route then reads from it, as a re-inspected checkpoint would. Run::

    python benchmarks/inspect_speed.py [--gb 1.0] [--keep DIR] [--repeat 5]

Target: peak RSS <= max(2 x the largest tensor, 300 MB) above the import baseline, at least
as fast as the naive route.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_GENERATE = r"""
import sys, torch
from safetensors.torch import save_file
layers, hidden, vocab, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
g = torch.Generator().manual_seed(0)
sd = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g) * 0.02}
for i in range(layers):
    for name in ("self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj"):
        sd[f"model.layers.{i}.{name}.weight"] = torch.randn(hidden, hidden, generator=g) * 0.02
    sd[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(hidden)
sd["model.layers.3.mlp.down_proj.weight"][5, 7] = float("nan")
save_file(sd, out + ".safetensors")
torch.save(sd, out + ".pt")
print(max(t.numel() * t.element_size() for t in sd.values()))
"""

_GENERATE_DEEPSPEED = r"""
import collections, os, sys, torch
src, out = sys.argv[1], sys.argv[2]
sd = torch.load(src, weights_only=True, mmap=True)
world, tag = 2, os.path.join(out, "global_step3")
os.makedirs(tag, exist_ok=True)
with open(os.path.join(out, "latest"), "w") as f:
    f.write("global_step3")
shapes = collections.OrderedDict((k, t.shape) for k, t in sd.items())
total = sum(t.numel() for t in sd.values())
padded = -(-total // (2 * world)) * 2 * world
flat = torch.zeros(padded)
at = 0
for t in sd.values():
    flat[at : at + t.numel()] = t.reshape(-1)
    at += t.numel()
torch.save({"module": {k: t.bfloat16() for k, t in sd.items()}, "param_shapes": [shapes],
            "buffer_names": [], "shared_params": {}, "global_steps": 3, "skipped_steps": 0,
            "dp_world_size": world, "ds_version": "0.19.8",
            "lr_scheduler": {"last_batch_iteration": 2}},
           os.path.join(tag, "mp_rank_00_model_states.pt"))
part = padded // world
g = torch.Generator().manual_seed(1)
for rank in range(world):
    lo, hi = rank * part, (rank + 1) * part
    master = flat[lo:hi].clone()
    exp_avg = torch.randn(part, generator=g) * 1e-4
    exp_avg_sq = torch.rand(part, generator=g) * 1e-8 + exp_avg * exp_avg
    mapping, at = collections.OrderedDict(), 0
    for k, t in sd.items():
        start, end = max(at, lo), min(at + t.numel(), hi)
        if start < end:
            mapping[k] = {"numel": end - start, "start": start - lo}
        at += t.numel()
    moments = {"step": torch.tensor(3.0), "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    inner = {"state": {0: moments},
             "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.95), "eps": 1e-8, "params": [0]}]}
    torch.save({"optimizer_state_dict": {"zero_stage": 2, "partition_count": world,
                                         "single_partition_of_fp32_groups": [master],
                                         "base_optimizer_state": inner,
                                         "param_slice_mappings": [mapping]}},
               os.path.join(tag, f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"))
"""

_ROUTE = r"""
import json, resource, sys, time
route, path = sys.argv[1], sys.argv[2]
def rss(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if route == "inspect":
    from sapper.checkpoint.inspect import inspect_paths
elif route == "naive-safetensors":
    import torch
    from safetensors.torch import load_file
else:
    import os, torch
def tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors(v)
base = rss()
start = time.perf_counter()
if route == "inspect":
    found = sum(1 for f in inspect_paths([path]).findings if f.code == "K001")
elif route == "naive-deepspeed":
    tag = os.path.join(path, "global_step3")
    objs = [torch.load(os.path.join(tag, f), weights_only=True) for f in sorted(os.listdir(tag))]
    found = sum(1 for t in tensors(objs) if t.is_floating_point() and bool(torch.isnan(t).any()))
else:
    sd = load_file(path) if route == "naive-safetensors" else torch.load(path, weights_only=True)
    found = sum(1 for t in sd.values() if t.is_floating_point() and bool(torch.isnan(t).any()))
took = time.perf_counter() - start
print(json.dumps({"seconds": took, "peak": rss(), "base": base, "nan_tensors": found}))
"""


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def _cat(path: Path) -> float:
    start = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        subprocess.run(["cat", *map(str, _files(path))], stdout=sink, check=True)
    return time.perf_counter() - start


def _route(route: str, path: Path, repeat: int) -> dict:
    """The run with the shortest time of ``repeat`` fresh subprocesses (a shared machine's
    noise only ever adds time), with the median time beside it; the peak RSS is the
    largest of the runs."""
    runs = [_route_once(route, path) for _ in range(repeat)]
    best = min(runs, key=lambda r: r["seconds"])
    times = sorted(r["seconds"] for r in runs)
    return {
        **best,
        "median": times[len(times) // 2],
        "peak": max(r["peak"] for r in runs),
        "base": min(r["base"] for r in runs),
    }


def _route_once(route: str, path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent / "src"))
    proc = subprocess.run(
        [sys.executable, "-c", _ROUTE, route, str(path)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _print(rows: list, layers: int, largest: int) -> None:
    mb = 2**20
    size = rows[0][1]
    print(
        f"file {size / 1e9:.2f} GB, {layers} layers, largest tensor {largest / mb:.0f} MB;"
        f" target peak above imports <= {max(2 * largest, 300 * mb) / mb:.0f} MB"
    )
    print(
        f"{'route':34} {'best s':>7} {'median s':>8} {'GB/s':>6} {'peak RSS MB':>12} "
        f"{'above imports':>14} {'NaN tensors':>12}"
    )
    for name, nbytes, best, median, r in rows:
        peak = f"{r['peak'] / mb:.0f}" if r else "-"
        above = f"{(r['peak'] - r['base']) / mb:.0f}" if r else "-"
        nan = r["nan_tensors"] if r else "-"
        print(
            f"{name:34} {best:7.2f} {median:8.2f} {nbytes / best / 1e9:6.2f} {peak:>12} "
            f"{above:>14} {nan:>12}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=1.0, help="checkpoint size, about")
    parser.add_argument("--keep", type=Path, help="write the files here and keep them")
    parser.add_argument("--repeat", type=int, default=5, help="runs per route, best kept")
    args = parser.parse_args()
    hidden, vocab = 2048, 16384
    per_layer = 4 * hidden * hidden * 4
    layers = max(4, round((args.gb * 2**30 - vocab * hidden * 4) / per_layer))
    folder = args.keep or Path(tempfile.mkdtemp(prefix="sapper-inspect-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / "bench"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _GENERATE, str(layers), str(hidden), str(vocab), str(stem)],
            capture_output=True,
            text=True,
            check=True,
        )
        largest = int(proc.stdout.strip())
        deepspeed = folder / "deepspeed"
        subprocess.run(
            [sys.executable, "-c", _GENERATE_DEEPSPEED, str(stem) + ".pt", str(deepspeed)],
            check=True,
        )
        rows = []
        for path, routes in (
            (stem.with_suffix(".safetensors"), ("inspect", "naive-safetensors")),
            (stem.with_suffix(".pt"), ("inspect", "naive-torch")),
            (deepspeed, ("inspect", "naive-deepspeed")),
        ):
            size = sum(p.stat().st_size for p in _files(path))
            _cat(path)  # warm the page cache once, for every route alike
            cats = sorted(_cat(path) for _ in range(args.repeat))
            rows.append((f"cat {path.name}", size, cats[0], cats[len(cats) // 2], None))
            for route in routes:
                r = _route(route, path, args.repeat)
                rows.append((f"{route} {path.name}", size, r["seconds"], r["median"], r))
        _print(rows, layers, largest)
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
