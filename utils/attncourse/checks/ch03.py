"""Visible checks for chapter 03: multi-head attention and its cost."""

import torch

from ..memory import peak_memory
from .ch02 import SDPA_ALLOWED, SDPA_BUILTINS
from ._core import (LargestTensor, build_module, call, close, dtypes_and_gradients, expect_pair, expect_tensor, fail,
                    forbidding, load_cases, max_error, module_dtypes, ok, require_callable, tensor)

# From scratch: the built-ins these exercises re-implement (the hidden tests forbid the same).
MHA_BUILTINS = ("torch.nn.MultiheadAttention", "torch.nn.functional.multi_head_attention_forward",
                "aten::multi_head_attention_forward", "aten::_native_multi_head_attention")
TILED_BUILTINS = SDPA_BUILTINS
TILED_ALLOWED = SDPA_ALLOWED | {"aten::logsumexp"}     # a tile's softmax may be PyTorch's

def _data():
    return load_cases("ch03")


def _full_attention(q, k, v, mask=None):
    # PyTorch's own kernel: the target for tiled attention, without spelling out chapter 02's exercise here.
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def check_split_heads(fn):
    """Check split_heads(x [..., N, D], n_heads) -> [..., H, N, D/H]."""
    require_callable(fn, "split_heads")
    c = _data()["split"]
    x, expected = tensor(c["x"]), tensor(c["heads"])          # x: [2, 3, 8] (B = 2, N = 3, D = 8), H = 2
    got = expect_tensor(call(fn, x, 2, what="split_heads(x, 2)"), "split_heads(x [2, 3, 8], 2)", shape=(2, 2, 3, 4))
    if close(got, expected):
        ok("split_heads: [B, N, D] -> [B, H, N, D/H], head h holds features h*D_H .. (h+1)*D_H - 1")
        dtypes_and_gradients(fn, [x, 2], "split_heads(x, 2)", grad_args=(0,))
        ok("split_heads keeps float32 and float64, and gradients flow back")
        return
    if close(got, x.reshape(2, 2, 3, 4)):
        fail("you reshaped [B, N, D] straight to [B, H, N, D_H]: that mixes tokens across heads. Reshape to "
             "[B, N, H, D_H] first, then transpose the N and H axes (transpose(-3, -2))")
    if close(got, x.reshape(2, 3, 4, 2).permute(0, 3, 1, 2)):
        fail("your heads take every H-th feature; each head must own a contiguous slice of D_H features: "
             "reshape to [..., N, H, D_H] (not [..., N, D_H, H])")
    fail(f"split_heads differs from the expected result (max error {max_error(got, expected):.3g})")


def check_merge_heads(fn):
    """Check merge_heads(x [..., H, N, D_H]) -> [..., N, H * D_H], the inverse of split_heads."""
    require_callable(fn, "merge_heads")
    c = _data()["split"]
    x, heads = tensor(c["x"]), tensor(c["heads"])
    got = expect_tensor(call(fn, heads, what="merge_heads(heads)"), "merge_heads(heads [2, 2, 3, 4])", shape=(2, 3, 8))
    if close(got, x):
        ok("merge_heads undoes split_heads: heads concatenated along the features, head 0 first")
        dtypes_and_gradients(fn, [heads], "merge_heads(heads)", grad_args=(0,))
        ok("merge_heads keeps float32 and float64, and gradients flow back")
        return
    if close(got, heads.reshape(2, 3, 8)):
        fail("you reshaped [B, H, N, D_H] straight to [B, N, D]: transpose H and N first "
             "(transpose(-3, -2)), then reshape")
    if close(got, heads.permute(0, 2, 3, 1).reshape(2, 3, 8)):
        fail("your features are interleaved across heads; concatenate whole heads, head 0 first: "
             "[B, H, N, D_H] -> [B, N, H, D_H] -> [B, N, H * D_H]")
    fail(f"merge_heads(split_heads(x)) should give x back (max error {max_error(got, x):.3g})")


def check_split_in_proj(fn):
    """Check split_in_proj(in_proj_weight [3D, D], in_proj_bias [3D]) -> (w_q, w_k, w_v, b_q, b_k, b_v)."""
    require_callable(fn, "split_in_proj")
    c = _data()["mha"]
    w, b = tensor(c["in_proj_weight"]), tensor(c["in_proj_bias"])     # D = 8
    out = call(fn, w, b, what="split_in_proj(in_proj_weight, in_proj_bias)")
    if not isinstance(out, (tuple, list)) or len(out) != 6:
        fail("split_in_proj should return six tensors: (w_q, w_k, w_v, b_q, b_k, b_v)")
    blocks, biases = [w[0:8], w[8:16], w[16:24]], [b[0:8], b[8:16], b[16:24]]
    for name, t in zip(["w_q", "w_k", "w_v", "b_q", "b_k", "b_v"], out):
        expect_tensor(t, name, shape=(8, 8) if name[0] == "w" else (8,))
    if all(close(o, e, 0) for o, e in zip(out, blocks + biases)):
        ok("split_in_proj: rows 0..D-1 are W_Q, D..2D-1 W_K, 2D..3D-1 W_V (nn.Linear's [out, in] layout kept)")
        return
    if all(close(o, e.T, 0) for o, e in zip(out[:3], blocks)):
        fail("you transposed the blocks; nn.MultiheadAttention stores them in nn.Linear's [out, in] layout, "
             "exactly what q_proj.weight expects: do not transpose")
    if any(close(o, e, 0) for o, e in zip(out[:3], blocks)) or any(close(out[i], blocks[j], 0)
                                                                for i in range(3) for j in range(3) if i != j):
        fail("the blocks are in the wrong order: in_proj_weight stacks W_Q, W_K, W_V in that order along dim 0")
    fail("split_in_proj should cut in_proj_weight into three [D, D] row blocks (dim 0) and in_proj_bias into three")


def _torch_mha(c):
    """torch.nn.MultiheadAttention holding the same weights (its fused layout: rows Q, K, V)."""
    st = {k: tensor(v) for k, v in c["state"].items()}
    theirs = torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([st["q_proj.weight"], st["k_proj.weight"], st["v_proj.weight"]]))
        theirs.in_proj_bias.copy_(torch.cat([st["q_proj.bias"], st["k_proj.bias"], st["v_proj.bias"]]))
        theirs.out_proj.weight.copy_(st["out_proj.weight"])
        theirs.out_proj.bias.copy_(st["out_proj.bias"])
    return theirs


def check_mha(cls):
    """Check MultiHeadAttention(d_model, n_heads).forward(query, key, value) against torch.nn.MultiheadAttention."""
    c = _data()["mha"]
    module = build_module(cls, c["init"], "MultiHeadAttention", c["state"])
    x = tensor(c["x"])
    with forbidding(MHA_BUILTINS, "MultiHeadAttention"):
        y, w = expect_pair(call(module, x, x, x, what="MultiHeadAttention.forward(x, x, x)"), "MultiHeadAttention.forward")
    expect_tensor(y, "output", shape=(2, 4, 8))
    expect_tensor(w, "weights", shape=(2, 2, 4, 4))
    y, w = y.detach(), w.detach()
    with torch.no_grad():
        ty, tw = _torch_mha(c)(x, x, x, need_weights=True, average_attn_weights=False)
    if close(y, ty) and close(w, tw):
        ok("MultiHeadAttention matches torch.nn.MultiheadAttention (outputs and per-head weights)")
        module_dtypes(module, [x, x, x], "MultiHeadAttention.forward(x, x, x)")
        ok("MultiHeadAttention in float32 returns float32 and agrees with float64")
        return
    if close(y, tensor(c["no_out_proj_output"])):
        fail("you forgot the output projection: return out_proj(merge_heads(...))")
    if close(y, tensor(c["d_model_scale_output"])):
        fail("you divided the scores by sqrt(d_model); each head works in d_head = d_model / n_heads "
             "dimensions, so divide by sqrt(d_head)")
    if not close(w, tw):
        fail(f"your per-head weights [B, H, N_q, N_k] differ from torch's (max error {max_error(w, tw):.3g}): "
             "check split_heads and that q, k, v come from q_proj, k_proj and v_proj")
    fail(f"the weights match but the output differs from torch's (max error {max_error(y, ty):.3g}): "
         "check merge_heads and the output projection")


def check_mha_masks(cls):
    """Check MultiHeadAttention's key_mask (True = real key) and causal arguments."""
    c = _data()["mha"]
    module = build_module(cls, c["init"], "MultiHeadAttention", c["state"])
    x, key_mask = tensor(c["x"]), torch.tensor(c["key_mask"])
    theirs = _torch_mha(c)
    y, w = expect_pair(call(module, x, x, x, key_mask=key_mask, what="forward(x, x, x, key_mask=key_mask)"),
                       "MultiHeadAttention.forward")
    y, w = y.detach(), w.detach()
    blocked = ~key_mask[:, None, None, :].expand_as(w)
    if bool((w[blocked].abs() > 1e-9).any()) and bool((w[~blocked].abs() < 1e-9).all()):
        fail("your key mask is inverted: here True marks a real key that may be attended (the course's "
             "convention). PyTorch's key_padding_mask is the opposite (True = padding): pass ~key_mask to it")
    if bool((w[blocked].abs() > 1e-9).any()):
        fail("padded keys (key_mask False) still get weight: expand key_mask [B, N_k] to [B, 1, 1, N_k] so "
             "it applies to every head and every query, and pass it to the attention")
    with torch.no_grad():
        ty, tw = theirs(x, x, x, key_padding_mask=~key_mask, need_weights=True, average_attn_weights=False)
    if not (close(y, ty) and close(w, tw)):
        fail(f"with key_mask the output differs from torch's (max error {max_error(y, ty):.3g})")
    ok("key_mask: padded keys get weight 0 in every head; matches torch with key_padding_mask=~key_mask")
    y, w = expect_pair(call(module, x, x, x, causal=True, what="forward(x, x, x, causal=True)"),
                       "MultiHeadAttention.forward")
    y, w = y.detach(), w.detach()
    future = torch.ones(4, 4, dtype=torch.bool).triu(1)
    if bool((w[..., future].abs() > 1e-9).any()):
        fail("with causal=True a query still attends to future keys: combine the causal mask (j <= i) with "
             "the key mask")
    with torch.no_grad():
        ty, _ = theirs(x, x, x, attn_mask=future, need_weights=False)
    if not close(y, ty):
        fail(f"with causal=True the output differs from torch's (max error {max_error(y, ty):.3g})")
    ok("causal=True: no query sees the future; matches torch with attn_mask = the upper triangle")


def _numbers(out, what):
    if not isinstance(out, (tuple, list)) or len(out) != 4:
        fail(f"{what} should return four numbers: (QKV projection, Q K^T, A V, output projection)")
    return [int(v) for v in out]


def check_attention_flops(fn):
    """Check attention_flops(n, d, h) -> four FLOP counts."""
    require_callable(fn, "attention_flops")
    c = _data()["cost"]
    for (n, d, h), expected in zip(c["args"], c["flops"]):
        got = _numbers(call(fn, n, d, h, what=f"attention_flops({n}, {d}, {h})"), "attention_flops")
        if got == expected:
            continue
        if [2 * g for g in got] == expected:
            fail("every count is half the expected one: a multiply-add is 2 FLOPs, so an [a x b][b x c] "
                 "product costs 2abc (the factor 2)")
        if got[1] * h == expected[1] and got[0] == expected[0]:
            fail(f"Q K^T and A V: count every head. Each of the H = {h} heads does an [N x D_H][D_H x N] product")
        names = ["QKV projection", "Q K^T", "A V", "output projection"]
        wrong = [nm for nm, g, e in zip(names, got, expected) if g != e]
        fail(f"attention_flops({n}, {d}, {h}): {', '.join(wrong)} wrong; got {got}, expected {expected}")
    ok("attention_flops: 6ND^2 + 2N^2D + 2N^2D + 2ND^2 (a multiply-add = 2 FLOPs)")


def check_attention_memory(fn):
    """Check attention_memory(n, d, h, bytes_per_element=4) against the formula and a measurement."""
    require_callable(fn, "attention_memory")
    c = _data()["cost"]
    for (n, d, h), expected in zip(c["args"], c["memory"]):
        got = _numbers(call(fn, n, d, h, what=f"attention_memory({n}, {d}, {h})"), "attention_memory")
        if got == expected:
            continue
        if [4 * g for g in got] == expected:
            fail("these are element counts: multiply by bytes_per_element (4 for float32) to get bytes")
        if got[1] * h == expected[1]:
            fail(f"the score matrix Q K^T has one N x N table for every head: H N^2 elements (H = {h})")
        fail(f"attention_memory({n}, {d}, {h}) should be {expected}, got {got}")
    eight = _numbers(call(fn, 4, 8, 2, bytes_per_element=8, what="attention_memory(4, 8, 2, bytes_per_element=8)"),
                     "attention_memory")
    if eight != [2 * e for e in c["memory"][0]]:
        fail("bytes_per_element is ignored: float64 takes 8 bytes per element")
    ok("attention_memory matches the formulas")
    # And against what PyTorch really allocates (float32, one sequence).
    n, d, h = 512, 64, 4
    got = _numbers(call(fn, n, d, h, what=f"attention_memory({n}, {d}, {h})"), "attention_memory")
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(n, d, generator=g), torch.randn(d, 3 * d, generator=g)
    q, k = torch.randn(h, n, d // h, generator=g), torch.randn(h, n, d // h, generator=g)
    _, qkv_bytes = peak_memory(torch.matmul, x, w)
    _, score_bytes = peak_memory(lambda: q @ k.transpose(-2, -1))
    for name, predicted, measured in [("QKV projection", got[0], qkv_bytes), ("Q K^T", got[1], score_bytes)]:
        if abs(predicted - measured) > 0.05 * measured:
            fail(f"{name}: you predict {predicted:,} bytes, PyTorch allocated {measured:,}")
    ok(f"measured with the profiler: QKV {qkv_bytes:,} B and scores {score_bytes:,} B, as predicted")


def _tiled_call(fn, q, k, v, bs, causal):
    kw = {"causal": True} if causal else {}
    with forbidding(TILED_BUILTINS, "tiled_attention", TILED_ALLOWED):
        out = call(fn, q, k, v, bs, what=f"tiled_attention(q, k, v, block_size={bs}{', causal=True' if causal else ''})",
                   **kw)
    return expect_tensor(out, f"tiled_attention output (block_size={bs})", shape=q.shape[:-1] + v.shape[-1:]).detach()


def check_tiled_attention(fn):
    """Check tiled_attention(q, k, v, block_size) == full attention, for any block size."""
    require_callable(fn, "tiled_attention")
    c = _data()["tiled"]
    q, k, v = tensor(c["q"]), tensor(c["k"]) * 3, tensor(c["v"])          # [2, 7, 4], [2, 7, 4], [2, 7, 3]
    full = _full_attention(q, k, v)
    if not close(_tiled_call(fn, q, k, v, 16, False), full):
        fail("even with one block (block_size >= N) the result differs from softmax(q k^T / sqrt(d)) v: check "
             "the scaling and the final division by the running sum")
    ones = _tiled_call(fn, q, k, torch.ones(2, 7, 3, dtype=torch.float64), 2, False)
    if bool((ones < 1 - 1e-9).any()):
        fail("with v = 1 every output should be 1 (weights sum to 1), yours are smaller: when a block raises "
             "the running max m, multiply the running sum l by exp(m_old - m_new) too")
    if bool((ones > 1 + 1e-9).any()):
        fail("with v = 1 every output should be 1, yours are larger: when a block raises the running max, "
             "rescale the accumulator acc by exp(m_old - m_new) (not only the running sum)")
    for bs in (1, 2, 3, 7, 9):
        got = _tiled_call(fn, q, k, v, bs, False)
        if not close(got, full):
            if 7 % bs and close(_tiled_call(fn, q[..., :6, :], k[..., :6, :], v[..., :6, :], 3, False),
                                _full_attention(q[..., :6, :], k[..., :6, :], v[..., :6, :])):
                fail(f"right when block_size divides N but not for N = 7, block_size = {bs}: the last block is "
                     "shorter; range(0, N, block_size) and slicing q[..., s : s + block_size, :] handle it")
            fail(f"block_size={bs}: differs from full attention (max error {max_error(got, full):.3g})")
    big = _tiled_call(fn, q * 40, k * 40, v, 3, False)
    if bool(torch.isnan(big).any() or torch.isinf(big).any()):
        fail("large scores give NaN or inf: subtract the running max before exponentiating")
    ok("tiled attention equals full attention for block sizes 1, 2, 3, 7 (= N) and 9 (> N)")
    dtypes_and_gradients(fn, [q, k, v, 3], "tiled_attention(q, k, v, block_size=3)")
    ok("tiled attention keeps float32 and float64")
    # The constraint the hidden tests grade too (there, measured from outside the kernel).
    n, bs = 1024, 128
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 16, generator=g) for _ in range(3))
    _, peak = peak_memory(lambda: call(fn, q, k, v, bs, what="tiled_attention on N = 1024"))
    if peak > n * n * 4:
        fail(f"tiled_attention allocated {peak / 2**20:.1f} MiB on N = {n}: it builds the full N x N score matrix "
             f"({n * n * 4 / 2**20:.0f} MiB). Loop over blocks of queries and keys and keep only a "
             f"block_size x block_size tile of scores at a time")
    ok(f"tiled attention on N = {n} allocated {peak / 2**20:.2f} MiB at most (the full matrix would be "
       f"{n * n * 4 / 2**20:.0f} MiB)")


def check_tiled_attention_causal(fn):
    """Check tiled_attention(q, k, v, block_size, causal=True) == causal full attention."""
    require_callable(fn, "tiled_attention")
    c = _data()["tiled"]
    q, k, v = tensor(c["q"]), tensor(c["k"]), tensor(c["v"])
    mask = torch.ones(7, 7, dtype=torch.bool).tril()
    full = _full_attention(q, k, v, mask)
    for bs in (1, 2, 3, 7, 9):
        got = _tiled_call(fn, q, k, v, bs, True)
        if close(got, full):
            continue
        if bool(torch.isnan(got[..., 0, :]).any()) or close(got[..., 1:, :],
                                                             _full_attention(q, k, v, mask.tril(-1))[..., 1:, :]):
            fail("query i must see key i itself: mask only j > i (the diagonal stays visible)")
        if close(got, _full_attention(q, k, v)):
            fail("causal=True is ignored: mask the scores where key j > query i in each tile")
        fail(f"block_size={bs}, causal=True: differs from causal full attention (max error {max_error(got, full):.3g})")
    ok("causal tiled attention equals causal full attention for block sizes 1, 2, 3, 7 and 9")


def check_sliding_window_mask(fn):
    """Check sliding_window_mask(n, window) -> bool [n, n], True where |i - j| <= window."""
    require_callable(fn, "sliding_window_mask")
    m = expect_tensor(call(fn, 6, 2, what="sliding_window_mask(6, 2)"), "sliding_window_mask(6, 2)", shape=(6, 6))
    if m.dtype != torch.bool:
        fail(f"the mask should be a bool tensor (True = may attend), got {m.dtype}")
    expected = torch.tensor(_data()["window_6_2"])
    if bool((m == expected).all()):
        ok("sliding window: each token sees itself and `window` neighbours on both sides")
        return
    diff = torch.arange(6)[:, None] - torch.arange(6)[None, :]
    if bool((m == (diff.abs() < 2)).all()) or bool((m == (diff.abs() <= 3)).all()):
        fail("off by one at the window edges: key j is visible when |i - j| <= window (so 2 * window + 1 keys "
             "for a query far from the ends)")
    if bool((m == ((diff >= 0) & (diff <= 2))).all()):
        fail("your window only looks back; this mask is symmetric, with window neighbours on both sides "
             "(combine it with a causal mask for a causal local window)")
    fail(f"sliding_window_mask(6, 2) should be\n{expected.int()}\ngot\n{m.int()}")


# ---- attention as an RNN again: linear attention and the delta rule --------------------------------------------
def _linear_data():
    c = _data()["linear"]
    return tensor(c["q"]), tensor(c["k"]), tensor(c["v"]), c


def _linear_call(fn, what, *args):
    return expect_tensor(call(fn, *args, what=what), what, shape=(2, 7, 3))


def _linear_mistakes(got, c, name):
    """Name the usual mistakes of a linear-attention exercise by the outputs they give on the stored input."""
    if close(got, tensor(c["not_causal"])):
        fail(f"{name}: token t also reads keys after it; the sums run over s <= t only (a causal mask on the "
             "scores, or the state before token t + 1 is added)")
    if close(got, tensor(c["unnormalised"])):
        fail(f"{name}: the outputs are not divided by the normaliser sum_s q_t . k_s, so they grow with t; divide "
             "by it, as softmax divides by the sum of its exponentials")
    if close(got, tensor(c["normalised_over_all"])):
        fail(f"{name}: the normaliser sums q_t . k_s over every key, the numerator only over s <= t; both run "
             "over the same keys, s <= t")
    if close(got[..., 1:, :], tensor(c["read_before_write"])[..., 1:, :]):      # its first row is 0 / 0
        fail(f"{name}: token t reads the state before its own key and value are added; add k_t v_t^T (and "
             "k_t to z) first, then read with q_t, as the parallel form's diagonal includes s = t")


def _quadratic_memory(fn, what, *args):
    """Fail a function that builds the T x T table of the parallel form on a sequence where it would show."""
    n = 1024
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.rand(n, 8, generator=g) + 0.1 for _ in range(3))
    with LargestTensor() as seen:
        call(fn, q, k, v, *args, what=f"{what} on T = {n}")
    if seen.largest >= n * n // 4:
        fail(f"{what} made a tensor of {seen.largest:,} numbers on T = {n}: it builds the T x T table of the "
             f"parallel form ({n * n:,} numbers). Keep a state of d_k x d_v numbers instead")
    ok(f"{what} on T = {n} made no tensor larger than {seen.largest:,} numbers (the T x T table has {n * n:,})")


def check_linear_attention(fn):
    """Check linear_attention(q, k, v) [..., T, d] -> [..., T, d_v], the causal parallel form."""
    require_callable(fn, "linear_attention")
    q, k, v, c = _linear_data()
    got = _linear_call(fn, "linear_attention(q, k, v)", q, k, v)
    if not close(got, tensor(c["output"])):
        _linear_mistakes(got, c, "linear_attention")
        fail(f"linear_attention differs from sum_(s<=t) (q_t . k_s) v_s / sum_(s<=t) q_t . k_s "
             f"(max error {max_error(got, tensor(c['output'])):.3g})")
    ok("linear attention: each token averages the values of the tokens up to it, weighted by q_t . k_s")
    dtypes_and_gradients(fn, [q, k, v], "linear_attention(q, k, v)", grad_args=(0, 1, 2))
    ok("linear attention keeps float32 and float64, and gradients flow back")


def check_linear_attention_recurrent(fn):
    """Check linear_attention_recurrent(q, k, v): the parallel form's outputs, from a d_k x d_v state."""
    require_callable(fn, "linear_attention_recurrent")
    q, k, v, c = _linear_data()
    got = _linear_call(fn, "linear_attention_recurrent(q, k, v)", q, k, v)
    if not close(got, tensor(c["output"])):
        _linear_mistakes(got, c, "linear_attention_recurrent")
        fail(f"linear_attention_recurrent differs from the parallel form (max error "
             f"{max_error(got, tensor(c['output'])):.3g})")
    ok("the recurrent form gives the parallel form's outputs")
    dtypes_and_gradients(fn, [q, k, v], "linear_attention_recurrent(q, k, v)", grad_args=(0, 1, 2))
    ok("the recurrent form keeps float32 and float64, and gradients flow back")
    _quadratic_memory(fn, "linear_attention_recurrent")


def check_linear_attention_chunked(fn):
    """Check linear_attention_chunked(q, k, v, chunk): the parallel form's outputs for every chunk size."""
    require_callable(fn, "linear_attention_chunked")
    q, k, v, c = _linear_data()
    expected = tensor(c["output"])
    for chunk in (3, 7, 1, 2, 9):           # 3 first: the chunked mistakes show there
        what = f"linear_attention_chunked(q, k, v, chunk={chunk}) with T = 7"
        got = _linear_call(fn, what, q, k, v, chunk)
        if close(got, expected):
            continue
        if chunk == 3 and close(got, tensor(c["chunk3_no_state"])):
            fail("each chunk only sees its own tokens: carry the state S = sum k_s v_s^T (and z = sum k_s) of the "
                 "chunks before it, and add q_c S to the chunk's numerator and q_c z to its normaliser")
        if chunk == 3 and close(got, tensor(c["chunk3_not_causal"])):
            fail("inside a chunk, token t also reads the chunk's later tokens: mask the chunk's q_c k_c^T with a "
                 "lower triangle (tril), as in the parallel form")
        _linear_mistakes(got, c, f"linear_attention_chunked(chunk={chunk})")
        if 7 % chunk and close(call(fn, q[..., :6, :], k[..., :6, :], v[..., :6, :], chunk, what=what),
                               expected[..., :6, :]):
            fail(f"right when chunk divides T but not for T = 7, chunk = {chunk}: the last chunk is shorter; "
                 "range(0, T, chunk) and slicing x[..., s : s + chunk, :] handle it")
        fail(f"{what} differs from the parallel form (max error {max_error(got, expected):.3g})")
    ok("the chunked form gives the parallel form's outputs for chunks of 1, 2, 3, 7 (= T) and 9 (> T)")
    dtypes_and_gradients(fn, [q, k, v, 3], "linear_attention_chunked(q, k, v, chunk=3)", grad_args=(0, 1, 2))
    ok("the chunked form keeps float32 and float64, and gradients flow back")
    _quadratic_memory(fn, "linear_attention_chunked", 64)


def _delta_call(fn, what, *args, **kwargs):
    out = call(fn, *args, what=what, **kwargs)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        fail(f"{what} should return a pair (outputs, state), got {type(out).__name__}")
    o = expect_tensor(out[0], f"{what}'s outputs", shape=(2, 7, 3))
    return o, expect_tensor(out[1], f"{what}'s state", shape=(2, 4, 3))


def _delta_case(fn, c, what, gated, **kwargs):
    q, k, v, beta = (tensor(c[x]) for x in ("q", "k", "v", "beta"))
    args = (q, k, v, beta) + ((tensor(c["g"]),) if gated else ())
    o, state = _delta_call(fn, what, *args, **kwargs)
    return o, state, args


def check_delta_rule(fn):
    """Check delta_rule(q, k, v, beta, g=None, scale=None) -> (outputs, last state), without a gate."""
    require_callable(fn, "delta_rule")
    c = _data()["delta"]
    o, state, args = _delta_case(fn, c, "delta_rule(q, k, v, beta)", gated=False)
    if close(o, tensor(c["output"])) and close(state, tensor(c["state"])):
        ok("the delta rule: each write moves what the state returns for k_t a share beta_t of the way to v_t")
        o1, _, _ = _delta_case(fn, c, "delta_rule(q, k, v, beta, scale=1.0)", gated=False, scale=1.0)
        if not close(o1, tensor(c["output_scale_1"])):
            fail("delta_rule(..., scale=1.0) should read with q_t itself: use the scale given, and d_k ** -0.5 "
                 "only when scale is None")
        ok("the scale argument is used, d_k ** -0.5 by default")
        dtypes_and_gradients(fn, list(args), "delta_rule(q, k, v, beta)", grad_args=(0, 1, 2, 3))
        ok("the delta rule keeps float32 and float64, and gradients flow back")
        return
    if close(state, tensor(c["hebbian_state"])):
        fail("your state adds beta_t k_t v_t^T, as linear attention does: the delta rule writes the error, "
             "beta_t k_t (v_t - S^T k_t)^T, so that what S returns for k_t moves towards v_t")
    if close(state, tensor(c["state"])) and close(o, tensor(c["read_before_write"])):
        fail("your outputs read the state before token t's write: update S with token t first, then "
             "o_t = S^T (scale q_t)")
    if close(state, tensor(c["state"])) and close(o, tensor(c["unscaled"])):
        fail("your outputs are not scaled: o_t = S^T (scale q_t) with scale = d_k ** -0.5 when none is given")
    if close(state, tensor(c["state"])):
        fail(f"the last state is right, the outputs differ (max error {max_error(o, tensor(c['output'])):.3g}): "
             "o_t = S_t^T (scale q_t) with the state after token t's write")
    fail(f"the delta rule's state differs (max error {max_error(state, tensor(c['state'])):.3g}): per token, "
         "S <- S + beta_t k_t (v_t - S^T k_t)^T")


def check_delta_rule_gated(fn):
    """Check delta_rule(q, k, v, beta, g): Gated DeltaNet, the state decayed by exp(g_t) before each write."""
    require_callable(fn, "delta_rule")
    c = _data()["delta"]
    o, state, args = _delta_case(fn, c, "delta_rule(q, k, v, beta, g)", gated=True)
    if close(o, tensor(c["gated_output"])) and close(state, tensor(c["gated_state"])):
        ok("the gated delta rule: the state decays by exp(g_t), then the delta rule writes")
        dtypes_and_gradients(fn, list(args), "delta_rule(q, k, v, beta, g)", grad_args=(0, 1, 2, 3, 4))
        ok("the gated delta rule keeps float32 and float64, and gradients flow back")
        return
    if close(state, tensor(c["state"])):
        fail("g is ignored: before token t's write, multiply the state by exp(g_t) (g is a log-decay, <= 0)")
    if close(state, tensor(c["gate_without_exp"])):
        fail("g is a log-decay (g_t <= 0): multiply the state by exp(g_t), not by g_t")
    if close(state, tensor(c["gate_after_write"])):
        fail("the decay comes before the write: S <- exp(g_t) S first, then the error v_t - S^T k_t is taken "
             "from the decayed state")
    fail(f"the gated delta rule's state differs (max error {max_error(state, tensor(c['gated_state'])):.3g}): "
         "per token, S <- exp(g_t) S, then S <- S + beta_t k_t (v_t - S^T k_t)^T")
