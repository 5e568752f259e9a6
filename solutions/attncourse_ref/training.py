"""Chapter 09: the pieces of a real training run (reference implementation).

The learner's versions of these functions are what the generic training program
(attncourse.lab.train) calls at every step; see chapters/ch09/gpu_lab.ipynb.
"""
import math

import torch
import torch.nn.functional as F


def lr_at(step, max_lr, min_lr, warmup_steps, max_steps):
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then cosine decay to a floor.

    Steps 0 .. warmup_steps - 1 climb linearly: step s gets max_lr * (s + 1) / warmup_steps, so the
    last warmup step reaches max_lr.  From warmup_steps to max_steps the rate follows half a cosine
    from max_lr down to min_lr; at step max_steps and after it stays at min_lr.
    Returns a Python float.
    """
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    progress = (step - warmup_steps) / (max_steps - warmup_steps)     # 0 -> 1 over the decay
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def cross_entropy(logits, targets, ignore_index=-100):
    """Mean cross-entropy of logits against target classes, as F.cross_entropy computes it, from scratch.

    logits [N, V] or [B, T, V] float (float32 or float64): a row of V scores per position;
    targets [N] or [B, T] long: each position's class in 0 .. V-1, or ignore_index for a position
    that does not count (padding).  Returns a 0-dim tensor of the logits' dtype: the mean of
    -log softmax(row)[target] over the positions whose target is not ignore_index.  Stable for any
    finite logits: each row's maximum is subtracted before exponentiating.  If every position is
    ignored the mean is over zero positions: NaN, as F.cross_entropy returns.
    """
    rows = logits.reshape(-1, logits.shape[-1])
    classes = targets.reshape(-1)
    keep = classes != ignore_index
    rows, classes = rows[keep], classes[keep]
    shifted = rows - rows.amax(dim=-1, keepdim=True).detach()      # the largest entry of each row is 0
    log_norm = shifted.exp().sum(dim=-1).log()                      # log sum exp, no overflow: every exp <= 1
    picked = shifted.gather(-1, classes.unsqueeze(-1)).squeeze(-1)
    return (log_norm - picked).mean()


def micro_batch_loss(logits, targets, accum_steps):
    """The loss to backpropagate for one of ``accum_steps`` micro-batches of an optimizer step.

    logits [B, T, V] float, targets [B, T] long.  The mean next-token cross-entropy of this
    micro-batch divided by accum_steps, so that the gradients summed over the accum_steps
    micro-batches equal the gradient of the mean loss over the whole (large) batch.
    Returns a 0-dim tensor of the logits' dtype.
    """
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return loss / accum_steps


def clip_grad_norm(grads, max_norm):
    """Global gradient-norm clipping, as torch.nn.utils.clip_grad_norm_ does it, without modifying ``grads``.

    grads: list of tensors (one per parameter, all of one float dtype).  The total norm is the L2
    norm of all their entries together.  If it exceeds max_norm, every gradient is multiplied by
    the same factor max_norm / (total_norm + 1e-6); otherwise they are returned unchanged.
    Returns (total_norm, clipped): total_norm a 0-dim tensor (the norm before clipping),
    clipped a list of new tensors in the order of ``grads``.
    """
    total_norm = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
    scale = (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
    return total_norm, [g * scale for g in grads]


def flops_per_token(n_params, n_embedding, n_layer, n_embd, seq_len):
    """Training FLOPs per token of a GPT: 6 N plus the attention term 12 * n_layer * n_embd * seq_len.

    N = n_params - n_embedding: the parameters that take part in matrix products.  n_embedding
    counts the parameters of tables that are only looked up (position table; the token table
    too unless it is tied to the output head, whose matrix product is real compute).  Each such
    parameter costs 2 FLOPs per token forward and 4 backward (6 N).  Attention adds the two
    [T x T] products (scores and weighted sum), 2 * 2 * n_layer * seq_len * n_embd forward,
    three times that with the backward pass.  Returns an int.
    """
    n = n_params - n_embedding
    return 6 * n + 12 * n_layer * n_embd * seq_len


def mfu(flops_per_token, tokens_per_second, peak_flops, n_devices=1):
    """Model FLOPs utilisation: the fraction (0..1) of the devices' peak that training achieves.

    tokens_per_second counts the tokens of all devices together; peak_flops is one device's
    peak (FLOP/s).  Returns a Python float.
    """
    return flops_per_token * tokens_per_second / (peak_flops * n_devices)


def shard_indices(n, rank, world_size):
    """The rows of a global batch of n rows that process ``rank`` of ``world_size`` works on.

    Contiguous, equal blocks in rank order: rank r gets rows r * n / W .. (r + 1) * n / W - 1.
    Raises ValueError if world_size does not divide n or rank is not in 0 .. world_size - 1.
    Returns a 1-D long tensor.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    if n % world_size:
        raise ValueError(f"a batch of {n} rows does not split evenly over {world_size} processes")
    per_rank = n // world_size
    return torch.arange(rank * per_rank, (rank + 1) * per_rank)


def all_reduce_mean(loss_sum, count):
    """The mean loss over every process: sum of all ranks' loss sums / sum of all ranks' counts.

    loss_sum and count: 0-dim float tensors of one dtype (this process's summed per-token loss and
    its number of tokens).  Uses torch.distributed.all_reduce with SUM on the default group when
    torch.distributed is initialised; otherwise this is the only process.  Does not modify its
    inputs.  Returns a 0-dim tensor of loss_sum's dtype, the same on every rank.
    """
    totals = torch.stack([loss_sum, count])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(totals, op=torch.distributed.ReduceOp.SUM)
    return totals[0] / totals[1]


class AdamW(torch.optim.Optimizer):
    """AdamW (Loshchilov and Hutter, 2019) from scratch, step for step as torch.optim.AdamW computes it.

    params: parameters or param groups (dicts with "params" and any of the options below), as for
    every torch.optim optimizer; lr, betas = (beta1, beta2), eps, weight_decay: the defaults of the
    groups.  Each parameter p with a gradient gets, at its t-th step (t counted per parameter):
    decoupled weight decay p <- p * (1 - lr * weight_decay); the moments m <- beta1 m + (1 - beta1) g,
    v <- beta2 v + (1 - beta2) g^2; bias corrections m_hat = m / (1 - beta1^t),
    v_hat = v / (1 - beta2^t); and p <- p - lr * m_hat / (sqrt(v_hat) + eps).  The learning rate is
    read from the group at every step (a schedule may change group["lr"] between steps).
    Parameters whose .grad is None are skipped.  State per parameter, under PyTorch's names:
    state["step"] (t), state["exp_avg"] (m), state["exp_avg_sq"] (v).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:                                       # this parameter's first step
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t, m, v, g = state["step"], state["exp_avg"], state["exp_avg_sq"], p.grad
                p.mul_(1 - lr * weight_decay)                      # decoupled: the gradient never sees it
                m.lerp_(g, 1 - beta1)                               # m + (1 - beta1)(g - m) = beta1 m + (1 - beta1) g
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                bias1, bias2 = 1 - beta1 ** t, 1 - beta2 ** t
                denom = (v.sqrt() / math.sqrt(bias2)).add_(eps)     # sqrt(v_hat) + eps
                p.addcdiv_(m, denom, value=-lr / bias1)             # p - lr * m_hat / (sqrt(v_hat) + eps)


def training_memory(n_params, n_layer, n_embd, n_head, batch, seq_len, mixed_precision=False, dropout=False,
                    checkpointing=False):
    """Bytes a GPT training run with AdamW holds: model state per parameter, activations per layer.

    Model state: in float32, weights and gradients 4 bytes per parameter each; AdamW's two moments 8;
    no master copy.  With mixed precision (16-bit weights and gradients), 2 + 2 bytes, the moments 8
    and a float32 master copy of the weights 4 (16 in all either way; Rajbhandari et al. 2020).
    Activations kept for the backward pass, per layer, with e = 2 bytes per element (mixed precision)
    or 4 (float32), s = seq_len, b = batch, h = n_embd, a = n_head (Korthikanti et al. 2022, without
    flash attention): e * (16 s b h + a s^2 b) (layer-norm inputs 2 sbh, attention's input, Q, K, V
    and output-projection input 5 sbh, the MLP's input, hidden layer before and after GELU 9 sbh, the
    softmax's output a s^2 b); with dropout also its 1-byte masks (a s^2 b + 2 s b h) and the dropped
    attention weights (e a s^2 b), which makes s b h (34 + 5 a s / h) in 16 bits.  Times n_layer; with
    checkpointing, only each layer's input (e s b h per layer) plus one layer's activations, rebuilt
    during its backward pass.  Embeddings and logits are left out.  Returns a dict of ints: weights,
    grads, optimizer, master, activations, total.
    """
    e = 2 if mixed_precision else 4
    s, b, h, a = seq_len, batch, n_embd, n_head
    per_layer = e * (16 * s * b * h + a * s * s * b)
    if dropout:
        per_layer += e * a * s * s * b + a * s * s * b + 2 * s * b * h
    activations = n_layer * e * s * b * h + per_layer if checkpointing else n_layer * per_layer
    memory = {"weights": e * n_params, "grads": e * n_params, "optimizer": 8 * n_params,
              "master": 4 * n_params if mixed_precision else 0, "activations": activations}
    memory["total"] = sum(memory.values())
    return memory
