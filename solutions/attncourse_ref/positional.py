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


# ---- longer contexts than trained: RoPE's frequencies, rescaled (§4.8) ----
def rope_inv_freq(d, base=10000.0):
    """RoPE's frequencies w_i = base^(-2i/d), i = 0 .. d/2 - 1, as float64 [d/2] (apply_rope's, for base 10000).
    The graded functions below write them out again: a solution body must stand alone in the learner's cell."""
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def interpolated_inv_freq(d, factor, base=10000.0):
    """Position interpolation (Chen et al., 2023): a position m is read as m / s, so that s times the trained
    length maps onto the trained range; the same as every frequency divided by s."""
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d) / factor


def ntk_inv_freq(d, factor, base=10000.0):
    """NTK-aware scaling (bloc97, 2023): the base raised to base * s^(d / (d - 2)).  The fastest pair (i = 0)
    keeps its frequency, the slowest (i = d/2 - 1) is divided by exactly s, and those between by less."""
    stretched = base * factor ** (d / (d - 2))
    return stretched ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def yarn_inv_freq(d, factor, original_max, base=10000.0, beta_fast=32.0, beta_slow=1.0):
    """YaRN (Peng et al., 2023): (frequencies [d/2] float64, attention factor).

    A pair that turns more than beta_fast times over the trained length ``original_max`` keeps its frequency
    (it has seen every angle), one that turns fewer than beta_slow times is interpolated (divided by s), and a
    linear ramp over the pair index joins the two.  The ramp's ends are the pair indices where a pair turns
    exactly beta_fast and beta_slow times, floored and ceiled (as the reference code and Hugging Face do).
    The attention factor 0.1 ln s + 1 multiplies the rotated queries and keys (cos and sin), so the logits
    are scaled by its square: YaRN's temperature, sqrt(1/t) = 0.1 ln s + 1.
    """
    import math

    def pair_turning(times):         # the pair index i where original_max * w_i = times * 2 pi
        return d * math.log(original_max / (times * 2 * math.pi)) / (2 * math.log(base))
    low = max(math.floor(pair_turning(beta_fast)), 0)
    high = min(math.ceil(pair_turning(beta_slow)), d - 1)
    if low == high:
        high += 0.001                 # a ramp of width zero: a step
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)   # 0 keep .. 1 interpolate
    w = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    scale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return w * (1 - ramp) + (w / factor) * ramp, scale


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
