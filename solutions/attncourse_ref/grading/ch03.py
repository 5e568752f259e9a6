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


# ---- attention as an RNN again ------------------------------------------------------------------------------------
def _features(rng, shape, dtype):
    """Positive features, as a feature map such as elu(x) + 1 gives them."""
    return torch.from_numpy(rng.random(shape) + 0.05).to(dtype)


def _linear_inputs(rng, i, t):
    lead = [(), (2,), (2, 3), (1,)][i % 4]
    dtype = torch.float32 if i % 4 == 3 else torch.float64
    dk, dv = int(rng.integers(1, 7)), int(rng.integers(1, 7))
    return (_features(rng, lead + (t, dk), dtype), _features(rng, lead + (t, dk), dtype),
            _tensor(rng, lead + (t, dv), dtype))


def _linear_cases(rng, fn, lengths, extra=lambda i, t: []):
    cases = []
    for i, t in enumerate(lengths):
        q, k, v = _linear_inputs(rng, i, t)
        grads = {"rng": rng, "grad_args": (0, 1, 2)} if i % 3 == 1 else {}
        cases.append(function_case(fn, [q, k, v] + extra(i, t), **grads))
    return cases


# As for tiled attention: on a sequence where the T x T table of the parallel form cannot hide (4096 x 4096 float32 =
# 64 MiB), the kernel's peak resident memory may grow by at most 16 MiB.
def _linear_memory_case(rng, fn, extra=()):
    q, k, v = _features(rng, (FULL_MATRIX_N, 8), torch.float32), _features(rng, (FULL_MATRIX_N, 8), torch.float32), \
        _tensor(rng, (FULL_MATRIX_N, 8), torch.float32)
    case = function_case(fn, [q, k, v, *extra], describe=f"(T = {FULL_MATRIX_N}, d = 8: the T x T table would take "
                                                          f"{FULL_MATRIX_N ** 2 * 4 >> 20} MiB)")
    case.call["peak_bytes"] = PEAK_LIMIT
    return case


@hidden_test("ch03.linear_attention")
def linear_attention(rng):
    return _linear_cases(rng, ref.linear_attention, [1, 5, 8, 3, 12, int(rng.integers(6, 20))])


@hidden_test("ch03.linear_attention_recurrent")
def linear_attention_recurrent(rng):
    return _linear_cases(rng, ref.linear_attention_recurrent, [1, 5, 8, 3, 12, int(rng.integers(6, 20))]) + \
        [_linear_memory_case(rng, ref.linear_attention_recurrent)]


@hidden_test("ch03.linear_attention_chunked")
def linear_attention_chunked(rng):
    # (T, chunk): not divisible, chunk 1, chunk > T, chunk = T, several whole chunks
    shapes = [(7, 3), (5, 1), (4, 9), (8, 8), (12, 4), (int(rng.integers(10, 30)), int(rng.integers(2, 6)))]
    return _linear_cases(rng, ref.linear_attention_chunked, [t for t, _ in shapes], lambda i, t: [shapes[i][1]]) + \
        [_linear_memory_case(rng, ref.linear_attention_chunked, (64,))]


def _delta_case(rng, i, gated):
    lead = [(), (2,), (2, 3), (1,), (3,), ()][i]
    dtype = torch.float32 if i == 3 else torch.float64
    # One key of a single feature (case 0), where the default scale d_k ** -0.5 is 1; wider keys elsewhere, so that
    # an unscaled read fails every case that leaves the scale to the default.
    t, dk, dv = int(rng.integers(1, 13)), 1 if i == 0 else int(rng.integers(2, 7)), int(rng.integers(1, 7))
    q, k, v = (_tensor(rng, lead + (t, d), dtype) for d in (dk, dk, dv))
    if i != 5:                                                 # keys L2-normalised, as DeltaNet's are; one case not
        k = k / k.norm(dim=-1, keepdim=True)
    beta = torch.from_numpy(rng.uniform(0.1, 1.0, lead + (t,))).to(dtype)
    if i == 2:
        beta = torch.ones_like(beta)                           # beta = 1: the write replaces what k_t returned
    args = [q, k, v, beta]
    if gated:
        args.append(torch.from_numpy(-rng.uniform(0.0, 1.5, lead + (t,))).to(dtype))
    kwargs = {"scale": float(rng.uniform(0.3, 2.0))} if i == 4 else {}
    grads = {"rng": rng, "grad_args": tuple(range(len(args))), "grad_outputs": (0, 1)} if i in (1, 4) else {}
    return function_case(ref.delta_rule, args, kwargs, **grads)


@hidden_test("ch03.delta_rule")
def delta_rule(rng):
    return [_delta_case(rng, i, gated=False) for i in range(6)]


@hidden_test("ch03.delta_rule_gated")
def delta_rule_gated(rng):
    return [_delta_case(rng, i, gated=True) for i in range(6)]


def _linear_check_data(g):
    """Linear attention on a fixed input, and what the usual mistakes give on it (the visible checks name them)."""
    q, k = (torch.rand(2, 7, 4, generator=g, dtype=torch.float64) + 0.1 for _ in range(2))
    v = torch.randn(2, 7, 3, generator=g, dtype=torch.float64)
    scores = q @ k.transpose(-2, -1)
    causal = scores.tril()
    chunk_no_state = torch.cat([ref.linear_attention(q[..., s:s + 3, :], k[..., s:s + 3, :], v[..., s:s + 3, :])
                                for s in range(0, 7, 3)], dim=-2)
    chunk_not_causal = []
    for s in range(0, 7, 3):
        before = scores[..., s:s + 3, :s + 3]                   # earlier chunks in full, this chunk unmasked
        chunk_not_causal.append(before @ v[..., :s + 3, :] / before.sum(-1, keepdim=True))
    return {"q": q, "k": k, "v": v, "output": ref.linear_attention(q, k, v),
            "not_causal": scores @ v / scores.sum(-1, keepdim=True),
            "unnormalised": causal @ v,
            "normalised_over_all": causal @ v / scores.sum(-1, keepdim=True),
            "read_before_write": scores.tril(-1) @ v / scores.tril(-1).sum(-1, keepdim=True),
            "chunk3_no_state": chunk_no_state, "chunk3_not_causal": torch.cat(chunk_not_causal, dim=-2)}


def _delta_check_data(g):
    q, k, v = (torch.randn(2, 7, d, generator=g, dtype=torch.float64) for d in (4, 4, 3))
    k = k / k.norm(dim=-1, keepdim=True)
    beta = torch.rand(2, 7, generator=g, dtype=torch.float64) * 0.8 + 0.2
    gate = -torch.rand(2, 7, generator=g, dtype=torch.float64)
    o, state = ref.delta_rule(q, k, v, beta)
    o_g, state_g = ref.delta_rule(q, k, v, beta, gate)
    hebbian = (beta[..., None] * k).transpose(-2, -1) @ v      # sum_t beta_t k_t v_t^T
    before, S = [], torch.zeros_like(state)
    for t in range(7):                                         # o_t read from the state before token t's write
        before.append((0.5 * q[..., t, None, :] @ S)[..., 0, :])
        error = v[..., t, :] - (k[..., t, None, :] @ S)[..., 0, :]
        S = S + beta[..., t, None, None] * k[..., t, :, None] * error[..., None, :]
    before = torch.stack(before, dim=-2)
    without_exp, after = torch.zeros_like(state), torch.zeros_like(state)
    for t in range(7):
        for S, decay, first in ((without_exp, gate[..., t], True), (after, gate[..., t].exp(), False)):
            if first:
                S.mul_(decay[..., None, None])
            err = v[..., t, :] - (k[..., t, None, :] @ S)[..., 0, :]
            S.add_(beta[..., t, None, None] * k[..., t, :, None] * err[..., None, :])
            if not first:
                S.mul_(decay[..., None, None])
    return {"q": q, "k": k, "v": v, "beta": beta, "g": gate, "output": o, "state": state,
            "output_scale_1": ref.delta_rule(q, k, v, beta, scale=1.0)[0],
            "hebbian_state": hebbian, "read_before_write": before, "unscaled": o * 2.0,
            "gated_output": o_g, "gated_state": state_g, "gate_without_exp": without_exp, "gate_after_write": after}


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
        "linear": _linear_check_data(g), "delta": _delta_check_data(g),
    }
