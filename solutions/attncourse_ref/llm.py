"""Chapter 06: large language models (reference implementation).

Tokenizers (characters, byte-level byte-pair encoding), a GPT whose parameters carry GPT-2's
names (so GPT-2's weights load into it), the next-token loss, sampling, the KV cache and BERT's
masked-language-model masking.
"""
import collections

import torch
import torch.nn.functional as F
from torch import nn

UNKNOWN = "\ufffd"          # what char_decode writes for the unknown-character id
IGNORE_INDEX = -100         # label of positions that no loss should score (PyTorch's default)


# ---- a character tokenizer -------------------------------------------------------------------
def char_vocab(corpus):
    """The distinct characters of ``corpus`` sorted by code point, as one string; character i has id i."""
    return "".join(sorted(set(corpus)))


def char_encode(text, vocab):
    """list[int]: the id of each character of ``text``; a character missing from ``vocab`` gets len(vocab)."""
    index = {c: i for i, c in enumerate(vocab)}
    return [index.get(c, len(vocab)) for c in text]


def char_decode(ids, vocab):
    """str: the characters with these ids (ints or a 1-D long tensor); the unknown id len(vocab) -> U+FFFD."""
    return "".join(vocab[i] if i < len(vocab) else UNKNOWN for i in map(int, ids))


# ---- byte-level byte-pair encoding -------------------------------------------------------------
def merge_pair(ids, pair, new_id):
    """A new list: ``ids`` with each occurrence of ``pair`` replaced by ``new_id``, scanning left to
    right; occurrences do not overlap ([a, a, a] with pair (a, a) gives [new_id, a])."""
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def bpe_train(text, n_merges):
    """Learn up to ``n_merges`` merges from the UTF-8 bytes of ``text``; merge i creates token 256 + i.

    Each round counts every adjacent pair (overlapping ones too: [a, a, a] holds (a, a) twice),
    takes the most frequent, ties going to the smallest pair (a, b), and merges it. Training stops
    early when no pair occurs at least twice. Returns a list of (a, b) tuples of ints.
    """
    ids = list(text.encode("utf-8"))
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


def bpe_encode(text, merges):
    """list[int]: the UTF-8 bytes of ``text`` with the merges applied in the order they were learned."""
    ids = list(text.encode("utf-8"))
    for i, pair in enumerate(merges):
        ids = merge_pair(ids, tuple(pair), 256 + i)
    return ids


def bpe_decode(ids, merges):
    """str: the bytes behind ``ids``, joined, then decoded as UTF-8 (invalid bytes -> U+FFFD)."""
    pieces = {i: bytes([i]) for i in range(256)}
    for i, (a, b) in enumerate(merges):
        pieces[256 + i] = pieces[a] + pieces[b]
    return b"".join(pieces[int(i)] for i in ids).decode("utf-8", errors="replace")


# ---- the GPT ---------------------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    """GPT-2's masked multi-head self-attention with a fused projection c_attn -> [q | k | v].

    Parameters: c_attn.weight [3C, C], c_attn.bias [3C], c_proj.weight [C, C], c_proj.bias [C].
    forward(x [B, T, C], past_kv=None or (k, v) each [B, H, T_past, C/H]) -> (y [B, T, C], (k, v))
    where the returned k, v hold the past and the new keys/values: [B, H, T_past + T, C/H].
    """

    def __init__(self, n_embd, n_head, dropout=0.0):
        super().__init__()
        assert n_embd % n_head == 0, "n_embd must be a multiple of n_head"
        self.n_head, self.dropout = n_head, dropout
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x, past_kv=None):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        mask = None
        if past_kv is not None:
            t_past = past_kv[0].shape[2]
            k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
            # Query i sits at position t_past + i: it sees keys 0 .. t_past + i.
            mask = torch.ones(T, t_past + T, dtype=torch.bool, device=x.device).tril(t_past)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.c_proj(y)), (k, v)


class Block(nn.Module):
    """A pre-norm block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).

    forward(x [B, T, C], past_kv=None) -> (x [B, T, C], (k, v) of its attention).
    """

    def __init__(self, n_embd, n_head, dropout=0.0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(collections.OrderedDict(
            c_fc=nn.Linear(n_embd, 4 * n_embd), gelu=nn.GELU(approximate="tanh"),
            c_proj=nn.Linear(4 * n_embd, n_embd), dropout=nn.Dropout(dropout)))

    def forward(self, x, past_kv=None):
        a, present = self.attn(self.ln_1(x), past_kv)
        x = x + a
        x = x + self.mlp(self.ln_2(x))
        return x, present


class GPT(nn.Module):
    """GPT-2's architecture: token and learned position embeddings, n_layer pre-norm blocks, a final
    LayerNorm, and a head tied to the token embedding (logits = x @ wte.weight^T, no separate matrix).

    forward(idx [B, T] long, past_kv=None, use_cache=False) -> logits [B, T, vocab_size], or
    (logits, new_past_kv) with use_cache=True; past_kv / new_past_kv: one (k, v) per layer, each
    [B, n_head, T_past, n_embd / n_head]. Requires T_past + T <= block_size.
    """

    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0):
        nn.Module.__init__(self)        # not super(): the notebook's own GPT class runs this method too
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(p=dropout)
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
        logits = F.linear(self.ln_f(x), self.wte.weight)      # the tied head
        return (logits, presents) if use_cache else logits


# GPT-2's Conv1D layers store their weight as [in, out], the transpose of nn.Linear's [out, in].
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def load_gpt2_weights(model, state_dict):
    """Copy a Hugging Face GPT2LMHeadModel state dict into ``model`` (a GPT of the same sizes), in place.

    Our parameter ``name`` is GPT-2's ``"transformer." + name``; Conv1D weights are transposed;
    GPT-2's lm_head.weight (the same tensor as wte.weight) and any key that is not one of our
    parameters are ignored. Returns ``model``.
    """
    with torch.no_grad():
        for name, param in model.named_parameters():
            weight = state_dict["transformer." + name]
            if name.endswith(CONV1D_WEIGHTS):
                weight = weight.t()
            param.copy_(weight)
    return model


# ---- training and sampling ---------------------------------------------------------------------------
def lm_loss(logits, idx, pad_id=None):
    """Mean next-token cross-entropy: logits[:, t] scored against idx[:, t + 1], for t < T - 1.

    logits [B, T, V] float, idx [B, T] long; targets equal to pad_id are ignored (not counted).
    Returns a scalar of logits' dtype.
    """
    targets = idx[:, 1:]
    if pad_id is not None:
        targets = targets.masked_fill(targets == pad_id, IGNORE_INDEX)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX)


def next_token_probs(logits, temperature=1.0, top_k=None, top_p=None):
    """The next-token distribution after temperature, top-k and top-p, renormalised. Shape and dtype of logits.

    1. divide the logits by temperature (> 0);
    2. top-k: keep the tokens whose logit is >= the k-th largest (ties with it are all kept);
    3. softmax;
    4. top-p: rank the tokens by probability, largest first, equal ones by lower id first; keep
       the shortest prefix whose total reaches top_p (the token that crosses top_p is kept);
       set the others to 0 and renormalise. None disables a filter.
    """
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None:
        ranked, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        above = ranked.cumsum(-1) - ranked                     # mass of the tokens ranked before
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, above >= top_p)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_next_token(probs, generator=None):
    """One token id per row of ``probs`` [..., V] (rows sum to 1), drawn with ``generator``: long [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


# ---- BERT's masked-language-model masking ------------------------------------------------------------
def mlm_mask(tokens, special_mask, mask_id, vocab_size, mlm_prob=0.15, generator=None):
    """BERT's masking: returns (inputs, labels), both long [B, T] like ``tokens``.

    Each position where special_mask is False is chosen independently with probability mlm_prob;
    of the chosen, 80% become mask_id, 10% a token drawn uniformly from 0 .. vocab_size - 1, 10%
    stay as they are. labels: the original token at chosen positions, -100 elsewhere.
    ``tokens`` is not modified.
    """
    shape, device = tokens.shape, tokens.device
    chosen = (torch.rand(shape, generator=generator, device=device) < mlm_prob) & ~special_mask
    labels = torch.where(chosen, tokens, IGNORE_INDEX)
    action = torch.rand(shape, generator=generator, device=device)
    random_tokens = torch.randint(vocab_size, shape, generator=generator, device=device)
    inputs = torch.where(chosen & (action < 0.8), mask_id, tokens)
    inputs = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_tokens, inputs)
    return inputs, labels
