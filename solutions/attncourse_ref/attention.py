"""Chapter 02: the attention layer and self-attention (reference implementation)."""
import math

import torch
from torch import nn


def scaled_dot_product_attention(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d_k)) v over the last two dimensions; leading dimensions broadcast.

    q: [..., N_q, d_k], k: [..., N_k, d_k], v: [..., N_k, d_v].
    mask: optional bool tensor broadcastable to [..., N_q, N_k]; True means "may attend".
    Returns (output [..., N_q, d_v], weights [..., N_q, N_k]).
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        # -inf before the softmax gives exactly zero weight after it.
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def causal_mask(n, device=None):
    """[n, n] bool mask: position i may attend to positions 0..i (itself and the past)."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


class SelfAttention(nn.Module):
    """Single-head self-attention with one fused projection X -> [Q K V].

    Parameters: qkv.weight [3 * d_head, d_model] (rows: W_Q, then W_K, then W_V), qkv.bias [3 * d_head].
    """

    def __init__(self, d_model, d_head=None, bias=True):
        super().__init__()
        self.d_head = d_head or d_model
        self.qkv = nn.Linear(d_model, 3 * self.d_head, bias=bias)

    def forward(self, x, mask=None):
        q, k, v = self.qkv(x).split(self.d_head, dim=-1)
        return scaled_dot_product_attention(q, k, v, mask)


class CrossAttention(nn.Module):
    """Queries from one sequence, keys and values from another (the context).

    Parameters: q_proj.weight [d_head, d_query], kv_proj.weight [2 * d_head, d_context]
    (rows: W_K, then W_V), and their biases.
    """

    def __init__(self, d_query, d_context, d_head, bias=True):
        super().__init__()
        self.d_head = d_head
        self.q_proj = nn.Linear(d_query, d_head, bias=bias)
        self.kv_proj = nn.Linear(d_context, 2 * d_head, bias=bias)

    def forward(self, x, context, mask=None):
        q = self.q_proj(x)
        k, v = self.kv_proj(context).split(self.d_head, dim=-1)
        return scaled_dot_product_attention(q, k, v, mask)


def equivariance_gap(layer, x, perm):
    """max |layer(x permuted) - layer(x) permuted| over the sequence axis (dim -2).

    Zero (up to rounding) exactly when the layer is permutation-equivariant for this x and perm.
    """
    return (layer(x[..., perm, :]) - layer(x)[..., perm, :]).abs().max().item()
