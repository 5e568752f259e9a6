"""Visible checks for chapter 02: the attention layer and self-attention."""
import math

import torch

from ..forbid import ELEMENTARY
from ..layers import make_layer
from ._core import (build_module, call, close, dtypes_and_gradients, expect_pair, expect_tensor, fail, forbidding,
                    load_cases, max_error, module_dtypes, ok, require_callable, tensor)

# Exercise 1 re-implements PyTorch's fused kernel: it may not call it (the hidden tests agree).
SDPA_BUILTINS = ("torch.nn.functional.scaled_dot_product_attention",
                 # the operator and every kernel it dispatches to, including the math one
                 "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math",
                 "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention",
                 "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
                 "aten::_scaled_dot_product_attention_math_for_mps", "aten::_scaled_dot_product_fused_attention_overrideable")
# Everything else it calls or runs is elementary, or softmax (attncourse.forbid.ELEMENTARY): F.multi_head_attention_forward,
# which decomposes into allowed operators, fails by construction.
SDPA_ALLOWED = ELEMENTARY | {"aten::softmax", "aten::_softmax", "aten::_safe_softmax"}


def _data():
    return load_cases("ch02")


def _scale_used(weights, raw):
    """Fit c in weights ~ softmax(c * raw) row by row: tells which scaling the learner applied."""
    logw = torch.log(weights.clamp_min(1e-300))
    dl = logw - logw[..., :1]
    ds = raw - raw[..., :1]
    return float((dl * ds).sum() / (ds * ds).sum())


def check_attention(fn):
    """Check scaled_dot_product_attention(q, k, v, mask=None) -> (output, weights)."""
    require_callable(fn, "scaled_dot_product_attention")
    c = _data()["attention"]
    q, k, v, raw = tensor(c["q"]), tensor(c["k"]), tensor(c["v"]), tensor(c["raw_scores"])
    with forbidding(SDPA_BUILTINS, "scaled_dot_product_attention", SDPA_ALLOWED):
        out, w = expect_pair(call(fn, q, k, v, what="scaled_dot_product_attention(q, k, v)"),
                             "scaled_dot_product_attention")
    expect_tensor(w, "weights", shape=(3, 5))
    expect_tensor(out, "output", shape=(3, 2))
    if w.dtype != q.dtype or out.dtype != q.dtype:
        fail(f"inputs are {q.dtype} but you returned {out.dtype} / {w.dtype}: keep the inputs' dtype")
    if torch.isnan(w).any() or torch.isinf(w).any():
        fail("your weights contain NaN or inf: exponentiating large scores overflows; use torch.softmax")
    rows, cols = w.sum(-1), w.sum(-2)
    if not torch.allclose(rows, torch.ones_like(rows), atol=1e-6):
        if torch.allclose(cols, torch.ones_like(cols), atol=1e-6):
            fail("your weights sum to 1 over the query axis (dim -2), not the key axis: "
                 "the softmax must normalise each query's scores over the keys, dim=-1")
        fail(f"each row of the weights must sum to 1 (a distribution over keys); your row sums are {rows.tolist()}")
    if (w <= 0).any():
        fail("with no mask every weight should be strictly positive (softmax never gives exactly 0)")
    d = q.shape[-1]
    c_used = _scale_used(w, raw)
    for value, message in [(1.0, "you did not scale the scores: divide q k^T by sqrt(d_k)"),
                           (1 / d, "you divided the scores by d_k; divide by sqrt(d_k)"),
                           (math.sqrt(d), "you multiplied the scores by sqrt(d_k); divide by it")]:
        if abs(c_used - value) < 1e-3 and abs(c_used - 1 / math.sqrt(d)) > 1e-3:
            fail(message)
    if not close(w, tensor(c["weights"])):
        fail(f"your weights differ from the expected ones (max error {max_error(w, tensor(c['weights'])):.3g}); "
             "check that the scores are q @ k transposed over its last two dimensions")
    if not close(out, tensor(c["output"])):
        fail("the weights are right but the output is not: the output is weights @ v")
    ok("fixed case: weights and output match")

    # Leading dimensions: a batch of 2, 3 heads; each slice must equal the unbatched result.
    qb = torch.stack([q, q.flip(0)]).unsqueeze(1).expand(2, 3, 3, 4)
    kb = torch.stack([k, k.flip(0)]).unsqueeze(1).expand(2, 3, 5, 4)
    vb = torch.stack([v, v.flip(0)]).unsqueeze(1).expand(2, 3, 5, 2)
    try:
        res = fn(qb, kb, vb)
    except Exception as exc:
        fail(f"with batch and head dimensions ([2, 3, N, d] inputs) your function raised {type(exc).__name__}: "
             f"{exc}. Transpose only the last two dimensions of k (k.transpose(-2, -1)), not k.T or dims 0 and 1")
    ob, wb = expect_pair(res, "scaled_dot_product_attention")
    if tuple(wb.shape) != (2, 3, 3, 5) or tuple(ob.shape) != (2, 3, 3, 2):
        fail(f"with batch and head dimensions [2, 3] the weights should be [2, 3, 3, 5] and the output [2, 3, 3, 2]; "
             f"got {list(wb.shape)} and {list(ob.shape)}. Transpose only the last two dimensions of k "
             "(k.transpose(-2, -1)), not k.T or dims 0 and 1")
    if not (close(ob[0, 1], tensor(c["output"])) and close(wb[0, 2], tensor(c["weights"]))):
        fail("batched inputs give different answers from the same inputs one at a time: transpose only the "
             "last two dimensions of k (k.transpose(-2, -1)) so the batch and head dimensions stay put")
    ok("batch and head dimensions broadcast")

    big = call(fn, q * 100, k * 100, v, what="scaled_dot_product_attention with large scores")
    if torch.isnan(big[1]).any():
        fail("large scores give NaN weights: your softmax overflows; use torch.softmax (it subtracts the row max)")
    ok("large scores stay finite")
    dtypes_and_gradients(fn, [q, k, v], "scaled_dot_product_attention(q, k, v)", grad_args=(0, 1, 2))
    ok("float32 and float64 keep their dtype; gradients flow back to q, k and v (the hidden tests backpropagate)")


def check_attention_mask(fn):
    """Check the mask argument of scaled_dot_product_attention(q, k, v, mask)."""
    require_callable(fn, "scaled_dot_product_attention")
    c = _data()["attention"]
    q, k, v = tensor(c["q"]), tensor(c["k"]), tensor(c["v"])
    mask = torch.tensor(c["mask"])
    with forbidding(SDPA_BUILTINS, "scaled_dot_product_attention", SDPA_ALLOWED):
        out, w = expect_pair(call(fn, q, k, v, mask=mask, what="scaled_dot_product_attention(q, k, v, mask=mask)"),
                             "scaled_dot_product_attention")
    expect_tensor(w, "masked weights", shape=(3, 5))
    if torch.isnan(w).any():
        fail("masked weights contain NaN: some softmax ran over scores that were all -inf. The softmax must "
             "run over the keys (dim=-1), and True in the mask means 'may attend'")
    blocked, allowed = w[~mask], w[mask]
    if (blocked.abs() > 1e-9).any() and (allowed.abs() < 1e-9).all():
        fail("your mask is inverted: True means 'may attend', so weights must be 0 where the mask is False")
    if close(w, tensor(c["weights"])):
        fail("your function ignores the mask: the weights are the same as without it. Set the scores where "
             "the mask is False to float('-inf') before the softmax")
    if (blocked.abs() > 1e-9).any():
        fail("positions where the mask is False still get weight. Filling their scores with 0 is not enough "
             "(exp(0) = 1 still counts): fill them with float('-inf') before the softmax")
    rows = w.sum(-1)
    if not torch.allclose(rows, torch.ones_like(rows), atol=1e-6):
        fail("masked positions are 0 but the rows no longer sum to 1: you applied the mask after the softmax. "
             "Set masked scores to -inf before the softmax so the remaining weights renormalise")
    if not (close(w, tensor(c["masked_weights"])) and close(out, tensor(c["masked_output"]))):
        fail(f"masked weights differ from the expected ones (max error "
             f"{max_error(w, tensor(c['masked_weights'])):.3g})")
    ok("boolean mask: blocked positions get exactly 0 and each row still sums to 1")

    # A mask shared by every batch element must broadcast.
    qb, kb, vb = q.expand(2, 3, 4), k.expand(2, 5, 4), v.expand(2, 5, 2)
    ob, wb = expect_pair(call(fn, qb, kb, vb, mask=mask, what="a [3, 5] mask with batched inputs"),
                         "scaled_dot_product_attention")
    if not close(wb[1], tensor(c["masked_weights"])):
        fail("a [N_q, N_k] mask must broadcast over batch dimensions")
    ok("a [N_q, N_k] mask broadcasts over the batch")
    dtypes_and_gradients(fn, [q, k, v], "scaled_dot_product_attention(q, k, v, mask=mask)", grad_args=(0, 1, 2),
                         mask=mask)
    ok("masked: float32 and float64 keep their dtype; gradients flow back to q, k and v")


def check_causal_mask(fn):
    """Check causal_mask(n) -> bool [n, n], True where query i may attend key j (j <= i)."""
    require_callable(fn, "causal_mask")
    m = call(fn, 5, what="causal_mask(5)")
    expect_tensor(m, "causal_mask(5)", shape=(5, 5))
    if m.dtype != torch.bool:
        fail(f"causal_mask should return a bool tensor (True = may attend), got {m.dtype}")
    expected = torch.tensor(_data()["causal_mask_5"])
    if torch.equal(m, expected):
        one = call(fn, 1, what="causal_mask(1)")
        if not (isinstance(one, torch.Tensor) and one.shape == (1, 1) and bool(one.all())):
            fail("causal_mask(1) should be [[True]]")
        ok("causal_mask: each position sees itself and the past")
        return
    if torch.equal(m, expected.T):
        fail("your mask is upper-triangular: it lets each position see the future and hides the past. "
             "Row i must be True in columns 0..i")
    if torch.equal(m, expected & ~torch.eye(5, dtype=torch.bool)):
        fail("off by one: the diagonal is False, so a position cannot attend to itself (the first row has no "
             "key at all and its softmax is NaN). Include the diagonal")
    if torch.equal(m, expected | torch.ones(5, 5, dtype=torch.bool).triu(1).tril(1)):
        fail("off by one: each position also sees the next one, which leaks the token it must predict")
    fail(f"causal_mask(5) should be lower-triangular including the diagonal; got\n{m.int()}")


def check_self_attention(cls):
    """Check SelfAttention(d_model, d_head): fused qkv projection, forward(x, mask=None) -> (y, weights)."""
    c = _data()["self_attention"]
    module = build_module(cls, c["init"], "SelfAttention", c["state"])
    x = tensor(c["x"])
    y, a = expect_pair(call(module, x, what="SelfAttention.forward(x)"), "SelfAttention.forward")
    expect_tensor(y, "SelfAttention output", shape=(5, 3))
    expect_tensor(a, "SelfAttention weights", shape=(5, 5))
    if not close(y, tensor(c["output"])):
        for order, expected in c["split_orders"].items():
            if order != "QKV" and close(y, tensor(expected)):
                fail(f"you split the fused projection as ({', '.join(order)}); its output is [Q | K | V] "
                     "in that order (the rows of qkv.weight are W_Q, then W_K, then W_V)")
        fail(f"SelfAttention output differs from the expected one (max error "
             f"{max_error(y, tensor(c['output'])):.3g}); Q, K and V must all be projections of the same x")
    if not close(a, tensor(c["weights"])):
        fail("the output matches but the returned weights do not: return the attention weights")
    masked = call(module, x, mask=torch.ones(5, 5, dtype=torch.bool).tril(), what="SelfAttention.forward(x, mask)")
    if not close(expect_pair(masked, "SelfAttention.forward")[0], tensor(c["causal_output"])):
        fail("SelfAttention ignores its mask argument: pass it on to your attention function")
    ok("SelfAttention: parameter names and shapes, fused split order, output and mask")
    module_dtypes(module, [x], "SelfAttention.forward(x)")
    ok("SelfAttention in float32 returns float32 and agrees with float64")


def check_cross_attention(cls):
    """Check CrossAttention(d_query, d_context, d_head): forward(x, context, mask=None) -> (y, weights)."""
    c = _data()["cross_attention"]
    module = build_module(cls, c["init"], "CrossAttention", c["state"])
    x, ctx = tensor(c["x"]), tensor(c["context"])
    y, a = expect_pair(call(module, x, ctx, what="CrossAttention.forward(x, context)"), "CrossAttention.forward")
    if tuple(a.shape) == (4, 2) or tuple(y.shape)[:1] == (4,):
        fail(f"the output should have one row per query position of x (2 here), got shape {list(y.shape)}: "
             "queries come from x, keys and values from the context")
    expect_tensor(y, "CrossAttention output", shape=(2, 2))
    expect_tensor(a, "CrossAttention weights", shape=(2, 4))
    if close(y, tensor(c["kv_swapped_output"])):
        fail("you split kv_proj's output as (V, K); it is [K | V]")
    if not close(y, tensor(c["output"])):
        fail(f"CrossAttention output differs from the expected one (max error "
             f"{max_error(y, tensor(c['output'])):.3g})")
    masked = call(module, x, ctx, mask=torch.tensor(c["mask"]), what="CrossAttention.forward(x, context, mask)")
    if not close(expect_pair(masked, "CrossAttention.forward")[0], tensor(c["masked_output"])):
        fail("CrossAttention ignores its mask argument: pass it on to your attention function")
    ok("CrossAttention: queries from x, keys and values from the context, mask passed on")
    module_dtypes(module, [x, ctx], "CrossAttention.forward(x, context)")
    ok("CrossAttention in float32 returns float32 and agrees with float64")


def check_equivariance_gap(fn):
    """Check equivariance_gap(layer, x, perm) -> float."""
    require_callable(fn, "equivariance_gap")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64)
    w = torch.randn(4, 4, generator=g, dtype=torch.float64)
    perm = torch.tensor([2, 0, 5, 1, 3, 4])
    gap_eq = call(fn, make_layer("attention", w), x, perm, what="equivariance_gap(attention layer, x, perm)")
    if isinstance(gap_eq, torch.Tensor):
        if gap_eq.numel() != 1:
            fail(f"equivariance_gap should return one number (the max gap), got a tensor of shape {list(gap_eq.shape)}")
        gap_eq = gap_eq.item()
    if not isinstance(gap_eq, float):
        fail(f"equivariance_gap should return a float, got {type(gap_eq).__name__}")
    gap_seq = call(fn, make_layer("cumsum", w), x, perm, what="equivariance_gap(cumulative-sum layer, x, perm)")
    gap_seq = float(gap_seq)
    if gap_eq > 1e-6:
        fail(f"for attention without a mask (equivariant) the gap should be ~0, you got {gap_eq:.3g}: compare "
             "layer(x[perm]) with layer(x)[perm], permuting rows (the sequence axis) in both")
    if gap_seq < 1e-6:
        fail("for a cumulative sum (order-sensitive) your gap is ~0: make sure you permute the input before "
             "the layer and the output after it")
    ok(f"equivariance_gap: {gap_eq:.1e} for attention, {gap_seq:.2f} for an order-sensitive layer")
