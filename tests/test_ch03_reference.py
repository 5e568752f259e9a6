"""Unit tests of the chapter 03 reference (multi-head attention and its cost)."""

import math

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


def test_measuring_imports_no_compiler():
    """peak_memory and matrix_products use PyTorch's profiler without torch.profiler's wrapper, whose start imports
    torch._inductor: 1.5 s in every grading kernel whose checks measure (chapters 03 and 09)."""
    import subprocess
    import sys
    code = ("import sys, torch\nfrom attncourse.memory import peak_memory\nfrom attncourse.flops import matrix_products\n"
            "x = torch.randn(8, 8)\nassert peak_memory(torch.matmul, x, x)[1] == 256\n"
            "assert [p[0] for p in matrix_products(torch.matmul, x, x)] == ['aten::mm']\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torch._inductor', 'torch._dynamo', 'sympy'))))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout


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


# ---- linear attention and the delta rule --------------------------------------------------------------------------
def _features(seed, shape_qk, d_v):
    g = torch.Generator().manual_seed(seed)
    q, k = (ref.elu_feature_map(torch.randn(*shape_qk, generator=g, dtype=torch.float64)) for _ in range(2))
    return q, k, torch.randn(*shape_qk[:-1], d_v, generator=g, dtype=torch.float64)


def test_linear_attention_is_attention_with_a_dot_product_similarity():
    """Written out: o_t = sum_{s<=t} sim(q_t, k_s) v_s / sum_{s<=t} sim(q_t, k_s), sim the features' dot product."""
    q, k, v = _features(0, (2, 7, 4), 3)
    expected = torch.zeros(2, 7, 3, dtype=torch.float64)
    for b in range(2):
        for t in range(7):
            sims = torch.stack([q[b, t] @ k[b, s] for s in range(t + 1)])
            expected[b, t] = (sims[:, None] * v[b, :t + 1]).sum(0) / sims.sum()
    torch.testing.assert_close(ref.linear_attention(q, k, v), expected)
    assert (ref.elu_feature_map(torch.tensor([-15.0, 0.0, 2.0])) > 0).all()


@settings(max_examples=15, deadline=None)
@given(T=st.integers(1, 20), chunk=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_linear_attention_parallel_recurrent_and_chunked_agree(T, chunk, seed):
    q, k, v = _features(seed, (2, 3, T, 5), 4)
    parallel = ref.linear_attention(q, k, v)
    torch.testing.assert_close(ref.linear_attention_recurrent(q, k, v), parallel)
    torch.testing.assert_close(ref.linear_attention_chunked(q, k, v, chunk), parallel)


def _delta_rule_by_the_paper(q, k, v, beta, g, scale):
    """Gated DeltaNet's equation: S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T (S of shape [d_k, d_v]),
    o_t = S_t^T q_t scale; one sequence at a time, with the identity matrix written out."""
    B, T, d_k = k.shape
    out = torch.zeros(B, T, v.shape[-1], dtype=v.dtype)
    for b in range(B):
        S = torch.zeros(d_k, v.shape[-1], dtype=v.dtype)
        for t in range(T):
            a = 1.0 if g is None else math.exp(g[b, t])
            S = a * (torch.eye(d_k, dtype=v.dtype) - beta[b, t] * torch.outer(k[b, t], k[b, t])) @ S \
                + beta[b, t] * torch.outer(k[b, t], v[b, t])
            out[b, t] = S.T @ q[b, t] * scale
    return out, S


@pytest.mark.parametrize("gated", [False, True])
def test_delta_rule_is_the_papers_recurrence(gated):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 9, d, generator=gen, dtype=torch.float64) for d in (4, 4, 3))
    k = torch.nn.functional.normalize(k, dim=-1)
    beta = torch.rand(2, 9, generator=gen, dtype=torch.float64)
    g = -torch.rand(2, 9, generator=gen, dtype=torch.float64) if gated else None
    o, state = ref.delta_rule(q, k, v, beta, g)
    expected, last = _delta_rule_by_the_paper(q, k, v, beta, g, 4 ** -0.5)
    torch.testing.assert_close(o, expected)
    torch.testing.assert_close(state[1], last)
    if gated:                                  # a decay of 1 is no decay
        no_decay = ref.delta_rule(q, k, v, beta, torch.zeros_like(g))[0]
        torch.testing.assert_close(no_decay, ref.delta_rule(q, k, v, beta)[0])


def test_the_delta_rule_overwrites_where_linear_attention_adds():
    """Two values written under the same key, then the key read back: with beta = 1 the delta rule returns the
    second value; the sum k v^T of linear attention returns their sum; beta = 0 writes nothing; a log-decay of
    -inf forgets everything before the token."""
    k = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)[None]
    v = torch.tensor([[1.0, 2.0], [5.0, -1.0], [3.0, 3.0]], dtype=torch.float64)[None]
    q = k.clone()
    o, state = ref.delta_rule(q, k, v, torch.ones(1, 3, dtype=torch.float64), scale=1.0)
    torch.testing.assert_close(state[0].T @ k[0, 0], v[0, 1])           # the second write replaced the first
    torch.testing.assert_close(state[0].T @ k[0, 2], v[0, 2])           # another key's value is untouched
    additive = sum(torch.outer(k[0, t], v[0, t]) for t in range(3))
    torch.testing.assert_close(additive.T @ k[0, 0], v[0, 0] + v[0, 1])
    assert not ref.delta_rule(q, k, v, torch.zeros(1, 3, dtype=torch.float64))[1].any()
    forget = torch.tensor([[0.0, float("-inf"), float("-inf")]], dtype=torch.float64)
    _, state = ref.delta_rule(q, k, v, torch.ones(1, 3, dtype=torch.float64), forget, scale=1.0)
    torch.testing.assert_close(state[0], torch.outer(k[0, 2], v[0, 2]))


def test_the_recurrent_states_size_does_not_grow_with_the_length():
    for T in (4, 64):
        q, k, v = _features(T, (1, T, 8), 6)
        assert ref.delta_rule(q, k, v, torch.full((1, T), 0.5, dtype=torch.float64))[1].shape == (1, 8, 6)
