"""The machine a run starts on: the environment that decides its numerics and its
communication (python, torch, CUDA and NCCL versions, the GPUs, ``NCCL_*``/``TORCH_*``/
``CUDA_*`` variables), and the GPU model in sapper's table for the checklist.

torch is asked in a short child process, never in sapper's own: initialising CUDA in the
supervisor would hold a context (hundreds of MB) on GPU 0 for the whole run. A machine
without torch or without GPUs is recorded as such; the GPU is then unknown.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from typing import Any

__all__ = ["environment", "match_gpu", "probe"]

_PROBE = r"""
import json
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["hip"] = getattr(torch.version, "hip", None)
    out["cuda_available"] = torch.cuda.is_available()
    try:
        v = torch.cuda.nccl.version() if out["cuda_available"] else None
        out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else v
    except Exception:
        out["nccl"] = None
    gpus = []
    if out["cuda_available"]:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1)})
    out["gpus"] = gpus
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""

#: Prefixes of the variables that decide numerics and communication.
_VAR_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "PYTORCH_", "NVIDIA_", "HIP_", "ROCM_",
                 "OMP_", "MASTER_", "WORLD_SIZE", "NPROC_PER_NODE", "NNODES")
#: Variables whose value is a secret by their name: recorded as set, never with the value.
_SECRET = re.compile(r"(TOKEN|SECRET|PASSWORD|KEY|CREDENTIAL)", re.I)


def probe(timeout_s: float = 60.0) -> dict[str, Any]:
    """torch's versions and the GPUs, from a child interpreter (sapper's own python).
    ``{"error": ...}`` when it cannot tell; never raises."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True,
            timeout=timeout_s, env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"could not ask torch ({type(exc).__name__})"}
    line = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
    try:
        info = json.loads(line[0]) if line else None
    except ValueError:
        info = None
    if not isinstance(info, dict):
        return {"error": f"could not ask torch (exit {done.returncode})"}
    return info


def match_gpu(name: str, memory_gib: float | None = None) -> str | None:
    """The table's name for a device torch names (``NVIDIA H100 80GB HBM3`` -> ``H100``,
    ``NVIDIA A100-SXM4-40GB`` -> ``A100-40GB``), or None when none fits: the entries
    whose model number is a word of the device's name, the closest in memory first."""
    from sapper.plan.hardware import GPUS, find_gpu

    direct = find_gpu(name)
    if direct is not None:
        return direct.name
    words = set(re.split(r"[^A-Z0-9]+", name.upper()))
    norm = re.sub(r"[^A-Z0-9]", "", name.upper())
    fits = []
    for gpu in GPUS:
        base = re.split(r"[^A-Z0-9]", gpu.name.upper())[0]
        if base not in words and not (base.startswith("RTX") and base[3:] in words):
            continue
        variant = gpu.name.upper().partition("-")[2]
        if variant and not variant.endswith("GB") and variant.replace("-", "") not in norm:
            continue  # H100-PCIe, H100-NVL: only when the device says so
        if not variant or variant.endswith("GB"):
            other_variant = any(
                g.name.upper().startswith(base + "-") and not g.name.upper().endswith("GB")
                and g.name.upper().partition("-")[2] in norm for g in GPUS
            )
            if other_variant:
                continue
        gap = abs(gpu.memory_gib - memory_gib) if memory_gib else 0.0
        fits.append((gap, gpu.name))
    if not fits:
        return None
    fits.sort()
    if memory_gib and fits[0][0] > 0.25 * memory_gib:
        return None
    return fits[0][1]


def environment(info: dict[str, Any]) -> dict[str, Any]:
    """``env.json``: versions, GPUs and the variables of the numerics and communication
    (a variable whose name says it is a secret is recorded as ``"(set)"``)."""
    variables = {
        k: ("(set)" if _SECRET.search(k) else v)
        for k, v in sorted(os.environ.items())
        if k.startswith(_VAR_PREFIXES)
    }
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "host": platform.node(),
        "torch": info.get("torch"),
        "cuda": info.get("cuda"),
        "hip": info.get("hip"),
        "nccl": info.get("nccl"),
        "gpus": info.get("gpus", []),
        "probe_error": info.get("error"),
        "variables": variables,
    }
