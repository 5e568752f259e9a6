"""Visible checks for chapter 08: RMSNorm, SwiGLU, routing, capacity, the MoE layer, auxiliary losses."""
import torch

from ..forbid import ELEMENTARY
from ._core import (build_module, call, close, expect_pair, expect_tensor, fail, forbidding, load_cases, max_error, ok,
                    require_callable, same, tensor)

# Exercise 1 writes RMSNorm from scratch: PyTorch's own may not do it (the hidden tests agree).
RMS_NORM_BUILTINS = ("torch.nn.functional.rms_norm", "torch.rms_norm", "torch.nn.RMSNorm",
                     "aten::rms_norm", "aten::_fused_rms_norm")
RMS_NORM_ALLOWED = ELEMENTARY       # and nothing but elementary operations (attncourse.forbid)


def _data():
    return load_cases("ch08")


def _scalar(value, what, dtype):
    """A 0-dimensional tensor of ``dtype`` (a [1] tensor or a Python float is not enough: autograd needs it)."""
    if not isinstance(value, torch.Tensor):
        fail(f"{what} should return a 0-dimensional torch.Tensor (a scalar loss you can backpropagate), "
             f"got {type(value).__name__}")
    if value.dim() != 0:
        fail(f"{what} should return a scalar (0-dimensional tensor), got shape {list(value.shape)}: reduce with .sum() "
             "or .mean() as the formula says")
    if value.dtype != dtype:
        fail(f"{what} returned {value.dtype} for {dtype} inputs: keep the inputs' dtype")
    return value


def _value(stored, dtype=torch.float64):
    """A stored scalar (written as a one-element list) as a 0-dimensional tensor."""
    return tensor(stored, dtype).reshape(())


def _grad(fn, x, cotangent=None):
    """d<fn(x), cotangent>/dx (or d fn(x)/dx for a scalar), without keeping the graph."""
    x = x.clone().requires_grad_(True)
    out = fn(x)
    total = out if cotangent is None else (out * cotangent).sum()
    if not total.requires_grad:
        return torch.zeros_like(x)
    (g,) = torch.autograd.grad(total, x, allow_unused=True)
    return torch.zeros_like(x) if g is None else g


# ---- RMSNorm -------------------------------------------------------------------------------------------
RMS_MISTAKES = [
    ("mean_subtracted", "you subtracted the mean: that is LayerNorm. RMSNorm does not centre x; it only divides by "
                        "the root mean square sqrt(mean(x^2) + eps)"),
    ("eps_outside", "eps belongs inside the square root: x / sqrt(mean(x^2) + eps), not x / (sqrt(mean(x^2)) + eps)"),
    ("wrong_axis", "your mean of squares runs over the wrong axis: each vector is normalised over its own features, "
                   "the last dimension (dim=-1, keepdim=True)"),
    ("no_weight", "the output is normalised but the learned gain is missing: multiply by self.weight"),
    ("l2_norm", "you divided by the L2 norm (a sum of squares); RMS is the root of the *mean* of the squares"),
    ("all_dims", "your mean of squares runs over every dimension of x at once (one RMS for the whole tensor): each "
                 "vector gets its own RMS, over its features only (dim=-1, keepdim=True)"),
]


def _checked_rms_norm(cls):
    """The learner's RMSNorm with the stored weights, after checking its values (float64, float32, shapes)."""
    c = _data()["rms_norm"]
    x, expected = tensor(c["x"]), tensor(c["output"])
    with forbidding(RMS_NORM_BUILTINS, "RMSNorm", RMS_NORM_ALLOWED):
        module = build_module(cls, c["init"], "RMSNorm", c["state"])
        y = call(module, x, what="RMSNorm.forward(x)")
    expect_tensor(y, "RMSNorm output", shape=x.shape, dtype=torch.float64)
    if not close(y, expected):
        for key, message in RMS_MISTAKES:
            if close(y, tensor(c["mistakes"][key])):
                fail(message)
        fail(f"RMSNorm output differs from the expected one (max error {max_error(y, expected):.3g})")
    ok("RMSNorm in float64: eps inside the root, the gain applied, over the last dimension")

    with forbidding(RMS_NORM_BUILTINS, "RMSNorm", RMS_NORM_ALLOWED):
        y1 = call(module, x[0], what="RMSNorm.forward on a single vector [d]")
        y32 = call(module.float(), x.float(), what="RMSNorm in float32")
        module.double()
    expect_tensor(y1, "RMSNorm of a single [d] vector", shape=(5,))
    if not close(y1, expected[0]):
        fail("a single vector [d] gives a different answer from the same vector in a batch: normalise over dim=-1")
    expect_tensor(y32, "RMSNorm output for float32 inputs", shape=x.shape, dtype=torch.float32)
    if not close(y32, expected, atol=1e-5):
        fail("float32 inputs give a different answer from float64 ones")
    ok("any leading shape, float32 and float64")
    return module


def check_rms_norm(cls):
    """Check RMSNorm(d, eps): forward(x [..., d]) -> x / sqrt(mean(x^2) + eps) * weight, float32 and float64."""
    _checked_rms_norm(cls)


def check_rms_norm_grad(cls):
    """Check that gradients flow through RMSNorm.forward as through the formula (after its values)."""
    c = _data()["rms_norm"]
    module = _checked_rms_norm(cls)
    with forbidding(RMS_NORM_BUILTINS, "RMSNorm", RMS_NORM_ALLOWED):
        g = _grad(module, tensor(c["x"]), tensor(c["cotangent"]))
    if not close(g, tensor(c["grad"])):
        fail(f"the values are right but the gradient with respect to x is wrong (max error "
             f"{max_error(g, tensor(c['grad'])):.3g}): compute with differentiable torch operations only "
             "(no .detach(), no .item(), no in-place edits of x)")
    ok("gradients flow through x")


# ---- SwiGLU ---------------------------------------------------------------------------------------------
def check_swiglu_hidden(fn):
    """Check swiglu_hidden(d_model, multiple_of) -> int: floor(8 d_model / 3) rounded up to a multiple."""
    require_callable(fn, "swiglu_hidden")
    for key, expected in _data()["swiglu_hidden"].items():
        d, m = (int(v) for v in key.split(","))
        got = call(fn, d, m, what=f"swiglu_hidden({d}, {m})")
        if isinstance(got, torch.Tensor) or not isinstance(got, int) or isinstance(got, bool):
            fail(f"swiglu_hidden({d}, {m}) should return a Python int (a layer size), got {type(got).__name__}: "
                 "use integer arithmetic (//) rather than float division")
        if got == 4 * d:
            fail(f"swiglu_hidden({d}, {m}) returned 4 * d_model = {got}: that is the D -> 4D -> D MLP's hidden size. "
                 "SwiGLU has three matrices instead of two, so it uses 8/3 D to keep the parameter count")
        if got % m:
            fail(f"swiglu_hidden({d}, {m}) = {got} is not a multiple of multiple_of = {m}")
        if got < expected:
            fail(f"swiglu_hidden({d}, {m}) = {got}: you rounded down (or to the nearest multiple); round floor(8 d / 3) "
                 f"*up* to the next multiple of {m}")
        if got != expected:
            fail(f"swiglu_hidden({d}, {m}) = {got}, expected {expected}: start from floor(8 * d_model / 3) and round up "
                 f"to a multiple of {m}; an exact multiple stays as it is")
    ok("swiglu_hidden: 8D/3 rounded up to a multiple (4096 -> 11008 with multiple_of=256, LLaMA-7B's size)")


SWIGLU_MISTAKES = [
    ("gate_swapped", "the gate is on the wrong branch: silu goes on x W1 (self.w1, the gate) and multiplies the plain "
                     "x W2 (self.w2, the value): w3(silu(w1(x)) * w2(x))"),
    ("sigmoid_gate", "you used sigmoid(x W1) as the gate; SwiGLU uses silu(z) = z * sigmoid(z) (F.silu)"),
    ("gelu_gate", "you used GELU as the gate's activation (that is GeGLU); SwiGLU uses silu (F.silu)"),
    ("no_gate", "there is no nonlinearity: apply silu to x W1 before multiplying by x W2"),
    ("silu_of_product", "you applied silu to the product (x W1) * (x W2): silu goes on the gate x W1 alone, and its "
                        "result multiplies x W2: w3(silu(w1(x)) * w2(x))"),
]


def check_swiglu(cls):
    """Check SwiGLU(d_model, d_hidden): forward(x [..., D]) -> w3(silu(w1(x)) * w2(x))."""
    c = _data()["swiglu"]
    module = build_module(cls, c["init"], "SwiGLU", c["state"])
    x, expected = tensor(c["x"]), tensor(c["output"])
    y = call(module, x, what="SwiGLU.forward(x)")
    expect_tensor(y, "SwiGLU output", shape=x.shape, dtype=torch.float64)
    if not close(y, expected):
        for key, message in SWIGLU_MISTAKES:
            if close(y, tensor(c["mistakes"][key])):
                fail(message)
        fail(f"SwiGLU output differs from the expected one (max error {max_error(y, expected):.3g}); "
             "Y = (silu(X W1) * X W2) W3 with self.w1, self.w2, self.w3")
    y32 = call(module.float(), x.float(), what="SwiGLU in float32")
    expect_tensor(y32, "SwiGLU output for float32 inputs", shape=x.shape, dtype=torch.float32)
    if not close(y32, expected, atol=1e-5):
        fail("float32 inputs give a different answer from float64 ones")
    ok("SwiGLU: silu gate on w1, value w2, output w3; float32 and float64, any leading shape")


# ---- the router -------------------------------------------------------------------------------------------
def _route(fn, logits, k, what):
    gates, experts = expect_pair(call(fn, logits, k, what=what), "top_k_router")
    shape = tuple(logits.shape[:-1]) + (k,)
    expect_tensor(gates, "gates", shape=shape)
    expect_tensor(experts, "experts", shape=shape)
    if experts.dtype != torch.int64:
        fail(f"experts should be int64 indices (as torch.sort / torch.topk return), got {experts.dtype}")
    if gates.dtype != logits.dtype:
        fail(f"gates are {gates.dtype} for {logits.dtype} logits: keep the logits' dtype")
    return gates, experts


def check_top_k_router(fn):
    """Check top_k_router(logits [..., E], k) -> (gates [..., k], experts [..., k] int64)."""
    require_callable(fn, "top_k_router")
    c = _data()["router"]
    logits, k = tensor(c["logits"]), c["k"]
    gates, experts = _route(fn, logits, k, "top_k_router(logits, 2)")
    want = torch.tensor(c["experts"])
    sums = gates.sum(-1)
    if not close(sums, torch.ones_like(sums)):
        if close(gates, tensor(c["all_softmax_gates"])):
            fail("you took the softmax over all E experts and then kept the top k without renormalising: the gates "
                 "must be the softmax over the k selected logits only (they sum to 1 per token, as in Mixtral)")
        fail(f"each token's k gates must sum to 1 (a softmax over the selected logits); yours sum to {sums.tolist()}")
    if not same(experts[0], want[0]):
        if sorted(experts[0].tolist()) == sorted(want[0].tolist()):
            fail(f"you picked the right experts for token 0 but in the wrong order ({experts[0].tolist()}): list them "
                 f"in descending order of logit ({want[0].tolist()})")
        fail(f"token 0's experts should be the 2 largest logits, {want[0].tolist()}; you returned {experts[0].tolist()}")
    if not same(experts, want):
        fail(f"with tied logits the lower expert index comes first: rows 1 and 2 should give {want[1:].tolist()}, you "
             f"returned {experts[1:].tolist()}. torch.topk does not promise an order among ties (on CPU it often "
             "breaks them differently); torch.sort(logits, dim=-1, descending=True, stable=True) does")
    long = torch.tensor([2.0 if i % 3 == 0 else 1.0 for i in range(24)], dtype=torch.float64)
    _, top = _route(fn, long, 4, "top_k_router(24 logits with ties, 4)")
    if top.tolist() != [0, 3, 6, 9]:
        fail(f"24 experts with logit 2 at experts 0, 3, 6, ..., 21 and 1 elsewhere: the top 4 are [0, 3, 6, 9] (ties to "
             f"the lower index); you returned {top.tolist()}. In rows of more than 16 entries torch.sort without "
             "stable=True orders tied values arbitrarily: torch.sort(logits, dim=-1, descending=True, stable=True)")
    if not close(gates, tensor(c["gates"])):
        fail(f"the experts are right but the gates differ (max error {max_error(gates, tensor(c['gates'])):.3g}): "
             "gates = softmax of the selected logits, in the same order as the experts")
    ok("top-2 of 5 experts: descending order, ties to the lower index, gates sum to 1")

    g = _grad(lambda t: fn(t, k)[0], logits, tensor(c["cotangent"]))
    if not close(g, tensor(c["grad"])):
        fail("the gradient of the gates with respect to the logits is wrong: compute the gates from the logits with "
             "differentiable operations (gather the selected logits, then softmax)")
    batched = torch.stack([logits, logits.flip(0)]).float()
    bg, be = _route(fn, batched, k, "top_k_router on [2, 3, 5] float32 logits")
    if not (same(be[0], want) and close(bg[0], tensor(c["gates"]), atol=1e-6)):
        fail("batched float32 logits [2, 3, 5] give different answers from the same logits unbatched: "
             "work over the last dimension only")
    big, _ = _route(fn, batched * 200, k, "top_k_router on large logits")
    if not torch.isfinite(big).all():
        fail("large logits give NaN or inf gates: use torch.softmax on the selected logits (it subtracts the max)")
    ok("gradients, leading dimensions, float32 and large logits")


# ---- capacity ---------------------------------------------------------------------------------------------
CAPACITY_MISTAKES = [
    ("latest_first", "you kept each expert's latest tokens: tokens queue in token order, so an expert keeps its "
                     "*earliest* `capacity` tokens and drops the later ones"),
    ("slot_major", "you queued every first choice before any second choice (GShard's priority order); this exercise "
                   "queues tokens in token order: all of token t's choices come before token t+1's"),
    ("one_more", "off by one: each expert keeps `capacity` tokens, you kept one more"),
    ("one_less", "off by one: each expert keeps `capacity` tokens, you kept one fewer"),
]


def check_capacity_mask(fn):
    """Check capacity_mask(experts [..., k] int64, n_experts, capacity) -> bool [..., k] (True = kept)."""
    require_callable(fn, "capacity_mask")
    c = _data()["capacity"]
    experts, want = torch.tensor(c["experts"]), torch.tensor(c["keep"])
    keep = call(fn, experts, c["n_experts"], c["capacity"], what="capacity_mask(experts, 4, 2)")
    expect_tensor(keep, "capacity_mask", shape=experts.shape)
    if keep.dtype != torch.bool:
        fail(f"capacity_mask should return a bool tensor (True = the assignment fits), got {keep.dtype}")
    if not same(keep, want):
        for key, message in CAPACITY_MISTAKES:
            if same(keep, torch.tensor(c[key])):
                fail(message)
        fail(f"expected {want.int().tolist()} (experts {experts.tolist()}, capacity 2), got {keep.int().tolist()}")
    ok("capacity 2: each expert keeps its first two tokens in token order")
    batched = call(fn, torch.tensor(c["batched_experts"]), c["n_experts"], c["capacity"],
                   what="capacity_mask on [2, 3, 2] experts")
    if not (isinstance(batched, torch.Tensor) and same(batched, torch.tensor(c["batched_keep"]))):
        fail("with leading dimensions [2, 3] the tokens queue in row-major order (flatten all leading dimensions): "
             "the answer must be the [6, 2] answer reshaped")
    none, every = (call(fn, experts, c["n_experts"], cap, what=f"capacity_mask with capacity {cap}") for cap in (0, 12))
    if bool(none.any()) or not bool(every.all()):
        fail("capacity 0 keeps nothing and a capacity of at least the number of tokens keeps everything")
    ok("leading dimensions; capacity 0 and unlimited capacity")


# ---- the MoE layer -------------------------------------------------------------------------------------
MOE_MISTAKES = [
    ("no_gates", "the gates are not applied: multiply each expert's output by its token's gate before adding"),
    ("all_softmax_gates", "your gates come from a softmax over all experts: use top_k_router's gates (softmax over "
                          "the k selected logits)"),
    ("first_only", "only each token's first expert contributes: add the gated outputs of all k experts"),
]


def _moe_output(module, x, what, n_experts):
    y, logits = expect_pair(call(module, x, what=what), "MoE.forward")
    expect_tensor(y, f"{what}'s output", shape=x.shape, dtype=x.dtype)
    expect_tensor(logits, f"{what}'s router logits", shape=tuple(x.shape[:-1]) + (n_experts,), dtype=x.dtype)
    return y, logits


def check_moe(cls):
    """Check MoE(d_model, d_hidden, n_experts, k): forward(x [..., D]) -> (y [..., D], logits [..., E])."""
    c = _data()["moe"]
    module = build_module(cls, c["init"], "MoE", c["state"])
    x, expected = tensor(c["x"]), tensor(c["output"])
    y, logits = _moe_output(module, x, "MoE.forward(x [2, 3, 4])", 4)
    if not close(logits, tensor(c["logits"])):
        fail("the router logits differ: return self.router(x) for every token, shaped [..., n_experts]")
    if not close(y, expected):
        for key, message in MOE_MISTAKES:
            if close(y, tensor(c["mistakes"][key])):
                fail(message)
        fail(f"MoE output differs from the expected one (max error {max_error(y, expected):.3g}). Make sure "
             "check_swiglu and check_top_k_router pass; then y = sum over each token's k experts of gate * expert(x)")
    ok("MoE on [2, 3, 4]: each token's k experts, weighted by their gates")

    single, _ = _moe_output(module, x[0, 0], "MoE.forward on one token [4]", 4)
    if not close(single, tensor(c["single"])):
        fail("a single token x [D] gives a different answer: flatten all leading dimensions into tokens, then restore")
    lonely = build_module(cls, c["lonely_init"], "MoE", c["lonely_state"])
    yl, _ = _moe_output(lonely, tensor(c["lonely_x"]), "MoE with 6 experts and only 2 tokens", 6)
    if not close(yl, tensor(c["lonely_output"])):
        fail("with 6 experts and 2 tokens most experts receive no token: skip them (an empty selection), they "
             "must not change the output")
    y32, _ = _moe_output(module.float(), x.float(), "MoE in float32", 4)
    if not close(y32, expected, atol=1e-5):
        fail("float32 inputs give a different answer from float64 ones")
    ok("one token, experts that receive no token, float32")


CAPACITY_LAYER_MISTAKES = [
    ("ignored", "capacity_factor is set but nothing was dropped: compute capacity = ceil(capacity_factor * T * k / E) "
                "and zero the gates of the assignments capacity_mask rejects"),
    ("renormalised", "you renormalised the remaining gates after dropping: a dropped assignment simply contributes "
                     "nothing, the other gates stay as they are"),
    ("rounded_down", "wrong capacity: capacity_factor * T * k / E = 1.0 * 9 * 2 / 4 = 4.5 here, and the capacity is "
                     "that rounded *up* (math.ceil), 5; you rounded it down (int() or // give 4)"),
    ("no_k", "wrong capacity: it is ceil(capacity_factor * T * k / E) with T the number of tokens; you left out k"),
    ("last_dim_tokens", "wrong capacity: T is the number of tokens over all leading dimensions (x [3, 3, 4] holds 9 "
                        "tokens, x.numel() // d_model); you counted only the last leading dimension's 3"),
]


def check_moe_capacity(cls):
    """Check MoE(..., capacity_factor=1.0): assignments over capacity are dropped, in capacity_mask's order."""
    c = _data()["moe_capacity"]
    module = build_module(cls, c["init"], "MoE", c["state"])
    x, expected = tensor(c["x"]), tensor(c["output"])
    y, _ = _moe_output(module, x, "MoE(capacity_factor=1.0).forward(x [3, 3, 4])", 4)
    if not close(y, expected):
        for key, message in CAPACITY_LAYER_MISTAKES:
            if close(y, tensor(c["mistakes"][key])):
                fail(message)
        fail(f"with capacity_factor=1.0 the output differs from the expected one (max error "
             f"{max_error(y, expected):.3g}); check_capacity_mask must pass first")
    y32, _ = _moe_output(module.float(), x.float(), "MoE(capacity_factor=1.0) in float32", 4)
    if not close(y32, expected, atol=1e-5):
        fail("with a capacity, float32 inputs give a different answer from float64 ones")
    ok(f"capacity ceil(4.5) = {c['capacity']} per expert for {c['tokens']} tokens and k = 2: {c['dropped']} "
       "assignments dropped, the rest unchanged")


# ---- auxiliary losses ----------------------------------------------------------------------------------
BALANCE_MISTAKES = [
    ("f_from_probs", "f_i must count the hard top-k assignments (how many tokens went to expert i, from `experts`), "
                     "not the router probabilities; P_i is the one that uses probabilities"),
    ("gates_as_P", "P_i is the mean of the full softmax over all E experts, not of the k selected gates"),
    ("per_token", "f_i is a fraction of all T*k (token, slot) assignments: divide the counts by T*k, not by T"),
    ("no_E", "multiply by the number of experts E, so that a perfectly balanced router scores exactly 1"),
]


def check_load_balancing_loss(fn):
    """Check load_balancing_loss(logits [..., E], experts [..., k]) -> scalar E * sum_i f_i P_i."""
    require_callable(fn, "load_balancing_loss")
    c = _data()["balance"]
    logits, experts, expected = tensor(c["logits"]), torch.tensor(c["experts"]), _value(c["loss"])
    loss = _scalar(call(fn, logits, experts, what="load_balancing_loss(logits, experts)"), "load_balancing_loss",
                   torch.float64)
    if not close(loss, expected):
        for key, message in BALANCE_MISTAKES:
            if close(loss, _value(c["mistakes"][key])):
                fail(message)
        fail(f"load_balancing_loss = {loss.item():.6f}, expected {expected.item():.6f}")
    balanced = call(fn, tensor(c["balanced_logits"]), torch.tensor(c["balanced_experts"]),
                    what="load_balancing_loss on a balanced router")
    if not (isinstance(balanced, torch.Tensor) and close(balanced.reshape(()), torch.tensor(1.0))):
        fail(f"a perfectly balanced router (uniform probabilities, every expert chosen equally often) should score 1, "
             f"yours gives {float(balanced):.4f}")
    rerouted = _scalar(call(fn, logits, torch.tensor(c["rerouted_experts"]),
                            what="load_balancing_loss(logits, experts) with experts that are not the logits' top-k"),
                       "load_balancing_loss", torch.float64)
    if not close(rerouted, _value(c["rerouted_loss"])):
        if close(rerouted, expected):
            fail("you recomputed the top-k experts from the logits: count f from the `experts` argument, the choices "
                 "actually made (after noise or a capacity limit they are not the logits' top-k)")
        fail(f"with experts that are not the logits' top-k, load_balancing_loss = {rerouted.item():.6f}, expected "
             f"{_value(c['rerouted_loss']).item():.6f}: count f from `experts`")
    ok(f"load-balancing loss {loss.item():.4f} for an unbalanced router, 1 for a balanced one, f counted from `experts`")
    g = _grad(lambda t: fn(t, experts), logits)
    if float(g.abs().max()) == 0.0:
        fail("no gradient reaches the logits: P must be the mean of softmax(logits) computed with autograd on "
             "(only f, a count, carries no gradient)")
    if not close(g, tensor(c["grad"])):
        fail(f"the gradient with respect to the logits is wrong (max error {max_error(g, tensor(c['grad'])):.3g}): "
             "it flows through P only; f is a constant count")
    lead = call(fn, logits.reshape(2, 3, 4).float(), experts.reshape(2, 3, 2), what="load_balancing_loss on [2, 3, 4]")
    _scalar(lead, "load_balancing_loss on float32 logits", torch.float32)
    if not close(lead, expected, atol=1e-5):
        fail("logits [2, 3, E] give a different loss from the same tokens as [6, E]: average over every token")
    ok("gradient through P, leading dimensions, float32")


Z_MISTAKES = [
    ("sum", "average over tokens (mean), not sum"),
    ("no_square", "square the log-sum-exp of each token's logits before averaging"),
    ("max", "use the log-sum-exp of the logits (torch.logsumexp), not the largest logit"),
    ("square_after_mean", "you squared after averaging (the square of the mean): square each token's log-sum-exp "
                          "first, then average the squares over the tokens"),
]


def check_router_z_loss(fn):
    """Check router_z_loss(logits [..., E]) -> scalar mean over tokens of logsumexp(logits)^2."""
    require_callable(fn, "router_z_loss")
    c = _data()["z_loss"]
    logits, expected = tensor(c["logits"]), _value(c["loss"])
    loss = _scalar(call(fn, logits, what="router_z_loss(logits)"), "router_z_loss", torch.float64)
    if not close(loss, expected):
        for key, message in Z_MISTAKES:
            if close(loss, _value(c["mistakes"][key])):
                fail(message)
        fail(f"router_z_loss = {loss.item():.6f}, expected {expected.item():.6f}")
    big = _scalar(call(fn, tensor(c["big"], torch.float32), what="router_z_loss on logits near 120"),
                  "router_z_loss", torch.float32)
    if not torch.isfinite(big):
        fail("logits near 120 overflow: exp(120) is inf in float32. Use torch.logsumexp, which subtracts the max")
    if not close(big, _value(c["big_loss"]), atol=1e-2):
        fail(f"for logits [120, 119, 100] the loss should be {_value(c['big_loss']).item():.3f}, got {big.item():.3f}")
    g = _grad(fn, logits)
    if not close(g, tensor(c["grad"])):
        fail("the gradient with respect to the logits is wrong: compute the loss with differentiable torch operations")
    ok("z-loss: mean squared log-sum-exp, stable for large logits, with gradients")


# ---- bookkeeping ---------------------------------------------------------------------------------------
def check_transformer_parameters(fn):
    """Check transformer_parameters(d_model, n_layers, n_heads, n_kv_heads, d_ffn, vocab_size, n_experts, top_k)."""
    require_callable(fn, "transformer_parameters")
    c = _data()["params"]
    for name in ("mixtral", "dense", "small"):
        got = call(fn, **c[name], what=f"transformer_parameters(**{name})")
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            fail(f"transformer_parameters should return a pair (total, active), got {type(got).__name__}")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in got):
            fail(f"return Python ints (exact counts), got {[type(v).__name__ for v in got]}")
        total, active = got
        want_total, want_active = c[f"{name}_counts"]
        if (total, active) == (want_total, want_active):
            continue
        mistakes = c["mistakes"]
        if name == "mixtral" and [total, active] == mistakes["no_gqa"]:
            fail("K and V have n_kv_heads * (d_model / n_heads) columns, not d_model: with grouped-query attention "
                 "8 KV heads serve 32 query heads")
        if name == "mixtral" and [total, active] == mistakes["tied"]:
            fail("the output head is a separate [vocab_size, d_model] matrix (untied from the embedding): count both")
        if total == want_total and active == total:
            fail("active parameters count only top_k of the n_experts experts in each layer; you counted all")
        if total == want_total:
            fail(f"the total is right but active is off by {active - want_active:,}: active = total minus the "
                 "(n_experts - top_k) unused experts per layer")
        per_layer = (total - want_total) / c[name]["n_layers"]
        fail(f"{name}: total {total:,}, expected {want_total:,} (off by {total - want_total:,}, {per_layer:,.1f} per "
             "layer). Per layer: attention, n_experts SwiGLU experts (3 d_model d_ffn each), a router when n_experts "
             "> 1, two RMSNorm gains; then one final RMSNorm, the embedding and the output head")
    ok(f"Mixtral 8x7B: {c['mixtral_counts'][0]:,} parameters in total, {c['mixtral_counts'][1]:,} active per token")


# ---- auxiliary-loss-free balancing (DeepSeek-V3) -----------------------------------------------------------------
def check_biased_top_k_router(fn):
    """Check biased_top_k_router(logits [..., E], bias [E], k) -> (gates [..., k], experts [..., k] int64)."""
    require_callable(fn, "biased_top_k_router")
    c = _data()["biased_router"]
    logits, bias, k = tensor(c["logits"]), tensor(c["bias"]), c["k"]
    what = "biased_top_k_router(logits, bias, 2)"
    gates, experts = _route(lambda lg, kk: fn(lg, bias, kk), logits, k, what)
    want, mistakes = torch.tensor(c["experts"]), c["mistakes"]
    if not same(experts, want):
        if same(experts, torch.tensor(mistakes["unbiased_experts"])):
            fail(f"your experts are the top-k of the logits alone ({experts.tolist()}): the bias must move the choice. "
                 f"Add it before the top-k, choosing by logits + bias; added after the top-k it changes nothing "
                 f"(expected {want.tolist()})")
        if same(experts, torch.tensor(mistakes["subtracted_experts"])):
            fail(f"you chose by logits - bias ({experts.tolist()}): choose by logits + bias, so that a larger bias "
                 f"makes an expert more likely to be chosen (expected {want.tolist()})")
        fail(f"the experts should be the 2 largest of logits + bias, in descending order, {want.tolist()}; you "
             f"returned {experts.tolist()}")
    if not close(gates, tensor(c["gates"])):
        if close(gates, tensor(mistakes["bias_in_gates"])):
            fail("the experts are right but the gates include the bias: the bias only chooses. The gates are the "
                 "softmax of the chosen experts' unbiased logits, logits.gather(-1, experts)")
        fail(f"the experts are right but the gates differ (max error {max_error(gates, tensor(c['gates'])):.3g}): "
             "softmax over the chosen experts' unbiased logits, in the same order as the experts")
    ok("top-2 of logits + bias; gates from the unbiased logits")

    long_logits, long_bias = tensor(c["long_logits"]), tensor(c["long_bias"])
    _, top = _route(lambda lg, kk: fn(lg, long_bias, kk), long_logits, c["long_k"],
                    "biased_top_k_router(24 logits with ties, bias, 5)")
    if top.tolist() != c["long_experts"]:
        fail(f"24 experts whose logits + bias tie: the top 5 are {c['long_experts']} (ties to the lower index); you "
             f"returned {top.tolist()}. In rows of more than 16 entries torch.sort without stable=True orders tied "
             "values arbitrarily: torch.sort(logits + bias, dim=-1, descending=True, stable=True)")
    lg, b = logits.clone().requires_grad_(True), bias.clone().requires_grad_(True)
    out = call(fn, lg, b, k, what=f"{what} with requires_grad inputs")
    total = (out[0] * tensor(c["cotangent"])).sum()
    if not total.requires_grad:
        fail("the gates are not connected to the logits: compute them with torch operations on the logits")
    g_logits, g_bias = torch.autograd.grad(total, (lg, b), allow_unused=True)
    if g_bias is not None and float(g_bias.abs().max()) > 0:
        fail("the bias receives a gradient: it must only pick the experts (DeepSeek-V3 changes it with the update "
             "rule, never with gradients), so keep it out of the gates")
    if g_logits is None or not close(g_logits, tensor(c["grad"])):
        fail("the gradient of the gates with respect to the logits is wrong: gather the chosen unbiased logits, "
             "then softmax")
    bg, be = _route(lambda t, kk: fn(t, bias.float(), kk), torch.stack([logits, logits]).float(), k,
                    "biased_top_k_router on [2, 4, 6] float32 logits")
    if not (same(be[1], want) and close(bg[1], tensor(c["gates"]), atol=1e-6)):
        fail("batched float32 logits [2, 4, 6] give different answers from the same logits unbatched: work over the "
             "last dimension only")
    ok("ties to the lower index, no gradient for the bias, leading dimensions, float32")


def check_update_bias(fn):
    """Check update_bias(bias [E], experts [..., k] int64, gamma) -> new bias b + gamma * sign(mean load - load)."""
    require_callable(fn, "update_bias")
    c = _data()["bias_update"]
    bias, experts, gamma = tensor(c["bias"]), torch.tensor(c["experts"]), c["gamma"]
    new = call(fn, bias, experts, gamma, what="update_bias(bias, experts, 0.1)")
    expect_tensor(new, "the new bias", shape=bias.shape, dtype=torch.float64)
    want = tensor(c["new"])
    if not close(new, want):
        load, mean = [int(v) for v in c["load"]], c["mean"]
        mistakes = c["mistakes"]
        if close(new, tensor(mistakes["reversed"])):
            fail(f"the sign is reversed: loads {load} against a mean of {mean:g}. An overloaded expert's bias must go "
                 "DOWN by gamma (fewer tokens choose it next time), an underloaded one's up: "
                 "bias + gamma * sign(mean_load - load)")
        if close(new, tensor(mistakes["difference"])):
            fail(f"you moved the bias by gamma times the load difference; DeepSeek-V3 moves it by gamma times its sign "
                 f"(every expert moves by gamma, 0 or -gamma): loads {load}, mean {mean:g}")
        if close(new, tensor(mistakes["no_k"])):
            fail(f"the mean load is the number of (token, slot) assignments per expert, T * k / E = {mean:g} here "
                 "(6 tokens, k = 2, 4 experts): you left out k")
        if close(new, tensor(mistakes["no_zero"])):
            fail(f"an expert exactly at the mean load ({mean:g}) keeps its bias: sign(0) = 0 (torch.sign); yours "
                 f"moved it. Loads {load}")
        fail(f"new bias {new.tolist()}, expected {want.tolist()} (loads {load}, mean {mean:g}, gamma {gamma})")
    ok(f"loads {[int(v) for v in c['load']]} against a mean of {c['mean']:g}: the busiest expert's bias drops by gamma")
    held = bias.clone().requires_grad_(True)
    out = call(fn, held, experts, gamma, what="update_bias on a bias that requires grad")
    if isinstance(out, torch.Tensor) and out.requires_grad:
        fail("the new bias carries autograd history (requires_grad=True): the bias is not trained by gradients. "
             "Compute the update under torch.no_grad() (or from bias.detach())")
    batched = call(fn, bias.float(), torch.tensor(c["batched_experts"]), gamma,
                   what="update_bias with float32 bias and experts [2, 3, 2]")
    expect_tensor(batched, "the new bias for a float32 bias", shape=bias.shape, dtype=torch.float32)
    if not close(batched, want, atol=1e-6):
        fail("experts [2, 3, 2] (the same choices with leading dimensions) give a different update: count the "
             "assignments over every leading dimension")
    ok("no autograd history, input unchanged, leading dimensions, float32")
    idle = c["idle"]
    load = [int(v) for v in idle["load"]]
    try:
        new = fn(bias, torch.tensor(idle["experts"]), gamma)
    except Exception as exc:                          # noqa: BLE001 - what the learner's code raised, said plainly
        fail(f"with the last expert idle (loads {load}) update_bias raised {type(exc).__name__}: {exc}. "
             "torch.bincount counts the ids up to the largest it sees: give it minlength=E, so that an expert no "
             "token chose still gets its count, 0")
    expect_tensor(new, "the new bias with the last expert idle", shape=bias.shape, dtype=torch.float64)
    if close(new, tensor(idle["floor"])):
        fail(f"loads {load}: the mean load T * k / E = 10 / 4 = 2.5 is not a whole number, so the expert with 2 "
             "tokens is below it and its bias rises; integer division (T * k // E = 2) put it exactly at the mean")
    if not close(new, tensor(idle["new"])):
        fail(f"loads {load} against a mean of 2.5: new bias {new.tolist()}, expected {tensor(idle['new']).tolist()}")
    ok(f"loads {load}: an idle expert and a mean load of 2.5, not a whole number")


def check_deepseek_moe(cls):
    """Check DeepSeekMoE: forward(x [..., D]) -> (y [..., D], unbiased router logits [..., E])."""
    c = _data()["deepseek"]
    module = build_module(cls, c["init"], "DeepSeekMoE", c["state"])
    x, expected = tensor(c["x"]), tensor(c["output"])
    y, logits = _moe_output(module, x, "DeepSeekMoE.forward(x [2, 3, 4])", 5)
    if not close(logits, tensor(c["logits"])):
        if close(logits, tensor(c["biased_logits"])):
            fail("you returned the biased scores: return the router's unbiased logits, self.router(x) (the losses and "
                 "the load statistics use them; the bias belongs to the choice only)")
        fail("the router logits differ: return self.router(x) for every token, shaped [..., n_experts]")
    if not close(y, expected):
        m = c["mistakes"]
        if close(y, tensor(m["no_bias"])):
            fail("you routed without the bias: choose the experts with biased_top_k_router(logits, self.bias, k)")
        if close(y, tensor(m["shared_gated"])):
            fail("the shared expert is multiplied by a gate: it sees every token with no gate, y = shared(x) + the "
                 "gated routed experts")
        if close(y, tensor(m["no_shared"])):
            fail("the shared experts are missing: add every self.shared expert's output for every token")
        fail(f"DeepSeekMoE output differs from the expected one (max error {max_error(y, expected):.3g}); make sure "
             "check_swiglu and check_biased_top_k_router pass")
    ok("shared expert on every token, routed experts chosen with the bias, unbiased logits returned")
    two = build_module(cls, c["two_init"], "DeepSeekMoE", c["two_state"])
    y2, _ = _moe_output(two, tensor(c["two_x"]), "DeepSeekMoE with 2 shared experts and k = 1", 4)
    if not close(y2, tensor(c["two_output"])):
        fail("with two shared experts (n_shared=2) the output differs: add the outputs of all shared experts")
    module.zero_grad(set_to_none=True)
    with torch.enable_grad():
        y, _ = _moe_output(module, x, "DeepSeekMoE.forward(x [2, 3, 4])", 5)
        y.sum().backward()
    if module.router.weight.grad is None or not module.router.weight.grad.abs().sum() > 0:
        fail("no gradient reaches the router: the output depends on the router's weights through the gates (a softmax "
             "of the chosen logits), so the router can only learn if the gates are computed with autograd on. Do not "
             "route under torch.no_grad() or from detached logits (only the bias update is gradient-free)")
    lone = build_module(cls, c["lone_init"], "DeepSeekMoE", c["lone_state"])
    try:
        with torch.no_grad():
            y0 = lone(tensor(c["lone_x"]))[0]
    except NotImplementedError:
        raise
    except Exception as exc:                           # noqa: BLE001 - what the learner's code raised, said plainly
        fail(f"with no shared expert (n_shared=0) and float64 inputs your layer raised {type(exc).__name__}: {exc}. "
             "Build the output in the input's dtype (torch.zeros_like(x)): torch.zeros(shape) is float32, and only the "
             "shared experts' sum had hidden it")
    expect_tensor(y0, "the output with no shared expert", shape=(4, 3), dtype=torch.float64)
    if not close(y0, tensor(c["lone_output"])):
        fail("with no shared expert (n_shared=0) the output differs: it is the gated routed experts' sum alone")
    y32, _ = _moe_output(module.float(), x.float(), "DeepSeekMoE in float32", 5)
    if not close(y32, expected, atol=1e-5):
        fail("float32 inputs give a different answer from float64 ones")
    ok("two shared experts, none, the router's gradient, float32")
