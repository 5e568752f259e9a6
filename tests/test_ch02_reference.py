"""The chapter 02 reference against PyTorch's own implementations, and its properties."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from attncourse_ref import attention as ref

dims = st.integers(1, 6)


@given(lead=st.lists(st.integers(1, 3), max_size=2), nq=dims, nk=dims, dk=dims, dv=dims,
       dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2**16), masked=st.booleans())
def test_sdpa_matches_torch(lead, nq, nk, dk, dv, dtype, seed, masked):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, nq, dk, generator=g, dtype=dtype)
    k = torch.randn(*lead, nk, dk, generator=g, dtype=dtype)
    v = torch.randn(*lead, nk, dv, generator=g, dtype=dtype)
    mask = None
    if masked:
        mask = torch.rand(nq, nk, generator=g) < 0.6
        mask[:, 0] = True
    out, w = ref.scaled_dot_product_attention(q, k, v, mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(out, expected, rtol=tol, atol=tol)
    assert out.dtype == w.dtype == dtype
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    if mask is not None:
        assert (w[..., ~mask] == 0).all()


def test_sdpa_gradients_match_torch():
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    grads = torch.autograd.grad(ref.scaled_dot_product_attention(q, k, v)[0].sum(), (q, k, v))
    expected = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v).sum(), (q, k, v))
    for a, b in zip(grads, expected):
        torch.testing.assert_close(a, b)


def test_sdpa_large_scores_stay_finite():
    q = torch.randn(4, 8) * 1e3
    out, w = ref.scaled_dot_product_attention(q, q, q)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()


@pytest.mark.parametrize("n", [1, 2, 7])
def test_causal_mask_matches_is_causal(n):
    m = ref.causal_mask(n)
    assert m.dtype == torch.bool and m.shape == (n, n)
    assert torch.equal(m, torch.ones(n, n, dtype=torch.bool).tril())
    q, k, v = torch.randn(3, n, 4), torch.randn(3, n, 4), torch.randn(3, n, 4)
    torch.testing.assert_close(ref.scaled_dot_product_attention(q, k, v, m)[0],
                               F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_self_attention_is_single_head_multihead_without_output_projection():
    torch.manual_seed(0)
    d = 6
    sa = ref.SelfAttention(d)
    mha = torch.nn.MultiheadAttention(d, 1, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(sa.qkv.weight)
        mha.in_proj_bias.copy_(sa.qkv.bias)
        mha.out_proj.weight.copy_(torch.eye(d))
        mha.out_proj.bias.zero_()
    x = torch.randn(2, 5, d)
    y, w = sa(x)
    y2, w2 = mha(x, x, x)
    torch.testing.assert_close(y, y2, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(w, w2, atol=1e-6, rtol=1e-5)


def test_self_attention_parameter_layout():
    sa = ref.SelfAttention(8, 3)
    assert {k: tuple(v.shape) for k, v in sa.state_dict().items()} == {"qkv.weight": (9, 8), "qkv.bias": (9,)}
    assert ref.SelfAttention(8, 3, bias=False).qkv.bias is None


def test_cross_attention_matches_manual_projections():
    torch.manual_seed(1)
    ca = ref.CrossAttention(3, 5, 4)
    x, ctx = torch.randn(2, 7, 3), torch.randn(2, 9, 5)
    k, v = (ctx @ ca.kv_proj.weight.T + ca.kv_proj.bias).split(4, -1)
    expected = F.scaled_dot_product_attention(ca.q_proj(x), k, v)
    torch.testing.assert_close(ca(x, ctx)[0], expected)
    assert ca(x, ctx)[1].shape == (2, 7, 9)


def test_equivariance_gap():
    torch.manual_seed(2)
    sa = ref.SelfAttention(4).double()
    x, perm = torch.randn(6, 4, dtype=torch.float64), torch.randperm(6)
    assert ref.equivariance_gap(lambda t: sa(t)[0], x, perm) < 1e-12
    assert ref.equivariance_gap(lambda t: sa(t, ref.causal_mask(6))[0], x, perm) > 1e-3
    assert ref.equivariance_gap(lambda t: t.cumsum(-2), x, torch.arange(6)) == 0


def test_scaling_keeps_score_variance_near_one():
    torch.manual_seed(3)
    for d in (16, 256):
        q, k = torch.randn(2000, d), torch.randn(2000, d)
        s = (q * k).sum(-1) / math.sqrt(d)
        assert 0.85 < s.var().item() < 1.15
