"""Known-wrong implementations for chapter 04 (see tests/zoo/__init__.py)."""
import torch

from attncourse_ref.positional import relative_position_index, sinusoidal_table

from . import collector

TABLE = {"test_sinusoidal_table", "test_shift_matrix"}          # shift_matrix reads row k of the table
INDEX = {"test_relative_position_index", "test_relative_position_bias"}
VARIANTS, _add = collector()


# ---- sinusoidal_table ------------------------------------------------------------------------
@_add("sin in the first half, cos in the second", "sinusoidal_table", TABLE, "check_sinusoidal_table",
      "first half")
def table_halves(n_positions, d_model):
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return torch.cat([torch.sin(pos * inv_freq), torch.cos(pos * inv_freq)], dim=-1)


@_add("cos on even, sin on odd dimensions", "sinusoidal_table", TABLE, "check_sinusoidal_table", "swapped")
def table_swapped(n_positions, d_model):
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.empty(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.cos(pos * inv_freq)
    table[:, 1::2] = torch.sin(pos * inv_freq)
    return table


@_add("exponent 2i/d with i the dimension, not the pair", "sinusoidal_table", TABLE, "check_sinusoidal_table",
      "exponent")
def table_exponent(n_positions, d_model):
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    dims = torch.arange(d_model, dtype=torch.float64)
    angles = pos / 10000.0 ** (2 * dims / d_model)           # every dimension its own frequency
    table = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, 1::2])
    return table


@_add("positions counted from 1", "sinusoidal_table", TABLE, "check_sinusoidal_table", "position 0")
def table_from_one(n_positions, d_model):
    pos = torch.arange(1, n_positions + 1, dtype=torch.float64)[:, None]
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.empty(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq)
    return table


# ---- shift_matrix -----------------------------------------------------------------------------
@_add("M_k transposed (shifts by -k)", "shift_matrix", {"test_shift_matrix"}, "check_shift_matrix", "transposed")
def shift_transposed(k, d_model):
    row = sinusoidal_table(k + 1, d_model)[k]
    sin_b, cos_b = row[0::2], row[1::2]
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    even = torch.arange(0, d_model, 2)
    m[even, even] = cos_b
    m[even, even + 1] = -sin_b
    m[even + 1, even] = sin_b
    m[even + 1, even + 1] = cos_b
    return m


@_add("M_k without the minus sign", "shift_matrix", {"test_shift_matrix"}, "check_shift_matrix", "rotation")
def shift_no_minus(k, d_model):
    row = sinusoidal_table(k + 1, d_model)[k]
    sin_b, cos_b = row[0::2], row[1::2]
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    even = torch.arange(0, d_model, 2)
    m[even, even] = cos_b
    m[even, even + 1] = sin_b
    m[even + 1, even] = sin_b
    m[even + 1, even + 1] = cos_b
    return m


# ---- LearnedPositionalEmbedding.forward ---------------------------------------------------------
@_add("returns the embeddings without adding x", "learned_positional_embedding",
      {"test_learned_positional_embedding"}, "check_learned_positional_embedding", "add")
def learned_no_add(self, x):
    n = x.shape[-2]
    return self.embedding(torch.arange(n, device=x.device)).expand_as(x)


@_add("learned positions counted from 1", "learned_positional_embedding", {"test_learned_positional_embedding"},
      "check_learned_positional_embedding", "row 0")
def learned_from_one(self, x):
    n = x.shape[-2]
    positions = torch.arange(1, n + 1, device=x.device).clamp_max(self.max_len - 1)
    return x + self.embedding(positions)


# ---- apply_rope ----------------------------------------------------------------------------------
@_add("RoPE rotating (first half, second half) pairs", "rope", {"test_rope"}, "check_rope", "adjacent dimensions")
def rope_halves(x, positions):
    d = x.shape[-1]
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    angles = positions.to(torch.float64)[:, None] * inv_freq
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


@_add("RoPE rotating the wrong way", "rope", {"test_rope"}, "check_rope", "direction")
def rope_clockwise(x, positions):
    d = x.shape[-1]
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    angles = positions.to(torch.float64)[:, None] * inv_freq
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1).flatten(-2)


@_add("RoPE ignoring the positions argument", "rope", {"test_rope"}, "check_rope", "positions")
def rope_arange(x, positions):
    d, n = x.shape[-1], x.shape[-2]
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


@_add("RoPE adding the sine term but dropping the cosine factor", "rope", {"test_rope"}, "check_rope",
      "norm")
def rope_not_rotation(x, positions):
    d = x.shape[-1]
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    angles = positions.to(torch.float64)[:, None] * inv_freq
    sin = torch.sin(angles).to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 - x2 * sin, x1 * sin + x2], dim=-1).flatten(-2)


# ---- relative_position_index ---------------------------------------------------------------------
@_add("relative index not offset (negative indices wrap around)", "relative_position_index", INDEX,
      "check_relative_position_index", "negative")
def index_no_offset(n, max_len):
    pos = torch.arange(n)
    return pos[:, None] - pos[None, :]


@_add("relative index offset by n - 1 instead of max_len - 1", "relative_position_index", INDEX,
      "check_relative_position_index", "max_len - 1")
def index_offset_n(n, max_len):
    pos = torch.arange(n)
    return pos[:, None] - pos[None, :] + n - 1


@_add("relative index j - i instead of i - j", "relative_position_index", INDEX,
      "check_relative_position_index", "i - j")
def index_key_minus_query(n, max_len):
    pos = torch.arange(n)
    return pos[None, :] - pos[:, None] + max_len - 1


# ---- RelativePositionBias.forward -----------------------------------------------------------------
@_add("bias with heads last (not permuted)", "relative_position_bias", {"test_relative_position_bias"},
      "check_relative_position_bias", "heads")
def bias_heads_last(self, scores):
    n = scores.shape[-1]
    bias = self.table[relative_position_index(n, self.max_len)]
    return scores + bias.reshape(bias.shape[-1], n, n)


@_add("one bias shared by all heads", "relative_position_bias", {"test_relative_position_bias"},
      "check_relative_position_bias", "own")
def bias_shared(self, scores):
    n = scores.shape[-1]
    return scores + self.table[relative_position_index(n, self.max_len)][..., 0]


# ---- RoPE past the trained length: interpolated_inv_freq, ntk_inv_freq, yarn_inv_freq ---------------------
@_add("interpolation multiplying the frequencies by s", "interpolated_inv_freq", {"test_interpolated_inv_freq"},
      "check_interpolated_inv_freq", "multiplied the frequencies by s")
def interpolated_times_factor(d, factor, base=10000.0):
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d) * factor


@_add("interpolation by the base times s", "interpolated_inv_freq", {"test_interpolated_inv_freq"},
      "check_interpolated_inv_freq", "multiplied the base by s")
def interpolated_base_times_factor(d, factor, base=10000.0):
    return (base * factor) ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


@_add("interpolation in float32", "interpolated_inv_freq", {"test_interpolated_inv_freq"},
      "check_interpolated_inv_freq", "float64")
def interpolated_float32(d, factor, base=10000.0):
    return base ** (-torch.arange(0, d, 2, dtype=torch.float32) / d) / factor


@_add("NTK as position interpolation", "ntk_inv_freq", {"test_ntk_inv_freq"}, "check_ntk_inv_freq",
      "position interpolation")
def ntk_as_interpolation(d, factor, base=10000.0):
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d) / factor


@_add("NTK with the base times s", "ntk_inv_freq", {"test_ntk_inv_freq"}, "check_ntk_inv_freq",
      "multiplied the base by s")
def ntk_base_times_factor(d, factor, base=10000.0):
    return (base * factor) ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


@_add("NTK with the exponent (d - 2) / d", "ntk_inv_freq", {"test_ntk_inv_freq"}, "check_ntk_inv_freq",
      "not (d - 2) / d")
def ntk_inverse_exponent(d, factor, base=10000.0):
    return (base * factor ** ((d - 2) / d)) ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


YARN = {"test_yarn_inv_freq"}


@_add("YaRN's ramp reversed", "yarn_inv_freq", YARN, "check_yarn_inv_freq", "wrong way")
def yarn_reversed(d, factor, original_max, base=10000.0, beta_fast=32.0, beta_slow=1.0):
    import math
    low = max(math.floor(d * math.log(original_max / (beta_fast * 2 * math.pi)) / (2 * math.log(base))), 0)
    high = min(math.ceil(d * math.log(original_max / (beta_slow * 2 * math.pi)) / (2 * math.log(base))), d - 1)
    if low == high:
        high += 0.001
    keep = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    w = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    return w * keep + (w / factor) * (1 - keep), 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


@_add("YaRN's ramp ends not rounded", "yarn_inv_freq", YARN, "check_yarn_inv_freq", "rounded outwards")
def yarn_exact_ends(d, factor, original_max, base=10000.0, beta_fast=32.0, beta_slow=1.0):
    import math
    low = d * math.log(original_max / (beta_fast * 2 * math.pi)) / (2 * math.log(base))
    high = d * math.log(original_max / (beta_slow * 2 * math.pi)) / (2 * math.log(base))
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    w = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    return w * (1 - ramp) + (w / factor) * ramp, 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


@_add("YaRN counting turns over s times the trained length", "yarn_inv_freq", YARN, "check_yarn_inv_freq",
      "not over s * original_max")
def yarn_new_length(d, factor, original_max, base=10000.0, beta_fast=32.0, beta_slow=1.0):
    import math
    span = factor * original_max
    low = max(math.floor(d * math.log(span / (beta_fast * 2 * math.pi)) / (2 * math.log(base))), 0)
    high = min(math.ceil(d * math.log(span / (beta_slow * 2 * math.pi)) / (2 * math.log(base))), d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    w = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    return w * (1 - ramp) + (w / factor) * ramp, 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


@_add("YaRN's attention factor as its square root", "yarn_inv_freq", YARN, "check_yarn_inv_freq", "its square")
def yarn_scale_unsquared(d, factor, original_max, base=10000.0, beta_fast=32.0, beta_slow=1.0):
    import math
    low = max(math.floor(d * math.log(original_max / (beta_fast * 2 * math.pi)) / (2 * math.log(base))), 0)
    high = min(math.ceil(d * math.log(original_max / (beta_slow * 2 * math.pi)) / (2 * math.log(base))), d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    w = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    return w * (1 - ramp) + (w / factor) * ramp, math.sqrt(0.1 * math.log(factor) + 1.0)


@_add("YaRN's attention factor inverted", "yarn_inv_freq", YARN, "check_yarn_inv_freq", "not flatter")
def yarn_scale_inverse(d, factor, original_max, base=10000.0, beta_fast=32.0, beta_slow=1.0):
    import math
    low = max(math.floor(d * math.log(original_max / (beta_fast * 2 * math.pi)) / (2 * math.log(base))), 0)
    high = min(math.ceil(d * math.log(original_max / (beta_slow * 2 * math.pi)) / (2 * math.log(base))), d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    w = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    return w * (1 - ramp) + (w / factor) * ramp, 1 / (0.1 * math.log(factor) + 1.0)
