"""Chapter 01: RNN seq2seq with additive attention (reference implementation)."""
import torch
from torch import nn


class AdditiveAttention(nn.Module):
    """Bahdanau attention: e_i = v . tanh(W_q s + W_k h_i), a = softmax over the unpadded i, c = sum_i a_i h_i.

    Parameters: W_q.weight [attn_dim, query_dim] (no bias), W_k.weight [attn_dim, key_dim] and
    W_k.bias [attn_dim], v.weight [1, attn_dim] (no bias).
    """

    def __init__(self, query_dim, key_dim, attn_dim):
        super().__init__()
        self.W_q = nn.Linear(query_dim, attn_dim, bias=False)
        self.W_k = nn.Linear(key_dim, attn_dim)
        self.v = nn.Linear(attn_dim, 1, bias=False)

    def forward(self, query, keys, mask=None):
        # query [B, Dq] -> [B, 1, A]; keys [B, S, Dk] -> [B, S, A]; one score per source position.
        scores = self.v(torch.tanh(self.W_q(query).unsqueeze(-2) + self.W_k(keys))).squeeze(-1)   # [B, S]
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))     # padding gets weight exactly 0
        weights = torch.softmax(scores, dim=-1)
        context = (weights.unsqueeze(-1) * keys).sum(dim=-2)      # [B, Dk]
        return context, weights


class AttentionDecoder(nn.Module):
    """One step of a GRU decoder with additive attention over the encoder states.

    s_t = GRU([embed(y_{t-1}), c_t], s_{t-1}) with c_t = attention(query=s_{t-1}, keys=encoder states);
    logits_t = out([s_t, c_t]).
    """

    def __init__(self, vocab_size, emb_dim, enc_dim, hidden_dim, attn_dim):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_dim)
        self.attention = AdditiveAttention(hidden_dim, enc_dim, attn_dim)
        self.gru = nn.GRUCell(emb_dim + enc_dim, hidden_dim)
        self.out = nn.Linear(hidden_dim + enc_dim, vocab_size)

    def forward(self, y_prev, state, enc, mask=None):
        context, weights = self.attention(state, enc, mask)                  # query: the previous state
        new_state = self.gru(torch.cat([self.embedding(y_prev), context], dim=-1), state)
        logits = self.out(torch.cat([new_state, context], dim=-1))
        return new_state, logits, weights


def greedy_decode(step, state, enc, mask, bos, eos, max_len, pad=0):
    """Feed each step its own most likely token until every sequence has produced ``eos`` or
    ``max_len`` tokens were generated.  Returns long [B, L] (L <= max_len): the tokens after BOS,
    EOS included, ``pad`` after a sequence's EOS."""
    batch = state.shape[0]
    y = torch.full((batch,), bos, dtype=torch.long, device=state.device)
    done = torch.zeros(batch, dtype=torch.bool, device=state.device)
    tokens = []
    for _ in range(max_len):
        state, logits, _ = step(y, state, enc, mask)
        y = logits.argmax(dim=-1)
        tokens.append(y.masked_fill(done, pad))
        done = done | (y == eos)
        if bool(done.all()):
            break
    return torch.stack(tokens, dim=1)
