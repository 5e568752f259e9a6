"""The chapter 08 reference against PyTorch's RMSNorm, Hugging Face's Mixtral, plain Python loops, and its properties."""
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attncourse_ref import moe as ref

transformers = pytest.importorskip("transformers")
from transformers import MixtralConfig, MixtralForCausalLM, MistralConfig, MistralForCausalLM  # noqa: E402
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func  # noqa: E402

dtypes = st.sampled_from([torch.float32, torch.float64])


# ---- RMSNorm ------------------------------------------------------------------------------------------
@given(lead=st.lists(st.integers(1, 3), max_size=2), d=st.integers(1, 12), dtype=dtypes,
       eps=st.sampled_from([1e-6, 1e-3, 0.1]), scale=st.sampled_from([0.01, 1.0, 30.0]), seed=st.integers(0, 2**16))
def test_rms_norm_matches_torch(lead, d, dtype, eps, scale, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*lead, d, generator=g, dtype=dtype) * scale).requires_grad_(True)
    ours, theirs = ref.RMSNorm(d, eps).to(dtype), torch.nn.RMSNorm(d, eps=eps).to(dtype)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(d, generator=g, dtype=dtype))
        theirs.weight.copy_(ours.weight)
    y, expected = ours(x), theirs(x)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(y, expected, rtol=tol, atol=tol)
    assert y.dtype == dtype
    cot = torch.randn(y.shape, generator=g, dtype=dtype)
    grads = torch.autograd.grad((y * cot).sum(), (x, ours.weight))
    expected_grads = torch.autograd.grad((expected * cot).sum(), (x, theirs.weight))
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=10 * tol, atol=10 * tol)


def test_rms_norm_output_has_unit_mean_square():
    x = torch.randn(4, 7, 32, dtype=torch.float64) * 5 + 2
    y = ref.RMSNorm(32, eps=0.0).double()(x)
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(4, 7, dtype=torch.float64))


# ---- SwiGLU ------------------------------------------------------------------------------------------
def test_swiglu_hidden_llama_sizes():
    assert ref.swiglu_hidden(4096, 256) == 11008          # LLaMA-7B
    assert ref.swiglu_hidden(5120, 256) == 13824          # LLaMA-13B
    assert ref.swiglu_hidden(8192, 256) == 22016          # LLaMA-65B


@given(d=st.integers(1, 10_000), m=st.integers(1, 512))
def test_swiglu_hidden_is_the_smallest_multiple_at_least_8d_over_3(d, m):
    h = ref.swiglu_hidden(d, m)
    assert isinstance(h, int) and h % m == 0
    assert 8 * d // 3 <= h < 8 * d // 3 + m


def test_swiglu_matches_its_formula():
    torch.manual_seed(0)
    sw = ref.SwiGLU(6, 10).double()
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    w1, w2, w3 = sw.w1.weight, sw.w2.weight, sw.w3.weight
    a = x @ w1.T
    expected = ((a * torch.sigmoid(a)) * (x @ w2.T)) @ w3.T
    torch.testing.assert_close(sw(x), expected)
    assert sum(p.numel() for p in ref.SwiGLU(64).parameters()) == 3 * 64 * 176


# ---- the router ----------------------------------------------------------------------------------------
def _python_top_k(row, k):
    """Descending logit, lower index first among ties: plain Python sorting."""
    order = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
    top = [row[i] for i in order]
    m = max(top)
    e = [math.exp(t - m) for t in top]
    return [v / sum(e) for v in e], order


@given(rows=st.integers(1, 6), n_experts=st.integers(1, 8), data=st.data(), integer=st.booleans(), dtype=dtypes)
def test_router_matches_python_sorting_with_ties(rows, n_experts, data, integer, dtype):
    k = data.draw(st.integers(1, n_experts))
    values = st.integers(-2, 2) if integer else st.floats(-5, 5, allow_nan=False)
    logits = torch.tensor([[float(data.draw(values)) for _ in range(n_experts)] for _ in range(rows)], dtype=dtype)
    gates, experts = ref.top_k_router(logits, k)
    assert experts.dtype == torch.int64 and gates.dtype == dtype
    for r in range(rows):
        want_gates, want_experts = _python_top_k(logits[r].tolist(), k)
        assert experts[r].tolist() == want_experts
        torch.testing.assert_close(gates[r], torch.tensor(want_gates, dtype=dtype))


def test_router_matches_mixtral_without_ties():
    torch.manual_seed(1)
    logits = torch.randn(50, 8)
    gates, experts = ref.top_k_router(logits, 2)
    probs = torch.softmax(logits, -1)
    top, idx = torch.topk(probs, 2, dim=-1)                     # Mixtral: softmax over all, top-k, renormalise
    assert torch.equal(experts, idx)
    torch.testing.assert_close(gates, top / top.sum(-1, keepdim=True))


def test_router_differs_from_topk_on_ties():
    """The tie rule is a real constraint: torch.topk on CPU breaks some ties otherwise (why the docstring fixes it)."""
    logits = torch.tensor([[1.0, 2.0, 2.0, 0.0, 2.0]])
    assert ref.top_k_router(logits, 2)[1].tolist() == [[1, 2]]


# ---- capacity -----------------------------------------------------------------------------------------
def _python_capacity(experts, capacity):
    used, keep = {}, []
    for token in experts.reshape(-1, experts.shape[-1]).tolist():
        row = []
        for e in token:
            used[e] = used.get(e, 0) + 1
            row.append(used[e] <= capacity)
        keep.append(row)
    return torch.tensor(keep, dtype=torch.bool).reshape(experts.shape)


@given(lead=st.lists(st.integers(1, 4), min_size=1, max_size=3), n_experts=st.integers(1, 6), data=st.data(),
       seed=st.integers(0, 2**16))
def test_capacity_mask_matches_a_queue(lead, n_experts, data, seed):
    k = data.draw(st.integers(1, n_experts))
    capacity = data.draw(st.integers(0, 6))
    g = torch.Generator().manual_seed(seed)
    experts = torch.randn(*lead, n_experts, generator=g).argsort(-1)[..., :k]
    keep = ref.capacity_mask(experts, n_experts, capacity)
    assert keep.dtype == torch.bool
    assert torch.equal(keep, _python_capacity(experts, capacity))
    counts = torch.bincount(experts[keep], minlength=n_experts)
    assert int(counts.max()) <= capacity if keep.any() else True


# ---- the MoE layer against a dense loop -----------------------------------------------------------------
def dense_loop(layer, x, keep=None):
    """Every expert on every token, weighted by its gate (zero when not chosen or dropped)."""
    tokens = x.reshape(-1, x.shape[-1])
    gates, experts = ref.top_k_router(layer.router(tokens), layer.k)
    if keep is not None:
        gates = gates * keep
    y = torch.zeros_like(tokens)
    for e, expert in enumerate(layer.experts):
        weight = (gates * (experts == e)).sum(-1, keepdim=True)
        y = y + weight * expert(tokens)
    return y.reshape(x.shape)


@given(shape=st.sampled_from([(5,), (1, 5), (3, 5), (2, 4, 5), (2, 1, 3, 5)]), n_experts=st.integers(1, 8),
       data=st.data(), dtype=dtypes, seed=st.integers(0, 2**16), skew=st.booleans())
def test_moe_matches_the_dense_loop(shape, n_experts, data, dtype, seed, skew):
    k = data.draw(st.integers(1, n_experts))
    torch.manual_seed(seed)
    layer = ref.MoE(5, 7, n_experts, k).to(dtype)
    if skew:
        with torch.no_grad():
            layer.router.weight[0] += 5.0          # most experts receive no token
    x = torch.randn(shape, dtype=dtype)
    with torch.no_grad():
        y, logits = layer(x)
        expected = dense_loop(layer, x)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(y, expected, rtol=tol, atol=tol)
    assert logits.shape == shape[:-1] + (n_experts,) and y.dtype == dtype


@given(tokens=st.integers(1, 20), n_experts=st.integers(2, 6), factor=st.sampled_from([0.25, 0.5, 1.0, 1.5]),
       data=st.data(), seed=st.integers(0, 2**16))
def test_moe_with_capacity_matches_the_dense_loop_and_drops_to_zero(tokens, n_experts, factor, data, seed):
    k = data.draw(st.integers(1, n_experts))
    torch.manual_seed(seed)
    layer = ref.MoE(4, 6, n_experts, k, capacity_factor=factor).double()
    with torch.no_grad():
        layer.router.weight[1] += 1.0
    x = torch.randn(tokens, 4, dtype=torch.float64)
    with torch.no_grad():
        y, logits = layer(x)
        experts = ref.top_k_router(logits, k)[1]
        keep = _python_capacity(experts, math.ceil(factor * tokens * k / n_experts))
        torch.testing.assert_close(y, dense_loop(layer, x, keep))
    dropped = ~keep.any(-1)
    assert (y[dropped] == 0).all()                 # fully dropped tokens: zero, the residual carries them


def test_moe_matches_huggingface_mixtral_block():
    torch.manual_seed(2)
    cfg = MixtralConfig(hidden_size=8, intermediate_size=12, num_local_experts=6, num_experts_per_tok=2,
                        router_jitter_noise=0.0)
    theirs = MixtralSparseMoeBlock(cfg).double().eval()
    ours = ref.MoE(8, 12, 6, 2).double()
    with torch.no_grad():
        theirs.gate.weight.copy_(ours.router.weight)
        for e, expert in enumerate(ours.experts):
            theirs.experts.gate_up_proj[e].copy_(torch.cat([expert.w1.weight, expert.w2.weight]))
            theirs.experts.down_proj[e].copy_(expert.w3.weight)
        x = torch.randn(3, 5, 8, dtype=torch.float64)
        torch.testing.assert_close(ours(x)[0], theirs(x).to(torch.float64), rtol=1e-6, atol=1e-6)


# ---- auxiliary losses ---------------------------------------------------------------------------------------
@given(tokens=st.integers(1, 30), n_experts=st.integers(2, 8), data=st.data(), seed=st.integers(0, 2**16))
def test_load_balancing_loss_is_huggingface_mixtral_over_k(tokens, n_experts, data, seed):
    k = data.draw(st.integers(1, n_experts))
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, n_experts, generator=g) * 2
    experts = ref.top_k_router(logits, k)[1]
    # Hugging Face counts f over the T tokens (its loss is k at balance); ours over the T*k assignments.
    expected = load_balancing_loss_func((logits,), n_experts, k) / k
    torch.testing.assert_close(ref.load_balancing_loss(logits, experts), expected, rtol=1e-5, atol=1e-6)


def test_load_balancing_loss_is_one_when_balanced_and_its_gradient_flows_through_p_only():
    logits = torch.zeros(8, 4, dtype=torch.float64, requires_grad=True)
    experts = torch.tensor([[0, 1], [2, 3]] * 4)
    loss = ref.load_balancing_loss(logits, experts)
    assert loss.item() == pytest.approx(1.0)
    skewed = torch.randn(16, 4, dtype=torch.float64).requires_grad_(True)
    chosen = ref.top_k_router(skewed, 2)[1]
    (grad,) = torch.autograd.grad(ref.load_balancing_loss(skewed, chosen), skewed)
    f = torch.bincount(chosen.flatten(), minlength=4).double() / chosen.numel()
    (expected,) = torch.autograd.grad(4 * (f * torch.softmax(skewed, -1).mean(0)).sum(), skewed)
    torch.testing.assert_close(grad, expected)


@given(lead=st.lists(st.integers(1, 3), min_size=1, max_size=3), n_experts=st.integers(1, 8), dtype=dtypes,
       seed=st.integers(0, 2**16))
def test_router_z_loss_matches_its_formula(lead, n_experts, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(*lead, n_experts, generator=g, dtype=dtype) * 3
    expected = torch.log(torch.exp(logits.double()).sum(-1)).pow(2).mean().to(dtype)
    z = ref.router_z_loss(logits)
    assert z.dim() == 0 and z.dtype == dtype
    torch.testing.assert_close(z, expected)


def test_router_z_loss_is_finite_for_large_float32_logits():
    z = ref.router_z_loss(torch.tensor([[120.0, 119.0, 100.0]]))
    assert torch.isfinite(z) and z.item() == pytest.approx((120 + math.log1p(math.exp(-1.0))) ** 2, rel=1e-5)


# ---- parameter counts against Hugging Face models built on the meta device ------------------------------------
def _count(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("d, layers, heads, kv, ffn, vocab, experts, k", [
    (64, 2, 4, 2, 88, 100, 8, 2), (48, 3, 6, 6, 96, 50, 4, 1), (128, 1, 8, 1, 200, 300, 16, 4),
    (4096, 32, 32, 8, 14336, 32000, 8, 2)])
def test_parameters_match_huggingface_mixtral(d, layers, heads, kv, ffn, vocab, experts, k):
    cfg = MixtralConfig(vocab_size=vocab, hidden_size=d, intermediate_size=ffn, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv, num_local_experts=experts,
                        num_experts_per_tok=k, tie_word_embeddings=False)
    with torch.device("meta"):
        model = MixtralForCausalLM(cfg)
    total, active = ref.transformer_parameters(d, layers, heads, kv, ffn, vocab, experts, k)
    assert total == _count(model)
    assert active == total - layers * (experts - k) * 3 * d * ffn


@pytest.mark.parametrize("d, layers, heads, kv, ffn, vocab", [(64, 2, 4, 4, 176, 65), (4096, 32, 32, 8, 14336, 32000)])
def test_dense_parameters_match_huggingface_mistral(d, layers, heads, kv, ffn, vocab):
    cfg = MistralConfig(vocab_size=vocab, hidden_size=d, intermediate_size=ffn, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=False)
    with torch.device("meta"):
        model = MistralForCausalLM(cfg)
    assert ref.transformer_parameters(d, layers, heads, kv, ffn, vocab) == (_count(model), _count(model))


def test_mixtral_published_sizes():
    total, active = ref.transformer_parameters(4096, 32, 32, 8, 14336, 32000, 8, 2)
    assert round(total / 1e9, 1) == 46.7 and round(active / 1e9, 1) == 12.9


# ---- auxiliary-loss-free balancing (DeepSeek-V3) ----------------------------------------------------------------
@given(rows=st.integers(1, 5), n_experts=st.integers(1, 24), data=st.data(), dtype=dtypes)
def test_biased_router_chooses_by_logits_plus_bias_and_gates_by_logits(rows, n_experts, data, dtype):
    k = data.draw(st.integers(1, n_experts))
    ints = st.integers(-2, 2)
    logits = torch.tensor([[float(data.draw(ints)) for _ in range(n_experts)] for _ in range(rows)], dtype=dtype)
    bias = torch.tensor([float(data.draw(ints)) for _ in range(n_experts)], dtype=dtype)
    gates, experts = ref.biased_top_k_router(logits, bias, k)
    assert experts.dtype == torch.int64 and gates.dtype == dtype
    for r in range(rows):
        scores = (logits[r] + bias).tolist()
        order = sorted(range(n_experts), key=lambda i: (-scores[i], i))[:k]      # ties to the lower index
        assert experts[r].tolist() == order
        torch.testing.assert_close(gates[r], torch.softmax(logits[r, order], -1))


def test_biased_router_with_zero_bias_is_top_k_router_and_the_bias_gets_no_gradient():
    torch.manual_seed(3)
    logits = torch.randn(4, 7, 6, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    gates, experts = ref.biased_top_k_router(logits, bias, 2)
    want_gates, want_experts = ref.top_k_router(logits, 2)
    assert torch.equal(experts, want_experts) and torch.equal(gates, want_gates)
    bias.data += torch.tensor([0.0, 5.0, 0.0, 0.0, 0.0, -5.0], dtype=torch.float64)
    gates, experts = ref.biased_top_k_router(logits, bias, 2)
    assert (experts[..., 0] == 1).all() and not (experts == 5).any()
    assert torch.autograd.grad(gates.pow(3).sum(), bias, allow_unused=True)[0] is None


@given(lead=st.lists(st.integers(1, 5), min_size=1, max_size=2), n_experts=st.integers(1, 9), data=st.data(),
       dtype=dtypes, gamma=st.sampled_from([1e-3, 0.01, 0.5]))
def test_update_bias_is_the_sign_rule(lead, n_experts, data, dtype, gamma):
    k = data.draw(st.integers(1, n_experts))
    experts = torch.stack([torch.randperm(n_experts)[:k] for _ in range(math.prod(lead))]).reshape(*lead, k)
    bias = torch.randn(n_experts, dtype=dtype).requires_grad_(True)
    before = bias.detach().clone()
    new = ref.update_bias(bias, experts, gamma)
    assert new.dtype == dtype and not new.requires_grad and torch.equal(bias.detach(), before)
    load = [int((experts == e).sum()) for e in range(n_experts)]
    mean = experts.numel() / n_experts
    want = [b + gamma * ((l < mean) - (l > mean)) for b, l in zip(before.tolist(), load)]
    torch.testing.assert_close(new, torch.tensor(want, dtype=dtype))


def _dense_deepseek(layer, x):
    tokens = x.reshape(-1, x.shape[-1])
    gates, experts = ref.biased_top_k_router(layer.router(tokens), layer.bias, layer.k)
    y = sum((s(tokens) for s in layer.shared), torch.zeros_like(tokens))
    for e, expert in enumerate(layer.experts):
        y = y + (gates * (experts == e)).sum(-1, keepdim=True) * expert(tokens)
    return y.reshape(x.shape)


@given(shape=st.sampled_from([(5,), (3, 5), (2, 4, 5)]), n_experts=st.integers(1, 8), n_shared=st.integers(0, 2),
       data=st.data(), dtype=dtypes, seed=st.integers(0, 2**16))
def test_deepseek_moe_matches_the_dense_loop(shape, n_experts, n_shared, data, dtype, seed):
    k = data.draw(st.integers(1, n_experts))
    torch.manual_seed(seed)
    layer = ref.DeepSeekMoE(5, 7, n_experts, k, n_shared).to(dtype)
    layer.bias.copy_(torch.randn(n_experts, dtype=dtype) * 2)
    x = torch.randn(shape, dtype=dtype)
    with torch.no_grad():
        y, logits = layer(x)
        torch.testing.assert_close(y, _dense_deepseek(layer, x))
        torch.testing.assert_close(logits, layer.router(x))
    assert [n for n, _ in layer.named_buffers()] == ["bias"]
    assert "bias" not in dict(layer.named_parameters())


def test_deepseek_moe_without_shared_experts_and_bias_is_the_moe_layer():
    torch.manual_seed(4)
    plain = ref.MoE(6, 8, 5, 2).double()
    layer = ref.DeepSeekMoE(6, 8, 5, 2, n_shared=0).double()
    layer.load_state_dict({**plain.state_dict(), "bias": torch.zeros(5, dtype=torch.float64)})
    x = torch.randn(3, 4, 6, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x)[0], plain(x)[0], rtol=1e-14, atol=1e-14)


def test_visible_check_names_a_bias_update_that_keeps_autograd_history():
    """Not in the zoo: the server receives numbers only, so no hidden test can see requires_grad on the result."""
    from attncourse.checks import CheckFailed
    from attncourse.checks.ch08 import check_update_bias

    def attached(bias, experts, gamma):
        load = torch.bincount(experts.reshape(-1), minlength=bias.shape[-1]).to(bias.dtype)
        return bias + gamma * torch.sign(experts.numel() / bias.shape[-1] - load)
    with pytest.raises(CheckFailed, match="autograd history"):
        check_update_bias(attached)
    check_update_bias(ref.update_bias)
