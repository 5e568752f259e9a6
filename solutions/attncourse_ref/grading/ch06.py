"""Hidden tests for chapter 06: tokenizers, the GPT (against transformers' GPT-2), loss, sampling, KV cache, MLM.

``transformers`` is imported only inside the builders that use it: every chapter's module is
imported when the grading server starts, and that import costs seconds.
"""
import math

import numpy as np
import torch

from .. import llm as ref
from . import fixed, function_case, hidden_test, judged_case, loader_case, module_case

DTYPES = [torch.float32, torch.float64]


def _mostly64(i):
    """float64 in two cases of three: a float32 computation of float64 inputs fails most cases."""
    return torch.float32 if i % 3 == 1 else torch.float64
from attncourse.checks.ch06 import NO_MHA  # noqa: E402

TEXTS = [
    "the cat sat on the mat; the cat ate the rat.",
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer",
    "aaaa abab aaaa baba",
    "学而时习之，不亦说乎？有朋自远方来，不亦乐乎？",
    "naïve café — déjà vu, 🙂🙂 emoji and ümlaut",
    "",
]


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


def _seed(rng):
    torch.manual_seed(int(rng.integers(2**31)))


# ---- character tokenizer ----------------------------------------------------------------------
@hidden_test("ch06.char_vocab")
def char_vocab(rng):
    corpora = TEXTS + ["zyx\nzyx  \t", "".join(rng.permutation(list("hello world, HELLO WORLD!")))]
    return [function_case(ref.char_vocab, [c]) for c in corpora]


@hidden_test("ch06.char_encode")
def char_encode(rng):
    vocab = ref.char_vocab(TEXTS[0] + TEXTS[1])
    cases = [function_case(ref.char_encode, [t, vocab]) for t in ["the rat", TEXTS[1][:30], ""]]
    # Characters the vocabulary lacks: capitals, digits, Chinese.
    cases += [function_case(ref.char_encode, [t, vocab]) for t in ["The RAT 42", "cat 猫 sat", "\u00e9t\u00e9"]]
    return cases


@hidden_test("ch06.char_decode")
def char_decode(rng):
    vocab = ref.char_vocab(TEXTS[3] + "\n abc")
    cases = []
    for n in (0, 1, 7, 25):
        ids = [int(i) for i in rng.integers(0, len(vocab) + 1, size=n)]
        cases.append(function_case(ref.char_decode, [ids, vocab]))
    ids = torch.from_numpy(rng.integers(0, len(vocab) + 1, size=12))        # a tensor of ids is allowed too
    ids[3] = len(vocab)
    cases.append(function_case(ref.char_decode, [ids, vocab]))
    cases.append(function_case(ref.char_decode, [[len(vocab), 0, len(vocab)], vocab]))
    return cases


# ---- byte-pair encoding ---------------------------------------------------------------------------
@hidden_test("ch06.merge_pair")
def merge_pair(rng):
    cases = [function_case(ref.merge_pair, [ids, pair, new]) for ids, pair, new in [
        ([1, 2, 3, 1, 2], (1, 2), 256), ([5, 5, 5, 5, 5], (5, 5), 300), ([7, 7, 7], (7, 7), 256),
        ([], (1, 2), 256), ([1], (1, 2), 256), ([2, 1, 2, 1], (1, 2), 999), ([3, 4], (4, 3), 256)]]
    for _ in range(4):
        ids = [int(i) for i in rng.integers(0, 4, size=int(rng.integers(5, 30)))]
        pair = (int(rng.integers(0, 4)), int(rng.integers(0, 4)))
        cases.append(function_case(ref.merge_pair, [_with_lookalikes(rng, ids, pair), pair, int(rng.integers(256, 400))]))
    # Ids of several digits (tokens made by earlier merges, up to 50,000): an id is a number, not a string
    # of digits or characters; (1, 2) must not match inside 21 or 12.
    for pair in [(1, 2), (11, 1), (256, 300), (5, 5), (1234, 56), (0, 10), (99, 9),
                 (int(rng.integers(256, 50_000)), int(rng.integers(256, 50_000)))]:
        ids = [int(i) for i in rng.integers(0, 3000, size=int(rng.integers(8, 30)))]
        ids[3:5] = list(pair)                                 # at least one real occurrence
        cases.append(function_case(ref.merge_pair, [_with_lookalikes(rng, ids, pair), pair,
                                                    int(rng.integers(256, 60_000))]))
    return cases


def _with_lookalikes(rng, ids, pair):
    """``ids`` with look-alikes of ``pair`` inserted: ids whose decimal digits end with pair[0]'s and
    begin with pair[1]'s (91, 27 for (1, 2)), next to each other and next to real halves of the pair, and one more real pair."""
    a, b = (str(x) for x in pair)
    before, after = int("9" + a), int(b + "7")
    out = list(ids)
    for look in ([before, after], [before, pair[1]], list(pair), [pair[0], after], [before, int(b + "0")]):
        at = int(rng.integers(0, len(out) + 1))
        out[at:at] = look
    return out


@hidden_test("ch06.bpe_train")
def bpe_train(rng):
    cases = [function_case(ref.bpe_train, [t, n]) for t, n in [
        (TEXTS[0], 10), (TEXTS[1], 20), (TEXTS[2], 8),
        ("ab ba cd dc", 3),              # every pair once: no merge at all
        ("xyxy zwzw", 5),                # ties between (x, y), (z, w) and others: the smallest pair wins
        (TEXTS[3], 12), (TEXTS[4], 12), (TEXTS[1], 0), ("", 4)]]
    letters = "".join(_pick(rng, list("abcd ")) for _ in range(200))
    cases.append(function_case(ref.bpe_train, [letters, int(rng.integers(10, 30))]))
    return cases


@hidden_test("ch06.bpe_encode")
def bpe_encode(rng):
    merges = ref.bpe_train(TEXTS[1] + TEXTS[0] + TEXTS[3], 40)
    texts = ["the question is to be", "学而时习之", TEXTS[4], "", "tttthe the"]
    cases = [function_case(ref.bpe_encode, [t, merges]) for t in texts]
    cases.append(function_case(ref.bpe_encode, [TEXTS[1], merges[:5]]))
    cases.append(function_case(ref.bpe_encode, [TEXTS[2], ref.bpe_train(TEXTS[2], 6)]))
    # Many merges over a small alphabet: merges overlap and build on each other, so only applying them in
    # the order they were learned gives these ids (not merging the leftmost mergeable pair first).
    for _ in range(8):
        corpus = "".join(_pick(rng, list("abc ")) for _ in range(400))
        merges = ref.bpe_train(corpus, int(rng.integers(20, 40)))
        text = "".join(_pick(rng, list("abc ")) for _ in range(int(rng.integers(40, 80))))
        cases.append(function_case(ref.bpe_encode, [text, merges]))
    return cases


@hidden_test("ch06.bpe_decode")
def bpe_decode(rng):
    merges = ref.bpe_train(TEXTS[3] + TEXTS[4] + TEXTS[0], 40)
    texts = [TEXTS[3], TEXTS[4], "the cat", "", "来 🙂 ü"]
    cases = [function_case(ref.bpe_decode, [ref.bpe_encode(t, merges), merges]) for t in texts]
    cases.append(function_case(ref.bpe_decode, [[0xE4, 0x41, 0xFF], merges]))    # invalid UTF-8 -> U+FFFD
    return cases


# ---- the GPT ----------------------------------------------------------------------------------------
def _randomize(module, rng, scale=0.5):
    """Weights far from the default initialisation (LayerNorm gains and biases included), so that
    every part of the computation shows in the output."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.from_numpy(rng.standard_normal(tuple(p.shape)) * scale).to(p.dtype)
            p.copy_(1.0 + noise if name.endswith("ln_1.weight") or name.endswith("ln_2.weight")
                    or name.endswith("ln_f.weight") else noise)
    return module


def _attention_init(rng):
    n_head = _pick(rng, [2, 3, 4])
    return {"n_embd": n_head * int(rng.integers(1, 5)), "n_head": n_head}


def _past(rng, b, n_head, t_past, head_dim, dtype):
    shape = (b, n_head, t_past, head_dim)
    return (torch.from_numpy(rng.standard_normal(shape)).to(dtype),
            torch.from_numpy(rng.standard_normal(shape)).to(dtype))


@hidden_test("ch06.attention", forbid=NO_MHA)
def attention(rng):
    cases = []
    for i in range(8):
        init = _attention_init(rng)
        train = i in (1, 2, 4, 5, 7)              # training mode: dropout on the weights and on the output
        init["dropout"] = 0.5 if train else [0.0, 0.3][i % 2 == 0]   # evaluation mode: dropout must do nothing
        dtype = DTYPES[i % 2]
        module = _randomize(ref.CausalSelfAttention(**init), rng).to(dtype)
        b, t = int(rng.integers(1, 4)), int(rng.integers(2, 8))
        x = torch.from_numpy(rng.standard_normal((b, t, init["n_embd"]))).to(dtype)
        cases.append(module_case(module, init, [x], train_seed=_train_seed(rng) if train else None,
                                 describe=_train_describe(module, init, x) if train else ""))
    return cases


def _train_seed(rng):
    return int(rng.integers(2**31))


def _train_describe(module, init, x):
    sizes = ", ".join(f"{k}={v}" for k, v in init.items())
    return (f"{type(module).__name__}({sizes}) in training mode (dropout active, the same torch.manual_seed "
            f"before both calls) on ({list(x.shape)} {str(x.dtype)[6:]})")


@hidden_test("ch06.attention_cache", forbid=NO_MHA)
def attention_cache(rng):
    cases = []
    for i in range(8):
        init = {**_attention_init(rng), "dropout": [0.0, 0.3][i % 2]}     # evaluation mode: dropout does nothing
        dtype = DTYPES[i % 2]
        module = _randomize(ref.CausalSelfAttention(**init), rng).to(dtype)
        b, t_past, t = int(rng.integers(1, 4)), int(rng.integers(1, 7)), (1 if i < 4 else int(rng.integers(2, 5)))
        x = torch.from_numpy(rng.standard_normal((b, t, init["n_embd"]))).to(dtype)
        past = _past(rng, b, init["n_head"], t_past, init["n_embd"] // init["n_head"], dtype)
        cases.append(module_case(module, init, [x], {"past_kv": past}))
    return cases


@hidden_test("ch06.block", forbid=NO_MHA)
def block(rng):
    cases = []
    for i in range(6):
        init = _attention_init(rng)
        train = i in (1, 2, 3)                       # training mode: the attention's and the MLP's dropout
        init["dropout"] = 0.5 if train else [0.0, 0.3][i % 2 == 0]   # evaluation mode: dropout must do nothing
        dtype = DTYPES[i % 2]
        module = _randomize(ref.Block(**init), rng).to(dtype)
        b, t = int(rng.integers(1, 4)), int(rng.integers(2 if train else 1, 6))
        x = torch.from_numpy(rng.standard_normal((b, t, init["n_embd"]))).to(dtype)
        kwargs = {}
        if i >= 4:                                   # the cache is passed on to the attention
            kwargs["past_kv"] = _past(rng, b, init["n_head"], int(rng.integers(1, 5)),
                                      init["n_embd"] // init["n_head"], dtype)
        cases.append(module_case(module, init, [x], kwargs, train_seed=_train_seed(rng) if train else None,
                                 describe=_train_describe(module, init, x) if train else ""))
    return cases


def _gpt_init(rng):
    n_head = _pick(rng, [1, 2, 3])
    return {"vocab_size": int(rng.integers(5, 30)), "block_size": int(rng.integers(6, 14)),
            "n_layer": int(rng.integers(1, 4)), "n_head": n_head, "n_embd": n_head * int(rng.integers(2, 5))}


def gpt2_oracle(init, rng, dtype):
    """transformers' GPT2LMHeadModel with these sizes, randomly initialised here (no download), its
    weights spread far from the default initialisation, in eval mode."""
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel
    transformers.logging.set_verbosity_error()
    _seed(rng)
    config = GPT2Config(vocab_size=init["vocab_size"], n_positions=init["block_size"], n_embd=init["n_embd"],
                        n_layer=init["n_layer"], n_head=init["n_head"], bos_token_id=0, eos_token_id=0,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf = GPT2LMHeadModel(config).to(dtype).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    return hf


@hidden_test("ch06.gpt", forbid=NO_MHA)
def gpt(rng):
    """Your GPT with GPT-2's weights must give GPT-2's logits (transformers' GPT2LMHeadModel)."""
    cases = []
    for i in range(5):
        init = _gpt_init(rng)
        dtype = DTYPES[i % 2]
        hf = gpt2_oracle(init, rng, dtype)
        init["dropout"] = [0.0, 0.3][i % 2]                         # evaluation mode: dropout does nothing
        ours = ref.load_gpt2_weights(ref.GPT(**init).to(dtype), hf.state_dict())
        b, t = int(rng.integers(1, 4)), int(rng.integers(1, init["block_size"] + 1))
        idx = torch.from_numpy(rng.integers(0, init["vocab_size"], size=(b, t)))
        sizes = ", ".join(f"{k}={v}" for k, v in init.items())
        case = module_case(ours, init, [idx], describe=f"GPT({sizes}) with a random GPT-2's weights on idx {[b, t]} "
                           f"{str(dtype)[6:]}, against GPT2LMHeadModel")
        with torch.no_grad():
            case.expected = [hf(idx).logits.numpy()]
        cases.append(case)
    # Training mode (dropout 0.3 on the embeddings, the attention weights and each residual branch),
    # against the reference after the same torch.manual_seed: a GPT that skips a dropout fails these.
    for i in range(6):
        init = {**_gpt_init(rng), "dropout": 0.3}
        model = _randomize(ref.GPT(**init), rng).to(DTYPES[i % 2])
        b, t = int(rng.integers(1, 4)), int(rng.integers(2, init["block_size"] + 1))
        idx = torch.from_numpy(rng.integers(0, init["vocab_size"], size=(b, t)))
        cases.append(module_case(model, init, [idx], train_seed=_train_seed(rng), describe=_train_describe(model, init, idx)))
    return cases


@hidden_test("ch06.gpt_cache", forbid=NO_MHA)
def gpt_cache(rng):
    """forward with a cache: the logits and caches the reference gives, whatever the prompt length."""
    cases = []
    for i in range(7):
        init = _gpt_init(rng)
        dtype = DTYPES[i % 2]
        model = _randomize(ref.GPT(**init), rng).to(dtype).eval()
        b = int(rng.integers(1, 3))
        t_past = int(rng.integers(1, init["block_size"] - 1))
        t = 1 if i < 3 else int(rng.integers(1, init["block_size"] - t_past + 1))
        prompt = torch.from_numpy(rng.integers(0, init["vocab_size"], size=(b, t_past)))
        idx = torch.from_numpy(rng.integers(0, init["vocab_size"], size=(b, t)))
        if i == 6:       # the first call: no past yet, a cache comes back
            cases.append(module_case(model, init, [prompt], {"use_cache": True}))
            continue
        with torch.no_grad():
            _, past = model(prompt, use_cache=True)
        past = [tuple(kv) for kv in past]
        cases.append(module_case(model, init, [idx], {"past_kv": past, "use_cache": i != 5}))
    return cases


@hidden_test("ch06.load_gpt2")
def load_gpt2(rng):
    cases = []
    for i in range(4):
        init = _gpt_init(rng)
        dtype = DTYPES[i % 2]
        state = {k: v.clone() for k, v in gpt2_oracle(init, rng, dtype).state_dict().items()}
        if i == 3:       # older checkpoints also store each layer's causal-mask buffer: not a parameter
            for layer in range(init["n_layer"]):
                state[f"transformer.h.{layer}.attn.bias"] = torch.ones(1, 1, init["block_size"], init["block_size"],
                                                                       dtype=torch.bool).tril()
        target = ref.GPT(**init).to(dtype)
        cases.append(loader_case(ref.load_gpt2_weights, target, [state],
                                 describe=f"a GPT2LMHeadModel state dict ({init}, {str(dtype)[6:]}, "
                                          f"{len(state)} keys) into a GPT of the same sizes"))
    return cases


# ---- the loss and sampling -----------------------------------------------------------------------------
@hidden_test("ch06.lm_loss")
def lm_loss(rng):
    cases = []
    for i in range(8):
        dtype = _mostly64(i)
        b, t, v = int(rng.integers(1, 5)), int(rng.integers(2, 9)), int(rng.integers(3, 12))
        logits = torch.from_numpy(rng.standard_normal((b, t, v)) * 2).to(dtype)
        idx = torch.from_numpy(rng.integers(1, v, size=(b, t)))
        kwargs = {}
        if i >= 3:                                  # padded rows: a suffix of pad_id (0) after >= 2 tokens
            lengths = rng.integers(2, t + 1, size=b)
            idx = idx.masked_fill(torch.arange(t)[None, :] >= torch.from_numpy(lengths)[:, None], 0)
            kwargs["pad_id"] = 0
        cases.append(function_case(ref.lm_loss, [logits, idx], kwargs, rng=rng, grad_args=(0,) if i % 2 else ()))
    return cases


def _logits(rng, shape, dtype, integer=False):
    x = rng.integers(-3, 4, size=shape).astype(float) if integer else rng.standard_normal(shape) * 2
    return torch.from_numpy(x).to(dtype)


@hidden_test("ch06.sampling")
def sampling(rng):
    cases = []
    for i in range(10):
        dtype = _mostly64(i)
        shape = _pick(rng, [(7,), (3, 9), (2, 2, 6)])
        temperature = _pick(rng, [0.5, 0.8, 1.0, 1.7])
        top_k = None if i < 3 else int(rng.integers(1, shape[-1] + 2))
        logits = _logits(rng, shape, dtype, integer=i >= 6)    # integer logits: ties at the k-th
        cases.append(function_case(ref.next_token_probs, [logits], {"temperature": temperature, "top_k": top_k}))
    # Ties with the k-th largest logit: all of them stay.
    tied = torch.tensor([[1.0, 3.0, 2.0, 3.0, 2.0, 0.0], [5.0, 5.0, 5.0, 1.0, 0.0, 5.0]])
    cases += [function_case(ref.next_token_probs, [tied.to(dtype)], {"top_k": k}) for k, dtype in
              [(3, torch.float64), (2, torch.float32), (1, torch.float64)]]
    return cases


def _safe_top_p(rng, probs):
    """A top_p at least 1e-3 away from every cumulative sum of the ranked probabilities: rounding cannot
    decide which tokens are kept."""
    ranked = torch.sort(probs, dim=-1, descending=True, stable=True).values.cumsum(-1).flatten().tolist()
    while True:
        p = float(rng.uniform(0.2, 0.95))
        if all(abs(p - c) > 1e-3 for c in ranked):
            return p


@hidden_test("ch06.top_p")
def top_p(rng):
    cases = []
    # Ranked 0.5, 0.25, 0.125, 0.0625, 0.0625: each top_p lies strictly between two cumulative sums, so
    # the token that crosses it decides; with ties ranked by lower id first.
    dyadic = torch.log(torch.tensor([0.125, 0.5, 0.0625, 0.25, 0.0625], dtype=torch.float64))
    for p in (0.3, 0.6, 0.8, 0.9, 0.95):
        cases.append(function_case(ref.next_token_probs, [dyadic], {"top_p": p}))
    ties = torch.log(torch.tensor([0.2, 0.3, 0.2, 0.3], dtype=torch.float64))
    cases.append(function_case(ref.next_token_probs, [ties], {"top_p": 0.25}))
    cases.append(function_case(ref.next_token_probs, [ties], {"top_p": 0.7}))
    for i in range(2):
        dtype = _mostly64(i)
        logits = _logits(rng, _pick(rng, [(8,), (3, 10)]), dtype)
        kwargs = {"temperature": _pick(rng, [0.7, 1.0, 1.5])}
        if i >= 1:
            kwargs["top_k"] = int(rng.integers(2, 6))
        probs = ref.next_token_probs(logits.double(), kwargs["temperature"], kwargs.get("top_k"))
        kwargs["top_p"] = _safe_top_p(rng, probs)
        cases.append(function_case(ref.next_token_probs, [logits], kwargs))
    # Long rows (more than 16 tokens: PyTorch's sort keeps tied values in order there only when asked to
    # be stable) of integer logits, with top_p crossed inside a group of tied tokens: the lower ids stay.
    for i in range(12):
        dtype = torch.float32 if i % 4 == 1 else torch.float64       # float64 in three cases of four
        cases.append(_tied_top_p_case(rng, dtype, top_k=int(rng.integers(18, 30)) if i % 4 == 3 else None))
    return cases


def _tied_top_p_case(rng, dtype, top_k=None):
    while True:
        n = int(rng.integers(20, 40))
        # integer logits times a scale that float32 cannot hold exactly: ties stay ties
        logits = (_logits(rng, _pick(rng, [(n,), (2, n)]), torch.float64, integer=True)
                  * float(rng.uniform(1.5, 2.5))).to(dtype)
        kwargs = {"temperature": _pick(rng, [0.8, 1.0, 2.0])}
        if top_k is not None:
            kwargs["top_k"] = top_k
        probs = ref.next_token_probs(logits.double(), kwargs["temperature"], top_k)
        ranked = torch.sort(probs.reshape(-1, n)[0], descending=True, stable=True).values
        sums = [0.0] + ranked.cumsum(0).tolist()
        # places j where the token that crosses top_p ties with the next one, and top_p fits strictly inside
        inside = [j for j in range(n - 1) if ranked[j] == ranked[j + 1] > 0 and sums[j + 1] - sums[j] > 4e-3
                  and sums[j] > 0]
        if not inside:
            continue
        j = int(inside[int(rng.integers(len(inside)))])
        top_p = float(rng.uniform(sums[j] + 1e-3, sums[j + 1] - 1e-3))
        every = torch.sort(probs, dim=-1, descending=True, stable=True).values.cumsum(-1).flatten().tolist()
        # ... and where the order of the tied tokens decides what is kept (an unstable sort keeps others)
        ranked, order = torch.sort(probs, dim=-1, descending=True)
        unstable = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, ranked.cumsum(-1) - ranked < top_p)
        if all(abs(top_p - c) > 1e-3 for c in every) and \
                bool((unstable != (ref.next_token_probs(probs.log(), top_p=top_p) > 0)).any()):
            return function_case(ref.next_token_probs, [logits], {**kwargs, "top_p": top_p})


def chi2_limit(df, p=1e-6):
    """The chi-square statistic that an honest draw exceeds with probability ``p``: the exact quantile
    (Wilson and Hilferty's approximation, used before, is 15% too low at df = 1 and 5.5% at df = 4, so a
    correct sampler failed about 3 times as often as the page and the messages said)."""
    from scipy.stats import chi2
    return float(chi2.isf(p, df))


def _chi2(counts, expected):
    keep = expected > 0
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum()), int(keep.sum()) - 1


def _sample_judge(probs, n_rows_stat):
    probs = probs.numpy()

    def judge(got):
        if len(got) != 1:
            return f"expected one tensor of token ids, got {len(got)} values"
        ids = got[0]
        if ids.shape != probs.shape[:-1]:
            return f"the ids have shape {list(ids.shape)}, expected {list(probs.shape[:-1])} (one per row)"
        if ids.dtype != np.int64:
            return f"the ids have dtype {ids.dtype}, expected int64 (torch.long)"
        flat, rows = ids.reshape(-1), probs.reshape(-1, probs.shape[-1])
        if ((flat < 0) | (flat >= rows.shape[-1])).any():
            return "some ids are outside 0 .. V - 1"
        if (rows[np.arange(len(flat)), flat] == 0).any():
            return "some drawn tokens have probability 0"
        if n_rows_stat:
            counts = np.bincount(flat, minlength=rows.shape[-1]).astype(float)
            stat, df = _chi2(counts, rows[0] * len(flat))
            if stat > chi2_limit(df):
                freq = counts / len(flat)
                return (f"over {len(flat):,} draws from the same row, the frequencies {np.round(freq, 3).tolist()} "
                        f"do not follow the probabilities {np.round(rows[0], 3).tolist()} (chi-square {stat:.0f} "
                        f"with {df} degrees of freedom; an honest sampler exceeds {chi2_limit(df):.0f} once in a million)")
        return None
    return judge


def _seeded(rng):
    return torch.Generator().manual_seed(int(rng.integers(2**31)))


@hidden_test("ch06.sample")
def sample(rng):
    """Every case is called twice with generators of the same seed (torch's global seed differs): the
    ids must agree. Statistics: 20,000 draws from one distribution pass a chi-square test at the 1e-6
    level; a sampler that moves 0.015 of probability between two tokens of 0.1 fails it with probability
    above 0.99. Plus shapes, dtype and that no zero-probability token is ever drawn."""
    cases = []
    long_row = ref.next_token_probs(torch.from_numpy(rng.standard_normal(40)), temperature=0.7, top_k=12, top_p=0.9)
    for dtype, row in [(torch.float64, [0.5, 0.0, 0.3, 0.15, 0.05]), (torch.float32, [0.1] * 10),
                       (torch.float64, long_row.tolist())]:
        probs = torch.tensor(row, dtype=dtype).expand(20_000, len(row)).contiguous()
        shown = row if len(row) <= 10 else f"a row of {len(row)} probabilities, {int((long_row > 0).sum())} of them > 0"
        cases.append(judged_case([probs, _seeded(rng)], judge=_sample_judge(probs, True), repeat=2,
                                 describe=f"20,000 rows of {shown} ({str(dtype)[6:]}), twice with the same generator seed"))
    probs = ref.next_token_probs(torch.from_numpy(rng.standard_normal((2, 3, 7))), top_k=3)
    cases.append(judged_case([probs, _seeded(rng)], judge=_sample_judge(probs, False), repeat=2,
                             describe="probs [2, 3, 7] after top-k 3, twice with the same generator seed"))
    one_hot = torch.eye(6, dtype=torch.float64)[torch.from_numpy(rng.integers(0, 6, size=9))]
    cases.append(judged_case([one_hot, _seeded(rng)], judge=_sample_judge(one_hot, False), repeat=2,
                             describe="one-hot rows [9, 6], twice with the same generator seed"))
    return cases


# ---- masked language modelling ------------------------------------------------------------------------
SIGMAS = 5        # statistical tolerances: this many standard deviations of an honest draw


def _mlm_batch(rng, b, t, vocab_size, n_special=4, words=None):
    """Token ids 0 .. n_special - 1 are special ([PAD], [CLS], [SEP], [MASK] = 3): each row is
    [CLS] words [SEP] [PAD]..., words drawn from n_special .. (words or vocab_size) - 1."""
    tokens = torch.from_numpy(rng.integers(n_special, words or vocab_size, size=(b, t)))
    lengths = torch.from_numpy(rng.integers(t // 2, t + 1, size=b))
    pos = torch.arange(t)[None, :]
    tokens[:, 0] = 1
    tokens = torch.where(pos == lengths[:, None] - 1, 2, tokens)
    tokens = torch.where(pos >= lengths[:, None], 0, tokens)
    return tokens, tokens < n_special


def _mlm_arrays(got, tokens):
    if len(got) != 2:
        return None, f"expected (inputs, labels), got {len(got)} values"
    inputs, labels = got
    for name, a in (("inputs", inputs), ("labels", labels)):
        if a.shape != tuple(tokens.shape):
            return None, f"{name} has shape {list(a.shape)}, expected {list(tokens.shape)}"
        if a.dtype != np.int64:
            return None, f"{name} has dtype {a.dtype}, expected int64 (torch.long)"
    return (inputs, labels), None


def _mlm_properties_judge(tokens, special):
    tok, spec = tokens.numpy(), special.numpy()

    def judge(got):
        arrays, why = _mlm_arrays(got, tokens)
        if why:
            return why
        inputs, labels = arrays
        chosen = labels != ref.IGNORE_INDEX
        if (chosen & spec).any():
            return f"{int((chosen & spec).sum())} special positions were chosen for prediction; never choose them"
        if (labels[chosen] != tok[chosen]).any():
            return "at chosen positions the label must be the original token"
        if (inputs[~chosen] != tok[~chosen]).any():
            return "positions that are not chosen must keep their original token in the inputs"
        return None
    return judge


def _mlm_statistics_judge(tokens, special, mask_id, vocab_size, mlm_prob):
    tok, spec = tokens.numpy(), special.numpy()

    def judge(got):
        arrays, why = _mlm_arrays(got, tokens)
        if why:
            return why
        inputs, labels = arrays
        chosen = (labels != ref.IGNORE_INDEX) & ~spec
        n = int(chosen.sum())
        n_open = int((~spec).sum())
        rate, tol = n / n_open, SIGMAS * math.sqrt(mlm_prob * (1 - mlm_prob) / n_open)
        if abs(rate - mlm_prob) > tol:
            return f"{rate:.3f} of the non-special positions were chosen, expected {mlm_prob} +- {tol:.3f}"
        got_in, orig = inputs[chosen], tok[chosen]
        masked = got_in == mask_id
        kept = got_in == orig
        randomised = ~masked & ~kept
        # A random draw equals the original (or the mask id) with probability 1/V each: expected shares.
        expect = {"mask": 0.8 + 0.1 / vocab_size, "random": 0.1 * (1 - 2 / vocab_size), "kept": 0.1 + 0.1 / vocab_size}
        share = {"mask": masked.mean(), "random": randomised.mean(), "kept": kept.mean()}
        tol = {k: SIGMAS * math.sqrt(q * (1 - q) / n) for k, q in expect.items()}
        if any(abs(share[k] - expect[k]) > tol[k] for k in expect):
            return (f"of the {n:,} chosen positions {share['mask']:.3f} became the mask token, {share['random']:.3f} "
                    f"another token and {share['kept']:.3f} stayed; expected 0.8 / 0.1 / 0.1 "
                    f"(tolerances {tol['mask']:.3f} / {tol['random']:.3f} / {tol['kept']:.3f})")
        drawn = got_in[randomised]
        if len(drawn) and (drawn.min() < 0 or drawn.max() >= vocab_size):
            return "random replacements must be token ids in 0 .. vocab_size - 1"
        if vocab_size <= 64:
            # A small vocabulary: every id on its own. A draw that equals the mask id or the position's own token
            # looks masked or kept, so id j shows with weight 1 - (share of chosen positions holding j), the mask
            # id never: then a chi-square test at the 1e-6 level (ids 1 .. V - 1 leave out id 0, and fail).
            ids = [j for j in range(vocab_size) if j != mask_id]
            weight = 1 - np.bincount(orig, minlength=vocab_size)[ids] / len(orig)
            expected = weight / weight.sum() * len(drawn)
            counts = np.bincount(drawn, minlength=vocab_size)[ids].astype(float)
            stat, df = _chi2(counts, expected)
            if stat > chi2_limit(df):
                return (f"the {len(drawn)} random replacements are not spread over every id of 0 .. {vocab_size - 1} "
                        f"as a uniform draw is: ids {ids} appear {counts.astype(int).tolist()} times, expected about "
                        f"{np.round(expected).astype(int).tolist()} (draw them with torch.randint(vocab_size, ...): "
                        "every id from 0 to vocab_size - 1)")
            return None
        # Their distribution, not only their mean: ten equal bins of 0 .. V - 1 (the batch's words all lie
        # in the first twentieth), a chi-square test at the 1e-6 level.
        edges = np.linspace(0, vocab_size, 11)
        counts = np.histogram(drawn, bins=edges)[0].astype(float)
        expected = np.diff(np.ceil(edges)) / vocab_size * len(drawn)
        stat, df = _chi2(counts, expected)
        if len(drawn) > 50 and stat > chi2_limit(df):
            return (f"the {len(drawn)} random replacements are not uniform over 0 .. {vocab_size - 1}: in ten equal "
                    f"ranges of ids they number {counts.astype(int).tolist()}, expected about "
                    f"{round(len(drawn) / 10)} each (draw them with torch.randint(vocab_size, ...), not from the batch)")
        return None
    return judge


@hidden_test("ch06.mlm_properties")
def mlm_properties(rng):
    cases = []
    for b, t, v in [(4, 12, 30), (16, 64, 1000), (2, 5, 10), (32, 32, 50)]:
        tokens, special = _mlm_batch(rng, b, t, v)
        cases.append(judged_case([tokens, special, 3, v], {"generator": _seeded(rng)},
                                 judge=_mlm_properties_judge(tokens, special), repeat=2,
                                 describe=f"tokens {[b, t]} with special positions, vocab_size={v}, "
                                          "twice with the same generator seed"))
    return cases


@hidden_test("ch06.mlm_statistics")
def mlm_statistics(rng):
    """Over 32,768 positions per case (about 24,000 of them not special) the share chosen and the 80/10/10
    split must lie within 5 standard deviations of an honest draw's (e.g. 0.15 +- 0.011 chosen, 0.8 +-
    0.033 masked), and the random replacements must pass a chi-square test of uniformity over the whole
    vocabulary (the batch's words use only its first twentieth), id by id in vocabularies of 8 to 16 ids (in
    most cases: about 90 to 180 replacements per id, so a draw that never gives id 0 fails). Each case is called
    twice with generators of the same seed: the same masking."""
    cases = []
    # (vocab size, mlm_prob, words 4 .. words - 1); a vocabulary of at most 16 ids tests every id on its own
    for v, p, words in [(1000, 0.15, 50), (200, 0.3, 10), (500, 0.15, 25), (12, 0.5, 12), (8, 0.6, 8),
                        (16, 0.6, 16), (10, 0.6, 10), (14, 0.6, 14)]:
        tokens, special = _mlm_batch(rng, 128, 256, v, words=words)
        kwargs = {"generator": _seeded(rng)} if p == 0.15 else {"mlm_prob": p, "generator": _seeded(rng)}
        cases.append(judged_case([tokens, special, 3, v], kwargs, repeat=2,
                                 judge=_mlm_statistics_judge(tokens, special, 3, v, p),
                                 describe=f"tokens [128, 256] (words 4 .. {words - 1}), vocab_size={v}, mlm_prob={p}, "
                                          "twice with the same generator seed"))
    return cases


# ---- the visible checks' stored cases -----------------------------------------------------------------
CHECK_INIT = {"vocab_size": 11, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 8}


def _attention_variant(module, x, past=None, order="qkv", transpose=True, top_left=False):
    """The reference attention with one known mistake, for the visible checks to recognise it."""
    b, t, c = x.shape
    parts = dict(zip(order, module.c_attn(x).split(c, dim=-1)))
    heads = (lambda u: u.view(b, t, module.n_head, c // module.n_head).transpose(1, 2)) if transpose else \
        (lambda u: u.reshape(b, module.n_head, t, c // module.n_head))
    q, k, v = heads(parts["q"]), heads(parts["k"]), heads(parts["v"])
    if past is not None:
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=past is None or top_left)
    return module.c_proj(y.transpose(1, 2).reshape(b, t, c))


def check_data():
    """Fixed inputs and expected values for the visible checks (tools/make_check_data.py writes them)."""
    rng = np.random.default_rng(6)
    bpe_text = "low lower lowest newer newest 新新新的 the the"
    merges = ref.bpe_train(bpe_text, 12)
    tie_text = "xyxy zwzw"
    corpus = "hello world\nHELLO!"
    tokenizers = {
        "corpus": corpus, "vocab": ref.char_vocab(corpus),
        "encode_text": "low, World", "encoded": ref.char_encode("low, World", ref.char_vocab(corpus)),
        "bpe_text": bpe_text, "merges": merges, "tie_text": tie_text, "tie_merges": ref.bpe_train(tie_text, 3),
        "encoded_bpe": ref.bpe_encode("the newest lowest 新的", merges),
    }

    torch.manual_seed(6)
    attn = _randomize(ref.CausalSelfAttention(8, 2), rng).double().eval()
    x = fixed((2, 5, 8), 61)
    y, (k, v) = attn(x)
    past = (fixed((2, 2, 3, 4), 62), fixed((2, 2, 3, 4), 63))
    xc = fixed((2, 2, 8), 64)
    yc, (kc, vc) = attn(xc, past)
    training = {}
    for name, (p_attn, p_resid) in {"y_train": (0.5, 0.5), "y_train_resid_only": (0.0, 0.5)}.items():
        dropping = ref.CausalSelfAttention(8, 2, 0.5).double()
        dropping.load_state_dict(attn.state_dict())
        dropping.dropout, dropping.resid_dropout.p = p_attn, p_resid
        torch.manual_seed(13)
        training[name] = dropping.train()(x)[0]
    attention = {"init": {"n_embd": 8, "n_head": 2}, "state": dict(attn.state_dict()), "x": x, "y": y, "k": k, "v": v,
                 **training,
                 "split_orders": {o: _attention_variant(attn, x, order=o) for o in ("kqv", "vkq", "qvk", "kvq", "vqk")},
                 "y_no_transpose": _attention_variant(attn, x, transpose=False),
                 "past_k": past[0], "past_v": past[1], "x_new": xc, "y_cached": yc, "k_cached": kc, "v_cached": vc,
                 "y_cached_top_left": _attention_variant(attn, xc, past, top_left=True)}

    blk = _randomize(ref.Block(8, 2), rng).double().eval()
    post = blk.ln_1(x + blk.attn(x)[0])
    block = {"init": {"n_embd": 8, "n_head": 2}, "state": dict(blk.state_dict()), "x": x, "y": blk(x)[0],
             "y_post_norm": blk.ln_2(post + blk.mlp(post)), "past_k": past[0], "past_v": past[1], "x_new": xc,
             "y_cached": blk(xc, past)[0]}

    hf = gpt2_oracle(CHECK_INIT, rng, torch.float64)
    model = ref.load_gpt2_weights(ref.GPT(**CHECK_INIT).double(), hf.state_dict())
    idx = torch.from_numpy(rng.integers(0, CHECK_INIT["vocab_size"], size=(2, 8)))
    h = model.drop(model.wte(idx) + model.wpe(torch.arange(8)))
    for layer in model.h:
        h = layer(h)[0]
    gpt = {"init": CHECK_INIT, "state": dict(model.state_dict()), "idx": idx, "logits": hf(idx).logits,
           "logits_without_ln_f": torch.nn.functional.linear(h, model.wte.weight),
           "hf_state": dict(hf.state_dict()),
           "parameters": [[name, list(p.shape)] for name, p in sorted(model.named_parameters())]}

    logits, idx = fixed((2, 5, 7), 66) * 2, torch.from_numpy(rng.integers(1, 7, size=(2, 5)))
    padded = idx.clone()
    padded[1, 3:] = 0
    flat = lambda lg, tg: torch.nn.functional.cross_entropy(lg.reshape(-1, 7), tg.reshape(-1))
    with torch.enable_grad():                    # make_check_data runs this under no_grad
        lg = logits.clone().requires_grad_(True)
        grad = torch.autograd.grad(ref.lm_loss(lg, idx), lg)[0]
    loss = {"logits": logits, "idx": idx, "loss": ref.lm_loss(logits, idx).item(), "grad": grad,
            "loss_unshifted": flat(logits, idx).item(), "loss_backwards": flat(logits[:, 1:], idx[:, :-1]).item(),
            "idx_padded": padded, "loss_padded": ref.lm_loss(logits, padded, pad_id=0).item(),
            "loss_pad_counted": ref.lm_loss(logits, padded).item()}

    logits = fixed((2, 6), 65) * 2
    ties = torch.tensor([1.0, 3.0, 2.0, 3.0, 2.0, 0.0], dtype=torch.float64)
    sampling = {"logits": logits, "t07": ref.next_token_probs(logits, 0.7), "t10": ref.next_token_probs(logits),
                "t07_times": ref.next_token_probs(logits * 0.7), "k3": ref.next_token_probs(logits, top_k=3),
                "ties": ties, "ties_k3": ref.next_token_probs(ties, top_k=3)}
    return {"tokenizers": tokenizers, "attention": attention, "block": block, "gpt": gpt, "loss": loss,
            "sampling": sampling, **_gqa_check_data(np.random.default_rng(66)), "window": _window_check_data()}


# ---- grouped-query attention ------------------------------------------------------------------------------
# (n_head, n_kv_head) in turn: 1 < n_kv_head < n_head in six of ten (where the grouping shows), multi-query
# (n_kv_head = 1) and multi-head (n_kv_head = n_head) in two each.
GQA_SHAPES = [(4, 2), (6, 3), (4, 1), (6, 2), (4, 4), (6, 3), (4, 2), (6, 1), (6, 2), (2, 2)]


def _gqa_init(rng, i):
    n_head, n_kv_head = GQA_SHAPES[i % len(GQA_SHAPES)]
    return {"n_embd": n_head * int(rng.integers(1, 4)), "n_head": n_head, "n_kv_head": n_kv_head}


def _gqa_describe(init, x, past=None, train=False):
    sizes = ", ".join(f"{k}={v}" for k, v in init.items())
    shape, dtype = list(x.shape), str(x.dtype)[6:]
    if train:
        return (f"GroupedQueryAttention({sizes}) in training mode (dropout active, the same torch.manual_seed before "
                f"both calls) on x {shape} {dtype}")
    if past is not None:
        return f"GroupedQueryAttention({sizes}) on x {shape} {dtype}, past_kv of {past[0].shape[2]} tokens ({list(past[0].shape)})"
    return f"GroupedQueryAttention({sizes}) on x {shape} {dtype}"


@hidden_test("ch06.gqa", forbid=NO_MHA)
def gqa(rng):
    """Twelve cases, float64 in two of three; training mode (dropout 0.5) in four; evaluation mode with a nonzero
    dropout, which must then do nothing, in seven, and with none in one; the returned cache must hold n_kv_head
    heads (a cache of repeated keys has the wrong shape in every case with n_kv_head < n_head)."""
    cases = []
    for i in range(12):
        init = _gqa_init(rng, i)
        train = i in (1, 3, 6, 8)
        init["dropout"] = 0.5 if train else (0.0 if i == 5 else 0.3)    # evaluation mode: dropout must do nothing
        dtype = _mostly64(i)
        module = _randomize(ref.GroupedQueryAttention(**init), rng).to(dtype)
        b, t = int(rng.integers(1, 4)), int(rng.integers(2, 8))
        x = torch.from_numpy(rng.standard_normal((b, t, init["n_embd"]))).to(dtype)
        cases.append(module_case(module, init, [x], train_seed=_train_seed(rng) if train else None,
                                 describe=_gqa_describe(init, x, train=train)))
    return cases


@hidden_test("ch06.gqa_cache", forbid=NO_MHA)
def gqa_cache(rng):
    """Eight cases with a cache of n_kv_head heads: one new token in three, two to four in five; a nonzero dropout
    in six, which evaluation mode must ignore."""
    cases = []
    for i in range(8):
        init = {**_gqa_init(rng, i + 3), "dropout": 0.0 if i % 4 == 0 else 0.3}  # evaluation mode: dropout does nothing
        dtype = _mostly64(i)
        module = _randomize(ref.GroupedQueryAttention(**init), rng).to(dtype)
        b, t_past, t = int(rng.integers(1, 4)), int(rng.integers(1, 7)), (1 if i % 3 == 0 else int(rng.integers(2, 5)))
        x = torch.from_numpy(rng.standard_normal((b, t, init["n_embd"]))).to(dtype)
        past = _past(rng, b, init["n_kv_head"], t_past, init["n_embd"] // init["n_head"], dtype)
        cases.append(module_case(module, init, [x], {"past_kv": past}, describe=_gqa_describe(init, x, past)))
    return cases


@hidden_test("ch06.gqa_from_mha")
def gqa_from_mha(rng):
    """Eight conversions, float64 in two of three, every one with groups of two or more heads."""
    cases = []
    for i in range(8):
        n_head, n_kv_head = [(4, 2), (6, 3), (4, 1), (6, 2), (8, 2), (6, 1), (8, 4), (4, 2)][i]
        c = n_head * int(rng.integers(1, 4))
        dtype = _mostly64(i)
        weight = torch.from_numpy(rng.standard_normal((3 * c, c))).to(dtype)
        bias = torch.from_numpy(rng.standard_normal(3 * c)).to(dtype)
        cases.append(function_case(ref.gqa_from_mha, [weight, bias, n_head, n_kv_head]))
    return cases


# ---- multi-head latent attention ---------------------------------------------------------------------------------
def _mla_init(rng, i):
    """Sizes of a small latent attention layer: the latents narrower than the heads' keys and values, as in DeepSeek's
    (kv_rank < n_head * (nope_dim + v_dim)), rope_dim even."""
    n_head = int(rng.integers(1, 4)) + (i % 2)
    return {"n_embd": int(rng.integers(4, 13)), "n_head": n_head, "q_rank": int(rng.integers(3, 9)),
            "kv_rank": int(rng.integers(2, 6)), "nope_dim": int(rng.integers(1, 5)), "rope_dim": 2 * int(rng.integers(1, 3)),
            "v_dim": int(rng.integers(1, 5))}


def _mla_module(rng, init, dtype):
    module = ref.MultiHeadLatentAttention(**init)
    with torch.no_grad():                                     # weights far from the default initialisation
        for name, p in module.named_parameters():
            noise = torch.from_numpy(rng.standard_normal(tuple(p.shape)) * 0.5)
            p.copy_(1.0 + noise if name.endswith("norm.weight") else noise)
    return module.to(dtype)


def _mla_past(rng, module, b, t_past, dtype):
    """A cache as the layer itself leaves it: normalised latents and rotated keys of earlier tokens."""
    with torch.no_grad():
        return module.eval()(torch.from_numpy(rng.standard_normal((b, t_past, module.wkv_a.in_features))).to(dtype))[1]


def _mla_describe(init, x, past=None, train=False, absorbed=False):
    sizes = ", ".join(f"{k}={v}" for k, v in init.items())
    shape, dtype = list(x.shape), str(x.dtype)[6:]
    if train:
        return (f"MultiHeadLatentAttention({sizes}) in training mode (dropout active, the same torch.manual_seed "
                f"before both calls) on x {shape} {dtype}")
    text = f"MultiHeadLatentAttention({sizes}) on x {shape} {dtype}"
    if past is not None:
        text = f"{text}, a cache of {past[0].shape[1]} tokens"
    return f"{text}, absorbed=True" if absorbed else text


@hidden_test("ch06.mla", forbid=NO_MHA)
def mla(rng):
    """Ten cases without a cache, float64 in two of three; training mode (dropout 0.5) in four, evaluation mode with
    a nonzero dropout, which must then do nothing, in five."""
    cases = []
    for i in range(10):
        init = _mla_init(rng, i)
        train = i in (1, 4, 6, 9)
        init["dropout"] = 0.5 if train else (0.0 if i == 0 else 0.3)
        dtype = _mostly64(i)
        module = _mla_module(rng, init, dtype)
        x = torch.from_numpy(rng.standard_normal((int(rng.integers(1, 4)), int(rng.integers(1, 8)), init["n_embd"])))
        x = x.to(dtype)
        cases.append(module_case(module, init, [x], train_seed=_train_seed(rng) if train else None,
                                 describe=_mla_describe(init, x, train=train)))
    return cases


def _mla_cache_cases(rng, absorbed):
    cases = []
    for i in range(8):
        init = {**_mla_init(rng, i), "dropout": 0.0 if i % 4 == 0 else 0.3}   # evaluation mode: dropout does nothing
        dtype = _mostly64(i)
        module = _mla_module(rng, init, dtype)
        b, t = int(rng.integers(1, 4)), (1 if i % 3 == 0 else int(rng.integers(2, 5)))
        past = None if absorbed and i % 4 == 1 else _mla_past(rng, module, b, int(rng.integers(1, 7)), dtype)
        x = torch.from_numpy(rng.standard_normal((b, t, init["n_embd"]))).to(dtype)
        kwargs = {"absorbed": True} if absorbed else {}
        cases.append(module_case(module, init, [x, past], kwargs, describe=_mla_describe(init, x, past,
                                                                                          absorbed=absorbed)))
    return cases


@hidden_test("ch06.mla_cache", forbid=NO_MHA)
def mla_cache(rng):
    """Eight cases continuing from a cache the layer left: one new token in three, two to four in five."""
    return _mla_cache_cases(rng, absorbed=False)


# What absorbing saves, graded: one token decoded against 4,096 cached ones with 32 heads, where the heads' keys and
# values made from the latents, wkv_b(c_kv), would take 64 MiB in float32 (and the keys with their rotated part 36 MiB
# more); the kernel's peak resident memory, measured by the grading server, may grow by at most 16 MiB. Keys and
# values built in pieces pass that bound, so the call may also make at most 8 M numbers in all (the reference makes
# 1.1 M; wkv_b(c_kv), whole or in pieces, is 16.8 M).
MLA_CACHE_TOKENS, MLA_PEAK_LIMIT, MLA_CREATED_LIMIT = 4096, 16 << 20, 8_000_000


def _mla_memory_bound_case(rng):
    init = {"n_embd": 16, "n_head": 32, "q_rank": 8, "kv_rank": 8, "nope_dim": 64, "rope_dim": 8, "v_dim": 64}
    module = _mla_module(rng, init, torch.float32).eval()
    past = (torch.from_numpy(rng.standard_normal((1, MLA_CACHE_TOKENS, 8))).float(),
            torch.from_numpy(rng.standard_normal((1, MLA_CACHE_TOKENS, 8))).float())
    x = torch.from_numpy(rng.standard_normal((1, 1, 16))).float()
    keys = MLA_CACHE_TOKENS * 32 * (64 + 64) * 4
    case = module_case(module, init, [x, past], {"absorbed": True},
                       describe=f"(one token against a cache of {MLA_CACHE_TOKENS} tokens, 32 heads, absorbed=True: "
                                f"wkv_b(c_kv) would take {keys >> 20} MiB)")
    case.call["peak_bytes"] = MLA_PEAK_LIMIT
    case.call["max_created"] = MLA_CREATED_LIMIT
    return case


@hidden_test("ch06.mla_absorbed", forbid=NO_MHA)
def mla_absorbed(rng):
    """Eight cases of absorbed=True, from a cache in six and from nothing in two, and one bounded in memory."""
    return _mla_cache_cases(rng, absorbed=True) + [_mla_memory_bound_case(rng)]


# ---- sliding windows and attention sinks ----------------------------------------------------------------------------
@hidden_test("ch06.sliding_window_mask")
def sliding_window_mask(rng):
    """Ten masks, in most of them fewer queries than keys (as with a cache) and sinks that some queries' windows have
    passed while the first queries come before the last sink; a window of 1, one wider than the keys (plain causal),
    and one case without sinks."""
    cases = []
    for i in range(10):
        t_k = int(rng.integers(4, 13))
        t_q = t_k if i in (1, 5) else t_k - int(rng.integers(1, 3))
        window = [1, t_k + 3][i] if i < 2 else int(rng.integers(2, t_k - 1))
        sinks = 0 if i in (1, 7) else int(rng.integers(2, 5))
        cases.append(function_case(ref.sliding_window_mask, [t_q, t_k, window, sinks],
                                   describe=f"sliding_window_mask(t_q={t_q}, t_k={t_k}, window={window}, sinks={sinks})"))
    return cases


def _rolled(rng, b, h, d, dtype, steps, window, sinks):
    """A cache as rolling_cache_update leaves it after ``steps`` appends of 1 to 4 tokens each."""
    cache = None
    for _ in range(steps):
        t = int(rng.integers(1, 5))
        k, v = (torch.from_numpy(rng.standard_normal((b, h, t, d))).to(dtype) for _ in range(2))
        cache = ref.rolling_cache_update(cache, k, v, window, sinks)[3]
    return cache


ROLLING_LABELS = ["keys", "values", "positions", "kept keys", "kept values", "kept positions"]


@hidden_test("ch06.rolling_cache")
def rolling_cache(rng):
    """Ten steps: the first one (no cache) in two, one new token (decoding) in four, several in the others; windows
    from 1 to 5 and 1 to 3 sinks (none in two), after four to nine earlier steps, so that the cache has long been full;
    float64 in two of three."""
    cases = []
    for i in range(10):
        b, h, d = int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 5))
        window, sinks, dtype = int(rng.integers(1, 6)), [1, 2, 3, 0, 2][i % 5], _mostly64(i)
        steps = 0 if i in (0, 5) else int(rng.integers(4, 10))        # by then the cache has dropped positions
        cache = _rolled(rng, b, h, d, dtype, steps, window, sinks)
        t = 1 if i % 3 == 1 else int(rng.integers(1, 5))
        k, v = (torch.from_numpy(rng.standard_normal((b, h, t, d))).to(dtype) for _ in range(2))
        name, shape = str(dtype)[6:], [b, h, t, d]
        if cache is None:
            describe = (f"rolling_cache_update(no cache, {t} new token(s) {shape} {name}, window={window}, "
                        f"sinks={sinks})")
        else:
            kept = cache[2].tolist()
            describe = (f"rolling_cache_update(a cache of positions {kept}, {t} new token(s) {shape} {name}, "
                        f"window={window}, sinks={sinks})")
        case = function_case(ref.rolling_cache_update, [cache, k, v, window, sinks], describe=describe)
        case.labels = ROLLING_LABELS
        cases.append(case)
    return cases


@hidden_test("ch06.attention_with_sinks")
def attention_with_sinks(rng):
    """Nine cases, float64 in two of three: with and without a mask (causal, sliding-window, with a cache's fewer
    queries), sink logits from -inf (plain attention) to large ones that take nearly all the weight, a query whose
    mask allows no key in three; gradients with respect to q, k, v and the sink logits in four."""
    cases = []
    for i in range(9):
        b, h, d = int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 6))
        t_k = int(rng.integers(1, 8))
        t_q = t_k if i % 2 == 0 else int(rng.integers(1, t_k + 1))
        dtype = _mostly64(i)
        q, k, v = (torch.from_numpy(rng.standard_normal((b, h, t, d))).to(dtype) for t in (t_q, t_k, t_k))
        sink = torch.from_numpy(rng.standard_normal(h) * 2).to(dtype)
        if i == 2:
            sink[0] = float("-inf")
        if i == 6:
            sink = sink + 8.0
        mask = None
        if i % 3 != 0:
            mask = ref.sliding_window_mask(t_q, t_k, int(rng.integers(1, t_k + 1)), int(rng.integers(0, 2)))
        if i in (4, 7, 8):                                   # a query that may attend to no key: all to the sink
            mask = (torch.ones(t_q, t_k, dtype=torch.bool) if mask is None else mask).clone()
            mask[0] = False
        grads = (0, 1, 2, 3) if i in (1, 3, 5, 7) else ()
        qs, ks, name = list(q.shape), list(k.shape), str(dtype)[6:]
        rows, logits = None if mask is None else mask.int().tolist(), [round(float(x), 2) for x in sink]
        describe = f"attention_with_sinks(q {qs}, k and v {ks} {name}, sink_logits {logits}, mask {rows})"
        if grads:
            describe = f"attention_with_sinks(q {qs}, k and v {ks} {name}, sink_logits {logits}, mask {rows}), with gradients"
        cases.append(function_case(ref.attention_with_sinks, [q, k, v, sink, mask], rng=rng, grad_args=grads,
                                   describe=describe))
    return cases


def _window_check_data():
    """The sliding-window checks' cases: a mask and four known-wrong ones, a rolling cache stepped five times, and
    attention with sinks against plain attention and a sink divided by sqrt(D)."""
    t_q, t_k, window, sinks = 4, 7, 3, 2
    p, j = torch.arange(t_k - t_q, t_k)[:, None], torch.arange(t_k)[None, :]
    i = torch.arange(t_q)[:, None]                         # a query's index among the queries, not its position
    masks = {"expected": ref.sliding_window_mask(t_q, t_k, window, sinks),
             "wide": (j <= p) & ((p - j <= window) | (j < sinks)),
             "no_sinks": (j <= p) & (p - j < window),
             "top_left": (j <= i) & ((i - j < window) | (j < sinks)),
             # three queries, a window of 1 and two sinks: the first query must not see the second sink, its future
             "causal_sinks": ref.sliding_window_mask(3, 3, 1, 2)}
    mask = {"t_q": t_q, "t_k": t_k, "window": window, "sinks": sinks, **masks}

    steps, cache, chunks = [], None, [3, 2, 1, 1, 3]
    for i, t in enumerate(chunks):
        k, v = fixed((1, 1, t, 2), 70 + i), fixed((1, 1, t, 2), 80 + i)
        keys, values, positions, cache = ref.rolling_cache_update(cache, k, v, window, sinks)
        steps.append({"k": k, "v": v, "keys": keys, "values": values, "positions": positions, "kept": cache[2]})
    rolling = {"window": window, "sinks": sinks, "steps": steps}

    q, k, v = fixed((1, 2, 3, 4), 90), fixed((1, 2, 5, 4), 91), fixed((1, 2, 5, 4), 92)
    sink, m = torch.tensor([0.5, -1.0], dtype=torch.float64), ref.sliding_window_mask(3, 5, 2, 1)
    none = m.clone()
    none[0] = False
    sinks_case = {"q": q, "k": k, "v": v, "sink": sink, "mask": m, "expected": ref.attention_with_sinks(q, k, v, sink, m),
                  "plain": torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m),
                  "scaled": ref.attention_with_sinks(q, k, v, sink / 2, m), "none_mask": none,
                  "none_expected": ref.attention_with_sinks(q, k, v, sink, none)}
    return {"mask": mask, "rolling": rolling, "sinks": sinks_case}


def _mla_variant(module, x, past=None, rotate_queries=True, positions_from_zero=False, scale_dim=None, top_left=False,
                 norm_cache=True):
    """The plain path of the reference with one known mistake, for the visible checks to recognise it."""
    B, T, _ = x.shape
    H, r, nope, rope_dim = module.n_head, module.kv_rank, module.nope_dim, module.rope_dim
    t_past = 0 if past is None else past[0].shape[1]
    positions = torch.arange(T) if positions_from_zero else torch.arange(t_past, t_past + T)
    turn = lambda u: ref.apply_rope(u, positions)                               # noqa: E731
    q = module.wq_b(module.q_norm(module.wq_a(x))).view(B, T, H, nope + rope_dim).transpose(1, 2)
    q_nope, q_pe = q.split([nope, rope_dim], dim=-1)
    latent, k_pe = module.wkv_a(x).split([r, rope_dim], dim=-1)
    c_kv, k_pe = module.kv_norm(latent), turn(k_pe)
    if past is not None:
        c_kv, k_pe = torch.cat([past[0], c_kv], dim=1), torch.cat([past[1], k_pe], dim=1)
    S = c_kv.shape[1]
    k_nope, v = module.wkv_b(c_kv).view(B, S, H, -1).transpose(1, 2).split([nope, module.v_dim], dim=-1)
    k = torch.cat([k_nope, k_pe[:, None].expand(B, H, S, rope_dim)], dim=-1)
    mask = torch.ones(T, S, dtype=torch.bool).tril(0 if top_left else t_past)
    q_pe = turn(q_pe) if rotate_queries else q_pe
    y = torch.nn.functional.scaled_dot_product_attention(torch.cat([q_nope, q_pe], -1), k, v, attn_mask=mask,
                                                         scale=None if scale_dim is None else scale_dim ** -0.5)
    cache = (c_kv if norm_cache else latent, k_pe)
    return module.wo(y.transpose(1, 2).reshape(B, T, H * module.v_dim)), cache


def _mla_check_data(rng):
    init = {"n_embd": 12, "n_head": 2, "q_rank": 6, "kv_rank": 4, "nope_dim": 3, "rope_dim": 2, "v_dim": 3}
    attn = _mla_module(rng, init, torch.float64).eval()
    x = fixed((2, 5, 12), 81)
    y, (c_kv, k_pe) = attn(x)
    past = attn(fixed((2, 3, 12), 82))[1]
    xc = fixed((2, 2, 12), 83)
    yc, (c_kv_cached, k_pe_cached) = attn(xc, past)
    dropping = ref.MultiHeadLatentAttention(**init, dropout=0.5).double()
    dropping.load_state_dict(attn.state_dict())
    torch.manual_seed(13)
    y_train = dropping.train()(x)[0]
    dropping.dropout = 0.0                                    # the output's dropout only
    torch.manual_seed(13)
    y_train_resid_only = dropping(x)[0]
    return {"init": init, "state": dict(attn.state_dict()), "x": x, "y": y, "c_kv": c_kv, "k_pe": k_pe,
            "y_train": y_train, "y_train_resid_only": y_train_resid_only,
            "y_query_not_rotated": _mla_variant(attn, x, rotate_queries=False)[0], "y_scale_nope": _mla_variant(attn, x, scale_dim=3)[0],
            "c_kv_not_normalised": _mla_variant(attn, x, norm_cache=False)[1][0],
            "past_c_kv": past[0], "past_k_pe": past[1], "x_new": xc, "y_cached": yc, "c_kv_cached": c_kv_cached,
            "k_pe_cached": k_pe_cached,
            "y_cached_positions_from_0": _mla_variant(attn, xc, past, positions_from_zero=True)[0],
            "y_cached_top_left": _mla_variant(attn, xc, past, top_left=True)[0]}


# ---- speculative decoding ----------------------------------------------------------------------------------
def _spec_inputs(rng, batch, k, V, dtype, zeros=False, same=False):
    """Target and draft distributions (some tokens of probability 0 with ``zeros``; the draft equal to the
    target with ``same``, else the target's logits plus noise, as a draft model resembles its target) and
    draft tokens drawn from the draft's distributions."""
    def masked(logits):
        if zeros:
            logits = logits.masked_fill(torch.from_numpy(rng.random(logits.shape) < 0.3), float("-inf"))
            logits[..., 0] = logits[..., 0].clamp(min=-10.0)       # at least one token stays
        return logits
    logits = torch.from_numpy(rng.standard_normal((*batch, k + 1, V)) * 1.5)
    p = torch.softmax(masked(logits.clone()), -1)
    noise = torch.from_numpy(rng.standard_normal((*batch, k, V)) * 0.8)
    q = p[..., :k, :].clone() if same else torch.softmax(masked(logits[..., :k, :] + noise), -1)
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    x = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(*batch, k)
    return p.to(dtype), q.to(dtype), x


def _spec_exact_judge(expected):
    expected = expected.numpy()

    def judge(got):
        if len(got) != 1:
            return f"expected one tensor of token ids, got {len(got)} values"
        out = got[0]
        if out.shape != expected.shape:
            return f"the result has shape {list(out.shape)}, expected {list(expected.shape)} ([..., k + 1])"
        if out.dtype != np.int64:
            return f"the result has dtype {out.dtype}, expected int64 (torch.long)"
        if not np.array_equal(out, expected):
            rows = int((out != expected).reshape(-1, out.shape[-1]).any(-1).sum())
            return (f"{rows} of {expected.reshape(-1, expected.shape[-1]).shape[0]} rows differ from the reference's with "
                    "the same generator seed: draw the uniforms first (torch.rand(draft_tokens.shape, generator=generator, "
                    "dtype=target_probs.dtype)), accept while u < p / q, then one torch.multinomial call for all rows")
        return None
    return judge


@hidden_test("ch06.speculative_step")
def speculative_step(rng):
    """Eight cases compared token for token with the reference, each called twice with generators of the same
    seed (the random draws are fixed by the docstring): batch shapes (), [B] and [B1, B2], k from 1 to 3 (and 5
    once), float64 in two of three, tokens of probability 0, drafts that resemble the target (so that rows
    where every draft token is accepted, and a bonus token is drawn, are common) and a draft equal to the target."""
    cases = []
    for i in range(8):
        batch = [(), (16,), (3, 8), (40,), (24,), (4, 6), (30,), (8,)][i]
        k, V = (int(rng.integers(1, 4)) if i != 3 else 5), int(rng.integers(3, 12))
        dtype = _mostly64(i)
        p, q, x = _spec_inputs(rng, batch, k, V, dtype, zeros=i in (2, 5, 6), same=i == 7)
        g = _seeded(rng)
        expected = ref.speculative_step(p, q, x, torch.Generator().manual_seed(g.initial_seed()))
        cases.append(judged_case([p, q, x, g], judge=_spec_exact_judge(expected), repeat=2,
                                 describe=f"target_probs {list(p.shape)}, draft_probs {list(q.shape)} ({str(dtype)[6:]}), "
                                          f"draft_tokens {list(x.shape)}, k={k}, twice with the same generator seed"))
    return cases


def spec_expected_lengths(p, q):
    """P(n accepted = j), j = 0 .. k, for one row: token i is accepted with probability sum_x min(p_i, q_i)."""
    beta = torch.minimum(p[:-1], q).sum(-1).double()                # [k]
    reach = torch.cat([torch.ones(1, dtype=torch.float64), beta.cumprod(0)])      # P(n >= j)
    return reach - torch.cat([reach[1:], torch.zeros(1, dtype=torch.float64)])


def spec_statistics(out, p, q, x):
    """The chi-square statistics a speculative step's rows are judged by: one per position j (the tokens
    at position j, where the row has one, against p_j) and one for the number of accepted tokens.
    Returns [(j or "accepted", stat, df, counts, expected)] or a str saying what is malformed."""
    k, V = q.shape[-2], q.shape[-1]
    n = (out != ref.PAD_TOKEN).sum(-1) - 1                         # accepted draft tokens per row
    if (n < 0).any():
        return "some rows hold no new token: every step adds at least one (the correction or the bonus token)"
    position = np.arange(k + 1)
    if (out[position > n[:, None]] != ref.PAD_TOKEN).any() or (out[position <= n[:, None]] == ref.PAD_TOKEN).any():
        return "the new tokens must come first in each row, then PAD_TOKEN (-1) to the end"
    if (out[:, :k][position[:k] < n[:, None]] != x[position[:k] < n[:, None]]).any():
        return "the accepted tokens must be the draft's tokens, in their order"
    last = out[np.arange(len(out)), n]
    if ((last < 0) | (last >= V)).any():
        return "the token after the accepted ones is not a token id in 0 .. V - 1"
    stats = []
    for j in range(k + 1):
        column = out[n >= j, j]
        counts = np.bincount(column, minlength=V).astype(float)
        expected = p[j] * len(column)
        if (counts[expected == 0] > 0).any():
            return f"a token of target probability 0 came out at position {j}"
        stats.append((j, *_chi2(counts, expected), counts, expected))
    counts = np.bincount(n, minlength=k + 1).astype(float)
    expected = spec_expected_lengths(torch.from_numpy(p), torch.from_numpy(q)).numpy() * len(out)
    stats.append(("accepted", *_chi2(counts, expected), counts, expected))
    return stats


def _spec_statistics_judge(p, q, x):
    p, q, x = p[0].double().numpy(), q[0].double().numpy(), x.numpy()

    def judge(got):
        if len(got) != 1:
            return f"expected one tensor of token ids, got {len(got)} values"
        out = got[0]
        if out.shape != (len(x), x.shape[1] + 1):
            return f"the result has shape {list(out.shape)}, expected {[len(x), x.shape[1] + 1]} ([..., k + 1])"
        if out.dtype != np.int64:
            return f"the result has dtype {out.dtype}, expected int64 (torch.long)"
        stats = spec_statistics(out, p, q, x)
        if isinstance(stats, str):
            return stats
        for what, stat, df, counts, expected in stats:
            if df > 0 and stat > chi2_limit(df):
                shares = np.round(counts / counts.sum(), 3).tolist()
                want = np.round(expected / expected.sum(), 3).tolist()
                if what == "accepted":
                    return (f"over {len(out):,} steps the shares of 0 .. {len(want) - 1} accepted tokens are {shares}, "
                            f"expected {want} (token i is accepted with probability min(1, p_i(x) / q_i(x)); chi-square "
                            f"{stat:.0f} with {df} degrees of freedom; a correct step exceeds {chi2_limit(df):.0f} once in a million)")
                return (f"over {len(out):,} steps the tokens at position {what} have frequencies {shares}, but the target's "
                        f"distribution there is {want} (chi-square {stat:.0f} with {df} degrees of freedom; a correct step "
                        f"exceeds {chi2_limit(df):.0f} once in a million)")
        return None
    return judge


# The statistical cases: a target and a draft per position, the same in every row.
SPEC_ROWS = 20_000
SPEC_CASES = [
    # k = 2, V = 4: the draft favours the tokens the target does not
    (torch.float64, [[0.1, 0.2, 0.3, 0.4], [0.5, 0.1, 0.1, 0.3], [0.25, 0.25, 0.4, 0.1]],
     [[0.4, 0.3, 0.2, 0.1], [0.2, 0.2, 0.3, 0.3]]),
    # k = 3, V = 6: tokens the draft never proposes (q = 0 where p > 0) and tokens the target never takes
    (torch.float64, [[0.3, 0.0, 0.2, 0.2, 0.3, 0.0], [0.1, 0.1, 0.1, 0.1, 0.3, 0.3], [0.0, 0.5, 0.0, 0.25, 0.25, 0.0],
                     [0.2, 0.2, 0.2, 0.2, 0.1, 0.1]],
     [[0.2, 0.3, 0.5, 0.0, 0.0, 0.0], [0.3, 0.3, 0.1, 0.1, 0.1, 0.1], [0.1, 0.4, 0.1, 0.2, 0.1, 0.1]]),
    # k = 1, V = 5, float32
    (torch.float32, [[0.05, 0.15, 0.3, 0.3, 0.2], [0.6, 0.1, 0.1, 0.1, 0.1]], [[0.3, 0.3, 0.2, 0.1, 0.1]]),
]


def spec_statistics_inputs(rng, case):
    dtype, p, q = case
    p, q = torch.tensor(p, dtype=torch.float64), torch.tensor(q, dtype=torch.float64)
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    x = torch.multinomial(q, SPEC_ROWS, replacement=True, generator=g).t().contiguous()      # [rows, k]
    k, V = q.shape
    return (p.to(dtype).expand(SPEC_ROWS, k + 1, V).contiguous(), q.to(dtype).expand(SPEC_ROWS, k, V).contiguous(), x)


@hidden_test("ch06.speculative_distribution")
def speculative_distribution(rng):
    """Three cases of 20,000 steps from one target and one draft (k = 2, 3, 1), each called twice with generators
    of the same seed. At every position the tokens that come out must follow the target's distribution, and the
    number of accepted tokens its law (P(token i accepted) = sum_x min(p_i(x), q_i(x))): chi-square tests at
    the 1e-6 level. Their power against the usual mistakes (resampling from p or from q instead of
    max(0, p - q), accepting with q / p, accepting by p >= q without a draw, the bonus token from p_(k-1)) is
    above 0.9999 in the first case alone (tests/test_ch06_reference.py computes it)."""
    cases = []
    for case in SPEC_CASES:
        p, q, x = spec_statistics_inputs(rng, case)
        cases.append(judged_case([p, q, x, _seeded(rng)], judge=_spec_statistics_judge(p, q, x), repeat=2,
                                 describe=f"{SPEC_ROWS:,} steps with k={x.shape[1]}, V={p.shape[-1]} ({str(p.dtype)[6:]}), "
                                          "the same target and draft distributions in every row, twice with the same "
                                          "generator seed"))
    return cases


# ---- the visible checks' stored cases for grouped-query attention and speculative decoding -------------------
def _gqa_variant(module, x, past=None, strided=False, top_left=False, no_mask=False, by_kv_count=False):
    """The reference grouped-query attention with one known mistake, for the visible checks to recognise it
    (``by_kv_count``: query head h reads key/value head h // n_kv_head instead of h // (n_head // n_kv_head))."""
    b, t, c = x.shape
    d = c // module.n_head
    q, k, v = module.c_attn(x).split([c, module.n_kv_head * d, module.n_kv_head * d], dim=-1)
    q = q.view(b, t, module.n_head, d).transpose(1, 2)
    k, v = (u.view(b, t, module.n_kv_head, d).transpose(1, 2) for u in (k, v))
    if past is not None:
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
    group = module.n_head // module.n_kv_head
    if by_kv_count:
        k, v = (u[:, torch.arange(module.n_head) // module.n_kv_head] for u in (k, v))
    else:
        k, v = (u.repeat(1, group, 1, 1) if strided else u.repeat_interleave(group, dim=1) for u in (k, v))
    mask = None
    if past is not None and not top_left and not no_mask:
        mask = torch.ones(t, k.shape[2], dtype=torch.bool).tril(k.shape[2] - t)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                         is_causal=mask is None and not no_mask)
    return module.c_proj(y.transpose(1, 2).reshape(b, t, c))


def _gqa_from_mha_variant(weight, bias, n_head, n_kv_head, how):
    c = weight.shape[1]
    d, group = c // n_head, n_head // n_kv_head

    def pool(rows):
        if how == "strided":                 # heads h and h + n_kv_head, ... pooled together
            heads = rows.reshape(group, n_kv_head, d, *rows.shape[1:]).mean(dim=0)
        else:
            heads = rows.reshape(n_kv_head, group, d, *rows.shape[1:])
            heads = heads[:, 0] if how == "first" else heads.sum(dim=1)
        return heads.reshape(n_kv_head * d, *rows.shape[1:])

    def convert(t):
        q, k, v = t.split(c, dim=0)
        return torch.cat([q, pool(k), pool(v)], dim=0)
    return convert(weight), convert(bias)


def _gqa_check_data(rng):
    init = {"n_embd": 12, "n_head": 4, "n_kv_head": 2}
    torch.manual_seed(7)
    attn = _randomize(ref.GroupedQueryAttention(**init), rng).double().eval()
    x = fixed((2, 5, 12), 71)
    y, (k, v) = attn(x)
    past = (fixed((2, 2, 3, 3), 72), fixed((2, 2, 3, 3), 73))
    xc = fixed((2, 2, 12), 74)
    yc, (kc, vc) = attn(xc, past)
    dropping = ref.GroupedQueryAttention(**init, dropout=0.5).double()
    dropping.load_state_dict(attn.state_dict())
    torch.manual_seed(13)
    y_train = dropping.train()(x)[0]
    resid_only = ref.GroupedQueryAttention(**init, dropout=0.5).double()
    resid_only.load_state_dict(attn.state_dict())
    resid_only.dropout = 0.0
    torch.manual_seed(13)
    y_train_resid_only = resid_only.train()(x)[0]
    gqa = {"init": init, "state": dict(attn.state_dict()), "x": x, "y": y, "k": k, "v": v,
           "y_train": y_train, "y_train_resid_only": y_train_resid_only,
           "y_strided": _gqa_variant(attn, x, strided=True),
           "past_k": past[0], "past_v": past[1], "x_new": xc, "y_cached": yc, "k_cached": kc, "v_cached": vc,
           "y_cached_strided": _gqa_variant(attn, xc, past, strided=True),
           "y_cached_top_left": _gqa_variant(attn, xc, past, top_left=True),
           "y_cached_no_mask": _gqa_variant(attn, xc, past, no_mask=True)}
    # 8 query heads and 4 key/value heads: h // (n_head // n_kv_head) = h // 2 and h // n_kv_head = h // 4 differ
    # (with 4 and 2 they are the same)
    wide_init = {"n_embd": 16, "n_head": 8, "n_kv_head": 4}
    wide = _randomize(ref.GroupedQueryAttention(**wide_init), rng).double().eval()
    x_wide = fixed((2, 4, 16), 80)
    gqa["wide"] = {"init": wide_init, "state": dict(wide.state_dict()), "x": x_wide, "y": wide(x_wide)[0],
                   "y_by_kv_count": _gqa_variant(wide, x_wide, by_kv_count=True)}
    weight, bias = fixed((36, 12), 75), fixed((36,), 76)
    converted = ref.gqa_from_mha(weight, bias, 4, 2)
    conversion = {"weight": weight, "bias": bias, "n_head": 4, "n_kv_head": 2,
                  "expected_weight": converted[0], "expected_bias": converted[1],
                  **{f"{how}_weight": _gqa_from_mha_variant(weight, bias, 4, 2, how)[0]
                     for how in ("first", "strided", "sum")}}
    # speculative decoding: 16 rows (with 3, drawing the uniforms in another order could pass), k = 3, V = 6,
    # seed 0: what the reference returns
    p = torch.softmax(fixed((16, 4, 6), 77) * 2, -1)
    q = torch.softmax(fixed((16, 3, 6), 78) * 2, -1)
    xs = torch.multinomial(q.reshape(-1, 6), 1, generator=torch.Generator().manual_seed(79)).reshape(16, 3)
    spec = {"p": p, "q": q, "x": xs, "out": ref.speculative_step(p, q, xs, torch.Generator().manual_seed(0))}
    return {"gqa": gqa, "gqa_from_mha": conversion, "speculative": spec, "mla": _mla_check_data(rng)}
