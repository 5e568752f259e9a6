"""Known-wrong implementations for chapter 06 (see tests/zoo/__init__.py)."""
import collections
import math

import torch
import torch.nn.functional as F
from torch import nn

from attncourse_ref.llm import IGNORE_INDEX, PAD_TOKEN, Block, merge_pair
from attncourse_ref.positional import apply_rope

from . import collector

VARIANTS, _add = collector()
BPE = {"test_merge_pair", "test_bpe_train", "test_bpe_encode"}     # bpe_train and bpe_encode call merge_pair
MODEL = {"test_gpt", "test_gpt_cache"}                              # the GPT runs every block and attention


# ---- character tokenizer -------------------------------------------------------------------------
@_add("vocabulary in order of first appearance", "char_vocab", {"test_char_vocab"}, "check_char_vocab",
      "sorted by code point")
def vocab_unsorted(corpus):
    return "".join(dict.fromkeys(corpus))


@_add("unknown characters get id 0", "char_encode", {"test_char_encode"}, "check_char_encode", "len(vocab)")
def encode_unknown_zero(text, vocab):
    index = {c: i for i, c in enumerate(vocab)}
    return [index.get(c, 0) for c in text]


@_add("unknown characters dropped", "char_encode", {"test_char_encode"}, "check_char_encode", "len(vocab)")
def encode_unknown_dropped(text, vocab):
    index = {c: i for i, c in enumerate(vocab)}
    return [index[c] for c in text if c in index]


@_add("unknown id decoded as '?'", "char_decode", {"test_char_decode"}, "check_char_decode", "U+FFFD")
def decode_unknown_question_mark(ids, vocab):
    return "".join(vocab[i] if i < len(vocab) else "?" for i in map(int, ids))


# ---- byte-pair encoding -----------------------------------------------------------------------------
@_add("merge_pair replaces the first occurrence only", "merge_pair", BPE, "check_merge_pair", "every occurrence")
def merge_first_only(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if ids[i] == pair[0] and ids[i + 1] == pair[1]:
            return ids[:i] + [new_id] + ids[i + 2:]
    return list(ids)


@_add("merge_pair steps one element after a match", "merge_pair", BPE, "check_merge_pair", "skip both elements")
def merge_step_one(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
        else:
            out.append(ids[i])
        i += 1
    return out


@_add("ties go to the largest pair", "bpe_train", {"test_bpe_train"}, "check_bpe_train", "smallest pair")
def train_ties_largest(text, n_merges):
    ids = list(text.encode("utf-8"))
    merges = []
    for i in range(n_merges):
        counts = collections.Counter(zip(ids, ids[1:]))
        if not counts:
            break
        pair = max(counts, key=lambda p: (counts[p], p))
        if counts[pair] < 2:
            break
        ids = merge_pair(ids, pair, 256 + i)
        merges.append(pair)
    return merges


@_add("training never stops early", "bpe_train", {"test_bpe_train"}, "check_bpe_train", "at least twice")
def train_no_early_stop(text, n_merges):
    ids = list(text.encode("utf-8"))
    merges = []
    for i in range(n_merges):
        counts = collections.Counter(zip(ids, ids[1:]))
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))
        ids = merge_pair(ids, pair, 256 + i)
        merges.append(pair)
    return merges


@_add("trained on characters, not UTF-8 bytes", "bpe_train", {"test_bpe_train"}, "check_bpe_train", "UTF-8 bytes")
def train_on_characters(text, n_merges):
    ids = [ord(c) for c in text]
    merges = []
    for i in range(n_merges):
        counts = collections.Counter(zip(ids, ids[1:]))
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))
        if counts[pair] < 2:
            break
        ids = merge_pair(ids, pair, 256 + i)
        merges.append(pair)
    return merges


@_add("merges applied in reverse order", "bpe_encode", {"test_bpe_encode"}, "check_bpe_encode",
      "in the order they were learned")
def encode_reversed(text, merges):
    ids = list(text.encode("utf-8"))
    for i in reversed(range(len(merges))):
        ids = merge_pair(ids, tuple(merges[i]), 256 + i)
    return ids


@_add("encodes characters, not UTF-8 bytes", "bpe_encode", {"test_bpe_encode"}, "check_bpe_encode", "UTF-8 bytes")
def encode_characters(text, merges):
    ids = [ord(c) for c in text]
    for i, pair in enumerate(merges):
        ids = merge_pair(ids, tuple(pair), 256 + i)
    return ids


@_add("each token decoded on its own", "bpe_decode", {"test_bpe_decode"}, "check_bpe_decode",
      "decode the whole byte string once")
def decode_per_token(ids, merges):
    pieces = {i: bytes([i]) for i in range(256)}
    for i, (a, b) in enumerate(merges):
        pieces[256 + i] = pieces[a] + pieces[b]
    return "".join(pieces[int(i)].decode("utf-8", errors="replace") for i in ids)


@_add("invalid bytes dropped", "bpe_decode", {"test_bpe_decode"}, "check_bpe_decode", "U+FFFD")
def decode_ignore_errors(ids, merges):
    pieces = {i: bytes([i]) for i in range(256)}
    for i, (a, b) in enumerate(merges):
        pieces[256 + i] = pieces[a] + pieces[b]
    return b"".join(pieces[int(i)] for i in ids).decode("utf-8", errors="ignore")


# ---- the GPT ------------------------------------------------------------------------------------------
@_add("causal mask missing", "attention", {"test_attention", "test_block"} | MODEL, "check_attention", "not causal")
def attention_not_causal(self, x, past_kv=None):
    B, T, C = x.shape
    q, k, v = self.c_attn(x).split(C, dim=-1)
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
    mask = None
    if past_kv is not None:
        t_past = past_kv[0].shape[2]
        k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
        mask = torch.ones(T, t_past + T, dtype=torch.bool, device=x.device).tril(t_past)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    y = y.transpose(1, 2).reshape(B, T, C)
    return self.resid_dropout(self.c_proj(y)), (k, v)


@_add("KV cache appended along the head axis", "attention", {"test_attention_cache", "test_block", "test_gpt_cache"},
      "check_attention_cache", "wrong axis")
def attention_cache_wrong_axis(self, x, past_kv=None):
    B, T, C = x.shape
    q, k, v = self.c_attn(x).split(C, dim=-1)
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
    mask = None
    if past_kv is not None:
        t_past = past_kv[0].shape[2]
        k, v = torch.cat([past_kv[0], k], dim=1), torch.cat([past_kv[1], v], dim=1)
        mask = torch.ones(T, t_past + T, dtype=torch.bool, device=x.device).tril(t_past)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                       dropout_p=self.dropout if self.training else 0.0)
    y = y.transpose(1, 2).reshape(B, T, C)
    return self.resid_dropout(self.c_proj(y)), (k, v)


@_add("causal mask not shifted for cached keys", "attention", {"test_attention_cache", "test_block", "test_gpt_cache"},
      "check_attention_cache", "shifted")
def attention_cache_top_left(self, x, past_kv=None):
    B, T, C = x.shape
    q, k, v = self.c_attn(x).split(C, dim=-1)
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
    if past_kv is not None:
        k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
    y = y.transpose(1, 2).reshape(B, T, C)
    return self.resid_dropout(self.c_proj(y)), (k, v)


@_add("post-norm block", "block", {"test_block"} | MODEL, "check_block", "post-norm")
def block_post_norm(self, x, past_kv=None):
    a, present = self.attn(x, past_kv)
    x = self.ln_1(x + a)
    x = self.ln_2(x + self.mlp(x))
    return x, present


@_add("untied head", "gpt", MODEL, "check_gpt", "tied to the token embedding")
class GPTUntiedHead(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, past_kv=None, use_cache=False):
        t_past = 0 if past_kv is None else past_kv[0][0].shape[2]
        positions = torch.arange(t_past, t_past + idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        presents = []
        for i, block in enumerate(self.h):
            x, present = block(x, None if past_kv is None else past_kv[i])
            presents.append(present)
        logits = self.lm_head(self.ln_f(x))
        return (logits, presents) if use_cache else logits


@_add("positions restart at 0 with a cache", "gpt", {"test_gpt_cache"}, "check_gpt_cache", "must start at t_past")
class GPTPositionsRestart(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)

    def forward(self, idx, past_kv=None, use_cache=False):
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        presents = []
        for i, block in enumerate(self.h):
            x, present = block(x, None if past_kv is None else past_kv[i])
            presents.append(present)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return (logits, presents) if use_cache else logits


@_add("no dropout on the embeddings", "gpt", {"test_gpt"}, "check_gpt", "apply self.drop to the embeddings")
class GPTNoEmbeddingDropout(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)

    def forward(self, idx, past_kv=None, use_cache=False):
        t_past = 0 if past_kv is None else past_kv[0][0].shape[2]
        positions = torch.arange(t_past, t_past + idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        presents = []
        for i, block in enumerate(self.h):
            x, present = block(x, None if past_kv is None else past_kv[i])
            presents.append(present)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return (logits, presents) if use_cache else logits


@_add("no final LayerNorm", "gpt", MODEL, "check_gpt", "ln_f")
class GPTNoFinalNorm(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)

    def forward(self, idx, past_kv=None, use_cache=False):
        t_past = 0 if past_kv is None else past_kv[0][0].shape[2]
        positions = torch.arange(t_past, t_past + idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        presents = []
        for i, block in enumerate(self.h):
            x, present = block(x, None if past_kv is None else past_kv[i])
            presents.append(present)
        logits = F.linear(x, self.wte.weight)
        return (logits, presents) if use_cache else logits


@_add("Conv1D weights not transposed", "load_gpt2_weights", {"test_load_gpt2"}, "check_load_gpt2_weights",
      "must be transposed")
def load_not_transposed(model, state_dict):
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(state_dict["transformer." + name])
    return model


@_add("Conv1D weights reshaped instead of transposed", "load_gpt2_weights", {"test_load_gpt2"},
      "check_load_gpt2_weights", "reshaped")
def load_reshaped(model, state_dict):
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(state_dict["transformer." + name].reshape(param.shape))
    return model


@_add("every 2-D weight transposed, embeddings too", "load_gpt2_weights", {"test_load_gpt2"},
      "check_load_gpt2_weights", "copied as it is")
def load_transpose_all(model, state_dict):
    with torch.no_grad():
        for name, param in model.named_parameters():
            weight = state_dict["transformer." + name]
            param.copy_(weight.t() if weight.dim() == 2 else weight)
    return model


# ---- loss and sampling -------------------------------------------------------------------------------------
@_add("loss not shifted", "lm_loss", {"test_lm_loss"}, "check_lm_loss", "not shifted")
def loss_not_shifted(logits, idx, pad_id=None):
    targets = idx
    if pad_id is not None:
        targets = targets.masked_fill(targets == pad_id, IGNORE_INDEX)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)


@_add("padding scored", "lm_loss", {"test_lm_loss"}, "check_lm_loss", "padding was scored")
def loss_counts_padding(logits, idx, pad_id=None):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


@_add("temperature applied after the softmax", "next_token_probs", {"test_sampling", "test_top_p"}, "check_sampling",
      "before the softmax")
def probs_temperature_after_softmax(logits, temperature=1.0, top_k=None, top_p=None):
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1) / temperature
    probs = probs / probs.sum(-1, keepdim=True)
    if top_p is not None:
        ranked, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        above = ranked.cumsum(-1) - ranked
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, above >= top_p)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


@_add("top-k drops tokens tied with the k-th", "next_token_probs", {"test_sampling"}, "check_sampling",
      "tied with it stays")
def probs_top_k_exactly_k(logits, temperature=1.0, top_k=None, top_p=None):
    logits = logits / temperature
    if top_k is not None:
        keep = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).indices
        allowed = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, keep, True)
        logits = logits.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None:
        ranked, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        above = ranked.cumsum(-1) - ranked
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, above >= top_p)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


@_add("top-p drops the token that crosses p", "next_token_probs", {"test_top_p"}, "check_top_p",
      "dropped the token that crosses top_p")
def probs_top_p_drops_crossing(logits, temperature=1.0, top_k=None, top_p=None):
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None:
        ranked, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, ranked.cumsum(-1) > top_p)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


@_add("top-p ranks ties by higher id", "next_token_probs", {"test_top_p"}, "check_top_p", "lower id")
def probs_top_p_ties_reversed(logits, temperature=1.0, top_k=None, top_p=None):
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None:
        ranked, order = torch.sort(probs, dim=-1, stable=True)
        ranked, order = ranked.flip(-1), order.flip(-1)
        above = ranked.cumsum(-1) - ranked
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, above >= top_p)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


@_add("argmax instead of sampling", "sample_next_token", {"test_sample"}, "check_sample", "argmax")
def sample_argmax(probs, generator=None):
    return probs.argmax(-1)


@_add("softmax applied to probabilities", "sample_next_token", {"test_sample"}, "check_sample",
      "already probabilities")
def sample_softmax_again(probs, generator=None):
    flat = torch.softmax(probs.reshape(-1, probs.shape[-1]), dim=-1)
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


# ---- masked language modelling -----------------------------------------------------------------------------
@_add("special tokens masked too", "mlm_mask", {"test_mlm_properties"}, "check_mlm_properties", "special positions")
def mlm_masks_special(tokens, special_mask, mask_id, vocab_size, mlm_prob=0.15, generator=None):
    shape, device = tokens.shape, tokens.device
    chosen = torch.rand(shape, generator=generator, device=device) < mlm_prob
    labels = torch.where(chosen, tokens, IGNORE_INDEX)
    action = torch.rand(shape, generator=generator, device=device)
    random_tokens = torch.randint(vocab_size, shape, generator=generator, device=device)
    inputs = torch.where(chosen & (action < 0.8), mask_id, tokens)
    inputs = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_tokens, inputs)
    return inputs, labels


@_add("every chosen token masked", "mlm_mask", {"test_mlm_statistics"}, "check_mlm_statistics", "BERT uses 80%")
def mlm_all_masked(tokens, special_mask, mask_id, vocab_size, mlm_prob=0.15, generator=None):
    chosen = (torch.rand(tokens.shape, generator=generator, device=tokens.device) < mlm_prob) & ~special_mask
    return torch.where(chosen, mask_id, tokens), torch.where(chosen, tokens, IGNORE_INDEX)


@_add("random replacements drawn from 1 .. V - 1 (id 0 never)", "mlm_mask", {"test_mlm_statistics"},
      "check_mlm_statistics", "never drew id 0")
def mlm_random_from_one(tokens, special_mask, mask_id, vocab_size, mlm_prob=0.15, generator=None):
    shape, device = tokens.shape, tokens.device
    chosen = (torch.rand(shape, generator=generator, device=device) < mlm_prob) & ~special_mask
    action = torch.rand(shape, generator=generator, device=device)
    random_tokens = torch.randint(1, vocab_size, shape, generator=generator, device=device)
    inputs = torch.where(chosen & (action < 0.8), mask_id, tokens)
    inputs = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_tokens, inputs)
    return inputs, torch.where(chosen, tokens, IGNORE_INDEX)


@_add("labels at every position", "mlm_mask", {"test_mlm_properties", "test_mlm_statistics"},
      "check_mlm_properties", "-100")
def mlm_labels_everywhere(tokens, special_mask, mask_id, vocab_size, mlm_prob=0.15, generator=None):
    shape, device = tokens.shape, tokens.device
    chosen = (torch.rand(shape, generator=generator, device=device) < mlm_prob) & ~special_mask
    action = torch.rand(shape, generator=generator, device=device)
    random_tokens = torch.randint(vocab_size, shape, generator=generator, device=device)
    inputs = torch.where(chosen & (action < 0.8), mask_id, tokens)
    inputs = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_tokens, inputs)
    return inputs, tokens.clone()


# ---- issue 23: ids of several digits, merge order, generators, inputs, distributions, long tied rows ----------
@_add("merge_pair on the ids' decimal text", "merge_pair", {"test_merge_pair"}, "check_merge_pair", "not the digits")
def merge_digits(ids, pair, new_id):
    text = " ".join(map(str, ids)).replace(f"{pair[0]} {pair[1]}", str(new_id))
    return [int(t) for t in text.split()]


@_add("BPE encoding merges the leftmost mergeable pair first", "bpe_encode", {"test_bpe_encode"}, "check_bpe_encode",
      "leftmost")
def encode_leftmost_first(text, merges):
    ids = list(text.encode("utf-8"))
    new = {tuple(pair): 256 + i for i, pair in enumerate(merges)}
    while True:
        at = next((j for j in range(len(ids) - 1) if (ids[j], ids[j + 1]) in new), None)
        if at is None:
            return ids
        ids = ids[:at] + [new[(ids[at], ids[at + 1])]] + ids[at + 2:]


@_add("top-p sorts without stable=True (ties in long rows)", "next_token_probs", {"test_top_p"}, "check_top_p",
      "more than 16")
def probs_top_p_unstable(logits, temperature=1.0, top_k=None, top_p=None):
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None:
        ranked, order = torch.sort(probs, dim=-1, descending=True)
        above = ranked.cumsum(-1) - ranked
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, above >= top_p)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


@_add("next-token probabilities computed in float32", "next_token_probs", {"test_sampling", "test_top_p"},
      "check_sampling", "computed in float32")
def probs_in_float32(logits, temperature=1.0, top_k=None, top_p=None):
    logits32 = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits32, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits32 = logits32.masked_fill(logits32 < kth, float("-inf"))
    probs = torch.softmax(logits32, dim=-1)
    if top_p is not None:
        ranked, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        above = ranked.cumsum(-1) - ranked
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, above >= top_p)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs.to(logits.dtype)


@_add("sampling from torch's global random state (generator ignored)", "sample_next_token", {"test_sample"},
      "check_sample", "pass the generator")
def sample_global_rng(probs, generator=None):
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1).reshape(probs.shape[:-1])


@_add("masking with torch's global random state (generator ignored)", "mlm_mask",
      {"test_mlm_properties", "test_mlm_statistics"}, "check_mlm_properties", "draw every random number with the generator")
def mlm_global_rng(tokens, special_mask, mask_id, vocab_size, mlm_prob=0.15, generator=None):
    shape, device = tokens.shape, tokens.device
    chosen = (torch.rand(shape, device=device) < mlm_prob) & ~special_mask
    labels = torch.where(chosen, tokens, IGNORE_INDEX)
    action = torch.rand(shape, device=device)
    random_tokens = torch.randint(vocab_size, shape, device=device)
    inputs = torch.where(chosen & (action < 0.8), mask_id, tokens)
    inputs = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_tokens, inputs)
    return inputs, labels


@_add("random replacements drawn from the batch's own words", "mlm_mask", {"test_mlm_statistics"},
      "check_mlm_statistics", "whole vocabulary")
def mlm_replacements_from_batch(tokens, special_mask, mask_id, vocab_size, mlm_prob=0.15, generator=None):
    shape, device = tokens.shape, tokens.device
    chosen = (torch.rand(shape, generator=generator, device=device) < mlm_prob) & ~special_mask
    labels = torch.where(chosen, tokens, IGNORE_INDEX)
    action = torch.rand(shape, generator=generator, device=device)
    words = tokens[~special_mask]
    random_tokens = words[torch.randint(len(words), shape, generator=generator, device=device)]
    inputs = torch.where(chosen & (action < 0.8), mask_id, tokens)
    inputs = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_tokens, inputs)
    return inputs, labels


@_add("masking writes into the tokens argument", "mlm_mask", {"test_mlm_properties", "test_mlm_statistics"},
      "check_mlm_properties", "changed its argument 0 in place")
def mlm_in_place(tokens, special_mask, mask_id, vocab_size, mlm_prob=0.15, generator=None):
    shape, device = tokens.shape, tokens.device
    chosen = (torch.rand(shape, generator=generator, device=device) < mlm_prob) & ~special_mask
    labels = torch.where(chosen, tokens, IGNORE_INDEX)
    action = torch.rand(shape, generator=generator, device=device)
    random_tokens = torch.randint(vocab_size, shape, generator=generator, device=device)
    tokens.masked_fill_(chosen & (action < 0.8), mask_id)
    replace = chosen & (action >= 0.8) & (action < 0.9)
    tokens[replace] = random_tokens[replace]
    return tokens, labels


@_add("attention weights without dropout (no dropout_p)", "attention", {"test_attention", "test_block"},
      "check_attention", "the attention weights get no dropout")
def attention_no_weight_dropout(self, x, past_kv=None):
    B, T, C = x.shape
    q, k, v = self.c_attn(x).split(C, dim=-1)
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
    mask = None
    if past_kv is not None:
        t_past = past_kv[0].shape[2]
        k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
        mask = torch.ones(T, t_past + T, dtype=torch.bool, device=x.device).tril(t_past)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    y = y.transpose(1, 2).reshape(B, T, C)
    return self.resid_dropout(self.c_proj(y)), (k, v)


# ---- grouped-query attention ---------------------------------------------------------------------------------
@_add("key/value heads paired with query heads h % n_kv_head (repeat, not repeat_interleave)", "gqa",
      {"test_gqa", "test_gqa_cache"}, "check_gqa", "h // (n_head // n_kv_head)")
def gqa_strided_heads(self, x, past_kv=None):
    B, T, C = x.shape
    D = C // self.n_head
    q, k, v = self.c_attn(x).split([C, self.n_kv_head * D, self.n_kv_head * D], dim=-1)
    q = q.view(B, T, self.n_head, D).transpose(1, 2)
    k, v = (t.view(B, T, self.n_kv_head, D).transpose(1, 2) for t in (k, v))
    mask = None
    if past_kv is not None:
        t_past = past_kv[0].shape[2]
        k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
        mask = torch.ones(T, t_past + T, dtype=torch.bool, device=x.device).tril(t_past)
    group = self.n_head // self.n_kv_head
    y = F.scaled_dot_product_attention(q, k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1),
                                       attn_mask=mask, is_causal=mask is None,
                                       dropout_p=self.dropout if self.training else 0.0)
    y = y.transpose(1, 2).reshape(B, T, C)
    return self.resid_dropout(self.c_proj(y)), (k, v)


@_add("query head h reads key/value head h // n_kv_head (not h // group)", "gqa", {"test_gqa", "test_gqa_cache"},
      "check_gqa", "h // n_kv_head = h // 4")
def gqa_by_kv_count(self, x, past_kv=None):
    B, T, C = x.shape
    D = C // self.n_head
    q, k, v = self.c_attn(x).split([C, self.n_kv_head * D, self.n_kv_head * D], dim=-1)
    q = q.view(B, T, self.n_head, D).transpose(1, 2)
    k, v = (t.view(B, T, self.n_kv_head, D).transpose(1, 2) for t in (k, v))
    mask = None
    if past_kv is not None:
        t_past = past_kv[0].shape[2]
        k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
        mask = torch.ones(T, t_past + T, dtype=torch.bool, device=x.device).tril(t_past)
    head = torch.arange(self.n_head) // self.n_kv_head
    y = F.scaled_dot_product_attention(q, k[:, head], v[:, head], attn_mask=mask, is_causal=mask is None,
                                       dropout_p=self.dropout if self.training else 0.0)
    y = y.transpose(1, 2).reshape(B, T, C)
    return self.resid_dropout(self.c_proj(y)), (k, v)


@_add("attention dropout applied in evaluation mode too", "gqa", {"test_gqa", "test_gqa_cache"}, "check_gqa",
      "in evaluation mode (module.eval())")
def gqa_dropout_in_eval(self, x, past_kv=None):
    B, T, C = x.shape
    D = C // self.n_head
    q, k, v = self.c_attn(x).split([C, self.n_kv_head * D, self.n_kv_head * D], dim=-1)
    q = q.view(B, T, self.n_head, D).transpose(1, 2)
    k, v = (t.view(B, T, self.n_kv_head, D).transpose(1, 2) for t in (k, v))
    mask = None
    if past_kv is not None:
        t_past = past_kv[0].shape[2]
        k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
        mask = torch.ones(T, t_past + T, dtype=torch.bool, device=x.device).tril(t_past)
    group = self.n_head // self.n_kv_head
    y = F.scaled_dot_product_attention(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1),
                                       attn_mask=mask, is_causal=mask is None, dropout_p=self.dropout)
    y = y.transpose(1, 2).reshape(B, T, C)
    return self.resid_dropout(self.c_proj(y)), (k, v)


@_add("the cache stores the keys and values repeated for every query head", "gqa", {"test_gqa", "test_gqa_cache"},
      "check_gqa", "saves no memory")
def gqa_cache_repeated(self, x, past_kv=None):
    B, T, C = x.shape
    D = C // self.n_head
    q, k, v = self.c_attn(x).split([C, self.n_kv_head * D, self.n_kv_head * D], dim=-1)
    q = q.view(B, T, self.n_head, D).transpose(1, 2)
    group = self.n_head // self.n_kv_head
    k, v = (t.view(B, T, self.n_kv_head, D).transpose(1, 2).repeat_interleave(group, dim=1) for t in (k, v))
    mask = None
    if past_kv is not None:
        t_past = past_kv[0].shape[2]
        past_k, past_v = past_kv
        if past_k.shape[1] != self.n_head:
            past_k, past_v = past_k.repeat_interleave(group, dim=1), past_v.repeat_interleave(group, dim=1)
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        mask = torch.ones(T, t_past + T, dtype=torch.bool, device=x.device).tril(t_past)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                       dropout_p=self.dropout if self.training else 0.0)
    y = y.transpose(1, 2).reshape(B, T, C)
    return self.resid_dropout(self.c_proj(y)), (k, v)


@_add("no causal mask in the cached step", "gqa", {"test_gqa_cache"}, "check_gqa_cache", "must not see the new tokens")
def gqa_cache_no_mask(self, x, past_kv=None):
    B, T, C = x.shape
    D = C // self.n_head
    q, k, v = self.c_attn(x).split([C, self.n_kv_head * D, self.n_kv_head * D], dim=-1)
    q = q.view(B, T, self.n_head, D).transpose(1, 2)
    k, v = (t.view(B, T, self.n_kv_head, D).transpose(1, 2) for t in (k, v))
    if past_kv is not None:
        k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
    group = self.n_head // self.n_kv_head
    y = F.scaled_dot_product_attention(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1),
                                       is_causal=past_kv is None,
                                       dropout_p=self.dropout if self.training else 0.0)
    y = y.transpose(1, 2).reshape(B, T, C)
    return self.resid_dropout(self.c_proj(y)), (k, v)


@_add("causal mask not shifted for cached keys (is_causal=True with a cache)", "gqa", {"test_gqa_cache"},
      "check_gqa_cache", "shifted")
def gqa_cache_top_left(self, x, past_kv=None):
    B, T, C = x.shape
    D = C // self.n_head
    q, k, v = self.c_attn(x).split([C, self.n_kv_head * D, self.n_kv_head * D], dim=-1)
    q = q.view(B, T, self.n_head, D).transpose(1, 2)
    k, v = (t.view(B, T, self.n_kv_head, D).transpose(1, 2) for t in (k, v))
    if past_kv is not None:
        k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                       dropout_p=self.dropout if self.training else 0.0)
    y = y.transpose(1, 2).reshape(B, T, C)
    return self.resid_dropout(self.c_proj(y)), (k, v)


@_add("the first head of each group kept instead of the mean", "gqa_from_mha", {"test_gqa_from_mha"},
      "check_gqa_from_mha", "first head of each group")
def gqa_from_mha_first_head(weight, bias, n_head, n_kv_head):
    C = weight.shape[1]
    D, group = C // n_head, n_head // n_kv_head

    def convert(t):
        q, k, v = t.split(C, dim=0)
        first = lambda rows: rows.reshape(n_kv_head, group, D, *rows.shape[1:])[:, 0].reshape(n_kv_head * D, *rows.shape[1:])
        return torch.cat([q, first(k), first(v)], dim=0)
    return convert(weight), convert(bias)


@_add("heads g, g + n_kv_head, ... pooled together", "gqa_from_mha", {"test_gqa_from_mha"}, "check_gqa_from_mha",
      "consecutive heads")
def gqa_from_mha_strided(weight, bias, n_head, n_kv_head):
    C = weight.shape[1]
    D, group = C // n_head, n_head // n_kv_head

    def convert(t):
        q, k, v = t.split(C, dim=0)
        pool = lambda rows: rows.reshape(group, n_kv_head, D, *rows.shape[1:]).mean(0).reshape(n_kv_head * D, *rows.shape[1:])
        return torch.cat([q, pool(k), pool(v)], dim=0)
    return convert(weight), convert(bias)


@_add("the heads of a group summed, not averaged", "gqa_from_mha", {"test_gqa_from_mha"}, "check_gqa_from_mha",
      "summed the heads")
def gqa_from_mha_sum(weight, bias, n_head, n_kv_head):
    C = weight.shape[1]
    D, group = C // n_head, n_head // n_kv_head

    def convert(t):
        q, k, v = t.split(C, dim=0)
        pool = lambda rows: rows.reshape(n_kv_head, group, D, *rows.shape[1:]).sum(1).reshape(n_kv_head * D, *rows.shape[1:])
        return torch.cat([q, pool(k), pool(v)], dim=0)
    return convert(weight), convert(bias)


@_add("the queries pooled too", "gqa_from_mha", {"test_gqa_from_mha"}, "check_gqa_from_mha", "pooled the queries")
def gqa_from_mha_queries_pooled(weight, bias, n_head, n_kv_head):
    C = weight.shape[1]
    D, group = C // n_head, n_head // n_kv_head
    pool = lambda rows: rows.reshape(n_kv_head, group, D, *rows.shape[1:]).mean(1).reshape(n_kv_head * D, *rows.shape[1:])
    return (torch.cat([pool(part) for part in weight.split(C, dim=0)], dim=0),
            torch.cat([pool(part) for part in bias.split(C, dim=0)], dim=0))


# ---- speculative decoding --------------------------------------------------------------------------------------
SPEC = {"test_speculative_step", "test_speculative_distribution"}


# Its law is right: the distribution's hidden test passes it, but that test cell runs the visible check first.
@_add("the uniforms drawn position by position (another order of draws)", "speculative_step", {"test_speculative_step"},
      "check_speculative_step", "order of draws", check_only={"test_speculative_distribution"})
def spec_uniforms_by_position(target_probs, draft_probs, draft_tokens, generator=None):
    k, V = draft_tokens.shape[-1], target_probs.shape[-1]
    u = torch.stack([torch.rand(draft_tokens.shape[:-1], generator=generator, dtype=target_probs.dtype)
                     for _ in range(k)], dim=-1)                     # [..., k], drawn one position at a time
    p = target_probs[..., :k, :].gather(-1, draft_tokens[..., None])[..., 0]
    q = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
    n = (u < p / q).long().cumprod(-1).sum(-1)
    p_n = target_probs.gather(-2, n[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    q_n = draft_probs.gather(-2, n.clamp(max=k - 1)[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    weights = torch.where((n < k)[..., None], (p_n - q_n).clamp(min=0), p_n)
    nxt = torch.multinomial(weights.reshape(-1, V), 1, generator=generator).reshape(n.shape)
    position = torch.arange(k + 1)
    padded = torch.cat([draft_tokens, torch.full_like(draft_tokens[..., :1], -1)], dim=-1)
    out = torch.where(position < n[..., None], padded, -1)
    return torch.where(position == n[..., None], nxt[..., None], out)


@_add("the correction resampled from the target's p, not from max(0, p - q)", "speculative_step", SPEC,
      "check_speculative_step", "resampled from the target's p")
def spec_resample_from_p(target_probs, draft_probs, draft_tokens, generator=None):
    k, V = draft_tokens.shape[-1], target_probs.shape[-1]
    u = torch.rand(draft_tokens.shape, generator=generator, dtype=target_probs.dtype)
    p = target_probs[..., :k, :].gather(-1, draft_tokens[..., None])[..., 0]
    q = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
    n = (u < p / q).long().cumprod(-1).sum(-1)
    weights = target_probs.gather(-2, n[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    nxt = torch.multinomial(weights.reshape(-1, V), 1, generator=generator).reshape(n.shape)
    position = torch.arange(k + 1)
    padded = torch.cat([draft_tokens, torch.full_like(draft_tokens[..., :1], PAD_TOKEN)], dim=-1)
    out = torch.where(position < n[..., None], padded, PAD_TOKEN)
    return torch.where(position == n[..., None], nxt[..., None], out)


@_add("the correction drawn from the draft's q", "speculative_step", SPEC, "check_speculative_step", "not from the draft's q")
def spec_resample_from_q(target_probs, draft_probs, draft_tokens, generator=None):
    k, V = draft_tokens.shape[-1], target_probs.shape[-1]
    u = torch.rand(draft_tokens.shape, generator=generator, dtype=target_probs.dtype)
    p = target_probs[..., :k, :].gather(-1, draft_tokens[..., None])[..., 0]
    q = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
    n = (u < p / q).long().cumprod(-1).sum(-1)
    p_n = target_probs.gather(-2, n[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    q_n = draft_probs.gather(-2, n.clamp(max=k - 1)[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    weights = torch.where((n < k)[..., None], q_n, p_n)
    nxt = torch.multinomial(weights.reshape(-1, V), 1, generator=generator).reshape(n.shape)
    position = torch.arange(k + 1)
    padded = torch.cat([draft_tokens, torch.full_like(draft_tokens[..., :1], PAD_TOKEN)], dim=-1)
    out = torch.where(position < n[..., None], padded, PAD_TOKEN)
    return torch.where(position == n[..., None], nxt[..., None], out)


@_add("a draft token accepted when p >= q, rejected otherwise (no random draw)", "speculative_step", SPEC,
      "check_speculative_step", "not only when p >= q")
def spec_deterministic_accept(target_probs, draft_probs, draft_tokens, generator=None):
    k, V = draft_tokens.shape[-1], target_probs.shape[-1]
    p = target_probs[..., :k, :].gather(-1, draft_tokens[..., None])[..., 0]
    q = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
    n = (p >= q).long().cumprod(-1).sum(-1)
    p_n = target_probs.gather(-2, n[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    q_n = draft_probs.gather(-2, n.clamp(max=k - 1)[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    weights = torch.where((n < k)[..., None], (p_n - q_n).clamp(min=0), p_n)
    nxt = torch.multinomial(weights.reshape(-1, V), 1, generator=generator).reshape(n.shape)
    position = torch.arange(k + 1)
    padded = torch.cat([draft_tokens, torch.full_like(draft_tokens[..., :1], PAD_TOKEN)], dim=-1)
    out = torch.where(position < n[..., None], padded, PAD_TOKEN)
    return torch.where(position == n[..., None], nxt[..., None], out)


@_add("the acceptance ratio inverted (q / p)", "speculative_step", SPEC, "check_speculative_step", "not q / p")
def spec_ratio_inverted(target_probs, draft_probs, draft_tokens, generator=None):
    k, V = draft_tokens.shape[-1], target_probs.shape[-1]
    u = torch.rand(draft_tokens.shape, generator=generator, dtype=target_probs.dtype)
    p = target_probs[..., :k, :].gather(-1, draft_tokens[..., None])[..., 0]
    q = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
    n = (u < q / p).long().cumprod(-1).sum(-1)
    p_n = target_probs.gather(-2, n[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    q_n = draft_probs.gather(-2, n.clamp(max=k - 1)[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    residual = (p_n - q_n).clamp(min=0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)      # nothing left: fall back on p
    weights = torch.where((n < k)[..., None], residual, p_n)
    nxt = torch.multinomial(weights.reshape(-1, V), 1, generator=generator).reshape(n.shape)
    position = torch.arange(k + 1)
    padded = torch.cat([draft_tokens, torch.full_like(draft_tokens[..., :1], PAD_TOKEN)], dim=-1)
    out = torch.where(position < n[..., None], padded, PAD_TOKEN)
    return torch.where(position == n[..., None], nxt[..., None], out)


@_add("no bonus token when every draft token is accepted", "speculative_step", SPEC, "check_speculative_step",
      "no row has a bonus token")
def spec_no_bonus(target_probs, draft_probs, draft_tokens, generator=None):
    k, V = draft_tokens.shape[-1], target_probs.shape[-1]
    u = torch.rand(draft_tokens.shape, generator=generator, dtype=target_probs.dtype)
    p = target_probs[..., :k, :].gather(-1, draft_tokens[..., None])[..., 0]
    q = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
    n = (u < p / q).long().cumprod(-1).sum(-1)
    p_n = target_probs.gather(-2, n.clamp(max=k - 1)[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    q_n = draft_probs.gather(-2, n.clamp(max=k - 1)[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    weights = torch.where((n < k)[..., None], (p_n - q_n).clamp(min=0), p_n)
    nxt = torch.multinomial(weights.reshape(-1, V), 1, generator=generator).reshape(n.shape)
    nxt = torch.where(n < k, nxt, PAD_TOKEN)
    position = torch.arange(k + 1)
    padded = torch.cat([draft_tokens, torch.full_like(draft_tokens[..., :1], PAD_TOKEN)], dim=-1)
    out = torch.where(position < n[..., None], padded, PAD_TOKEN)
    return torch.where(position == n[..., None], nxt[..., None], out)


@_add("the bonus token drawn from p_(k-1) instead of p_k", "speculative_step", SPEC, "check_speculative_step",
      "the position after the last draft token")
def spec_bonus_off_by_one(target_probs, draft_probs, draft_tokens, generator=None):
    k, V = draft_tokens.shape[-1], target_probs.shape[-1]
    u = torch.rand(draft_tokens.shape, generator=generator, dtype=target_probs.dtype)
    p = target_probs[..., :k, :].gather(-1, draft_tokens[..., None])[..., 0]
    q = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
    n = (u < p / q).long().cumprod(-1).sum(-1)
    p_n = target_probs.gather(-2, n.clamp(max=k - 1)[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    q_n = draft_probs.gather(-2, n.clamp(max=k - 1)[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    weights = torch.where((n < k)[..., None], (p_n - q_n).clamp(min=0), p_n)
    nxt = torch.multinomial(weights.reshape(-1, V), 1, generator=generator).reshape(n.shape)
    position = torch.arange(k + 1)
    padded = torch.cat([draft_tokens, torch.full_like(draft_tokens[..., :1], PAD_TOKEN)], dim=-1)
    out = torch.where(position < n[..., None], padded, PAD_TOKEN)
    return torch.where(position == n[..., None], nxt[..., None], out)


@_add("uniforms drawn from torch's global random state (generator ignored)", "speculative_step", SPEC,
      "check_speculative_step", "draw every random number from the generator")
def spec_global_rng(target_probs, draft_probs, draft_tokens, generator=None):
    k, V = draft_tokens.shape[-1], target_probs.shape[-1]
    u = torch.rand(draft_tokens.shape, dtype=target_probs.dtype)
    p = target_probs[..., :k, :].gather(-1, draft_tokens[..., None])[..., 0]
    q = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
    n = (u < p / q).long().cumprod(-1).sum(-1)
    p_n = target_probs.gather(-2, n[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    q_n = draft_probs.gather(-2, n.clamp(max=k - 1)[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    weights = torch.where((n < k)[..., None], (p_n - q_n).clamp(min=0), p_n)
    nxt = torch.multinomial(weights.reshape(-1, V), 1, generator=generator).reshape(n.shape)
    position = torch.arange(k + 1)
    padded = torch.cat([draft_tokens, torch.full_like(draft_tokens[..., :1], PAD_TOKEN)], dim=-1)
    out = torch.where(position < n[..., None], padded, PAD_TOKEN)
    return torch.where(position == n[..., None], nxt[..., None], out)


MLA_ALL = {"test_mla", "test_mla_cache", "test_mla_absorbed"}
MLA_CACHED = {"test_mla_cache", "test_mla_absorbed"}


# ---- multi-head latent attention (apply_rope: the learner's, pasted from chapter 04) -----------------------------
@_add("the queries' rope part not rotated", "mla", MLA_ALL, "check_mla",
      "not rotated")
def mla_query_not_rotated(self, x, past=None, absorbed=False):
    B, T, _ = x.shape
    H, r, nope, rope = self.n_head, self.kv_rank, self.nope_dim, self.rope_dim
    t_past = 0 if past is None else past[0].shape[1]
    positions = torch.arange(t_past, t_past + T, device=x.device)
    q = self.wq_b(self.q_norm(self.wq_a(x))).view(B, T, H, nope + rope).transpose(1, 2)
    q_nope, q_pe = q.split([nope, rope], dim=-1)
    c_kv, k_pe = self.wkv_a(x).split([r, rope], dim=-1)
    c_kv, k_pe = self.kv_norm(c_kv), apply_rope(k_pe, positions)
    if past is not None:
        c_kv, k_pe = torch.cat([past[0], c_kv], dim=1), torch.cat([past[1], k_pe], dim=1)
    S = c_kv.shape[1]
    mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(t_past)
    if not absorbed:
        k_nope, v = self.wkv_b(c_kv).view(B, S, H, nope + self.v_dim).transpose(1, 2).split([nope, self.v_dim], -1)
        k = torch.cat([k_nope, k_pe[:, None].expand(B, H, S, rope)], dim=-1)
        y = F.scaled_dot_product_attention(torch.cat([q_nope, q_pe], dim=-1), k, v, attn_mask=mask,
                                           dropout_p=self.dropout if self.training else 0.0)
    else:
        w_k, w_v = self.wkv_b.weight.view(H, nope + self.v_dim, r).split([nope, self.v_dim], dim=1)
        scores = (torch.einsum("bhtd,hdr->bhtr", q_nope, w_k) @ c_kv[:, None].transpose(-2, -1)
                  + q_pe @ k_pe[:, None].transpose(-2, -1)) / math.sqrt(nope + rope)
        weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = torch.einsum("bhtr,hvr->bhtv", weights @ c_kv[:, None], w_v)
    return self.resid_dropout(self.wo(y.transpose(1, 2).reshape(B, T, H * self.v_dim))), (c_kv, k_pe)


@_add("scores scaled by 1 / sqrt(nope_dim)", "mla", MLA_ALL, "check_mla",
      "1 / sqrt(nope_dim + rope_dim)")
def mla_scale_nope(self, x, past=None, absorbed=False):
    B, T, _ = x.shape
    H, r, nope, rope = self.n_head, self.kv_rank, self.nope_dim, self.rope_dim
    t_past = 0 if past is None else past[0].shape[1]
    positions = torch.arange(t_past, t_past + T, device=x.device)
    q = self.wq_b(self.q_norm(self.wq_a(x))).view(B, T, H, nope + rope).transpose(1, 2)
    q_nope, q_pe = q.split([nope, rope], dim=-1)
    q_pe = apply_rope(q_pe, positions)
    c_kv, k_pe = self.wkv_a(x).split([r, rope], dim=-1)
    c_kv, k_pe = self.kv_norm(c_kv), apply_rope(k_pe, positions)
    if past is not None:
        c_kv, k_pe = torch.cat([past[0], c_kv], dim=1), torch.cat([past[1], k_pe], dim=1)
    S = c_kv.shape[1]
    mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(t_past)
    if not absorbed:
        k_nope, v = self.wkv_b(c_kv).view(B, S, H, nope + self.v_dim).transpose(1, 2).split([nope, self.v_dim], -1)
        k = torch.cat([k_nope, k_pe[:, None].expand(B, H, S, rope)], dim=-1)
        y = F.scaled_dot_product_attention(torch.cat([q_nope, q_pe], dim=-1), k, v, attn_mask=mask,
                                           dropout_p=self.dropout if self.training else 0.0, scale=nope ** -0.5)
    else:
        w_k, w_v = self.wkv_b.weight.view(H, nope + self.v_dim, r).split([nope, self.v_dim], dim=1)
        scores = (torch.einsum("bhtd,hdr->bhtr", q_nope, w_k) @ c_kv[:, None].transpose(-2, -1)
                  + q_pe @ k_pe[:, None].transpose(-2, -1)) / math.sqrt(nope)
        weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = torch.einsum("bhtr,hvr->bhtv", weights @ c_kv[:, None], w_v)
    return self.resid_dropout(self.wo(y.transpose(1, 2).reshape(B, T, H * self.v_dim))), (c_kv, k_pe)


@_add("the cache keeps the latents before kv_norm", "mla", MLA_ALL, "check_mla",
      "after kv_norm")
def mla_cache_not_normalised(self, x, past=None, absorbed=False):
    B, T, _ = x.shape
    H, r, nope, rope = self.n_head, self.kv_rank, self.nope_dim, self.rope_dim
    t_past = 0 if past is None else past[0].shape[1]
    positions = torch.arange(t_past, t_past + T, device=x.device)
    q = self.wq_b(self.q_norm(self.wq_a(x))).view(B, T, H, nope + rope).transpose(1, 2)
    q_nope, q_pe = q.split([nope, rope], dim=-1)
    q_pe = apply_rope(q_pe, positions)
    c_kv, k_pe = self.wkv_a(x).split([r, rope], dim=-1)
    latent, k_pe = c_kv, apply_rope(k_pe, positions)
    c_kv = self.kv_norm(latent)
    if past is not None:
        c_kv, k_pe = torch.cat([past[0], c_kv], dim=1), torch.cat([past[1], k_pe], dim=1)
        latent = torch.cat([past[0], latent], dim=1)
    S = c_kv.shape[1]
    mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(t_past)
    if not absorbed:
        k_nope, v = self.wkv_b(c_kv).view(B, S, H, nope + self.v_dim).transpose(1, 2).split([nope, self.v_dim], -1)
        k = torch.cat([k_nope, k_pe[:, None].expand(B, H, S, rope)], dim=-1)
        y = F.scaled_dot_product_attention(torch.cat([q_nope, q_pe], dim=-1), k, v, attn_mask=mask,
                                           dropout_p=self.dropout if self.training else 0.0)
    else:
        w_k, w_v = self.wkv_b.weight.view(H, nope + self.v_dim, r).split([nope, self.v_dim], dim=1)
        scores = (torch.einsum("bhtd,hdr->bhtr", q_nope, w_k) @ c_kv[:, None].transpose(-2, -1)
                  + q_pe @ k_pe[:, None].transpose(-2, -1)) / math.sqrt(nope + rope)
        weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = torch.einsum("bhtr,hvr->bhtv", weights @ c_kv[:, None], w_v)
    return self.resid_dropout(self.wo(y.transpose(1, 2).reshape(B, T, H * self.v_dim))), (latent, k_pe)


@_add("new tokens rotated at positions 0 .. T - 1 after a cache", "mla", MLA_CACHED, "check_mla_cache",
      "positions T_past")
def mla_positions_from_zero(self, x, past=None, absorbed=False):
    B, T, _ = x.shape
    H, r, nope, rope = self.n_head, self.kv_rank, self.nope_dim, self.rope_dim
    t_past = 0 if past is None else past[0].shape[1]
    positions = torch.arange(T, device=x.device)
    q = self.wq_b(self.q_norm(self.wq_a(x))).view(B, T, H, nope + rope).transpose(1, 2)
    q_nope, q_pe = q.split([nope, rope], dim=-1)
    q_pe = apply_rope(q_pe, positions)
    c_kv, k_pe = self.wkv_a(x).split([r, rope], dim=-1)
    c_kv, k_pe = self.kv_norm(c_kv), apply_rope(k_pe, positions)
    if past is not None:
        c_kv, k_pe = torch.cat([past[0], c_kv], dim=1), torch.cat([past[1], k_pe], dim=1)
    S = c_kv.shape[1]
    mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(t_past)
    if not absorbed:
        k_nope, v = self.wkv_b(c_kv).view(B, S, H, nope + self.v_dim).transpose(1, 2).split([nope, self.v_dim], -1)
        k = torch.cat([k_nope, k_pe[:, None].expand(B, H, S, rope)], dim=-1)
        y = F.scaled_dot_product_attention(torch.cat([q_nope, q_pe], dim=-1), k, v, attn_mask=mask,
                                           dropout_p=self.dropout if self.training else 0.0)
    else:
        w_k, w_v = self.wkv_b.weight.view(H, nope + self.v_dim, r).split([nope, self.v_dim], dim=1)
        scores = (torch.einsum("bhtd,hdr->bhtr", q_nope, w_k) @ c_kv[:, None].transpose(-2, -1)
                  + q_pe @ k_pe[:, None].transpose(-2, -1)) / math.sqrt(nope + rope)
        weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = torch.einsum("bhtr,hvr->bhtv", weights @ c_kv[:, None], w_v)
    return self.resid_dropout(self.wo(y.transpose(1, 2).reshape(B, T, H * self.v_dim))), (c_kv, k_pe)


@_add("causal mask not shifted by the cache", "mla", MLA_CACHED, "check_mla_cache",
      "must be shifted")
def mla_mask_top_left(self, x, past=None, absorbed=False):
    B, T, _ = x.shape
    H, r, nope, rope = self.n_head, self.kv_rank, self.nope_dim, self.rope_dim
    t_past = 0 if past is None else past[0].shape[1]
    positions = torch.arange(t_past, t_past + T, device=x.device)
    q = self.wq_b(self.q_norm(self.wq_a(x))).view(B, T, H, nope + rope).transpose(1, 2)
    q_nope, q_pe = q.split([nope, rope], dim=-1)
    q_pe = apply_rope(q_pe, positions)
    c_kv, k_pe = self.wkv_a(x).split([r, rope], dim=-1)
    c_kv, k_pe = self.kv_norm(c_kv), apply_rope(k_pe, positions)
    if past is not None:
        c_kv, k_pe = torch.cat([past[0], c_kv], dim=1), torch.cat([past[1], k_pe], dim=1)
    S = c_kv.shape[1]
    mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(0)
    if not absorbed:
        k_nope, v = self.wkv_b(c_kv).view(B, S, H, nope + self.v_dim).transpose(1, 2).split([nope, self.v_dim], -1)
        k = torch.cat([k_nope, k_pe[:, None].expand(B, H, S, rope)], dim=-1)
        y = F.scaled_dot_product_attention(torch.cat([q_nope, q_pe], dim=-1), k, v, attn_mask=mask,
                                           dropout_p=self.dropout if self.training else 0.0)
    else:
        w_k, w_v = self.wkv_b.weight.view(H, nope + self.v_dim, r).split([nope, self.v_dim], dim=1)
        scores = (torch.einsum("bhtd,hdr->bhtr", q_nope, w_k) @ c_kv[:, None].transpose(-2, -1)
                  + q_pe @ k_pe[:, None].transpose(-2, -1)) / math.sqrt(nope + rope)
        weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = torch.einsum("bhtr,hvr->bhtv", weights @ c_kv[:, None], w_v)
    return self.resid_dropout(self.wo(y.transpose(1, 2).reshape(B, T, H * self.v_dim))), (c_kv, k_pe)


@_add("no dropout on the attention weights", "mla", {"test_mla"}, "check_mla",
      "get no dropout")
def mla_no_attention_dropout(self, x, past=None, absorbed=False):
    B, T, _ = x.shape
    H, r, nope, rope = self.n_head, self.kv_rank, self.nope_dim, self.rope_dim
    t_past = 0 if past is None else past[0].shape[1]
    positions = torch.arange(t_past, t_past + T, device=x.device)
    q = self.wq_b(self.q_norm(self.wq_a(x))).view(B, T, H, nope + rope).transpose(1, 2)
    q_nope, q_pe = q.split([nope, rope], dim=-1)
    q_pe = apply_rope(q_pe, positions)
    c_kv, k_pe = self.wkv_a(x).split([r, rope], dim=-1)
    c_kv, k_pe = self.kv_norm(c_kv), apply_rope(k_pe, positions)
    if past is not None:
        c_kv, k_pe = torch.cat([past[0], c_kv], dim=1), torch.cat([past[1], k_pe], dim=1)
    S = c_kv.shape[1]
    mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(t_past)
    if not absorbed:
        k_nope, v = self.wkv_b(c_kv).view(B, S, H, nope + self.v_dim).transpose(1, 2).split([nope, self.v_dim], -1)
        k = torch.cat([k_nope, k_pe[:, None].expand(B, H, S, rope)], dim=-1)
        y = F.scaled_dot_product_attention(torch.cat([q_nope, q_pe], dim=-1), k, v, attn_mask=mask,
                                           dropout_p=0.0)
    else:
        w_k, w_v = self.wkv_b.weight.view(H, nope + self.v_dim, r).split([nope, self.v_dim], dim=1)
        scores = (torch.einsum("bhtd,hdr->bhtr", q_nope, w_k) @ c_kv[:, None].transpose(-2, -1)
                  + q_pe @ k_pe[:, None].transpose(-2, -1)) / math.sqrt(nope + rope)
        weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = torch.einsum("bhtr,hvr->bhtv", weights @ c_kv[:, None], w_v)
    return self.resid_dropout(self.wo(y.transpose(1, 2).reshape(B, T, H * self.v_dim))), (c_kv, k_pe)


@_add("absorbed=True that builds the keys and values", "mla", {"test_mla_absorbed"}, "check_mla_absorbed",
      "builds the heads' keys")
def mla_absorbed_builds_keys(self, x, past=None, absorbed=False):
    B, T, _ = x.shape
    H, r, nope, rope = self.n_head, self.kv_rank, self.nope_dim, self.rope_dim
    t_past = 0 if past is None else past[0].shape[1]
    positions = torch.arange(t_past, t_past + T, device=x.device)
    q = self.wq_b(self.q_norm(self.wq_a(x))).view(B, T, H, nope + rope).transpose(1, 2)
    q_nope, q_pe = q.split([nope, rope], dim=-1)
    q_pe = apply_rope(q_pe, positions)
    c_kv, k_pe = self.wkv_a(x).split([r, rope], dim=-1)
    c_kv, k_pe = self.kv_norm(c_kv), apply_rope(k_pe, positions)
    if past is not None:
        c_kv, k_pe = torch.cat([past[0], c_kv], dim=1), torch.cat([past[1], k_pe], dim=1)
    S = c_kv.shape[1]
    mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(t_past)
    if True:                                       # absorbed or not
        k_nope, v = self.wkv_b(c_kv).view(B, S, H, nope + self.v_dim).transpose(1, 2).split([nope, self.v_dim], -1)
        k = torch.cat([k_nope, k_pe[:, None].expand(B, H, S, rope)], dim=-1)
        y = F.scaled_dot_product_attention(torch.cat([q_nope, q_pe], dim=-1), k, v, attn_mask=mask,
                                           dropout_p=self.dropout if self.training else 0.0)
    else:
        w_k, w_v = self.wkv_b.weight.view(H, nope + self.v_dim, r).split([nope, self.v_dim], dim=1)
        scores = (torch.einsum("bhtd,hdr->bhtr", q_nope, w_k) @ c_kv[:, None].transpose(-2, -1)
                  + q_pe @ k_pe[:, None].transpose(-2, -1)) / math.sqrt(nope + rope)
        weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = torch.einsum("bhtr,hvr->bhtv", weights @ c_kv[:, None], w_v)
    return self.resid_dropout(self.wo(y.transpose(1, 2).reshape(B, T, H * self.v_dim))), (c_kv, k_pe)


# ---- sliding windows and attention sinks ----------------------------------------------------------------------------
@_add("window of window + 1 positions", "sliding_window_mask", {"test_sliding_window_mask"},
      "check_sliding_window_mask", "window + 1 positions")
def window_too_wide(t_q, t_k, window, sinks=0, device=None):
    p, j = torch.arange(t_k - t_q, t_k)[:, None], torch.arange(t_k)[None, :]
    return (j <= p) & ((p - j <= window) | (j < sinks))


@_add("sinks ignored", "sliding_window_mask", {"test_sliding_window_mask"}, "check_sliding_window_mask",
      "attention sinks")
def window_without_sinks(t_q, t_k, window, sinks=0, device=None):
    p, j = torch.arange(t_k - t_q, t_k)[:, None], torch.arange(t_k)[None, :]
    return (j <= p) & (p - j < window)


@_add("queries at the first positions", "sliding_window_mask", {"test_sliding_window_mask"},
      "check_sliding_window_mask", "last t_q")
def window_top_left(t_q, t_k, window, sinks=0, device=None):
    p, j = torch.arange(t_q)[:, None], torch.arange(t_k)[None, :]
    return (j <= p) & ((p - j < window) | (j < sinks))


@_add("sinks not causal", "sliding_window_mask", {"test_sliding_window_mask"},
      "check_sliding_window_mask", "stays causal")
def window_future_sinks(t_q, t_k, window, sinks=0, device=None):
    p, j = torch.arange(t_k - t_q, t_k)[:, None], torch.arange(t_k)[None, :]
    return ((j <= p) & (p - j < window)) | (j < sinks)


@_add("evicts before returning", "rolling_cache", {"test_rolling_cache"}, "check_rolling_cache",
      "still need the keys")
def rolling_evict_first(cache, k, v, window, sinks=0):
    n = 0 if cache is None else int(cache[2][-1]) + 1
    positions = torch.arange(n, n + k.shape[-2])
    if cache is not None:
        k, v, positions = torch.cat([cache[0], k], -2), torch.cat([cache[1], v], -2), torch.cat([cache[2], positions])
    keep = (positions < sinks) | (positions[-1] - positions < window)
    kept = (k[..., keep, :], v[..., keep, :], positions[keep])
    return (*kept, kept)


@_add("keeps window - 1 positions, which a window of 1 empties", "rolling_cache", {"test_rolling_cache"},
      "check_rolling_cache", "always holds the last position")
def rolling_one_too_few(cache, k, v, window, sinks=0):
    n = 0 if cache is None else int(cache[2][-1]) + 1
    positions = torch.arange(n, n + k.shape[-2])
    if cache is not None:
        k, v, positions = torch.cat([cache[0], k], -2), torch.cat([cache[1], v], -2), torch.cat([cache[2], positions])
    keep = (positions < sinks) | (positions[-1] + 1 - positions < window)
    return k, v, positions, (k[..., keep, :], v[..., keep, :], positions[keep])


@_add("evicts the sinks", "rolling_cache", {"test_rolling_cache"}, "check_rolling_cache", "lose the sinks")
def rolling_no_sinks(cache, k, v, window, sinks=0):
    n = 0 if cache is None else int(cache[2][-1]) + 1
    positions = torch.arange(n, n + k.shape[-2])
    if cache is not None:
        k, v, positions = torch.cat([cache[0], k], -2), torch.cat([cache[1], v], -2), torch.cat([cache[2], positions])
    keep = positions[-1] - positions < window
    return k, v, positions, (k[..., keep, :], v[..., keep, :], positions[keep])


@_add("positions from the cache's size", "rolling_cache", {"test_rolling_cache"}, "check_rolling_cache",
      "not from the cache's size")
def rolling_positions_from_size(cache, k, v, window, sinks=0):
    n = 0 if cache is None else cache[0].shape[-2]
    positions = torch.arange(n, n + k.shape[-2])
    if cache is not None:
        k, v, positions = torch.cat([cache[0], k], -2), torch.cat([cache[1], v], -2), torch.cat([cache[2], positions])
    keep = (positions < sinks) | (positions[-1] - positions < window)
    return k, v, positions, (k[..., keep, :], v[..., keep, :], positions[keep])


@_add("sink ignored", "attention_with_sinks", {"test_attention_with_sinks"}, "check_attention_with_sinks",
      "plain attention")
def sinks_ignored(q, k, v, sink_logits, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1).nan_to_num() @ v


@_add("renormalised after dropping the sink", "attention_with_sinks", {"test_attention_with_sinks"},
      "check_attention_with_sinks", "without renormalising")
def sinks_renormalised(q, k, v, sink_logits, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    sink = sink_logits[:, None, None].expand(*scores.shape[:-1], 1)
    weights = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]
    return weights / weights.sum(-1, keepdim=True) @ v


@_add("sink logit scaled by 1/sqrt(D)", "attention_with_sinks", {"test_attention_with_sinks"},
      "check_attention_with_sinks", "divided the sink logit")
def sinks_scaled(q, k, v, sink_logits, mask=None):
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    sink = sink_logits[:, None, None].expand(*scores.shape[:-1], 1)
    return torch.cat([scores, sink], dim=-1).div(math.sqrt(q.shape[-1])).softmax(dim=-1)[..., :-1] @ v


@_add("softmax that divides by the keys' maximum", "attention_with_sinks", {"test_attention_with_sinks"},
      "check_attention_with_sinks", "NaN")
def sinks_nan_when_masked(q, k, v, sink_logits, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    top = scores.amax(-1, keepdim=True)                  # -inf for a row with no key: exp(-inf - -inf) is NaN
    e, s = (scores - top).exp(), (sink_logits[:, None, None] - top).exp()
    return e / (e.sum(-1, keepdim=True) + s) @ v


@_add("absorbed=True that builds the keys and values 16 tokens at a time", "mla", {"test_mla_absorbed"},
      "check_mla_absorbed", "building them in pieces")
def mla_absorbed_keys_in_blocks(self, x, past=None, absorbed=False):
    # Under any peak-memory bound, and never a tensor as large as the keys: the plain path, block by block.
    B, T, _ = x.shape
    H, r, nope, rope = self.n_head, self.kv_rank, self.nope_dim, self.rope_dim
    t_past = 0 if past is None else past[0].shape[1]
    positions = torch.arange(t_past, t_past + T, device=x.device)
    q = self.wq_b(self.q_norm(self.wq_a(x))).view(B, T, H, nope + rope).transpose(1, 2)
    q_nope, q_pe = q.split([nope, rope], dim=-1)
    q_pe = apply_rope(q_pe, positions)
    c_kv, k_pe = self.wkv_a(x).split([r, rope], dim=-1)
    c_kv, k_pe = self.kv_norm(c_kv), apply_rope(k_pe, positions)
    if past is not None:
        c_kv, k_pe = torch.cat([past[0], c_kv], dim=1), torch.cat([past[1], k_pe], dim=1)
    S = c_kv.shape[1]
    mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(t_past)
    if not absorbed:
        k_nope, v = self.wkv_b(c_kv).view(B, S, H, nope + self.v_dim).transpose(1, 2).split([nope, self.v_dim], -1)
        k = torch.cat([k_nope, k_pe[:, None].expand(B, H, S, rope)], dim=-1)
        y = F.scaled_dot_product_attention(torch.cat([q_nope, q_pe], dim=-1), k, v, attn_mask=mask,
                                           dropout_p=self.dropout if self.training else 0.0)
    else:
        scores, blocks = [], []
        for s in range(0, S, 16):                  # keys and values of 16 tokens at a time
            k_nope, v = self.wkv_b(c_kv[:, s:s + 16]).view(B, -1, H, nope + self.v_dim).transpose(1, 2).split(
                [nope, self.v_dim], -1)
            scores.append(q_nope @ k_nope.transpose(-2, -1) + q_pe @ k_pe[:, None, s:s + 16].transpose(-2, -1))
            blocks.append(v)
        weights = (torch.cat(scores, -1) / math.sqrt(nope + rope)).masked_fill(~mask, float("-inf")).softmax(-1)
        y = sum(weights[..., s:s + 16] @ v for s, v in zip(range(0, S, 16), blocks))
    return self.resid_dropout(self.wo(y.transpose(1, 2).reshape(B, T, H * self.v_dim))), (c_kv, k_pe)
