"""Hidden tests for chapter 00: softmax with temperature, cosine similarity, analogy search."""
import numpy as np
import torch

from .. import foundations as ref
from attncourse.checks.ch00 import COSINE_ALLOWED, COSINE_BUILTINS, SOFTMAX_ALLOWED, SOFTMAX_BUILTINS

from . import fixed, function_case, hidden_test, raises_case

DTYPES = [torch.float32, torch.float64]
SHAPES = [(5,), (3, 4), (2, 3, 5), (4, 1, 6), (2, 2, 3, 3)]


def _tensor(rng, shape, dtype, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape) * scale).to(dtype)


def _dim(rng, ndim):
    """A dimension index, sometimes negative; -1 only a third of the time so 'always -1' is caught."""
    d = int(rng.integers(ndim))
    return d - ndim if rng.random() < 0.5 else d


def _with_neg_inf(rng, x, dim):
    """Set some entries to -inf, keeping at least one finite entry in every slice along dim."""
    x = x.clone()
    hole = torch.from_numpy(rng.random(tuple(x.shape)) < 0.3)
    keep = torch.from_numpy(rng.integers(x.shape[dim], size=tuple(s for i, s in enumerate(x.shape)
                                                                     if i != dim % x.dim())))
    first = torch.nn.functional.one_hot(keep, x.shape[dim]).bool().movedim(-1, dim % x.dim())
    return x.masked_fill(hole & ~first, float("-inf"))


@hidden_test("ch00.softmax", forbid=SOFTMAX_BUILTINS, allow=SOFTMAX_ALLOWED)
def softmax(rng):
    cases = []
    for i, shape in enumerate(SHAPES * 2):
        dtype = DTYPES[i % 2]
        x = _tensor(rng, shape, dtype, scale=float(rng.uniform(0.5, 4)))
        if i < 3:                               # the default dim=-1
            cases.append(function_case(ref.softmax, [x], rng=rng, grad_args=(0,) if i == 0 else ()))
        else:
            cases.append(function_case(ref.softmax, [x], {"dim": _dim(rng, len(shape))}, rng=rng,
                                       grad_args=(0,) if i % 4 == 0 else ()))
    # Large scores, different in every slice: exp overflows (or a global max underflows) without
    # a per-slice maximum subtracted first.
    for dtype in DTYPES:
        x = _tensor(rng, (4, 6), dtype, 3.0) + torch.from_numpy(rng.uniform(-3000, 3000, (4, 1))).to(dtype)
        cases.append(function_case(ref.softmax, [x], {"dim": -1}))
        cases.append(function_case(ref.softmax, [x.T.contiguous()], {"dim": 0}))
    # -inf entries get weight exactly 0 (and zero gradient).
    for i, shape in enumerate([(3, 5), (2, 4, 3)]):
        dim = -1 if i == 0 else 1
        x = _with_neg_inf(rng, _tensor(rng, shape, torch.float64), dim)
        cases.append(function_case(ref.softmax, [x], {"dim": dim}, rng=rng, grad_args=(0,)))
    return cases


@hidden_test("ch00.softmax_temperature", forbid=SOFTMAX_BUILTINS, allow=SOFTMAX_ALLOWED)
def softmax_temperature(rng):
    cases = []
    for i in range(8):
        shape = SHAPES[i % len(SHAPES)]
        dtype = DTYPES[i % 2]
        x = _tensor(rng, shape, dtype, 2.0)
        t = float(np.exp(rng.uniform(np.log(0.05), np.log(20))))
        cases.append(function_case(ref.softmax, [x], {"dim": _dim(rng, len(shape)), "temperature": t}, rng=rng,
                                   grad_args=(0,) if i % 3 == 0 else ()))
    # Temperature near 0: argmax (distinct values 0.01 apart, or exact ties sharing the weight).
    for dtype in DTYPES:
        x = torch.from_numpy(rng.permutation(24).reshape(4, 6) / 100.0).to(dtype) * 5
        cases.append(function_case(ref.softmax, [x], {"dim": -1, "temperature": 1e-5}))
        ties = torch.from_numpy(rng.integers(0, 3, (5, 4)).astype(float)).to(dtype)
        cases.append(function_case(ref.softmax, [ties], {"dim": 0, "temperature": 1e-30}))
    x = _tensor(rng, (3, 4), torch.float32, 2.0) + 1000
    cases.append(function_case(ref.softmax, [x], {"temperature": 0.01}))
    # Temperatures that make no sense must be refused.
    x = _tensor(rng, (2, 3), torch.float64)
    for t in (0.0, -1.0, -0.25):
        cases.append(raises_case([x], {"temperature": t}, exception="ValueError",
                                 describe=f"softmax([2, 3] float64, temperature={t})"))
    return cases


@hidden_test("ch00.cosine_similarity", forbid=COSINE_BUILTINS, allow=COSINE_ALLOWED)
def cosine_similarity(rng):
    cases = []
    pairs = [((5,), (5,)), ((4, 3), (4, 3)), ((3,), (6, 3)), ((2, 1, 4), (1, 5, 4)), ((7, 8), (8,))]
    for i in range(10):
        sa, sb = pairs[i % len(pairs)]
        dtype = DTYPES[i % 2]
        # Very different norms per vector: forgetting to normalise one side shows.
        a = _tensor(rng, sa, dtype) * torch.from_numpy(rng.uniform(0.2, 5, sa[:-1] + (1,))).to(dtype)
        b = _tensor(rng, sb, dtype) * torch.from_numpy(rng.uniform(0.2, 5, sb[:-1] + (1,))).to(dtype)
        if i >= 7:                            # vectors along another dimension
            full = torch.broadcast_shapes(sa, sb)
            a, b = a.expand(full).movedim(-1, 0).contiguous(), b.expand(full).movedim(-1, 0).contiguous()
            cases.append(function_case(ref.cosine_similarity, [a, b], {"dim": 0}, rng=rng, grad_args=(0, 1)))
        else:
            cases.append(function_case(ref.cosine_similarity, [a, b], rng=rng, grad_args=(0, 1) if i % 3 == 0 else ()))
    return cases


def known_table(rng, noise=0.05, dtype=torch.float64):
    """Words built from meaning directions, so analogies have known answers.

    Every word = its concept's direction + its gender's direction (+ a little noise), then
    stretched by a random length: directions carry the meaning, lengths carry nothing.  Filler words
    are made of the directions left over, so every analogy's answer is its concept's other word.
    Returns (words, table [V, D]).
    """
    concepts = ["parent", "child", "sibling", "royal", "spouse", "noble", "servant", "person"]
    pairs = {"parent": ("father", "mother"), "child": ("son", "daughter"), "sibling": ("brother", "sister"),
             "royal": ("king", "queen"), "spouse": ("husband", "wife"), "noble": ("lord", "lady"),
             "servant": ("manservant", "maid"), "person": ("man", "woman")}
    d = 16
    basis = np.linalg.qr(rng.standard_normal((d, d)))[0]
    concept_vec = {c: basis[i] * 2.0 for i, c in enumerate(concepts)}
    gender_vec = [basis[len(concepts)], -basis[len(concepts)]]
    words, rows = [], []
    for c in concepts:
        for g in (0, 1):
            words.append(pairs[c][g])
            rows.append(concept_vec[c] + gender_vec[g] + noise * rng.standard_normal(d))
    unused = basis[len(concepts) + 1:]          # directions no concept or gender uses
    for j in range(6):                         # unrelated filler words: made of the unused directions, so that
        words.append(f"word{j}")               # no draw puts one nearer an analogy's answer than the answer
        rows.append(rng.standard_normal(len(unused)) @ unused * 1.5 + noise * rng.standard_normal(d))
    # lengths within a factor of 4 of each other: a wider spread lets one word's length outweigh the others'
    # meaning in a - b + c, and the known answer would no longer be the nearest word for every draw
    table = np.array(rows) * rng.uniform(0.5, 2.0, (len(rows), 1))
    return words, torch.from_numpy(table).to(dtype)


def _separated(table, a, b, c, k):
    """True if the top k+1 similarities are clearly apart (no near-ties to flip on rounding)."""
    sims = ref.cosine_similarity(table[a] - table[b] + table[c], table.double())
    sims[[a, b, c]] = float("-inf")
    top = sims.topk(min(k + 1, len(sims) - 3)).values
    return bool((top[:-1] - top[1:]).min() > 1e-4) if len(top) > 1 else True


@hidden_test("ch00.analogy")
def analogy(rng):
    cases = []
    for i in range(4):                                     # known answers
        words, table = known_table(rng, dtype=DTYPES[i % 2])
        w = {x: j for j, x in enumerate(words)}
        a, b, c, answer = [("father", "man", "woman", "mother"), ("king", "man", "woman", "queen"),
                           ("sister", "woman", "man", "brother"), ("lady", "wife", "husband", "lord")][i]
        got = ref.analogy(table, w[a], w[b], w[c])
        assert words[int(got[0])] == answer, (words[int(got[0])], answer)
        cases.append(function_case(ref.analogy, [table, w[a], w[b], w[c]], {"k": 1 + 2 * (i % 2)},
                                   describe=f"known table: {a} - {b} + {c} should give {answer}"))
    tries = 0
    while len(cases) < 10 and tries < 200:                  # random tables
        tries += 1
        v, d = int(rng.integers(8, 40)), int(rng.integers(3, 12))
        dtype = DTYPES[len(cases) % 2]
        table = (_tensor(rng, (v, d), torch.float64) * torch.from_numpy(rng.uniform(0.2, 5, (v, 1)))).to(dtype)
        a, b, c = (int(x) for x in rng.choice(v, size=3, replace=False))
        k = int(rng.integers(1, 5))
        if _separated(table, a, b, c, k):
            cases.append(function_case(ref.analogy, [table, a, b, c], {"k": k}))
    return cases


def check_data():
    """Fixed inputs and expected values for the visible checks (tools/make_check_data.py writes them)."""
    x = fixed((3, 4), 10)
    big = x * 1000
    neg = x.clone()
    neg[0, 1] = neg[2, 0] = neg[2, 3] = float("-inf")
    softmax = {"x": x, "dim_last": ref.softmax(x), "dim_0": ref.softmax(x, dim=0),
               "t_half": ref.softmax(x, temperature=0.5), "t_five": ref.softmax(x, temperature=5.0),
               "t_multiplied": ref.softmax(x * 0.5), "big": big, "big_out": ref.softmax(big),
               "neg_inf_rows": [[0, 1], [2, 0], [2, 3]], "neg_out": ref.softmax(neg),
               "tiny_t_argmax": ref.softmax(x, temperature=1e-6).argmax(-1)}
    a, b = fixed((4, 3), 11), fixed((4, 3), 12)
    b = b * torch.tensor([[0.5], [2.0], [3.0], [0.25]], dtype=torch.float64)
    a = a * torch.tensor([[4.0], [0.5], [1.0], [2.0]], dtype=torch.float64)
    cosine = {"a": a, "b": b, "expected": ref.cosine_similarity(a, b), "b_only": (a * b).sum(-1) / b.norm(dim=-1),
              "a_only": (a * b).sum(-1) / a.norm(dim=-1), "dot": (a * b).sum(-1)}
    rng = np.random.default_rng(2026)
    words, table = known_table(rng)
    w = {x: j for j, x in enumerate(words)}
    queries = [("father", "man", "woman", "mother"), ("king", "man", "woman", "queen"),
               ("son", "man", "woman", "daughter"), ("husband", "man", "woman", "wife")]
    for a_, b_, c_, ans in queries:
        assert words[int(ref.analogy(table, w[a_], w[b_], w[c_]))] == ans
    analogy = {"words": words, "table": table, "queries": [[w[a_], w[b_], w[c_], w[d_]] for a_, b_, c_, d_ in queries],
               "top3_father": ref.analogy(table, w["father"], w["man"], w["woman"], k=3)}
    return {"softmax": softmax, "cosine": cosine, "analogy": analogy}
