"""A tiny character-level Shakespeare language model for chapter 08's show-only experiments.

Each block is PyTorch's ``nn.TransformerEncoderLayer`` with a causal mask (chapters 02 to 05
built and tested attention and the block); what is passed in replaces its normalisation (e.g.
``nn.LayerNorm`` or your ``RMSNorm``) and its feed-forward layer (a GELU MLP, your ``SwiGLU`` or
your ``MoE``), and ``pre_norm`` says where the norms sit.

    from attncourse import moe_lab
    data = moe_lab.CharData.load()
    model = moe_lab.TinyLM(data.vocab_size, d_model=64, n_layers=2, n_heads=4, context=64,
                           norm=nn.LayerNorm, ffn=lambda d: nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(),
                                                                           nn.Linear(4 * d, d)))
    history = moe_lab.train(model, data, steps=200)
"""
import time

import torch
import torch.nn.functional as F
from torch import nn

from . import shakespeare

PLAYS = ("hamlet", "macbeth", "othello", "king-lear")


class CharData:
    """Characters of a few plays as integer ids, split 90/10 into training and validation text."""

    def __init__(self, text):
        self.chars = sorted(set(text))
        self.vocab_size = len(self.chars)
        index = {c: i for i, c in enumerate(self.chars)}
        ids = torch.tensor([index[c] for c in text], dtype=torch.long)
        cut = int(0.9 * len(ids))
        self.train, self.val = ids[:cut], ids[cut:]

    @classmethod
    def load(cls, plays=PLAYS):
        return cls(shakespeare.text(plays))

    def batch(self, split, batch_size, context, generator):
        """(inputs, targets), each [batch_size, context]: targets are the inputs shifted by one."""
        ids = self.train if split == "train" else self.val
        start = torch.randint(len(ids) - context - 1, (batch_size,), generator=generator)
        rows = start[:, None] + torch.arange(context + 1)
        chunk = ids[rows]
        return chunk[:, :-1], chunk[:, 1:]


class Block(nn.TransformerEncoderLayer):
    """PyTorch's own Transformer layer (with a causal mask: a decoder-only block), with its
    normalisation and feed-forward layer swapped for the ones passed in.

    norm_first=True:  x + f(norm(x))      (pre-norm, GPT-2 onwards)
    norm_first=False: norm(x + f(x))      (post-norm, the 2017 Transformer)
    A feed-forward layer that returns (y, router_logits) is an MoE; its logits are kept.
    """

    def __init__(self, d_model, n_heads, norm, ffn, pre_norm=True):
        super().__init__(d_model, n_heads, dim_feedforward=1, dropout=0.0, batch_first=True, norm_first=pre_norm,
                         bias=False)
        del self.linear1, self.linear2          # the feed-forward layer is ``ffn``'s
        self.norm1, self.norm2 = norm(d_model), norm(d_model)
        self.ffn = ffn(d_model)
        self.router_logits = None

    def _ff_block(self, x):
        out = self.ffn(x)
        if isinstance(out, tuple):
            out, self.router_logits = out
        return out


class TinyLM(nn.Module):
    """Token and learned position embeddings, n_layers blocks, (a final norm if pre-norm), a linear head."""

    def __init__(self, vocab_size, d_model, n_layers, n_heads, context, norm, ffn, pre_norm=True):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, norm, ffn, pre_norm) for _ in range(n_layers))
        self.final_norm = norm(d_model) if pre_norm else nn.Identity()
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, ids):
        n = ids.shape[1]
        # nn.MultiheadAttention's bool mask is True where attention is NOT allowed: the future.  PyTorch's own
        # helper makes it (its -inf entries), so the learner package does not spell out chapter 02's exercise.
        blocked = nn.Transformer.generate_square_subsequent_mask(n, device=ids.device).isinf()
        x = self.tok(ids) + self.pos(torch.arange(n, device=ids.device))
        for block in self.blocks:
            x = block(x, src_mask=blocked, is_causal=True)
        return self.head(self.final_norm(x))

    def router_logits(self):
        """Router logits of every MoE layer from the last forward pass, [batch, N, E] each."""
        return [b.router_logits for b in self.blocks if b.router_logits is not None]


def count_parameters(module):
    return sum(p.numel() for p in module.parameters())


@torch.no_grad()
def evaluate(model, data, batches, batch_size, context, seed=1234):
    """Mean validation cross-entropy (nats per character) over fixed validation batches."""
    model.eval()
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(batches):
        x, y = data.batch("val", batch_size, context, g)
        losses.append(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item())
    model.train()
    return sum(losses) / len(losses)


def train(model, data, steps, batch_size=32, context=64, lr=3e-3, aux_loss=None, eval_every=50,
          eval_batches=4, seed=0, after_step=None):
    """AdamW on next-character prediction; the data order depends only on ``seed``.

    aux_loss(router_logits: list of tensors) -> scalar, added to the cross-entropy (MoE models).
    after_step(model), if given, runs after each optimiser step under torch.no_grad(), while
    model.router_logits() still holds that step's router logits (DeepSeek-V3's bias update).
    Returns {"step", "val_loss", "train_loss", "tokens_per_s"}: validation loss every
    ``eval_every`` steps (and at step 0), and training throughput (tokens per second of the training
    thread's CPU time, excluding evaluation: on one thread that is the work itself, so a busy machine, which
    stretches the wall-clock time of whichever run it overlaps, does not reorder the models).

    Runs on one CPU thread: with matrices this small a second thread saves little, and on a
    machine whose cores are busy with other work every operation waits for it (measured: 10x
    slower).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(model, data, steps, batch_size, context, lr, aux_loss, eval_every, eval_batches, seed,
                      after_step)
    finally:
        torch.set_num_threads(threads)


def _train(model, data, steps, batch_size, context, lr, aux_loss, eval_every, eval_batches, seed, after_step):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    history = {"step": [0], "val_loss": [evaluate(model, data, eval_batches, batch_size, context)],
               "train_loss": []}
    busy = 0.0
    for step in range(1, steps + 1):
        x, y = data.batch("train", batch_size, context, g)
        t0 = time.thread_time()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        total = loss + aux_loss(model.router_logits()) if aux_loss is not None else loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        opt.step()
        if after_step is not None:
            with torch.no_grad():
                after_step(model)
        busy += time.thread_time() - t0
        history["train_loss"].append(loss.item())
        if step % eval_every == 0 or step == steps:
            history["step"].append(step)
            history["val_loss"].append(evaluate(model, data, eval_batches, batch_size, context))
    history["tokens_per_s"] = steps * batch_size * context / busy
    return history
