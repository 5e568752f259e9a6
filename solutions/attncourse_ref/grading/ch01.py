"""Hidden tests for chapter 01: additive attention with padding, an attention-decoder step, greedy decoding."""
import numpy as np
import torch

from attncourse.layers import decoder_step

from .. import seq2seq as ref
from . import fixed, hidden_test, layer_case, module_case

DTYPES = [torch.float32, torch.float64]


def _tensor(rng, shape, dtype, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape) * scale).to(dtype)


def padding_mask(rng, batch, length, full_row=True):
    """[B, S] bool, True at real positions: each row a prefix of random length >= 1 (one row full)."""
    lengths = rng.integers(1, length + 1, size=batch)
    if full_row:
        lengths[int(rng.integers(batch))] = length
    return torch.arange(length)[None, :] < torch.from_numpy(lengths)[:, None]


def _garbage_padding(keys, mask, rng):
    """Padded positions hold large junk, as real padded encoder states may: ignoring the mask shows."""
    junk = torch.from_numpy(rng.standard_normal(tuple(keys.shape)) * 10).to(keys.dtype)
    return torch.where(mask.unsqueeze(-1), keys, junk)


def _attention_cases(rng, masked):
    cases = []
    for i in range(8):
        init = {"query_dim": int(rng.integers(1, 9)), "key_dim": int(rng.integers(1, 9)),
                "attn_dim": int(rng.integers(1, 9))}
        dtype = DTYPES[i % 2]
        module = ref.AdditiveAttention(**init).to(dtype)
        with torch.no_grad():                      # bigger weights than the default init: sharper weights
            for p in module.parameters():
                p.mul_(3.0)
        b, s = int(rng.integers(2, 6)), int(rng.integers(2, 9))
        query, keys = _tensor(rng, (b, init["query_dim"]), dtype), _tensor(rng, (b, s, init["key_dim"]), dtype)
        if masked:
            mask = padding_mask(rng, b, s)
            if i % 4 == 3:                         # not only prefixes: any positions may be hidden
                mask = torch.from_numpy(rng.random((b, s)) < 0.6) | torch.nn.functional.one_hot(
                    torch.from_numpy(rng.integers(s, size=b)), s).bool()
            cases.append(module_case(module, init, [query, _garbage_padding(keys, mask, rng)], {"mask": mask}))
        else:
            cases.append(module_case(module, init, [query, keys]))
    return cases


@hidden_test("ch01.attention_unmasked")
def attention_unmasked(rng):
    return _attention_cases(rng, masked=False)


@hidden_test("ch01.attention_masked")
def attention_masked(rng):
    return _attention_cases(rng, masked=True)


@hidden_test("ch01.decoder_step")
def decoder_step_cases(rng):
    cases = []
    for i in range(8):
        init = {"vocab_size": int(rng.integers(3, 12)), "emb_dim": int(rng.integers(1, 7)),
                "enc_dim": int(rng.integers(1, 7)), "hidden_dim": int(rng.integers(1, 7)),
                "attn_dim": int(rng.integers(1, 7))}
        dtype = DTYPES[i % 2]
        module = ref.AttentionDecoder(**init).to(dtype)
        with torch.no_grad():
            for p in module.attention.parameters():
                p.mul_(3.0)
        b, s = int(rng.integers(1, 5)), int(rng.integers(2, 8))
        y_prev = torch.from_numpy(rng.integers(init["vocab_size"], size=b))
        state = _tensor(rng, (b, init["hidden_dim"]), dtype)
        mask = padding_mask(rng, b, s)
        enc = _garbage_padding(_tensor(rng, (b, s, init["enc_dim"]), dtype), mask, rng)
        kwargs = {"mask": mask} if i != 0 else {}
        cases.append(module_case(module, init, [y_prev, state, enc], kwargs))
    return cases


def greedy_problem(rng, batch, dtype, vocab=6, hidden=5, length=6, max_len=8, eos=2):
    """A fixed decoder step (attncourse.layers.decoder_step) and its inputs."""
    weight = _tensor(rng, (vocab, hidden), dtype, 1.5)
    state = _tensor(rng, (batch, hidden), dtype)
    mask = padding_mask(rng, batch, length)
    enc = _tensor(rng, (batch, length, hidden), dtype)
    return weight, [state, enc, mask, 1, eos, max_len]


def _greedy_path(weight, args):
    """The greedy tokens without any EOS (id -1): rows are independent and the greedy path does
    not depend on which id is EOS, so this tells where any choice of EOS would stop each row."""
    return ref.greedy_decode(decoder_step(weight), *args[:4], -1, args[5])


def _first_occurrences(path, token):
    """Per row of ``path``: the first step emitting ``token`` (None if never)."""
    return [int((row == token).nonzero()[0]) if (row == token).any() else None for row in path]


def _classify(stops, max_len, single):
    if any(s == 0 for s in stops):
        return None
    if single:
        return "max_len" if stops[0] is None else "early" if stops[0] < max_len - 1 else None
    if len(set(stops)) < 2:
        return None
    if None in stops:
        return "some_never" if any(s is not None for s in stops) else None
    return "all_early" if max(stops) < max_len - 1 else None


def _greedy_cases(rng, single):
    cases, tries = [], 0
    wanted = ["early", "max_len"] * 3 if single else ["all_early", "some_never", "all_early", "some_never", "all_early"]
    while wanted and tries < 500:
        tries += 1
        dtype = DTYPES[len(cases) % 2]
        batch = 1 if single else int(rng.integers(2, 6))
        max_len = int(rng.integers(5, 16))
        vocab = int(rng.integers(4, 8))
        weight, args = greedy_problem(rng, batch, dtype, vocab=vocab, max_len=max_len)
        path = _greedy_path(weight, args)
        for eos in rng.permutation(vocab):
            if eos in (0, args[3]):                           # EOS is neither PAD (0) nor BOS
                continue
            kind = _classify(_first_occurrences(path, int(eos)), max_len, single)
            if kind in wanted:
                break
        else:
            continue
        wanted.remove(kind)
        args[4] = int(eos)
        if len(cases) == 2 and not single:
            args = args + [int(rng.integers(3, 6))]           # an explicit pad id
        cases.append(layer_case(ref.greedy_decode, "decoder_step", weight, args,
                                describe=f"(a fixed decoder step, batch of {batch}, max_len={max_len}, "
                                         f"eos={args[4]}: {kind.replace('_', ' ')})"))
    assert not wanted, f"could not build greedy cases {wanted}"
    return cases


@hidden_test("ch01.greedy_decode")
def greedy_single(rng):
    return _greedy_cases(rng, single=True)


@hidden_test("ch01.greedy_batched")
def greedy_batched(rng):
    return _greedy_cases(rng, single=False)


def check_data():
    """Fixed inputs and expected values for the visible checks (tools/make_check_data.py writes them)."""
    torch.manual_seed(0)
    att = ref.AdditiveAttention(3, 4, 5).double()
    with torch.no_grad():
        for p in att.parameters():
            p.mul_(3.0)
    query, keys = fixed((2, 3), 20), fixed((2, 4, 4), 21)
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    junk_keys = torch.where(mask.unsqueeze(-1), keys, 10 * fixed((2, 4, 4), 22))
    ctx, w = att(query, keys)
    no_tanh = torch.softmax(att.v(att.W_q(query).unsqueeze(-2) + att.W_k(keys)).squeeze(-1), dim=-1)
    mctx, mw = att(query, junk_keys, mask)
    attention = {"init": {"query_dim": 3, "key_dim": 4, "attn_dim": 5}, "state": dict(att.state_dict()),
                 "query": query, "keys": keys, "context": ctx, "weights": w, "no_tanh_weights": no_tanh,
                 "mask": mask, "junk_keys": junk_keys, "masked_context": mctx, "masked_weights": mw,
                 "unmasked_junk_weights": att(query, junk_keys)[1]}

    torch.manual_seed(1)
    init = {"vocab_size": 7, "emb_dim": 4, "enc_dim": 4, "hidden_dim": 4, "attn_dim": 3}
    dec = ref.AttentionDecoder(**init).double()
    y_prev = torch.tensor([1, 5])
    state, enc = fixed((2, 4), 23), torch.where(mask.unsqueeze(-1), fixed((2, 4, 4), 24), 10 * fixed((2, 4, 4), 25))
    new_state, logits, weights = dec(y_prev, state, enc, mask)
    emb = dec.embedding(y_prev)
    c_prev = dec.attention(state, enc, mask)[0]
    swapped_state = dec.gru(torch.cat([c_prev, emb], -1), state)
    decoder = {"init": init, "state": dict(dec.state_dict()), "y_prev": y_prev, "s": state, "enc": enc,
               "mask": mask, "new_state": new_state, "logits": logits, "weights": weights,
               "swapped_gru_input_state": swapped_state, "unmasked_new_state": dec(y_prev, state, enc)[0],
               "new_state_query_weights": dec.attention(new_state, enc, mask)[1]}

    rng = np.random.default_rng(7)
    greedy = {}
    for name, batch in [("single", 1), ("batched", 4)]:
        found = False
        while not found:
            weight, args = greedy_problem(rng, batch, torch.float64, max_len=10)
            path = _greedy_path(weight, args)
            for eos in range(2, 6):
                stops = _first_occurrences(path, eos)
                if batch == 1:
                    found = stops[0] is not None and 2 <= stops[0] < 7 and len(set(path[0, :stops[0]].tolist())) > 1 \
                        and int(path[0, 0]) != args[3]
                else:
                    found = None not in stops and len(set(stops)) >= 3 and min(stops) >= 1 and max(stops) < 9
                if found:
                    args[4] = eos
                    break
        state_, enc_, mask_, bos, eos, max_len = args
        greedy[name] = {"weight": weight, "state": state_, "enc": enc_, "mask": mask_, "bos": bos, "eos": eos,
                        "max_len": max_len, "tokens": ref.greedy_decode(decoder_step(weight), *args),
                        "stops": stops}
    return {"attention": attention, "decoder": decoder, "greedy": greedy}
