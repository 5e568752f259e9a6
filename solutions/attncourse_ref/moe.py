"""Chapter 08: modern tweaks and Mixture-of-Experts (reference implementation).

RMSNorm, SwiGLU, a top-k router, expert capacity, the MoE layer, the Switch load-balancing
loss, the router z-loss, DeepSeek-V3's auxiliary-loss-free balancing (a biased router, its bias
update and a layer with shared experts), and the parameter bookkeeping of a (MoE) Transformer.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last dimension: x / sqrt(eps + mean(x^2)) * weight.

    Parameters: weight [d] (initialised to ones). forward(x [..., d]) -> [..., d], same dtype.
    """

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x * inv_rms * self.weight


def swiglu_hidden(d_model, multiple_of=8):
    """SwiGLU hidden size: floor(8 d_model / 3) rounded up to a multiple of ``multiple_of`` (as LLaMA)."""
    hidden = 8 * d_model // 3
    return multiple_of * -(-hidden // multiple_of)


class SwiGLU(nn.Module):
    """Y = (silu(X W1) * X W2) W3, no biases.

    Parameters: w1.weight [H, D] (gate), w2.weight [H, D] (value), w3.weight [D, H] (output).
    """

    def __init__(self, d_model, d_hidden=None, multiple_of=8):
        super().__init__()
        d_hidden = d_hidden or swiglu_hidden(d_model, multiple_of)
        self.w1 = nn.Linear(d_model, d_hidden, bias=False)
        self.w2 = nn.Linear(d_model, d_hidden, bias=False)
        self.w3 = nn.Linear(d_hidden, d_model, bias=False)

    def forward(self, x):
        return self.w3(F.silu(self.w1(x)) * self.w2(x))


def top_k_router(logits, k):
    """The k largest logits per token and their gates.

    logits [..., E] -> (gates [..., k], experts [..., k] int64). Experts in descending order of
    logit, ties broken by the lower expert index first; gates are the softmax over the k
    selected logits (they sum to 1 per token), as Mixtral does.
    """
    # A stable descending sort keeps tied logits in index order; torch.topk promises no order.
    experts = torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :k]
    gates = torch.softmax(logits.gather(-1, experts), dim=-1)
    return gates, experts


def capacity_mask(experts, n_experts, capacity):
    """Which (token, slot) assignments fit: experts [..., k] int64 -> bool [..., k].

    Tokens queue for an expert in token order (leading dimensions flattened row-major); each
    expert keeps its first ``capacity`` tokens and drops the rest.
    """
    flat = F.one_hot(experts.reshape(-1), n_experts)           # [T * k, E], token-major
    rank = (flat.cumsum(0) * flat).sum(-1) - 1                 # place of each assignment in its expert's queue
    return (rank < capacity).reshape(experts.shape)


class MoE(nn.Module):
    """A Mixture-of-Experts feed-forward layer: a linear router and E SwiGLU experts, top-k routing.

    Parameters: router.weight [E, D]; experts.<e>.w1/w2/w3 as in SwiGLU(d_model, d_hidden).
    forward(x [..., D]) -> (y [..., D], router logits [..., E]): y = sum over each token's k
    experts of gate * expert(x). With a capacity factor, each expert takes at most
    ceil(capacity_factor * T * k / E) of the T tokens (capacity_mask's order); a dropped
    assignment adds nothing (the other gates are not renormalised), so a token dropped by all
    its experts gets y = 0 and the block's residual connection carries it on unchanged.
    """

    def __init__(self, d_model, d_hidden, n_experts, k, capacity_factor=None):
        super().__init__()
        self.n_experts, self.k, self.capacity_factor = n_experts, k, capacity_factor
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(d_model, d_hidden) for _ in range(n_experts))

    def forward(self, x):
        tokens = x.reshape(-1, x.shape[-1])
        logits = self.router(tokens)
        gates, experts = top_k_router(logits, self.k)
        keep = torch.ones_like(experts, dtype=torch.bool)
        if self.capacity_factor is not None:
            capacity = math.ceil(self.capacity_factor * tokens.shape[0] * self.k / self.n_experts)
            keep = capacity_mask(experts, self.n_experts, capacity)
        y = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where((experts == e) & keep)   # only the tokens sent to expert e
            if token.numel():
                y.index_add_(0, token, gates[token, slot, None] * expert(tokens[token]))
        return y.reshape(x.shape), logits.reshape(*x.shape[:-1], self.n_experts)


def load_balancing_loss(logits, experts):
    """Switch Transformer auxiliary loss E * sum_i f_i P_i (1 when perfectly balanced).

    logits [..., E]; experts [..., k] int64 (the top-k choices). f_i: fraction of the T*k
    (token, slot) assignments that go to expert i (from the counts, no gradient); P_i: mean
    router probability softmax(logits)_i over the T tokens.
    """
    n_experts = logits.shape[-1]
    probs = torch.softmax(logits.reshape(-1, n_experts), dim=-1)
    f = torch.bincount(experts.reshape(-1), minlength=n_experts).to(logits.dtype) / experts.numel()
    return n_experts * (f * probs.mean(0)).sum()


def router_z_loss(logits):
    """ST-MoE router z-loss: mean over tokens of logsumexp(logits)^2; logits [..., E]."""
    return torch.logsumexp(logits, dim=-1).pow(2).mean()


def biased_top_k_router(logits, bias, k):
    """Top-k routing with a per-expert bias that moves the choice but not the gates (DeepSeek-V3).

    logits [..., E], bias [E] (same dtype) -> (gates [..., k], experts [..., k] int64). Experts: the k
    largest of logits + bias, in descending order of logits + bias, ties to the lower index; gates:
    the softmax over the chosen experts' UNBIASED logits (top_k_router's convention, so a zero bias
    gives top_k_router's answer). The bias gets no gradient: it only picks the indices.
    """
    experts = torch.sort(logits + bias, dim=-1, descending=True, stable=True).indices[..., :k]
    gates = torch.softmax(logits.gather(-1, experts), dim=-1)
    return gates, experts


def update_bias(bias, experts, gamma):
    """DeepSeek-V3's bias update after a batch: b_i + gamma * sign(mean load - load_i).

    bias [E]; experts int64 [..., k], the batch's choices; load_i = how many of the T*k assignments
    went to expert i, mean load = T*k / E. An overloaded expert's bias drops by gamma, an underloaded
    one's rises by gamma, one exactly at the mean keeps its bias. Returns a new tensor of the bias's
    dtype with no autograd history (the bias is not trained by gradients); the input is unchanged.
    """
    with torch.no_grad():
        n_experts = bias.shape[-1]
        load = torch.bincount(experts.reshape(-1), minlength=n_experts).to(bias.dtype)
        return bias.detach() + gamma * torch.sign(experts.numel() / n_experts - load)


class DeepSeekMoE(nn.Module):
    """An MoE layer with shared experts and auxiliary-loss-free routing, as in DeepSeek-V3.

    Parameters: router.weight [E, D]; experts.<e> and shared.<s> SwiGLU(d_model, d_hidden); buffer
    bias [E] (zeros; changed by update_bias, not by the optimiser). forward(x [..., D]) ->
    (y [..., D], router logits [..., E], unbiased): y = sum of the n_shared shared experts' outputs
    (every token, no gate) + sum over each token's k experts chosen by biased_top_k_router of
    gate * expert(x). No capacity: no token is dropped.
    """

    def __init__(self, d_model, d_hidden, n_experts, k, n_shared=1):
        super().__init__()
        self.n_experts, self.k = n_experts, k
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(d_model, d_hidden) for _ in range(n_experts))
        self.shared = nn.ModuleList(SwiGLU(d_model, d_hidden) for _ in range(n_shared))
        self.register_buffer("bias", torch.zeros(n_experts))

    def forward(self, x):
        tokens = x.reshape(-1, x.shape[-1])
        logits = self.router(tokens)
        gates, experts = biased_top_k_router(logits, self.bias, self.k)
        y = torch.zeros_like(tokens)
        for expert in self.shared:
            y = y + expert(tokens)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(experts == e)
            if token.numel():
                y = y.index_add(0, token, gates[token, slot, None] * expert(tokens[token]))
        return y.reshape(x.shape), logits.reshape(*x.shape[:-1], self.n_experts)


def transformer_parameters(d_model, n_layers, n_heads, n_kv_heads, d_ffn, vocab_size, n_experts=1, top_k=1):
    """(total, active) parameter counts of a pre-norm decoder with SwiGLU (MoE) feed-forward layers.

    Per layer: W_Q and W_O [D, D], W_K and W_V [D, n_kv_heads * D / n_heads], no biases; each
    expert a SwiGLU (3 D d_ffn); a router [n_experts, D] when n_experts > 1; two RMSNorm gains.
    Plus a final RMSNorm, the token embedding and an untied output head ([V, D] each).
    Active: the same with top_k experts per layer instead of n_experts.
    """
    kv = n_kv_heads * (d_model // n_heads)
    attention = 2 * d_model * d_model + 2 * d_model * kv
    expert = 3 * d_model * d_ffn
    router = n_experts * d_model if n_experts > 1 else 0
    shared = n_layers * (attention + router + 2 * d_model) + d_model + 2 * vocab_size * d_model
    return shared + n_layers * n_experts * expert, shared + n_layers * top_k * expert
