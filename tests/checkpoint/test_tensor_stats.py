"""The chunked statistics against a direct computation in float64, on tensors with every
kind of special value, in every floating dtype and any chunking."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz import stable_settings

from sapper.checkpoint.naming import parse_name
from sapper.checkpoint.stats import flat_chunks, stats_of

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
SPECIAL = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-40, 1e-6, 65504.0, 1e30, -3.0]


@given(
    dtype=st.sampled_from(DTYPES),
    values=st.lists(
        st.one_of(st.sampled_from(SPECIAL), st.floats(-1e4, 1e4)), min_size=1, max_size=300
    ),
    chunk=st.integers(1, 64),
)
@stable_settings(300)
def test_chunked_stats_match_direct(dtype, values, chunk) -> None:
    t = torch.tensor(values, dtype=torch.float64).to(dtype)
    s = stats_of("t", flat_chunks(t, chunk), str(dtype), tuple(t.shape))
    ref = t.double()
    finite = torch.isfinite(ref)
    assert s.nan == int(torch.isnan(ref).sum())
    assert s.posinf == int((ref == math.inf).sum()) and s.neginf == int((ref == -math.inf).sum())
    bad = (~finite).nonzero()
    assert s.first_nonfinite == (int(bad[0, 0]) if len(bad) else None)
    assert s.zeros == int((ref == 0).sum())
    f = ref[finite]
    assert s.abs_max == pytest.approx(float(f.abs().max()) if f.numel() else 0.0)
    assert s.sum_sq == pytest.approx(float((f * f).sum()), rel=1e-5)
    info = torch.finfo(dtype)
    mag = t.abs()
    assert s.subnormal == int(((mag > 0) & (mag < info.tiny) & torch.isfinite(t)).sum())
    all_equal = bool(finite.all()) and bool((ref == ref[0]).all())
    assert s.constant == (t.numel() > 1 and all_equal)
    if dtype in (torch.float16, torch.bfloat16):
        assert s.saturated == int((torch.isfinite(t) & (mag >= info.max)).sum())


@pytest.mark.parametrize(
    ("key", "layer", "role"),
    [
        ("model.layers.17.mlp.down_proj.weight", 17, "mlp.down_proj.weight"),
        ("transformer.h.3.attn.c_attn.weight", 3, "attn.c_attn.weight"),
        (
            "decoder.layers.5.self_attention.linear_qkv.weight",
            5,
            "self_attention.linear_qkv.weight",
        ),
        ("_orig_mod.model.layers.2.self_attn.q_proj.weight", 2, "self_attn.q_proj.weight"),
        (
            "module._fsdp_wrapped_module.model.layers.0._fsdp_wrapped_module.mlp.up_proj.weight",
            0,
            "mlp.up_proj.weight",
        ),
        ("model.embed_tokens.weight", None, "model.embed_tokens.weight"),
    ],
)
def test_layer_names_across_schemes(key: str, layer: int | None, role: str) -> None:
    name = parse_name(key)
    assert (name.layer, name.role) == (layer, role)
