"""Small fixed layers used to exercise learners' property checks (e.g. permutation equivariance)."""
import torch


def make_layer(kind, weight):
    """A layer [..., N, D] -> [..., N, D] built from a [D, D] weight.

    'linear' and 'attention' are permutation-equivariant; 'causal' and 'cumsum' see order.
    """
    if kind == "linear":
        return lambda x: x @ weight
    if kind == "attention":
        return lambda x: torch.nn.functional.scaled_dot_product_attention(x @ weight, x, x)
    if kind == "causal":
        return lambda x: torch.nn.functional.scaled_dot_product_attention(x @ weight, x, x, is_causal=True)
    if kind == "cumsum":
        return lambda x: (x @ weight).cumsum(dim=-2)
    if kind == "decoder_step":
        return decoder_step(weight)
    if kind == "prefix_decoder":
        return prefix_decoder(weight)
    if kind == "score_table":
        return score_table(weight)
    raise ValueError(f"unknown layer kind {kind!r}")


def decoder_step(weight):
    """A fixed decoder step for greedy decoding (chapter 01), from a [V, H] weight (token vectors).

    step(y_prev [B] long, state [B, H], enc [B, S, H], mask [B, S] bool or None)
        -> (new_state [B, H], logits [B, V], weights [B, S])
    Dot-product attention of the state over enc, then
    new_state = tanh(2 * state rolled by one coordinate + weight[y_prev] + context) (the roll keeps the
    state moving, so the tokens change from step to step) and logits = new_state @ weight.T.
    Deterministic: no parameters to train, nothing random.
    """
    def step(y_prev, state, enc, mask=None):
        scores = (enc @ state.unsqueeze(-1)).squeeze(-1)
        if mask is not None:   # padded positions get no weight
            scores = torch.where(mask, scores, torch.full_like(scores, float("-inf")))
        attn = torch.softmax(scores, dim=-1)
        new_state = torch.tanh(2 * state.roll(1, dims=-1) + weight[y_prev] + (attn.unsqueeze(-1) * enc).sum(-2))
        return new_state, new_state @ weight.T, attn
    return step


def prefix_decoder(weight):
    """A fixed stateless decoder for greedy decoding (chapter 05), from a [V, H] weight (token vectors).

    decode(tgt_in [B, T] long, memory [B, S, H], memory_mask [B, S] bool or None) -> logits [B, T, V].
    Like a Transformer decoder it re-reads the whole prefix and position t sees tokens 0..t only:
    h_t = tanh(g_t) with g_t = 0.7 * (g_{t-1} rolled by one coordinate) + weight[tgt_in[:, t]],
    then dot-product attention of h_t over memory (masked positions get no weight) and
    logits_t = 2 (h_t rolled by one coordinate + context_t) @ weight.T (the roll keeps the tokens
    changing from step to step).  Rows are independent; nothing random.
    """
    def decode(tgt_in, memory, memory_mask=None):
        g = torch.zeros(tgt_in.shape[0], weight.shape[1], dtype=weight.dtype)
        states = []
        for t in range(tgt_in.shape[1]):
            g = 0.7 * g.roll(1, dims=-1) + weight[tgt_in[:, t]]
            states.append(torch.tanh(g))
        h = torch.stack(states, dim=1)                                    # [B, T, H]
        scores = h @ memory.transpose(-2, -1)                             # [B, T, S]
        if memory_mask is not None:
            scores = torch.where(memory_mask[:, None, :], scores, torch.full_like(scores, float("-inf")))
        context = torch.softmax(scores, dim=-1) @ memory
        return 2 * (h.roll(1, dims=-1) + context) @ weight.T
    return decode


def score_table(table):
    """A fixed decoder for beam search (chapter 05) from a [T, V, V] table: next-token logits by
    (position, previous token).

    decode(tgt_in [B, t] long, memory [B, S, V] with S >= t, memory_mask [B, S] bool or None) -> logits [B, t, V],
    logits[b, s] = table[s, tgt_in[b, s]] + memory[b, s], the bias memory[b, s] left out where
    memory_mask[b, s] is False: the table holds what depends on the prefix (through its last token), memory
    and its mask a bias for each sequence of the batch. Indexing, a selection and one addition per entry:
    the same logits whatever the batch's size or order, so equal entries stay exactly equal.
    """
    def decode(tgt_in, memory, memory_mask=None):
        t = tgt_in.shape[1]
        positions = torch.arange(t)[None, :].expand_as(tgt_in)
        bias = memory[:, :t]
        if memory_mask is not None:
            bias = torch.where(memory_mask[:, :t, None], bias, torch.zeros_like(bias))
        return table[positions, tgt_in] + bias
    return decode
