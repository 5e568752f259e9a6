"""Hidden tests for chapter 05: LayerNorm, the feed-forward network, encoder and decoder blocks (against
torch.nn.TransformerEncoderLayer / TransformerDecoderLayer weights), the encoder and decoder stacks,
teacher forcing, the label-smoothed loss, greedy decoding and beam search."""
import copy

import numpy as np
import torch
from torch import nn

from attncourse.checks.ch05 import (LABEL_SMOOTHING_ALLOWED, LABEL_SMOOTHING_BUILTINS, LAYER_NORM_ALLOWED,
                                     LAYER_NORM_BUILTINS, TRANSFORMER_BUILTINS)
from attncourse.layers import prefix_decoder, score_table

from .. import transformer as ref
from . import fixed, function_case, hidden_test, layer_case, module_case, module_grad_case
from .ch01 import _classify, _first_occurrences, padding_mask

DTYPES = [torch.float32, torch.float64]
# Stacks of blocks in float32: a few more rounding steps than one layer.
STACK_TOL = {np.dtype("float32"): (2e-4, 2e-5)}


def _tensor(rng, shape, dtype, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape) * scale).to(dtype)


def _perturb(module, rng, scale=0.3):
    """Random norm weights and biases: PyTorch initialises them to 1 and 0, which would hide
    a LayerNorm that swaps or ignores them, and the attention biases start at 0 too."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(_tensor(rng, tuple(p.shape), p.dtype, scale))
    return module


def _padded_mask(rng, b, s):
    """[B, S] bool, True at real positions: each row a prefix of length >= 1, and (when S > 1) at least
    one row padded, so that a block that ignores or inverts its mask cannot pass by luck."""
    lengths = rng.integers(1, s + 1, size=b)
    if s > 1:
        lengths[int(rng.integers(b))] = int(rng.integers(1, s))
    return torch.arange(s)[None, :] < torch.from_numpy(lengths)[:, None]


# ---- LayerNorm ---------------------------------------------------------------------------------------
def _layer_norm_cases(rng, grad):
    cases = []
    # (leading shape, D, input scale, offset, eps): tiny variance makes eps matter; D = 1 has none at all;
    # a large offset with a small spread breaks E[x^2] - E[x]^2 in float32.
    settings = [((2, 3), 8, 1.0, 0.0, 1e-5), ((4,), 5, 0.01, 0.0, 1e-3), ((2, 2, 3), 16, 3.0, 1.0, 1e-5),
                ((3,), 2, 0.05, 0.0, 0.1), ((2, 4), 1, 1.0, 0.0, 1e-5), ((5,), 7, 0.1, 100.0, 1e-5),
                ((), 6, 1.0, 0.0, 1e-5), ((2, 3), 12, 0.02, -2.0, 1e-2)]
    for i, (lead, d, scale, offset, eps) in enumerate(settings):
        large_mean = offset == 100.0
        dtype = torch.float32 if large_mean else DTYPES[i % 2]
        if grad and (d == 1 or large_mean):
            continue                                      # no spread / a forward-pass precision test
        module = _perturb(ref.LayerNorm(d, eps).to(dtype), rng, scale=1.0)
        n = int(rng.integers(1, 6))
        x = _tensor(rng, lead + (n, d), dtype, scale) + offset
        init = {"normalized_shape": d, "eps": eps}
        # Around 100 in float32 the mean itself is rounded to ~1e-5: a looser tolerance for that case.
        tol = {np.dtype("float32"): (1e-3, 1e-3)} if large_mean else None
        if grad:
            cases.append(module_grad_case(module, init, [x], rng=rng))
        else:
            cases.append(module_case(module, init, [x], tol=tol))
    return cases


@hidden_test("ch05.layer_norm", forbid=LAYER_NORM_BUILTINS, allow=LAYER_NORM_ALLOWED)
def layer_norm(rng):
    return _layer_norm_cases(rng, grad=False)


@hidden_test("ch05.layer_norm_grad", forbid=LAYER_NORM_BUILTINS, allow=LAYER_NORM_ALLOWED)
def layer_norm_grad(rng):
    return _layer_norm_cases(rng, grad=True)


# ---- FeedForward ---------------------------------------------------------------------------------------
@hidden_test("ch05.feed_forward")
def feed_forward(rng):
    cases = []
    for i in range(8):
        d = int(rng.integers(1, 9))
        train = _training(i)
        init = {"d_model": d, "d_ff": None if i % 3 == 0 else int(rng.integers(1, 20)),
                "activation": "gelu" if i % 2 else "relu", "dropout": 0.5 if train else 0.1}
        dtype = DTYPES[(i // 2) % 2]
        module = ref.FeedForward(**init).to(dtype)
        x = _tensor(rng, [(), (2,), (2, 3)][i % 3] + (int(rng.integers(1, 6)), d), dtype, 2.0)
        cases.append(module_case(module, init, [x], train_seed=_train_seed(rng) if train else None,
                                 describe=_train_describe(module, init, x) if train else ""))
    return cases


def _training(i):
    """Five cases of eight run in training mode: dropout is active there and must be where PyTorch puts it."""
    return i % 8 in (1, 2, 4, 5, 7)


def _train_seed(rng):
    return int(rng.integers(2**31))


def _train_describe(module, init, *args):
    sizes = ", ".join(f"{k}={v}" for k, v in init.items())
    shapes = ", ".join(f"{list(a.shape)} {str(a.dtype)[6:]}" for a in args)
    return (f"{type(module).__name__}({sizes}) in training mode (dropout active, the same torch.manual_seed "
            f"before both calls) on ({shapes})")


# ---- encoder and decoder blocks --------------------------------------------------------------------------
def _block_setup(rng, i, norm_first):
    h = int(rng.integers(1, 4))
    d = h * int(rng.integers(2 if h == 1 else 1, 5))   # D = 1: a LayerNorm outputs its bias, whatever came in
    init = {"d_model": d, "n_heads": h, "d_ff": int(rng.integers(1, 4 * d + 1)), "dropout": 0.1,
            "activation": "gelu" if i % 3 == 2 else "relu", "norm_first": norm_first}
    return init, DTYPES[i % 2]


def _torch_layer(cls, init, dtype):
    """torch's own layer with the same sizes (randomly initialised): its weights are what the test loads."""
    return cls(init["d_model"], init["n_heads"], init["d_ff"], init["dropout"], init["activation"],
               batch_first=True, norm_first=init["norm_first"], dtype=dtype)


def _encoder_cases(rng, norm_first):
    cases = []
    for i in range(8):
        init, dtype = _block_setup(rng, i, norm_first)
        train = _training(i)
        if train:
            init["dropout"] = 0.5
        module = ref.EncoderBlock(**init).to(dtype)
        module.load_state_dict(_torch_layer(nn.TransformerEncoderLayer, init, dtype).state_dict())
        _perturb(module, rng)
        b, n = int(rng.integers(1, 4)), int(rng.integers(3 if train else 1, 8))
        x = _tensor(rng, (b, n, init["d_model"]), dtype)
        kwargs = {} if i % 4 == 0 else {"key_mask": _padded_mask(rng, b, n)}
        cases.append(module_case(module, init, [x], kwargs, train_seed=_train_seed(rng) if train else None,
                                 describe=_train_describe(module, init, x) if train else ""))
    return cases


@hidden_test("ch05.encoder_block", forbid=TRANSFORMER_BUILTINS)
def encoder_block(rng):
    return _encoder_cases(rng, norm_first=False)


@hidden_test("ch05.encoder_pre_norm", forbid=TRANSFORMER_BUILTINS)
def encoder_pre_norm(rng):
    return _encoder_cases(rng, norm_first=True)


def _decoder_cases(rng, norm_first):
    cases = []
    for i in range(8):
        init, dtype = _block_setup(rng, i, norm_first)
        train = _training(i)
        if train:
            init["dropout"] = 0.5
        module = ref.DecoderBlock(**init).to(dtype)
        module.load_state_dict(_torch_layer(nn.TransformerDecoderLayer, init, dtype).state_dict())
        _perturb(module, rng)
        b, t = int(rng.integers(1, 4)), int(rng.integers(2, 8))
        s = t if i == 3 else int(rng.integers(1, 9))          # one case with as many sources as targets
        if s == t and i != 3:
            s += 1
        x = _tensor(rng, (b, t, init["d_model"]), dtype)
        memory = _tensor(rng, (b, s, init["d_model"]), dtype)
        kwargs = {} if i % 4 == 0 else {"memory_mask": _padded_mask(rng, b, s)}
        cases.append(module_case(module, init, [x, memory], kwargs, train_seed=_train_seed(rng) if train else None,
                                 describe=_train_describe(module, init, x, memory) if train else ""))
    return cases


@hidden_test("ch05.decoder_block", forbid=TRANSFORMER_BUILTINS)
def decoder_block(rng):
    return _decoder_cases(rng, norm_first=False)


@hidden_test("ch05.decoder_pre_norm", forbid=TRANSFORMER_BUILTINS)
def decoder_pre_norm(rng):
    return _decoder_cases(rng, norm_first=True)


# ---- the encoder and decoder stacks --------------------------------------------------------------------
def _stack_init(rng, i, vocab):
    h = int(rng.integers(1, 3))
    return {"vocab_size": vocab, "d_model": h * int(rng.integers(2, 5)), "n_heads": h,
            "n_layers": int(rng.integers(1, 3)), "d_ff": int(rng.integers(2, 12)), "dropout": 0.1,
            "max_len": int(rng.integers(10, 16)), "norm_first": bool(i % 2), "activation": "relu"}


@hidden_test("ch05.encoder", forbid=TRANSFORMER_BUILTINS)
def encoder(rng):
    cases = []
    for i in range(6):
        vocab = int(rng.integers(4, 12))
        init = _stack_init(rng, i, vocab)
        train = i in (1, 2, 4)                             # half the cases in training mode
        if train:
            init["dropout"] = 0.5
        dtype = DTYPES[(i // 2) % 2]
        module = _perturb(ref.Encoder(**init).to(dtype), rng)
        b, s = int(rng.integers(1, 4)), int(rng.integers(1, init["max_len"] + 1))
        src_mask = _padded_mask(rng, b, s)
        src = torch.from_numpy(rng.integers(1, vocab, size=(b, s))).masked_fill(~src_mask, 0)
        cases.append(module_case(module, init, [src, src_mask], tol=STACK_TOL,
                                 train_seed=_train_seed(rng) if train else None,
                                 describe=_train_describe(module, init, src, src_mask) if train else ""))
    return cases


@hidden_test("ch05.decoder", forbid=TRANSFORMER_BUILTINS)
def decoder(rng):
    cases = []
    for i in range(6):
        vocab = int(rng.integers(4, 12))
        init = {**_stack_init(rng, i, vocab), "tie_embeddings": i % 3 != 0}     # tied in 4 cases of 6
        train = i in (1, 2, 4)                             # half the cases in training mode
        if train:
            init["dropout"] = 0.5
        dtype = DTYPES[(i // 2) % 2]
        module = _perturb(ref.Decoder(**init).to(dtype), rng)
        b, t, s = int(rng.integers(1, 4)), int(rng.integers(1, init["max_len"] + 1)), int(rng.integers(1, 9))
        tgt_in = torch.from_numpy(rng.integers(0, vocab, size=(b, t)))
        memory = _tensor(rng, (b, s, init["d_model"]), dtype)
        kwargs = {} if i == 0 else {"memory_mask": _padded_mask(rng, b, s)}
        cases.append(module_case(module, init, [tgt_in, memory], kwargs, tol=STACK_TOL,
                                 train_seed=_train_seed(rng) if train else None,
                                 describe=_train_describe(module, init, tgt_in, memory) if train else ""))
    return cases


# ---- teacher forcing ---------------------------------------------------------------------------------------
@hidden_test("ch05.shift_right")
def shift_right(rng):
    cases = []
    for b, t in [(1, 1), (1, 5), (3, 4), (2, 9), (4, 2)]:
        tgt = torch.from_numpy(rng.integers(0, 20, size=(b, t)))
        cases.append(function_case(ref.shift_right, [tgt, int(rng.integers(1, 25))]))
    return cases


@hidden_test("ch05.sequence_loss")
def sequence_loss(rng):
    cases = []
    for i in range(8):
        b, t, v = int(rng.integers(1, 5)), int(rng.integers(1, 8)), int(rng.integers(3, 9))
        dtype = DTYPES[i % 2]
        logits = _tensor(rng, (b, t, v), dtype, 2.0)
        pad = 0 if i < 5 else int(rng.integers(1, v))
        target = torch.from_numpy(rng.integers(0, v, size=(b, t)))
        keep = _padded_mask(rng, b, t)                       # each row: real tokens, then padding
        target = torch.where(keep, torch.where(target == pad, (target + 1) % v, target), pad)
        cases.append(function_case(ref.sequence_loss, [logits, target], {"pad": pad} if pad else {},
                                   rng=rng, grad_args=(0,) if i % 2 == 0 else ()))
    return cases


# ---- label smoothing ------------------------------------------------------------------------------------------
# (batch, length, V, smoothing, pad, logit scale, padded): eps = 0 once, padding in all but two cases (whose eps is
# not 0), pad ids other than 0, a large V, large float32 logits three times (log(softmax) underflows there: every
# row of those has a class 150 below its largest logit, whose probability rounds to 0 in float32).
_SMOOTHING_SETTINGS = [(3, 5, 6, 0.1, 0, 2.0, True), (2, 6, 5, 0.0, 0, 2.0, True), (4, 4, 8, 0.2, 3, 2.0, True),
                       (1, 7, 4, 0.05, 0, 1.0, True), (3, 3, 9, 0.5, 0, 3.0, True), (2, 5, 50, 0.1, 7, 2.0, True),
                       (2, 4, 7, 0.3, 0, 30.0, True), (3, 6, 3, 1.0, 0, 2.0, True), (2, 5, 6, 0.15, 2, 2.0, False),
                       (4, 5, 12, 0.25, 0, 2.0, True), (3, 4, 10, 0.1, 0, 50.0, True), (2, 6, 16, 0.2, 5, 50.0, False)]


@hidden_test("ch05.label_smoothed_loss", forbid=LABEL_SMOOTHING_BUILTINS, allow=LABEL_SMOOTHING_ALLOWED)
def label_smoothed_loss(rng):
    cases = []
    for i, (b, t, v, eps, pad, scale, padded) in enumerate(_SMOOTHING_SETTINGS):
        dtype = torch.float32 if scale > 10 else DTYPES[(i + 1) % 2]
        logits = _tensor(rng, (b, t, v), dtype, scale)
        if scale > 10 or i % 3 != 2:
            # one logit per row far below the others (150 in float32, 800 in float64): its probability underflows
            # to 0, so log(softmax(x)) is -inf there in most cases, while log_softmax stays finite
            low = torch.from_numpy(rng.integers(0, v, size=(b, t, 1)))
            logits.scatter_(-1, low, logits.amax(-1, keepdim=True) - (150 if dtype == torch.float32 else 800))
        target = torch.from_numpy(rng.integers(0, v, size=(b, t)))
        target = torch.where(target == pad, (target + 1) % v, target)          # real tokens are never pad
        if padded:
            target = torch.where(_padded_mask(rng, b, t), target, pad)          # each row: real tokens, then padding
        kwargs = {"pad": pad} if pad else {}
        cases.append(function_case(ref.label_smoothed_loss, [logits, target, eps], kwargs, rng=rng, grad_args=(0,)))
    return cases


# ---- greedy decoding ------------------------------------------------------------------------------------------
def _greedy_problem(rng, batch, dtype, vocab, max_len, hidden=5, length=6):
    weight = _tensor(rng, (vocab, hidden), dtype, 1.5)
    memory = _tensor(rng, (batch, length, hidden), dtype)
    return weight, [memory, padding_mask(rng, batch, length), 1, -1, max_len]


@hidden_test("ch05.greedy_decode")
def greedy_decode(rng):
    cases, tries = [], 0
    # Most cases run to max_len for some row, or stop at different steps in different rows: decoding that
    # stops a step short or when the first sequence ends fails most of them.
    wanted = [("early", 1), ("max_len", 1), ("all_early", 3), ("some_never", 4), ("all_early", 5),
              ("some_never", 2), ("some_never", 3), ("max_len", 1), ("some_never", 5), ("all_early", 2)]
    while wanted and tries < 500:
        tries += 1
        kind_wanted, batch = wanted[0]
        dtype = DTYPES[len(cases) % 2]
        max_len, vocab = int(rng.integers(5, 14)), int(rng.integers(4, 8))
        weight, args = _greedy_problem(rng, batch, dtype, vocab, max_len)
        path = ref.greedy_decode(prefix_decoder(weight), *args)      # eos = -1: never stops early
        for eos in rng.permutation(vocab):
            if eos in (0, 1):                                        # neither pad nor bos
                continue
            if _classify(_first_occurrences(path, int(eos)), max_len, batch == 1) == kind_wanted:
                break
        else:
            continue
        wanted.pop(0)
        args[3] = int(eos)
        if len(cases) == 4:
            # an explicit pad id: a token of the decoder's vocabulary (finished rows feed it back), not bos or eos
            args = args + [int(rng.choice([v for v in range(2, vocab) if v != int(eos)]))]
        cases.append(layer_case(ref.greedy_decode, "prefix_decoder", weight, args,
                                describe=f"(a fixed decoder, batch of {batch}, max_len={max_len}, eos={args[3]}: "
                                         f"{kind_wanted.replace('_', ' ')})"))
    assert not wanted, f"could not build greedy cases {wanted}"
    return cases


# ---- beam search ------------------------------------------------------------------------------------------------
def _beam_problem(rng, batch, vocab, max_len, eos, dtype, ties):
    """A score table [T, V, V] and a per-row bias [B, T, V] (attncourse.layers.score_table).

    eos gets a bias that grows with the position and differs by row, so that hypotheses finish at different
    steps. With ``ties``, at some steps two tokens get exactly the same logits for every prefix (the same
    column of the table and of the bias), and at the next step the same row of the table: their hypotheses
    then tie exactly, and only the tie-breaking rule decides."""
    table = rng.standard_normal((max_len, vocab, vocab)) * 1.5
    table[:, :, eos] += np.linspace(-2.5, 1.5, max_len)[:, None]
    memory = rng.standard_normal((batch, max_len, vocab))
    memory[:, :, eos] += rng.uniform(-1.5, 1.5, size=(batch, 1))
    if ties:
        for s in range(max_len - 1):
            if rng.random() < 0.7:
                likely = np.argsort(-(table[s].mean(0) + memory[:, s].mean(0)), kind="stable")
                i, j = (int(x) for x in rng.permutation(likely[:3])[:2])      # two of the likeliest tokens
                table[s, :, j], memory[:, s, j] = table[s, :, i], memory[:, s, i]
                table[s + 1, j] = table[s + 1, i]
    return torch.from_numpy(table).to(dtype), torch.from_numpy(memory).to(dtype)


def _ties_decide(table, memory, mask, bos, eos, max_len, beam, alpha, answer):
    """For each row, whether its answer changes when equal candidates are taken in the other token order: the
    same search with the token ids reversed (id v becomes V - 1 - v), its answer mapped back."""
    flip = torch.arange(table.shape[-1] - 1, -1, -1)
    tokens, _ = ref.beam_search(score_table(table[:, flip][:, :, flip]), memory[:, :, flip], mask,
                                int(flip[bos]), int(flip[eos]), max_len, beam, alpha, pad=-1)
    return [[int(flip[v]) for v in row if v >= 0] != mine for row, mine in zip(tokens.tolist(), answer)]


def _first_finished(decode, memory, mask, bos, eos, max_len, beam):
    """Each row's first hypothesis to finish (plain lists, one row at a time): a search that goes on after it
    is what most cases must need."""
    first = []
    for b in range(memory.shape[0]):
        alive, found = [([], 0.0)], None
        for t in range(1, max_len + 1):
            candidates = []
            for tokens, logp in alive:
                row_mask = None if mask is None else mask[b:b + 1]
                lps = torch.log_softmax(decode(torch.tensor([[bos] + tokens]), memory[b:b + 1], row_mask)[0, -1], dim=-1)
                candidates += [(tokens + [v], logp + lp) for v, lp in enumerate(lps.tolist())]
            candidates = sorted(candidates, key=lambda c: -c[1])[:beam]
            ended = [c[0] for c in candidates if c[0][-1] == eos or t == max_len]
            if ended:
                found = ended[0]
                break
            alive = candidates
        first.append(found)
    return first


# (beam size, alpha): every pair of the two lists, and four more searches wider than greedy; ties in half of the
# cases, float64 in half of them.
BEAM_SIZES, ALPHAS = (1, 2, 3, 5), (0.0, 0.6, 1.0)
BEAM_ROWS = 8           # rows drawn per problem, of which a case keeps 1 to 3 (rows are searched independently)
BEAM_TRIES = 1000       # problems drawn per setting at most: a salt's hardest setting took 36 draws on average and
                        # 129 at most over 80 salts; 1,000 leaves a chance of about 1e-12 of running out


def _beam_rows(table, memory, mask, bos, eos, max_len, beam, alpha, ties):
    """Per row of a drawn problem: its answer's length, and which of the properties a case needs it shows:
    "greedy" (greedy decoding finds another answer), "first" (the first hypothesis to finish is not the
    answer: the search must go on), "ranked" (ranking each hypothesis' candidates apart, the top_per_beam
    mistake, gives another answer) and "ties" (the tie-breaking rule decides the answer)."""
    decode = score_table(table)
    tokens, _ = ref.beam_search(decode, memory, mask, bos, eos, max_len, beam, alpha, pad=-1)
    answers = [[v for v in row if v >= 0] for row in tokens.tolist()]
    rows = [{"length": len(a), "shows": set()} for a in answers]
    if beam > 1:
        greedy = ref.greedy_decode(decode, memory, mask, bos, eos, max_len, -1).tolist()
        first = _first_finished(decode, memory, mask, bos, eos, max_len, beam)
        for b, row in enumerate(rows):
            row_mask = None if mask is None else mask[b:b + 1]
            if [v for v in greedy[b] if v >= 0] != answers[b]:
                row["shows"].add("greedy")
            if first[b] != answers[b]:
                row["shows"].add("first")
            if _plain_beam(decode, memory[b:b + 1], row_mask, bos, eos, max_len, beam, alpha,
                           "top_per_beam")[0][0].tolist() != answers[b]:
                row["shows"].add("ranked")
    if ties:
        for row, decides in zip(rows, _ties_decide(table, memory, mask, bos, eos, max_len, beam, alpha, answers)):
            if decides:
                row["shows"].add("ties")
    return rows


def _pick_rows(rows, batch, max_len, needed):
    """Up to ``batch`` rows, at least one, that finish at different lengths (a lone row before max_len) and
    together show every property in ``needed``; None if no choice does."""
    from itertools import combinations
    for size in range(batch, 0, -1):
        for chosen in combinations(range(len(rows)), size):
            lengths = [rows[b]["length"] for b in chosen]
            if len(set(lengths)) < min(size, 2) or (size == 1 and lengths[0] == max_len):
                continue
            if needed <= set().union(*(rows[b]["shows"] for b in chosen)):
                return list(chosen)
    return None


def _planted_beam(rng, kind, dtype):
    """A score table built so that a finished hypothesis' freed slot (or the early stop's bound) decides the
    answer (beam_size 2, alpha 1): ``kind`` "keep_finished", "refill" or "stop_lp_t" gives another answer than
    the exercise's beam search.
    Random tables (as in _beam_problem) almost never do. Token roles, sizes and the probabilities' small
    jitter are drawn; where no role is planted, every token is about equally likely and eos a little less,
    so a path that leaves the planted ones only loses.

    Step 1 (after bos): B, then eos (hypothesis A, finished at once), then C. The exercise keeps B and A,
    so only B goes on, with its two best extensions B x1 and B x2; x2 is followed by eos almost surely,
    and [B, x2, eos] wins once its length penalty is counted. keep_finished lets A hold a slot, keeps only
    B x1 and answers A. refill keeps C too, whose extension C y (then eos) outranks B x2: it answers
    [C, y, eos], where the exercise answers A. "stop_lp_t": A = [eos] is first at step 1 and B second, whose
    best future is [B, x2, eos]: an early stop that bounds B with lp(1) instead of lp(max_len) answers A."""
    vocab, max_len = int(rng.integers(7, 10)), int(rng.integers(4, 7))
    eos, bos, b, c, x1, x2, y = (int(v) for v in rng.permutation(vocab)[:7])
    jitter = lambda: float(rng.uniform(-0.01, 0.01))              # noqa: E731
    table = np.zeros((max_len, vocab, vocab))
    table[:, :, eos] = -1.0                                       # flat elsewhere, eos a little less likely

    def plant(step, prev, probs):
        rest = (1 - sum(probs.values())) / (vocab - len(probs))
        row = np.full(vocab, np.log(rest))
        for token, q in probs.items():
            row[token] = np.log(q)
        table[step, prev] = row
    if kind == "stop_lp_t":                                       # A = [eos] first, then B, whose only way
        plant(0, bos, {eos: 0.4 + jitter(), b: 0.35 + jitter()})   # on is B x2 eos: the bound with lp(1) stops
        plant(1, b, {x2: 0.99})                                   # at step 1, the one with lp(max_len) does not
    elif kind == "keep_finished":
        plant(0, bos, {b: 0.5 + jitter(), eos: 0.3 + jitter(), c: 0.12})
        plant(1, b, {x1: 0.5 + jitter(), x2: 0.45 + jitter()})
    else:
        plant(0, bos, {b: 0.45 + jitter(), eos: 0.25 + jitter(), c: 0.2 + jitter()})
        plant(1, b, {x1: 0.4 + jitter(), x2: 0.35 + jitter()})
        plant(1, c, {y: 0.98})
        plant(2, y, {eos: 0.97})
    plant(2, x2, {eos: 0.97})
    table, memory = torch.from_numpy(table).to(dtype), torch.zeros(1, max_len, vocab, dtype=dtype)
    args = [memory, None, bos, eos, max_len, 2, 1.0]
    right = ref.beam_search(score_table(table), *args, pad=-1)[0][0].tolist()
    other = _plain_beam(score_table(table), memory, None, bos, eos, max_len, 2, 1.0, kind)[0][0].tolist()
    assert [v for v in right if v >= 0] != other, f"the planted {kind} table does not decide the answer"
    return table, args


# Planted rows: a row of a beam search case on tokens of its own, built so that one mistake of the text changes
# its answer under any (beam_size > 1, alpha) of the hidden test.  Random rows almost never let a freed slot, the
# early stop's bound or the order of exactly equal candidates decide; these rows are built so that it does, and
# every case wider than greedy carries them, so that each such mistake fails most cases under any salt.
PLANT_LOW = -1e4        # a logit whose probability underflows to exactly 0 in float32 and float64
PLANT_FILLERS = 8       # weak tokens shared by every planted row: they lead only to each other, thinly
PLANT_EOS = 0.002       # eos after a planted token that does not plant it
KINDS_ANY_ALPHA = ("token_first", "last_of_equal")          # exact ties decide: any alpha
KINDS_WITH_PENALTY = ("keep_finished", "refill", "stop_lp_t")   # with alpha = 0 these give the exercise's answer


def _row_design(rng, kind, beam, alpha):
    """One planted row on named tokens: (first, rows), the first token's probabilities and, per (step, previous
    token), the next token's; "eos" is the problem's eos, every other mass goes to the fillers.  Token ids are
    drawn later, except that "Hi" < "Hj" and "v1" < "v2" (the tie rows need the order)."""
    lp = lambda n: ((5 + n) / 6) ** alpha                  # noqa: E731
    jit = lambda: float(rng.uniform(-0.004, 0.004))        # noqa: E731
    decoys = lambda name, total, n: {f"{name}{i}": total / n + 0.004 * (i - (n - 1) / 2) for i in range(n)}  # noqa: E731
    if kind == "keep_finished":
        # A = [eos] outranks [B, xk], the k-th best extension of B, so a beam where A keeps a slot drops it;
        # [B, xk, eos] wins once its length penalty is counted.
        q, pb = 0.97 / (beam + 0.5) + jit(), 0.55 + jit()
        pa = float(np.exp((np.log(pb * q) + np.log(pb * q * 0.99) / lp(3)) / 2))
        return {"B": pb, "eos": pa}, {(1, "B"): {**decoys("x", 0.97 - q, beam - 1), "xk": q}, (2, "xk"): {"eos": 0.99}}
    if kind == "refill":
        # B0..B(k-2) and A = [eos] fill the beam; C is next and only a refilled beam keeps it: [C, y, eos] beats A
        # with its length penalty, and the Bs lead nowhere.
        pa = min(0.2, 0.5 / (beam + 1)) + jit()
        lo = pa ** lp(3) / 0.98 / 0.97
        pc = float(np.sqrt(lo * pa))
        return ({**decoys("B", 0.94 - pa - pc, beam - 1), "eos": pa, "C": pc},
                {(1, "C"): {"y": 0.98}, (2, "y"): {"eos": 0.97}})
    if kind == "stop_lp_t":
        # A = [eos] is first and B second at step 1: a bound with lp(1) stops there, the one with lp(max_len)
        # does not, and [B, x, eos] wins.
        pa = 0.4 + jit()
        return {"eos": pa, "B": pa - 0.02}, {(1, "B"): {"x": 0.99}, (2, "x"): {"eos": 0.99}}
    # The tie rows: Hi and Hj are exactly equal at step 1 and have the same next-token row.  D0..D(k-3) fill
    # the other slots, so that the beam's cut falls inside the tied candidates.
    first = {**decoys("D", 0.2 * (beam - 2), max(beam - 2, 1)), "Hi": 0.15, "Hj": 0.15} if beam > 2 else \
        {"Hi": 0.4, "Hj": 0.4}
    if kind == "token_first":
        # Hi v1, Hi v2, Hj v1, Hj v2 tie exactly: the exercise keeps Hi's two (lower hypothesis first), ties by
        # token first keep Hi v1 and Hj v1, and only [Hi, v2, eos] ends well.
        same = {"v1": 0.4, "v2": 0.4}
        rows = {(1, "Hi"): same, (1, "Hj"): same, (2, "v2"): {"eos": 0.99}}
        rows.update({(1, f"D{i}"): {f"d{i}": 0.99} for i in range(beam - 2)})
        return first, rows
    # last_of_equal: [Hi, eos] and [Hj, eos] finish at the same step with exactly equal scores and win.
    return first, {(1, "Hi"): {"eos": 0.99}, (1, "Hj"): {"eos": 0.99}}


def _with_planted_rows(rng, table, memory, mask, bos, eos, beam, alpha, kinds):
    """The problem (table [T, V, V], memory [B, T, V], mask [B, T] or None) with one planted row per kind
    appended, each on new tokens of its own (ids V and up, in a drawn order) and the shared fillers.  Rows of
    the problem never reach a new token and planted rows never reach an old one but eos (logits PLANT_LOW), so
    the old rows' answers do not change.  Each planted row is checked to change its answer under its mistake.
    Returns (table, memory, mask)."""
    max_len, dtype = table.shape[0], table.dtype
    assert mask is None or bool(mask[:, 0].all()), "every row's bias must count at step 1"
    designs = [_row_design(rng, kind, beam, alpha) for kind in kinds]
    own = [sorted({*first, *(p for _, p in rows), *(t for r in rows.values() for t in r)} - {"eos"})
           for first, rows in designs]
    fillers = [f"f{i}" for i in range(PLANT_FILLERS)]
    keys = [*fillers, *((k, name) for k, names in enumerate(own) for name in names)]
    n_old = table.shape[-1]
    ids = {key: n_old + int(i) for key, i in zip(keys, rng.permutation(len(keys)))}
    for k in range(len(kinds)):                         # the tie rows need Hi < Hj and v1 < v2
        for a, b in (("Hi", "Hj"), ("v1", "v2")):
            if (k, a) in ids and ids[(k, a)] > ids[(k, b)]:
                ids[(k, a)], ids[(k, b)] = ids[(k, b)], ids[(k, a)]
    v = n_old + len(ids)
    new = np.full((max_len, v, v), PLANT_LOW)
    new[:, :n_old, :n_old] = table.double().numpy()
    new[0, bos, n_old:] = 0.0                          # reached only through a planted row's bias at step 1

    def log_row(probs, row):
        """Log-probabilities over the new tokens and eos: ``probs`` (on this row's names), the rest to the fillers."""
        out = np.full(v, PLANT_LOW)
        p = {eos if t == "eos" else ids[(row, t)]: q for t, q in probs.items()}
        p.setdefault(eos, PLANT_EOS)
        rest = (1 - sum(p.values())) / PLANT_FILLERS
        assert rest > 0, probs
        for f in fillers:
            p[ids[f]] = p.get(ids[f], 0) + rest
        for token, q in p.items():
            out[token] = np.log(q)
        return out
    default = log_row({}, None)
    new[1:, n_old:] = default                          # after any new token, the fillers (and a little eos)
    rows_memory = np.zeros((len(kinds), max_len, v))
    for k, (first, rows) in enumerate(designs):
        start = log_row(first, k)
        rows_memory[k, 0] = np.where(np.arange(v) < n_old, PLANT_LOW, start)
        rows_memory[k, 0, eos] = start[eos] - new[0, bos, eos]
        for (step, prev), probs in rows.items():
            new[step, ids[(k, prev)]] = log_row(probs, k)
    old_memory = np.zeros((memory.shape[0], max_len, v))
    old_memory[:, :, :n_old] = memory.double().numpy()
    old_memory[:, 0, n_old:] = PLANT_LOW                # (mask rows start True: the bias at step 1 always counts)
    table = torch.from_numpy(new).to(dtype)
    memory = torch.from_numpy(np.concatenate([old_memory, rows_memory])).to(dtype)
    if mask is not None:
        mask = torch.cat([mask, torch.ones(len(kinds), max_len, dtype=torch.bool)])
    decode = score_table(table)
    for k, kind in enumerate(kinds):
        row = memory.shape[0] - len(kinds) + k
        args = [memory[row:row + 1], None, bos, eos, max_len, beam, alpha]
        right = [t for t in ref.beam_search(decode, *args, pad=-1)[0][0].tolist() if t >= 0]
        assert right != _plain_beam(decode, *args, kind)[0][0].tolist(), f"the planted {kind} row does not decide the answer"
    return table, memory, mask


@hidden_test("ch05.beam_search")
def beam_search(rng):
    """Every setting gets its case from problems drawn for it alone (no setting can use up the others' draws),
    and a case is made of chosen rows of a larger drawn batch: every property a case needs is then common, so
    that the builder finds one within a few draws under any salt (tests/test_salts.py runs it under many).
    Every case wider than greedy also carries planted rows (_with_planted_rows), and six more cases are planted
    rows alone: each mistake of KINDS_ANY_ALPHA and KINDS_WITH_PENALTY then fails most cases under any salt."""
    cases = []
    settings = [(b, a) for a in ALPHAS for b in BEAM_SIZES] + [(2, 0.0), (3, 0.6), (5, 1.0), (3, 0.0)]
    for i, (beam, alpha) in enumerate(settings):
        dtype, ties = DTYPES[i % 2], i % 4 < 2
        needed = ({"greedy", "first", "ranked"} if beam > 1 else set()) | ({"ties"} if ties else set())
        for _ in range(BEAM_TRIES):
            batch, vocab, max_len = int(rng.integers(1, 4)), int(rng.integers(4, 8)), int(rng.integers(4, 8))
            eos, bos = (int(x) for x in rng.choice(vocab, 2, replace=False))
            table, memory = _beam_problem(rng, BEAM_ROWS, vocab, max_len, eos, dtype, ties)
            mask = None if i % 3 == 0 else padding_mask(rng, BEAM_ROWS, max_len)
            chosen = _pick_rows(_beam_rows(table, memory, mask, bos, eos, max_len, beam, alpha, ties),
                                batch, max_len, needed)
            if chosen is not None:
                break
        else:
            raise AssertionError(f"could not build a beam search case for beam_size={beam}, alpha={alpha}")
        memory, mask = memory[chosen], None if mask is None else mask[chosen]
        if beam > 1:
            kinds = KINDS_ANY_ALPHA + (KINDS_WITH_PENALTY if alpha > 0 else ())
            table, memory, mask = _with_planted_rows(rng, table, memory, mask, bos, eos, beam, alpha, kinds)
        cases.append(_beam_case(rng, table, memory, mask, bos, eos, beam, alpha, explicit_pad=i % 4 == 0,
                                ties=ties))
    for i, (beam, alpha) in enumerate([(2, 1.0), (3, 0.6), (5, 1.0), (2, 0.6), (3, 1.0), (5, 0.6)]):
        vocab, max_len = int(rng.integers(2, 5)), int(rng.integers(4, 8))     # a few tokens besides the planted
        eos, bos = (int(x) for x in rng.choice(vocab, 2, replace=False))
        empty = torch.zeros(0, max_len, vocab, dtype=DTYPES[i % 2])
        table, memory, mask = _with_planted_rows(rng, torch.zeros(max_len, vocab, vocab, dtype=DTYPES[i % 2]), empty,
                                                 None, bos, eos, beam, alpha, KINDS_ANY_ALPHA + KINDS_WITH_PENALTY)
        cases.append(_beam_case(rng, table, memory, mask, bos, eos, beam, alpha, explicit_pad=i % 2 == 1))
    return cases


def _beam_case(rng, table, memory, mask, bos, eos, beam, alpha, explicit_pad, ties=False):
    vocab, max_len = table.shape[-1], table.shape[0]
    pad = int(rng.integers(vocab, vocab + 5)) if explicit_pad else 0        # an explicit pad id: no token's
    args = [memory, mask, bos, eos, max_len, beam, alpha] + ([pad] if pad else [])
    return layer_case(ref.beam_search, "score_table", table, args,
                      describe=f"(a score table: batch of {memory.shape[0]}, V={vocab}, max_len={max_len}, "
                               f"beam_size={beam}, alpha={alpha}, {'ties, ' if ties else ''}"
                               f"{str(table.dtype)[6:]}{', memory_mask=None' if mask is None else ''})")


# ---- stored cases for the visible checks ---------------------------------------------------------------------
def _layer_norm_variants(x, weight, bias, eps):
    """What classic LayerNorm mistakes give on ``x`` (the visible check names them by these outputs)."""
    d = x.shape[-1]
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    z = (x - mean) / torch.sqrt(var + eps)
    tokens_mean = x.mean(-2, keepdim=True)                     # statistics over the tokens instead
    tokens_var = ((x - tokens_mean) ** 2).mean(-2, keepdim=True)
    return {"unbiased": (x - mean) / torch.sqrt(var * d / (d - 1) + eps) * weight + bias,
            "eps_outside": (x - mean) / (torch.sqrt(var) + eps) * weight + bias,
            "wrong_axis": (x - tokens_mean) / torch.sqrt(tokens_var + eps) * weight + bias,
            "no_affine": z,
            "swapped_affine": z * bias + weight}


def _stack_variants(module, args, kwargs):
    """What the stack gives with the embedding scale or the positions wrong (by editing weights) and,
    for pre-norm, without the final LayerNorm."""
    out = {}
    d = module.d_model
    for name, factor in [("unscaled", d ** -0.5), ("scaled_by_d", d ** 0.5)]:
        other = copy.deepcopy(module)
        with torch.no_grad():
            other.embedding.weight.mul_(factor)
        out[name] = other(*args, **kwargs)
    other = copy.deepcopy(module)
    with torch.no_grad():
        other.pos_embedding.weight.zero_()
    out["no_positions"] = other(*args, **kwargs)
    if isinstance(module.norm, ref.LayerNorm):
        other = copy.deepcopy(module)
        other.norm = nn.Identity()
        out["no_final_norm"] = other(*args, **kwargs)
    return out


def check_data():
    """Fixed cases for the visible checks (tools/make_check_data.py writes them)."""
    data = {}
    # LayerNorm: D = 5, eps = 0.1 with a small spread, so where eps goes shows.
    x = fixed((2, 3, 5), 51) * 0.3
    weight, bias = fixed((5,), 52) + 1, fixed((5,), 53)
    ln = ref.LayerNorm(5, eps=0.1).double()
    with torch.no_grad():
        ln.weight.copy_(weight)
        ln.bias.copy_(bias)
    cot = fixed((2, 3, 5), 54)
    with torch.enable_grad():                                  # make_check_data runs under no_grad
        xg = x.clone().requires_grad_()
        y = ln(xg)
        (grad,) = torch.autograd.grad((y * cot).sum(), xg)
        mean = xg.mean(-1, keepdim=True).detach()               # statistics cut from the graph
        var = ((xg - mean) ** 2).mean(-1, keepdim=True).detach()
        (detached_grad,) = torch.autograd.grad((((xg - mean) / torch.sqrt(var + 0.1) * weight + bias) * cot).sum(), xg)
    offset = fixed((4, 6), 55) * 0.05 + 100.0                 # large mean, small spread, for float32
    ln6 = ref.LayerNorm(6).double()
    data["layer_norm"] = {"init": {"normalized_shape": 5, "eps": 0.1}, "state": dict(ln.state_dict()), "x": x,
                          "output": y, **_layer_norm_variants(x, weight, bias, 0.1), "cotangent": cot, "grad": grad,
                          "detached_grad": detached_grad, "offset_x": offset, "offset_output": ln6(offset)}

    # FeedForward: D = 4, d_ff = 6, both activations; what a missing or wrong activation gives.
    torch.manual_seed(5)
    ff = ref.FeedForward(4, 6).double()
    xf = fixed((2, 3, 4), 56) * 2
    hidden = ff.linear1(xf)
    data["feed_forward"] = {"state": dict(ff.state_dict()), "x": xf, "relu": ff(xf),
                            "gelu": ref.FeedForward.forward(_with(ff, activation="gelu"), xf),
                            "no_activation": ff.linear2(hidden),
                            "gelu_tanh": ff.linear2(torch.nn.functional.gelu(hidden, approximate="tanh"))}
    # ... and in training mode with dropout 0.5, right after torch.manual_seed(9).
    dropping = _with(ff, dropout=nn.Dropout(0.5)).train()
    torch.manual_seed(9)
    data["feed_forward"]["train"] = dropping(xf)

    # Encoder and decoder stacks: small, random, with padding; both norm placements.
    for name, cls, extra in [("encoder", ref.Encoder, {}), ("decoder", ref.Decoder, {"tie_embeddings": False})]:
        for norm_first in (False, True):
            init = {"vocab_size": 9, "d_model": 8, "n_heads": 2, "n_layers": 2, "d_ff": 12, "dropout": 0.1,
                    "max_len": 10, "norm_first": norm_first, "activation": "relu", **extra}
            torch.manual_seed(7 + norm_first)
            module = _perturb(cls(**init).double(), np.random.default_rng(7)).eval()
            mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
            if name == "encoder":
                args = [torch.tensor([[3, 5, 7, 2, 8, 4], [6, 6, 3, 1, 0, 0]]), mask]
                kwargs = {}
            else:
                args = [torch.tensor([[1, 4, 4, 7, 2], [1, 8, 3, 2, 0]]), fixed((2, 6, 8), 57)]
                kwargs = {"memory_mask": mask}
            inputs = dict(zip(["src", "src_mask"] if name == "encoder" else ["tgt_in", "memory"], args), **kwargs)
            entry = {"init": init, "state": dict(module.state_dict()), "inputs": inputs,
                     "output": module(*args, **kwargs), **_stack_variants(module, args, kwargs)}
            if name == "decoder":
                entry["mask_ignored"] = module(*args)
            data[f"{name}_{'pre' if norm_first else 'post'}"] = entry

    # A decoder whose output projection is tied to the embedding: it keeps its own bias.
    entry = dict(data["decoder_post"])
    entry["init"] = {**entry["init"], "tie_embeddings": True}
    torch.manual_seed(7)
    tied = _perturb(ref.Decoder(**entry["init"]).double(), np.random.default_rng(8)).eval()
    args = [entry["inputs"]["tgt_in"], entry["inputs"]["memory"]]
    mask = entry["inputs"]["memory_mask"]
    hidden = tied.norm(_decoder_hidden(tied, *args, mask))
    data["decoder_tied"] = {"init": entry["init"], "state": dict(tied.state_dict()), "inputs": entry["inputs"],
                            "output": tied(*args, memory_mask=mask), "no_bias": hidden @ tied.embedding.weight.T}

    # Teacher forcing.
    tgt = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    logits = fixed((2, 4, 5), 58) * 2
    target = torch.tensor([[3, 1, 4, 2], [2, 4, 0, 0]])
    with torch.enable_grad():
        lg = logits.clone().requires_grad_()
        loss = ref.sequence_loss(lg, target)
        (loss_grad,) = torch.autograd.grad(loss, lg)
    per_token = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    real = (target != 0).double()
    data["teacher_forcing"] = {
        "tgt": tgt, "bos": 1, "shifted": ref.shift_right(tgt, 1), "logits": logits, "target": target,
        "loss": loss, "loss_grad": loss_grad, "with_padding": per_token.mean(), "summed": (per_token * real).sum(),
        "mean_of_means": ((per_token * real).sum(1) / real.sum(1)).mean(),
        "pad_4_target": torch.tensor([[3, 1, 0, 2], [2, 0, 4, 4]]),
        "pad_4_loss": ref.sequence_loss(logits, torch.tensor([[3, 1, 0, 2], [2, 0, 4, 4]]), pad=4)}

    # Label smoothing: V = 6, eps = 0.2, row 0 all real, row 1 three real tokens then padding.
    data["label_smoothing"] = _label_smoothing_check_case()

    # Greedy decoding with the fixed decoder attncourse.layers.prefix_decoder.
    data["greedy"] = _greedy_check_case()

    # Beam search with the score table attncourse.layers.score_table, and what each classic mistake gives.
    data["beam"] = _beam_check_case()
    rng = np.random.default_rng(2022)               # planted tables where a freed slot or the stop decides
    data["beam"]["planted"] = []
    for kind in ("keep_finished", "refill", "stop_lp_t"):
        table, args = _planted_beam(rng, kind, torch.float64)
        right = ref.beam_search(score_table(table), *args)
        wrong = _plain_beam(score_table(table), *args, kind)
        data["beam"]["planted"].append({"kind": kind, "table": table, "max_len": args[4], "bos": args[2],
                                        "eos": args[3], "tokens": right[0], "scores": right[1],
                                        "mistake_tokens": wrong[0], "mistake_scores": wrong[1]})
    return data


def _label_smoothing_check_case():
    """The stored case of check_label_smoothed_loss and what the classic mistakes give on it."""
    eps, v = 0.2, 6
    logits = fixed((2, 5, v), 59) * 2
    target = torch.tensor([[3, 1, 4, 2, 5], [2, 4, 1, 0, 0]])
    with torch.enable_grad():
        lg = logits.clone().requires_grad_()
        loss = ref.label_smoothed_loss(lg, target, eps)
        (grad,) = torch.autograd.grad(loss, lg)
    log_p = torch.log_softmax(logits, -1)
    nll = -log_p.gather(-1, target[..., None])[..., 0]              # at padding: -log p[pad], the class 0
    uniform = -log_p.mean(-1)
    real = target != 0
    n_real = real.sum()

    def over_real(per_token):
        return per_token[real].sum() / n_real

    others = (-log_p.sum(-1) - nll) / (v - 1)                       # mean -log p over the V - 1 wrong classes
    smoothed = (1 - eps) * nll + eps * uniform
    big = fixed((2, 5, v), 60) * 300
    pad_4_target = torch.tensor([[3, 1, 0, 2, 5], [2, 0, 1, 4, 4]])
    return {"logits": logits, "target": target, "smoothing": eps, "loss": loss, "grad": grad,
            "unsmoothed": over_real(nll),
            "v_minus_1": over_real((1 - eps) * nll + eps * others),
            "no_eps_over_v": over_real((1 - eps) * nll + eps * (uniform - nll / v)),
            "with_padding": smoothed.mean(),
            "smoothing_on_padding": over_real((1 - eps) * nll) + eps * uniform.mean(),
            "mean_over_rows": smoothed[real].sum() / target.shape[0],
            "summed": smoothed[real].sum(),
            "pad_4_target": pad_4_target, "pad_4_loss": ref.label_smoothed_loss(logits, pad_4_target, eps, pad=4),
            "big_logits": big, "big_loss": ref.label_smoothed_loss(big, target, eps)}


def _decoder_hidden(decoder, tgt_in, memory, memory_mask):
    """The decoder's last block output (before the final norm and the projection)."""
    x = decoder.embedding(tgt_in) * decoder.d_model ** 0.5 + decoder.pos_embedding(torch.arange(tgt_in.shape[-1]))
    for layer in decoder.layers:
        x = layer(x, memory, memory_mask)
    return x


def _with(module, **attrs):
    other = copy.deepcopy(module)
    for k, v in attrs.items():
        setattr(other, k, v)
    return other


def _greedy_check_case():
    """A batch of three whose rows stop at three different steps, and a row that never stops."""
    for seed in range(200):
        rng = np.random.default_rng(seed)
        weight, args = _greedy_problem(rng, 4, torch.float64, 6, 9)
        weight = (weight * 100).round() / 100
        memory = (args[0] * 100).round() / 100
        path = ref.greedy_decode(prefix_decoder(weight), memory, args[1], 1, -1, 9)
        for eos in range(2, 6):
            stops = _first_occurrences(path, eos)
            if None in stops[3:] and None not in stops[:3] and len(set(stops[:3])) == 3 and min(stops[:3]) > 0:
                out = ref.greedy_decode(prefix_decoder(weight), memory[:3], args[1][:3], 1, eos, 9)
                never = ref.greedy_decode(prefix_decoder(weight), memory[3:], args[1][3:], 1, eos, 9)
                return {"weight": weight, "memory": memory[:3], "mask": args[1][:3], "bos": 1, "eos": eos,
                        "max_len": 9, "output": out, "memory_never": memory[3:], "mask_never": args[1][3:],
                        "output_never": never}
    raise AssertionError("no greedy check case found")


# Mistakes the visible check of beam search names, by what each gives on its stored cases.
BEAM_MISTAKES = ("no_penalty", "eos_not_counted", "eos_expanded", "top_per_beam", "no_parent", "probabilities",
                 "first_finished", "raw_logits")


def _plain_beam(decode, memory, mask, bos, eos, max_len, beam, alpha, mistake=None):
    """Beam search one row at a time with lists, as the exercise states it, or with one of BEAM_MISTAKES or of
    the two beam forms of other codebases the text sets apart, or "last_of_equal" (of equal finished scores the
    one set aside last wins, where the exercise keeps the first): "keep_finished" (a finished hypothesis keeps its
    slot in the beam, as in the common vectorised form) and "refill" (fairseq's and Hugging Face's: of the top
    2 beam_size candidates, those in the first beam_size that end are finished, and the first beam_size that
    do not end go on, so the beam never shrinks)."""
    answers, scores = [], []
    for b in range(memory.shape[0]):
        alive, best, held = [([], 0.0)], None, []
        for t in range(1, max_len + 1):
            candidates = []
            for tokens, logp in alive:
                row_mask = None if mask is None else mask[b:b + 1]
                logits = decode(torch.tensor([[bos] + tokens]), memory[b:b + 1], row_mask)[0, -1]
                lps = {"probabilities": torch.softmax(logits, -1), "raw_logits": logits}.get(
                    mistake, torch.log_softmax(logits, -1))
                # each candidate: (tokens, its log-probability as a 0-d tensor, the same as a float to sort by);
                # entry v is logp + lps[v] in the tensors' dtype, added for every v in one operation
                totals = (0.0 if mistake == "no_parent" else logp) + lps
                mine = list(zip([tokens + [v] for v in range(len(lps))], totals.unbind(), totals.tolist()))
                if mistake == "top_per_beam":
                    mine = sorted(mine, key=lambda c: -c[2])[:beam]
                candidates += mine
            if mistake == "token_first":                # ties by token id, then hypothesis
                candidates = sorted(candidates, key=lambda c: (-c[2], c[0][-1]))
            elif mistake != "top_per_beam":
                candidates = sorted(candidates, key=lambda c: -c[2])
            kept = candidates[:beam]
            if mistake == "keep_finished":              # finished hypotheses keep competing for the beam's slots
                pool = sorted([(c, False) for c in candidates] + [(h, True) for h in held], key=lambda c: -float(c[0][1]))
                held, kept = [c for c, fin in pool[:beam] if fin], [c for c, fin in pool[:beam] if not fin]
            elif mistake == "refill" and t < max_len:   # fairseq / Hugging Face: the first beam_size that go on,
                kept = [c for c in kept if c[0][-1] == eos] + [c for c in candidates[:2 * beam] if c[0][-1] != eos][:beam]
            alive = []
            for tokens, logp, *_ in kept:
                ends = tokens[-1] == eos and mistake != "eos_expanded"
                if ends or t == max_len:
                    length = t - (mistake == "eos_not_counted" and tokens[-1] == eos)
                    score = logp if mistake == "no_penalty" else logp / ((5 + length) / 6) ** alpha
                    if mistake == "eos_expanded" and eos in tokens:
                        tokens = tokens[:tokens.index(eos) + 1]
                    if best is None or score > best[0] or (mistake == "last_of_equal" and score == best[0]):
                        best = (score, tokens)
                    if mistake == "keep_finished":
                        held.append((tokens, logp))
                else:
                    alive.append((tokens, logp))
            if not alive or (mistake == "first_finished" and best is not None):
                break
            if mistake == "stop_lp_t" and best is not None and \
                    best[0] >= max(float(lp) for _, lp in alive) / ((5 + t) / 6) ** alpha:
                break                                   # the bound with lp(t), not lp(max_len): stops too early
        answers.append(best[1])
        scores.append(best[0])
    width = max(len(a) for a in answers)
    return torch.tensor([a + [0] * (width - len(a)) for a in answers]), torch.stack(scores)


# The check's mask: the second sequence's bias is dropped at steps 4 and 5 (score_table).
CHECK_MASK = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])


def _beam_check_case():
    """A batch of two on a score table where beam search beats greedy decoding and every mistake of
    BEAM_MISTAKES gives its own answer; and a table with exact ties, where the order of equal candidates
    decides the answer."""
    settings = [(1, 0.0, True), (3, 0.0, False), (3, 0.6, True), (2, 1.0, False)]
    for seed in range(500):
        rng = np.random.default_rng(seed)
        table, memory = _beam_problem(rng, 2, 5, 5, 3, torch.float64, False)
        table, memory = (table * 100).round() / 100, (memory * 100).round() / 100
        decode = score_table(table)
        entries, seen = [], set()
        for beam, alpha, masked in settings:
            mask = CHECK_MASK if masked else None
            right = ref.beam_search(decode, memory, mask, 1, 3, 5, beam, alpha)
            mistakes = {m: _plain_beam(decode, memory, mask, 1, 3, 5, beam, alpha, m) for m in BEAM_MISTAKES}
            mistakes["mask_misaligned"] = ref.beam_search(_mask_repeated(decode, 2), memory, mask, 1, 3, 5, beam, alpha)
            mistakes["mask_ignored"] = ref.beam_search(decode, memory, None, 1, 3, 5, beam, alpha)
            entries.append({"beam_size": beam, "alpha": alpha, "masked": masked, "tokens": right[0].tolist(),
                            "scores": right[1].tolist(), "mistakes": {m: {"tokens": o[0].tolist(), "scores": o[1].tolist()}
                                                                      for m, o in mistakes.items()}})
            if beam > 1:
                seen |= {m for m, o in mistakes.items() if not _same_answer(o, right)
                         and all(not _same_answer(o, p) for n, p in mistakes.items() if n != m)}
        greedy = ref.greedy_decode(decode, memory, CHECK_MASK, 1, 3, 5)
        misaligned = entries[2]["mistakes"]["mask_misaligned"]
        if seen >= set(BEAM_MISTAKES) and entries[1]["tokens"] != greedy.tolist() \
                and not _same_answer((torch.tensor(misaligned["tokens"]), torch.tensor(misaligned["scores"])),
                                     (torch.tensor(entries[2]["tokens"]), torch.tensor(entries[2]["scores"]))) \
                and ref.beam_search(score_table(table.float()), memory.float(), CHECK_MASK, 1, 3, 5, 3, 0.6)[0].tolist() \
                == entries[2]["tokens"]:
            break
    else:
        raise AssertionError("no beam search check case found")
    for seed in range(500):
        rng = np.random.default_rng(1000 + seed)
        tie_table, tie_memory = _beam_problem(rng, 2, 5, 5, 3, torch.float64, True)
        tie_table, tie_memory = (tie_table * 100).round() / 100, (tie_memory * 100).round() / 100
        tied = ref.beam_search(score_table(tie_table), tie_memory, None, 1, 3, 5, 2, 0.0)
        answer = [row[:row.index(3) + 1] if 3 in row else row for row in tied[0].tolist()]
        token_first = _plain_beam(score_table(tie_table), tie_memory, None, 1, 3, 5, 2, 0.0, "token_first")[0]
        last = _plain_beam(score_table(tie_table), tie_memory, None, 1, 3, 5, 2, 0.0, "last_of_equal")[0]
        # the order of equal candidates decides, and so does which of two equal finished hypotheses wins
        if any(_ties_decide(tie_table, tie_memory, None, 1, 3, 5, 2, 0.0, answer)) and not torch.equal(token_first, tied[0]) \
                and not torch.equal(last, tied[0]) and not torch.equal(last, token_first):
            break
    else:
        raise AssertionError("no beam search tie case found")
    return {"table": table, "memory": memory, "mask": CHECK_MASK,
            "bos": 1, "eos": 3, "max_len": 5, "settings": entries, "greedy": greedy,
            "tie_table": tie_table, "tie_memory": tie_memory, "tie_beam_size": 2, "tie_tokens": tied[0],
            "tie_scores": tied[1], "tie_last_tokens": last}


def _mask_repeated(decode, batch):
    """``decode`` fed memory_mask.repeat(k, 1) where memory is memory.repeat_interleave(k, 0): the mask of
    another sequence for most hypotheses (a batched search that repeats the two differently)."""
    def misaligned(tgt_in, memory, memory_mask=None):
        k = tgt_in.shape[0] // batch
        original = None if memory_mask is None else memory_mask[::k]
        return decode(tgt_in, memory, None if original is None else original.repeat(k, 1))
    return misaligned


def _same_answer(a, b):
    return a[0].shape == b[0].shape and torch.equal(a[0], b[0]) and torch.allclose(a[1], b[1], rtol=1e-9, atol=0)
