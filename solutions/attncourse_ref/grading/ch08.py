"""Hidden tests for chapter 08: RMSNorm, SwiGLU, the top-k router, expert capacity, the MoE layer
(against a dense loop in tests/test_ch08_reference.py), the load-balancing and z-losses, DeepSeek-V3's
biased router, bias update and shared-expert layer, and the parameter count of a (MoE) Transformer."""
import math

import numpy as np
import torch
import torch.nn.functional as F

from .. import moe as ref
from . import fixed, function_case, hidden_test, module_case, module_grad_case, no_history_case

DTYPES = [torch.float32, torch.float64]
# RMSNorm is written from scratch: PyTorch's own may not do it.
from attncourse.checks.ch08 import RMS_NORM_ALLOWED, RMS_NORM_BUILTINS  # noqa: E402
LEADING = [(), (3,), (2, 3), (1, 4)]


def _tensor(rng, shape, dtype, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape) * scale).to(dtype)


def _seed_torch(rng):
    """Module weights drawn by torch, reproducibly from the test's own seed."""
    torch.manual_seed(int(rng.integers(2**31)))


# ---- RMSNorm -------------------------------------------------------------------------------------------
def _rms_norm_cases(rng, grad):
    cases = []
    # (leading shape, D, input scale, eps): a small scale makes eps matter (and where it sits);
    # D = 1 normalises a single number; 1-D inputs have no leading dimension at all.
    settings = [((2, 3), 8, 1.0, 1e-6), ((4,), 5, 0.01, 1e-3), ((2, 2, 3), 16, 3.0, 1e-5), ((3,), 2, 0.05, 0.1),
                ((2, 4), 1, 1.0, 1e-6), ((), 6, 1.0, 1e-6), ((2, 3), 12, 0.02, 1e-2), ((5,), 7, 100.0, 1e-6)]
    for i, (lead, d, scale, eps) in enumerate(settings):
        dtype = DTYPES[i % 2]
        module = ref.RMSNorm(d, eps).to(dtype)
        with torch.no_grad():
            module.weight.copy_(_tensor(rng, (d,), dtype) + 1.0)     # not all ones: the gain must be applied
        n = int(rng.integers(1, 6))
        x = _tensor(rng, lead + (n, d) if lead or i % 3 else (d,), dtype, scale) + float(rng.uniform(-0.5, 0.5)) * scale
        init = {"d": d, "eps": eps}
        cases.append(module_grad_case(module, init, [x], rng=rng) if grad else module_case(module, init, [x]))
    return cases


@hidden_test("ch08.rms_norm", forbid=RMS_NORM_BUILTINS, allow=RMS_NORM_ALLOWED)
def rms_norm(rng):
    return _rms_norm_cases(rng, grad=False)


@hidden_test("ch08.rms_norm_grad", forbid=RMS_NORM_BUILTINS, allow=RMS_NORM_ALLOWED)
def rms_norm_grad(rng):
    return _rms_norm_cases(rng, grad=True)


# ---- SwiGLU ---------------------------------------------------------------------------------------------
@hidden_test("ch08.swiglu_hidden")
def swiglu_hidden(rng):
    settings = [(64, 8), (4096, 256), (512, 64), (3, 1), (4, 2), (100, 7), (768, 32), (5120, 256), (1, 8),
                (int(rng.integers(10, 2000)), int(rng.integers(1, 65)))]
    return [function_case(ref.swiglu_hidden, [d, m]) for d, m in settings]


@hidden_test("ch08.swiglu")
def swiglu(rng):
    cases = []
    for i in range(8):
        d, h = int(rng.integers(2, 10)), int(rng.integers(2, 12))
        dtype = DTYPES[i % 2]
        _seed_torch(rng)
        module = ref.SwiGLU(d, h).to(dtype)
        x = _tensor(rng, LEADING[i % len(LEADING)] + (int(rng.integers(1, 6)), d), dtype, 2.0)
        cases.append(module_case(module, {"d_model": d, "d_hidden": h}, [x]))
    return cases


# ---- router and capacity --------------------------------------------------------------------------------
@hidden_test("ch08.top_k_router")
def top_k_router(rng):
    cases = []
    for i in range(15):
        lead = LEADING[i % len(LEADING)] + (int(rng.integers(1, 6)),)
        tied = i % 3 != 0
        # Tied rows are long (17 to 64 experts): PyTorch sorts ties in index order in rows of up to 16
        # entries even when not asked to be stable, and in no promised order beyond.
        n_experts = int(rng.integers(17, 65)) if tied else int(rng.integers(2, 10))
        k = int(rng.integers(2, 9)) if tied else (int(rng.integers(1, n_experts + 1)) if i % 4 else 1)
        dtype = DTYPES[i % 2]
        if tied:
            # Exact ties: small integers, so many tokens have equal logits (some straddling the k-th place).
            logits = torch.from_numpy(rng.integers(-2, 3, size=lead + (n_experts,)).astype(float)).to(dtype)
        else:
            logits = _tensor(rng, lead + (n_experts,), dtype, float(rng.uniform(0.5, 3.0)))
        cases.append(function_case(ref.top_k_router, [logits, k], rng=rng, grad_args=(0,) if i % 2 == 0 else ()))
    ties = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 2.0, 2.0, 1.0], [3.0, 1.0, 3.0, 3.0]]).repeat(1, 5)   # 20 experts, every row tied
    cases += [function_case(ref.top_k_router, [ties, 2]), function_case(ref.top_k_router, [ties.double(), 3])]
    big = _tensor(rng, (3, 6), torch.float32, 200.0)   # exponentiating raw logits overflows float32
    cases.append(function_case(ref.top_k_router, [big, 2]))
    return cases


def _routed(rng, lead, n_experts, k, skew):
    """Top-k expert choices of random logits; ``skew`` makes expert 0 popular (it overflows)."""
    logits = _tensor(rng, lead + (n_experts,), torch.float64)
    logits[..., 0] += skew
    return ref.top_k_router(logits, k)[1]


@hidden_test("ch08.capacity_mask")
def capacity_mask(rng):
    cases = []
    for i in range(10):
        lead = LEADING[1 + i % 3] if i % 5 else (int(rng.integers(4, 12)),)
        n_experts = int(rng.integers(2, 7))
        k = min(n_experts, 1 + i % 3)
        experts = _routed(rng, lead, n_experts, k, skew=float(rng.uniform(0.0, 2.0)))
        tokens = experts[..., 0].numel()
        capacity = [0, 1, 2, math.ceil(tokens * k / n_experts), tokens][i % 5] if i else 1
        cases.append(function_case(ref.capacity_mask, [experts, n_experts, capacity]))
    return cases


# ---- the MoE layer ---------------------------------------------------------------------------------------
def _moe_case(rng, i, capacity_factor):
    d, h = int(rng.integers(2, 7)), int(rng.integers(2, 8))
    n_experts = int(rng.integers(2, 9))
    k = min(n_experts, 1 + i % 3)
    dtype = DTYPES[i % 2]
    _seed_torch(rng)
    module = ref.MoE(d, h, n_experts, k, capacity_factor).to(dtype)
    if i % 3 == 2 or (capacity_factor is not None and i % 3 == 1):
        with torch.no_grad():          # a popular expert: many others get no token, and it overflows
            module.router.weight[int(rng.integers(n_experts))] += 3.0 * torch.sign(_tensor(rng, (d,), dtype))
    if capacity_factor is None:
        shapes = [(d,), (int(rng.integers(1, 4)), d), (2, int(rng.integers(1, 5)), d), (2, 2, 3, d)]
    else:                              # enough tokens to fill the experts
        shapes = [(int(rng.integers(4, 13)), d), (2, int(rng.integers(3, 7)), d), (2, 2, 3, d)]
    x = _tensor(rng, shapes[i % len(shapes)], dtype)
    init = {"d_model": d, "d_hidden": h, "n_experts": n_experts, "k": k, "capacity_factor": capacity_factor}
    return module_case(module, init, [x])


def _dropped(case):
    """How many (token, slot) assignments the reference drops in a capacity case."""
    init, x = case.call["init"], torch.from_numpy(case.arrays["arg0"])
    tokens = x.reshape(-1, x.shape[-1])
    router = torch.from_numpy(case.arrays[case.call["state"]["router.weight"]])
    experts = ref.top_k_router(tokens @ router.T, init["k"])[1]
    capacity = math.ceil(init["capacity_factor"] * tokens.shape[0] * init["k"] / init["n_experts"])
    return int((~ref.capacity_mask(experts, init["n_experts"], capacity)).sum())


@hidden_test("ch08.moe")
def moe(rng):
    return [_moe_case(rng, i, None) for i in range(12)]


def _exact_capacity(factor, tokens, k, n_experts):
    """True if the capacity does not depend on the order of the products (binary-exact factors)."""
    options = {math.ceil(factor * tokens * k / n_experts), math.ceil(factor * (tokens * k / n_experts)),
               math.ceil(tokens * k * factor / n_experts), math.ceil(factor * tokens * k / n_experts - 1e-9)}
    return len(options) == 1


@hidden_test("ch08.moe_capacity")
def moe_capacity(rng):
    cases, i = [], 0
    factors = [0.5, 1.0, 1.25, 2.0, 0.75]
    while len(cases) < 10:
        case = _moe_case(rng, i, factors[i % len(factors)])
        init, x = case.call["init"], case.arrays["arg0"]
        i += 1
        # Capacities that do not depend on the order of the products, and mostly cases that drop something.
        if _exact_capacity(init["capacity_factor"], int(np.prod(x.shape[:-1])), init["k"], init["n_experts"]) \
                and (_dropped(case) or len(cases) % 4 == 3):
            cases.append(case)
    return cases


# ---- auxiliary losses --------------------------------------------------------------------------------------
@hidden_test("ch08.load_balancing_loss")
def load_balancing_loss(rng):
    cases = []
    for i in range(10):
        lead = LEADING[i % len(LEADING)] + (int(rng.integers(2, 9)),)
        n_experts = int(rng.integers(2, 9))
        k = min(n_experts, 1 + i % 3)
        dtype = DTYPES[i % 2]
        logits = _tensor(rng, lead + (n_experts,), dtype, float(rng.uniform(0.5, 3.0)))
        logits[..., 0] += float(rng.uniform(0.0, 2.0))            # unbalanced: the loss is above 1
        experts = ref.top_k_router(logits, k)[1]
        if i % 4 == 3:                                             # choices after noise or capacity: not the top-k
            experts = ref.top_k_router(logits + _tensor(rng, logits.shape, dtype, 3.0), k)[1]
        cases.append(function_case(ref.load_balancing_loss, [logits, experts], rng=rng, grad_args=(0,)))
    return cases


@hidden_test("ch08.router_z_loss")
def router_z_loss(rng):
    cases = []
    for i in range(8):
        lead = LEADING[i % len(LEADING)] + (int(rng.integers(1, 7)),)
        dtype = DTYPES[i % 2]
        logits = _tensor(rng, lead + (int(rng.integers(2, 9)),), dtype, float(rng.uniform(0.5, 4.0)))
        cases.append(function_case(ref.router_z_loss, [logits], rng=rng, grad_args=(0,)))
    big = _tensor(rng, (4, 5), torch.float32, 10.0) + 120.0        # exp(120) overflows float32
    cases.append(function_case(ref.router_z_loss, [big], rng=rng, grad_args=(0,),
                               tol={np.dtype("float32"): (1e-4, 1e-3)}))
    return cases


# ---- auxiliary-loss-free balancing (DeepSeek-V3) -------------------------------------------------------------
@hidden_test("ch08.biased_top_k_router")
def biased_top_k_router(rng):
    cases = []
    for i in range(14):
        lead = LEADING[i % len(LEADING)] + (int(rng.integers(2, 7)),)
        tied = i % 2 == 1 or i == 0
        dtype = torch.float32 if i % 4 == 0 else torch.float64
        # Tied rows are long (17 to 40 experts): see top_k_router's test.
        n_experts = int(rng.integers(17, 41)) if tied else int(rng.integers(3, 12))
        k = int(rng.integers(2, 7)) if tied else int(rng.integers(1, n_experts))
        if tied:      # small integers: exact ties in logits + bias, some straddling the k-th place
            logits = torch.from_numpy(rng.integers(-2, 3, size=lead + (n_experts,)).astype(float)).to(dtype)
            bias = torch.from_numpy(rng.integers(-1, 2, size=n_experts).astype(float)).to(dtype)
        else:         # a bias as large as the logits: it changes many tokens' choices
            logits = _tensor(rng, lead + (n_experts,), dtype, float(rng.uniform(0.5, 2.0)))
            bias = _tensor(rng, (n_experts,), dtype, 1.5)
        cases.append(function_case(ref.biased_top_k_router, [logits, bias, k], rng=rng,
                                   grad_args=(0, 1) if i % 2 == 0 else ()))
    return cases


def _loads(rng, n_experts, tokens, k, last_idle=False, at_whole_mean=False):
    """Choices ([tokens, k], k different experts per token) whose per-expert loads are drawn: some experts
    exactly at the mean load (at its whole part when T k / E is not whole), some idle, the others above or
    below it; with ``last_idle``, the last expert gets no token (a count by bincount needs its minlength); with
    ``at_whole_mean``, at least one expert sits exactly at the mean's whole part."""
    mean = tokens * k // n_experts
    counts = np.full(n_experts, mean)
    counts[rng.choice(n_experts, tokens * k - mean * n_experts, replace=False)] += 1   # the remainder, if any
    movable = [e for e in range(n_experts) if rng.random() < 0.7]
    movable = movable if len(movable) >= 2 else [0, n_experts - 1]
    for _ in range(3 * n_experts):
        a, b = rng.choice(movable, 2, replace=False)
        step = int(rng.integers(1, max(2, mean // 2 + 1)))
        if counts[a] >= step and counts[b] + step <= tokens:
            counts[a] -= step
            counts[b] += step
    if (counts == mean).all():
        counts[movable[:2]] += [-1, 1]
    if last_idle:
        for _ in range(counts[-1]):                           # hand its assignments to experts with room
            counts[int(rng.choice(np.flatnonzero(counts[:-1] < tokens)))] += 1
        counts[-1] = 0
    if at_whole_mean and not (counts[:-1] == mean).any():
        # move load between expert 0 and the others until it sits at the mean's whole part
        while counts[0] != mean:
            step = 1 if counts[0] < mean else -1
            donors = [e for e in range(1, n_experts - (1 if last_idle else 0))
                      if (counts[e] > 0 if step > 0 else counts[e] < tokens)]
            counts[int(rng.choice(donors))] -= step
            counts[0] += step
    flat = np.repeat(np.arange(n_experts), counts)           # expert runs of at most `tokens`
    grid = flat.reshape(k, tokens).T                          # token t: entries t, T + t, ...: k different experts
    return torch.from_numpy(grid[rng.permutation(tokens)].copy()).long()


@hidden_test("ch08.update_bias")
def update_bias(rng):
    cases = []
    for i in range(10):
        dtype = torch.float32 if i % 3 == 0 else torch.float64
        n_experts = int(rng.integers(3, 17))
        k = min(n_experts - 1, 1 + i % 4)
        if i % 5 == 4:           # the choices of a skewed router, any leading shape
            lead = LEADING[1 + i % 3] + (int(rng.integers(3, 9)),)
            experts = _routed(rng, lead, n_experts, k, skew=2.0)
        else:                    # drawn loads: T k a multiple of E, so some experts sit exactly at the mean
            tokens = n_experts * int(rng.integers(2, 6))
            experts = _loads(rng, n_experts, tokens, k)
            if i % 2:
                experts = experts.reshape(2, tokens // 2, k) if tokens % 2 == 0 else experts[None]
        bias = _tensor(rng, (n_experts,), dtype, 0.01)
        gamma = [1e-3, 0.01, 0.25, 0.05][i % 4]
        if i % 3 == 1:           # a bias that requires grad (a module's buffer may): the new one has no history
            cases.append(no_history_case(ref.update_bias, [bias, experts, gamma], held=(0,),
                                         describe=f"(bias [{n_experts}] {str(dtype)[6:]} with requires_grad=True, "
                                                  f"experts {list(experts.shape)}, gamma={gamma})"))
            continue
        cases.append(function_case(ref.update_bias, [bias, experts, gamma]))
    for i in range(12):
        # The mistakes the text names, in every one of these cases (so each is caught by most of the test's cases,
        # under any salt): T k not a multiple of E (experts at the whole part of the mean are below it, not at it:
        # T * k // E gets them wrong), the last expert idle (bincount without minlength returns E - 1 loads), and a
        # bias that requires grad (the new bias must carry no autograd history).
        dtype = DTYPES[i % 2]
        n_experts = int(rng.integers(3, 17))
        k = int(rng.integers(1, n_experts - 1))     # k <= E - 2: with the last expert idle, one can sit at the mean
        tokens = n_experts * int(rng.integers(2, 6)) + int(rng.integers(1, n_experts))
        while tokens * k % n_experts == 0:           # r k can be a multiple of E; r + 1, ... not all
            tokens += 1
        experts = _loads(rng, n_experts, tokens, k, last_idle=True, at_whole_mean=True)
        bias = _tensor(rng, (n_experts,), dtype, 0.01)
        cases.append(no_history_case(ref.update_bias, [bias, experts, [0.01, 0.05][i % 2]], held=(0,),
                                     describe=f"({tokens} tokens, k={k}, {n_experts} experts, T*k/E not whole, the "
                                              f"last expert idle, bias {str(dtype)[6:]} with requires_grad=True)"))
    return cases


@hidden_test("ch08.deepseek_moe")
def deepseek_moe(rng):
    cases = []
    for i in range(12):
        d, h = int(rng.integers(2, 7)), int(rng.integers(2, 8))
        n_experts = int(rng.integers(3, 9))
        k = min(n_experts - 1, [2, 1, 3, 2, 2][i % 5])
        # No shared expert in one float32 case and three float64 ones: only there does an output buffer made in
        # float32 show (with a shared expert, float32 + float64 is float64), and a shared expert left out or gated
        # shows only in the other eight.
        n_shared = 0 if i in (3, 7, 10, 11) else [1, 1, 2, 1, 1][i % 5]
        dtype = torch.float32 if i % 3 == 0 else torch.float64
        _seed_torch(rng)
        module = ref.DeepSeekMoE(d, h, n_experts, k, n_shared).to(dtype)
        with torch.no_grad():     # a bias as large as the logits, so it changes the choices
            module.bias.copy_(_tensor(rng, (n_experts,), dtype, 1.5))
        shapes = [(d,), (int(rng.integers(2, 6)), d), (2, int(rng.integers(2, 5)), d), (2, 2, 3, d)]
        x = _tensor(rng, shapes[i % len(shapes)] if i else (5, d), dtype)
        init = {"d_model": d, "d_hidden": h, "n_experts": n_experts, "k": k, "n_shared": n_shared}
        # seven with gradients, all with k >= 2: the gates carry the router's gradient to x (routing under
        # torch.no_grad() does not; with k = 1 every gate is 1 and carries none)
        cases.append(module_case(module, init, [x]) if k == 1 or i == 9 else module_grad_case(module, init, [x], rng=rng))
    return cases


# ---- bookkeeping -------------------------------------------------------------------------------------------
@hidden_test("ch08.transformer_parameters")
def transformer_parameters(rng):
    settings = [(4096, 32, 32, 8, 14336, 32000, 8, 2),        # Mixtral 8x7B
                (4096, 32, 32, 32, 11008, 32000, 1, 1),       # LLaMA-7B shape: dense, no GQA
                (64, 2, 4, 4, 176, 65, 1, 1), (64, 2, 4, 2, 88, 65, 8, 2), (48, 3, 6, 3, 96, 100, 4, 1),
                (128, 4, 8, 1, 256, 500, 16, 4), (32, 1, 2, 2, 64, 10, 4, 4)]
    d = int(rng.integers(1, 9)) * 16
    settings.append((d, int(rng.integers(1, 6)), 4, 2, int(rng.integers(8, 300)), int(rng.integers(10, 1000)),
                     int(rng.integers(2, 9)), 2))
    return [function_case(ref.transformer_parameters, list(s)) for s in settings]


# ---- stored cases for the visible checks ------------------------------------------------------------------
def _rms_variants(x, weight, eps):
    """What the common RMSNorm mistakes return on x (the visible check names the one that matches)."""
    ms = x.pow(2).mean(-1, keepdim=True)
    centred = x - x.mean(-1, keepdim=True)
    return {"wrong_axis": x / torch.sqrt(x.pow(2).mean(-2, keepdim=True) + eps) * weight,
            "mean_subtracted": centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + eps) * weight,
            "eps_outside": x / (torch.sqrt(ms) + eps) * weight,
            "no_weight": x / torch.sqrt(ms + eps),
            "all_dims": x / torch.sqrt(x.pow(2).mean() + eps) * weight,
            "l2_norm": x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps) * weight}


def _swiglu_with(module, x, gate, value):
    return module.w3(gate(module.w1(x) if value == "w2" else module.w2(x)) * (module.w2(x) if value == "w2" else module.w1(x)))


def check_data():
    """Fixed inputs and expected values for the visible checks (tools/make_check_data.py writes them)."""
    with torch.enable_grad():           # the writer runs under no_grad; some stored values are gradients
        return _check_data()


def _check_data():
    # RMSNorm: eps = 0.1 and small inputs, so where eps sits shows.
    x = fixed((3, 5), 1) * 0.3
    weight = 1.0 + fixed((5,), 2)
    norm = ref.RMSNorm(5, 0.1).double()
    with torch.no_grad():
        norm.weight.copy_(weight)
    xg = x.clone().requires_grad_(True)
    cot = fixed((3, 5), 3)
    y = norm(xg)
    (grad,) = torch.autograd.grad((y * cot).sum(), xg)
    rms = {"init": {"d": 5, "eps": 0.1}, "state": dict(norm.state_dict()), "x": x, "output": y, "cotangent": cot,
           "grad": grad, "mistakes": _rms_variants(x, weight, 0.1)}

    # SwiGLU: gate and value on the right and on the wrong branch.
    torch.manual_seed(0)
    sw = ref.SwiGLU(4, 6).double()
    xs = fixed((2, 3, 4), 4)
    swiglu = {"init": {"d_model": 4, "d_hidden": 6}, "state": dict(sw.state_dict()), "x": xs, "output": sw(xs),
              "mistakes": {"gate_swapped": _swiglu_with(sw, xs, F.silu, "w1"),
                           "sigmoid_gate": _swiglu_with(sw, xs, torch.sigmoid, "w2"),
                           "no_gate": sw.w3(sw.w1(xs) * sw.w2(xs)),
                           "silu_of_product": sw.w3(F.silu(sw.w1(xs) * sw.w2(xs))),
                           "gelu_gate": _swiglu_with(sw, xs, F.gelu, "w2")}}
    hidden = {f"{d},{m}": ref.swiglu_hidden(d, m) for d, m in [(64, 8), (4096, 256), (4, 2), (100, 7), (768, 32)]}

    # Router: the second and third rows hold ties, one of them across the k-th place.
    logits = torch.tensor([[0.5, -1.0, 1.5, 2.0, 0.0], [1.0, 3.0, 1.0, 1.0, -2.0], [2.0, 0.0, 2.0, 2.0, 2.0]],
                          dtype=torch.float64)
    gates, experts = ref.top_k_router(logits, 2)
    lg = logits.clone().requires_grad_(True)
    gcot = fixed((3, 2), 5)
    (router_grad,) = torch.autograd.grad((ref.top_k_router(lg, 2)[0] * gcot).sum(), lg)
    router = {"logits": logits, "k": 2, "gates": gates, "experts": experts, "cotangent": gcot, "grad": router_grad,
              "all_softmax_gates": torch.softmax(logits, -1).gather(-1, experts)}

    # Capacity: expert 1 is popular; token 0 picks it second, before later tokens pick it first.
    cap_experts = torch.tensor([[0, 1], [1, 2], [1, 0], [3, 1], [2, 1], [1, 0]])
    slot_major = torch.zeros(6, 2, dtype=torch.bool)
    seen = {}
    for slot in range(2):                      # the GShard order, for naming that mistake
        for t in range(6):
            e = int(cap_experts[t, slot])
            seen[e] = seen.get(e, 0) + 1
            slot_major[t, slot] = seen[e] <= 2
    keep = ref.capacity_mask(cap_experts, 4, 2)
    latest = ref.capacity_mask(cap_experts.flip(0), 4, 2).flip(0)
    capacity = {"experts": cap_experts, "n_experts": 4, "capacity": 2, "keep": keep, "slot_major": slot_major,
                "latest_first": latest, "one_more": ref.capacity_mask(cap_experts, 4, 3),
                "one_less": ref.capacity_mask(cap_experts, 4, 1),
                "batched_experts": cap_experts.reshape(2, 3, 2), "batched_keep": keep.reshape(2, 3, 2)}

    # MoE: one layer, its answer and the answers of common mistakes.
    torch.manual_seed(1)
    layer = ref.MoE(4, 6, 4, 2).double()
    xm = fixed((2, 3, 4), 6)
    ym, lm = layer(xm)
    tokens = xm.reshape(-1, 4)
    g, e = ref.top_k_router(tokens @ layer.router.weight.T, 2)
    every = torch.stack([ex(tokens) for ex in layer.experts], 1)            # [T, E, D]: the dense loop
    chosen = every.gather(1, e[..., None].expand(-1, -1, 4))               # [T, k, D]
    probs = torch.softmax(tokens @ layer.router.weight.T, -1).gather(-1, e)
    moe_mistakes = {"no_gates": chosen.sum(1).reshape(2, 3, 4),
                    "all_softmax_gates": (probs[..., None] * chosen).sum(1).reshape(2, 3, 4),
                    "first_only": (g[:, :1, None] * chosen[:, :1]).sum(1).reshape(2, 3, 4)}
    torch.manual_seed(2)
    lonely = ref.MoE(3, 5, 6, 1).double()
    xl = fixed((2, 3), 7)
    moe = {"init": {"d_model": 4, "d_hidden": 6, "n_experts": 4, "k": 2}, "state": dict(layer.state_dict()),
           "x": xm, "output": ym, "logits": lm, "mistakes": moe_mistakes, "single": layer(xm[0, 0])[0],
           "lonely_init": {"d_model": 3, "d_hidden": 5, "n_experts": 6, "k": 1},
           "lonely_state": dict(lonely.state_dict()), "lonely_x": xl, "lonely_output": lonely(xl)[0]}

    # Capacity in the layer: 9 tokens in [3, 3, 4], k = 2 of 4 experts, capacity_factor 1.0: the capacity is
    # ceil(9 * 2 / 4) = ceil(4.5) = 5 (rounding down gives 4, leaving out k 3, counting only the last leading
    # dimension's 3 tokens 2: each a different output), and two popular experts overflow.
    torch.manual_seed(3)
    tight = ref.MoE(4, 6, 4, 2, capacity_factor=1.0).double()
    with torch.no_grad():
        tight.router.weight[1] -= torch.tensor([2.0, -2.0, 2.0, -2.0], dtype=torch.float64)
    xt = fixed((3, 3, 4), 8)
    yt, lt = tight(xt)
    loose = ref.MoE(4, 6, 4, 2).double()
    loose.load_state_dict(tight.state_dict())
    ft = xt.reshape(-1, 4)
    gt, et = ref.top_k_router(ft @ tight.router.weight.T, 2)
    capacity_t = math.ceil(1.0 * 9 * 2 / 4)
    keep_t = ref.capacity_mask(et, 4, capacity_t)
    outs_t = torch.stack([ex(ft) for ex in tight.experts], 1).gather(1, et[..., None].expand(-1, -1, 4))
    renorm = (gt * keep_t) / (gt * keep_t).sum(-1, keepdim=True).clamp_min(1e-300)
    cap_mistakes = {"ignored": loose(xt)[0], "renormalised": (renorm[..., None] * outs_t).sum(1).reshape(3, 3, 4),
                    "rounded_down": _moe_with_capacity(tight, xt, math.floor(1.0 * 9 * 2 / 4)),
                    "no_k": _moe_with_capacity(tight, xt, math.ceil(1.0 * 9 / 4)),
                    "last_dim_tokens": _moe_with_capacity(tight, xt, math.ceil(1.0 * 3 * 2 / 4))}
    moe_capacity = {"init": {"d_model": 4, "d_hidden": 6, "n_experts": 4, "k": 2, "capacity_factor": 1.0},
                    "state": dict(tight.state_dict()), "x": xt, "output": yt, "logits": lt, "mistakes": cap_mistakes,
                    "tokens": 9, "capacity": capacity_t, "dropped": int((~keep_t).sum())}

    # Load balancing: an unbalanced router; k = 2.
    lb_logits = fixed((6, 4), 9) + torch.tensor([1.5, 0.0, 0.0, -0.5], dtype=torch.float64)
    lb_experts = ref.top_k_router(lb_logits, 2)[1]
    lb_rerouted = torch.tensor([[2, 3], [0, 3], [3, 1], [2, 1], [3, 2], [1, 3]])
    lgl = lb_logits.clone().requires_grad_(True)
    (lb_grad,) = torch.autograd.grad(ref.load_balancing_loss(lgl, lb_experts), lgl)
    p = torch.softmax(lb_logits, -1)
    counts = torch.bincount(lb_experts.reshape(-1), minlength=4).double()
    balance = {"logits": lb_logits, "experts": lb_experts, "loss": ref.load_balancing_loss(lb_logits, lb_experts),
               "grad": lb_grad,
               "mistakes": {"f_from_probs": 4 * (p.mean(0) ** 2).sum(), "no_E": (counts / 12 * p.mean(0)).sum(),
                            "per_token": 4 * (counts / 6 * p.mean(0)).sum(),
                            "gates_as_P": 4 * (counts / 12 * torch.zeros(4, dtype=torch.float64).index_add(
                                0, lb_experts.reshape(-1), ref.top_k_router(lb_logits, 2)[0].reshape(-1)) / 6).sum()},
               "balanced_logits": torch.zeros(4, 4, dtype=torch.float64),
               "balanced_experts": torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2]]),
               # the same logits with choices that are not their top-k (after noise or a capacity limit)
               "rerouted_experts": lb_rerouted, "rerouted_loss": ref.load_balancing_loss(lb_logits, lb_rerouted)}

    z_logits = fixed((3, 4), 10) * 2
    zl = z_logits.clone().requires_grad_(True)
    (z_grad,) = torch.autograd.grad(ref.router_z_loss(zl), zl)
    lse = torch.logsumexp(z_logits, -1)
    z = {"logits": z_logits, "loss": ref.router_z_loss(z_logits), "grad": z_grad,
         "mistakes": {"sum": lse.pow(2).sum(), "no_square": lse.mean(), "max": z_logits.max(-1).values.pow(2).mean(),
                      "square_after_mean": lse.mean().pow(2)},
         "big": torch.tensor([[120.0, 119.0, 100.0]]), "big_loss": ref.router_z_loss(torch.tensor([[120.0, 119.0, 100.0]],
                                                                                                    dtype=torch.float64))}

    mixtral = dict(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ffn=14336, vocab_size=32000, n_experts=8,
                   top_k=2)
    small = dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ffn=88, vocab_size=65, n_experts=8, top_k=2)
    dense = dict(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, d_ffn=11008, vocab_size=32000, n_experts=1,
                 top_k=1)
    params = {"mixtral": mixtral, "mixtral_counts": list(ref.transformer_parameters(**mixtral)),
              "dense": dense, "dense_counts": list(ref.transformer_parameters(**dense)),
              "small": small, "small_counts": list(ref.transformer_parameters(**small)),
              "mistakes": {"no_gqa": list(ref.transformer_parameters(**{**mixtral, "n_kv_heads": 32})),
                           "tied": [c - 32000 * 4096 for c in ref.transformer_parameters(**mixtral)]}}
    return {"rms_norm": rms, "swiglu": swiglu, "swiglu_hidden": hidden, "router": router, "capacity": capacity,
            "moe": moe, "moe_capacity": moe_capacity, "balance": balance, "z_loss": z, "params": params,
            **_aux_free_data()}


def _aux_free_data():
    """DeepSeek-V3's biased router, bias update and shared-expert layer, with what common mistakes return."""
    # Router: a bias that moves several tokens' choices (expert 1 up, expert 3 down).
    logits = fixed((4, 6), 11)
    bias = torch.tensor([0.0, 1.5, 0.0, -2.0, 0.0, 0.5], dtype=torch.float64)
    gates, experts = ref.biased_top_k_router(logits, bias, 2)
    lg = logits.clone().requires_grad_(True)
    cot = fixed((4, 2), 12)
    (grad,) = torch.autograd.grad((ref.biased_top_k_router(lg, bias, 2)[0] * cot).sum(), lg)
    scores = logits + bias
    chosen = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :2]
    # 24 experts, logit 1 at 0, 3, 6, ... and bias 1 at 1, 4, 7, ...: scores tie at 2 everywhere they are 2.
    long_logits = torch.tensor([1.0 if i % 3 == 0 else 0.0 for i in range(24)], dtype=torch.float64)
    long_bias = torch.tensor([1.0 if i % 3 == 1 else (2.0 if i == 23 else 0.0) for i in range(24)], dtype=torch.float64)
    biased_router = {
        "logits": logits, "bias": bias, "k": 2, "gates": gates, "experts": experts, "cotangent": cot, "grad": grad,
        "mistakes": {"bias_in_gates": torch.softmax(scores.gather(-1, chosen), dim=-1),
                     "unbiased_experts": ref.top_k_router(logits, 2)[1],
                     "subtracted_experts": ref.top_k_router(logits - bias, 2)[1]},
        "long_logits": long_logits, "long_bias": long_bias, "long_k": 5,
        "long_experts": ref.biased_top_k_router(long_logits, long_bias, 5)[1]}

    # Bias update: 6 tokens, k = 2 of 4 experts, loads [5, 3, 2, 2] against a mean of 3.
    up_experts = torch.tensor([[0, 1], [0, 2], [0, 3], [1, 0], [0, 2], [1, 3]])
    up_bias = torch.tensor([0.2, -0.1, 0.05, 0.0], dtype=torch.float64)
    gamma = 0.1
    load = torch.bincount(up_experts.reshape(-1), minlength=4).double()
    update = {"bias": up_bias, "experts": up_experts, "gamma": gamma, "load": load, "mean": 3.0,
              "new": ref.update_bias(up_bias, up_experts, gamma),
              "mistakes": {"reversed": up_bias + gamma * torch.sign(load - 3.0),
                           "difference": up_bias + gamma * (3.0 - load),
                           "no_k": up_bias + gamma * torch.sign(1.5 - load),
                           "no_zero": up_bias + torch.where(load < 3.0, gamma, -gamma)},
              "batched_experts": up_experts.reshape(2, 3, 2)}
    # 5 tokens, k = 2 of 4 experts: loads [4, 2, 4, 0], the last expert idle, a mean of 2.5 (not a whole number).
    idle_experts = torch.tensor([[0, 1], [0, 2], [0, 2], [0, 2], [1, 2]])
    idle_load = torch.bincount(idle_experts.reshape(-1), minlength=4).double()
    update["idle"] = {"experts": idle_experts, "load": idle_load, "mean": 2.5,
                      "new": ref.update_bias(up_bias, idle_experts, gamma),
                      "floor": up_bias + gamma * torch.sign(2.0 - idle_load)}

    # The layer: 5 experts, top-2, one shared expert, a bias that moves the choices.
    torch.manual_seed(5)
    layer = ref.DeepSeekMoE(4, 6, 5, 2, n_shared=1).double()
    layer.bias.copy_(torch.tensor([1.0, 0.0, -1.0, 0.5, 0.0], dtype=torch.float64))
    x = fixed((2, 3, 4), 13)
    y, lgt = layer(x)
    tokens = x.reshape(-1, 4)
    router_logits = layer.router(tokens)
    shared = layer.shared[0](tokens)
    plain_gates, plain_experts = ref.top_k_router(router_logits, 2)
    g, e = ref.biased_top_k_router(router_logits, layer.bias, 2)

    def routed(gates, experts):
        outs = torch.stack([ex(tokens) for ex in layer.experts], 1).gather(1, experts[..., None].expand(-1, -1, 4))
        return (gates[..., None] * outs).sum(1)
    deepseek = {"init": {"d_model": 4, "d_hidden": 6, "n_experts": 5, "k": 2, "n_shared": 1},
                "state": dict(layer.state_dict()), "x": x, "output": y, "logits": lgt,
                "mistakes": {"no_bias": (shared + routed(plain_gates, plain_experts)).reshape(2, 3, 4),
                             "shared_gated": (g[:, :1] * shared + routed(g, e)).reshape(2, 3, 4),
                             "no_shared": routed(g, e).reshape(2, 3, 4)},
                "biased_logits": lgt + layer.bias}
    torch.manual_seed(6)
    two = ref.DeepSeekMoE(3, 5, 4, 1, n_shared=2).double()
    two.bias.copy_(torch.tensor([0.0, 0.8, 0.0, -0.8], dtype=torch.float64))
    x2 = fixed((5, 3), 14)
    deepseek.update({"two_init": {"d_model": 3, "d_hidden": 5, "n_experts": 4, "k": 1, "n_shared": 2},
                     "two_state": dict(two.state_dict()), "two_x": x2, "two_output": two(x2)[0]})
    torch.manual_seed(8)                            # no shared expert, float64: the output is the routed sum alone
    lone = ref.DeepSeekMoE(3, 5, 4, 2, n_shared=0).double()
    x0 = fixed((4, 3), 15)
    deepseek.update({"lone_init": {"d_model": 3, "d_hidden": 5, "n_experts": 4, "k": 2, "n_shared": 0},
                     "lone_state": dict(lone.state_dict()), "lone_x": x0, "lone_output": lone(x0)[0]})
    return {"biased_router": biased_router, "bias_update": update, "deepseek": deepseek}


def _moe_with_capacity(layer, x, capacity):
    """The layer's output with a given per-expert capacity (to name a wrong capacity formula)."""
    tokens = x.reshape(-1, x.shape[-1])
    gates, experts = ref.top_k_router(layer.router(tokens), layer.k)
    keep = ref.capacity_mask(experts, layer.n_experts, capacity)
    outs = torch.stack([ex(tokens) for ex in layer.experts], 1).gather(1, experts[..., None].expand(-1, -1, x.shape[-1]))
    return ((gates * keep)[..., None] * outs).sum(1).reshape(x.shape)
