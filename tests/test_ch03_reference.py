"""Unit tests of the chapter 03 reference (multi-head attention and its cost)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attncourse.memory import peak_memory
from attncourse_ref import multihead as ref


def test_split_merge_roundtrip_and_layout():
    x = torch.randn(2, 5, 12)
    heads = ref.split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    torch.testing.assert_close(heads[:, 1], x[..., 4:8])
    torch.testing.assert_close(ref.merge_heads(heads), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cross", [False, True])
def test_mha_matches_torch(dtype, cross):
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(12, 3, batch_first=True, dtype=dtype)
    with torch.no_grad():
        theirs.in_proj_bias.normal_()
        theirs.out_proj.bias.normal_()
    ours = ref.load_from_torch(ref.MultiHeadAttention(12, 3).to(dtype), theirs)
    x = torch.randn(2, 5, 12, dtype=dtype)
    ctx = torch.randn(2, 7, 12, dtype=dtype) if cross else x
    key_mask = torch.rand(2, ctx.shape[1]) < 0.7
    key_mask[:, 0] = True
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-12, rtol=1e-10)
    with torch.no_grad():
        y, w = ours(x, ctx, ctx, key_mask=key_mask)
        ty, tw = theirs(x, ctx, ctx, key_padding_mask=~key_mask, average_attn_weights=False)
        torch.testing.assert_close(y, ty, **tol)
        torch.testing.assert_close(w, tw, **tol)
        if not cross:
            y, _ = ours(x, x, x, causal=True)
            ty, _ = theirs(x, x, x, attn_mask=torch.ones(5, 5, dtype=torch.bool).triu(1))
            torch.testing.assert_close(y, ty, **tol)


def test_cost_formulas():
    n, d, h = 1000, 512, 8
    assert ref.attention_flops(n, d, h) == (6 * n * d * d, 2 * n * n * d, 2 * n * n * d, 2 * n * d * d)
    assert ref.attention_memory(100_000, 8192, 64)[1] == 64 * 100_000 ** 2 * 4   # 2.56 TB


def test_memory_matches_measurement():
    n, d, h = 256, 64, 4
    q, k = torch.randn(h, n, d // h), torch.randn(h, n, d // h)
    _, measured = peak_memory(lambda: q @ k.transpose(-2, -1))
    assert measured == ref.attention_memory(n, d, h)[1]


@given(nq=st.integers(1, 20), nk=st.integers(1, 20), block=st.integers(1, 25), causal=st.booleans(),
       seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([0.5, 1.0, 5.0, 30.0]))
@settings(max_examples=60, deadline=None)
def test_tiled_matches_full(nq, nk, block, causal, seed, scale):
    if causal:
        nk = nq
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, nq, 4, generator=g, dtype=torch.float64) * scale
    k = torch.randn(2, nk, 4, generator=g, dtype=torch.float64) * scale
    v = torch.randn(2, nk, 3, generator=g, dtype=torch.float64)
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(ref.tiled_attention(q, k, v, block, causal), full, atol=1e-10, rtol=1e-9)


def test_tiled_memory_is_linear():
    def peak(n):
        q = torch.randn(1, n, 64)
        return peak_memory(ref.tiled_attention, q, q, q, 64)[1]
    small, large = peak(512), peak(2048)
    assert large < 5 * small                       # 4x the tokens: about 4x the memory, not 16x


def test_sliding_window_mask():
    m = ref.sliding_window_mask(7, 2)
    assert m.dtype == torch.bool and m.sum() == 7 * 5 - 2 * (2 + 1)
    assert m[3, 1] and m[3, 5] and not m[3, 0] and not m[3, 6]
