"""Chapter 05: the Transformer (reference implementation).

Parameter names follow torch.nn.LayerNorm, torch.nn.TransformerEncoderLayer and
torch.nn.TransformerDecoderLayer, so their weights load into these modules unchanged.
Masks follow the course's convention: True marks a real position that may be attended.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


class LayerNorm(nn.Module):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the last dimension (biased variance).

    Parameters: weight [normalized_shape] (ones), bias [normalized_shape] (zeros).
    """

    def __init__(self, normalized_shape: int, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)        # biased: divide by D, not D - 1
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class FeedForward(nn.Module):
    """Position-wise MLP: linear2(dropout(activation(linear1(x)))), D -> d_ff (4D by default) -> D.

    Parameters: linear1 [d_ff, d_model], linear2 [d_model, d_ff] (with biases); activation "relu" or "gelu".
    """

    def __init__(self, d_model, d_ff=None, activation="relu", dropout=0.0):
        super().__init__()
        d_ff = d_ff or 4 * d_model
        self.activation = activation
        self.linear1 = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        act = F.gelu if self.activation == "gelu" else F.relu
        return self.linear2(self.dropout(act(self.linear1(x))))


class EncoderBlock(FeedForward):
    """Self-attention and the feed-forward network, each wrapped in a residual connection and a LayerNorm.

    Post-norm (norm_first=False): x = norm(x + sublayer(x)); pre-norm: x = x + sublayer(norm(x)).
    Names as in torch.nn.TransformerEncoderLayer: self_attn, linear1, linear2, norm1, norm2.
    forward(x [B, N, D], key_mask [B, N] bool or None, True = real token) -> [B, N, D].
    """

    def __init__(self, d_model, n_heads, d_ff=None, dropout=0.1, activation="relu", norm_first=False):
        super().__init__(d_model, d_ff, activation, dropout)           # linear1, dropout, linear2
        self.norm_first = norm_first
        self.self_attn = nn.MultiheadAttention(d_model, n_heads, dropout=dropout, batch_first=True)
        self.norm1 = LayerNorm(d_model)
        self.norm2 = LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x, key_mask=None):
        pad = None if key_mask is None else ~key_mask                   # torch: True = padding
        def attend(h):
            return self.dropout1(self.self_attn(h, h, h, key_padding_mask=pad, need_weights=False)[0])
        if self.norm_first:
            x = x + attend(self.norm1(x))
            return x + self.dropout2(FeedForward.forward(self, self.norm2(x)))
        x = self.norm1(x + attend(x))
        return self.norm2(x + self.dropout2(FeedForward.forward(self, x)))


class DecoderBlock(FeedForward):
    """Causal self-attention, cross-attention (queries from x, keys and values from memory), feed-forward.

    Names as in torch.nn.TransformerDecoderLayer: self_attn, multihead_attn, linear1, linear2, norm1..3.
    forward(x [B, T, D], memory [B, S, D], memory_mask [B, S] bool or None, True = real source token)
        -> [B, T, D]; position t of x attends to positions 0..t of x only.
    """

    def __init__(self, d_model, n_heads, d_ff=None, dropout=0.1, activation="relu", norm_first=False):
        super().__init__(d_model, d_ff, activation, dropout)
        self.norm_first = norm_first
        self.self_attn = nn.MultiheadAttention(d_model, n_heads, dropout=dropout, batch_first=True)
        self.multihead_attn = nn.MultiheadAttention(d_model, n_heads, dropout=dropout, batch_first=True)
        self.norm1 = LayerNorm(d_model)
        self.norm2 = LayerNorm(d_model)
        self.norm3 = LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(self, x, memory, memory_mask=None):
        n = x.shape[-2]
        future = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)   # torch: True = blocked
        pad = None if memory_mask is None else ~memory_mask
        def self_block(h):
            return self.dropout1(self.self_attn(h, h, h, attn_mask=future, need_weights=False)[0])
        def cross_block(h):
            return self.dropout2(self.multihead_attn(h, memory, memory, key_padding_mask=pad, need_weights=False)[0])
        if self.norm_first:
            x = x + self_block(self.norm1(x))
            x = x + cross_block(self.norm2(x))
            return x + self.dropout3(FeedForward.forward(self, self.norm3(x)))
        x = self.norm1(x + self_block(x))
        x = self.norm2(x + cross_block(x))
        return self.norm3(x + self.dropout3(FeedForward.forward(self, x)))


class Encoder(nn.Module):
    """Token embeddings * sqrt(D) + learned positions, dropout, N encoder blocks, a final LayerNorm if pre-norm.

    forward(src [B, S] long, src_mask [B, S] bool, True = real token) -> memory [B, S, D].
    """

    def __init__(self, vocab_size, d_model, n_heads, n_layers, d_ff=None, dropout=0.1, max_len=64,
                 norm_first=False, activation="relu"):
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model ** -0.5)   # * sqrt(D) in forward: entries ~ N(0, 1)
        self.pos_embedding = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList([EncoderBlock(d_model, n_heads, d_ff, dropout, activation, norm_first)
                                     for _ in range(n_layers)])
        self.norm = LayerNorm(d_model) if norm_first else nn.Identity()

    def forward(self, src, src_mask=None):
        positions = torch.arange(src.shape[-1], device=src.device)
        x = self.dropout(self.embedding(src) * math.sqrt(self.d_model) + self.pos_embedding(positions))
        for layer in self.layers:
            x = layer(x, src_mask)
        return self.norm(x)


class Decoder(nn.Module):
    """Target embeddings * sqrt(D) + learned positions, N decoder blocks, final LayerNorm if pre-norm, output projection.

    forward(tgt_in [B, T] long, memory [B, S, D], memory_mask [B, S] bool or None) -> logits [B, T, vocab_size].
    tie_embeddings: the output projection shares its weight with the target embedding.
    """

    def __init__(self, vocab_size, d_model, n_heads, n_layers, d_ff=None, dropout=0.1, max_len=64,
                 norm_first=False, activation="relu", tie_embeddings=False):
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model ** -0.5)   # * sqrt(D) in forward: entries ~ N(0, 1)
        self.pos_embedding = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList([DecoderBlock(d_model, n_heads, d_ff, dropout, activation, norm_first)
                                     for _ in range(n_layers)])
        self.norm = LayerNorm(d_model) if norm_first else nn.Identity()
        self.out = nn.Linear(d_model, vocab_size)
        if tie_embeddings:
            self.out.weight = self.embedding.weight

    def forward(self, tgt_in, memory, memory_mask=None):
        positions = torch.arange(tgt_in.shape[-1], device=tgt_in.device)
        x = self.dropout(self.embedding(tgt_in) * math.sqrt(self.d_model) + self.pos_embedding(positions))
        for layer in self.layers:
            x = layer(x, memory, memory_mask)
        return self.out(self.norm(x))


def shift_right(tgt, bos):
    """Teacher forcing's decoder input: [B, T] long targets -> [B, T] long, bos followed by tgt[:, :-1]."""
    start = torch.full_like(tgt[:, :1], bos)
    return torch.cat([start, tgt[:, :-1]], dim=1)


def sequence_loss(logits, target, pad=0):
    """Mean cross-entropy over the positions whose target is not ``pad``.

    logits [B, T, V] float, target [B, T] long -> a scalar of logits' dtype.
    """
    return F.cross_entropy(logits.flatten(0, -2), target.flatten(), ignore_index=pad)


def label_smoothed_loss(logits, target, smoothing, pad=0):
    """Mean cross-entropy against label-smoothed targets over the positions whose target is not ``pad``.

    At a real position with target y the smoothed target distribution over the V classes is
    q = (1 - smoothing) * onehot(y) + smoothing / V: the smoothing is spread uniformly over all V
    classes, y included (F.cross_entropy's label_smoothing convention), so y gets
    1 - smoothing + smoothing / V and every other class smoothing / V. The loss of a position is
    -sum_k q_k log p_k = (1 - smoothing) * (-log p_y) + smoothing * mean_k(-log p_k).
    logits [B, T, V] float, target [B, T] long, 0 <= smoothing <= 1 -> a scalar of logits' dtype,
    equal to F.cross_entropy(logits.flatten(0, -2), target.flatten(), ignore_index=pad,
    label_smoothing=smoothing).
    """
    log_p = F.log_softmax(logits, dim=-1)
    real = target != pad
    safe = target.masked_fill(~real, 0)                             # any valid index; these rows are dropped
    nll = -log_p.gather(-1, safe.unsqueeze(-1)).squeeze(-1)          # -log p_y          [B, T]
    uniform = -log_p.mean(dim=-1)                                    # mean_k -log p_k   [B, T]
    per_token = (1 - smoothing) * nll + smoothing * uniform
    return per_token[real].mean()


def greedy_decode(decode, memory, memory_mask, bos, eos, max_len, pad=0):
    """Feed the whole prefix back each step and take the argmax of the last position's logits.

    decode(tgt_in [B, t] long, memory, memory_mask) -> logits [B, t, V].  Returns long [B, L],
    L <= max_len: the tokens after bos, eos included, ``pad`` after a sequence's eos; stops when
    every sequence has produced eos or after max_len tokens.
    """
    batch = memory.shape[0]
    prefix = torch.full((batch, 1), bos, dtype=torch.long, device=memory.device)
    done = torch.zeros(batch, dtype=torch.bool, device=memory.device)
    for _ in range(max_len):
        y = decode(prefix, memory, memory_mask)[:, -1].argmax(dim=-1)
        prefix = torch.cat([prefix, y.masked_fill(done, pad)[:, None]], dim=1)
        done = done | (y == eos)
        if bool(done.all()):
            break
    return prefix[:, 1:]


def beam_search(decode, memory, memory_mask, bos, eos, max_len, beam_size, alpha=0.0, pad=0):
    """Beam search with a length penalty for a batch, with a stateless decoder (as greedy_decode).

    The penalty is GNMT's (Wu et al. 2016, "Google's Neural Machine Translation System", eq. 14, without
    its coverage term): lp(Y) = ((5 + |Y|) / 6) ** alpha.

    decode(tgt_in [B, t] long, memory, memory_mask) -> logits [B, t, V]; memory [B, ...], memory_mask [B, S]
    bool or None (repeat both per hypothesis, row b's hypotheses next to each other, to decode them at once).
    A hypothesis Y is the tokens after bos; its score is log P(Y) / lp(|Y|), lp(n) = ((5 + n) / 6) ** alpha,
    log P(Y) the sum of its tokens' log-probabilities (log_softmax of the last position's logits) and
    |Y| its number of tokens, eos included (alpha = 0: the plain log-probability).
    Each step, for each batch row separately: every unfinished hypothesis (at first only the empty one)
    is extended by every token; the candidates are ranked by log-probability, ties in the order of a stable
    sort of the flattened [hypotheses, V] scores (lower hypothesis index, then lower token id; hypotheses are
    numbered by their rank at the previous step); the first beam_size are kept. A kept candidate that ends in
    eos is finished: set aside with its score, never extended. The others are the next step's unfinished
    hypotheses. After step max_len every kept candidate is finished, eos or not. A row stops once it has no
    unfinished hypothesis, or when the best finished score is >= the best unfinished log-probability divided
    by lp(max_len), a bound no continuation can beat (stopping there gives the same result as going on).
    The answer is the finished hypothesis with the highest score; of equal scores, the one finished first
    (earlier step, then better rank). beam_size = 1 is greedy decoding.
    Returns (tokens long [B, L], scores [B] in the logits' dtype): each row's answer, pad after it, L the
    longest answer's length; and its score.
    """
    batch, device = memory.shape[0], memory.device
    prefix = torch.full((batch, 1, 0), bos, dtype=torch.long, device=device)   # [B, k, t] tokens after bos
    logp = torch.zeros(batch, 1, device=device)                                 # [B, k] log P of each hypothesis
    best_score = best_len = best_tokens = None
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    for t in range(1, max_len + 1):
        k = prefix.shape[1]
        tgt_in = torch.cat([torch.full((batch, k, 1), bos, dtype=torch.long, device=device), prefix], dim=2)
        mask = None if memory_mask is None else memory_mask.repeat_interleave(k, dim=0)
        logits = decode(tgt_in.flatten(0, 1), memory.repeat_interleave(k, dim=0), mask)[:, -1]
        if best_score is None:                                                  # the logits' dtype, from step 1
            logp = logp.to(logits.dtype)
            best_score = torch.full((batch,), float("-inf"), dtype=logits.dtype, device=device)
            best_len = torch.zeros(batch, dtype=torch.long, device=device)
            best_tokens = torch.full((batch, max_len), pad, dtype=torch.long, device=device)
        vocab = logits.shape[-1]
        candidates = logp[:, :, None] + F.log_softmax(logits, dim=-1).view(batch, k, vocab)
        candidates = candidates.masked_fill(done[:, None, None], float("-inf")).flatten(1)    # [B, k * V]
        order = candidates.sort(dim=-1, descending=True, stable=True).indices[:, :beam_size]
        logp = candidates.gather(1, order)                                      # [B, k'] best first
        parent, token = order // vocab, order % vocab
        prefix = torch.cat([prefix.gather(1, parent[:, :, None].expand(-1, -1, t - 1)), token[:, :, None]], dim=2)
        finished = (token == eos) | (t == max_len)
        score = torch.where(finished, logp / ((5 + t) / 6) ** alpha, float("-inf"))          # GNMT's lp(t)
        top = score.argmax(dim=1)                                               # the first of equal scores
        top_score = score.gather(1, top[:, None])[:, 0]
        better = top_score > best_score                                         # strictly: earlier wins ties
        best_score = torch.where(better, top_score, best_score)
        best_len = torch.where(better, t, best_len)
        best_tokens[better, :t] = prefix[better, top[better]]
        logp = logp.masked_fill(finished, float("-inf"))                        # finished: set aside
        bound = logp.max(dim=1).values / ((5 + max_len) / 6) ** alpha
        done = done | (best_score >= bound)
        if bool(done.all()):
            break
    return best_tokens[:, :int(best_len.max())], best_score
