"""A safetensors file's statistics reduced by numpy (no torch) against the same file's
tensors reduced by torch: every count, extreme and flag equal, the sum of squares equal
to float32 rounding, for every dtype safetensors stores, with NaNs, infinities, zeros,
subnormals, saturated and constant values, in one chunk and in many."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from sapper.checkpoint import safefile
from sapper.checkpoint.arrays import widen
from sapper.checkpoint.source import SafetensorsSource, TorchSource
from sapper.checkpoint.stats import flat_chunks

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
#: torch cannot reduce these (no count_nonzero): numpy's figures are checked on their own.
FLOAT8 = [d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None))
          if d is not None]  # fmt: skip
INTS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]


def _tensors(dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    """Tensors of ``dtype`` that take each path of the reduction."""
    g = torch.Generator().manual_seed(seed)
    if not dtype.is_floating_point:
        if dtype == torch.bool:
            return {"mask": torch.rand(300, generator=g) > 0.5, "none": torch.zeros(7, dtype=dtype)}
        info = torch.iinfo(dtype)
        lo, hi = max(info.min, -1000), min(info.max, 1000)
        return {
            "ids": torch.randint(lo, hi, (40, 30), generator=g).to(dtype),
            "zeros": torch.zeros(9, dtype=dtype),
            "extreme": torch.tensor([info.min, info.max, 0], dtype=dtype),
        }
    finfo = torch.finfo(dtype)
    wide = torch.randn(50, 40, generator=g) * 0.02
    out = {
        "normal": wide.to(dtype),
        "constant": torch.full((33,), 0.5).to(dtype),
        "signs": torch.tensor([0.5, -0.5, 0.5] * 5).to(dtype),
        "zeros": torch.zeros(17).to(dtype),
        "tiny": torch.tensor([0.0, finfo.tiny, finfo.tiny / 4, -finfo.tiny / 2, 1.0]).to(dtype),
        "saturated": torch.tensor([finfo.max, -finfo.max, 1.0, 0.0]).to(dtype),
        "empty": torch.zeros(0, 3).to(dtype),
    }
    if dtype != getattr(torch, "float8_e4m3fn", None):  # no infinity in e4m3fn
        out["nonfinite"] = torch.tensor([1.0, math.nan, math.inf, -math.inf, 0.0, 2.0]).to(dtype)
    else:
        out["nonfinite"] = torch.tensor([1.0, math.nan, 0.0, 2.0, math.nan]).to(dtype)
    if dtype in (torch.float32, torch.float16, torch.bfloat16):  # squares past float32
        out["huge"] = torch.tensor([3e38, 1.0, -2e38]).to(torch.float32).to(dtype)
    return out


def _fields(s: object) -> dict[str, object]:
    d = dict(vars(s))
    d.pop("sum_sq")
    return {k: ("nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


@pytest.mark.parametrize("chunk", [None, 7])
@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
def test_numpy_statistics_match_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, chunk: int | None
) -> None:
    tensors = _tensors(dtype, seed=len(str(dtype)))
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    if chunk is not None:  # many pieces per tensor: state carried across them
        monkeypatch.setattr(safefile, "CHUNK_ELEMENTS", chunk)
    source = SafetensorsSource([path])
    reference = TorchSource({k: t.contiguous() for k, t in tensors.items()}, str(path))
    try:
        for key in tensors:
            got = source.stats(key)
            want = reference.stats(key) if chunk is None else _torch_stats(reference, key, chunk)
            assert _fields(got) == _fields(want), key
            assert got.sum_sq == pytest.approx(want.sum_sq, rel=1e-5, abs=1e-30), key
    finally:
        source.close()


def _torch_stats(source: TorchSource, key: str, size: int):
    """torch's statistics fed pieces of ``size`` elements, as numpy's were."""
    from sapper.checkpoint.stats import stats_of

    info = source.info(key)
    return stats_of(
        key, flat_chunks(source._tensors[key], size), info.dtype, info.shape, info.file
    )


@pytest.mark.parametrize("dtype", FLOATS + FLOAT8, ids=str)
def test_widened_bits_are_the_values(tmp_path: Path, dtype: torch.dtype) -> None:
    """Every bit pattern of the 8- and 16-bit floats read as torch reads it."""
    bits = 256 if dtype.itemsize == 1 else 65536
    view = torch.uint8 if bits == 256 else torch.int16
    raw = torch.arange(bits, dtype=torch.int64).to(view if bits == 256 else torch.int32)
    values = (raw if bits == 256 else raw.to(torch.int16)).view(dtype)
    path = tmp_path / "all.safetensors"
    save_file({"all": values}, str(path))
    source = SafetensorsSource([path])
    try:
        stored = source.stored_dtype("all")
        with np.errstate(invalid="ignore"):
            pieces = [widen(c, stored).astype(np.float64) for c in source.arrays("all")]
        got = np.concatenate(pieces)
    finally:
        source.close()
    want = values.to(torch.float64).numpy()
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    assert same.all()


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_statistics(tmp_path: Path, dtype: torch.dtype) -> None:
    """Counted from the values widened to float32 (which torch can reduce)."""
    tensors = {k: t for k, t in _tensors(dtype, seed=3).items() if t.numel()}
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    source = SafetensorsSource([path])
    finfo = torch.finfo(dtype)
    try:
        for key, t in tensors.items():
            got = source.stats(key)
            x = t.to(torch.float32).reshape(-1)
            finite = torch.isfinite(x)
            mag = torch.where(finite, x, torch.zeros(())).abs()
            assert got.numel == x.numel()
            assert got.nan == int(torch.isnan(x).sum()), key
            assert got.posinf == int((x == math.inf).sum()), key
            assert got.neginf == int((x == -math.inf).sum()), key
            assert got.zeros == int((x == 0).sum()), key
            assert got.abs_max == float(mag.max()), key
            assert got.saturated == int((mag >= finfo.max).sum()), key
            assert got.subnormal == int(((mag > 0) & (mag < finfo.tiny)).sum()), key
            assert got.sum_sq == pytest.approx(float((mag.double() ** 2).sum()), rel=1e-5)
            assert got.finite_min == float(x[finite].min()), key
            assert got.finite_max == float(x[finite].max()), key
    finally:
        source.close()


def test_tied_weights_compared_with_numpy(tmp_path: Path) -> None:
    """K010 on a safetensors model: the largest difference of a head and an embedding
    that should be tied, as torch finds it."""
    from sapper.checkpoint.checks import tied_findings

    g = torch.Generator().manual_seed(1)
    embed = torch.randn(100, 24, generator=g).to(torch.bfloat16)
    head = embed.clone()
    head[37, 5] += 0.5
    path = tmp_path / "model.safetensors"
    save_file({"lm_head.weight": head, "model.embed_tokens.weight": embed}, str(path))
    source = SafetensorsSource([path])
    try:
        found = tied_findings(source, {"tie_word_embeddings": True})
    finally:
        source.close()
    worst = float((head.double() - embed.double()).abs().max())
    assert [f.code for f in found] == ["K010"]
    assert f"max |difference| {worst:.3g}" in found[0].message
