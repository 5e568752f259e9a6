"""Visible checks for chapter 06: tokenizers, the GPT, GPT-2's weights, loss, sampling, KV cache, MLM masking."""
import contextlib

import torch

from ..autograde import bare_module
from .ch03 import MHA_BUILTINS
from ._core import (LargestTensor, NotDoneYet, build_module, call, close, dtypes_and_gradients, expect_tensor, fail,
                    forbidding, load_cases, max_error, ok, require_callable, same, tensor)

NO_MHA = MHA_BUILTINS
IGNORE = -100


def _data():
    return load_cases("ch06")


def _expect_str(s, what):
    if not isinstance(s, str):
        fail(f"{what} should return a str, got {type(s).__name__}")
    return s


def _expect_ids(ids, what):
    if isinstance(ids, torch.Tensor) or not isinstance(ids, list):
        fail(f"{what} should return a list of ints (a Python list), got {type(ids).__name__}")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        found = sorted({type(i).__name__ for i in ids})      # a placeholder without braces inside translates
        fail(f"{what} should return a list of Python ints; found {found}")
    return ids


# ---- character tokenizer -------------------------------------------------------------------------
def check_char_vocab(fn):
    """Check char_vocab(corpus) -> str of the distinct characters, sorted by code point."""
    require_callable(fn, "char_vocab")
    c = _data()["tokenizers"]
    vocab = _expect_str(call(fn, c["corpus"], what="char_vocab(corpus)"), "char_vocab")
    if len(vocab) != len(set(vocab)):
        fail("your vocabulary repeats characters: keep each distinct character once")
    if set(vocab) != set(c["corpus"]):
        fail(f"your vocabulary should hold exactly the characters of the corpus; missing "
             f"{sorted(set(c['corpus']) - set(vocab))}, extra {sorted(set(vocab) - set(c['corpus']))}")
    if vocab != c["vocab"]:
        fail(f"the characters must be sorted by code point (sorted(...)), so that ids do not depend on the "
             f"order of the text: expected {c['vocab']!r}, got {vocab!r}")
    if call(fn, "", what="char_vocab('')") != "":
        fail("char_vocab('') should be the empty string")
    ok(f"char_vocab: {len(vocab)} distinct characters, sorted")


def check_char_encode(fn):
    """Check char_encode(text, vocab) -> list[int], unknown characters -> len(vocab)."""
    require_callable(fn, "char_encode")
    c = _data()["tokenizers"]
    vocab = c["vocab"]
    ids = _expect_ids(call(fn, c["encode_text"], vocab, what="char_encode(text, vocab)"), "char_encode")
    if len(ids) != len(c["encode_text"]):
        fail(f"char_encode must give one id per character ({len(c['encode_text'])} here), got {len(ids)}: "
             "a character missing from the vocabulary gets the id len(vocab), it is not dropped")
    if ids != c["encoded"]:
        known = [i for i, ch in enumerate(c["encode_text"]) if ch in vocab]
        if all(ids[i] == c["encoded"][i] for i in known):
            fail(f"the known characters are right, but a character missing from the vocabulary must get the id "
                 f"len(vocab) = {len(vocab)} (the unknown id); yours got {[ids[i] for i in range(len(ids)) if i not in known]}")
        fail(f"char_encode('{c['encode_text']}') should be {c['encoded']}, got {ids}: the id of a character is "
             "its index in vocab")
    if call(fn, "", vocab, what="char_encode('', vocab)") != []:
        fail("char_encode('', vocab) should be []")
    ok("char_encode: ids are indices in the vocabulary; unknown characters get len(vocab)")


def check_char_decode(fn):
    """Check char_decode(ids, vocab) -> str; the unknown id decodes to U+FFFD."""
    require_callable(fn, "char_decode")
    c = _data()["tokenizers"]
    vocab, known = c["vocab"], "hello"
    ids = [vocab.index(ch) for ch in known]
    for given in (ids, torch.tensor(ids)):
        # the argument shown as code (a list or a tensor), so that no English word is formatted into a message
        shown = repr(given) if isinstance(given, list) else f"torch.tensor({ids})"
        text = _expect_str(call(fn, given, vocab, what=f"char_decode({shown}, vocab)"), "char_decode")
        if text != known:
            fail(f"char_decode({shown}) should be {known!r}, got {text!r}")
    text = _expect_str(call(fn, [ids[0], len(vocab), ids[1]], vocab, what="char_decode with the unknown id"),
                       "char_decode")
    if text != "h\ufffde":
        fail(f"the unknown id len(vocab) = {len(vocab)} must decode to the replacement character U+FFFD "
             f"('\\ufffd'); [h, unknown, e] gave {text!r}")
    ok("char_decode: lists and tensors of ids; the unknown id becomes U+FFFD")


# ---- byte-pair encoding ------------------------------------------------------------------------------
def check_merge_pair(fn):
    """Check merge_pair(ids, pair, new_id) -> new list, non-overlapping left to right."""
    require_callable(fn, "merge_pair")
    ids = [1, 2, 3, 1, 2, 2]
    out = _expect_ids(call(fn, ids, (1, 2), 256, what="merge_pair([1, 2, 3, 1, 2, 2], (1, 2), 256)"), "merge_pair")
    if ids != [1, 2, 3, 1, 2, 2]:
        fail("merge_pair changed its input list: build and return a new list")
    if out == [256, 3, 1, 2, 2]:
        fail("only the first occurrence was replaced: replace every occurrence of the pair")
    if len(out) > 4 and out[:2] == [256, 2]:
        fail("after a match, skip both elements of the pair (the next one to look at is two further on)")
    if out != [256, 3, 256, 2]:
        fail(f"merge_pair([1, 2, 3, 1, 2, 2], (1, 2), 256) should be [256, 3, 256, 2], got {out}")
    run = call(fn, [7, 7, 7], (7, 7), 300, what="merge_pair([7, 7, 7], (7, 7), 300)")
    if run != [300, 7]:
        fail(f"occurrences must not overlap, scanning left to right: [7, 7, 7] with (7, 7) -> [300, 7], got {run}")
    many = call(fn, [21, 2, 1, 2, 12], (1, 2), 300, what="merge_pair([21, 2, 1, 2, 12], (1, 2), 300)")
    if many != [21, 2, 300, 12]:
        fail(f"merge_pair([21, 2, 1, 2, 12], (1, 2), 300) should be [21, 2, 300, 12], got {many}: ids are whole "
             "numbers, compare them as numbers, not the digits or characters of their text ((1, 2) is not in 21, 2)")
    for ids, expected in [([], []), ([1], [1]), ([2, 1], [2, 1])]:
        got = call(fn, ids, (1, 2), 256, what=f"merge_pair({ids}, (1, 2), 256)")
        if got != expected:
            fail(f"merge_pair({ids}, (1, 2), 256) should be {expected}, got {got}")
    ok("merge_pair: every occurrence, left to right, no overlaps")


def _as_pairs(merges, what):
    if not isinstance(merges, list):
        fail(f"{what} should return a list of (a, b) pairs, got {type(merges).__name__}")
    try:
        return [tuple(int(x) for x in m) for m in merges]
    except (TypeError, ValueError):
        fail(f"{what} should return a list of (a, b) pairs of ints")


def check_bpe_train(fn):
    """Check bpe_train(text, n_merges) -> list of (a, b) merges; merge i creates token 256 + i."""
    require_callable(fn, "bpe_train")
    c = _data()["tokenizers"]
    short = _as_pairs(call(fn, "abcd", 5, what="bpe_train('abcd', 5)"), "bpe_train")
    if short:
        fail(f"in 'abcd' every pair occurs once: training must stop at once (no pair occurs at least twice); "
             f"you returned {short}")
    ties = _as_pairs(call(fn, c["tie_text"], 3, what=f"bpe_train({c['tie_text']!r}, 3)"), "bpe_train")
    want_ties = [tuple(m) for m in c["tie_merges"]]
    if ties != want_ties:
        if len(ties) > len(want_ties) and ties[:len(want_ties)] == want_ties:
            fail(f"training must stop when no pair occurs at least twice; {c['tie_text']!r} gives "
                 f"{want_ties}, you returned {ties}")
        if sorted(ties) == sorted(want_ties):
            fail(f"pairs that tie on count go to the smallest pair (a, b): {c['tie_text']!r} with 3 merges gives "
                 f"{want_ties}, you returned {ties}")
    want = [tuple(m) for m in c["merges"]]
    got = _as_pairs(call(fn, c["bpe_text"], 12, what="bpe_train(text, 12)"), "bpe_train")
    if any(x >= 256 + len(got) for pair in got for x in pair):
        fail("train on the UTF-8 bytes of the text (list(text.encode('utf-8'))), not on its characters: your "
             "merges hold ids above 255 that no merge created (code points); bytes keep the base vocabulary "
             "at 256 symbols for any language")
    if got != want or ties != want_ties:
        got, want, text = (got, want, c["bpe_text"]) if got != want else (ties, want_ties, c["tie_text"])
        n = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        fail(f"for {text!r}, merge {n} should be {want[n] if n < len(want) else 'none (training stops)'}, got "
             f"{got[n] if n < len(got) else 'none'}: count every adjacent pair of the current ids (overlapping "
             "ones too), take the most frequent, smallest pair on ties, and give merge i the id 256 + i")
    ok(f"bpe_train: the {len(want)} merges of the stored case, ties to the smallest pair, early stop")


def check_bpe_encode(fn):
    """Check bpe_encode(text, merges) -> list[int], and that more merges never give more tokens."""
    require_callable(fn, "bpe_encode")
    c = _data()["tokenizers"]
    merges = [tuple(m) for m in c["merges"]]
    text = "the newest lowest 新的"
    ids = _expect_ids(call(fn, text, merges, what="bpe_encode(text, merges)"), "bpe_encode")
    base = call(fn, text, [], what="bpe_encode(text, [])")
    if base != list(text.encode("utf-8")):
        fail(f"with no merges bpe_encode must return the UTF-8 bytes of the text (list(text.encode('utf-8'))), "
             f"got {base[:12]}...")
    if ids != c["encoded_bpe"]:
        fail(f"bpe_encode(text, merges) should be {c['encoded_bpe']}, got {ids}: apply the merges in the "
             "order they were learned (merge i creates 256 + i), each over the whole sequence")
    order = call(fn, "abc", [(98, 99), (97, 98)], what="bpe_encode('abc', [(98, 99), (97, 98)])")
    if order != [97, 256]:
        fail(f"bpe_encode('abc', [(98, 99), (97, 98)]) should be [97, 256]: merge 0 ('b', 'c') is applied first, "
             f"over the whole sequence, and then no ('a', 'b') is left; you returned {order}. Apply the merges in the "
             "order they were learned, not by merging the leftmost mergeable pair first")
    counts = [len(call(fn, text, merges[:k], what="bpe_encode")) for k in range(len(merges) + 1)]
    if any(b > a for a, b in zip(counts, counts[1:])):
        fail(f"adding merges must never add tokens; token counts with 0, 1, 2, ... merges: {counts}")
    ok(f"bpe_encode: {len(text)} characters -> {len(ids)} tokens; counts never grow with more merges: {counts}")


def check_bpe_decode(fn):
    """Check bpe_decode(ids, merges) -> str: any Unicode string comes back; invalid bytes -> U+FFFD."""
    require_callable(fn, "bpe_decode")
    c = _data()["tokenizers"]
    merges = [tuple(m) for m in c["merges"]]
    text = _expect_str(call(fn, c["encoded_bpe"], merges, what="bpe_decode(ids, merges)"), "bpe_decode")
    if "\ufffd" in text and "the newest" in text:
        fail("Chinese characters came back as U+FFFD: a character's UTF-8 bytes can be split over several "
             "tokens, so join the bytes of all tokens first and decode the whole byte string once")
    if text != "the newest lowest 新的":
        fail(f"bpe_decode should give back 'the newest lowest 新的', got {text!r}")
    for s in ["学而时习之", "naïve 🙂", ""]:
        back = call(fn, list(s.encode("utf-8")), [], what="bpe_decode(bytes, [])")
        if back != s:
            fail(f"with no merges the ids are the UTF-8 bytes: bpe_decode(list({s!r}.encode()), []) should be {s!r}, "
                 f"got {back!r}")
    bad = call(fn, [0xE4, 0x41], [], what="bpe_decode([0xE4, 0x41], [])")
    if bad != "\ufffdA":
        fail(f"bytes that are not valid UTF-8 decode to U+FFFD (errors='replace'): [0xE4, 0x41] should give "
             f"'\\ufffdA', got {bad!r}")
    ok("bpe_decode: joins the bytes, decodes once; Chinese and emoji survive; invalid bytes become U+FFFD")


# ---- the GPT ---------------------------------------------------------------------------------------------
def _pair(out, what):
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        fail(f"{what} should return a pair, got {type(out).__name__}")
    return out


def _kv(out, what):
    y, present = _pair(out, what)
    k, v = _pair(present, f"the cache returned by {what}")
    return y, k, v


@torch.no_grad()
def _check_dropout_and_float32(cls, c, module, x, name, proj="c_proj"):
    """The attention layer ``name`` (CausalSelfAttention, GroupedQueryAttention or MultiHeadLatentAttention, whose
    output projection is ``proj``) with dropout 0.5 in training mode, after torch.manual_seed(13), in evaluation
    mode, and in float32: the cases' y_train, y_train_resid_only and y."""
    dropping = build_module(cls, {**c["init"], "dropout": 0.5}, name, c["state"]).train()
    with torch.random.fork_rng(), forbidding(NO_MHA, name):
        torch.manual_seed(13)
        y_train = _kv(call(dropping, x, what=f"{name}(dropout=0.5) in training mode"), f"{name}.forward")[0]
    if not close(y_train, tensor(c["y_train"])):
        if close(y_train, tensor(c["y"])):
            fail(f"in training mode (dropout=0.5) your attention gives its evaluation output: dropout is never applied. "
                 "Pass dropout_p=self.dropout if self.training else 0.0 to F.scaled_dot_product_attention and apply "
                 f"self.resid_dropout to {proj}'s output")
        if close(y_train, tensor(c["y_train_resid_only"])):
            fail("in training mode the attention weights get no dropout: pass dropout_p=self.dropout if self.training "
                 "else 0.0 to F.scaled_dot_product_attention (self.resid_dropout on the output is right)")
        fail(f"in training mode (dropout=0.5, torch.manual_seed(13) first) your attention differs from the expected "
             "output: dropout_p=self.dropout if self.training else 0.0 on the attention weights, then "
             f"self.resid_dropout on {proj}'s output")
    dropping.eval()
    with torch.random.fork_rng(), forbidding(NO_MHA, name):
        y_eval = _kv(call(dropping, x, what=f"{name}(dropout=0.5) in evaluation mode"), f"{name}.forward")[0]
    if not close(y_eval, tensor(c["y"])):
        fail("in evaluation mode (module.eval()) dropout must do nothing, whatever its p: with dropout=0.5 your output "
             "differs from the output without dropout. Use dropout_p=self.dropout if self.training else 0.0 and an "
             "nn.Dropout module (it follows the mode), not F.dropout(..., training=True)")
    y32 = call(module.float(), x.float(), what=f"{name} in float32")[0]
    if y32.dtype != torch.float32 or not close(y32, tensor(c["y"]), atol=1e-4):
        fail("in float32 the module should return float32 outputs matching float64 to 1e-4")


def check_attention(cls):
    """Check CausalSelfAttention(n_embd, n_head).forward(x) -> (y, (k, v)) without a cache."""
    c = _data()["attention"]
    module = build_module(cls, c["init"], "CausalSelfAttention", c["state"])
    x = tensor(c["x"])
    with forbidding(NO_MHA, "CausalSelfAttention"):
        y, k, v = _kv(call(module, x, what="CausalSelfAttention.forward(x)"), "CausalSelfAttention.forward")
    expect_tensor(y, "the output y", shape=(2, 5, 8))
    expect_tensor(k, "the returned keys", shape=(2, 2, 5, 4))
    expect_tensor(v, "the returned values", shape=(2, 2, 5, 4))
    if not close(y, tensor(c["y"])):
        x2 = x.clone()
        x2[:, -1] += 1.0                                  # change the last token only
        y2 = call(module, x2, what="CausalSelfAttention.forward(x)")[0]
        if max_error(y[:, :-1], y2[:, :-1]) > 1e-9:
            fail("changing the last token changed the outputs at earlier positions: the attention is not "
                 "causal. Pass is_causal=True to F.scaled_dot_product_attention (no cache)")
        for order, expected in c["split_orders"].items():
            if close(y, tensor(expected)):
                fail(f"you split c_attn's output as ({', '.join(order)}); it is [q | k | v] in that order")
        if close(y, tensor(c["y_no_transpose"])):
            fail("you reshaped [B, T, C] straight to [B, H, T, C/H]: view it as [B, T, H, C/H] and transpose "
                 "dims 1 and 2, so that each head gets C/H features of every token")
        fail(f"the output differs from the expected one (max error {max_error(y, tensor(c['y'])):.3g}): "
             "q, k, v = c_attn(x).split(C, dim=-1), heads [B, H, T, C/H], F.scaled_dot_product_attention, "
             "heads merged back to [B, T, C], then c_proj")
    if not (close(k, tensor(c["k"])) and close(v, tensor(c["v"]))):
        fail("y is right but the returned (k, v) are not the keys and values of this call, split into heads "
             "[B, H, T, C/H]")
    _check_dropout_and_float32(cls, c, module, x, "CausalSelfAttention")
    ok("CausalSelfAttention: fused split, heads, causal attention, output projection, returned (k, v)")


@contextlib.contextmanager
def _watch_sdpa(seen):
    """Record the (q, k) shapes of every F.scaled_dot_product_attention call: tells which axis a cache grew."""
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        seen.append((tuple(q.shape), tuple(k.shape)))
        return real(q, k, v, *args, **kwargs)
    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = real


@torch.no_grad()
def check_attention_cache(cls):
    """Check CausalSelfAttention.forward(x, past_kv) with cached keys and values."""
    c = _data()["attention"]
    module = build_module(cls, c["init"], "CausalSelfAttention", c["state"])
    past = (tensor(c["past_k"]), tensor(c["past_v"]))
    x = tensor(c["x_new"])
    seen = []
    try:
        with _watch_sdpa(seen), forbidding(NO_MHA, "CausalSelfAttention"):
            out = module(x, past_kv=past)
    except NotImplementedError:
        fail("CausalSelfAttention.forward is not implemented yet: replace `raise NotImplementedError()`", NotDoneYet)
    except Exception as exc:
        if "must match except in dimension" in str(exc) or (seen and seen[-1][0][1:2] + seen[-1][0][3:]
                                                             != seen[-1][1][1:2] + seen[-1][1][3:]):
            fail("the cache grew along the wrong axis: past keys [B, H, T_past, C/H] and new keys [B, H, T, C/H] "
                 f"join along dim 2 (time), torch.cat([past_k, k], dim=2) ({type(exc).__name__}: {str(exc)[:100]})")
        fail(f"CausalSelfAttention.forward(x, past_kv) raised {type(exc).__name__}: {exc}")
    y, k, v = _kv(out, "CausalSelfAttention.forward")
    if not isinstance(k, torch.Tensor):
        fail(f"the returned keys should be a tensor, got {type(k).__name__}")
    if tuple(k.shape) == (2, 4, 2, 4) or tuple(k.shape) == (2, 2, 2, 8):
        fail(f"the cache grew along the wrong axis: keys [B, H, T_past, C/H] = [2, 2, 3, 4] plus 2 new tokens "
             f"should give [2, 2, 5, 4] (concatenate along dim 2, time), you returned {list(k.shape)}")
    if tuple(k.shape) == (2, 2, 2, 4):
        fail("return the past and the new keys and values together ([B, H, T_past + T, C/H]), not only the new ones")
    expect_tensor(k, "the returned keys", shape=(2, 2, 5, 4))
    expect_tensor(v, "the returned values", shape=(2, 2, 5, 4))
    expect_tensor(y, "the output y", shape=(2, 2, 8))
    if not (close(k, tensor(c["k_cached"])) and close(v, tensor(c["v_cached"]))):
        fail("the returned cache should be torch.cat([past, new], dim=2): the past first, then the new tokens")
    if not close(y, tensor(c["y_cached"])):
        if close(y, tensor(c["y_cached_top_left"])):
            fail("with a cache the causal mask must be shifted: new query i sits at position t_past + i and sees "
                 "keys 0 .. t_past + i. is_causal=True aligns the mask to the top left (query 0 sees key 0 only); "
                 "build the mask yourself when past_kv is given")
        fail(f"with a cache the output differs from the expected one (max error {max_error(y, tensor(c['y_cached'])):.3g}): "
             "attend over the past and the new keys, new query i seeing keys 0 .. t_past + i")
    ok("CausalSelfAttention with a cache: keys grow along time, the mask is shifted by the past")


@torch.no_grad()
def check_block(cls):
    """Check Block(n_embd, n_head).forward(x, past_kv=None) -> (x, (k, v)): pre-norm residual block."""
    c = _data()["block"]
    module = build_module(cls, c["init"], "Block", c["state"])
    x = tensor(c["x"])
    with forbidding(NO_MHA, "Block"):
        y, k, v = _kv(call(module, x, what="Block.forward(x)"), "Block.forward")
    expect_tensor(y, "Block output", shape=(2, 5, 8))
    if not close(y, tensor(c["y"])):
        if close(y, tensor(c["y_post_norm"])):
            fail("this is a post-norm block (LayerNorm after the residual sum); GPT-2 is pre-norm: "
                 "x = x + attn(ln_1(x)), then x = x + mlp(ln_2(x))")
        fail(f"Block output differs (max error {max_error(y, tensor(c['y'])):.3g}): pre-norm with a residual "
             "around each sub-layer, x = x + attn(ln_1(x))[0], then x = x + mlp(ln_2(x))")
    past = (tensor(c["past_k"]), tensor(c["past_v"]))
    out = call(module, tensor(c["x_new"]), past_kv=past, what="Block.forward(x, past_kv)")
    yc, kc, _ = _kv(out, "Block.forward")
    if not close(yc, tensor(c["y_cached"])):
        fail("with past_kv the block's output is wrong: pass past_kv on to the attention and return its new cache")
    expect_tensor(kc, "the cache the block returns", shape=(2, 2, 5, 4))
    y32 = _kv(call(module.float(), x.float(), what="Block in float32"), "Block.forward")[0]
    if y32.dtype != torch.float32 or not close(y32, tensor(c["y"]), atol=1e-4):
        fail("in float32 the block should return float32 outputs matching float64 to 1e-4")
    ok("Block: pre-norm residual sub-layers; the cache passes through; float32 and float64")


def _check_parameters(cls, c):
    """Build the learner's GPT and compare its parameters with GPT-2's names and shapes."""
    require_callable(cls, "GPT", kind="class")
    sizes = ", ".join(f"{k}={v}" for k, v in c["init"].items())
    model = call(cls, **c["init"], what=f"GPT({sizes})")
    if not isinstance(model, torch.nn.Module):
        fail("GPT(...) should build a torch.nn.Module")
    mine = {name: list(p.shape) for name, p in model.state_dict().items()}
    wanted = {name: shape for name, shape in c["parameters"]}
    if any(n.startswith("lm_head") for n in mine):
        fail("your model has its own head matrix (lm_head): GPT-2's head is tied to the token embedding, and "
             "GPT's state dict holds no separate head. Declare no head; compute the logits with wte.weight "
             "(F.linear(x, self.wte.weight))")
    layers = {n.split(".")[1] for n in wanted if n.startswith("h.")}
    shared = {n for n, p in model.named_parameters()}
    if len(layers) > 1 and not any(n.startswith("h.1.") for n in shared) and any(n.startswith("h.0.") for n in shared):
        fail("every layer shares h.0's parameters: you put the same Block object in the list n_layer times. "
             "Build a new Block for each layer")
    if mine != wanted:
        missing = sorted(set(wanted) - set(mine))
        extra = sorted(set(mine) - set(wanted))
        wrong = sorted(n for n in set(mine) & set(wanted) if mine[n] != wanted[n])
        # names and shapes only (no English words) inside one message, so that it translates whole
        missing = ", ".join(f"{n} {wanted[n]}" for n in missing) or "-"
        extra = ", ".join(f"{n} {mine[n]}" for n in extra) or "-"
        wrong = ", ".join(f"{n} {mine[n]} -> {wanted[n]}" for n in wrong) or "-"
        fail(f"GPT's parameters must carry GPT-2's names and shapes; missing: {missing}; unexpected: {extra}; "
             f"wrong shape (yours -> GPT-2's): {wrong}")
    if getattr(model, "block_size", None) != c["init"]["block_size"]:
        fail("store the context length as self.block_size (generation uses it)")


@torch.no_grad()
def check_gpt(cls):
    """Check GPT.forward(idx) -> logits against GPT-2's (transformers), with GPT-2's weights loaded."""
    c = _data()["gpt"]
    _check_parameters(cls, c)
    model = build_module(cls, c["init"], "GPT", c["state"])
    idx = torch.tensor(c["idx"])
    with forbidding(NO_MHA, "GPT"):
        logits = call(model, idx, what="GPT.forward(idx)")
    if isinstance(logits, (tuple, list)):
        fail("with use_cache=False (the default) forward returns the logits alone, not a tuple")
    expect_tensor(logits, "logits", shape=(2, 8, c["init"]["vocab_size"]))
    expected = tensor(c["logits"])
    if not close(logits, expected, atol=1e-8):
        idx2 = idx.clone()
        idx2[:, -1] = (idx2[:, -1] + 1) % c["init"]["vocab_size"]
        later = call(model, idx2, what="GPT.forward(idx)")
        if max_error(logits[:, :-1], later[:, :-1]) > 1e-9:
            fail("changing the last token changed the logits at earlier positions: the model sees the future "
                 "(is the attention causal?)")
        same_token = torch.full((1, 6), 3)
        rows = call(model, same_token, what="GPT.forward on a repeated token")[0]
        if max_error(rows[1:], rows[:1].expand(5, -1)) < 1e-9:
            fail("a token repeated six times gets the same logits at every position: add the position "
                 "embeddings, x = wte(idx) + wpe(positions)")
        if close(logits, tensor(c["logits_without_ln_f"])):
            fail("apply the final LayerNorm ln_f before the head")
        fail(f"the logits differ from GPT-2's (max error {max_error(logits, expected):.3g}): wte(idx) + "
             "wpe(positions), dropout, the blocks, ln_f, then the tied head x @ wte.weight^T")
    f32 = call(model.float(), idx, what="GPT in float32")
    if f32.dtype != torch.float32 or not close(f32, expected, atol=1e-4):
        fail("in float32 the logits should be float32 and match to 1e-4")
    # In training mode with dropout 1.0 every dropout zeroes its input: the residual stream stays 0, so
    # every position gets the same logits, ln_f's bias times wte^T.  A dropout left out lets x through.
    dropped = build_module(cls, {**c["init"], "dropout": 1.0}, "GPT", c["state"]).train()
    with forbidding(NO_MHA, "GPT"):
        rows = call(dropped, idx, what="GPT.forward in training mode with dropout=1.0")
    if max_error(rows, rows[:1, :1].expand_as(rows)) > 1e-9:
        fail("in training mode with dropout=1.0 every dropout zeroes its input, so every position should get "
             "the same logits; yours differ: apply self.drop to the embeddings, x = self.drop(wte(idx) + "
             "wpe(positions)), and keep the blocks' dropouts")
    n = sum(p.numel() for p in model.parameters())
    ok(f"GPT: GPT-2's parameter names, the head tied to wte ({n:,} numbers); with GPT-2's weights it gives "
       f"GPT-2's logits (max difference {max_error(logits, expected):.1e})")


def _greedy(model, prompt, steps, cache):
    """Greedy tokens after ``prompt`` [1, T], with or without the model's cache."""
    idx = prompt
    with torch.no_grad():
        if not cache:
            for _ in range(steps):
                idx = torch.cat([idx, model(idx)[:, -1].argmax(-1, keepdim=True)], dim=1)
            return idx[0, prompt.shape[1]:].tolist()
        logits, past = _pair(model(idx, use_cache=True), "GPT.forward(idx, use_cache=True)")
        out = []
        for _ in range(steps):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out.append(int(nxt))
            logits, past = _pair(model(nxt, past_kv=past, use_cache=True), "GPT.forward(idx, past_kv, use_cache=True)")
        return out


@torch.no_grad()
def check_gpt_cache(cls):
    """Check GPT.forward with past_kv / use_cache: same logits, and greedy generation gives the same tokens."""
    c = _data()["gpt"]
    model = build_module(cls, c["init"], "GPT", c["state"])
    idx = torch.tensor(c["idx"])
    expected = tensor(c["logits"])
    out = call(model, idx[:, :5], use_cache=True, what="GPT.forward(idx, use_cache=True)")
    logits, past = _pair(out, "GPT.forward(idx, use_cache=True)")
    if not isinstance(past, (list, tuple)) or len(past) != c["init"]["n_layer"]:
        fail(f"use_cache=True returns (logits, past_kv) with one (k, v) per layer ({c['init']['n_layer']} here)")
    k0 = _pair(past[0], "each layer's cache")[0]
    expect_tensor(k0, "a layer's cached keys", shape=(2, c["init"]["n_head"], 5, c["init"]["n_embd"] // c["init"]["n_head"]))
    rest = call(model, idx[:, 5:], past_kv=past, use_cache=True, what="GPT.forward(idx, past_kv, use_cache=True)")
    rest_logits, past2 = _pair(rest, "GPT.forward(idx, past_kv, use_cache=True)")
    if not close(logits, expected[:, :5], atol=1e-8):
        fail("with use_cache=True the logits must be those of use_cache=False")
    if not close(rest_logits, expected[:, 5:], atol=1e-8):
        fail(f"with a cache of 5 tokens, the logits of tokens 5..7 differ from a full forward's (max error "
             f"{max_error(rest_logits, expected[:, 5:]):.3g}): the new tokens sit at positions t_past .. "
             "t_past + T - 1, so their positions must start at t_past (past_kv[0][0].shape[2]), not 0")
    only = call(model, idx[:, 5:], past_kv=past, what="GPT.forward(idx, past_kv)")
    if isinstance(only, (tuple, list)):
        fail("with use_cache=False forward returns the logits alone, even when past_kv is given")
    for t in range(1, c["init"]["block_size"] - 1):
        prompt = idx[:1, :t]
        steps = c["init"]["block_size"] - t
        plain, cached = _greedy(model, prompt, steps, False), _greedy(model, prompt, steps, True)
        if plain != cached:
            fail(f"greedy generation from a prompt of {t} tokens: {plain} without the cache, {cached} with it")
    ok("KV cache: the same logits, and greedy generation gives the same tokens for every prompt length")


def check_load_gpt2_weights(fn):
    """Check load_gpt2_weights(model, state_dict) on GPT-2's state dict: names, transposed Conv1D weights."""
    require_callable(fn, "load_gpt2_weights")
    c = _data()["gpt"]
    hf = {k: tensor(v) if not isinstance(v, bool) else v for k, v in c["hf_state"].items()}
    target = bare_module({name: shape for name, shape in c["parameters"]}, torch.float64)
    try:
        fn(target, hf)
    except NotImplementedError:
        fail("load_gpt2_weights is not implemented yet: replace `raise NotImplementedError()` with your code", NotDoneYet)
    except (RuntimeError, ValueError) as exc:
        if "size" in str(exc) or "shape" in str(exc):
            fail(f"a shape mismatch while copying ({type(exc).__name__}: {str(exc)[:120]}). GPT-2's Conv1D weights "
                 "(names ending in c_attn.weight, c_proj.weight, c_fc.weight) are stored [in, out] and must be "
                 "transposed; every other tensor (embeddings, LayerNorms, biases) is copied as it is")
        fail(f"load_gpt2_weights raised {type(exc).__name__}: {exc}")
    except KeyError as exc:
        fail(f"load_gpt2_weights looked up a key GPT-2's state dict lacks: {exc}. GPT-2 names our parameter "
             "`name` 'transformer.' + name")
    except Exception as exc:            # any other crash of the learner's code: a message, not a traceback
        fail(f"load_gpt2_weights raised {type(exc).__name__}: {exc}")
    wanted = c["state"]
    for name, p in sorted(target.named_parameters()):
        exp = tensor(wanted[name])
        if close(p, exp):
            continue
        src = hf.get("transformer." + name)
        if src is not None and src.dim() == 2 and close(p, src):
            fail(f"{name} was copied without transposing: GPT-2's Conv1D layers (c_attn, c_proj, c_fc) store "
                 "their weight as [in, out]; nn.Linear's is [out, in], so it must be transposed")
        if src is not None and src.numel() == exp.numel() and close(p, src.reshape(exp.shape)):
            fail(f"{name} was reshaped to nn.Linear's shape; it must be transposed (.t()), which reorders the numbers")
        fail(f"{name} does not hold GPT-2's transformer.{name} (max error {max_error(p, exp):.3g}); "
             "transpose only the Conv1D weights (names ending in c_attn.weight, c_proj.weight, c_fc.weight)")
    target32 = bare_module({name: shape for name, shape in c["parameters"]}, torch.float32)
    call(fn, target32, {k: v.float() for k, v in hf.items()}, what="load_gpt2_weights with a float32 state dict")
    if any(not close(p, tensor(wanted[name]), atol=1e-6) for name, p in target32.named_parameters()):
        fail("with a float32 model and state dict the loaded parameters differ from float64's")
    ok("load_gpt2_weights: every parameter holds GPT-2's, Conv1D weights transposed, the tied head skipped")


# ---- loss and sampling ---------------------------------------------------------------------------------------
def check_lm_loss(fn):
    """Check lm_loss(logits, idx, pad_id=None) -> scalar next-token cross-entropy, float32 and float64, gradients."""
    require_callable(fn, "lm_loss")
    c = _data()["loss"]
    logits, idx = tensor(c["logits"]), torch.tensor(c["idx"])
    for dtype in (torch.float64, torch.float32):
        lg = logits.to(dtype).requires_grad_(True)
        loss = call(fn, lg, idx, what=f"lm_loss(logits {str(dtype)[6:]}, idx)")
        expect_tensor(loss, "the loss", shape=())
        if loss.dtype != dtype:
            fail(f"the loss should keep the logits' dtype {dtype}, got {loss.dtype}")
        tol = 1e-9 if dtype == torch.float64 else 1e-5
        if not close(loss, tensor(c["loss"]), atol=tol):
            if close(loss, tensor(c["loss_unshifted"]), atol=tol):
                fail("the loss is not shifted: the logits at position t predict token t + 1, so score "
                     "logits[:, :-1] against idx[:, 1:]")
            if close(loss, tensor(c["loss_backwards"]), atol=tol):
                fail("shifted the wrong way: logits[:, :-1] (positions 0..T-2) are scored against idx[:, 1:]")
            fail(f"lm_loss = {float(loss.detach()):.6f}, expected {c['loss']:.6f}: the mean cross-entropy of "
                 "logits[:, t] against idx[:, t + 1]")
        grad = torch.autograd.grad(loss, lg)[0]
        if not close(grad, tensor(c["grad"]), atol=tol):
            fail("the loss has the right value but the wrong gradient: compute it with differentiable torch "
                 "operations on the logits (no .item(), no NumPy)")
    padded = torch.tensor(c["idx_padded"])
    loss = call(fn, logits, padded, pad_id=0, what="lm_loss(logits, idx, pad_id=0)")
    if not close(loss, tensor(c["loss_padded"]), atol=1e-9):
        if close(loss, tensor(c["loss_pad_counted"]), atol=1e-9):
            fail("padding was scored: targets equal to pad_id must be ignored (F.cross_entropy's ignore_index)")
        fail(f"with pad_id=0 the loss should be {c['loss_padded']:.6f} (the mean over non-pad targets only), "
             f"got {float(loss.detach()):.6f}")
    ok("lm_loss: shifted by one, padding ignored, both dtypes, gradients")


def check_sampling(fn):
    """Check next_token_probs(logits, temperature, top_k): temperature and top-k, float32 and float64."""
    require_callable(fn, "next_token_probs")
    c = _data()["sampling"]
    logits = tensor(c["logits"])
    for dtype in (torch.float64, torch.float32):
        p = call(fn, logits.to(dtype), temperature=0.7, what=f"next_token_probs(logits {str(dtype)[6:]}, temperature=0.7)")
        expect_tensor(p, "the probabilities", shape=(2, 6), dtype=dtype)
        tol = 1e-9 if dtype == torch.float64 else 1e-6
        if not close(p, tensor(c["t07"]), atol=tol):
            if close(p, tensor(c["t10"]), atol=tol):
                fail("temperature 0.7 gave the temperature-1 distribution: dividing probabilities by T and "
                     "renormalising changes nothing. Divide the logits by T before the softmax")
            if close(p, tensor(c["t07_times"]), atol=tol):
                fail("you multiplied the logits by the temperature; divide them by it (T < 1 sharpens)")
            if dtype == torch.float64 and close(p, tensor(c["t07"]), atol=1e-6):
                fail(f"float64 logits gave probabilities off by {max_error(p, tensor(c['t07'])):.0e}, float32's "
                     "rounding: they were computed in float32 (.float()?). Keep the logits' dtype throughout")
            fail(f"temperature 0.7: expected {tensor(c['t07']).tolist()}, got {p.tolist()}")
    p = call(fn, logits, top_k=3, what="next_token_probs(logits, top_k=3)")
    kept = (p > 0).sum(-1).tolist()
    if kept != [3, 3]:
        fail(f"top_k=3 should keep the 3 largest logits of each row and zero the rest; you kept {kept}")
    if not close(p, tensor(c["k3"]), atol=1e-9):
        fail("top_k=3: the kept tokens must be the 3 largest, renormalised (softmax over the kept logits)")
    ties = tensor(c["ties"])
    p = call(fn, ties, top_k=3, what="next_token_probs(tied logits, top_k=3)")
    if not close(p, tensor(c["ties_k3"]), atol=1e-9):
        fail(f"logits {ties.tolist()} with top_k=3: the 3rd largest is 2.0, and every token tied with it stays "
             f"(keep logits >= the k-th largest), so 4 tokens survive; you gave {p.tolist()}")
    p = call(fn, logits, top_k=50, what="next_token_probs(logits, top_k=50)")
    if not close(p, tensor(c["t10"]), atol=1e-9):
        fail("top_k larger than the vocabulary keeps every token")
    ok("next_token_probs: temperature divides the logits; top-k keeps ties with the k-th")


def check_top_p(fn):
    """Check next_token_probs(logits, top_p=...): the token that crosses top_p is kept, ties by lower id."""
    require_callable(fn, "next_token_probs")
    probs = torch.tensor([0.125, 0.5, 0.0625, 0.25, 0.0625], dtype=torch.float64)
    # Ranked: 0.5 (id 1), 0.25 (id 3), 0.125 (id 0), 0.0625 (ids 2, 4); the totals 0.5, 0.75, 0.875 ...
    cases = [(0.3, [0, 1, 0, 0, 0]), (0.6, [0, 2 / 3, 0, 1 / 3, 0]), (0.8, [1 / 7, 4 / 7, 0, 2 / 7, 0])]
    for dtype in (torch.float64, torch.float32):
        for top_p, want in cases:
            p = call(fn, probs.log().to(dtype), top_p=top_p, what=f"next_token_probs(log {probs.tolist()}, top_p={top_p})")
            expect_tensor(p, "the probabilities", shape=(5,), dtype=dtype)
            want = torch.tensor(want, dtype=torch.float64)
            if close(p, want, atol=1e-6):
                continue
            kept = [i for i in range(5) if float(p[i]) > 0]
            if abs(float(p.sum()) - 1) > 1e-5 and kept == [i for i in range(5) if want[i] > 0]:
                fail("top-p kept the right tokens but the result does not sum to 1: renormalise")
            if len(kept) == int((want > 0).sum()) - 1:
                fail(f"probabilities ranked 0.5, 0.25, 0.125, ... with top_p={top_p}: keep the shortest prefix whose "
                     "total reaches top_p, including the token that crosses it (at least one token always stays); "
                     f"you dropped the token that crosses top_p")
            if len(kept) == int((want > 0).sum()) + 1:
                fail(f"top_p={top_p}: you kept one token after the one that crosses top_p")
            fail(f"top_p={top_p} on {probs.tolist()}: expected {want.tolist()}, got {p.tolist()}")
    ties = torch.tensor([0.2, 0.3, 0.2, 0.3], dtype=torch.float64).log()
    p = call(fn, ties, top_p=0.25, what="next_token_probs(tied probabilities, top_p=0.25)")
    if not close(p, torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64), atol=1e-9):
        if close(p, torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64), atol=1e-9):
            fail("probabilities [0.2, 0.3, 0.2, 0.3], top_p=0.25: of the two tokens tied at 0.3 the lower id (1) "
                 "ranks first; sort with torch.sort(..., descending=True, stable=True)")
        fail(f"probabilities [0.2, 0.3, 0.2, 0.3], top_p=0.25 should keep token 1 alone, got {p.tolist()}")
    # 20 tokens, ten tied at 0.06 (even ids), ten at 0.04: top_p=0.33 keeps six of the ten, the lowest ids.
    long = torch.tensor([0.06 if i % 2 == 0 else 0.04 for i in range(20)], dtype=torch.float64)
    p = call(fn, long.log(), top_p=0.33, what="next_token_probs(20 tied logits, top_p=0.33)")
    kept = [i for i in range(20) if float(p[i]) > 0]
    if kept != [0, 2, 4, 6, 8, 10]:
        fail(f"probabilities 0.06 at the ten even ids and 0.04 at the odd ones, top_p=0.33: the first six of the tied "
             f"0.06 tokens by id stay, [0, 2, 4, 6, 8, 10]; you kept {kept}. Without stable=True, torch.sort orders "
             "tied values arbitrarily in rows of more than 16 entries: sort with descending=True, stable=True")
    p = call(fn, probs.log().expand(3, 5), top_p=0.6, what="next_token_probs(logits [3, 5], top_p=0.6)")
    expect_tensor(p, "the probabilities", shape=(3, 5))
    ok("top-p: the token that crosses top_p stays, ties go to the lower id, the rest renormalised")


def check_sample(fn):
    """Check sample_next_token(probs, generator=None) -> long ids, one per row, drawn with the generator."""
    require_callable(fn, "sample_next_token")
    row = torch.tensor([0.5, 0.0, 0.3, 0.2], dtype=torch.float64)
    probs = row.expand(4000, 4)
    ids = call(fn, probs, torch.Generator().manual_seed(0), what="sample_next_token(probs, generator)")
    expect_tensor(ids, "the sampled ids", shape=(4000,), dtype=torch.long)
    again = call(fn, probs, torch.Generator().manual_seed(0), what="sample_next_token(probs, generator)")
    if bool((ids == 0).all()):
        fail("every draw is the most likely token: that is greedy decoding (argmax), not sampling")
    if bool((ids == 1).any()):
        fail("a token of probability 0 was drawn: probs are already probabilities (no softmax); draw from them")
    if not same(ids, again):
        fail("two generators with the same seed gave different draws: pass the generator to the sampler "
             "(torch.multinomial(..., generator=generator))")
    freq = torch.bincount(ids, minlength=4).double() / len(ids)
    if max_error(freq, row) > 0.04:
        fail(f"the frequencies {freq.tolist()} are far from the probabilities {row.tolist()}")
    lead = call(fn, row.float().expand(2, 3, 4), what="sample_next_token(float32 probs [2, 3, 4])")
    expect_tensor(lead, "ids for probs [2, 3, 4]", shape=(2, 3), dtype=torch.long)
    if bool((lead == 1).any()):
        fail("a token of probability 0 was drawn from float32 probabilities")
    ok(f"sample_next_token: frequencies {[round(f, 3) for f in freq.tolist()]} for {row.tolist()}, reproducible")


# ---- masked language modelling -----------------------------------------------------------------------------------
def _mlm_batch():
    """64 rows of [CLS] words [SEP] (ids 1 and 2), 8 of them padded (id 0) after position 100; [MASK] = 3."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 500, (64, 128), generator=g)
    tokens[:, 0], tokens[:, -1] = 1, 2
    tokens[:8, 100:] = 0
    return tokens, tokens < 4


def _mlm_call(fn, tokens, special, seed):
    out = call(fn, tokens, special, 3, 500, generator=torch.Generator().manual_seed(seed),
               what="mlm_mask(tokens, special_mask, 3, 500, generator=...)")
    inputs, labels = _pair(out, "mlm_mask")
    expect_tensor(inputs, "inputs", shape=tuple(tokens.shape), dtype=torch.long)
    expect_tensor(labels, "labels", shape=tuple(tokens.shape), dtype=torch.long)
    return inputs, labels


def check_mlm_properties(fn):
    """Check mlm_mask's exact properties: labels, unchanged positions, special positions never chosen."""
    require_callable(fn, "mlm_mask")
    tokens, special = _mlm_batch()
    original = tokens.clone()
    inputs, labels = _mlm_call(fn, tokens, special, 1)
    if not same(tokens, original):
        fail("mlm_mask changed its tokens argument: return new tensors")
    if same(labels, tokens):
        fail("labels must be -100 wherever a position is not chosen (the loss ignores it); you labelled every position")
    chosen = labels != IGNORE
    if bool((chosen & special).any()):
        fail("special positions ([CLS], [SEP], [PAD]) were chosen: choose only where special_mask is False")
    if not bool(chosen.any()):
        fail("no position was chosen: labels are -100 everywhere")
    if not same(labels[chosen], tokens[chosen]):
        fail("at chosen positions the label is the original token")
    if not same(inputs[~chosen], tokens[~chosen]):
        fail("positions that are not chosen keep their token in the inputs")
    again = _mlm_call(fn, tokens, special, 1)
    if not same(again[0], inputs) or not same(again[1], labels):
        fail("the same seed should give the same masking: draw every random number with the generator")
    ok(f"mlm_mask: labels -100 except at the {int(chosen.sum())} chosen positions, no special position chosen, "
       "the rest unchanged, reproducible")


def check_mlm_statistics(fn):
    """Check mlm_mask's statistics: 15% of non-special positions chosen, 80/10/10 mask/random/unchanged."""
    require_callable(fn, "mlm_mask")
    tokens, special = _mlm_batch()
    inputs, labels = _mlm_call(fn, tokens, special, 2)
    chosen = (labels != IGNORE) & ~special
    rate = float(chosen.sum()) / float((~special).sum())
    if abs(rate - 0.15) > 0.02:
        fail(f"{rate:.3f} of the non-special positions were chosen; expected about 0.15 (mlm_prob)")
    masked = float((inputs[chosen] == 3).double().mean())
    kept = float((inputs[chosen] == tokens[chosen]).double().mean())
    if abs(masked - 0.8) > 0.05 or abs(kept - 0.1) > 0.04:
        fail(f"of the chosen positions {masked:.2f} became the mask token and {kept:.2f} stayed; BERT uses 80% "
             "mask, 10% a random token, 10% unchanged")
    # A batch whose words are ids 4 .. 24 only: random replacements still come from the whole vocabulary.
    narrow = torch.where(special, tokens, 4 + tokens % 21)
    inputs, labels = _mlm_call(fn, narrow, special, 4)
    chosen = (labels != IGNORE) & ~special
    replaced = inputs[chosen][(inputs[chosen] != 3) & (inputs[chosen] != narrow[chosen])]
    if len(replaced) >= 20 and float((replaced <= 24).double().mean()) > 0.5:
        fail(f"in a batch whose words are ids 4 .. 24, {int((replaced <= 24).sum())} of the {len(replaced)} random "
             "replacements were ids 4 .. 24: draw them uniformly from the whole vocabulary, 0 .. vocab_size - 1 "
             "(torch.randint(vocab_size, ..., generator=generator)), not from the batch's tokens")
    # A vocabulary of 8 ids and 90% chosen: about 90 random draws of each id, so every id must show up.
    small = torch.where(special, tokens, 4 + tokens % 4)
    inputs = _pair(call(fn, small, special, 3, 8, mlm_prob=0.9, generator=torch.Generator().manual_seed(5),
                        what="mlm_mask(..., vocab_size=8, mlm_prob=0.9)"), "mlm_mask")[0]
    picked = ((inputs != small) & (inputs != 3) & ~special)
    unseen = sorted(set(range(8)) - {3} - set(inputs[picked].tolist()) - set(small[~special].tolist()))
    if unseen:
        fail(f"with vocab_size=8 your random replacements never drew id {unseen[0]}: draw them from the whole vocabulary, "
             "torch.randint(vocab_size, ...) gives 0 .. vocab_size - 1 (torch.randint(1, vocab_size, ...) leaves out 0)")
    out = call(fn, tokens, special, 3, 500, mlm_prob=0.3, generator=torch.Generator().manual_seed(3),
               what="mlm_mask(..., mlm_prob=0.3)")
    rate30 = float(((_pair(out, "mlm_mask")[1] != IGNORE) & ~special).sum()) / float((~special).sum())
    if abs(rate30 - 0.3) > 0.025:
        fail(f"with mlm_prob=0.3, {rate30:.3f} of the non-special positions were chosen: use the mlm_prob argument")
    ok(f"mlm_mask: {rate:.3f} chosen, {masked:.2f} masked / {1 - masked - kept:.2f} random / {kept:.2f} kept")


# ---- grouped-query attention ------------------------------------------------------------------------------------
def _gqa_cache_shape(k, v, expected):
    for name, t in (("keys", k), ("values", v)):
        if not isinstance(t, torch.Tensor):
            fail(f"the returned {name} should be a tensor, got {type(t).__name__}")
    if tuple(k.shape) != tuple(expected) and len(k.shape) == 4 and k.shape[1] == 4 and expected[1] == 2:
        fail(f"the returned cache holds {k.shape[1]} heads, one per query head: keep the n_kv_head = 2 heads "
             f"[B, n_kv_head, T, D] = {list(expected)} and repeat them only for the attention; a cache of "
             "repeated keys saves no memory")
    expect_tensor(k, "the returned keys", shape=expected)
    expect_tensor(v, "the returned values", shape=expected)


@torch.no_grad()
def check_gqa(cls):
    """Check GroupedQueryAttention(n_embd, n_head, n_kv_head).forward(x) -> (y, (k, v)) without a cache."""
    c = _data()["gqa"]
    module = build_module(cls, c["init"], "GroupedQueryAttention", c["state"])
    x = tensor(c["x"])
    with forbidding(NO_MHA, "GroupedQueryAttention"):
        y, k, v = _kv(call(module, x, what="GroupedQueryAttention.forward(x)"), "GroupedQueryAttention.forward")
    _gqa_cache_shape(k, v, (2, 2, 5, 3))
    expect_tensor(y, "the output y", shape=(2, 5, 12))
    if not close(y, tensor(c["y"])):
        x2 = x.clone()
        x2[:, -1] += 1.0
        y2 = call(module, x2, what="GroupedQueryAttention.forward(x)")[0]
        if max_error(y[:, :-1], y2[:, :-1]) > 1e-9:
            fail("changing the last token changed the outputs at earlier positions: the attention is not "
                 "causal. Pass is_causal=True to F.scaled_dot_product_attention (no cache)")
        if close(y, tensor(c["y_strided"])):
            fail("query head h must use key/value head h // (n_head // n_kv_head): consecutive query heads share "
                 "one (k.repeat_interleave(group, dim=1)); k.repeat(1, group, 1, 1) pairs head h with h % n_kv_head")
        fail(f"the output differs from the expected one (max error {max_error(y, tensor(c['y'])):.3g}): q, k, v = "
             "c_attn(x).split([C, n_kv_head * D, n_kv_head * D], dim=-1), heads [B, heads, T, D], keys and values "
             "repeat_interleave'd to n_head heads, causal attention, heads merged back to [B, T, C], then c_proj")
    if not (close(k, tensor(c["k"])) and close(v, tensor(c["v"]))):
        fail("y is right but the returned (k, v) are not this call's keys and values, [B, n_kv_head, T, D], before "
             "they are repeated for the query heads")
    _check_dropout_and_float32(cls, c, module, x, "GroupedQueryAttention")
    w = c["wide"]
    wide = build_module(cls, w["init"], "GroupedQueryAttention", w["state"])
    with forbidding(NO_MHA, "GroupedQueryAttention"):
        y8 = _kv(call(wide, tensor(w["x"]), what="GroupedQueryAttention(16, 8, 4).forward(x)"),
                 "GroupedQueryAttention.forward")[0]
    if not close(y8, tensor(w["y"])):
        if close(y8, tensor(w["y_by_kv_count"])):
            fail("with 8 query heads and 4 key/value heads, query head h must read key/value head h // (n_head // "
                 "n_kv_head) = h // 2 (groups of consecutive query heads); yours reads h // n_kv_head = h // 4. With 4 "
                 "query heads and 2 key/value heads the two are the same")
        fail(f"with 8 query heads and 4 key/value heads the output differs from the expected one (max error "
             f"{max_error(y8, tensor(w['y'])):.3g})")
    ok("GroupedQueryAttention: 4 query heads share 2 key/value heads (h // 2), and 8 share 4; the cache holds "
       "n_kv_head heads")


@torch.no_grad()
def check_gqa_cache(cls):
    """Check GroupedQueryAttention.forward(x, past_kv) with a cache of n_kv_head heads."""
    c = _data()["gqa"]
    module = build_module(cls, c["init"], "GroupedQueryAttention", c["state"])
    past = (tensor(c["past_k"]), tensor(c["past_v"]))
    x = tensor(c["x_new"])
    try:
        with forbidding(NO_MHA, "GroupedQueryAttention"):
            out = module(x, past_kv=past)
    except NotImplementedError:
        fail("GroupedQueryAttention.forward is not implemented yet: replace `raise NotImplementedError()`", NotDoneYet)
    except Exception as exc:
        fail(f"GroupedQueryAttention.forward(x, past_kv) with past keys [B, n_kv_head, T_past, D] = [2, 2, 3, 3] "
             f"raised {type(exc).__name__}: {exc}")
    y, k, v = _kv(out, "GroupedQueryAttention.forward")
    _gqa_cache_shape(k, v, (2, 2, 5, 3))
    expect_tensor(y, "the output y", shape=(2, 2, 12))
    if not (close(k, tensor(c["k_cached"])) and close(v, tensor(c["v_cached"]))):
        fail("the returned cache should be torch.cat([past, new], dim=2) of the n_kv_head heads: the past first")
    if not close(y, tensor(c["y_cached"])):
        if close(y, tensor(c["y_cached_no_mask"])):
            fail("with a cache and several new tokens, new token i must not see the new tokens after it: pass the "
                 "shifted causal mask (query i sees keys 0 .. t_past + i) when past_kv is given")
        if close(y, tensor(c["y_cached_top_left"])):
            fail("with a cache the causal mask must be shifted: new query i sits at position t_past + i and sees "
                 "keys 0 .. t_past + i. is_causal=True aligns the mask to the top left (query 0 sees key 0 only); "
                 "build the mask yourself when past_kv is given")
        if close(y, tensor(c["y_cached_strided"])):
            fail("query head h must use key/value head h // (n_head // n_kv_head): consecutive query heads share "
                 "one (k.repeat_interleave(group, dim=1)); k.repeat(1, group, 1, 1) pairs head h with h % n_kv_head")
        fail(f"with a cache the output differs from the expected one (max error {max_error(y, tensor(c['y_cached'])):.3g})")
    ok("GroupedQueryAttention with a cache: 2 key/value heads grow along time, the mask is shifted by the past")


def check_gqa_from_mha(fn):
    """Check gqa_from_mha(weight, bias, n_head, n_kv_head) -> (weight, bias) of a grouped-query c_attn."""
    require_callable(fn, "gqa_from_mha")
    c = _data()["gqa_from_mha"]
    weight, bias = tensor(c["weight"]), tensor(c["bias"])
    out = _pair(call(fn, weight, bias, 4, 2, what="gqa_from_mha(weight [36, 12], bias [36], 4, 2)"), "gqa_from_mha")
    w, b = out
    expect_tensor(w, "the converted weight")
    expect_tensor(b, "the converted bias")
    if tuple(w.shape) == (18, 12):
        fail("the converted weight has shape [18, 12]: you pooled the queries too. Keep every query row (the first "
             "C = 12) and pool only the keys and the values, to n_kv_head * D = 6 rows each: [24, 12]")
    expect_tensor(w, "the converted weight", shape=(24, 12))
    expect_tensor(b, "the converted bias", shape=(24,))
    if not close(w[:12], weight[:12]):
        fail("the first C rows (the queries) must be copied unchanged: every query head keeps its own projection")
    if not close(w, tensor(c["expected_weight"])):
        if close(w, tensor(c["first_weight"])):
            fail("you kept the first head of each group; mean pooling averages the group's heads "
                 "(the mean of the key rows of heads g * group .. (g + 1) * group - 1)")
        if close(w, tensor(c["sum_weight"])):
            fail("you summed the heads of each group: average them (divide by n_head // n_kv_head)")
        if close(w, tensor(c["strided_weight"])):
            fail("group g holds the consecutive heads g * group .. (g + 1) * group - 1 (query head h uses key/value "
                 "head h // group), not heads g, g + n_kv_head, ...")
        fail(f"the converted weight differs from the expected one (max error "
             f"{max_error(w, tensor(c['expected_weight'])):.3g}): rows [q | mean of each group's k heads | the same for v]")
    if not close(b, tensor(c["expected_bias"])):
        fail("the weight is right but the bias is not: pool the key and value biases the same way")
    w32 = call(fn, weight.float(), bias.float(), 4, 2, what="gqa_from_mha in float32")[0]
    expect_tensor(w32, "the converted float32 weight", dtype=torch.float32)
    mha = _pair(call(fn, weight, bias, 4, 4, what="gqa_from_mha(weight, bias, 4, 4)"), "gqa_from_mha")
    if not (close(mha[0], weight) and close(mha[1], bias)):
        fail("with n_kv_head = n_head every group is one head: the weights must come back unchanged")
    ok("gqa_from_mha: queries kept, each group of 2 key/value heads averaged into one")


# ---- speculative decoding -----------------------------------------------------------------------------------------
PAD = -1


def _spec_call(fn, p, q, x, seed, what):
    out = call(fn, p, q, x, torch.Generator().manual_seed(seed), what=what)
    expect_tensor(out, "the result", shape=(*x.shape[:-1], x.shape[-1] + 1), dtype=torch.long)
    return out


def check_speculative_step(fn):
    """Check speculative_step(target_probs, draft_probs, draft_tokens, generator) -> long [..., k + 1]."""
    require_callable(fn, "speculative_step")
    f64 = torch.float64
    rows = 2000
    # k = 1. Draft token 1: p = 0.25, q = 0.5, so it is accepted half the time; on a rejection the residual
    # max(0, p - q) is all on token 0; token 3 (p_1 = 1) is the only possible bonus token.
    p = torch.tensor([[0.75, 0.25, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]], dtype=f64).expand(rows, 2, 4)
    q = torch.tensor([[0.1, 0.5, 0.2, 0.2]], dtype=f64).expand(rows, 1, 4)
    x = torch.ones(rows, 1, dtype=torch.long)
    what = "speculative_step on 2,000 rows, k = 1, draft token 1 with p = 0.25 and q = 0.5"
    out = _spec_call(fn, p, q, x, 0, what)
    again = _spec_call(fn, p, q, x, 0, what)
    if not same(out, again):
        fail("two generators with the same seed gave different results: draw every random number from the "
             "generator argument (torch.rand(..., generator=generator), torch.multinomial(..., generator=generator))")
    first, second = out[:, 0], out[:, 1]
    if bool((first == PAD).any()) or bool(((first < 0) | (first > 3)).any()):
        fail("every row must start with a token: the accepted draft token or the correction")
    two = second != PAD                                  # rows where the draft token was accepted (+ bonus)
    ended = ~two
    if not bool(two.any()) and bool((first == 1).any()):
        fail("no row has a bonus token: when every draft token is accepted, add one more token drawn from p_(k+1) "
             "(target_probs[..., k, :], the last row); a step always adds one token of its own")
    if bool((first[two] != 1).any()):
        fail("a row with two tokens must start with the accepted draft token (1 here)")
    if bool((first[ended] >= 2).any()):
        fail("after a rejection you drew a token that the target gives probability 0 (2 or 3 here): the correction is "
             "drawn from max(0, p - q), normalised, not from the draft's q")
    if bool((first[ended] == 1).any()):
        fail("after a rejection you resampled from the target's p: draw the correction from max(0, p - q), "
             "normalised (here all on token 0); drawing from p brings the rejected token back too often")
    share = float(two.double().mean())
    if share > 0.95:
        fail(f"the draft token was accepted in {share:.0%} of the rows, but the target gives it p = 0.25 and the draft "
             "q = 0.5: accept it with probability min(1, p / q) = 0.5 (u < p / q for a uniform u), not q / p and "
             "not always")
    if share < 0.05:
        fail(f"the draft token was accepted in {share:.0%} of the rows: accept it with probability min(1, p / q) = "
             "0.5, drawing a uniform u and accepting when u < p / q (not only when p >= q)")
    if abs(share - 0.5) > 0.06:
        fail(f"the draft token was accepted in {share:.1%} of the rows, expected about 50%: accept when u < p / q")
    if bool((second[two] != 3).any()):
        fail("the bonus token must come from target_probs[..., k, :] (here always token 3), the position after the "
             "last draft token, not from an earlier distribution")
    c = _data()["speculative"]
    pc, qc, xc = tensor(c["p"]), tensor(c["q"]), torch.tensor(c["x"])
    got = _spec_call(fn, pc, qc, xc, 0, "speculative_step(p [16, 4, 6], q [16, 3, 6], x [16, 3], seed 0)")
    want = torch.tensor(c["out"])
    if not same(got, want):
        fail(f"the rules are right, but with a generator of seed 0 the reference returns {want.tolist()} and yours "
             f"{got.tolist()}: follow the docstring's order of draws (all k uniforms first, as one torch.rand of "
             "target_probs' dtype, then one torch.multinomial for all rows) so that the hidden tests can compare tokens")
    got32 = _spec_call(fn, pc.float(), qc.float(), xc, 0, "speculative_step with float32 probabilities")
    if not same(got32[..., 0] >= 0, torch.ones(len(xc), dtype=torch.bool)):
        fail("with float32 probabilities every row must still start with a token")
    single = call(fn, pc[0], qc[0], xc[0], torch.Generator().manual_seed(0), what="speculative_step without a batch axis")
    expect_tensor(single, "the result for one sequence (p [4, 6], q [3, 6], x [3])", shape=(4,), dtype=torch.long)
    ok(f"speculative_step: accepted {share:.0%} where min(1, p / q) = 50%, corrections from max(0, p - q), bonus from "
       "p_(k+1), reproducible")


# ---- multi-head latent attention --------------------------------------------------------------------------------
def _mla_call(module, what, *args, **kwargs):
    """(y, c_kv, k_pe) of a MultiHeadLatentAttention call, with PyTorch's attention modules forbidden."""
    with forbidding(NO_MHA, "MultiHeadLatentAttention"):
        y, c_kv, k_pe = _kv(call(module, *args, what=what, **kwargs), "MultiHeadLatentAttention.forward")
    return y, c_kv, k_pe


def _mla_cache_shapes(c_kv, k_pe, t):
    expect_tensor(c_kv, "the cached latents c_kv", shape=(2, t, 4))
    expect_tensor(k_pe, "the cached rotated keys k_pe", shape=(2, t, 2))


@torch.no_grad()
def check_mla(cls):
    """Check MultiHeadLatentAttention(...).forward(x) -> (y, (c_kv, k_pe)) without a cache."""
    c = _data()["mla"]
    module = build_module(cls, c["init"], "MultiHeadLatentAttention", c["state"])
    x = tensor(c["x"])
    y, c_kv, k_pe = _mla_call(module, "MultiHeadLatentAttention.forward(x)", x)
    expect_tensor(y, "the output y", shape=(2, 5, 12))
    _mla_cache_shapes(c_kv, k_pe, 5)
    if not close(c_kv, tensor(c["c_kv"])):
        if close(c_kv, tensor(c["c_kv_not_normalised"])):
            fail("the cache should hold the latents after kv_norm: c_kv, k_pe = wkv_a(x).split([kv_rank, rope_dim], "
                 "-1), then c_kv = kv_norm(c_kv); keys and values are made from the normalised latents")
        fail("the cached latents differ: c_kv = kv_norm(the first kv_rank features of wkv_a(x))")
    if not close(k_pe, tensor(c["k_pe"])):
        fail("the cached keys k_pe should be the last rope_dim features of wkv_a(x), rotated by your apply_rope at "
             "positions 0 .. T - 1 (one key for all heads)")
    if not close(y, tensor(c["y"])):
        x2 = x.clone()
        x2[:, -1] += 1.0
        y2 = _mla_call(module, "MultiHeadLatentAttention.forward(x)", x2)[0]
        if max_error(y[:, :-1], y2[:, :-1]) > 1e-9:
            fail("changing the last token changed the outputs at earlier positions: the attention is not causal")
        if close(y, tensor(c["y_query_not_rotated"])):
            fail("your queries' rope part is not rotated: rotate q_pe with apply_rope at the tokens' positions, as "
                 "k_pe is; without it the scores cannot depend on relative positions")
        if close(y, tensor(c["y_scale_nope"])):
            fail("scale the scores by 1 / sqrt(nope_dim + rope_dim), the width of the whole query [q_nope | q_pe]")
        fail(f"the output differs from the expected one (max error {max_error(y, tensor(c['y'])):.3g}): per head, "
             "query [q_nope | rotated q_pe], key [k_nope | the shared rotated k_pe], value v, with k_nope and v from "
             "wkv_b(c_kv); causal attention; heads side by side, then wo")
    _check_dropout_and_float32(cls, c, module, x, "MultiHeadLatentAttention", proj="wo")
    ok("MultiHeadLatentAttention: keys and values from the latents, a decoupled rotated key shared by the heads; "
       "the cache holds the latents and that key")


@torch.no_grad()
def _check_mla_with_cache(cls, absorbed):
    c = _data()["mla"]
    module = build_module(cls, c["init"], "MultiHeadLatentAttention", c["state"]).eval()
    past = (tensor(c["past_c_kv"]), tensor(c["past_k_pe"]))
    what = ("MultiHeadLatentAttention.forward(x, past, absorbed=True)" if absorbed else
            "MultiHeadLatentAttention.forward(x, past)")
    kwargs = {"absorbed": True} if absorbed else {}
    y, c_kv, k_pe = _mla_call(module, f"{what} with a cache of 3 tokens", tensor(c["x_new"]), past, **kwargs)
    expect_tensor(y, "the output y", shape=(2, 2, 12))
    _mla_cache_shapes(c_kv, k_pe, 5)
    if not close(y, tensor(c["y_cached"])):
        if close(y, tensor(c["y_cached_positions_from_0"])):
            fail("with a cache, the new tokens sit at positions T_past .. T_past + T - 1: rotate their q_pe and k_pe "
                 "at those positions, not at 0 .. T - 1")
        if close(y, tensor(c["y_cached_top_left"])):
            fail("with a cache the causal mask must be shifted: new query i sits at position T_past + i and sees "
                 "keys 0 .. T_past + i")
    if not (close(c_kv, tensor(c["c_kv_cached"])) and close(k_pe, tensor(c["k_pe_cached"]))):
        fail("the returned cache should be torch.cat([past, new], dim=1) for c_kv and for k_pe: the past first, "
             "the new tokens' normalised latents and rotated keys after it")
    if not close(y, tensor(c["y_cached"])):
        fail(f"{what}: with a cache the output differs from the expected one (max error "
             f"{max_error(y, tensor(c['y_cached'])):.3g})")


def check_mla_cache(cls):
    """Check MultiHeadLatentAttention.forward(x, past): continuing from a cache of (c_kv, k_pe)."""
    _check_mla_with_cache(cls, absorbed=False)
    ok("MultiHeadLatentAttention with a cache: the latents and the rotated keys grow along time, positions and mask "
       "shifted by the past")


@torch.no_grad()
def check_mla_absorbed(cls):
    """Check forward(x, past, absorbed=True): the plain path's output, without a key or a value ever made."""
    _check_mla_with_cache(cls, absorbed=True)
    # One new token against a cache of 64: the keys of the plain path, wkv_b(c_kv), hold 65 x 8 x 32 numbers, and
    # the keys and values together twice that; the absorbed path's largest tensor is the scores or a view of wkv_b's
    # weight (a few hundred numbers), and all it makes together is a fraction of the keys and values.
    init = {"n_embd": 16, "n_head": 8, "q_rank": 8, "kv_rank": 4, "nope_dim": 32, "rope_dim": 2, "v_dim": 32}
    try:
        wide = cls(**init).double().eval()
    except Exception as exc:
        fail(f"MultiHeadLatentAttention(**{init}) raised {type(exc).__name__}: {exc}")
    g = torch.Generator().manual_seed(0)
    past = (torch.randn(1, 64, 4, generator=g, dtype=torch.float64),
            torch.randn(1, 64, 2, generator=g, dtype=torch.float64))
    x = torch.randn(1, 1, 16, generator=g, dtype=torch.float64)
    with LargestTensor() as seen:
        y = _mla_call(wide, "forward(x, past, absorbed=True) with 8 heads and a cache of 64 tokens", x, past,
                      absorbed=True)[0]
    keys, keys_and_values, made = 65 * 8 * 32, 65 * 8 * (32 + 32), seen.created
    if seen.largest >= keys:
        fail(f"absorbed=True made a tensor of {seen.largest:,} numbers decoding one token against 64 cached ones: it "
             f"builds the heads' keys or values from the latents (wkv_b(c_kv), {keys:,} numbers each). Absorb wkv_b "
             "instead: its key rows into the query (q_nope @ w_k, scored against c_kv), its value rows into the output")
    if made >= keys_and_values:
        fail(f"absorbed=True made {made:,} numbers in all decoding one token against 64 cached ones, more than the "
             f"heads' keys and values made from the latents ({keys_and_values:,}): building them in pieces is still "
             "building them. Absorb wkv_b instead: its key rows into the query (q_nope @ w_k, scored against c_kv), "
             "its value rows into the output")
    y_plain = _mla_call(wide, "forward(x, past)", x, past)[0]
    if not close(y, y_plain, atol=1e-9):
        fail(f"with 8 heads and a cache of 64 tokens, absorbed=True differs from the plain path (max error "
             f"{max_error(y, y_plain):.3g})")
    ok(f"absorbed=True gives the plain path's output, and decoding one token against 64 cached ones it made no "
       f"tensor larger than {seen.largest:,} numbers (the plain path's keys: {keys:,})")


# ---- sliding windows and attention sinks ----------------------------------------------------------------------------
def _as_bool_mask(m, what, shape):
    expect_tensor(m, what, shape=shape)
    if m.dtype != torch.bool:
        fail(f"{what} has dtype {m.dtype}; return a bool tensor (True where the query may attend), as the masks of "
             "F.scaled_dot_product_attention are")
    return m


def check_sliding_window_mask(fn):
    """Check sliding_window_mask(t_q, t_k, window, sinks) -> bool [t_q, t_k]."""
    require_callable(fn, "sliding_window_mask")
    c = _data()["window"]["mask"]
    t_q, t_k, window, sinks = c["t_q"], c["t_k"], c["window"], c["sinks"]
    what = f"sliding_window_mask({t_q}, {t_k}, window={window}, sinks={sinks})"
    got = _as_bool_mask(call(fn, t_q, t_k, window, sinks, what=what), what, (t_q, t_k))
    if not same(got, torch.tensor(c["expected"])):
        if same(got, torch.tensor(c["top_left"])):
            fail(f"{what}: your queries sit at positions 0 .. t_q - 1; they are the last t_q of the t_k positions "
                 "(query i at t_k - t_q + i), as when the earlier keys come from a cache")
        if same(got, torch.tensor(c["wide"])):
            fail(f"{what}: each query sees window + 1 positions: the window holds the query itself and the window - 1 "
                 "before it (p - j < window, not <=)")
        if same(got, torch.tensor(c["no_sinks"])):
            fail(f"{what}: the first sinks positions are missing from the rows whose window has passed them: a query "
                 "also attends to every key j < sinks (the attention sinks), however far back")
        expected, got_list = torch.tensor(c["expected"]).int().tolist(), got.int().tolist()
        fail(f"{what}: expected {expected}, got {got_list}")
    small = _as_bool_mask(call(fn, 3, 3, 1, 2, what="sliding_window_mask(3, 3, window=1, sinks=2)"),
                          "sliding_window_mask(3, 3, window=1, sinks=2)", (3, 3))
    if not same(small, torch.tensor(c["causal_sinks"])):
        fail("sliding_window_mask(3, 3, window=1, sinks=2): a sink is a key like any other, so it stays causal: the "
             f"first query (position 0) may not see position 1, a sink still in its future; got {small.int().tolist()}")
    what = "sliding_window_mask(5, 5, window=9, sinks=0)"
    if not same(_as_bool_mask(call(fn, 5, 5, 9, 0, what=what), what, (5, 5)), torch.ones(5, 5, dtype=torch.bool).tril()):
        fail("a window wider than the keys is plain causal attention: sliding_window_mask(5, 5, 9, 0) should "
             "be the lower triangle")
    what = "sliding_window_mask(2, 6, window=1, sinks=0)"
    if _as_bool_mask(call(fn, 2, 6, 1, 0, what=what), what, (2, 6)).sum(-1).tolist() != [1, 1]:
        fail("with window=1 and no sinks each query sees exactly one key, itself")
    ok("sliding_window_mask: causal, window - 1 positions back plus the query, the sinks kept, queries at the end")


def _rolling_step(fn, cache, step, window, sinks, n):
    number, t = n + 1, len(step["k"][0][0])
    what = f"rolling_cache_update(step {number}: {t} new token(s), window={window}, sinks={sinks})"
    out = call(fn, cache, tensor(step["k"]), tensor(step["v"]), window, sinks, what=what)
    if not isinstance(out, (tuple, list)) or len(out) != 4:
        fail(f"{what} should return four things, (keys, values, positions, new_cache); got {type(out).__name__}")
    keys, values, positions, new_cache = out
    if not isinstance(new_cache, (tuple, list)) or len(new_cache) != 3:
        fail(f"{what}: new_cache should be the tuple (k_kept, v_kept, positions_kept) the next step receives")
    for t, name in [(keys, "keys"), (values, "values"), (positions, "positions"), *zip(new_cache, ["k_kept", "v_kept",
                                                                                                  "positions_kept"])]:
        expect_tensor(t, f"{what}: {name}")
    if positions.dtype != torch.long or new_cache[2].dtype != torch.long:
        fail(f"{what}: positions must be long tensors (torch.arange(...) gives long)")
    return what, keys, values, positions, tuple(new_cache)


def check_rolling_cache(fn):
    """Check rolling_cache_update(cache, k, v, window, sinks) -> (keys, values, positions, new_cache), over five steps."""
    require_callable(fn, "rolling_cache_update")
    c = _data()["window"]["rolling"]
    window, sinks, cache = c["window"], c["sinks"], None
    for n, step in enumerate(c["steps"]):
        what, keys, values, positions, cache = _rolling_step(fn, cache, step, window, sinks, n)
        want, kept = step["positions"], step["kept"]
        got, got_kept = positions.tolist(), cache[2].tolist()
        if got != want:
            if got == kept:
                fail(f"{what}: you returned positions {got}, the cache after eviction; return the kept entries and "
                     f"all the new ones ({want}): the new queries still need the keys that the eviction drops")
            t = len(step["k"][0][0])
            want_new, got_new = want[-t:], got[-t:]
            if got[:-t] == want[:-t]:
                fail(f"{what}: the new tokens' positions should be {want_new}, got {got_new}: they continue from the "
                     "last position seen plus one, not from the cache's size (the cache has dropped positions)")
            fail(f"{what}: expected positions {want}, got {got} (the kept entries first, then the new ones)")
        if got_kept != kept:
            recent = [p for p in got_kept if p >= sinks]
            if [p for p in kept if p < sinks] != [p for p in got_kept if p < sinks]:
                fail(f"{what}: the kept positions {got_kept} lose the sinks: the first {sinks} positions stay in the "
                     f"cache for ever (expected {kept})")
            if len(recent) == window - 1:
                fewer = len(recent)
                fail(f"{what}: you keep the {fewer} most recent positions ({recent}); keep the window = {window} "
                     f"most recent, what the last query attended to, so that the cache always holds the last position "
                     f"seen (expected {kept})")
            fail(f"{what}: the cache should keep positions {kept}, got {got_kept}")
        if not (close(keys, tensor(step["keys"])) and close(values, tensor(step["values"]))):
            if close(keys, tensor(step["values"])):
                fail(f"{what}: keys and values are swapped")
            error = max_error(keys, tensor(step["keys"]))
            fail(f"{what}: the positions are right but the keys or values are not (max error {error:.3g}); "
                 "concatenate the kept ones and the new ones along the time axis (dim -2), in that order")
        if not (close(cache[0], keys[..., [got.index(p) for p in kept], :])
                and close(cache[1], values[..., [got.index(p) for p in kept], :])):
            fail(f"{what}: the kept keys and values must be the entries of the kept positions")
    largest = sinks + window
    ok(f"rolling_cache_update: five steps, the cache never above sinks + window = {largest} entries, the sinks kept")


def check_attention_with_sinks(fn):
    """Check attention_with_sinks(q, k, v, sink_logits, mask) -> [B, H, T_q, D]."""
    require_callable(fn, "attention_with_sinks")
    c = _data()["window"]["sinks"]
    q, k, v, sink, mask = tensor(c["q"]), tensor(c["k"]), tensor(c["v"]), tensor(c["sink"]), torch.tensor(c["mask"])
    what = "attention_with_sinks(q [1, 2, 3, 4], k and v [1, 2, 5, 4], sink_logits [0.5, -1.0], a window mask)"
    y = call(fn, q, k, v, sink, mask, what=what)
    expect_tensor(y, what, shape=(1, 2, 3, 4))
    if not close(y, tensor(c["expected"])):
        if close(y, tensor(c["plain"])):
            fail(f"{what}: your output is plain attention, as if there were no sink: append the sink logit as one more "
                 "column of the scores, softmax over all the columns, then drop the sink's column without "
                 "renormalising (the weights on the keys then sum to less than 1)")
        if close(y, tensor(c["scaled"])):
            fail(f"{what}: you divided the sink logit by sqrt(D) too; only q k^T is scaled, the sink logit is "
                 "learned on the scale of the scaled scores")
        error = max_error(y, tensor(c["expected"]))
        fail(f"{what}: max error {error:.3g} against the expected output")
    none = call(fn, q, k, v, sink, torch.tensor(c["none_mask"]), what="attention_with_sinks with a query whose mask "
                                                                       "allows no key")
    if not none.isfinite().all():
        fail("a query whose mask allows no key must give all its weight to the sink, an output of 0; yours has NaN. "
             "Put the sink's column in before the softmax, so that no row is all -inf")
    if not close(none, tensor(c["none_expected"])):
        fail("a query whose mask allows no key must give all its weight to the sink: an output of 0")
    plain = call(fn, q, k, v, torch.full((2,), float("-inf"), dtype=torch.float64), None,
                 what="attention_with_sinks(..., sink_logits = -inf, mask=None)")
    if not close(plain, torch.nn.functional.scaled_dot_product_attention(q, k, v)):
        fail("with sink logits of -inf and no mask the result must be plain attention, "
             "F.scaled_dot_product_attention(q, k, v)")
    dtypes_and_gradients(fn, [q, k, v, sink, mask], "attention_with_sinks", grad_args=(0, 1, 2, 3))
    ok("attention_with_sinks: the sink takes a share of each row's weight, rows with no key give 0, float32 and "
       "float64, gradients reach the sink logits")
