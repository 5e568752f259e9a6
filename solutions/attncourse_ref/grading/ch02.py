"""Hidden tests for chapter 02: randomized shapes, dtypes, masks and weights."""
import itertools

import numpy as np
import torch

from attncourse.checks.ch02 import SDPA_ALLOWED, SDPA_BUILTINS

from .. import attention as ref
from . import fixed, function_case, hidden_test, layer_case, module_case

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


@hidden_test("ch02.sdpa_unmasked", forbid=SDPA_BUILTINS, allow=SDPA_ALLOWED)
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


@hidden_test("ch02.sdpa_masked", forbid=SDPA_BUILTINS, allow=SDPA_ALLOWED)
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


def check_data():
    """Fixed inputs and expected values for the visible checks (tools/make_check_data.py writes them)."""
    q, k, v = fixed((3, 4), 1), fixed((5, 4), 2), fixed((5, 2), 3)
    mask = torch.tensor([[1, 1, 0, 0, 1], [0, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    out, w = ref.scaled_dot_product_attention(q, k, v)
    mout, mw = ref.scaled_dot_product_attention(q, k, v, mask)
    attention = {"q": q, "k": k, "v": v, "raw_scores": q @ k.T, "output": out, "weights": w,
                 "mask": mask, "masked_output": mout, "masked_weights": mw}

    torch.manual_seed(0)
    sa = ref.SelfAttention(4, 3).double()
    x = fixed((5, 4), 4)
    y, a = sa(x)
    orders = {}
    blocks = dict(zip("QKV", sa.qkv.weight.detach().split(3))), dict(zip("QKV", sa.qkv.bias.detach().split(3)))
    for order in itertools.permutations("QKV"):
        # A learner who splits the fused output as `order` reads block i as order[i]:
        # equivalent to the reference with the blocks rearranged accordingly.
        other = ref.SelfAttention(4, 3).double()
        placed = {name: i for i, name in enumerate(order)}
        with torch.no_grad():
            other.qkv.weight.copy_(torch.cat([blocks[0]["QKV"[placed[n]]] for n in "QKV"]))
            other.qkv.bias.copy_(torch.cat([blocks[1]["QKV"[placed[n]]] for n in "QKV"]))
        orders["".join(order)] = other(x)[0]
    self_attention = {"init": {"d_model": 4, "d_head": 3}, "state": dict(sa.state_dict()), "x": x,
                      "output": y, "weights": a, "causal_output": sa(x, ref.causal_mask(5))[0],
                      "split_orders": orders}

    torch.manual_seed(1)
    ca = ref.CrossAttention(3, 5, 2).double()
    xq, ctx = fixed((2, 3), 5), fixed((4, 5), 6)
    cy, cw = ca(xq, ctx)
    swapped = ref.CrossAttention(3, 5, 2).double()
    swapped.load_state_dict(ca.state_dict())
    with torch.no_grad():
        kw, vw = ca.kv_proj.weight.split(2)
        kb, vb = ca.kv_proj.bias.split(2)
        swapped.kv_proj.weight.copy_(torch.cat([vw, kw]))
        swapped.kv_proj.bias.copy_(torch.cat([vb, kb]))
    cmask = torch.tensor([[1, 0, 1, 1], [0, 1, 0, 0]], dtype=torch.bool)
    cross_attention = {"init": {"d_query": 3, "d_context": 5, "d_head": 2}, "state": dict(ca.state_dict()),
                       "x": xq, "context": ctx, "output": cy, "weights": cw, "kv_swapped_output": swapped(xq, ctx)[0],
                       "mask": cmask, "masked_output": ca(xq, ctx, cmask)[0]}
    return {"attention": attention, "causal_mask_5": ref.causal_mask(5),
            "self_attention": self_attention, "cross_attention": cross_attention}
