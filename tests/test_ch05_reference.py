"""The chapter 05 reference against PyTorch's own layers (LayerNorm, TransformerEncoderLayer,
TransformerDecoderLayer and their stacks), and its properties: padding, causality, teacher forcing."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attncourse.layers import prefix_decoder, score_table
from attncourse_ref import transformer as ref

DTYPES = st.sampled_from([torch.float32, torch.float64])


def _tol(dtype):
    return {"rtol": 1e-5, "atol": 2e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-10}


def _randomize(module, seed):
    """PyTorch initialises norms to (1, 0) and attention biases to 0: draw them at random."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    return module


def _key_mask(b, n, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, n + 1, (b,), generator=g)
    lengths[0] = n
    return torch.arange(n)[None, :] < lengths[:, None]


@given(lead=st.lists(st.integers(1, 3), max_size=2), d=st.integers(2, 9), eps=st.sampled_from([1e-5, 1e-3, 0.1]),
       scale=st.sampled_from([0.01, 1.0, 10.0]), dtype=DTYPES, seed=st.integers(0, 2**16))
def test_layer_norm_matches_torch_with_gradients(lead, d, eps, scale, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    theirs = nn.LayerNorm(d, eps=eps, dtype=dtype)
    with torch.no_grad():
        theirs.weight.normal_(generator=g)
        theirs.bias.normal_(generator=g)
    ours = ref.LayerNorm(d, eps).to(dtype)
    ours.load_state_dict(theirs.state_dict())
    x = (torch.randn(*lead, 4, d, generator=g, dtype=dtype) * scale).requires_grad_()
    cot = torch.randn(*lead, 4, d, generator=g, dtype=dtype)
    y_ours, y_theirs = ours(x), theirs(x)
    assert y_ours.dtype == dtype
    torch.testing.assert_close(y_ours, y_theirs, **_tol(dtype))
    mine = torch.autograd.grad((y_ours * cot).sum(), [x, ours.weight, ours.bias])
    expected = torch.autograd.grad((y_theirs * cot).sum(), [x, theirs.weight, theirs.bias])
    for a, b in zip(mine, expected):
        torch.testing.assert_close(a, b, rtol=1e-4 if dtype == torch.float32 else 1e-9,
                                   atol=1e-4 if dtype == torch.float32 else 1e-9)


def test_layer_norm_parameters_are_named_like_torch():
    ln = ref.LayerNorm(6)
    assert {k: tuple(v.shape) for k, v in ln.state_dict().items()} == {"weight": (6,), "bias": (6,)}
    assert (ln.weight == 1).all() and (ln.bias == 0).all() and ln.eps == 1e-5


def test_layer_norm_output_has_zero_mean_unit_variance():
    x = torch.randn(3, 7, 32, dtype=torch.float64) * 5 + 2
    y = ref.LayerNorm(32, eps=0.0).double()(x)
    torch.testing.assert_close(y.mean(-1), torch.zeros(3, 7, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(y.var(-1, correction=0), torch.ones(3, 7, dtype=torch.float64), atol=1e-10, rtol=0)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward_is_torchs_mlp(activation):
    torch.manual_seed(0)
    ff = ref.FeedForward(8, activation=activation).double().eval()
    assert ff.linear1.weight.shape == (32, 8) and ff.linear2.weight.shape == (8, 32)   # 4D by default
    mlp = nn.Sequential(nn.Linear(8, 32), nn.ReLU() if activation == "relu" else nn.GELU(), nn.Linear(32, 8)).double()
    mlp.load_state_dict({"0.weight": ff.linear1.weight, "0.bias": ff.linear1.bias,
                         "2.weight": ff.linear2.weight, "2.bias": ff.linear2.bias})
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(ff(x), mlp(x))


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_encoder_block_matches_torch(norm_first, activation, dtype):
    torch.manual_seed(1)
    theirs = _randomize(nn.TransformerEncoderLayer(12, 3, 20, 0.1, activation, batch_first=True,
                                                   norm_first=norm_first, dtype=dtype), 1).eval()
    ours = ref.EncoderBlock(12, 3, 20, 0.1, activation, norm_first).to(dtype).eval()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 6, 12, dtype=dtype).requires_grad_()     # autograd on: torch's slow, exact path
    mask = _key_mask(3, 6, 1)
    torch.testing.assert_close(ours(x, mask), theirs(x, src_key_padding_mask=~mask), **_tol(dtype))
    torch.testing.assert_close(ours(x), theirs(x), **_tol(dtype))


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decoder_block_matches_torch(norm_first, dtype):
    torch.manual_seed(2)
    theirs = _randomize(nn.TransformerDecoderLayer(8, 2, 16, 0.1, "relu", batch_first=True,
                                                   norm_first=norm_first, dtype=dtype), 2).eval()
    ours = ref.DecoderBlock(8, 2, 16, 0.1, "relu", norm_first).to(dtype).eval()
    ours.load_state_dict(theirs.state_dict())
    x, memory = torch.randn(2, 5, 8, dtype=dtype), torch.randn(2, 7, 8, dtype=dtype)
    mask = _key_mask(2, 7, 2)
    causal = nn.Transformer.generate_square_subsequent_mask(5, dtype=dtype)
    expected = theirs(x, memory, tgt_mask=causal, memory_key_padding_mask=~mask)
    torch.testing.assert_close(ours(x, memory, mask), expected, **_tol(dtype))


def _embedded(stack, ids):
    pos = stack.pos_embedding(torch.arange(ids.shape[1]))
    return stack.embedding(ids) * math.sqrt(stack.d_model) + pos


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_is_torchs_encoder_stack(norm_first):
    torch.manual_seed(3)
    ours = _randomize(ref.Encoder(11, 8, 2, 3, 16, 0.1, 20, norm_first).double(), 3).eval()
    layer = nn.TransformerEncoderLayer(8, 2, 16, 0.1, batch_first=True, norm_first=norm_first, dtype=torch.float64)
    theirs = nn.TransformerEncoder(layer, 3, norm=nn.LayerNorm(8, dtype=torch.float64) if norm_first else None,
                                   enable_nested_tensor=False).eval()
    theirs.layers.load_state_dict(ours.layers.state_dict())
    if norm_first:
        theirs.norm.load_state_dict(ours.norm.state_dict())
    src = torch.randint(1, 11, (3, 9))
    mask = _key_mask(3, 9, 3)
    src = src.masked_fill(~mask, 0)
    x = _embedded(ours, src).requires_grad_()
    torch.testing.assert_close(ours(src, mask), theirs(x, src_key_padding_mask=~mask), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("norm_first, tie", [(False, False), (True, True)])
def test_decoder_is_torchs_decoder_stack_and_a_projection(norm_first, tie):
    torch.manual_seed(4)
    ours = _randomize(ref.Decoder(13, 8, 2, 2, 16, 0.1, 20, norm_first, tie_embeddings=tie).double(), 4).eval()
    assert (ours.out.weight is ours.embedding.weight) == tie
    layer = nn.TransformerDecoderLayer(8, 2, 16, 0.1, batch_first=True, norm_first=norm_first, dtype=torch.float64)
    theirs = nn.TransformerDecoder(layer, 2, norm=nn.LayerNorm(8, dtype=torch.float64) if norm_first else None).eval()
    theirs.layers.load_state_dict(ours.layers.state_dict())
    if norm_first:
        theirs.norm.load_state_dict(ours.norm.state_dict())
    tgt, memory = torch.randint(0, 13, (2, 6)), torch.randn(2, 4, 8, dtype=torch.float64)
    mask = _key_mask(2, 4, 4)
    causal = nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.float64)
    hidden = theirs(_embedded(ours, tgt), memory, tgt_mask=causal, memory_key_padding_mask=~mask)
    torch.testing.assert_close(ours(tgt, memory, mask), F.linear(hidden, ours.out.weight, ours.out.bias),
                               rtol=1e-10, atol=1e-10)


def test_embeddings_enter_at_unit_scale():
    enc = ref.Encoder(50, 64, 4, 1)
    scaled = enc.embedding.weight * math.sqrt(64)
    assert 0.8 < scaled.std().item() < 1.2


@given(seed=st.integers(0, 2**16), norm_first=st.booleans())
def test_encoder_ignores_what_padding_holds(seed, norm_first):
    torch.manual_seed(seed)
    enc = ref.Encoder(10, 8, 2, 2, 16, 0.0, 12, norm_first).double().eval()
    mask = _key_mask(3, 7, seed)
    a = torch.randint(1, 10, (3, 7))
    b = torch.where(mask, a, torch.randint(1, 10, (3, 7)))
    with torch.no_grad():
        ya, yb = enc(a, mask), enc(b, mask)
    torch.testing.assert_close(ya[mask], yb[mask], rtol=1e-12, atol=1e-12)


@given(seed=st.integers(0, 2**16), t=st.integers(1, 6))
def test_decoder_position_t_never_sees_later_tokens(seed, t):
    torch.manual_seed(seed)
    dec = ref.Decoder(10, 8, 2, 2, 16, 0.0, 12).double().eval()
    memory = torch.randn(2, 5, 8, dtype=torch.float64)
    a = torch.randint(0, 10, (2, 7))
    b = a.clone()
    b[:, t:] = torch.randint(0, 10, (2, 7 - t))
    with torch.no_grad():
        torch.testing.assert_close(dec(a, memory)[:, :t], dec(b, memory)[:, :t], rtol=1e-12, atol=1e-12)


def test_shift_right_and_the_dates_convention():
    from attncourse import dates
    batch = dates.encode_batch([("21 Nov 2026", "2026-11-21"), ("1.2.2003", "2003-02-01")])
    assert torch.equal(ref.shift_right(batch.tgt_out, dates.BOS), batch.tgt_in)
    assert torch.equal(ref.shift_right(torch.tensor([[5, 6, 7]]), 1), torch.tensor([[1, 5, 6]]))


@given(seed=st.integers(0, 2**16), pad=st.sampled_from([0, 3]))
def test_sequence_loss_is_the_mean_over_real_tokens(seed, pad):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 5, 6, generator=g, dtype=torch.float64)
    target = torch.randint(0, 6, (3, 5), generator=g)
    target[0, 3:] = pad
    real = target != pad
    expected = sum(-torch.log_softmax(logits[i, j], -1)[target[i, j]] for i, j in real.nonzero()) / real.sum()
    torch.testing.assert_close(ref.sequence_loss(logits, target, pad), expected)


@given(seed=st.integers(0, 2**16), b=st.integers(1, 4), t=st.integers(1, 6), v=st.integers(2, 9),
       smoothing=st.sampled_from([0.0, 0.05, 0.1, 0.3, 1.0]), pad=st.sampled_from([0, 1]), dtype=DTYPES)
def test_label_smoothed_loss_is_torchs_label_smoothing_with_gradients(seed, b, t, v, smoothing, pad, dtype):
    """Value and gradient of F.cross_entropy(..., ignore_index=pad, label_smoothing=smoothing)."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, t, v, generator=g, dtype=dtype) * 3).requires_grad_()
    target = torch.randint(0, v, (b, t), generator=g)
    target[0, 0] = (pad + 1) % v                                  # at least one real token
    target[-1, t // 2 + 1:] = pad                                 # and padding (when t > 1)
    ours = ref.label_smoothed_loss(logits, target, smoothing, pad)
    theirs = F.cross_entropy(logits.flatten(0, -2), target.flatten(), ignore_index=pad, label_smoothing=smoothing)
    assert ours.dtype == dtype and ours.shape == ()
    torch.testing.assert_close(ours, theirs, **_tol(dtype))
    torch.testing.assert_close(torch.autograd.grad(ours, logits)[0], torch.autograd.grad(theirs, logits)[0],
                               **_tol(dtype))


def test_label_smoothed_loss_is_the_cross_entropy_with_the_smoothed_distribution():
    """-sum_k q_k log p_k with q = (1 - eps) onehot + eps / V, by hand; eps = 0 is sequence_loss."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    target = torch.tensor([[3, 1, 4, 0], [2, 0, 0, 0]])
    q = 0.8 * F.one_hot(target, 5).double() + 0.2 / 5
    per_token = -(q * torch.log_softmax(logits, -1)).sum(-1)
    real = target != 0
    torch.testing.assert_close(ref.label_smoothed_loss(logits, target, 0.2), per_token[real].sum() / 4)
    torch.testing.assert_close(ref.label_smoothed_loss(logits, target, 0.0), ref.sequence_loss(logits, target))


def test_label_smoothing_makes_the_best_logits_finite():
    """The smoothed loss has a finite minimiser: logit gap log((1 - eps + eps / V) / (eps / V)) to every other class."""
    eps, v = 0.1, 4
    gap = math.log((1 - eps + eps / v) / (eps / v))
    best = torch.tensor([[[gap, 0.0, 0.0, 0.0]]], dtype=torch.float64, requires_grad=True)
    loss = ref.label_smoothed_loss(best, torch.tensor([[0]]), eps, pad=-1)
    assert torch.autograd.grad(loss, best)[0].abs().max() < 1e-12
    wider = ref.label_smoothed_loss(torch.tensor([[[gap + 1, 0.0, 0.0, 0.0]]], dtype=torch.float64),
                                    torch.tensor([[0]]), eps, pad=-1)
    assert wider > loss


@given(seed=st.integers(0, 2**16), batch=st.integers(1, 5), eos=st.integers(2, 6))
def test_greedy_decode_matches_decoding_each_row_alone(seed, batch, eos):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(7, 5, generator=g, dtype=torch.float64) * 1.5
    memory = torch.randn(batch, 4, 5, generator=g, dtype=torch.float64)
    mask = _key_mask(batch, 4, seed)
    decode = prefix_decoder(weight)
    out = ref.greedy_decode(decode, memory, mask, 1, eos, 9)
    rows = []
    for i in range(batch):                      # one sequence at a time, no batching, no padding logic
        prefix = [1]
        while len(prefix) <= 9 and (len(prefix) == 1 or prefix[-1] != eos):
            prefix.append(int(decode(torch.tensor([prefix]), memory[i:i + 1], mask[i:i + 1])[0, -1].argmax()))
        rows.append(prefix[1:])
    width = max(len(r) for r in rows)
    assert out.dtype == torch.long and out.shape == (batch, width)
    for i, r in enumerate(rows):
        assert out[i].tolist() == r + [0] * (width - len(r))


# ---- beam search ------------------------------------------------------------------------------------------------
def _simple_beam(decode, memory, mask, bos, eos, max_len, beam_size, alpha):
    """Beam search for one sequence, written as plainly as possible: lists, Python's stable sort, no early stop."""
    alive, finished = [([], 0.0)], []
    for t in range(1, max_len + 1):
        candidates = []
        for tokens, logp in alive:
            logits = decode(torch.tensor([[bos] + tokens]), memory, mask)[0, -1]
            for v, lp in enumerate(F.log_softmax(logits, dim=-1)):
                candidates.append((tokens + [v], logp + lp))
        candidates = sorted(candidates, key=lambda c: -float(c[1]))[:beam_size]   # stable: ties keep their order
        alive = []
        for tokens, logp in candidates:
            if tokens[-1] == eos or t == max_len:
                finished.append((logp / ((5 + t) / 6) ** alpha, tokens))
            else:
                alive.append((tokens, logp))
        if not alive:
            break
    best = finished[0]
    for f in finished[1:]:
        if f[0] > best[0]:                       # of equal scores, the one finished first
            best = f
    return best


def _brute_force(decode, memory, mask, bos, eos, max_len, vocab, alpha):
    """Every hypothesis up to max_len tokens (eos only last; at max_len any last token), scored; the best."""
    best = None
    frontier = [([], torch.zeros((), dtype=memory.dtype))]
    for t in range(1, max_len + 1):
        grown = []
        for tokens, logp in frontier:
            lps = F.log_softmax(decode(torch.tensor([[bos] + tokens]), memory, mask)[0, -1], dim=-1)
            for v in range(vocab):
                y, lp = tokens + [v], logp + lps[v]
                if v == eos or t == max_len:
                    score = lp / ((5 + t) / 6) ** alpha
                    if best is None or score > best[0]:
                        best = (score, y)
                else:
                    grown.append((y, lp))
        frontier = grown
    return best


def _table_problem(seed, batch, vocab, max_len, dtype=torch.float64, ties=False):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(max_len, vocab, vocab, generator=g, dtype=dtype) * 1.5
    memory = torch.randn(batch, max_len, vocab, generator=g, dtype=dtype)
    if ties:                                     # coarse values: many exactly equal logits in a row
        table, memory = (table * 2).round() / 2, (memory * 2).round() / 2
    return score_table(table), memory


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_beam_search_with_a_full_beam_is_exhaustive_search(seed, alpha):
    vocab, max_len, eos = 3, 4, 2
    decode, memory = _table_problem(seed, 2, vocab, max_len)
    memory[:, :, eos] += torch.tensor([-1.0, 1.0])[:, None]          # one row stops early, one late
    tokens, scores = ref.beam_search(decode, memory, None, 1, eos, max_len, vocab ** max_len, alpha)
    for i in range(2):
        score, y = _brute_force(decode, memory[i:i + 1], None, 1, eos, max_len, vocab, alpha)
        assert tokens[i].tolist() == y + [0] * (tokens.shape[1] - len(y))
        torch.testing.assert_close(scores[i], score, rtol=1e-12, atol=1e-12)


@given(seed=st.integers(0, 2**16), batch=st.integers(1, 4), beam=st.sampled_from([1, 2, 3, 5]),
       alpha=st.sampled_from([0.0, 0.6, 1.0]), ties=st.booleans(), dtype=DTYPES)
def test_beam_search_matches_a_plain_implementation(seed, batch, beam, alpha, ties, dtype):
    vocab, max_len, eos, pad = 5, 6, 3, 4
    decode, memory = _table_problem(seed, batch, vocab, max_len, dtype, ties)
    lengths = torch.randint(1, max_len + 1, (batch,), generator=torch.Generator().manual_seed(seed))
    mask = torch.arange(max_len)[None, :] < lengths[:, None]             # score_table drops the bias where False
    tokens, scores = ref.beam_search(decode, memory, mask, 1, eos, max_len, beam, alpha, pad=pad)
    assert tokens.dtype == torch.long and scores.dtype == dtype and scores.shape == (batch,)
    width = 0
    for i in range(batch):
        score, y = _simple_beam(decode, memory[i:i + 1], mask[i:i + 1], 1, eos, max_len, beam, alpha)
        assert tokens[i].tolist() == y + [pad] * (tokens.shape[1] - len(y))
        assert float(scores[i]) == pytest.approx(float(score), rel=1e-6 if dtype == torch.float32 else 1e-12)
        width = max(width, len(y))
    assert tokens.shape[1] == width


@settings(max_examples=15)
@given(seed=st.integers(0, 2**16), batch=st.integers(1, 5), eos=st.integers(2, 6),
       alpha=st.sampled_from([0.0, 0.6, 1.0]))
def test_beam_search_of_width_one_is_greedy_decoding(seed, batch, eos, alpha):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(7, 5, generator=g, dtype=torch.float64) * 1.5
    memory = torch.randn(batch, 4, 5, generator=g, dtype=torch.float64)
    mask = _key_mask(batch, 4, seed)
    decode = prefix_decoder(weight)
    tokens, _ = ref.beam_search(decode, memory, mask, 1, eos, 9, 1, alpha)
    assert torch.equal(tokens, ref.greedy_decode(decode, memory, mask, 1, eos, 9))


def test_beam_search_breaks_ties_by_beam_then_token():
    """Four candidates tie at step 2; of width 2, ranking by hypothesis then token keeps 0-1 and 0-2, whose eos
    is the better; ranking by token then hypothesis would keep 0-1 and 1-1."""
    table = torch.zeros(3, 5, 5, dtype=torch.float64)       # eos = 3, bos = 4
    table[0, 4] = torch.tensor([2.0, 2.0, 0, 0, 0])           # tokens 0 and 1 tie
    table[1, 0] = table[1, 1] = torch.tensor([0, 3.0, 3.0, 0, 0])
    table[2, 1, 3], table[2, 2, 3] = 1.0, 4.0
    decode, memory = score_table(table), torch.zeros(1, 3, 5, dtype=torch.float64)
    tokens, _ = ref.beam_search(decode, memory, None, 4, 3, 3, 2)
    assert tokens.tolist() == [[0, 2, 3]]
