"""Visible checks for chapter 00: softmax with temperature, cosine similarity, analogy search."""
import torch

from ..forbid import ELEMENTARY

from ._core import (NotDoneYet, call, close, dtypes_and_gradients, expect_tensor, fail, forbidding, load_cases, max_error, ok,
                    require_callable, tensor)

# From scratch: the built-ins these exercises re-implement (the hidden tests forbid the same).
SOFTMAX_BUILTINS = ("torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax", "torch.special.softmax",
                    "torch.log_softmax", "torch.nn.functional.log_softmax", "torch.Tensor.log_softmax",
                    "torch.nn.Softmax",
                    # the operators, whatever spelling reaches them (torch.ops.aten._softmax, F.softmin, ...)
                    "aten::softmax", "aten::_softmax", "aten::log_softmax", "aten::_log_softmax", "aten::_safe_softmax",
                    "aten::special_softmax", "aten::special_log_softmax")
# ... and everything they call or run must be elementary (attncourse.forbid.ELEMENTARY): an unlisted route, such as
# aten::_masked_softmax, fails by construction.
SOFTMAX_ALLOWED = COSINE_ALLOWED = ELEMENTARY
COSINE_BUILTINS = ("torch.cosine_similarity", "torch.nn.functional.cosine_similarity", "torch.nn.CosineSimilarity",
                   "aten::cosine_similarity")


def _data():
    return load_cases("ch00")


def _softmax_out(fn, x, what, **kwargs):
    with forbidding(SOFTMAX_BUILTINS, "softmax", SOFTMAX_ALLOWED):
        out = call(fn, x, what=what, **kwargs)
    expect_tensor(out, what, shape=x.shape)
    if out.dtype != x.dtype:
        fail(f"{what}: the input is {x.dtype} but you returned {out.dtype}: keep the input's dtype")
    return out


def check_softmax(fn):
    """Check softmax(x, dim=-1, temperature=1.0) at temperature 1."""
    require_callable(fn, "softmax")
    c = _data()["softmax"]
    x = tensor(c["x"])
    out = _softmax_out(fn, x, "softmax(x)")
    if torch.isnan(out).any() or torch.isinf(out).any():
        fail("softmax(x) contains NaN or inf on small, ordinary scores")
    if (out <= 0).any() or (out >= 1).any():
        fail("every softmax weight of finite scores lies strictly between 0 and 1")
    rows, cols = out.sum(-1), out.sum(0)
    if not close(rows, torch.ones_like(rows), atol=1e-9):
        if close(cols, torch.ones_like(cols), atol=1e-9):
            fail("softmax(x) sums to 1 along dim 0, but the default is dim=-1 (the last dimension): "
                 "take the max and the sum along `dim`, with keepdim=True")
        fail(f"softmax(x) must sum to 1 along the last dimension; your sums are {rows.tolist()}")
    if not close(out, tensor(c["dim_last"]), atol=1e-9):
        fail(f"softmax(x) differs from exp(x) / sum(exp(x)) (max error {max_error(out, tensor(c['dim_last'])):.3g})")
    ok("softmax(x): a distribution along the last dimension")

    out0 = _softmax_out(fn, x, "softmax(x, dim=0)", dim=0)
    if close(out0, tensor(c["dim_last"]), atol=1e-9):
        fail("softmax(x, dim=0) gives the same answer as dim=-1: your function ignores `dim`")
    if not close(out0, tensor(c["dim_0"]), atol=1e-9):
        fail("softmax(x, dim=0) should sum to 1 down each column; take the max and the sum along `dim`, with keepdim=True")
    ok("softmax(x, dim=0): normalises along the dimension asked for")

    big = tensor(c["big"])
    outb = _softmax_out(fn, big, "softmax(1000 * x)")
    if torch.isnan(outb).any() or torch.isinf(outb).any():
        fail("softmax of large scores (around +-2000) gives NaN: exp overflows to inf (or underflows to 0 for "
             "every entry of a slice), and inf/inf or 0/0 is NaN. Subtract each slice's own maximum "
             "(x.amax(dim, keepdim=True)), not one global maximum, before exponentiating: softmax does not change, "
             "and exp never overflows")
    if not close(outb, tensor(c["big_out"]), atol=1e-9):
        fail("softmax of large scores is wrong: subtract each slice's maximum along `dim`, not one global maximum")
    ok("large scores: no overflow")

    neg = x.clone()
    for i, j in c["neg_inf_rows"]:
        neg[i, j] = float("-inf")
    outn = _softmax_out(fn, neg, "softmax(x with some -inf entries)")
    if torch.isnan(outn).any():
        fail("scores of -inf (a position that must get no weight) produce NaN; exp(-inf) = 0 should just work "
             "after subtracting the maximum")
    if not close(outn, tensor(c["neg_out"]), atol=1e-9):
        fail("with -inf scores the weights are wrong: those entries must get exactly 0 and the rest sum to 1")
    ok("-inf scores get weight exactly 0")
    dtypes_and_gradients(fn, [x], "softmax(x)", grad_args=(0,))
    dtypes_and_gradients(fn, [neg], "softmax(x with -inf entries)", grad_args=(0,))
    ok("float32 and float64 keep their dtype; gradients flow back through softmax (the hidden tests backpropagate)")


def check_softmax_temperature(fn):
    """Check the temperature argument of softmax(x, dim=-1, temperature=1.0)."""
    require_callable(fn, "softmax")
    c = _data()["softmax"]
    x = tensor(c["x"])
    half = _softmax_out(fn, x, "softmax(x, temperature=0.5)", temperature=0.5)
    if close(half, tensor(c["dim_last"]), atol=1e-9):
        fail("softmax(x, temperature=0.5) equals softmax(x): your function ignores the temperature")
    if close(half, tensor(c["t_multiplied"]), atol=1e-9):
        fail("you multiplied the scores by the temperature; divide them by it (softmax(x / T)): "
             "a low temperature must sharpen the distribution, a high one flatten it")
    if not close(half, tensor(c["t_half"]), atol=1e-9):
        fail(f"softmax(x, temperature=0.5) should equal softmax(x / 0.5) (max error "
             f"{max_error(half, tensor(c['t_half'])):.3g})")
    five = _softmax_out(fn, x, "softmax(x, temperature=5.0)", temperature=5.0)
    if not close(five, tensor(c["t_five"]), atol=1e-9):
        fail("softmax(x, temperature=5.0) should equal softmax(x / 5)")
    if not (five.amax(-1) < half.amax(-1)).all():
        fail("a higher temperature must give a flatter distribution (smaller largest weight)")
    ok("temperature: T=0.5 sharpens, T=5 flattens")

    tiny = _softmax_out(fn, x, "softmax(x, temperature=1e-6)", temperature=1e-6)
    if torch.isnan(tiny).any():
        fail("softmax(x, temperature=1e-6) gives NaN: x / T is huge; subtract the maximum first, then divide "
             "by the temperature, so every exponent stays <= 0")
    onehot = torch.nn.functional.one_hot(torch.tensor(c["tiny_t_argmax"]), x.shape[-1]).to(x.dtype)
    if not close(tiny, onehot, atol=1e-9):
        fail("as the temperature goes to 0 softmax should become argmax (a one-hot vector per row)")
    ok("temperature -> 0 behaves like argmax")

    for t in (0.0, -1.0):
        try:
            res = fn(x, temperature=t)
        except ValueError:
            continue
        except NotImplementedError:
            fail("softmax is not implemented yet", NotDoneYet)
        except Exception as exc:
            fail(f"softmax(x, temperature={t}) raised {type(exc).__name__}; raise a ValueError with a clear "
                 "message instead (temperature must be > 0)")
        fail(f"softmax(x, temperature={t}) returned {type(res).__name__} instead of refusing: a temperature "
             "<= 0 makes no sense; raise ValueError('temperature must be > 0')")
    ok("temperature <= 0 raises ValueError")
    dtypes_and_gradients(fn, [x], "softmax(x, temperature=0.5)", grad_args=(0,), temperature=0.5)
    ok("with a temperature: float32 and float64 keep their dtype; gradients flow back")


def check_cosine_similarity(fn):
    """Check cosine_similarity(a, b, dim=-1) -> tensor of cosines."""
    require_callable(fn, "cosine_similarity")
    c = _data()["cosine"]
    a, b = tensor(c["a"]), tensor(c["b"])
    with forbidding(COSINE_BUILTINS, "cosine_similarity", COSINE_ALLOWED):
        out = call(fn, a, b, what="cosine_similarity(a, b)")
    expect_tensor(out, "cosine_similarity([4, 3], [4, 3])")
    if tuple(out.shape) != (4,):
        fail(f"cosine_similarity of two [4, 3] tensors should have shape [4] (one cosine per row, reducing "
             f"dim=-1), got {list(out.shape)}")
    for key, message in [("dot", "you returned the plain dot product: divide by the lengths |a| |b|"),
                         ("b_only", "you divided by |b| only: normalise both vectors (divide by |a| |b|)"),
                         ("a_only", "you divided by |a| only: normalise both vectors (divide by |a| |b|)")]:
        if close(out, tensor(c[key])):
            fail(message)
    if close(out, (a * b).sum(-1) / ((a * a).sum(-1) * (b * b).sum(-1))):
        fail("you divided by the squared lengths |a|^2 |b|^2: take the square root (a.norm(dim=...))")
    if (out.abs() > 1 + 1e-9).any():
        fail(f"a cosine lies in [-1, 1]; you returned {out.tolist()}: divide by the lengths (a norm, with a square root)")
    if not close(out, tensor(c["expected"])):
        fail(f"cosine_similarity differs from a.b / (|a| |b|) (max error {max_error(out, tensor(c['expected'])):.3g})")
    ok("cosine_similarity: a.b / (|a| |b|), one value per row")
    scaled = call(fn, 3 * a, 0.5 * b, what="cosine_similarity(3 a, 0.5 b)")
    if not close(scaled, out):
        fail("stretching a vector must not change its cosine with another")
    rows = call(fn, a[0], b, what="cosine_similarity(a[0], b) with a [3] and b [4, 3]")
    if not (isinstance(rows, torch.Tensor) and close(rows, tensor(c["expected"]).new_tensor(
            [float((a[0] @ bi) / (a[0].norm() * bi.norm())) for bi in b]))):
        fail("cosine_similarity(vector [3], table [4, 3]) should broadcast and give the 4 cosines [4]")
    colwise = call(fn, a.T, b.T, dim=0, what="cosine_similarity(a.T, b.T, dim=0)")
    if not (isinstance(colwise, torch.Tensor) and close(colwise, out)):
        fail("cosine_similarity(a.T, b.T, dim=0) should equal cosine_similarity(a, b): reduce along `dim`")
    ok("scale-invariant, broadcasts, and follows `dim`")
    dtypes_and_gradients(fn, [a, b], "cosine_similarity(a, b)", grad_args=(0, 1))
    ok("float32 and float64 keep their dtype; gradients flow back to both inputs (the hidden tests backpropagate)")


def _analogy_hint(table, a, b, c, got):
    """Which known mistake ranks the rows the way the learner's answer does."""
    q = table[a] - table[b] + table[c]
    for scores, hint in [(table @ q, "you ranked by the plain dot product, which favours long vectors: rank by cosine"),
                         (-(table - q).norm(dim=-1), "you ranked by Euclidean distance: rank by cosine similarity"),
                         (torch.nn.functional.cosine_similarity(table[a] + table[b] - table[c], table, dim=-1),
                          "check the sign: the query is table[a] - table[b] + table[c]")]:
        scores = scores.clone()
        scores[[a, b, c]] = float("-inf")
        if scores.topk(len(got)).indices.tolist() == got:
            return ": " + hint
    return ""


def _analogy_result(fn, table, a, b, c, words, k):
    what = f"analogy(table, {words[a]}, {words[b]}, {words[c]}" + (f", k={k})" if k != 1 else ")")
    got = call(fn, table, a, b, c, k=k, what=what)
    expect_tensor(got, what)
    if got.dtype != torch.long or tuple(got.shape) != (k,):
        fail(f"{what} should return a long tensor of shape [{k}] (row indices), got {got.dtype} {list(got.shape)}")
    got = got.tolist()
    inputs = [i for i in got if i in (a, b, c)]
    if inputs:
        fail(f"{what} returned {words[inputs[0]]!r}, one of the input words: the query vector is usually "
             "closest to an input, so exclude a, b and c from the search")
    return got


def check_analogy(fn):
    """Check analogy(table, a, b, c, k=1) on a table whose answers are known."""
    require_callable(fn, "analogy")
    c = _data()["analogy"]
    words, table = c["words"], tensor(c["table"])
    for a, b, cc, answer in c["queries"]:
        got = _analogy_result(fn, table, a, b, cc, words, 1)
        if got != [answer]:
            hint = _analogy_hint(table, a, b, cc, got)
            fail(f"{words[a]} - {words[b]} + {words[cc]} should give {words[answer]!r}, you returned "
                 f"{words[got[0]]!r}{hint}")
    ok("analogy: " + ", ".join(f"{words[a]} - {words[b]} + {words[cc]} = {words[d]}" for a, b, cc, d in c["queries"]))
    a, b, cc = c["queries"][0][:3]
    got = _analogy_result(fn, table, a, b, cc, words, 3)
    if got != c["top3_father"]:
        hint = _analogy_hint(table, a, b, cc, got)
        fail(f"analogy(..., k=3) should return the 3 best rows, most similar first: expected {c['top3_father']}, got "
             f"{got}{hint}")
    ok("k best answers, most similar first")
