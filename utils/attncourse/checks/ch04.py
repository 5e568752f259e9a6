"""Visible checks for chapter 04: positional encoding."""

import torch

from ._core import (call, close, dtypes_and_gradients, expect_tensor, fail, load_cases, load_weights, max_error,
                    module_dtypes, ok, require_callable, tensor)

def _data():
    return load_cases("ch04")


def check_sinusoidal_table(fn):
    """Check sinusoidal_table(n_positions, d_model) -> float64 [n_positions, d_model]."""
    require_callable(fn, "sinusoidal_table")
    pe = expect_tensor(call(fn, 6, 8, what="sinusoidal_table(6, 8)"), "sinusoidal_table(6, 8)", shape=(6, 8))
    if pe.dtype != torch.float64:
        fail(f"sinusoidal_table should return float64 (compute the angles in float64), got {pe.dtype}")
    expected = tensor(_data()["sinusoidal_6_8"])
    if close(pe, expected):
        if pe.abs().max() > 1 + 1e-12:
            fail("values must lie in [-1, 1]")
        ok("sinusoidal table: sin on even, cos on odd dimensions, frequencies 1 / 10000^(2i/d)")
        return
    wrong = {k: tensor(v) for k, v in _data()["sinusoidal_mistakes"].items()}
    if close(pe, wrong["halves"]):
        fail("you put all the sines in the first half and all the cosines in the second half; the formula "
             "interleaves them: sin in dimension 2i, cos in dimension 2i+1 (table[:, 0::2] and table[:, 1::2])")
    if close(pe, wrong["swapped"]):
        fail("sin and cos are swapped: dimension 2i (even) holds sin, dimension 2i+1 (odd) holds cos")
    if close(pe, wrong["per_dim"]):
        fail("wrong exponent: dimensions 2i and 2i+1 share one frequency 1 / 10000^(2i/d), with i the pair "
             "index (0 .. d/2 - 1); you gave every dimension its own frequency")
    if close(pe, wrong["from_1"]):
        fail("positions start at 0: the first row (position 0) is [0, 1, 0, 1, ...]")
    if close(pe[0], torch.tensor([0.0, 1.0] * 4, dtype=torch.float64)) and close(pe[:, 0], torch.sin(torch.arange(6.0)).double()):
        fail(f"the first pair is right but later pairs are not (max error {max_error(pe, expected):.3g}): "
             "the frequency of pair i is 1 / 10000^(2i/d_model)")
    fail(f"sinusoidal_table(6, 8) differs from the formula (max error {max_error(pe, expected):.3g}); "
         "PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d))")


def check_shift_matrix(fn):
    """Check shift_matrix(k, d_model): PE(pos + k) = M_k @ PE(pos)."""
    require_callable(fn, "shift_matrix")
    m = expect_tensor(call(fn, 3, 8, what="shift_matrix(3, 8)"), "shift_matrix(3, 8)", shape=(8, 8))
    if m.dtype != torch.float64:
        fail(f"shift_matrix should return float64, got {m.dtype}")
    expected = tensor(_data()["shift_3_8"])
    pe = tensor(_data()["sinusoidal_12_8"])
    moved = pe[:9] @ m.T                         # row pos: (M_k @ PE(pos))^T
    if close(m, expected):
        if not close(moved, pe[3:], 1e-9):
            fail("M_3 is right but PE(pos + 3) != M_3 @ PE(pos) with your table: check sinusoidal_table")
        ok("shift_matrix: M_3 @ PE(pos) = PE(pos + 3) for every pos, and M_k is a rotation (M_k^T M_k = I)")
        return
    if close(m, expected.T):
        fail("your M_k is transposed: it shifts by -k (M_k @ PE(pos) = PE(pos - k)). Acting on (sin a, cos a), "
             "the block is [[cos b, sin b], [-sin b, cos b]]")
    if not close(m.T @ m, torch.eye(8, dtype=torch.float64), 1e-9):
        fail("M_k must be a rotation (each 2x2 block [[cos b, sin b], [-sin b, cos b]], so M_k^T M_k = I); yours "
             "is not: check the signs (sin(a + b) = sin a cos b + cos a sin b, cos(a + b) = cos a cos b - sin a sin b)")
    fail(f"shift_matrix(3, 8) differs from the expected one (max error {max_error(m, expected):.3g}); "
         "block i uses b = k * w_i; row k of sinusoidal_table holds sin(k w_i) and cos(k w_i)")


def check_learned_positional_embedding(cls):
    """Check LearnedPositionalEmbedding(max_len, d_model): forward(x) = x + embedding.weight[:N]."""
    c = _data()["learned"]
    require_callable(cls, "LearnedPositionalEmbedding", kind="class")
    module = call(cls, **c["init"], what="LearnedPositionalEmbedding(max_len=5, d_model=3)")
    if not isinstance(module, torch.nn.Module):
        fail("LearnedPositionalEmbedding(...) should build a torch.nn.Module")
    module = module.double()
    load_weights(module, c["state"], "LearnedPositionalEmbedding")
    x = tensor(c["x"])
    y = expect_tensor(call(module, x, what="LearnedPositionalEmbedding.forward(x)"), "output", shape=(2, 4, 3))
    y = y.detach()
    weight = tensor(c["state"]["embedding.weight"])
    if close(y, tensor(c["output"])):
        ok("learned positional embedding: x + P[0:N], one row per position")
        module_dtypes(module, [x], "LearnedPositionalEmbedding.forward(x)")
        ok("in float32 it returns float32 and agrees with float64")
        return
    if close(y, weight[:4].expand(2, 4, 3)):
        fail("you returned the position embeddings only: add them to x (x + P[:N])")
    if close(y, x + weight[1:5]):
        fail("the first position must use row 0 of the table: positions are 0 .. N-1")
    fail(f"output differs from x + embedding.weight[:N] (max error {max_error(y, tensor(c['output'])):.3g})")


def check_rope(fn):
    """Check apply_rope(x, positions): values, norms preserved, q_m . k_n depends only on m - n."""
    require_callable(fn, "apply_rope")
    c = _data()["rope"]
    x, positions = tensor(c["x"]), torch.tensor(c["positions"])
    y = expect_tensor(call(fn, x, positions, what="apply_rope(x, positions)"), "apply_rope(x, positions)",
                      shape=(3, 6), dtype=torch.float64)
    if not close(y.norm(dim=-1), x.norm(dim=-1), 1e-9):
        fail("RoPE must preserve every vector's norm (it is a rotation); yours changes it. Each pair becomes "
             "(x1 cos - x2 sin, x1 sin + x2 cos)")
    wrong = {k: tensor(v) for k, v in c["mistakes"].items()}
    if close(y, wrong["halves"]):
        fail("you rotated pairs (x[i], x[i + d/2]) (the 'rotate half' layout); this course pairs adjacent "
             "dimensions (x[2i], x[2i+1]), like the sinusoidal table")
    if close(y, wrong["reversed"]):
        fail("wrong direction: you rotated by -pos * w_i. (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos)")
    if close(y, wrong["positions_ignored"]):
        fail("you ignored the positions argument (used 0 .. N-1); rotate row n by positions[n] * w_i")
    if not close(y, tensor(c["output"])):
        fail(f"apply_rope differs from the expected values (max error {max_error(y, tensor(c['output'])):.3g}); "
             "pair i rotates by positions[n] * 10000^(-2i/d)")
    ok("RoPE: fixed case matches and norms are preserved")
    dtypes_and_gradients(fn, [x, positions], "apply_rope(x, positions)", grad_args=(0,))
    ok("RoPE keeps float32 and float64, and gradients flow back to x")
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 8, generator=g, dtype=torch.float64), torch.randn(1, 8, generator=g, dtype=torch.float64)
    dots = []
    for m, n in [(3, 1), (10, 8), (57, 55)]:
        qm = call(fn, q, torch.tensor([m]), what="apply_rope on one query")
        kn = call(fn, k, torch.tensor([n]), what="apply_rope on one key")
        dots.append(float((qm * kn).sum()))
    if max(dots) - min(dots) > 1e-9:
        fail(f"q_m . k_n should depend only on m - n; for m - n = 2 you got {dots}")
    ok(f"RoPE: q_m . k_n = {dots[0]:.4f} for (m, n) = (3, 1), (10, 8), (57, 55): only m - n matters")


def check_relative_position_index(fn):
    """Check relative_position_index(n, max_len) -> int64 [n, n], entry (i, j) = i - j + max_len - 1."""
    require_callable(fn, "relative_position_index")
    idx = expect_tensor(call(fn, 3, 4, what="relative_position_index(3, 4)"), "relative_position_index(3, 4)",
                        shape=(3, 3))
    if idx.dtype != torch.int64:
        fail(f"the index should be an int64 tensor (it indexes the table), got {idx.dtype}")
    expected = torch.tensor(_data()["relative_index_3_4"])
    if bool((idx == expected).all()):
        ok("relative position index: i - j + max_len - 1, all in [0, 2 max_len - 2]")
        return
    if bool((idx < 0).any()):
        fail("your index has negative entries: i - j runs from -(max_len-1) to max_len-1, so add max_len - 1. "
             "Negative indices do not raise in PyTorch: they silently read rows from the end of the table")
    if bool((idx == expected - 1).all()):
        fail("offset by n - 1; use max_len - 1: the row for distance 0 must not move when N changes")
    if bool((idx == expected.T).all()):
        fail("you computed j - i; the convention here is i - j (query position minus key position)")
    fail(f"relative_position_index(3, 4) should be\n{expected}\ngot\n{idx}")


def check_relative_position_bias(cls):
    """Check RelativePositionBias(max_len, n_heads): forward(scores) = scores + B."""
    c = _data()["bias"]
    require_callable(cls, "RelativePositionBias", kind="class")
    module = call(cls, **c["init"], what="RelativePositionBias(max_len=4, n_heads=2)")
    if not isinstance(module, torch.nn.Module):
        fail("RelativePositionBias(...) should build a torch.nn.Module")
    module = module.double()
    load_weights(module, c["state"], "RelativePositionBias")
    scores = tensor(c["scores"])
    out = expect_tensor(call(module, scores, what="RelativePositionBias.forward(scores)"), "output", shape=(2, 3, 3))
    out = out.detach()
    expected = tensor(c["output"])
    if close(out, expected):
        ok("relative position bias: B[h, i, j] = table[i - j + max_len - 1, h], added to every head's scores")
        module_dtypes(module, [scores], "RelativePositionBias.forward(scores)")
        ok("in float32 it returns float32 and agrees with float64")
        return
    bias = out - scores
    if close(bias[0], bias[1]):
        fail("every head got the same bias: each head has its own column of the table (B[h] = table[index, h])")
    if close(bias.flatten(), (expected - scores).permute(1, 2, 0).flatten()):
        fail("the table lookup gives [N, N, heads]: permute it to [heads, N, N] (a reshape mixes heads and "
             "positions)")
    fail(f"output differs from scores + B (max error {max_error(out, expected):.3g})")


# ---- RoPE past the trained length (section 4.8): d = 16 and s = 4, the page's model's heads ----
STORED = 1e-9        # the stored frequencies keep 10 decimals; every known mistake is off by far more


def _frequencies(fn, name, args, what):
    require_callable(fn, name)
    w = expect_tensor(call(fn, *args, what=what), what, shape=(args[0] // 2,))
    if w.dtype != torch.float64:
        fail(f"{name} should return float64 frequencies (compute them in float64), got {w.dtype}")
    return w


def check_interpolated_inv_freq(fn):
    """Check interpolated_inv_freq(d, factor, base=10000.0) -> float64 [d/2]: every frequency divided by s."""
    c = _data()["scaling"]
    w = _frequencies(fn, "interpolated_inv_freq", (16, 4.0), "interpolated_inv_freq(16, 4.0)")
    wrong = {k: tensor(v) for k, v in c["mistakes"].items()}
    if close(w, wrong["times_factor"], atol=STORED):
        fail("you multiplied the frequencies by s; reading position m as m / s divides every frequency by s")
    if close(w, wrong["base_times_factor"], atol=STORED):
        fail("you multiplied the base by s, which slows the pairs unevenly; position interpolation divides "
             "every frequency by s: w_i / s")
    if not close(w, tensor(c["interpolated"]), atol=STORED):
        fail(f"interpolated_inv_freq(16, 4.0) differs from the expected values (max error "
             f"{max_error(w, tensor(c['interpolated'])):.3g}); it is 10000^(-2i/d) / s for i = 0 .. d/2 - 1")
    ok("position interpolation: every frequency divided by s")


def check_ntk_inv_freq(fn):
    """Check ntk_inv_freq(d, factor, base=10000.0) -> float64 [d/2]: the base raised to base * s^(d/(d-2))."""
    c = _data()["scaling"]
    w = _frequencies(fn, "ntk_inv_freq", (16, 4.0), "ntk_inv_freq(16, 4.0)")
    wrong = {k: tensor(v) for k, v in c["mistakes"].items()}
    if close(w, tensor(c["interpolated"]), atol=STORED):
        fail("that is position interpolation (every frequency divided by s); NTK-aware scaling changes the base "
             "instead, to base * s^(d / (d - 2)), so the fastest pair keeps its frequency")
    if close(w, wrong["base_times_factor"], atol=STORED):
        fail("you multiplied the base by s; the exponent d / (d - 2) is what makes the slowest pair slow down "
             "by exactly s: base * s^(d / (d - 2))")
    if close(w, wrong["ntk_inverse_exponent"], atol=STORED):
        fail("the exponent is d / (d - 2), not (d - 2) / d: base * s^(d / (d - 2))")
    if not close(w, tensor(c["ntk"]), atol=STORED):
        fail(f"ntk_inv_freq(16, 4.0) differs from the expected values (max error "
             f"{max_error(w, tensor(c['ntk'])):.3g}); use base * s^(d / (d - 2)) in place of the base")
    ok(f"NTK-aware scaling: the fastest pair keeps w_0 = {float(w[0]):g}, the slowest is divided by "
       f"{float(tensor(c['interpolated'])[-1] * 4.0 / w[-1]):.3g}")


def check_yarn_inv_freq(fn):
    """Check yarn_inv_freq(d, factor, original_max, ...) -> (float64 [d/2], attention factor)."""
    c = _data()["scaling"]
    require_callable(fn, "yarn_inv_freq")
    out = call(fn, 16, 4.0, 64, what="yarn_inv_freq(16, 4.0, 64)")
    if not isinstance(out, tuple) or len(out) != 2:
        fail("yarn_inv_freq should return a pair: (frequencies, attention factor)")
    w = expect_tensor(out[0], "yarn_inv_freq(16, 4.0, 64)[0]", shape=(8,))
    if w.dtype != torch.float64:
        fail(f"yarn_inv_freq should return float64 frequencies (compute them in float64), got {w.dtype}")
    scale = float(out[1])
    wrong = {k: tensor(v) if not isinstance(v, float) else v for k, v in c["mistakes"].items()}
    if close(w, wrong["yarn_reversed"], atol=STORED):
        fail("the ramp runs the wrong way: pairs that turn many times over the trained length keep their "
             "frequency, and pairs that turn less than once are interpolated (divided by s)")
    if close(w, tensor(c["interpolated"]), atol=STORED):
        fail("every frequency is divided by s (position interpolation); YaRN keeps the pairs that turn more than "
             "beta_fast times over original_max and ramps between the two ends")
    w2 = expect_tensor(call(fn, 64, 8.0, 2048, what="yarn_inv_freq(64, 8.0, 2048)")[0],
                       "yarn_inv_freq(64, 8.0, 2048)[0]", shape=(32,))
    if close(w2, wrong["yarn_exact_ends"], atol=STORED):
        fail("the ramp's ends are pair indices rounded outwards: floor the beta_fast end and ceil the beta_slow "
             "end (YaRN's code and Hugging Face do), then clamp them to [0, d - 1]")
    if close(w2, wrong["yarn_new_length"], atol=STORED):
        fail("count a pair's turns over the trained length original_max, not over s * original_max: the ramp "
             "asks which angles training has seen")
    if not close(w, tensor(c["yarn"]), atol=STORED):
        fail(f"yarn_inv_freq(16, 4.0, 64) differs from the expected frequencies (max error "
             f"{max_error(w, tensor(c['yarn'])):.3g})")
    if not close(w2, tensor(c["yarn_2048"]), atol=STORED):
        fail(f"yarn_inv_freq(64, 8.0, 2048) differs from the expected frequencies (max error "
             f"{max_error(w2, tensor(c['yarn_2048'])):.3g})")
    if abs(scale - wrong["scale_unsquared"]) < 1e-9:
        fail("the attention factor is 0.1 ln s + 1 itself: it multiplies both the queries and the keys, so the "
             "logits grow by its square")
    if abs(scale - wrong["scale_inverse"]) < 1e-9:
        fail("the attention factor is 0.1 ln s + 1, above 1: the logits get sharper at longer contexts, not flatter")
    if abs(scale - c["yarn_scale"]) > 1e-9:
        fail(f"the attention factor for s = 4 should be 0.1 ln 4 + 1 = {c['yarn_scale']:.6f}, got {scale:.6f}")
    ok(f"YaRN: fast pairs kept, slow pairs interpolated, a ramp between; attention factor {scale:.4f} for s = 4")
