"""Visible checks for chapter 01: additive attention, an attention-decoder step, greedy decoding."""
import torch

from ..layers import decoder_step
from ._core import (build_module, call, close, expect_tensor, fail, load_cases, max_error, module_dtypes, ok,
                    require_callable, same, tensor)


def _data():
    return load_cases("ch01")


def _pair(out, what):
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        fail(f"{what} should return a pair (context, weights), got {type(out).__name__}")
    return out


def check_additive_attention(cls):
    """Check AdditiveAttention(query_dim, key_dim, attn_dim): forward(query, keys, mask=None) -> (context, weights)."""
    c = _data()["attention"]
    att = build_module(cls, c["init"], "AdditiveAttention", c["state"])
    query, keys = tensor(c["query"]), tensor(c["keys"])
    ctx, w = _pair(call(att, query, keys, what="AdditiveAttention.forward(query, keys)"), "AdditiveAttention.forward")
    expect_tensor(w, "the attention weights", shape=(2, 4))
    expect_tensor(ctx, "the context", shape=(2, 4))
    if torch.isnan(w).any():
        fail("the weights contain NaN without any mask")
    if not close(w.sum(-1), torch.ones(2, dtype=w.dtype), atol=1e-9):
        if close(w.sum(0), torch.ones(4, dtype=w.dtype), atol=1e-9):
            fail("your weights sum to 1 over the batch (dim 0), not over the source positions: take the softmax "
                 "over the positions i, dim=-1 of the [B, S] scores")
        fail(f"each sequence's weights must sum to 1 over its source positions; your sums are {w.sum(-1).tolist()}")
    if close(w, tensor(c["no_tanh_weights"])):
        fail("you left out the tanh: the score is v . tanh(W_q s + W_k h_i), a small one-hidden-layer network")
    if not close(w, tensor(c["weights"])):
        fail(f"the weights differ from softmax_i(v . tanh(W_q query + W_k keys_i)) (max error "
             f"{max_error(w, tensor(c['weights'])):.3g}); W_q applies to the query (decoder state), W_k to the keys")
    if not close(ctx, tensor(c["context"])):
        fail("the weights are right but the context is not: it is sum_i a_i h_i, the weighted sum of the keys "
             "(the encoder states themselves, not their projections)")
    ok("AdditiveAttention: scores, softmax over source positions, context")
    module_dtypes(att, [query, keys], "AdditiveAttention.forward(query, keys)")
    ok("AdditiveAttention in float32 returns float32 and agrees with float64")


def check_additive_attention_mask(cls):
    """Check that AdditiveAttention ignores padded source positions (mask False)."""
    c = _data()["attention"]
    att = build_module(cls, c["init"], "AdditiveAttention", c["state"])
    query, keys, mask = tensor(c["query"]), tensor(c["junk_keys"]), torch.tensor(c["mask"])
    ctx, w = _pair(call(att, query, keys, mask=mask, what="AdditiveAttention.forward(query, keys, mask)"),
                   "AdditiveAttention.forward")
    expect_tensor(w, "the masked weights", shape=(2, 4))
    if torch.isnan(w).any():
        fail("masked weights contain NaN")
    pad, real = w[~mask], w[mask]
    if close(w, tensor(c["unmasked_junk_weights"])):
        fail("your attention ignores the mask: padded positions still get weight. Set their scores to "
             "float('-inf') before the softmax (scores.masked_fill(~mask, float('-inf')))")
    if (pad.abs() > 1e-9).any() and (real.abs() < 1e-9).all():
        fail("your mask is inverted: True marks real characters, False marks padding, which must get weight 0")
    if (pad.abs() > 1e-9).any():
        fail("padded positions still get weight: filling their scores with 0 is not enough (exp(0) = 1); "
             "fill them with float('-inf') before the softmax")
    if not close(w.sum(-1), torch.ones(2, dtype=w.dtype), atol=1e-9):
        fail("padding gets weight 0 but the weights no longer sum to 1: you applied the mask after the softmax; "
             "mask the scores before it")
    if not (close(w, tensor(c["masked_weights"])) and close(ctx, tensor(c["masked_context"]))):
        fail(f"masked weights or context differ from the expected ones (max error "
             f"{max_error(w, tensor(c['masked_weights'])):.3g})")
    ok("padded source positions get weight exactly 0; the rest still sums to 1")


def check_decoder_step(cls):
    """Check AttentionDecoder(...).forward(y_prev, state, enc, mask) -> (new_state, logits, weights)."""
    c = _data()["decoder"]
    dec = build_module(cls, c["init"], "AttentionDecoder", c["state"])
    y_prev, s, enc, mask = torch.tensor(c["y_prev"]), tensor(c["s"]), tensor(c["enc"]), torch.tensor(c["mask"])
    out = call(dec, y_prev, s, enc, mask, what="AttentionDecoder.forward(y_prev, state, enc, mask)")
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        fail(f"AttentionDecoder.forward should return (new_state, logits, weights), got {type(out).__name__}")
    new_state, logits, weights = out
    expect_tensor(new_state, "new_state", shape=(2, 4))
    expect_tensor(logits, "logits", shape=(2, 7))
    expect_tensor(weights, "weights", shape=(2, 4))
    if close(new_state, s):
        fail("you returned the previous state: return the GRU's new state s_t")
    if close(weights, tensor(c["new_state_query_weights"])) and not close(weights, tensor(c["weights"])):
        fail("the attention is queried with the new state; in this decoder the query is the previous state "
             "s_{t-1} (the context c_t is an input of the GRU that computes s_t)")
    if close(new_state, tensor(c["unmasked_new_state"])) and not close(new_state, tensor(c["new_state"])):
        fail("the decoder ignores the padding mask: pass mask on to self.attention")
    if close(new_state, tensor(c["swapped_gru_input_state"])):
        fail("the GRU input is [embedding, context] in that order (torch.cat([self.embedding(y_prev), context], -1))")
    if not close(weights, tensor(c["weights"])):
        fail(f"the attention weights differ (max error {max_error(weights, tensor(c['weights'])):.3g}): "
             "call self.attention(state, enc, mask) with the previous state as the query")
    if not close(new_state, tensor(c["new_state"])):
        fail(f"the new state differs (max error {max_error(new_state, tensor(c['new_state'])):.3g}): "
             "s_t = self.gru(cat[embedding(y_prev), c_t], s_{t-1})")
    if not close(logits, tensor(c["logits"])):
        fail("the state is right but the logits are not: logits = self.out(cat[s_t, c_t]), with the new state")
    ok("AttentionDecoder step: attention with s_{t-1}, GRU on [embedding, context], logits from [s_t, c_t]")
    module_dtypes(dec, [y_prev, s, enc, mask], "AttentionDecoder.forward(y_prev, state, enc, mask)")
    ok("AttentionDecoder in float32 returns float32 and agrees with float64")


def _greedy(fn, case, what):
    require_callable(fn, "greedy_decode")
    step = decoder_step(tensor(case["weight"]))
    args = [tensor(case["state"]), tensor(case["enc"]), torch.tensor(case["mask"]), case["bos"], case["eos"],
            case["max_len"]]
    out = call(fn, step, *args, what=what)
    expect_tensor(out, what)
    if out.dtype != torch.long:
        fail(f"greedy_decode should return token ids as a long tensor, got {out.dtype}")
    return out, torch.tensor(case["tokens"]), case


def _diagnose(out, expected, case):
    bos = case["bos"]
    if out.shape[0] != expected.shape[0]:
        fail(f"greedy_decode should return one row per sequence ([{expected.shape[0]}, L]), got {list(out.shape)}")
    if out.shape[1] == expected.shape[1] + 1 and (out[:, 0] == bos).all():
        fail("your output starts with BOS: return only the generated tokens (BOS is the first input, not an output)")
    if out.shape[1] == case["max_len"] and expected.shape[1] < case["max_len"]:
        if same(out[:, : expected.shape[1]], expected):
            fail("you kept decoding after every sequence had produced EOS: stop as soon as all are done "
                 "(the output is shorter than max_len then)")
    if out.shape == expected.shape and not same(out, expected):
        after = torch.zeros_like(expected, dtype=torch.bool)
        for r, stop in enumerate(case["stops"]):
            if stop is not None:
                after[r, stop + 1:] = True
        if same(out[~after], expected[~after]):
            fail("tokens after a sequence's EOS must be the pad id (0 by default): a finished sequence "
                 "keeps being decoded with the others, but its outputs are replaced by pad")
    if out.shape[1] < expected.shape[1] and same(out, expected[:, : out.shape[1]]):
        fail("you stopped when the first sequence produced EOS: stop only when every sequence has produced it "
             "(or after max_len steps)")
    if out.shape[1] > 1 and not same(out, expected):
        fail(f"greedy_decode returned\n{out}\nexpected\n{expected}\nEach step's input must be the previous step's "
             "argmax token (BOS at the first step), and the state must be carried from step to step")
    if not same(out, expected):
        fail(f"greedy_decode returned {out.tolist()}, expected {expected.tolist()}")


def check_greedy_decode(fn):
    """Check greedy_decode(step, state, enc, mask, bos, eos, max_len, pad=0) on one sequence."""
    out, expected, case = _greedy(fn, _data()["greedy"]["single"], "greedy_decode(step, ...) on one sequence")
    _diagnose(out, expected, case)
    ok(f"one sequence: {out.tolist()[0]} (stops at EOS = {case['eos']})")


def check_greedy_batched(fn):
    """Check greedy_decode on a batch whose sequences finish at different steps."""
    out, expected, case = _greedy(fn, _data()["greedy"]["batched"], "greedy_decode(step, ...) on a batch of 4")
    _diagnose(out, expected, case)
    ok(f"a batch of 4 finishing at steps {case['stops']}: padded after EOS, stops when all are done")
