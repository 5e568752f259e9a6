"""Chapter 03: multi-head attention and its cost (reference implementation); linear attention and the delta rule."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import causal_mask, scaled_dot_product_attention


def split_heads(x, n_heads):
    """[..., N, D] -> [..., H, N, D / H]: head h gets features h * D_H .. (h + 1) * D_H - 1."""
    *lead, n, d = x.shape
    return x.reshape(*lead, n, n_heads, d // n_heads).transpose(-3, -2)


def merge_heads(x):
    """[..., H, N, D_H] -> [..., N, H * D_H]: the inverse of split_heads (heads concatenated)."""
    *lead, h, n, d_head = x.shape
    return x.transpose(-3, -2).reshape(*lead, n, h * d_head)


def split_in_proj(in_proj_weight, in_proj_bias):
    """torch.nn.MultiheadAttention's fused input projection -> (w_q, w_k, w_v, b_q, b_k, b_v).

    in_proj_weight is [3D, D] (rows: W_Q, then W_K, then W_V, each in nn.Linear's [out, in]
    layout), in_proj_bias is [3D].
    """
    w_q, w_k, w_v = in_proj_weight.chunk(3, dim=0)
    b_q, b_k, b_v = in_proj_bias.chunk(3, dim=0)
    return w_q, w_k, w_v, b_q, b_k, b_v


class MultiHeadAttention(nn.Module):
    """H heads of scaled dot-product attention, then an output projection.

    Parameters (all nn.Linear(d_model, d_model)): q_proj, k_proj, v_proj, out_proj.
    forward(query [B, N_q, D], key [B, N_k, D], value [B, N_k, D], key_mask=None, causal=False)
        -> (output [B, N_q, D], weights [B, H, N_q, N_k])
    key_mask: bool [B, N_k], True for a real key (may be attended), False for padding.
    causal: query i may attend key j only when j <= i (self-attention, N_q = N_k).
    """

    def __init__(self, d_model, n_heads, bias=True):
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be a multiple of n_heads"
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key, value, key_mask=None, causal=False):
        q = split_heads(self.q_proj(query), self.n_heads)          # [B, H, N_q, D_H]
        k = split_heads(self.k_proj(key), self.n_heads)            # [B, H, N_k, D_H]
        v = split_heads(self.v_proj(value), self.n_heads)
        mask = None
        if key_mask is not None:
            mask = key_mask[:, None, None, :]                      # [B, 1, 1, N_k]: every head, every query
        if causal:
            c = causal_mask(q.shape[-2], device=q.device)       # self-attention: N_q = N_k
            mask = c if mask is None else mask & c
        out, weights = scaled_dot_product_attention(q, k, v, mask)
        return self.out_proj(merge_heads(out)), weights


def load_from_torch(module, torch_mha):
    """Copy a torch.nn.MultiheadAttention's weights (same d_model, n_heads, with biases) into ``module``."""
    w_q, w_k, w_v, b_q, b_k, b_v = split_in_proj(torch_mha.in_proj_weight, torch_mha.in_proj_bias)
    with torch.no_grad():
        for proj, w, b in [(module.q_proj, w_q, b_q), (module.k_proj, w_k, b_k), (module.v_proj, w_v, b_v)]:
            proj.weight.copy_(w)
            proj.bias.copy_(b)
        module.out_proj.weight.copy_(torch_mha.out_proj.weight)
        module.out_proj.bias.copy_(torch_mha.out_proj.bias)
    return module


def attention_flops(n, d, h):
    """FLOPs of the four matrix products of self-attention on one sequence (a multiply-add = 2 FLOPs).

    Returns (qkv_projection, scores, weighted_sum, output_projection) as ints, with D_H = d / h:
    [N x D][D x 3D], H x [N x D_H][D_H x N], H x [N x N][N x D_H], [N x D][D x D].
    """
    d_head = d // h
    return (2 * n * d * 3 * d, 2 * h * n * n * d_head, 2 * h * n * n * d_head, 2 * n * d * d)


def attention_memory(n, d, h, bytes_per_element=4):
    """Bytes of the result of each of the four products: [N, 3D], [H, N, N], [H, N, D_H], [N, D]."""
    d_head = d // h
    return tuple(bytes_per_element * x for x in (n * 3 * d, h * n * n, h * n * d_head, n * d))


def tiled_attention(q, k, v, block_size, causal=False):
    """softmax(q k^T / sqrt(d_k)) v without ever holding more than a block_size x block_size tile of scores.

    q: [..., N_q, d_k], k: [..., N_k, d_k], v: [..., N_k, d_v] -> [..., N_q, d_v].
    Online softmax: for each block of queries keep a running max m, a running sum of exponentials
    l and a running weighted sum acc; when a new block of keys raises the max, rescale l and acc
    by exp(m_old - m_new).  causal: query i may attend key j only when j <= i.
    """
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = []
    for qs in range(0, n_q, block_size):
        qb = q[..., qs: qs + block_size, :]
        rows = qb.shape[-2]
        m = torch.full(qb.shape[:-1] + (1,), float("-inf"), dtype=q.dtype, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
        for ks in range(0, n_k, block_size):
            if causal and ks > qs + rows - 1:
                break                                      # every key of this block is in the future
            s = qb @ k[..., ks: ks + block_size, :].transpose(-2, -1) * scale
            if causal:
                i = torch.arange(qs, qs + rows, device=q.device)[:, None]
                j = torch.arange(ks, ks + s.shape[-1], device=q.device)[None, :]
                s = s.masked_fill(j > i, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            rescale = torch.exp(m - m_new)                 # 0 on the first block (m = -inf)
            l = l * rescale + p.sum(dim=-1, keepdim=True)
            acc = acc * rescale + p @ v[..., ks: ks + block_size, :]
            m = m_new
        out.append(acc / l)
    return torch.cat(out, dim=-2)


def sliding_window_mask(n, window, device=None):
    """[n, n] bool: query i may attend key j when |i - j| <= window (window neighbours on each side)."""
    i = torch.arange(n, device=device)
    return (i[:, None] - i[None, :]).abs() <= window


# ---- attention as an RNN again: linear attention and the delta rule (issue 34: references for the exercises to come)
def elu_feature_map(x):
    """phi(x) = elu(x) + 1 (Katharopoulos et al., 2020): features > 0 (rounding to 0 only far below 0: float32 at
    x < -17 or so), so that the normalisers below are not 0."""
    return F.elu(x) + 1


def linear_attention(q, k, v):
    """Causal linear attention, parallel form (Katharopoulos et al., 2020), on features q, k [..., T, d_k] (a
    positive feature map applied already) and values v [..., T, d_v]: o_t = sum_{s<=t} (q_t . k_s) v_s /
    sum_{s<=t} q_t . k_s.  Softmax attention's T x T table with q . k in place of exp(q . k): quadratic in T."""
    scores = (q @ k.transpose(-2, -1)).tril()
    return (scores @ v) / scores.sum(-1, keepdim=True)


def linear_attention_recurrent(q, k, v):
    """The same outputs, one token at a time: the state S = sum_{s<=t} k_s v_s^T [..., d_k, d_v] and the normaliser
    z = sum_{s<=t} k_s [..., d_k] give o_t = S^T q_t / (z . q_t).  An RNN whose state does not grow with T."""
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    z = q.new_zeros(*q.shape[:-2], q.shape[-1])
    out = []
    for t in range(q.shape[-2]):
        S = S + k[..., t, :, None] * v[..., t, None, :]
        z = z + k[..., t, :]
        out.append((q[..., t, None, :] @ S)[..., 0, :] / (q[..., t, :] * z).sum(-1, keepdim=True))
    return torch.stack(out, dim=-2)


def linear_attention_chunked(q, k, v, chunk=64):
    """The same outputs a chunk of positions at a time, as kernels compute them: within a chunk the parallel form
    (matrix products), from the chunks before it the recurrent form's state, carried from chunk to chunk."""
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    z = q.new_zeros(*q.shape[:-2], q.shape[-1], 1)
    out = []
    for start in range(0, q.shape[-2], chunk):
        qc, kc, vc = (x[..., start:start + chunk, :] for x in (q, k, v))
        scores = (qc @ kc.transpose(-2, -1)).tril()
        out.append((qc @ S + scores @ vc) / (qc @ z + scores.sum(-1, keepdim=True)))
        S, z = S + kc.transpose(-2, -1) @ vc, z + kc.sum(-2)[..., None]
    return torch.cat(out, dim=-2)


def delta_rule(q, k, v, beta, g=None, scale=None):
    """DeltaNet's recurrence (Schlag et al., 2021; Yang et al., 2024) and, with log-decays g, Gated DeltaNet's (Yang
    et al., 2025; Qwen3-Next's linear layers), as flash-linear-attention's naive reference writes them.

    q, k [..., T, d_k] (keys usually L2-normalised), v [..., T, d_v], beta [..., T] in (0, 1], g [..., T] <= 0 or
    None.  Per token: S <- exp(g_t) S, then S <- S + beta_t k_t (v_t - S^T k_t)^T: what the state returns for k_t
    moves a share beta_t of the way to v_t (a write that corrects, where linear attention's only adds), and
    o_t = S^T (scale q_t), scale d_k ** -0.5 unless given.  Returns (o [..., T, d_v], the state [..., d_k, d_v])."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    out = []
    for t in range(q.shape[-2]):
        if g is not None:
            S = S * g[..., t, None, None].exp()
        k_t = k[..., t, :]
        error = v[..., t, :] - (k_t[..., None, :] @ S)[..., 0, :]          # v_t - S^T k_t
        S = S + beta[..., t, None, None] * k_t[..., :, None] * error[..., None, :]
        out.append((scale * q[..., t, None, :] @ S)[..., 0, :])
    return torch.stack(out, dim=-2), S
