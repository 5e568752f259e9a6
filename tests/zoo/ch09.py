"""Known-wrong implementations for chapter 09 (see tests/zoo/__init__.py)."""
import math

import torch
import torch.nn.functional as F

from . import collector

VARIANTS, _add = collector()


# ---- lr_at ------------------------------------------------------------------------------------
@_add("warmup off by one", "lr_at", {"test_lr_warmup"}, "check_lr_warmup", "off by one")
def lr_warmup_off_by_one(step, max_lr, min_lr, warmup_steps, max_steps):
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    if step >= max_steps:
        return min_lr
    progress = (step - warmup_steps) / (max_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


@_add("cosine not reaching the floor", "lr_at", {"test_lr_cosine"}, "check_lr_cosine", "does not reach the floor")
def lr_cosine_short(step, max_lr, min_lr, warmup_steps, max_steps):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    progress = (step - warmup_steps) / max_steps          # never gets to 1 before max_steps
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


@_add("cosine decays to zero, not to the floor", "lr_at", {"test_lr_cosine"}, "check_lr_cosine", "ignores the floor")
def lr_cosine_to_zero(step, max_lr, min_lr, warmup_steps, max_steps):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    progress = (step - warmup_steps) / (max_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * progress)) * max_lr


@_add("cosine climbs back after max_steps", "lr_at", {"test_lr_cosine"}, "check_lr_cosine", "climbs back up")
def lr_cosine_keeps_going(step, max_lr, min_lr, warmup_steps, max_steps):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / (max_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


@_add("cosine not offset by the warmup", "lr_at", {"test_lr_cosine"}, "check_lr_cosine", "start at warmup_steps")
def lr_cosine_from_zero(step, max_lr, min_lr, warmup_steps, max_steps):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    progress = step / max_steps
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


# ---- micro_batch_loss -----------------------------------------------------------------------------
@_add("accumulation without loss scaling", "micro_batch_loss", {"test_micro_batch_loss"}, "check_micro_batch_loss",
      "not divided by accum_steps")
def accum_unscaled(logits, targets, accum_steps):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@_add("loss multiplied by accum_steps", "micro_batch_loss", {"test_micro_batch_loss"}, "check_micro_batch_loss",
      "multiplied")
def accum_multiplied(logits, targets, accum_steps):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)) * accum_steps


@_add("token losses summed", "micro_batch_loss", {"test_micro_batch_loss"}, "check_micro_batch_loss", "sums the token")
def accum_summed(logits, targets, accum_steps):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum") / accum_steps


# ---- cross_entropy ---------------------------------------------------------------------------------
@_add("cross-entropy without subtracting the row maximum", "cross_entropy", {"test_cross_entropy"},
      "check_cross_entropy", "exp overflows")
def ce_no_max(logits, targets, ignore_index=-100):
    rows, classes = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    keep = classes != ignore_index
    rows, classes = rows[keep], classes[keep]
    log_norm = rows.exp().sum(dim=-1).log()
    return (log_norm - rows.gather(-1, classes.unsqueeze(-1)).squeeze(-1)).mean()


@_add("cross-entropy as the log of a softmax", "cross_entropy", {"test_cross_entropy"}, "check_cross_entropy",
      "log of a probability that underflows")
def ce_log_of_softmax(logits, targets, ignore_index=-100):
    rows, classes = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    keep = classes != ignore_index
    rows, classes = rows[keep], classes[keep]
    e = (rows - rows.amax(dim=-1, keepdim=True)).exp()
    probs = e / e.sum(dim=-1, keepdim=True)
    return -probs.gather(-1, classes.unsqueeze(-1)).log().mean()


@_add("cross-entropy counting ignored positions in the mean", "cross_entropy", {"test_cross_entropy"},
      "check_cross_entropy", "counting the ignored positions")
def ce_counts_ignored(logits, targets, ignore_index=-100):
    rows, classes = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    keep = classes != ignore_index
    shifted = rows - rows.amax(dim=-1, keepdim=True)
    log_norm = shifted.exp().sum(dim=-1).log()
    picked = shifted.gather(-1, classes.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return ((log_norm - picked) * keep).sum() / classes.numel()


@_add("cross-entropy picking the logit of the ignore_index target", "cross_entropy", {"test_cross_entropy"},
      "check_cross_entropy", "leave the ignored positions out")
def ce_not_skipped(logits, targets, ignore_index=-100):
    rows, classes = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    shifted = rows - rows.amax(dim=-1, keepdim=True)
    log_norm = shifted.exp().sum(dim=-1).log()
    return (log_norm - shifted.gather(-1, classes.unsqueeze(-1)).squeeze(-1)).mean()


@_add("cross-entropy summed over positions", "cross_entropy", {"test_cross_entropy"}, "check_cross_entropy",
      "sums the positions' losses")
def ce_summed(logits, targets, ignore_index=-100):
    rows, classes = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    keep = classes != ignore_index
    rows, classes = rows[keep], classes[keep]
    shifted = rows - rows.amax(dim=-1, keepdim=True)
    log_norm = shifted.exp().sum(dim=-1).log()
    return (log_norm - shifted.gather(-1, classes.unsqueeze(-1)).squeeze(-1)).sum()


@_add("cross-entropy calling F.log_softmax", "cross_entropy", {"test_cross_entropy"}, "check_cross_entropy",
      "may not call torch.nn.functional.log_softmax")
def ce_builtin_log_softmax(logits, targets, ignore_index=-100):
    rows, classes = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    keep = classes != ignore_index
    log_probs = F.log_softmax(rows[keep], dim=-1)
    return -log_probs.gather(-1, classes[keep].unsqueeze(-1)).mean()


@_add("cross-entropy through torch.ops.aten.logsumexp", "cross_entropy", {"test_cross_entropy"},
      "check_cross_entropy", "may not call aten::logsumexp")
def ce_builtin_logsumexp(logits, targets, ignore_index=-100):
    rows, classes = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    keep = classes != ignore_index
    rows, classes = rows[keep], classes[keep]
    lse = torch.ops.aten.logsumexp(rows, [-1])
    return (lse - rows.gather(-1, classes.unsqueeze(-1)).squeeze(-1)).mean()


# ---- clip_grad_norm -------------------------------------------------------------------------------
@_add("clipping per parameter instead of globally", "clip_grad_norm", {"test_clip_grad_norm"},
      "check_clip_grad_norm", "clipped each gradient")
def clip_per_parameter(grads, max_norm):
    total_norm = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
    return total_norm, [g * (max_norm / (g.norm() + 1e-6)).clamp(max=1.0) for g in grads]


@_add("norms added instead of squared norms", "clip_grad_norm", {"test_clip_grad_norm"}, "check_clip_grad_norm",
      "adds up the gradients' norms")
def clip_sum_of_norms(grads, max_norm):
    total_norm = torch.stack([g.norm() for g in grads]).sum()
    scale = (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
    return total_norm, [g * scale for g in grads]


@_add("gradients scaled up below max_norm", "clip_grad_norm", {"test_clip_grad_norm"}, "check_clip_grad_norm",
      "never scale them up")
def clip_always(grads, max_norm):
    total_norm = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
    return total_norm, [g * (max_norm / (total_norm + 1e-6)) for g in grads]


@_add("factor without the 1e-6", "clip_grad_norm", {"test_clip_grad_norm"}, "check_clip_grad_norm", "1e-6")
def clip_no_eps(grads, max_norm):
    total_norm = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
    scale = (max_norm / total_norm).clamp(max=1.0) if total_norm > 0 else torch.ones_like(total_norm)
    return total_norm, [g * scale for g in grads]


@_add("calls the built-in clip_grad_norm_", "clip_grad_norm", {"test_clip_grad_norm"}, "check_clip_grad_norm",
      "may not call torch.nn.utils.clip_grad_norm_")
def clip_builtin(grads, max_norm):
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    total_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return total_norm, [p.grad for p in params]


# ---- flops_per_token and mfu -------------------------------------------------------------------------
@_add("FLOPs counting the embedding matrices as 6N compute", "flops_per_token", {"test_flops_per_token"},
      "check_flops_per_token", "lookup tables as compute")
def flops_with_embeddings(n_params, n_embedding, n_layer, n_embd, seq_len):
    return 6 * n_params + 12 * n_layer * n_embd * seq_len


@_add("FLOPs without the attention term", "flops_per_token", {"test_flops_per_token"}, "check_flops_per_token",
      "attention term")
def flops_no_attention(n_params, n_embedding, n_layer, n_embd, seq_len):
    return 6 * (n_params - n_embedding)


@_add("FLOPs of the forward pass only", "flops_per_token", {"test_flops_per_token"}, "check_flops_per_token",
      "forward pass only")
def flops_forward_only(n_params, n_embedding, n_layer, n_embd, seq_len):
    return 2 * (n_params - n_embedding) + 4 * n_layer * n_embd * seq_len


@_add("MFU as a percentage", "mfu", {"test_mfu"}, "check_mfu", "not a percentage")
def mfu_percent(flops_per_token, tokens_per_second, peak_flops, n_devices=1):
    return 100 * flops_per_token * tokens_per_second / (peak_flops * n_devices)


@_add("MFU against one device's peak", "mfu", {"test_mfu"}, "check_mfu", "all n_devices")
def mfu_one_device(flops_per_token, tokens_per_second, peak_flops, n_devices=1):
    return flops_per_token * tokens_per_second / peak_flops


# ---- shard_indices --------------------------------------------------------------------------------
@_add("each rank reading the same shard", "shard_indices", {"test_shard_indices"}, "check_shard_indices",
      "every rank gets the same rows")
def shard_same_for_all(n, rank, world_size):
    if not 0 <= rank < world_size or n % world_size:
        raise ValueError("uneven split")
    return torch.arange(n // world_size)


@_add("rows dealt round-robin", "shard_indices", {"test_shard_indices"}, "check_shard_indices", "contiguous block")
def shard_strided(n, rank, world_size):
    if not 0 <= rank < world_size or n % world_size:
        raise ValueError("uneven split")
    return torch.arange(rank, n, world_size)


@_add("uneven split accepted", "shard_indices", {"test_shard_indices"}, "check_shard_indices", "raise ValueError")
def shard_no_check(n, rank, world_size):
    per_rank = n // world_size
    return torch.arange(rank * per_rank, (rank + 1) * per_rank)


# ---- all_reduce_mean ----------------------------------------------------------------------------
@_add("no all-reduce: each rank's own mean", "all_reduce_mean", {"test_all_reduce_mean"}, "check_all_reduce_mean",
      "its own mean")
def reduce_local(loss_sum, count):
    return loss_sum / count


@_add("mean of the ranks' means", "all_reduce_mean", {"test_all_reduce_mean"}, "check_all_reduce_mean",
      "averaged the ranks' means")
def reduce_mean_of_means(loss_sum, count):
    mean = loss_sum / count
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(mean)
        mean = mean / torch.distributed.get_world_size()
    return mean


@_add("sum of the ranks' means", "all_reduce_mean", {"test_all_reduce_mean"}, "check_all_reduce_mean",
      "summed the ranks' means")
def reduce_sum_of_means(loss_sum, count):
    mean = loss_sum / count
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(mean)
    return mean


@_add("all-reduce without a process group", "all_reduce_mean", {"test_all_reduce_mean"}, "check_all_reduce_mean",
      "is_initialized")
def reduce_always(loss_sum, count):
    totals = torch.stack([loss_sum, count])
    torch.distributed.all_reduce(totals)
    return totals[0] / totals[1]


@_add("all-reduce in place", "all_reduce_mean", {"test_all_reduce_mean"}, "check_all_reduce_mean",
      "overwrites the tensor it is given")
def reduce_in_place(loss_sum, count):
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(loss_sum)
        torch.distributed.all_reduce(count)
    return loss_sum / count


# ---- issue 23: inputs left unchanged, integer results ----------------------------------------------------------
@_add("clipping the gradients in place", "clip_grad_norm", {"test_clip_grad_norm"}, "check_clip_grad_norm",
      "in place")
def clip_in_place(grads, max_norm):
    total_norm = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
    scale = (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale)
    return total_norm, grads


@_add("shard indices as floats (/ instead of //)", "shard_indices", {"test_shard_indices"}, "check_shard_indices",
      "1-D long tensor")
def shard_float(n, rank, world_size):
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    if n % world_size:
        raise ValueError(f"a batch of {n} rows does not split evenly over {world_size} processes")
    return torch.arange(rank * n / world_size, (rank + 1) * n / world_size)


# ---- AdamW (issue 22) -------------------------------------------------------------------------------------------
@_add("AdamW with L2 weight decay (added to the gradient)", "AdamW", {"test_adamw"}, "check_adamw",
      "added the weight decay to the gradient")
@torch.no_grad()
def adamw_l2(self):
    for group in self.param_groups:
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["step"], state["exp_avg"], state["exp_avg_sq"] = 0, torch.zeros_like(p), torch.zeros_like(p)
            state["step"] += 1
            t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
            g = p.grad + weight_decay * p
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.sub_(lr * (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + eps))


@_add("AdamW without bias correction", "AdamW", {"test_adamw"}, "check_adamw", "no bias correction")
@torch.no_grad()
def adamw_no_bias_correction(self):
    for group in self.param_groups:
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["step"], state["exp_avg"], state["exp_avg_sq"] = 0, torch.zeros_like(p), torch.zeros_like(p)
            state["step"] += 1
            m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
            p.mul_(1 - lr * weight_decay)
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.sub_(lr * m / (v.sqrt() + eps))


@_add("AdamW bias correction off by one step", "AdamW", {"test_adamw"}, "check_adamw", "off by one step")
@torch.no_grad()
def adamw_bias_off_by_one(self):
    for group in self.param_groups:
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["step"], state["exp_avg"], state["exp_avg_sq"] = 0, torch.zeros_like(p), torch.zeros_like(p)
            t, m, v, g = state["step"], state["exp_avg"], state["exp_avg_sq"], p.grad
            p.mul_(1 - lr * weight_decay)
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.sub_(lr * (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + eps))
            state["step"] += 1                            # counted after its use: t is 0 at the first step


@_add("AdamW with eps inside the square root", "AdamW", {"test_adamw"}, "check_adamw", "inside the square root")
@torch.no_grad()
def adamw_eps_inside(self):
    for group in self.param_groups:
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["step"], state["exp_avg"], state["exp_avg_sq"] = 0, torch.zeros_like(p), torch.zeros_like(p)
            state["step"] += 1
            t, m, v, g = state["step"], state["exp_avg"], state["exp_avg_sq"], p.grad
            p.mul_(1 - lr * weight_decay)
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.sub_(lr * (m / (1 - beta1 ** t)) / (v / (1 - beta2 ** t) + eps).sqrt())


@_add("AdamW weight decay not scaled by the learning rate", "AdamW", {"test_adamw"}, "check_adamw",
      "not scaled by the learning rate")
@torch.no_grad()
def adamw_decay_without_lr(self):
    for group in self.param_groups:
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["step"], state["exp_avg"], state["exp_avg_sq"] = 0, torch.zeros_like(p), torch.zeros_like(p)
            state["step"] += 1
            t, m, v, g = state["step"], state["exp_avg"], state["exp_avg_sq"], p.grad
            p.mul_(1 - weight_decay)
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.sub_(lr * (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + eps))


@_add("AdamW decaying parameters that have no gradient", "AdamW", {"test_adamw"}, "check_adamw", "decayed it anyway")
@torch.no_grad()
def adamw_decay_without_grad(self):
    for group in self.param_groups:
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            p.mul_(1 - lr * weight_decay)                 # before looking at the gradient
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["step"], state["exp_avg"], state["exp_avg_sq"] = 0, torch.zeros_like(p), torch.zeros_like(p)
            state["step"] += 1
            t, m, v, g = state["step"], state["exp_avg"], state["exp_avg_sq"], p.grad
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.sub_(lr * (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + eps))


@_add("AdamW with one step count for all parameters", "AdamW", {"test_adamw"}, "check_adamw", "one step count")
@torch.no_grad()
def adamw_shared_step(self):
    self.steps_taken = getattr(self, "steps_taken", 0) + 1
    for group in self.param_groups:
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
            state["step"] = t = self.steps_taken
            m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
            p.mul_(1 - lr * weight_decay)
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.sub_(lr * (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + eps))


@_add("AdamW state kept per position in the group, not per parameter", "AdamW", {"test_adamw"}, "check_adamw",
      "parameters share their moments")
@torch.no_grad()
def adamw_state_by_position(self):
    for group in self.param_groups:
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        for i, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            state = self.state[i]
            if not state:
                state["step"], state["exp_avg"], state["exp_avg_sq"] = 0, torch.zeros_like(p), torch.zeros_like(p)
            state["step"] += 1
            t, m, v, g = state["step"], state["exp_avg"], state["exp_avg_sq"], p.grad
            p.mul_(1 - lr * weight_decay)
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.sub_(lr * (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + eps))


# ---- training_memory (issue 22) ----------------------------------------------------------------------------------
@_add("memory without AdamW's moments", "training_memory", {"test_training_memory"}, "check_training_memory",
      "forgot AdamW's moments")
def memory_no_moments(n_params, n_layer, n_embd, n_head, batch, seq_len, mixed_precision=False, dropout=False,
                      checkpointing=False):
    e = 2 if mixed_precision else 4
    s, b, h, a = seq_len, batch, n_embd, n_head
    per_layer = e * (16 * s * b * h + a * s * s * b)
    if dropout:
        per_layer += e * a * s * s * b + a * s * s * b + 2 * s * b * h
    activations = n_layer * e * s * b * h + per_layer if checkpointing else n_layer * per_layer
    memory = {"weights": e * n_params, "grads": e * n_params, "optimizer": 0,
              "master": 4 * n_params if mixed_precision else 0, "activations": activations}
    memory["total"] = sum(memory.values())
    return memory


@_add("memory counting Adam as one moment", "training_memory", {"test_training_memory"}, "check_training_memory",
      "two moments")
def memory_one_moment(n_params, n_layer, n_embd, n_head, batch, seq_len, mixed_precision=False, dropout=False,
                      checkpointing=False):
    e = 2 if mixed_precision else 4
    s, b, h, a = seq_len, batch, n_embd, n_head
    per_layer = e * (16 * s * b * h + a * s * s * b)
    if dropout:
        per_layer += e * a * s * s * b + a * s * s * b + 2 * s * b * h
    activations = n_layer * e * s * b * h + per_layer if checkpointing else n_layer * per_layer
    memory = {"weights": e * n_params, "grads": e * n_params, "optimizer": 4 * n_params,
              "master": 4 * n_params if mixed_precision else 0, "activations": activations}
    memory["total"] = sum(memory.values())
    return memory


@_add("memory with a 16-bit master copy", "training_memory", {"test_training_memory"}, "check_training_memory",
      "master copy of the weights is in float32")
def memory_master_16bit(n_params, n_layer, n_embd, n_head, batch, seq_len, mixed_precision=False, dropout=False,
                        checkpointing=False):
    e = 2 if mixed_precision else 4
    s, b, h, a = seq_len, batch, n_embd, n_head
    per_layer = e * (16 * s * b * h + a * s * s * b)
    if dropout:
        per_layer += e * a * s * s * b + a * s * s * b + 2 * s * b * h
    activations = n_layer * e * s * b * h + per_layer if checkpointing else n_layer * per_layer
    memory = {"weights": e * n_params, "grads": e * n_params, "optimizer": 8 * n_params,
              "master": 2 * n_params if mixed_precision else 0, "activations": activations}
    memory["total"] = sum(memory.values())
    return memory


@_add("activations of one layer only", "training_memory", {"test_training_memory"}, "check_training_memory",
      "multiply by n_layer")
def memory_one_layer(n_params, n_layer, n_embd, n_head, batch, seq_len, mixed_precision=False, dropout=False,
                     checkpointing=False):
    e = 2 if mixed_precision else 4
    s, b, h, a = seq_len, batch, n_embd, n_head
    per_layer = e * (16 * s * b * h + a * s * s * b)
    if dropout:
        per_layer += e * a * s * s * b + a * s * s * b + 2 * s * b * h
    activations = n_layer * e * s * b * h + per_layer if checkpointing else per_layer
    memory = {"weights": e * n_params, "grads": e * n_params, "optimizer": 8 * n_params,
              "master": 4 * n_params if mixed_precision else 0, "activations": activations}
    memory["total"] = sum(memory.values())
    return memory


@_add("activations without the attention weights", "training_memory", {"test_training_memory"},
      "check_training_memory", "leave out the attention weights")
def memory_no_scores(n_params, n_layer, n_embd, n_head, batch, seq_len, mixed_precision=False, dropout=False,
                     checkpointing=False):
    e = 2 if mixed_precision else 4
    s, b, h = seq_len, batch, n_embd
    per_layer = e * 16 * s * b * h
    if dropout:
        per_layer += 2 * s * b * h
    activations = n_layer * e * s * b * h + per_layer if checkpointing else n_layer * per_layer
    memory = {"weights": e * n_params, "grads": e * n_params, "optimizer": 8 * n_params,
              "master": 4 * n_params if mixed_precision else 0, "activations": activations}
    memory["total"] = sum(memory.values())
    return memory
