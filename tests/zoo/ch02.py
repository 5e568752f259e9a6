"""Known-wrong implementations for chapter 02 (see tests/zoo/__init__.py)."""
import math

import torch

from attncourse_ref.attention import scaled_dot_product_attention

from . import collector

SDPA = {"test_sdpa_unmasked", "test_sdpa_masked", "test_self_attention", "test_cross_attention"}
MASK = {"test_sdpa_masked", "test_self_attention", "test_cross_attention"}  # both modules use masks
VARIANTS, _add = collector()


# ---- scaled_dot_product_attention ------------------------------------------------------
@_add("softmax over the query axis", "sdpa", SDPA, "check_attention", "query axis")
def sdpa_wrong_axis(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-2)
    return weights @ v, weights


@_add("weights left in float64 whatever the inputs' dtype", "sdpa", {"test_sdpa_unmasked", "test_sdpa_masked"},
      "check_attention", "keep the inputs' dtype")
def sdpa_float64_weights(q, k, v, mask=None):
    scores = (q @ k.transpose(-2, -1)).double() / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights.to(v.dtype) @ v, weights


@_add("no scaling", "sdpa", SDPA, "check_attention", "did not scale")
def sdpa_no_scaling(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


@_add("scaling by d instead of sqrt(d)", "sdpa", SDPA, "check_attention", "divided the scores by d_k")
def sdpa_scale_by_d(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / q.shape[-1]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


@_add("transposing the first two dimensions of k", "sdpa", SDPA, "check_attention", "last two dimensions")
def sdpa_wrong_transpose(q, k, v, mask=None):
    scores = q @ k.transpose(0, 1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


@_add("a softmax that overflows", "sdpa", {"test_sdpa_unmasked"}, "check_attention", "overflow")
def sdpa_naive_softmax(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    e = scores.exp()
    if mask is not None:
        e = e.masked_fill(~mask, 0.0)
    weights = e / e.sum(-1, keepdim=True)
    return weights @ v, weights


@_add("inverted mask", "sdpa", MASK, "check_attention_mask", "inverted")
def sdpa_inverted_mask(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


@_add("mask applied after the softmax", "sdpa", MASK, "check_attention_mask", "after the softmax")
def sdpa_mask_after_softmax(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v, weights


@_add("masking with 0 instead of -inf", "sdpa", MASK, "check_attention_mask", "with 0 is not enough")
def sdpa_mask_with_zero(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, 0.0)
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


@_add("mask ignored", "sdpa", MASK, "check_attention_mask", "ignores the mask")
def sdpa_ignores_mask(q, k, v, mask=None):
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v, weights


# ---- causal_mask ------------------------------------------------------------------------
@_add("upper-triangular causal mask", "causal_mask", {"test_causal_mask"}, "check_causal_mask", "upper-triangular")
def causal_upper(n, device=None):
    return torch.ones(n, n, dtype=torch.bool, device=device).triu()


@_add("causal mask without the diagonal", "causal_mask", {"test_causal_mask"}, "check_causal_mask", "diagonal")
def causal_no_diagonal(n, device=None):
    return torch.ones(n, n, dtype=torch.bool, device=device).tril(-1)


@_add("causal mask one step into the future", "causal_mask", {"test_causal_mask"}, "check_causal_mask",
      "next one")
def causal_leaks_next(n, device=None):
    return torch.ones(n, n, dtype=torch.bool, device=device).tril(1)


@_add("float causal mask", "causal_mask", {"test_causal_mask"}, "check_causal_mask", "bool tensor")
def causal_float(n, device=None):
    return torch.ones(n, n, device=device).tril()


# ---- SelfAttention.forward -----------------------------------------------------------------
@_add("fused QKV split as K, Q, V", "self_attention", {"test_self_attention"}, "check_self_attention",
      "split the fused projection as (K, Q, V)")
def self_attention_kqv(self, x, mask=None):
    k, q, v = self.qkv(x).split(self.d_head, dim=-1)
    return scaled_dot_product_attention(q, k, v, mask)


@_add("fused QKV split as V, K, Q", "self_attention", {"test_self_attention"}, "check_self_attention",
      "split the fused projection as (V, K, Q)")
def self_attention_vkq(self, x, mask=None):
    v, k, q = self.qkv(x).split(self.d_head, dim=-1)
    return scaled_dot_product_attention(q, k, v, mask)


@_add("V taken from the Q block", "self_attention", {"test_self_attention"},
      "check_self_attention", "SelfAttention")
def self_attention_wrong_dim(self, x, mask=None):
    h = self.qkv(x)
    q, k, v = h[..., : self.d_head], h[..., self.d_head: 2 * self.d_head], h[..., : self.d_head]
    return scaled_dot_product_attention(q, k, v, mask)


@_add("self-attention ignores its mask", "self_attention", {"test_self_attention"}, "check_self_attention",
      "ignores its mask")
def self_attention_no_mask(self, x, mask=None):
    q, k, v = self.qkv(x).split(self.d_head, dim=-1)
    return scaled_dot_product_attention(q, k, v)


@_add("self-attention computed in float64 whatever the module's dtype", "self_attention", {"test_self_attention"},
      "check_self_attention", "returned torch.float64")
def self_attention_float64(self, x, mask=None):
    q, k, v = self.qkv(x).double().split(self.d_head, dim=-1)
    return scaled_dot_product_attention(q, k, v, mask)


# ---- CrossAttention.forward ----------------------------------------------------------------
@_add("kv projection split as V, K", "cross_attention", {"test_cross_attention"}, "check_cross_attention",
      "(V, K)")
def cross_swapped_kv(self, x, context, mask=None):
    q = self.q_proj(x)
    v, k = self.kv_proj(context).split(self.d_head, dim=-1)
    return scaled_dot_product_attention(q, k, v, mask)


@_add("cross-attention ignores its mask", "cross_attention", {"test_cross_attention"}, "check_cross_attention",
      "mask")
def cross_no_mask(self, x, context, mask=None):
    q = self.q_proj(x)
    k, v = self.kv_proj(context).split(self.d_head, dim=-1)
    return scaled_dot_product_attention(q, k, v)


# ---- equivariance_gap ------------------------------------------------------------------------
@_add("output not permuted back", "equivariance_gap", {"test_equivariance_gap"}, "check_equivariance_gap",
      "in both")
def gap_no_output_perm(layer, x, perm):
    return (layer(x[..., perm, :]) - layer(x)).abs().max().item()


@_add("input never permuted", "equivariance_gap", {"test_equivariance_gap"}, "check_equivariance_gap",
      "permute the input")
def gap_compares_with_itself(layer, x, perm):
    return (layer(x)[..., perm, :] - layer(x)[..., perm, :]).abs().max().item()



@_add("calls PyTorch's fused kernel (the exercise re-implements it)", "sdpa", {"test_sdpa_unmasked", "test_sdpa_masked"},
      "check_attention", "may not call torch.nn.functional.scaled_dot_product_attention")
def sdpa_builtin(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out, torch.softmax(scores, dim=-1)
