"""Chapter 00: vectors, dot products, softmax and embeddings (reference implementation)."""
import torch


def softmax(x, dim=-1, temperature=1.0):
    """Numerically stable softmax of x / temperature along ``dim``.

    Subtracting the maximum first changes nothing mathematically (softmax is shift-invariant)
    but keeps every exponent <= 0, so exp never overflows; dividing by the temperature after
    the subtraction keeps that true for temperatures near 0, where the result tends to
    argmax (ties share the weight).  Entries equal to -inf get weight exactly 0.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = (x - x.amax(dim=dim, keepdim=True)) / temperature
    e = torch.exp(z)
    return e / e.sum(dim=dim, keepdim=True)


def cosine_similarity(a, b, dim=-1, eps=1e-8):
    """cos(angle) between a and b along ``dim``: a.b / (|a| |b|); a and b broadcast."""
    dot = (a * b).sum(dim=dim)
    norms = a.norm(dim=dim) * b.norm(dim=dim)
    return dot / norms.clamp_min(eps)


def analogy(table, a, b, c, k=1):
    """Rows of ``table`` [V, D] nearest (by cosine) to table[a] - table[b] + table[c].

    "a is to b as ? is to c": analogy(E, father, man, woman) should find mother.
    The three input words are excluded.  Returns a long tensor [k] of row indices, most
    similar first.
    """
    query = table[a] - table[b] + table[c]
    sims = cosine_similarity(query, table)
    sims[[a, b, c]] = float("-inf")
    return sims.topk(k).indices
