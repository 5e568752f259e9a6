"""Known-wrong implementations for chapter 01 (see tests/zoo/__init__.py)."""
import torch

from . import collector

ATTENTION = {"test_attention_unmasked", "test_attention_masked", "test_decoder_step"}
MASKED = {"test_attention_masked", "test_decoder_step"}
GREEDY = {"test_greedy_decode", "test_greedy_batched"}
VARIANTS, _add = collector()


# ---- AdditiveAttention.forward ------------------------------------------------------------------
@_add("softmax over the batch instead of the source positions", "additive_attention", ATTENTION,
      "check_additive_attention", "over the batch")
def attention_wrong_axis(self, query, keys, mask=None):
    scores = self.v(torch.tanh(self.W_q(query).unsqueeze(-2) + self.W_k(keys))).squeeze(-1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=0)
    return (weights.unsqueeze(-1) * keys).sum(dim=-2), weights


@_add("additive attention without the tanh", "additive_attention", ATTENTION, "check_additive_attention",
      "left out the tanh")
def attention_no_tanh(self, query, keys, mask=None):
    scores = self.v(self.W_q(query).unsqueeze(-2) + self.W_k(keys)).squeeze(-1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return (weights.unsqueeze(-1) * keys).sum(dim=-2), weights


@_add("padding not masked", "additive_attention", MASKED, "check_additive_attention_mask", "ignores the mask")
def attention_ignores_mask(self, query, keys, mask=None):
    scores = self.v(torch.tanh(self.W_q(query).unsqueeze(-2) + self.W_k(keys))).squeeze(-1)
    weights = torch.softmax(scores, dim=-1)
    return (weights.unsqueeze(-1) * keys).sum(dim=-2), weights


@_add("padding mask inverted", "additive_attention", MASKED, "check_additive_attention_mask", "inverted")
def attention_inverted_mask(self, query, keys, mask=None):
    scores = self.v(torch.tanh(self.W_q(query).unsqueeze(-2) + self.W_k(keys))).squeeze(-1)
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return (weights.unsqueeze(-1) * keys).sum(dim=-2), weights


@_add("padding masked with 0 instead of -inf", "additive_attention", MASKED, "check_additive_attention_mask",
      "not enough")
def attention_mask_zero(self, query, keys, mask=None):
    scores = self.v(torch.tanh(self.W_q(query).unsqueeze(-2) + self.W_k(keys))).squeeze(-1)
    if mask is not None:
        scores = scores.masked_fill(~mask, 0.0)
    weights = torch.softmax(scores, dim=-1)
    return (weights.unsqueeze(-1) * keys).sum(dim=-2), weights


@_add("padding masked after the softmax", "additive_attention", MASKED, "check_additive_attention_mask",
      "after the softmax")
def attention_mask_after(self, query, keys, mask=None):
    scores = self.v(torch.tanh(self.W_q(query).unsqueeze(-2) + self.W_k(keys))).squeeze(-1)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return (weights.unsqueeze(-1) * keys).sum(dim=-2), weights


# ---- AttentionDecoder.forward ---------------------------------------------------------------------
@_add("decoder returns the previous state", "decoder_step", {"test_decoder_step"}, "check_decoder_step",
      "returned the previous state")
def decoder_old_state(self, y_prev, state, enc, mask=None):
    context, weights = self.attention(state, enc, mask)
    new_state = self.gru(torch.cat([self.embedding(y_prev), context], dim=-1), state)
    return state, self.out(torch.cat([new_state, context], dim=-1)), weights


@_add("decoder does not pass the mask on", "decoder_step", {"test_decoder_step"}, "check_decoder_step",
      "ignores the padding mask")
def decoder_no_mask(self, y_prev, state, enc, mask=None):
    context, weights = self.attention(state, enc)
    new_state = self.gru(torch.cat([self.embedding(y_prev), context], dim=-1), state)
    return new_state, self.out(torch.cat([new_state, context], dim=-1)), weights


@_add("GRU input in the wrong order", "decoder_step", {"test_decoder_step"}, "check_decoder_step",
      "[embedding, context] in that order")
def decoder_swapped_input(self, y_prev, state, enc, mask=None):
    context, weights = self.attention(state, enc, mask)
    x = torch.cat([context, self.embedding(y_prev)], dim=-1)
    new_state = self.gru(x, state)
    return new_state, self.out(torch.cat([new_state, context], dim=-1)), weights


@_add("logits from the previous state", "decoder_step", {"test_decoder_step"}, "check_decoder_step",
      "logits are not")
def decoder_logits_old_state(self, y_prev, state, enc, mask=None):
    context, weights = self.attention(state, enc, mask)
    new_state = self.gru(torch.cat([self.embedding(y_prev), context], dim=-1), state)
    return new_state, self.out(torch.cat([state, context], dim=-1)), weights


# ---- greedy_decode -------------------------------------------------------------------------------
@_add("decoding never stops before max_len", "greedy_decode", GREEDY, "check_greedy_decode", "kept decoding")
def greedy_no_stop(step, state, enc, mask, bos, eos, max_len, pad=0):
    y = torch.full((state.shape[0],), bos, dtype=torch.long)
    done = torch.zeros(state.shape[0], dtype=torch.bool)
    tokens = []
    for _ in range(max_len):
        state, logits, _ = step(y, state, enc, mask)
        y = logits.argmax(dim=-1)
        tokens.append(y.masked_fill(done, pad))
        done = done | (y == eos)
    return torch.stack(tokens, dim=1)


@_add("decoding stops when the first sequence ends", "greedy_decode", {"test_greedy_batched"},
      "check_greedy_batched", "first sequence produced EOS")
def greedy_stops_on_any(step, state, enc, mask, bos, eos, max_len, pad=0):
    y = torch.full((state.shape[0],), bos, dtype=torch.long)
    tokens = []
    for _ in range(max_len):
        state, logits, _ = step(y, state, enc, mask)
        y = logits.argmax(dim=-1)
        tokens.append(y)
        if bool((y == eos).any()):
            break
    return torch.stack(tokens, dim=1)


@_add("no padding after EOS", "greedy_decode", {"test_greedy_batched"}, "check_greedy_batched",
      "must be the pad id")
def greedy_no_padding(step, state, enc, mask, bos, eos, max_len, pad=0):
    y = torch.full((state.shape[0],), bos, dtype=torch.long)
    done = torch.zeros(state.shape[0], dtype=torch.bool)
    tokens = []
    for _ in range(max_len):
        state, logits, _ = step(y, state, enc, mask)
        y = logits.argmax(dim=-1)
        tokens.append(y)
        done = done | (y == eos)
        if bool(done.all()):
            break
    return torch.stack(tokens, dim=1)


@_add("BOS fed at every step", "greedy_decode", GREEDY, "check_greedy_decode", "previous step's argmax")
def greedy_always_bos(step, state, enc, mask, bos, eos, max_len, pad=0):
    start = torch.full((state.shape[0],), bos, dtype=torch.long)
    done = torch.zeros(state.shape[0], dtype=torch.bool)
    tokens = []
    for _ in range(max_len):
        state, logits, _ = step(start, state, enc, mask)
        y = logits.argmax(dim=-1)
        tokens.append(y.masked_fill(done, pad))
        done = done | (y == eos)
        if bool(done.all()):
            break
    return torch.stack(tokens, dim=1)


@_add("state not carried between steps", "greedy_decode", GREEDY, "check_greedy_decode", "state must be carried")
def greedy_initial_state(step, state, enc, mask, bos, eos, max_len, pad=0):
    y = torch.full((state.shape[0],), bos, dtype=torch.long)
    done = torch.zeros(state.shape[0], dtype=torch.bool)
    tokens = []
    for _ in range(max_len):
        _, logits, _ = step(y, state, enc, mask)
        y = logits.argmax(dim=-1)
        tokens.append(y.masked_fill(done, pad))
        done = done | (y == eos)
        if bool(done.all()):
            break
    return torch.stack(tokens, dim=1)


@_add("BOS included in the output", "greedy_decode", GREEDY, "check_greedy_decode", "starts with BOS")
def greedy_with_bos(step, state, enc, mask, bos, eos, max_len, pad=0):
    y = torch.full((state.shape[0],), bos, dtype=torch.long)
    done = torch.zeros(state.shape[0], dtype=torch.bool)
    tokens = [y]
    for _ in range(max_len):
        state, logits, _ = step(y, state, enc, mask)
        y = logits.argmax(dim=-1)
        tokens.append(y.masked_fill(done, pad))
        done = done | (y == eos)
        if bool(done.all()):
            break
    return torch.stack(tokens, dim=1)
