"""Hidden tests for chapter 04: positional encoding."""
import numpy as np
import torch

from .. import positional as ref
from . import function_case, hidden_test, module_case

# RoPE in float32: a learner who computes the angles in float32 differs by about |angle| * 6e-8.
ROPE_TOL = {np.dtype("float32"): (1e-4, 5e-5)}


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


def _tensor(rng, shape, dtype, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape) * scale).to(dtype)


@hidden_test("ch04.sinusoidal_table")
def sinusoidal_table(rng):
    cases = [function_case(ref.sinusoidal_table, [1, 2]), function_case(ref.sinusoidal_table, [4, 2])]
    for i in range(6):
        n, d = int(rng.integers(1, 60)), 2 * int(rng.integers(1, 17))
        cases.append(function_case(ref.sinusoidal_table, [n, d]))
    return cases


@hidden_test("ch04.shift_matrix")
def shift_matrix(rng):
    cases = [function_case(ref.shift_matrix, [0, 4]), function_case(ref.shift_matrix, [1, 2])]
    for i in range(6):
        k, d = int(rng.integers(1, 40)), 2 * int(rng.integers(1, 13))
        cases.append(function_case(ref.shift_matrix, [k, d]))
    return cases


@hidden_test("ch04.learned_positional_embedding")
def learned_positional_embedding(rng):
    cases = []
    for i in range(6):
        init = {"max_len": int(rng.integers(2, 20)), "d_model": int(rng.integers(1, 10))}
        dtype = [torch.float32, torch.float64][i % 2]
        module = ref.LearnedPositionalEmbedding(**init).to(dtype)
        n = int(rng.integers(1, init["max_len"] + 1)) if i else init["max_len"]
        lead = [(), (2,), (3, 2)][i % 3]
        x = _tensor(rng, lead + (n, init["d_model"]), dtype)
        cases.append(module_case(module, init, [x]))
    return cases


@hidden_test("ch04.rope")
def rope(rng):
    cases = []
    for i in range(8):
        d = 2 * int(rng.integers(1, 9))
        n = int(rng.integers(1, 12))
        lead = [(), (2,), (2, 3)][i % 3]
        dtype = [torch.float32, torch.float64][i % 2]
        x = _tensor(rng, lead + (n, d), dtype)
        if i % 2:
            positions = torch.from_numpy(rng.integers(0, 200, size=n))
        else:
            positions = torch.arange(n)
        cases.append(function_case(ref.apply_rope, [x, positions], tol=ROPE_TOL))
    return cases


@hidden_test("ch04.relative_position_index")
def relative_position_index(rng):
    cases = [function_case(ref.relative_position_index, [1, 1]), function_case(ref.relative_position_index, [3, 3])]
    for _ in range(4):
        max_len = int(rng.integers(2, 16))
        cases.append(function_case(ref.relative_position_index, [int(rng.integers(1, max_len)), max_len]))
    return cases


@hidden_test("ch04.relative_position_bias")
def relative_position_bias(rng):
    cases = []
    for i in range(6):
        init = {"max_len": int(rng.integers(3, 12)), "n_heads": int(rng.integers(1, 5))}
        dtype = [torch.float32, torch.float64][i % 2]
        module = ref.RelativePositionBias(**init).to(dtype)
        with torch.no_grad():
            module.table.copy_(_tensor(rng, tuple(module.table.shape), dtype))
        n = int(rng.integers(1, init["max_len"]))
        lead = [(), (2,), (2, 1)][i % 3]
        scores = _tensor(rng, lead + (init["n_heads"], n, n), dtype)
        cases.append(module_case(module, init, [scores]))
    return cases


# ---- RoPE past the trained length: frequencies as float64 [d/2] (and YaRN's attention factor) ----
def _scaling_settings(rng, i):
    """(d, factor, base): head sizes from 4 to 128, factors whole and not, from 1 (no scaling) to 40."""
    d = [8, 16, 64, 128, 4, 32, 96, 24, 48, 128][i % 10] if i < 10 else 2 * int(rng.integers(2, 65))
    factor = 1.0 if i == 0 else float(_pick(rng, [2.0, 4.0, 8.0, 16.0, 32.0])) if i % 2 else float(rng.uniform(1.2, 40.0))
    base = float(_pick(rng, [10000.0, 500000.0, 1000000.0, 100.0])) if i > 1 else 10000.0
    return d, factor, base


@hidden_test("ch04.interpolated_inv_freq")
def interpolated_inv_freq(rng):
    return [function_case(ref.interpolated_inv_freq, list(_scaling_settings(rng, i))) for i in range(8)]


@hidden_test("ch04.ntk_inv_freq")
def ntk_inv_freq(rng):
    return [function_case(ref.ntk_inv_freq, list(_scaling_settings(rng, i))) for i in range(8)]


@hidden_test("ch04.yarn_inv_freq")
def yarn_inv_freq(rng):
    cases = []
    for i in range(12):
        d, factor, base = _scaling_settings(rng, i)
        original = int(_pick(rng, [32, 64, 512, 2048, 4096, 8192])) if i else 64
        kwargs = {"beta_fast": float(_pick(rng, [8.0, 16.0, 64.0])), "beta_slow": float(_pick(rng, [0.5, 2.0]))} \
            if i % 4 == 3 else {}
        cases.append(function_case(ref.yarn_inv_freq, [d, factor, original, base], kwargs))
    return cases


# Known mistakes, computed here so the visible checks can recognise them from stored values
# (learner-side code must not contain the formulas themselves).
def _mistaken_table(pos, d, first=0, sin_even=True, halves=False, per_dim=False):
    p = torch.arange(first, first + pos, dtype=torch.float64)[:, None]
    if per_dim:
        ang = p / 10000.0 ** (2 * torch.arange(d, dtype=torch.float64) / d)
        t = torch.sin(ang)
        t[:, 1::2] = torch.cos(ang[:, 1::2])
        return t
    ang = p * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    s, c = (torch.sin(ang), torch.cos(ang)) if sin_even else (torch.cos(ang), torch.sin(ang))
    if halves:
        return torch.cat([s, c], dim=-1)
    return torch.stack([s, c], dim=-1).flatten(-2)


def _mistaken_rope(x, positions, halves=False, sign=1.0):
    d = x.shape[-1]
    ang = positions.double()[:, None] * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = torch.cos(ang), sign * torch.sin(ang)
    if halves:
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


def _mistaken_yarn(d, factor, original, base=10000.0, reverse=False, exact_ends=False, turns_over=None,
                   scale=None):
    """YaRN with one of its known mistakes (the visible check names each)."""
    import math
    span = turns_over or original

    def pair_turning(times):
        return d * math.log(span / (times * 2 * math.pi)) / (2 * math.log(base))
    low, high = pair_turning(32.0), pair_turning(1.0)
    if not exact_ends:
        low, high = max(math.floor(low), 0), min(math.ceil(high), d - 1)
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    if reverse:
        ramp = 1 - ramp
    w = ref.rope_inv_freq(d, base)
    return w * (1 - ramp) + (w / factor) * ramp, (0.1 * math.log(factor) + 1.0 if scale is None else scale)


def check_data():
    """Fixed cases for the visible checks (tools/make_check_data.py writes them)."""
    import math
    torch.manual_seed(0)
    pe = ref.sinusoidal_table(6, 8)
    emb = ref.LearnedPositionalEmbedding(5, 3).double()
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    rope_x = torch.randn(3, 6, dtype=torch.float64)
    rope_pos = torch.tensor([0, 1, 5])
    rb = ref.RelativePositionBias(4, 2).double()
    with torch.no_grad():
        rb.table.copy_(torch.arange(14, dtype=torch.float64).reshape(7, 2))
    scores = torch.randn(2, 3, 3, dtype=torch.float64)
    return {
        "sinusoidal_6_8": pe,
        "sinusoidal_12_8": ref.sinusoidal_table(12, 8),
        "sinusoidal_mistakes": {"halves": _mistaken_table(6, 8, halves=True),
                                "swapped": _mistaken_table(6, 8, sin_even=False),
                                "per_dim": _mistaken_table(6, 8, per_dim=True),
                                "from_1": _mistaken_table(6, 8, first=1)},
        "shift_3_8": ref.shift_matrix(3, 8),
        "learned": {"init": {"max_len": 5, "d_model": 3}, "state": dict(emb.state_dict()), "x": x,
                    "output": emb(x)},
        "rope": {"x": rope_x, "positions": rope_pos, "output": ref.apply_rope(rope_x, rope_pos),
                 "mistakes": {"halves": _mistaken_rope(rope_x, rope_pos, halves=True),
                              "reversed": _mistaken_rope(rope_x, rope_pos, sign=-1.0),
                              "positions_ignored": _mistaken_rope(rope_x, torch.arange(3))}},
        "relative_index_3_4": ref.relative_position_index(3, 4),
        # d = 16, s = 4, base 10000 (YaRN: trained on 64 positions): the page's model's heads
        "scaling": {
            "interpolated": ref.interpolated_inv_freq(16, 4.0), "ntk": ref.ntk_inv_freq(16, 4.0),
            "yarn": ref.yarn_inv_freq(16, 4.0, 64)[0], "yarn_scale": ref.yarn_inv_freq(16, 4.0, 64)[1],
            "yarn_2048": ref.yarn_inv_freq(64, 8.0, 2048)[0],
            "mistakes": {
                "times_factor": ref.rope_inv_freq(16) * 4.0, "base_times_factor": ref.rope_inv_freq(16, 40000.0),
                "ntk_inverse_exponent": ref.rope_inv_freq(16, 10000.0 * 4.0 ** (14 / 16)),
                "yarn_reversed": _mistaken_yarn(16, 4.0, 64, reverse=True)[0],
                "yarn_exact_ends": _mistaken_yarn(64, 8.0, 2048, exact_ends=True)[0],
                "yarn_new_length": _mistaken_yarn(64, 8.0, 2048, turns_over=8 * 2048)[0],
                "scale_unsquared": math.sqrt(0.1 * math.log(4.0) + 1.0),
                "scale_inverse": 1 / (0.1 * math.log(4.0) + 1.0)}},
        "bias": {"init": {"max_len": 4, "n_heads": 2}, "state": dict(rb.state_dict()), "scores": scores,
                 "output": rb(scores)},
    }
