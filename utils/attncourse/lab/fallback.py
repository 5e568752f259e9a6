"""A GPT built only from PyTorch's own layers, so the lab runs before (or without) your chapter 06 model.

It has the interface the lab expects of any model (and of your chapter 06 GPT):
``GPT(vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0)`` and
``forward(idx [B, T] long) -> logits [B, T, vocab_size]``.  The blocks are
``nn.TransformerEncoderLayer`` (pre-norm, GELU, causal mask), whose attention runs through
``F.scaled_dot_product_attention`` (PyTorch's fused kernels on a GPU).  The output head
shares its matrix with the token embedding.  It is not chapter 06's exercise: no layer here
is written by hand.
"""
import torch
from torch import nn


def gpt2_style_init(m):
    """Chapter 06's initialisation (``model.apply(gpt2_style_init)``): N(0, 0.02) weights of linear layers
    and embeddings, zero biases.  GPT-2-style: GPT-2 also scales its residual projections by 1/sqrt(2 N)."""
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)


class FallbackGPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0):
        super().__init__()
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(n_embd, n_head, dim_feedforward=4 * n_embd, dropout=dropout,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight                  # weight tying
        self.apply(gpt2_style_init)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(block_size),
                             persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        if t > self.block_size:
            raise ValueError(f"sequence of {t} tokens is longer than the context ({self.block_size})")
        x = self.drop(self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device)))
        # is_causal=True lets the attention kernel skip the future instead of reading the mask.
        x = self.blocks(x, mask=self.causal[:t, :t], is_causal=True)
        return self.head(self.norm(x))
