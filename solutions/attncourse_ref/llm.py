"""Chapter 06: large language models (reference implementation).

Tokenizers (characters, byte-level byte-pair encoding), a GPT whose parameters carry GPT-2's
names (so GPT-2's weights load into it), the next-token loss, sampling, the KV cache, grouped-query and
multi-head latent attention, speculative decoding, sliding windows with attention sinks and BERT's
masked-language-model masking.
"""
import collections
import math

import torch
import torch.nn.functional as F
from torch import nn

from .positional import apply_rope

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


# ---- grouped-query attention -------------------------------------------------------------------------
class GroupedQueryAttention(nn.Module):
    """CausalSelfAttention with n_kv_head key/value heads shared by the n_head query heads (Ainslie et al.,
    2023): n_kv_head = n_head is multi-head attention, n_kv_head = 1 multi-query attention.

    Parameters: c_attn.weight [C + 2 * n_kv_head * D, C] and c_attn.bias, the fused projection to
    [q | k | v] of widths C, n_kv_head * D, n_kv_head * D (D = C / n_head); c_proj as CausalSelfAttention's.
    Query head h uses key/value head h // (n_head // n_kv_head) (consecutive query heads share one, as
    in Llama: torch.repeat_interleave along the head axis).
    forward(x [B, T, C], past_kv=None or (k, v) each [B, n_kv_head, T_past, D]) -> (y [B, T, C], (k, v))
    with the cache [B, n_kv_head, T_past + T, D]: n_head / n_kv_head times smaller than multi-head's.
    """

    def __init__(self, n_embd, n_head, n_kv_head, dropout=0.0):
        super().__init__()
        assert n_embd % n_head == 0, "n_embd must be a multiple of n_head"
        assert n_head % n_kv_head == 0, "n_kv_head must divide n_head"
        self.n_head, self.n_kv_head, self.dropout = n_head, n_kv_head, dropout
        self.c_attn = nn.Linear(n_embd, n_embd + 2 * n_kv_head * (n_embd // n_head))
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x, past_kv=None):
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
        group = self.n_head // self.n_kv_head          # query heads per key/value head
        y = F.scaled_dot_product_attention(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1),
                                           attn_mask=mask, is_causal=mask is None,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.c_proj(y)), (k, v)


def gqa_from_mha(weight, bias, n_head, n_kv_head):
    """A multi-head c_attn (weight [3C, C], bias [3C], rows [q | k | v]) as a grouped-query one with
    n_kv_head key/value heads: returns (weight [C + 2 * n_kv_head * D, C], bias [C + 2 * n_kv_head * D]).

    The query rows are kept; the key (and the value) rows of each group of n_head / n_kv_head
    consecutive heads are averaged into one head (mean pooling, as in Ainslie et al. 2023). Same dtype.
    """
    C = weight.shape[1]
    D, group = C // n_head, n_head // n_kv_head

    def pool(rows):                                   # [n_head * D, ...] -> [n_kv_head * D, ...]
        return rows.reshape(n_kv_head, group, D, *rows.shape[1:]).mean(dim=1).reshape(n_kv_head * D, *rows.shape[1:])

    def convert(t):
        q, k, v = t.split(C, dim=0)
        return torch.cat([q, pool(k), pool(v)], dim=0)
    return convert(weight), convert(bias)



# ---- multi-head latent attention (issue 34: the reference for the exercise to come) ---------------------------
class MultiHeadLatentAttention(nn.Module):
    """Causal multi-head latent attention (DeepSeek-V2, section 2.1; parameters named as in DeepSeek-V3's
    inference code): what a token leaves in the cache is a latent c_kv [kv_rank] and one rotated key k_pe
    [rope_dim] that every head shares, instead of a key and a value per head.

    Queries: wq_b(q_norm(wq_a(x))) gives each head [q_nope (nope_dim) | q_pe (rope_dim)]; q_pe is rotated (RoPE,
    apply_rope's adjacent pairs, at the token's position).  Keys and values: wkv_a(x) gives [c_kv | k_pe]; k_pe is
    rotated, c_kv normalised (kv_norm); wkv_b(c_kv) gives each head [k_nope (nope_dim) | v (v_dim)].  Head h's key
    is [k_nope_h | k_pe], its query [q_nope_h | q_pe_h], the scores are scaled by 1 / sqrt(nope_dim + rope_dim),
    and y = wo(the heads' outputs side by side).  The rotated part is "decoupled": RoPE applied to k_nope would
    depend on the position, and wkv_b could no longer be absorbed (``absorbed=True``).  No biases; RMSNorms as
    DeepSeek's (eps 1e-6).

    forward(x [B, T, C], past=None or (c_kv [B, T_past, kv_rank], k_pe [B, T_past, rope_dim]), absorbed=False)
    -> (y [B, T, C], the cache (c_kv, k_pe) of T_past + T positions); the new tokens are at positions
    T_past .. T_past + T - 1.  Dropout (training mode): F.scaled_dot_product_attention's dropout_p on the weights,
    then resid_dropout on the output.  absorbed=True (evaluation only): the same result, up to rounding, without a
    key or a value ever made, wkv_b absorbed into the queries and the output; a cached token then costs kv_rank +
    rope_dim numbers per head in the scores.
    """

    def __init__(self, n_embd, n_head, q_rank, kv_rank, nope_dim, rope_dim, v_dim, dropout=0.0):
        super().__init__()
        assert rope_dim % 2 == 0, "rope_dim must be even (RoPE rotates pairs)"
        self.n_head, self.kv_rank, self.dropout = n_head, kv_rank, dropout
        self.nope_dim, self.rope_dim, self.v_dim = nope_dim, rope_dim, v_dim
        self.wq_a = nn.Linear(n_embd, q_rank, bias=False)
        self.q_norm = nn.RMSNorm(q_rank, eps=1e-6)
        self.wq_b = nn.Linear(q_rank, n_head * (nope_dim + rope_dim), bias=False)
        self.wkv_a = nn.Linear(n_embd, kv_rank + rope_dim, bias=False)
        self.kv_norm = nn.RMSNorm(kv_rank, eps=1e-6)
        self.wkv_b = nn.Linear(kv_rank, n_head * (nope_dim + v_dim), bias=False)
        self.wo = nn.Linear(n_head * v_dim, n_embd, bias=False)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x, past=None, absorbed=False):
        B, T, _ = x.shape
        H, r, nope, rope = self.n_head, self.kv_rank, self.nope_dim, self.rope_dim
        t_past = 0 if past is None else past[0].shape[1]
        positions = torch.arange(t_past, t_past + T, device=x.device)
        q = self.wq_b(self.q_norm(self.wq_a(x))).view(B, T, H, nope + rope).transpose(1, 2)
        q_nope, q_pe = q.split([nope, rope], dim=-1)
        q_pe = apply_rope(q_pe, positions)
        c_kv, k_pe = self.wkv_a(x).split([r, rope], dim=-1)
        c_kv, k_pe = self.kv_norm(c_kv), apply_rope(k_pe, positions)          # what the cache keeps
        if past is not None:
            c_kv, k_pe = torch.cat([past[0], c_kv], dim=1), torch.cat([past[1], k_pe], dim=1)
        S = c_kv.shape[1]
        mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(t_past)
        if not absorbed:
            k_nope, v = self.wkv_b(c_kv).view(B, S, H, nope + self.v_dim).transpose(1, 2).split([nope, self.v_dim], -1)
            k = torch.cat([k_nope, k_pe[:, None].expand(B, H, S, rope)], dim=-1)   # one rotated key for all heads
            y = F.scaled_dot_product_attention(torch.cat([q_nope, q_pe], dim=-1), k, v, attn_mask=mask,
                                               dropout_p=self.dropout if self.training else 0.0)
        else:
            # DeepSeek's decoding: no key or value is made.  wkv_b's key rows w_k turn q_nope into a query in the
            # latent space, scored against c_kv itself; its value rows w_v map the weighted average of the latents.
            if self.training and self.dropout > 0:
                raise RuntimeError("absorbed=True is the evaluation path: call .eval() first (it applies no dropout)")
            w_k, w_v = self.wkv_b.weight.view(H, nope + self.v_dim, r).split([nope, self.v_dim], dim=1)
            scores = (torch.einsum("bhtd,hdr->bhtr", q_nope, w_k) @ c_kv[:, None].transpose(-2, -1)
                      + q_pe @ k_pe[:, None].transpose(-2, -1)) / math.sqrt(nope + rope)
            weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = torch.einsum("bhtr,hvr->bhtv", weights @ c_kv[:, None], w_v)
        return self.resid_dropout(self.wo(y.transpose(1, 2).reshape(B, T, H * self.v_dim))), (c_kv, k_pe)


# ---- speculative decoding ------------------------------------------------------------------------------
PAD_TOKEN = -1          # what speculative_step writes after the last new token


def speculative_step(target_probs, draft_probs, draft_tokens, generator=None):
    """Accept or reject k drafted tokens so that the result follows the target's distribution exactly
    (Leviathan et al., 2023; Chen et al., 2023).

    draft_tokens [..., k] long: token i was drawn from draft_probs[..., i, :] ([..., k, V], q_i);
    target_probs [..., k + 1, V]: the target's distributions p_i at the same positions and one more.
    Random draws, in this order, all from ``generator``:
      1. u = torch.rand(draft_tokens.shape, generator=generator, dtype=target_probs.dtype): one uniform
         per drafted token, drawn for all k even where an earlier one is rejected;
      2. draft token i is accepted when u_i < p_i(x_i) / q_i(x_i); the n accepted tokens are those
         before the first rejection (n = k when none is rejected);
      3. the next token: where n < k, from max(0, p_n - q_n) (multinomial normalises it); where n = k,
         the bonus token from p_k; one call torch.multinomial(weights.reshape(-1, V), 1,
         generator=generator) for all rows at once.
    Returns long [..., k + 1]: the n accepted draft tokens, the next token, then PAD_TOKEN (-1).
    """
    k, V = draft_tokens.shape[-1], target_probs.shape[-1]
    u = torch.rand(draft_tokens.shape, generator=generator, dtype=target_probs.dtype, device=draft_tokens.device)
    p = target_probs[..., :k, :].gather(-1, draft_tokens[..., None])[..., 0]
    q = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
    accepted = (u < p / q).long().cumprod(-1)             # 1 up to the first rejection, 0 from there
    n = accepted.sum(-1)                                  # [...]
    p_n = target_probs.gather(-2, n[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    q_n = draft_probs.gather(-2, n.clamp(max=k - 1)[..., None, None].expand(*n.shape, 1, V))[..., 0, :]
    weights = torch.where((n < k)[..., None], (p_n - q_n).clamp(min=0), p_n)
    nxt = torch.multinomial(weights.reshape(-1, V), 1, generator=generator).reshape(n.shape)
    position = torch.arange(k + 1, device=draft_tokens.device)
    padded = torch.cat([draft_tokens, torch.full_like(draft_tokens[..., :1], PAD_TOKEN)], dim=-1)
    out = torch.where(position < n[..., None], padded, PAD_TOKEN)
    return torch.where(position == n[..., None], nxt[..., None], out)


# ---- sliding windows and attention sinks --------------------------------------------------------------------------
def sliding_window_mask(t_q, t_k, window, sinks=0, device=None):
    """Which keys each query may attend to under causal sliding-window attention with attention sinks.

    The t_q queries are the last t_q of the t_k positions (query i sits at position t_k - t_q + i, as with a cache).
    The query at position p may attend to key j when j <= p and either p - j < window (the window holds the query
    itself and the window - 1 positions before it, as in Mistral and gpt-oss) or j < sinks (the first positions,
    always kept: StreamingLLM's attention sinks). Returns bool [t_q, t_k], True where attending is allowed.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    p = torch.arange(t_k - t_q, t_k, device=device)[:, None]
    j = torch.arange(t_k, device=device)[None, :]
    return (j <= p) & ((p - j < window) | (j < sinks))


def rolling_cache_update(cache, k, v, window, sinks=0):
    """One step of a rolling key/value cache of bounded size (StreamingLLM).

    cache: None before the first step, else (k_kept, v_kept, positions) as the last step returned it:
      [B, H, S, D], [B, H, S, D] and long [S], the positions in increasing order.
    k, v [B, H, T, D]: the new tokens, at the T positions after the last one seen (0 .. T - 1 after None).
    Returns (keys, values, positions, new_cache):
      keys, values, positions: the kept entries followed by the new ones, what the T new queries may need
      (attend with sliding_window_mask's rule applied to these positions);
      new_cache: the entries of those at positions j < sinks and the window most recent, in the same order: what
      the last new query attended to (a later query sees all but the oldest of them, which the mask leaves out). Its
      size never exceeds sinks + window, and it always holds the last position seen.
    """
    n = 0 if cache is None else int(cache[2][-1]) + 1
    positions = torch.arange(n, n + k.shape[-2], device=k.device)
    if cache is not None:
        k, v = torch.cat([cache[0], k], dim=-2), torch.cat([cache[1], v], dim=-2)
        positions = torch.cat([cache[2], positions])
    # What the last query (at positions[-1]) attended to: the sinks and its window.
    keep = (positions < sinks) | (positions[-1] - positions < window)
    return k, v, positions, (k[..., keep, :], v[..., keep, :], positions[keep])


def attention_with_sinks(q, k, v, sink_logits, mask=None):
    """Scaled dot-product attention with a learned sink logit per head (gpt-oss's form).

    q [B, H, T_q, D], k and v [B, H, T_k, D], sink_logits [H], mask bool [T_q, T_k] (True: may attend) or None.
    Each row of scores q k^T / sqrt(D), masked with -inf, gets one more column holding its head's sink logit;
    the softmax runs over all T_k + 1 columns and the sink's column is dropped, so the weights on the keys sum to
    less than 1 (what the sink took is attention paid to nothing). A sink logit of -inf is plain attention.
    Returns [B, H, T_q, D].
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    sink = sink_logits.to(scores.dtype)[:, None, None].expand(*scores.shape[:-1], 1)
    weights = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]
    return weights @ v
