"""Chapter 04: positional encoding (reference implementation)."""
import torch
from torch import nn


def sinusoidal_table(n_positions, d_model):
    """[n_positions, d_model] float64 table: PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same).

    d_model must be even.  Cast it to your activations' dtype when you add it.
    """
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)   # w_i, i = 0..d/2-1
    angles = pos * inv_freq                                                               # [n, d/2]
    table = torch.empty(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table


def shift_matrix(k, d_model):
    """M_k [d_model, d_model] float64 with PE(pos + k) = M_k @ PE(pos) for every pos (PE(pos) a column vector).

    Block diagonal: the block acting on (PE[2i], PE[2i+1]) = (sin a, cos a) is
    [[cos b, sin b], [-sin b, cos b]] with b = k w_i; row k of the table holds (sin b, cos b).
    """
    row = sinusoidal_table(k + 1, d_model)[k]
    sin_b, cos_b = row[0::2], row[1::2]
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    even = torch.arange(0, d_model, 2)
    m[even, even] = cos_b
    m[even, even + 1] = sin_b
    m[even + 1, even] = -sin_b
    m[even + 1, even + 1] = cos_b
    return m


class LearnedPositionalEmbedding(nn.Module):
    """x + P[:N], with P a learned table of max_len position vectors (BERT, GPT-2, ViT).

    Parameter: embedding.weight [max_len, d_model].  forward(x [..., N, d_model]) -> same shape, N <= max_len.
    """

    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)

    def forward(self, x):
        n = x.shape[-2]
        positions = torch.arange(n, device=x.device)
        return x + self.embedding(positions)


def apply_rope(x, positions):
    """Rotary position embedding: rotate each adjacent pair (x[2i], x[2i+1]) by the angle pos * w_i.

    x: [..., N, d] (d even), positions: int tensor [N].  w_i = 10000^(-2i/d), as in the sinusoidal
    table.  (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos).  Same shape and dtype as x.
    """
    d = x.shape[-1]
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    angles = positions.to(torch.float64)[:, None] * inv_freq          # [N, d/2]
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)   # [..., N, d/2, 2]
    return out.flatten(-2)


def relative_position_index(n, max_len):
    """[n, n] int64: entry (i, j) = (i - j) + max_len - 1, the row of the bias table for query i, key j.

    i - j runs over -(max_len - 1) .. max_len - 1; the offset makes every index non-negative.
    """
    pos = torch.arange(n)
    return pos[:, None] - pos[None, :] + max_len - 1


class RelativePositionBias(nn.Module):
    """A learned bias per head and relative distance, added to attention scores (Swin, T5-style).

    Parameter: table [2 * max_len - 1, n_heads].
    forward(scores [..., n_heads, N, N]) -> scores + B with B[h, i, j] = table[index[i, j], h], N <= max_len.
    """

    def __init__(self, max_len, n_heads):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Parameter(torch.randn(2 * max_len - 1, n_heads) * 0.02)

    def forward(self, scores):
        n = scores.shape[-1]
        bias = self.table[relative_position_index(n, self.max_len)]     # [N, N, H]
        return scores + bias.permute(2, 0, 1)
