"""Known-wrong implementations for chapter 08 (see tests/zoo/__init__.py).

Not in the zoo: "f and P swapped" in the load-balancing loss. E * sum_i f_i P_i is symmetric in f
and P, so swapping the names changes nothing; the real mistakes behind it (f from probabilities,
P from the top-k gates) are here.
"""
import math

import torch
import torch.nn.functional as F

from attncourse_ref.moe import biased_top_k_router, capacity_mask, top_k_router

from . import collector

RMS = {"test_rms_norm", "test_rms_norm_grad"}
MOE = {"test_moe", "test_moe_capacity"}
# The MoE layer's experts are the learner's SwiGLU and it routes with the learner's top_k_router and
# capacity_mask: their mistakes also fail the MoE cells (unless the layer's random cases hide them).
# DeepSeekMoE's experts are SwiGLUs too, and it routes with the learner's biased_top_k_router.
DEEPSEEK = {"test_deepseek_moe"}
SWIGLU = {"test_swiglu"} | MOE | DEEPSEEK
ROUTER = {"test_top_k_router"}
CAPACITY = {"test_capacity_mask", "test_moe_capacity"}
VARIANTS, _add = collector()


# ---- RMSNorm.forward ---------------------------------------------------------------------------------------
@_add("RMS over the wrong axis", "rms_norm", RMS, "check_rms_norm", "wrong axis")
def rms_wrong_axis(self, x):
    return x / torch.sqrt(x.pow(2).mean(dim=-2, keepdim=True) + self.eps) * self.weight


@_add("mean subtracted (LayerNorm without a bias)", "rms_norm", RMS, "check_rms_norm", "subtracted the mean")
def rms_mean_subtracted(self, x):
    centred = x - x.mean(dim=-1, keepdim=True)
    return centred / torch.sqrt(centred.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


@_add("eps outside the root", "rms_norm", RMS, "check_rms_norm", "inside the square root")
def rms_eps_outside(self, x):
    return x / (torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True)) + self.eps) * self.weight


@_add("gain not applied", "rms_norm", RMS, "check_rms_norm", "learned gain")
def rms_no_weight(self, x):
    return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)


@_add("divides by the L2 norm", "rms_norm", RMS, "check_rms_norm", "L2 norm")
def rms_l2(self, x):
    return x / torch.sqrt(x.pow(2).sum(dim=-1, keepdim=True) + self.eps) * self.weight


@_add("RMS over all dimensions at once", "rms_norm", RMS, "check_rms_norm", "every dimension")
def rms_all_dims(self, x):
    return x / torch.sqrt(x.pow(2).mean() + self.eps) * self.weight


@_add("calls PyTorch's rms_norm", "rms_norm", RMS, "check_rms_norm", "may not call")
def rms_builtin(self, x):
    return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


@_add("RMS computed on a detached x", "rms_norm", {"test_rms_norm_grad"}, "check_rms_norm_grad", "gradient")
def rms_detached(self, x):
    return x / torch.sqrt(x.detach().pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


# ---- swiglu_hidden -------------------------------------------------------------------------------------------
@_add("4D hidden size", "swiglu_hidden", {"test_swiglu_hidden"}, "check_swiglu_hidden", "4 * d_model")
def hidden_4d(d_model, multiple_of=8):
    return 4 * d_model


@_add("8D/3 rounded down to a multiple", "swiglu_hidden", {"test_swiglu_hidden"}, "check_swiglu_hidden",
      "rounded down")
def hidden_round_down(d_model, multiple_of=8):
    return multiple_of * (8 * d_model // 3 // multiple_of)


@_add("8D/3 rounded up before the multiple", "swiglu_hidden", {"test_swiglu_hidden"}, "check_swiglu_hidden",
      "floor(8 * d_model / 3)")
def hidden_ceil_first(d_model, multiple_of=8):
    return multiple_of * math.ceil(math.ceil(8 * d_model / 3) / multiple_of)


# ---- SwiGLU.forward --------------------------------------------------------------------------------------------
@_add("SwiGLU gate on the wrong branch", "swiglu", SWIGLU, "check_swiglu", "wrong branch")
def swiglu_gate_swapped(self, x):
    return self.w3(self.w1(x) * F.silu(self.w2(x)))


@_add("sigmoid gate instead of silu", "swiglu", SWIGLU, "check_swiglu", "sigmoid")
def swiglu_sigmoid(self, x):
    return self.w3(torch.sigmoid(self.w1(x)) * self.w2(x))


@_add("GELU gate (GeGLU)", "swiglu", SWIGLU, "check_swiglu", "GeGLU")
def swiglu_gelu(self, x):
    return self.w3(F.gelu(self.w1(x)) * self.w2(x))


@_add("no activation", "swiglu", SWIGLU, "check_swiglu", "no nonlinearity")
def swiglu_bilinear(self, x):
    return self.w3(self.w1(x) * self.w2(x))


@_add("silu of the product", "swiglu", SWIGLU, "check_swiglu", "silu to the product")
def swiglu_silu_of_product(self, x):
    return self.w3(F.silu(self.w1(x) * self.w2(x)))


# ---- top_k_router ----------------------------------------------------------------------------------------------
@_add("softmax over all experts then top-k, not renormalised", "top_k_router", ROUTER | MOE,
      "check_top_k_router", "without renormalising")
def router_no_renorm(logits, k):
    probs = torch.softmax(logits, dim=-1)
    experts = torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :k]
    return probs.gather(-1, experts), experts


@_add("torch.topk (ties in its own order)", "top_k_router", ROUTER, "check_top_k_router",
      "lower expert index")
def router_topk(logits, k):
    top, experts = torch.topk(logits, k, dim=-1)
    return torch.softmax(top, dim=-1), experts


@_add("experts in index order", "top_k_router", ROUTER, "check_top_k_router", "wrong order")
def router_index_order(logits, k):
    experts = torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :k].sort(dim=-1).values
    return torch.softmax(logits.gather(-1, experts), dim=-1), experts


@_add("the k smallest logits", "top_k_router", ROUTER | MOE, "check_top_k_router", "largest logits")
def router_smallest(logits, k):
    experts = torch.sort(logits, dim=-1, stable=True).indices[..., :k]
    return torch.softmax(logits.gather(-1, experts), dim=-1), experts


@_add("softmax by hand (overflows)", "top_k_router", ROUTER, "check_top_k_router", "large logits")
def router_naive_softmax(logits, k):
    experts = torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :k]
    e = logits.gather(-1, experts).exp()
    return e / e.sum(dim=-1, keepdim=True), experts


# ---- capacity_mask ------------------------------------------------------------------------------------------------
@_add("capacity keeps the latest tokens", "capacity_mask", CAPACITY, "check_capacity_mask", "earliest")
def capacity_latest(experts, n_experts, capacity):
    flat = F.one_hot(experts.reshape(-1).flip(0), n_experts)
    rank = (flat.cumsum(0) * flat).sum(-1) - 1
    return (rank < capacity).flip(0).reshape(experts.shape)


@_add("capacity queues slot by slot (GShard order)", "capacity_mask", CAPACITY, "check_capacity_mask",
      "GShard")
def capacity_slot_major(experts, n_experts, capacity):
    by_slot = experts.reshape(-1, experts.shape[-1]).T.reshape(-1)       # all first choices, then all second ...
    flat = F.one_hot(by_slot, n_experts)
    rank = (flat.cumsum(0) * flat).sum(-1) - 1
    return (rank < capacity).reshape(experts.shape[-1], -1).T.reshape(experts.shape)


@_add("capacity off by one", "capacity_mask", CAPACITY, "check_capacity_mask", "one more")
def capacity_off_by_one(experts, n_experts, capacity):
    flat = F.one_hot(experts.reshape(-1), n_experts)
    rank = (flat.cumsum(0) * flat).sum(-1) - 1
    return (rank <= capacity).reshape(experts.shape)


# ---- MoE.forward -------------------------------------------------------------------------------------------------
@_add("MoE gates not applied", "moe", MOE, "check_moe", "gates are not applied")
def moe_no_gates(self, x):
    tokens = x.reshape(-1, x.shape[-1])
    logits = self.router(tokens)
    gates, experts = top_k_router(logits, self.k)
    keep = torch.ones_like(experts, dtype=torch.bool)
    if self.capacity_factor is not None:
        keep = capacity_mask(experts, self.n_experts,
                             math.ceil(self.capacity_factor * tokens.shape[0] * self.k / self.n_experts))
    y = torch.zeros_like(tokens)
    for e, expert in enumerate(self.experts):
        token, slot = torch.where((experts == e) & keep)
        y.index_add_(0, token, expert(tokens[token]))
    return y.reshape(x.shape), logits.reshape(*x.shape[:-1], self.n_experts)


@_add("MoE gates from the softmax over all experts", "moe", MOE, "check_moe", "softmax over all experts")
def moe_all_softmax(self, x):
    tokens = x.reshape(-1, x.shape[-1])
    logits = self.router(tokens)
    experts = top_k_router(logits, self.k)[1]
    gates = torch.softmax(logits, dim=-1).gather(-1, experts)
    keep = torch.ones_like(experts, dtype=torch.bool)
    if self.capacity_factor is not None:
        keep = capacity_mask(experts, self.n_experts,
                             math.ceil(self.capacity_factor * tokens.shape[0] * self.k / self.n_experts))
    y = torch.zeros_like(tokens)
    for e, expert in enumerate(self.experts):
        token, slot = torch.where((experts == e) & keep)
        y.index_add_(0, token, gates[token, slot, None] * expert(tokens[token]))
    return y.reshape(x.shape), logits.reshape(*x.shape[:-1], self.n_experts)


@_add("MoE uses only the first expert", "moe", MOE, "check_moe", "first expert")
def moe_first_only(self, x):
    tokens = x.reshape(-1, x.shape[-1])
    logits = self.router(tokens)
    gates, experts = top_k_router(logits, self.k)
    keep = torch.ones_like(experts, dtype=torch.bool)
    if self.capacity_factor is not None:
        keep = capacity_mask(experts, self.n_experts,
                             math.ceil(self.capacity_factor * tokens.shape[0] * self.k / self.n_experts))
    y = torch.zeros_like(tokens)
    for e, expert in enumerate(self.experts):
        token = torch.where((experts[:, 0] == e) & keep[:, 0])[0]
        y.index_add_(0, token, gates[token, 0, None] * expert(tokens[token]))
    return y.reshape(x.shape), logits.reshape(*x.shape[:-1], self.n_experts)


@_add("MoE returns flat router logits", "moe", MOE, "check_moe", "router logits")
def moe_flat_logits(self, x):
    tokens = x.reshape(-1, x.shape[-1])
    logits = self.router(tokens)
    gates, experts = top_k_router(logits, self.k)
    keep = torch.ones_like(experts, dtype=torch.bool)
    if self.capacity_factor is not None:
        keep = capacity_mask(experts, self.n_experts,
                             math.ceil(self.capacity_factor * tokens.shape[0] * self.k / self.n_experts))
    y = torch.zeros_like(tokens)
    for e, expert in enumerate(self.experts):
        token, slot = torch.where((experts == e) & keep)
        y.index_add_(0, token, gates[token, slot, None] * expert(tokens[token]))
    return y.reshape(x.shape), logits


@_add("MoE ignores the capacity", "moe", {"test_moe_capacity"}, "check_moe_capacity", "nothing was dropped")
def moe_no_capacity(self, x):
    tokens = x.reshape(-1, x.shape[-1])
    logits = self.router(tokens)
    gates, experts = top_k_router(logits, self.k)
    y = torch.zeros_like(tokens)
    for e, expert in enumerate(self.experts):
        token, slot = torch.where(experts == e)
        y.index_add_(0, token, gates[token, slot, None] * expert(tokens[token]))
    return y.reshape(x.shape), logits.reshape(*x.shape[:-1], self.n_experts)


@_add("MoE renormalises the gates after dropping", "moe", {"test_moe_capacity"}, "check_moe_capacity", "renormalised")
def moe_renormalised(self, x):
    tokens = x.reshape(-1, x.shape[-1])
    logits = self.router(tokens)
    gates, experts = top_k_router(logits, self.k)
    keep = torch.ones_like(experts, dtype=torch.bool)
    if self.capacity_factor is not None:
        keep = capacity_mask(experts, self.n_experts,
                             math.ceil(self.capacity_factor * tokens.shape[0] * self.k / self.n_experts))
        gates = gates * keep
        gates = gates / gates.sum(-1, keepdim=True).clamp_min(1e-30)
    y = torch.zeros_like(tokens)
    for e, expert in enumerate(self.experts):
        token, slot = torch.where((experts == e) & keep)
        y.index_add_(0, token, gates[token, slot, None] * expert(tokens[token]))
    return y.reshape(x.shape), logits.reshape(*x.shape[:-1], self.n_experts)


@_add("MoE capacity without k", "moe", {"test_moe_capacity"}, "check_moe_capacity", "left out k")
def moe_capacity_no_k(self, x):
    tokens = x.reshape(-1, x.shape[-1])
    logits = self.router(tokens)
    gates, experts = top_k_router(logits, self.k)
    keep = torch.ones_like(experts, dtype=torch.bool)
    if self.capacity_factor is not None:
        keep = capacity_mask(experts, self.n_experts, math.ceil(self.capacity_factor * tokens.shape[0] / self.n_experts))
    y = torch.zeros_like(tokens)
    for e, expert in enumerate(self.experts):
        token, slot = torch.where((experts == e) & keep)
        y.index_add_(0, token, gates[token, slot, None] * expert(tokens[token]))
    return y.reshape(x.shape), logits.reshape(*x.shape[:-1], self.n_experts)


@_add("MoE capacity rounded down", "moe", {"test_moe_capacity"}, "check_moe_capacity", "you rounded it down")
def moe_capacity_floor(self, x):
    tokens = x.reshape(-1, x.shape[-1])
    logits = self.router(tokens)
    gates, experts = top_k_router(logits, self.k)
    keep = torch.ones_like(experts, dtype=torch.bool)
    if self.capacity_factor is not None:
        keep = capacity_mask(experts, self.n_experts, int(self.capacity_factor * tokens.shape[0] * self.k / self.n_experts))
    y = torch.zeros_like(tokens)
    for e, expert in enumerate(self.experts):
        token, slot = torch.where((experts == e) & keep)
        y.index_add_(0, token, gates[token, slot, None] * expert(tokens[token]))
    return y.reshape(x.shape), logits.reshape(*x.shape[:-1], self.n_experts)


@_add("MoE capacity from the last leading dimension's tokens", "moe", {"test_moe_capacity"}, "check_moe_capacity",
      "over all leading dimensions")
def moe_capacity_last_dim(self, x):
    tokens = x.reshape(-1, x.shape[-1])
    logits = self.router(tokens)
    gates, experts = top_k_router(logits, self.k)
    keep = torch.ones_like(experts, dtype=torch.bool)
    if self.capacity_factor is not None:
        n = x.shape[-2] if x.dim() > 1 else 1
        keep = capacity_mask(experts, self.n_experts, math.ceil(self.capacity_factor * n * self.k / self.n_experts))
    y = torch.zeros_like(tokens)
    for e, expert in enumerate(self.experts):
        token, slot = torch.where((experts == e) & keep)
        y.index_add_(0, token, gates[token, slot, None] * expert(tokens[token]))
    return y.reshape(x.shape), logits.reshape(*x.shape[:-1], self.n_experts)


# ---- load_balancing_loss --------------------------------------------------------------------------------------------
LB = {"test_load_balancing_loss"}


@_add("f computed from the router probabilities", "load_balancing_loss", LB, "check_load_balancing_loss",
      "hard top-k assignments")
def lb_f_from_probs(logits, experts):
    probs = torch.softmax(logits.reshape(-1, logits.shape[-1]), dim=-1)
    return logits.shape[-1] * (probs.mean(0) * probs.mean(0)).sum()


@_add("P from the top-k gates", "load_balancing_loss", LB, "check_load_balancing_loss", "full softmax")
def lb_p_from_gates(logits, experts):
    n_experts = logits.shape[-1]
    gates = torch.softmax(logits.gather(-1, experts), dim=-1).reshape(-1)
    tokens = experts[..., 0].numel()
    p = torch.zeros(n_experts, dtype=logits.dtype).index_add(0, experts.reshape(-1), gates) / tokens
    f = torch.bincount(experts.reshape(-1), minlength=n_experts).to(logits.dtype) / experts.numel()
    return n_experts * (f * p).sum()


@_add("f divided by T instead of T*k", "load_balancing_loss", LB, "check_load_balancing_loss", "divide the counts by T*k")
def lb_per_token(logits, experts):
    n_experts = logits.shape[-1]
    probs = torch.softmax(logits.reshape(-1, n_experts), dim=-1)
    f = torch.bincount(experts.reshape(-1), minlength=n_experts).to(logits.dtype) / probs.shape[0]
    return n_experts * (f * probs.mean(0)).sum()


@_add("no factor E", "load_balancing_loss", LB, "check_load_balancing_loss", "number of experts")
def lb_no_e(logits, experts):
    n_experts = logits.shape[-1]
    probs = torch.softmax(logits.reshape(-1, n_experts), dim=-1)
    f = torch.bincount(experts.reshape(-1), minlength=n_experts).to(logits.dtype) / experts.numel()
    return (f * probs.mean(0)).sum()


@_add("P detached (no gradient)", "load_balancing_loss", LB, "check_load_balancing_loss", "no gradient reaches")
def lb_detached(logits, experts):
    n_experts = logits.shape[-1]
    probs = torch.softmax(logits.detach().reshape(-1, n_experts), dim=-1)
    f = torch.bincount(experts.reshape(-1), minlength=n_experts).to(logits.dtype) / experts.numel()
    return n_experts * (f * probs.mean(0)).sum()


@_add("f from the logits' own top-k, not from experts", "load_balancing_loss", LB, "check_load_balancing_loss",
      "recomputed the top-k")
def lb_recomputed_top_k(logits, experts):
    n_experts, k = logits.shape[-1], experts.shape[-1]
    probs = torch.softmax(logits.reshape(-1, n_experts), dim=-1)
    chosen = torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :k]
    f = torch.bincount(chosen.reshape(-1), minlength=n_experts).to(logits.dtype) / chosen.numel()
    return n_experts * (f * probs.mean(0)).sum()


# ---- router_z_loss ------------------------------------------------------------------------------------------------
Z = {"test_router_z_loss"}


@_add("z-loss summed over tokens", "router_z_loss", Z, "check_router_z_loss", "mean")
def z_sum(logits):
    return torch.logsumexp(logits, dim=-1).pow(2).sum()


@_add("z-loss not squared", "router_z_loss", Z, "check_router_z_loss", "square")
def z_no_square(logits):
    return torch.logsumexp(logits, dim=-1).mean()


@_add("z-loss of the max logit", "router_z_loss", Z, "check_router_z_loss", "torch.logsumexp")
def z_max(logits):
    return logits.max(dim=-1).values.pow(2).mean()


@_add("z-loss squared after the mean", "router_z_loss", Z, "check_router_z_loss", "squared after averaging")
def z_square_after_mean(logits):
    return torch.logsumexp(logits, dim=-1).mean().pow(2)


@_add("log-sum-exp by hand (overflows)", "router_z_loss", Z, "check_router_z_loss", "overflow")
def z_naive(logits):
    return logits.exp().sum(dim=-1).log().pow(2).mean()


# ---- transformer_parameters ----------------------------------------------------------------------------------------
P = {"test_transformer_parameters"}


@_add("parameters: K and V as wide as Q (no GQA)", "transformer_parameters", P, "check_transformer_parameters",
      "grouped-query")
def params_no_gqa(d_model, n_layers, n_heads, n_kv_heads, d_ffn, vocab_size, n_experts=1, top_k=1):
    attention = 4 * d_model * d_model
    expert = 3 * d_model * d_ffn
    router = n_experts * d_model if n_experts > 1 else 0
    shared = n_layers * (attention + router + 2 * d_model) + d_model + 2 * vocab_size * d_model
    return shared + n_layers * n_experts * expert, shared + n_layers * top_k * expert


@_add("parameters: every expert active", "transformer_parameters", P, "check_transformer_parameters", "counted all")
def params_all_active(d_model, n_layers, n_heads, n_kv_heads, d_ffn, vocab_size, n_experts=1, top_k=1):
    kv = n_kv_heads * (d_model // n_heads)
    attention = 2 * d_model * d_model + 2 * d_model * kv
    router = n_experts * d_model if n_experts > 1 else 0
    total = n_layers * (attention + router + 2 * d_model + n_experts * 3 * d_model * d_ffn) + d_model \
        + 2 * vocab_size * d_model
    return total, total


@_add("parameters: tied embedding", "transformer_parameters", P, "check_transformer_parameters", "untied")
def params_tied(d_model, n_layers, n_heads, n_kv_heads, d_ffn, vocab_size, n_experts=1, top_k=1):
    kv = n_kv_heads * (d_model // n_heads)
    attention = 2 * d_model * d_model + 2 * d_model * kv
    expert = 3 * d_model * d_ffn
    router = n_experts * d_model if n_experts > 1 else 0
    shared = n_layers * (attention + router + 2 * d_model) + d_model + vocab_size * d_model
    return shared + n_layers * n_experts * expert, shared + n_layers * top_k * expert


@_add("parameters: norms forgotten", "transformer_parameters", P, "check_transformer_parameters", "per layer")
def params_no_norms(d_model, n_layers, n_heads, n_kv_heads, d_ffn, vocab_size, n_experts=1, top_k=1):
    kv = n_kv_heads * (d_model // n_heads)
    attention = 2 * d_model * d_model + 2 * d_model * kv
    expert = 3 * d_model * d_ffn
    router = n_experts * d_model if n_experts > 1 else 0
    shared = n_layers * (attention + router) + 2 * vocab_size * d_model
    return shared + n_layers * n_experts * expert, shared + n_layers * top_k * expert


@_add("parameters: a router in a dense model", "transformer_parameters", P, "check_transformer_parameters",
      "router when n_experts")
def params_dense_router(d_model, n_layers, n_heads, n_kv_heads, d_ffn, vocab_size, n_experts=1, top_k=1):
    kv = n_kv_heads * (d_model // n_heads)
    attention = 2 * d_model * d_model + 2 * d_model * kv
    expert = 3 * d_model * d_ffn
    shared = n_layers * (attention + n_experts * d_model + 2 * d_model) + d_model + 2 * vocab_size * d_model
    return shared + n_layers * n_experts * expert, shared + n_layers * top_k * expert


# ---- issue 23: ties in long rows, integer results ------------------------------------------------------------------
@_add("descending sort without stable=True (ties in long rows)", "top_k_router", ROUTER, "check_top_k_router",
      "more than 16")
def router_unstable_sort(logits, k):
    experts = torch.sort(logits, dim=-1, descending=True).indices[..., :k]
    return torch.softmax(logits.gather(-1, experts), dim=-1), experts


@_add("hidden size as a float (// on a float)", "swiglu_hidden", {"test_swiglu_hidden"}, "check_swiglu_hidden",
      "Python int")
def swiglu_hidden_float(d_model, multiple_of=8):
    return -(-(8 * d_model // 3) // multiple_of) * multiple_of * 1.0


@_add("parameter counts as floats (/ instead of //)", "transformer_parameters", P, "check_transformer_parameters",
      "Python ints")
def parameters_float(d_model, n_layers, n_heads, n_kv_heads, d_ffn, vocab_size, n_experts=1, top_k=1):
    kv = n_kv_heads * (d_model / n_heads)
    attention = 2 * d_model * d_model + 2 * d_model * kv
    expert = 3 * d_model * d_ffn
    router = n_experts * d_model if n_experts > 1 else 0
    shared = n_layers * (attention + router + 2 * d_model) + d_model + 2 * vocab_size * d_model
    return shared + n_layers * n_experts * expert, shared + n_layers * top_k * expert


# ---- auxiliary-loss-free balancing (DeepSeek-V3) ------------------------------------------------------------------
BIASED = {"test_biased_top_k_router"}


@_add("bias used in the gate weights too", "biased_top_k_router", BIASED | DEEPSEEK, "check_biased_top_k_router",
      "unbiased logits")
def biased_gates_with_bias(logits, bias, k):
    scores = logits + bias
    experts = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
    return torch.softmax(scores.gather(-1, experts), dim=-1), experts


@_add("bias added after the top-k (no effect on the choice)", "biased_top_k_router", BIASED | DEEPSEEK,
      "check_biased_top_k_router", "after the top-k")
def biased_after_top_k(logits, bias, k):
    experts = torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :k]
    return torch.softmax(logits.gather(-1, experts) + bias[experts], dim=-1), experts


@_add("bias subtracted from the logits", "biased_top_k_router", BIASED | DEEPSEEK, "check_biased_top_k_router",
      "logits + bias")
def biased_subtracted(logits, bias, k):
    experts = torch.sort(logits - bias, dim=-1, descending=True, stable=True).indices[..., :k]
    return torch.softmax(logits.gather(-1, experts), dim=-1), experts


@_add("biased router: descending sort without stable=True (ties in long rows)", "biased_top_k_router", BIASED,
      "check_biased_top_k_router", "more than 16")
def biased_unstable_sort(logits, bias, k):
    experts = torch.sort(logits + bias, dim=-1, descending=True).indices[..., :k]
    return torch.softmax(logits.gather(-1, experts), dim=-1), experts


UPDATE = {"test_update_bias"}


@_add("bias update with the sign reversed", "update_bias", UPDATE, "check_update_bias", "overloaded")
def update_reversed(bias, experts, gamma):
    load = torch.bincount(experts.reshape(-1), minlength=bias.shape[-1]).to(bias.dtype)
    return bias.detach() + gamma * torch.sign(load - experts.numel() / bias.shape[-1])


@_add("bias update by the load difference, not its sign", "update_bias", UPDATE, "check_update_bias", "sign")
def update_difference(bias, experts, gamma):
    load = torch.bincount(experts.reshape(-1), minlength=bias.shape[-1]).to(bias.dtype)
    return bias.detach() + gamma * (experts.numel() / bias.shape[-1] - load)


@_add("mean load per token, not per assignment (k left out)", "update_bias", UPDATE, "check_update_bias", "T * k")
def update_mean_without_k(bias, experts, gamma):
    load = torch.bincount(experts.reshape(-1), minlength=bias.shape[-1]).to(bias.dtype)
    tokens = experts.numel() // experts.shape[-1]
    return bias.detach() + gamma * torch.sign(tokens / bias.shape[-1] - load)


@_add("an expert exactly at the mean load is moved too", "update_bias", UPDATE, "check_update_bias",
      "exactly at the mean")
def update_no_zero(bias, experts, gamma):
    load = torch.bincount(experts.reshape(-1), minlength=bias.shape[-1]).to(bias.dtype)
    return bias.detach() + torch.where(load < experts.numel() / bias.shape[-1], gamma, -gamma)


@_add("loads counted by bincount without minlength (an idle last expert)", "update_bias", UPDATE, "check_update_bias",
      "minlength=E")
def update_no_minlength(bias, experts, gamma):
    load = torch.bincount(experts.reshape(-1)).to(bias.dtype)
    return bias.detach() + gamma * torch.sign(experts.numel() / bias.shape[-1] - load)


@_add("mean load by integer division (T * k // E)", "update_bias", UPDATE, "check_update_bias", "integer division")
def update_floor_mean(bias, experts, gamma):
    load = torch.bincount(experts.reshape(-1), minlength=bias.shape[-1]).to(bias.dtype)
    return bias.detach() + gamma * torch.sign(experts.numel() // bias.shape[-1] - load)


@_add("bias update that keeps autograd history", "update_bias", UPDATE, "check_update_bias", "autograd history")
def update_with_history(bias, experts, gamma):
    load = torch.bincount(experts.reshape(-1), minlength=bias.shape[-1]).to(bias.dtype)
    return bias + gamma * torch.sign(experts.numel() / bias.shape[-1] - load)


@_add("bias updated in place", "update_bias", UPDATE, "check_update_bias", "in place")
def update_in_place(bias, experts, gamma):
    load = torch.bincount(experts.reshape(-1), minlength=bias.shape[-1]).to(bias.dtype)
    with torch.no_grad():
        bias += gamma * torch.sign(experts.numel() / bias.shape[-1] - load)
    return bias


@_add("DeepSeekMoE routes without the bias", "deepseek_moe", DEEPSEEK, "check_deepseek_moe", "without the bias")
def deepseek_no_bias(self, x):
    tokens = x.reshape(-1, x.shape[-1])
    logits = self.router(tokens)
    experts = torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :self.k]
    gates = torch.softmax(logits.gather(-1, experts), dim=-1)
    y = torch.zeros_like(tokens)
    for expert in self.shared:
        y = y + expert(tokens)
    for e, expert in enumerate(self.experts):
        token, slot = torch.where(experts == e)
        y = y.index_add(0, token, gates[token, slot, None] * expert(tokens[token]))
    return y.reshape(x.shape), logits.reshape(*x.shape[:-1], self.n_experts)


@_add("shared expert gated by the router", "deepseek_moe", DEEPSEEK, "check_deepseek_moe", "no gate")
def deepseek_shared_gated(self, x):
    tokens = x.reshape(-1, x.shape[-1])
    logits = self.router(tokens)
    experts = torch.sort(logits + self.bias, dim=-1, descending=True, stable=True).indices[..., :self.k]
    gates = torch.softmax(logits.gather(-1, experts), dim=-1)
    y = torch.zeros_like(tokens)
    for expert in self.shared:
        y = y + gates[:, :1] * expert(tokens)
    for e, expert in enumerate(self.experts):
        token, slot = torch.where(experts == e)
        y = y.index_add(0, token, gates[token, slot, None] * expert(tokens[token]))
    return y.reshape(x.shape), logits.reshape(*x.shape[:-1], self.n_experts)


@_add("shared experts left out", "deepseek_moe", DEEPSEEK, "check_deepseek_moe", "shared experts")
def deepseek_no_shared(self, x):
    tokens = x.reshape(-1, x.shape[-1])
    logits = self.router(tokens)
    experts = torch.sort(logits + self.bias, dim=-1, descending=True, stable=True).indices[..., :self.k]
    gates = torch.softmax(logits.gather(-1, experts), dim=-1)
    y = torch.zeros_like(tokens)
    for e, expert in enumerate(self.experts):
        token, slot = torch.where(experts == e)
        y = y.index_add(0, token, gates[token, slot, None] * expert(tokens[token]))
    return y.reshape(x.shape), logits.reshape(*x.shape[:-1], self.n_experts)


@_add("DeepSeekMoE routes under torch.no_grad() (its router can never learn)", "deepseek_moe", DEEPSEEK,
      "check_deepseek_moe", "no gradient reaches the router")
def deepseek_no_grad_routing(self, x):
    tokens = x.reshape(-1, x.shape[-1])
    logits = self.router(tokens)
    with torch.no_grad():
        experts = torch.sort(logits + self.bias, dim=-1, descending=True, stable=True).indices[..., :self.k]
        gates = torch.softmax(logits.gather(-1, experts), dim=-1)
    y = torch.zeros_like(tokens)
    for expert in self.shared:
        y = y + expert(tokens)
    for e, expert in enumerate(self.experts):
        token, slot = torch.where(experts == e)
        y = y.index_add(0, token, gates[token, slot, None] * expert(tokens[token]))
    return y.reshape(x.shape), logits.reshape(*x.shape[:-1], self.n_experts)


@_add("DeepSeekMoE output buffer made in float32 (torch.zeros(shape))", "deepseek_moe", DEEPSEEK, "check_deepseek_moe",
      "torch.zeros(shape) is float32")
def deepseek_float32_buffer(self, x):
    tokens = x.reshape(-1, x.shape[-1])
    logits = self.router(tokens)
    gates, experts = biased_top_k_router(logits, self.bias, self.k)   # the learner's, in the notebook
    y = torch.zeros(tokens.shape)                     # float32, whatever x's dtype
    for expert in self.shared:
        y = y + expert(tokens)
    for e, expert in enumerate(self.experts):
        token, slot = torch.where(experts == e)
        y = y.index_add(0, token, gates[token, slot, None] * expert(tokens[token]))
    return y.reshape(x.shape), logits.reshape(*x.shape[:-1], self.n_experts)


@_add("DeepSeekMoE returns the biased logits", "deepseek_moe", DEEPSEEK, "check_deepseek_moe", "unbiased")
def deepseek_biased_logits(self, x):
    tokens = x.reshape(-1, x.shape[-1])
    scores = self.router(tokens) + self.bias
    experts = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :self.k]
    gates = torch.softmax((scores - self.bias).gather(-1, experts), dim=-1)
    y = torch.zeros_like(tokens)
    for expert in self.shared:
        y = y + expert(tokens)
    for e, expert in enumerate(self.experts):
        token, slot = torch.where(experts == e)
        y = y.index_add(0, token, gates[token, slot, None] * expert(tokens[token]))
    return y.reshape(x.shape), scores.reshape(*x.shape[:-1], self.n_experts)
