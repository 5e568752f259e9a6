"""Known-wrong implementations for chapter 00 (see tests/zoo/__init__.py)."""
import torch

from attncourse_ref.foundations import cosine_similarity

from . import collector

SOFTMAX = {"test_softmax", "test_softmax_temperature"}
VARIANTS, _add = collector()


# ---- cosine_similarity ------------------------------------------------------------------------
@_add("plain dot product", "cosine_similarity", {"test_cosine_similarity", "test_analogy"},
      "check_cosine_similarity", "plain dot product")
def cosine_dot(a, b, dim=-1, eps=1e-8):
    return (a * b).sum(dim=dim)


@_add("cosine divided by |b| only", "cosine_similarity", {"test_cosine_similarity"},
      "check_cosine_similarity", "divided by |b| only")
def cosine_b_only(a, b, dim=-1, eps=1e-8):
    return (a * b).sum(dim=dim) / b.norm(dim=dim).clamp_min(eps)


@_add("cosine divided by |a| only (analogy then ranks by dot product)", "cosine_similarity",
      {"test_cosine_similarity", "test_analogy"}, "check_cosine_similarity", "divided by |a| only")
def cosine_a_only(a, b, dim=-1, eps=1e-8):
    return (a * b).sum(dim=dim) / a.norm(dim=dim).clamp_min(eps)


@_add("squared norms (no square root)", "cosine_similarity", {"test_cosine_similarity", "test_analogy"},
      "check_cosine_similarity", "square root")
def cosine_squared_norms(a, b, dim=-1, eps=1e-8):
    return (a * b).sum(dim=dim) / ((a * a).sum(dim=dim) * (b * b).sum(dim=dim)).clamp_min(eps)


@_add("cosine always over the last dimension", "cosine_similarity", {"test_cosine_similarity"},
      "check_cosine_similarity", "reduce along `dim`")
def cosine_ignores_dim(a, b, dim=-1, eps=1e-8):
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(eps)


@_add("cosine that normalises its inputs in place", "cosine_similarity", {"test_cosine_similarity"},
      "check_cosine_similarity", "in place")
def cosine_in_place(a, b, dim=-1, eps=1e-8):
    a = a.div_(a.norm(dim=dim, keepdim=True).clamp_min(eps))
    b = b.div_(b.norm(dim=dim, keepdim=True).clamp_min(eps))
    return (a * b).sum(dim=dim)


# ---- softmax ----------------------------------------------------------------------------------
@_add("softmax without subtracting the maximum", "softmax", SOFTMAX, "check_softmax", "Subtract each slice's own maximum")
def softmax_overflows(x, dim=-1, temperature=1.0):
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    e = torch.exp(x / temperature)
    return e / e.sum(dim=dim, keepdim=True)


@_add("one global maximum instead of one per slice", "softmax", SOFTMAX, "check_softmax", "not one global maximum")
def softmax_global_max(x, dim=-1, temperature=1.0):
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    e = torch.exp((x - x.max()) / temperature)
    return e / e.sum(dim=dim, keepdim=True)


@_add("softmax always over the last dimension", "softmax", SOFTMAX, "check_softmax", "ignores `dim`")
def softmax_ignores_dim(x, dim=-1, temperature=1.0):
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    z = (x - x.amax(dim=-1, keepdim=True)) / temperature
    e = torch.exp(z)
    return e / e.sum(dim=-1, keepdim=True)


@_add("temperature multiplied instead of divided", "softmax", {"test_softmax_temperature"},
      "check_softmax_temperature", "multiplied the scores by the temperature")
def softmax_times_temperature(x, dim=-1, temperature=1.0):
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    z = (x - x.amax(dim=dim, keepdim=True)) * temperature
    e = torch.exp(z)
    return e / e.sum(dim=dim, keepdim=True)


@_add("temperature ignored", "softmax", {"test_softmax_temperature"}, "check_softmax_temperature",
      "ignores the temperature")
def softmax_no_temperature(x, dim=-1, temperature=1.0):
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)


@_add("no error for temperature <= 0", "softmax", {"test_softmax_temperature"}, "check_softmax_temperature",
      "raise ValueError")
def softmax_accepts_zero(x, dim=-1, temperature=1.0):
    z = (x - x.amax(dim=dim, keepdim=True)) / temperature
    e = torch.exp(z)
    return e / e.sum(dim=dim, keepdim=True)


@_add("softmax through NumPy (no gradient flows back)", "softmax", SOFTMAX, "check_softmax",
      "not connected to the inputs")
def softmax_via_numpy(x, dim=-1, temperature=1.0):
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    z = x.detach().numpy() / temperature
    e = torch.from_numpy(z - z.max(axis=dim, keepdims=True)).exp()
    return e / e.sum(dim=dim, keepdim=True)


# ---- analogy ------------------------------------------------------------------------------------
@_add("analogy that does not exclude the input words", "analogy", {"test_analogy"}, "check_analogy",
      "exclude a, b and c")
def analogy_keeps_inputs(table, a, b, c, k=1):
    query = table[a] - table[b] + table[c]
    return cosine_similarity(query, table).topk(k).indices


@_add("analogy ranked by dot product", "analogy", {"test_analogy"}, "check_analogy", "plain dot product")
def analogy_dot(table, a, b, c, k=1):
    query = table[a] - table[b] + table[c]
    sims = table @ query
    sims[[a, b, c]] = float("-inf")
    return sims.topk(k).indices


@_add("analogy ranked by Euclidean distance", "analogy", {"test_analogy"}, "check_analogy", "Euclidean")
def analogy_euclid(table, a, b, c, k=1):
    query = table[a] - table[b] + table[c]
    sims = -(table - query).norm(dim=-1)
    sims[[a, b, c]] = float("-inf")
    return sims.topk(k).indices


@_add("analogy with the wrong sign (a + b - c)", "analogy", {"test_analogy"}, "check_analogy", "check the sign")
def analogy_wrong_sign(table, a, b, c, k=1):
    query = table[a] + table[b] - table[c]
    sims = cosine_similarity(query, table)
    sims[[a, b, c]] = float("-inf")
    return sims.topk(k).indices


# ---- from scratch means from scratch ------------------------------------------------------
@_add("calls torch.softmax (the exercise re-implements it)", "softmax", SOFTMAX, "check_softmax", "may not call torch.softmax")
def softmax_builtin(x, dim=-1, temperature=1.0):
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return torch.softmax(x / temperature, dim=dim)
