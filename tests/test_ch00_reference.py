"""Unit tests of the chapter 00 reference (softmax with temperature, cosine similarity, analogy)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attncourse_ref import foundations as ref
from attncourse_ref.grading.ch00 import known_table

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4)


@given(shape=shapes, seed=st.integers(0, 2**31 - 1), t=st.floats(0.05, 20), scale=st.floats(0.1, 1000))
@settings(max_examples=60, deadline=None)
def test_softmax_matches_torch(shape, seed, t, scale):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale
    for dim in range(-len(shape), len(shape)):
        torch.testing.assert_close(ref.softmax(x, dim, t), torch.softmax(x / t, dim), atol=1e-12, rtol=1e-9)


def test_softmax_extremes():
    x = torch.tensor([[1000.0, 999.0, float("-inf")], [-2000.0, -2001.0, -2000.0]])
    out = ref.softmax(x)
    assert torch.isfinite(out).all() and out[0, 2] == 0
    torch.testing.assert_close(out.sum(-1), torch.ones(2))
    tiny = ref.softmax(torch.tensor([1.0, 3.0, 2.0, 3.0]), temperature=1e-30)
    torch.testing.assert_close(tiny, torch.tensor([0.0, 0.5, 0.0, 0.5]))
    for t in (0.0, -1.0):
        with pytest.raises(ValueError):
            ref.softmax(x, temperature=t)


def test_softmax_gradient_matches_torch():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    g = torch.randn(3, 4, dtype=torch.float64)
    (ref.softmax(x, 0, 0.7) * g).sum().backward()
    (torch.softmax(x2 / 0.7, 0) * g).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


@given(seed=st.integers(0, 2**31 - 1), d=st.integers(1, 10))
@settings(max_examples=40, deadline=None)
def test_cosine_matches_torch(seed, d):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(4, 1, d, generator=g, dtype=torch.float64), torch.randn(1, 3, d, generator=g, dtype=torch.float64)
    torch.testing.assert_close(ref.cosine_similarity(a, b), torch.nn.functional.cosine_similarity(a, b, dim=-1))
    torch.testing.assert_close(ref.cosine_similarity(a.mT, b.mT, dim=-2), ref.cosine_similarity(a, b))


def test_analogy_known_table_and_exclusion():
    words, table = known_table(np.random.default_rng(0))
    w = {x: i for i, x in enumerate(words)}
    assert words[int(ref.analogy(table, w["father"], w["man"], w["woman"]))] == "mother"
    top = ref.analogy(table, w["king"], w["man"], w["woman"], k=5)
    assert top.dtype == torch.long and not set(top.tolist()) & {w["king"], w["man"], w["woman"]}
    sims = ref.cosine_similarity(table[w["king"]] - table[w["man"]] + table[w["woman"]], table)
    assert (sims[top[:-1]] >= sims[top[1:]]).all()
