"""Unit tests of the chapter 01 reference (additive attention, decoder step, greedy decoding) and the date task."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attncourse import dates
from attncourse.layers import decoder_step
from attncourse_ref import seq2seq as ref


@given(b=st.integers(1, 4), s=st.integers(1, 7), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=40, deadline=None)
def test_additive_attention_formula_and_padding(b, s, seed):
    torch.manual_seed(seed)
    att = ref.AdditiveAttention(3, 5, 4).double()
    q, k = torch.randn(b, 3, dtype=torch.float64), torch.randn(b, s, 5, dtype=torch.float64)
    lengths = torch.randint(1, s + 1, (b,))
    mask = torch.arange(s)[None] < lengths[:, None]
    ctx, w = att(q, k, mask)
    for i in range(b):
        n = int(lengths[i])
        e = att.v(torch.tanh(att.W_q(q[i]) + att.W_k(k[i, :n]))).squeeze(-1)
        a = torch.softmax(e, -1)
        torch.testing.assert_close(w[i, :n], a)
        assert (w[i, n:] == 0).all()
        torch.testing.assert_close(ctx[i], a @ k[i, :n])
    # Padded keys do not matter at all.
    k2 = torch.where(mask[..., None], k, 1e3 * torch.randn_like(k))
    torch.testing.assert_close(att(q, k2, mask)[0], ctx)


def test_decoder_step_equations():
    torch.manual_seed(0)
    dec = ref.AttentionDecoder(9, 4, 6, 5, 3).double()
    y, s, enc = torch.tensor([1, 7]), torch.randn(2, 5, dtype=torch.float64), torch.randn(2, 4, 6, dtype=torch.float64)
    mask = torch.tensor([[True, True, False, False], [True] * 4])
    new, logits, w = dec(y, s, enc, mask)
    c, w2 = dec.attention(s, enc, mask)
    torch.testing.assert_close(w, w2)
    torch.testing.assert_close(new, dec.gru(torch.cat([dec.embedding(y), c], -1), s))
    torch.testing.assert_close(logits, dec.out(torch.cat([new, c], -1)))


def test_greedy_decode_matches_one_at_a_time():
    torch.manual_seed(3)
    weight = torch.randn(6, 5, dtype=torch.float64) * 1.5
    step = decoder_step(weight)
    state, enc = torch.randn(5, 5, dtype=torch.float64), torch.randn(5, 4, 5, dtype=torch.float64)
    mask = torch.ones(5, 4, dtype=torch.bool)
    out = ref.greedy_decode(step, state, enc, mask, bos=1, eos=2, max_len=12)
    for i in range(5):
        one = ref.greedy_decode(step, state[i:i + 1], enc[i:i + 1], mask[i:i + 1], 1, 2, 12)[0]
        row = out[i]
        assert torch.equal(row[: len(one)], one)
        assert (row[len(one):] == 0).all()
    ends = [(r == 2).nonzero()[0].item() if (r == 2).any() else None for r in out]
    assert out.shape[1] == 12 or (None not in ends and out.shape[1] == max(ends) + 1)


def test_dates_deterministic_and_disjoint():
    a, b = dates.split(500, 100, seed=5), dates.split(500, 100, seed=5)
    assert a == b
    train, test = a
    assert not {t for _, t in train} & {t for _, t in test}
    for src, tgt in train[:200]:
        assert dates.VOCAB.decode(dates.VOCAB.encode(tgt)) == tgt and len(tgt) == 10
    batch = dates.encode_batch(train[:7])
    assert batch.src_mask.sum(1).tolist() == [len(s) for s, _ in train[:7]]
    assert (batch.tgt_in[:, 0] == dates.BOS).all() and (batch.tgt_out[:, -1] == dates.EOS).all()
    assert dates.FORMATS["21 Nov 2026"](__import__("datetime").date(2026, 11, 21)) == "21 Nov 2026"
