"""Hidden tests for chapter 02: randomized shapes, dtypes, masks and weights."""
import numpy as np
import torch

from .. import attention as ref
from . import function_case, hidden_test, layer_case, module_case

LEADING = [(), (2,), (2, 3), (1, 4)]          # batch and head dimensions broadcast


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


def _tensor(rng, shape, dtype, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape) * scale).to(dtype)


def _qkv(rng, lead=None, dtype=None):
    lead = _pick(rng, LEADING) if lead is None else lead
    dtype = dtype or _pick(rng, [torch.float32, torch.float64])
    nq, nk, dk, dv = (int(x) for x in rng.integers(1, 8, size=4))
    scale = float(rng.uniform(0.5, 3.0))
    return (_tensor(rng, lead + (nq, dk), dtype, scale), _tensor(rng, lead + (nk, dk), dtype, scale),
            _tensor(rng, lead + (nk, dv), dtype))


def _random_mask(rng, shape):
    """A bool mask in which every query row can see at least one key (no all-masked rows)."""
    m = rng.random(shape) < 0.6
    m[..., int(rng.integers(shape[-1]))] = True
    return torch.from_numpy(m)


@hidden_test("ch02.sdpa_unmasked")
def sdpa_unmasked(rng):
    cases = []
    for i in range(10):
        q, k, v = _qkv(rng, lead=LEADING[i % len(LEADING)])
        cases.append(function_case(ref.scaled_dot_product_attention, [q, k, v], rng=rng,
                                   grad_args=(0, 1, 2) if i % 3 == 0 else ()))
    # Large logits: a softmax that exponentiates raw scores overflows here.
    q, k, v = _qkv(rng, lead=(2,), dtype=torch.float32)
    cases.append(function_case(ref.scaled_dot_product_attention, [q * 40, k * 40, v]))
    return cases


@hidden_test("ch02.sdpa_masked")
def sdpa_masked(rng):
    cases = []
    for i in range(10):
        lead = LEADING[1 + i % 3]
        q, k, v = _qkv(rng, lead=lead)
        nq, nk = q.shape[-2], k.shape[-2]
        kind = i % 4
        if kind == 0:                              # one mask per batch element and head
            mask = _random_mask(rng, lead + (nq, nk))
        elif kind == 1:                            # one mask shared by the whole batch
            mask = _random_mask(rng, (nq, nk))
        elif kind == 2:                            # key padding: [B, 1, ..., 1, N_k]
            mask = _random_mask(rng, (lead[0],) + (1,) * (len(lead) - 1) + (1, nk))
        else:                                      # causal: square scores
            n = min(nq, nk)
            q, k, v = q[..., :n, :], k[..., :n, :], v[..., :n, :]
            mask = ref.causal_mask(n)
        cases.append(function_case(ref.scaled_dot_product_attention, [q, k, v], {"mask": mask}, rng=rng,
                                   grad_args=(0, 1, 2) if i % 3 == 0 else ()))
    return cases


@hidden_test("ch02.causal_mask")
def causal_mask(rng):
    return [function_case(ref.causal_mask, [n]) for n in (1, 2, 3, 5, 8, int(rng.integers(9, 30)))]


@hidden_test("ch02.self_attention")
def self_attention(rng):
    cases = []
    for i in range(8):
        d_model = int(rng.integers(2, 12))
        init = {"d_model": d_model, "d_head": None if i % 3 == 0 else int(rng.integers(1, 9)), "bias": i % 4 != 3}
        dtype = _pick(rng, [torch.float32, torch.float64])
        module = ref.SelfAttention(**init).to(dtype)
        lead = LEADING[i % len(LEADING)]
        n = int(rng.integers(1, 8))
        x = _tensor(rng, lead + (n, d_model), dtype)
        kwargs = {"mask": ref.causal_mask(n)} if i % 2 else {}
        cases.append(module_case(module, init, [x], kwargs))
    return cases


@hidden_test("ch02.cross_attention")
def cross_attention(rng):
    cases = []
    for i in range(8):
        init = {"d_query": int(rng.integers(1, 10)), "d_context": int(rng.integers(1, 10)),
                "d_head": int(rng.integers(1, 9)), "bias": i % 4 != 3}
        dtype = _pick(rng, [torch.float32, torch.float64])
        module = ref.CrossAttention(**init).to(dtype)
        lead = LEADING[i % len(LEADING)]
        nq, nk = (int(x) for x in rng.integers(1, 8, size=2))
        x = _tensor(rng, lead + (nq, init["d_query"]), dtype)
        context = _tensor(rng, lead + (nk, init["d_context"]), dtype)
        kwargs = {"mask": _random_mask(rng, (nq, nk))} if i % 2 else {}
        cases.append(module_case(module, init, [x, context], kwargs))
    return cases


@hidden_test("ch02.equivariance_gap")
def equivariance_gap(rng):
    cases = []
    for i, kind in enumerate(["linear", "attention", "causal", "cumsum", "attention", "causal"]):
        n, d = int(rng.integers(3, 9)), int(rng.integers(2, 7))
        lead = LEADING[i % 3]
        x = _tensor(rng, lead + (n, d), torch.float64)
        weight = _tensor(rng, (d, d), torch.float64)
        perm = torch.from_numpy(rng.permutation(n))
        while n > 1 and bool((perm == torch.arange(n)).all()):   # the identity proves nothing
            perm = torch.from_numpy(rng.permutation(n))
        cases.append(layer_case(ref.equivariance_gap, kind, weight, [x, perm],
                                tol={np.dtype("float64"): (1e-6, 1e-6)}))
    return cases
