"""Known-wrong implementations for chapter 03 (see tests/zoo/__init__.py)."""
import math

import torch

from attncourse_ref.attention import causal_mask, scaled_dot_product_attention
from attncourse_ref.multihead import merge_heads, split_heads

from . import collector

MHA = {"test_mha", "test_mha_masks"}
TILED = {"test_tiled_attention", "test_tiled_attention_causal"}
VARIANTS, _add = collector()


# ---- split_heads / merge_heads (MultiHeadAttention uses both) --------------------------------------
@_add("split heads by reshape without transpose", "split_heads", {"test_split_heads"} | MHA, "check_split_heads",
      "transpose")
def split_no_transpose(x, n_heads):
    *lead, n, d = x.shape
    return x.reshape(*lead, n_heads, n, d // n_heads)


@_add("split heads with interleaved features", "split_heads", {"test_split_heads"} | MHA, "check_split_heads",
      "contiguous")
def split_interleaved(x, n_heads):
    *lead, n, d = x.shape
    return x.reshape(*lead, n, d // n_heads, n_heads).permute(*range(len(lead)), -1, -3, -2)


@_add("merge heads by reshape without transpose", "merge_heads", {"test_merge_heads"} | MHA, "check_merge_heads",
      "transpose")
def merge_no_transpose(x):
    *lead, h, n, d_head = x.shape
    return x.reshape(*lead, n, h * d_head)


@_add("merge heads feature-major (interleaved)", "merge_heads", {"test_merge_heads"} | MHA, "check_merge_heads",
      "head 0 first")
def merge_interleaved(x):
    *lead, h, n, d_head = x.shape
    return x.permute(*range(len(lead)), -2, -1, -3).reshape(*lead, n, h * d_head)


# ---- split_in_proj --------------------------------------------------------------------------------------
@_add("in_proj split as (Q, V, K)", "split_in_proj", {"test_split_in_proj"}, "check_split_in_proj", "order")
def in_proj_qvk(in_proj_weight, in_proj_bias):
    w_q, w_v, w_k = in_proj_weight.chunk(3, dim=0)
    b_q, b_v, b_k = in_proj_bias.chunk(3, dim=0)
    return w_q, w_k, w_v, b_q, b_k, b_v


@_add("in_proj blocks transposed", "split_in_proj", {"test_split_in_proj"}, "check_split_in_proj", "transpose")
def in_proj_transposed(in_proj_weight, in_proj_bias):
    w_q, w_k, w_v = in_proj_weight.chunk(3, dim=0)
    b_q, b_k, b_v = in_proj_bias.chunk(3, dim=0)
    return w_q.T, w_k.T, w_v.T, b_q, b_k, b_v


# ---- MultiHeadAttention.forward -----------------------------------------------------------------------
@_add("no output projection", "mha", MHA, "check_mha", "output projection")
def mha_no_out_proj(self, query, key, value, key_mask=None, causal=False):
    q = split_heads(self.q_proj(query), self.n_heads)
    k = split_heads(self.k_proj(key), self.n_heads)
    v = split_heads(self.v_proj(value), self.n_heads)
    mask = None
    if key_mask is not None:
        mask = key_mask[:, None, None, :]
    if causal:
        c = causal_mask(q.shape[-2], device=q.device)
        mask = c if mask is None else mask & c
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    return merge_heads(out), weights


@_add("scores scaled by sqrt(d_model) instead of sqrt(d_head)", "mha", MHA, "check_mha", "d_head")
def mha_scale_d_model(self, query, key, value, key_mask=None, causal=False):
    q = split_heads(self.q_proj(query), self.n_heads)
    k = split_heads(self.k_proj(key), self.n_heads)
    v = split_heads(self.v_proj(value), self.n_heads)
    scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_model)
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[-2], device=q.device), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return self.out_proj(merge_heads(weights @ v)), weights


@_add("key mask inverted (PyTorch's padding convention)", "mha", {"test_mha_masks"}, "check_mha_masks",
      "inverted")
def mha_inverted_key_mask(self, query, key, value, key_mask=None, causal=False):
    q = split_heads(self.q_proj(query), self.n_heads)
    k = split_heads(self.k_proj(key), self.n_heads)
    v = split_heads(self.v_proj(value), self.n_heads)
    mask = None
    if key_mask is not None:
        mask = ~key_mask[:, None, None, :]
    if causal:
        c = causal_mask(q.shape[-2], device=q.device)
        mask = c if mask is None else mask & c
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    return self.out_proj(merge_heads(out)), weights


@_add("causal flag ignored", "mha", {"test_mha_masks"}, "check_mha_masks", "causal")
def mha_ignores_causal(self, query, key, value, key_mask=None, causal=False):
    q = split_heads(self.q_proj(query), self.n_heads)
    k = split_heads(self.k_proj(key), self.n_heads)
    v = split_heads(self.v_proj(value), self.n_heads)
    mask = None if key_mask is None else key_mask[:, None, None, :]
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    return self.out_proj(merge_heads(out)), weights


# ---- attention_flops / attention_memory ---------------------------------------------------------------
@_add("FLOPs without the factor 2", "attention_flops", {"test_attention_flops"}, "check_attention_flops",
      "factor 2")
def flops_no_two(n, d, h):
    d_head = d // h
    return (n * d * 3 * d, h * n * n * d_head, h * n * n * d_head, n * d * d)


@_add("FLOPs of one head only", "attention_flops", {"test_attention_flops"}, "check_attention_flops", "every head")
def flops_one_head(n, d, h):
    d_head = d // h
    return (2 * n * d * 3 * d, 2 * n * n * d_head, 2 * n * n * d_head, 2 * n * d * d)


@_add("score memory of one head only", "attention_memory", {"test_attention_memory"}, "check_attention_memory",
      "every head")
def memory_one_head(n, d, h, bytes_per_element=4):
    d_head = d // h
    return tuple(bytes_per_element * x for x in (n * 3 * d, n * n, h * n * d_head, n * d))


@_add("memory in elements, not bytes", "attention_memory", {"test_attention_memory"}, "check_attention_memory",
      "bytes")
def memory_elements(n, d, h, bytes_per_element=4):
    d_head = d // h
    return (n * 3 * d, h * n * n, h * n * d_head, n * d)


# ---- tiled_attention ----------------------------------------------------------------------------------
@_add("tiled attention that builds the full score matrix", "tiled_attention", TILED,
      "check_tiled_attention", "full N x N score matrix")
def tiled_full_matrix(q, k, v, block_size, causal=False):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@_add("online softmax without rescaling the running sum", "tiled_attention", TILED, "check_tiled_attention",
      "running sum")
def tiled_no_sum_rescale(q, k, v, block_size, causal=False):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = []
    for qs in range(0, n_q, block_size):
        qb = q[..., qs: qs + block_size, :]
        rows = qb.shape[-2]
        m = torch.full(qb.shape[:-1] + (1,), float("-inf"), dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, n_k, block_size):
            s = qb @ k[..., ks: ks + block_size, :].transpose(-2, -1) * scale
            if causal:
                i = torch.arange(qs, qs + rows)[:, None]
                j = torch.arange(ks, ks + s.shape[-1])[None, :]
                s = s.masked_fill(j > i, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            rescale = torch.exp(m - m_new)
            l = l + p.sum(dim=-1, keepdim=True)
            acc = acc * rescale + p @ v[..., ks: ks + block_size, :]
            m = m_new
        out.append(acc / l)
    return torch.cat(out, dim=-2)


@_add("online softmax without rescaling the accumulator", "tiled_attention", TILED, "check_tiled_attention",
      "rescale")
def tiled_no_acc_rescale(q, k, v, block_size, causal=False):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = []
    for qs in range(0, n_q, block_size):
        qb = q[..., qs: qs + block_size, :]
        rows = qb.shape[-2]
        m = torch.full(qb.shape[:-1] + (1,), float("-inf"), dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, n_k, block_size):
            s = qb @ k[..., ks: ks + block_size, :].transpose(-2, -1) * scale
            if causal:
                i = torch.arange(qs, qs + rows)[:, None]
                j = torch.arange(ks, ks + s.shape[-1])[None, :]
                s = s.masked_fill(j > i, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            rescale = torch.exp(m - m_new)
            l = l * rescale + p.sum(dim=-1, keepdim=True)
            acc = acc + p @ v[..., ks: ks + block_size, :]
            m = m_new
        out.append(acc / l)
    return torch.cat(out, dim=-2)


@_add("tiled attention dropping the last partial block", "tiled_attention", TILED, "check_tiled_attention",
      "last")
def tiled_drop_last(q, k, v, block_size, causal=False):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = []
    for qs in range(0, n_q, block_size):
        qb = q[..., qs: qs + block_size, :]
        rows = qb.shape[-2]
        m = torch.full(qb.shape[:-1] + (1,), float("-inf"), dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, max(n_k - block_size + 1, 1), block_size):
            s = qb @ k[..., ks: ks + block_size, :].transpose(-2, -1) * scale
            if causal:
                i = torch.arange(qs, qs + rows)[:, None]
                j = torch.arange(ks, ks + s.shape[-1])[None, :]
                s = s.masked_fill(j > i, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            rescale = torch.exp(m - m_new)
            l = l * rescale + p.sum(dim=-1, keepdim=True)
            acc = acc * rescale + p @ v[..., ks: ks + block_size, :]
            m = m_new
        out.append(acc / l)
    return torch.cat(out, dim=-2)


@_add("tiled causal mask hiding the diagonal", "tiled_attention", {"test_tiled_attention_causal"},
      "check_tiled_attention_causal", "diagonal")
def tiled_strict_causal(q, k, v, block_size, causal=False):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = []
    for qs in range(0, n_q, block_size):
        qb = q[..., qs: qs + block_size, :]
        rows = qb.shape[-2]
        m = torch.full(qb.shape[:-1] + (1,), float("-inf"), dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
        for ks in range(0, n_k, block_size):
            s = qb @ k[..., ks: ks + block_size, :].transpose(-2, -1) * scale
            if causal:
                i = torch.arange(qs, qs + rows)[:, None]
                j = torch.arange(ks, ks + s.shape[-1])[None, :]
                s = s.masked_fill(j >= i, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            rescale = torch.exp(m - m_new)
            l = l * rescale + p.sum(dim=-1, keepdim=True)
            acc = acc * rescale + p @ v[..., ks: ks + block_size, :]
            m = m_new
        out.append(acc / l)
    return torch.cat(out, dim=-2)


# ---- sliding_window_mask --------------------------------------------------------------------------------
@_add("window edge excluded (|i - j| < window)", "sliding_window_mask", {"test_sliding_window_mask"},
      "check_sliding_window_mask", "off by one")
def window_strict(n, window, device=None):
    i = torch.arange(n, device=device)
    return (i[:, None] - i[None, :]).abs() < window


@_add("window one too wide (|i - j| <= window + 1)", "sliding_window_mask", {"test_sliding_window_mask"},
      "check_sliding_window_mask", "off by one")
def window_wide(n, window, device=None):
    i = torch.arange(n, device=device)
    return (i[:, None] - i[None, :]).abs() <= window + 1


@_add("window only looking back", "sliding_window_mask", {"test_sliding_window_mask"},
      "check_sliding_window_mask", "both sides")
def window_one_sided(n, window, device=None):
    i = torch.arange(n, device=device)
    diff = i[:, None] - i[None, :]
    return (diff >= 0) & (diff <= window)


# ---- linear attention: parallel, recurrent, chunked ------------------------------------------------------------
@_add("linear attention without the causal mask", "linear_attention", {"test_linear_attention"},
      "check_linear_attention", "s <= t only")
def linear_not_causal(q, k, v):
    scores = q @ k.transpose(-2, -1)
    return (scores @ v) / scores.sum(-1, keepdim=True)


@_add("linear attention without the normaliser", "linear_attention", {"test_linear_attention"},
      "check_linear_attention", "normaliser")
def linear_unnormalised(q, k, v):
    return (q @ k.transpose(-2, -1)).tril() @ v


@_add("linear attention normalised over every key", "linear_attention", {"test_linear_attention"},
      "check_linear_attention", "same keys")
def linear_normalised_over_all(q, k, v):
    scores = q @ k.transpose(-2, -1)
    return (scores.tril() @ v) / scores.sum(-1, keepdim=True)


@_add("recurrent form that builds the T x T table", "linear_attention_recurrent",
      {"test_linear_attention_recurrent"}, "check_linear_attention_recurrent", "T x T table")
def recurrent_is_parallel(q, k, v):
    scores = (q @ k.transpose(-2, -1)).tril()
    return (scores @ v) / scores.sum(-1, keepdim=True)


@_add("recurrent form that reads before it writes", "linear_attention_recurrent",
      {"test_linear_attention_recurrent"}, "check_linear_attention_recurrent", "reads the state before")
def recurrent_read_first(q, k, v):
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    z = q.new_zeros(*q.shape[:-2], q.shape[-1])
    out = []
    for t in range(q.shape[-2]):
        out.append((q[..., t, None, :] @ S)[..., 0, :] / (q[..., t, :] * z).sum(-1, keepdim=True))
        S = S + k[..., t, :, None] * v[..., t, None, :]
        z = z + k[..., t, :]
    return torch.stack(out, dim=-2)


@_add("recurrent form without the normaliser", "linear_attention_recurrent",
      {"test_linear_attention_recurrent"}, "check_linear_attention_recurrent", "normaliser")
def recurrent_unnormalised(q, k, v):
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    out = []
    for t in range(q.shape[-2]):
        S = S + k[..., t, :, None] * v[..., t, None, :]
        out.append((q[..., t, None, :] @ S)[..., 0, :])
    return torch.stack(out, dim=-2)


@_add("chunked form that forgets the earlier chunks", "linear_attention_chunked",
      {"test_linear_attention_chunked"}, "check_linear_attention_chunked", "carry the state")
def chunked_no_state(q, k, v, chunk=64):
    out = []
    for start in range(0, q.shape[-2], chunk):
        qc, kc, vc = (x[..., start:start + chunk, :] for x in (q, k, v))
        scores = (qc @ kc.transpose(-2, -1)).tril()
        out.append((scores @ vc) / scores.sum(-1, keepdim=True))
    return torch.cat(out, dim=-2)


@_add("chunked form without the mask inside a chunk", "linear_attention_chunked",
      {"test_linear_attention_chunked"}, "check_linear_attention_chunked", "tril")
def chunked_not_causal(q, k, v, chunk=64):
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    z = q.new_zeros(*q.shape[:-2], q.shape[-1], 1)
    out = []
    for start in range(0, q.shape[-2], chunk):
        qc, kc, vc = (x[..., start:start + chunk, :] for x in (q, k, v))
        scores = qc @ kc.transpose(-2, -1)
        out.append((qc @ S + scores @ vc) / (qc @ z + scores.sum(-1, keepdim=True)))
        S, z = S + kc.transpose(-2, -1) @ vc, z + kc.sum(-2)[..., None]
    return torch.cat(out, dim=-2)


@_add("chunked form that builds the T x T table", "linear_attention_chunked",
      {"test_linear_attention_chunked"}, "check_linear_attention_chunked", "T x T table")
def chunked_is_parallel(q, k, v, chunk=64):
    scores = (q @ k.transpose(-2, -1)).tril()
    return (scores @ v) / scores.sum(-1, keepdim=True)


# ---- the delta rule and its gated form -------------------------------------------------------------------------
DELTA = {"test_delta_rule", "test_delta_rule_gated"}


@_add("delta rule that adds k v^T (linear attention's write)", "delta_rule", DELTA, "check_delta_rule",
      "writes the error")
def delta_hebbian(q, k, v, beta, g=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    out = []
    for t in range(q.shape[-2]):
        if g is not None:
            S = S * g[..., t, None, None].exp()
        S = S + beta[..., t, None, None] * k[..., t, :, None] * v[..., t, None, :]
        out.append((scale * q[..., t, None, :] @ S)[..., 0, :])
    return torch.stack(out, dim=-2), S


@_add("delta rule that reads before it writes", "delta_rule", DELTA, "check_delta_rule", "before token t's write")
def delta_read_first(q, k, v, beta, g=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    out = []
    for t in range(q.shape[-2]):
        if g is not None:
            S = S * g[..., t, None, None].exp()
        out.append((scale * q[..., t, None, :] @ S)[..., 0, :])
        k_t = k[..., t, :]
        error = v[..., t, :] - (k_t[..., None, :] @ S)[..., 0, :]
        S = S + beta[..., t, None, None] * k_t[..., :, None] * error[..., None, :]
    return torch.stack(out, dim=-2), S


@_add("delta rule without the scale", "delta_rule", DELTA, "check_delta_rule", "not scaled")
def delta_unscaled(q, k, v, beta, g=None, scale=None):
    scale = 1.0 if scale is None else scale
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    out = []
    for t in range(q.shape[-2]):
        if g is not None:
            S = S * g[..., t, None, None].exp()
        k_t = k[..., t, :]
        error = v[..., t, :] - (k_t[..., None, :] @ S)[..., 0, :]
        S = S + beta[..., t, None, None] * k_t[..., :, None] * error[..., None, :]
        out.append((scale * q[..., t, None, :] @ S)[..., 0, :])
    return torch.stack(out, dim=-2), S


@_add("gated delta rule that ignores the gate", "delta_rule", {"test_delta_rule_gated"},
      "check_delta_rule_gated", "g is ignored")
def delta_no_gate(q, k, v, beta, g=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    out = []
    for t in range(q.shape[-2]):
        k_t = k[..., t, :]
        error = v[..., t, :] - (k_t[..., None, :] @ S)[..., 0, :]
        S = S + beta[..., t, None, None] * k_t[..., :, None] * error[..., None, :]
        out.append((scale * q[..., t, None, :] @ S)[..., 0, :])
    return torch.stack(out, dim=-2), S


@_add("gated delta rule multiplying by g, not exp(g)", "delta_rule", {"test_delta_rule_gated"},
      "check_delta_rule_gated", "not by g_t")
def delta_gate_without_exp(q, k, v, beta, g=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    out = []
    for t in range(q.shape[-2]):
        if g is not None:
            S = S * g[..., t, None, None]
        k_t = k[..., t, :]
        error = v[..., t, :] - (k_t[..., None, :] @ S)[..., 0, :]
        S = S + beta[..., t, None, None] * k_t[..., :, None] * error[..., None, :]
        out.append((scale * q[..., t, None, :] @ S)[..., 0, :])
    return torch.stack(out, dim=-2), S


@_add("gated delta rule decaying after the write", "delta_rule", {"test_delta_rule_gated"},
      "check_delta_rule_gated", "before the write")
def delta_gate_after(q, k, v, beta, g=None, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    out = []
    for t in range(q.shape[-2]):
        k_t = k[..., t, :]
        error = v[..., t, :] - (k_t[..., None, :] @ S)[..., 0, :]
        S = S + beta[..., t, None, None] * k_t[..., :, None] * error[..., None, :]
        if g is not None:
            S = S * g[..., t, None, None].exp()
        out.append((scale * q[..., t, None, :] @ S)[..., 0, :])
    return torch.stack(out, dim=-2), S
