"""Hidden tests for chapter 03: multi-head attention and its cost."""
import numpy as np
import torch
from torch import nn

from .. import multihead as ref
from attncourse.checks.ch03 import MHA_BUILTINS, TILED_ALLOWED, TILED_BUILTINS

from . import function_case, hidden_test, module_case


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


def _tensor(rng, shape, dtype, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape) * scale).to(dtype)


DTYPES = [torch.float32, torch.float64]


@hidden_test("ch03.split_heads")
def split_heads(rng):
    cases = []
    for i, lead in enumerate([(), (2,), (2, 3), (1,), (3,), ()]):
        h = int(rng.integers(1, 5))
        x = _tensor(rng, lead + (int(rng.integers(1, 7)), h * int(rng.integers(1, 5))), DTYPES[i % 2])
        cases.append(function_case(ref.split_heads, [x, h]))
    return cases


@hidden_test("ch03.merge_heads")
def merge_heads(rng):
    cases = []
    for i, lead in enumerate([(), (2,), (2, 3), (1,), (3,), ()]):
        shape = lead + tuple(int(s) for s in rng.integers(2, 6, size=3))
        cases.append(function_case(ref.merge_heads, [_tensor(rng, shape, DTYPES[i % 2])]))
    return cases


@hidden_test("ch03.split_in_proj")
def split_in_proj(rng):
    cases = []
    for i in range(4):
        d = int(rng.integers(2, 9))
        mha = nn.MultiheadAttention(d, 1, dtype=DTYPES[i % 2])
        with torch.no_grad():
            mha.in_proj_bias.normal_()
        cases.append(function_case(ref.split_in_proj, [mha.in_proj_weight.detach(), mha.in_proj_bias.detach()]))
    return cases


def _mha(rng, d, h, dtype):
    """The reference module with the weights of a randomly initialised torch.nn.MultiheadAttention."""
    theirs = nn.MultiheadAttention(d, h, batch_first=True, dtype=dtype)
    with torch.no_grad():
        theirs.in_proj_bias.copy_(_tensor(rng, (3 * d,), dtype))
        theirs.out_proj.bias.copy_(_tensor(rng, (d,), dtype))
    return ref.load_from_torch(ref.MultiHeadAttention(d, h).to(dtype), theirs)


def _mha_setup(rng, i):
    h = int(rng.integers(1, 5))
    d = h * int(rng.integers(1, 5))
    dtype = DTYPES[i % 2]
    b, nq, nk = int(rng.integers(1, 4)), int(rng.integers(1, 7)), int(rng.integers(1, 7))
    return h, d, dtype, b, nq, nk


@hidden_test("ch03.mha", forbid=MHA_BUILTINS)
def mha(rng):
    cases = []
    for i in range(6):
        h, d, dtype, b, nq, nk = _mha_setup(rng, i)
        module = _mha(rng, d, h, dtype)
        x = _tensor(rng, (b, nq, d), dtype)
        if i % 2:                                              # cross-attention: keys and values elsewhere
            ctx = _tensor(rng, (b, nk, d), dtype)
            args = [x, ctx, ctx]
        else:
            args = [x, x, x]
        cases.append(module_case(module, {"d_model": d, "n_heads": h}, args))
    return cases


@hidden_test("ch03.mha_masks", forbid=MHA_BUILTINS)
def mha_masks(rng):
    cases = []
    for i in range(8):
        h, d, dtype, b, nq, nk = _mha_setup(rng, i)
        h = max(h, 2)
        d = h * int(rng.integers(1, 4))
        module = _mha(rng, d, h, dtype)
        x = _tensor(rng, (b, nq, d), dtype)
        kind = i % 4          # 0: key mask, 1: causal, 2: key mask with cross-attention, 3: both
        ctx = _tensor(rng, (b, nk, d), dtype) if kind == 2 else x
        kwargs = {}
        if kind != 1:
            keep = rng.random((b, ctx.shape[1])) < 0.6
            keep[:, 0] = True                                  # every query keeps at least one key
            kwargs["key_mask"] = torch.from_numpy(keep)
        if kind in (1, 3):
            kwargs["causal"] = True
        cases.append(module_case(module, {"d_model": d, "n_heads": h}, [x, ctx, ctx], kwargs))
    return cases


@hidden_test("ch03.attention_flops")
def attention_flops(rng):
    cases = [function_case(ref.attention_flops, [1, 1, 1]), function_case(ref.attention_flops, [4, 8, 2])]
    for _ in range(4):
        h = int(rng.integers(1, 17))
        cases.append(function_case(ref.attention_flops, [int(rng.integers(1, 5000)), h * int(rng.integers(1, 128)), h]))
    return cases


@hidden_test("ch03.attention_memory")
def attention_memory(rng):
    cases = [function_case(ref.attention_memory, [4, 8, 2]), function_case(ref.attention_memory, [100_000, 8192, 64])]
    for i in range(4):
        h = int(rng.integers(1, 17))
        args = [int(rng.integers(1, 5000)), h * int(rng.integers(1, 128)), h]
        kwargs = {"bytes_per_element": int(_pick(rng, [2, 8]))} if i % 2 else {}
        cases.append(function_case(ref.attention_memory, args, kwargs))
    return cases


def _tiled_cases(rng, causal):
    cases = []
    # (N_q, N_k, block_size): not divisible, block 1, block > N, equal, one block exactly
    shapes = [(7, 7, 3), (5, 5, 1), (4, 4, 9), (8, 8, 8), (10, 10, 4), (12, 12, 5)]
    if not causal:
        shapes += [(3, 9, 2), (9, 4, 3)]
    for i, (nq, nk, bs) in enumerate(shapes):
        lead = [(), (2,), (2, 3)][i % 3]
        dtype = DTYPES[i % 2]
        dk, dv = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        scale = 4.0 if i == 4 else 1.0                       # peaky rows: the running max moves a lot
        q, k, v = (_tensor(rng, lead + (nq, dk), dtype, scale), _tensor(rng, lead + (nk, dk), dtype, scale),
                   _tensor(rng, lead + (nk, dv), dtype))
        if i == 5:
            k[..., -1, :] *= 30.0                            # the largest score sits in the last block
        kwargs = {"causal": True} if causal else {}
        cases.append(function_case(ref.tiled_attention, [q, k, v, bs], kwargs))
    # very large scores: exp without subtracting the running max overflows
    q, k, v = _tensor(rng, (6, 4), torch.float32, 30.0), _tensor(rng, (6, 4), torch.float32, 30.0), \
        _tensor(rng, (6, 3), torch.float32)
    cases.append(function_case(ref.tiled_attention, [q, k, v, 2], {"causal": True} if causal else {},
                               tol={np.dtype("float32"): (1e-4, 1e-4)}))
    return cases


# The stated constraint, graded: on a sequence long enough that the full score matrix cannot hide
# (4096 x 4096 float32 = 64 MiB, twice over with the weights), the kernel's peak resident memory,
# measured by the grading server from outside the kernel, may grow by at most 16 MiB.
FULL_MATRIX_N, PEAK_LIMIT = 4096, 16 << 20


def _memory_bound_case(rng, causal):
    q, k, v = (_tensor(rng, (FULL_MATRIX_N, 32), torch.float32) for _ in range(3))
    case = function_case(ref.tiled_attention, [q, k, v, 256], {"causal": True} if causal else {},
                         describe=f"(N = {FULL_MATRIX_N}, d = 32, block_size = 256{', causal' if causal else ''}: "
                                  f"the full score matrix would take {FULL_MATRIX_N ** 2 * 4 >> 20} MiB)")
    case.call["peak_bytes"] = PEAK_LIMIT
    return case


@hidden_test("ch03.tiled_attention", forbid=TILED_BUILTINS, allow=TILED_ALLOWED)
def tiled_attention(rng):
    return _tiled_cases(rng, causal=False) + [_memory_bound_case(rng, causal=False)]


@hidden_test("ch03.tiled_attention_causal", forbid=TILED_BUILTINS, allow=TILED_ALLOWED)
def tiled_attention_causal(rng):
    return _tiled_cases(rng, causal=True) + [_memory_bound_case(rng, causal=True)]


@hidden_test("ch03.sliding_window_mask")
def sliding_window_mask(rng):
    cases = [function_case(ref.sliding_window_mask, [n, w]) for n, w in [(1, 0), (5, 0), (5, 1), (6, 2), (4, 10)]]
    cases.append(function_case(ref.sliding_window_mask, [int(rng.integers(5, 30)), int(rng.integers(1, 5))]))
    return cases


def check_data():
    """Fixed cases for the visible checks (tools/make_check_data.py writes them)."""
    x = torch.arange(2 * 3 * 8, dtype=torch.float64).reshape(2, 3, 8)
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        theirs.in_proj_bias.normal_()
        theirs.out_proj.bias.normal_()
    module = ref.load_from_torch(ref.MultiHeadAttention(8, 2).double(), theirs)
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(2, 4, 8, generator=g, dtype=torch.float64)
    key_mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    y, w = module(xs, xs, xs)
    ym, wm = module(xs, xs, xs, key_mask=key_mask)
    yc, wc = module(xs, xs, xs, causal=True)
    q, k, v = torch.randn(2, 7, 4, generator=g, dtype=torch.float64), torch.randn(2, 7, 4, generator=g, dtype=torch.float64), \
        torch.randn(2, 7, 3, generator=g, dtype=torch.float64)
    # What two classic mistakes produce on the same input, so the visible check can name them.
    no_out = ref.MultiHeadAttention(8, 2).double()
    no_out.load_state_dict(module.state_dict())
    with torch.no_grad():
        no_out.out_proj.weight.copy_(torch.eye(8))
        no_out.out_proj.bias.zero_()
    scale_fix = ref.MultiHeadAttention(8, 2).double()
    scale_fix.load_state_dict(module.state_dict())
    with torch.no_grad():                                 # scores / sqrt(8) = (q * sqrt(4 / 8)) k / sqrt(4)
        scale_fix.q_proj.weight.mul_((4 / 8) ** 0.5)
        scale_fix.q_proj.bias.mul_((4 / 8) ** 0.5)
    return {
        "cost": {"args": [[4, 8, 2], [1000, 512, 8]],
                 "flops": [ref.attention_flops(4, 8, 2), ref.attention_flops(1000, 512, 8)],
                 "memory": [ref.attention_memory(4, 8, 2), ref.attention_memory(1000, 512, 8)]},
        "split": {"x": x, "heads": ref.split_heads(x, 2)},
        "mha": {"init": {"d_model": 8, "n_heads": 2}, "state": dict(module.state_dict()), "x": xs, "output": y,
                "weights": w, "key_mask": key_mask, "masked_output": ym, "masked_weights": wm,
                "causal_output": yc, "causal_weights": wc,
                "no_out_proj_output": no_out(xs, xs, xs)[0], "d_model_scale_output": scale_fix(xs, xs, xs)[0],
                "in_proj_weight": theirs.in_proj_weight, "in_proj_bias": theirs.in_proj_bias},
        "tiled": {"q": q, "k": k, "v": v},
        "window_6_2": ref.sliding_window_mask(6, 2),
    }
