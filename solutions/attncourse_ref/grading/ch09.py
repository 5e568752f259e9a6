"""Hidden tests for chapter 09: the pieces of a real training run."""
import math

import numpy as np
import torch
from attncourse.autograde import run_optimizer

from .. import training as ref
from . import function_case, hidden_test, optimizer_case, raises_case, ranks_case

DTYPES = [torch.float32, torch.float64]
from attncourse.checks.ch09 import (ADAMW_ALLOWED, ADAMW_KERNELS, CLIP_BUILTINS, CROSS_ENTROPY_ALLOWED,
                                     CROSS_ENTROPY_OPERATORS)  # noqa: E402


def _schedule(rng, warmup=None):
    """(max_lr, min_lr, warmup_steps, max_steps) with a real warmup and a real decay."""
    max_lr = float(rng.choice([6e-4, 1e-3, 3e-3, 0.1, 1.0]))
    min_lr = max_lr * float(rng.choice([0.0, 0.1, 0.25]))
    warmup = int(rng.integers(1, 40)) if warmup is None else warmup
    return max_lr, min_lr, warmup, warmup + int(rng.integers(2, 300))


@hidden_test("ch09.lr_warmup")
def lr_warmup(rng):
    cases = []
    for i in range(8):
        max_lr, min_lr, warmup, max_steps = _schedule(rng, warmup=1 if i == 0 else None)
        for step in sorted({0, warmup - 1, int(rng.integers(0, warmup))}):
            cases.append(function_case(ref.lr_at, [step, max_lr, min_lr, warmup, max_steps]))
    return cases


@hidden_test("ch09.lr_cosine")
def lr_cosine(rng):
    cases = []
    for i in range(8):
        max_lr, min_lr, warmup, max_steps = _schedule(rng, warmup=0 if i < 2 else None)
        span = max_steps - warmup
        steps = {warmup, warmup + span // 2, warmup + int(rng.integers(0, span)), max_steps - 1, max_steps,
                 max_steps + int(rng.integers(1, 100))}
        cases += [function_case(ref.lr_at, [s, max_lr, min_lr, warmup, max_steps]) for s in sorted(steps)]
    return cases


@hidden_test("ch09.micro_batch_loss")
def micro_batch_loss(rng):
    cases = []
    for i in range(8):
        b, t, v = (int(x) for x in rng.integers(1, 6, size=3)) if i else (1, 1, 2)
        dtype = DTYPES[i % 2]
        logits = torch.from_numpy(rng.standard_normal((b, t, v + 1)) * 2).to(dtype)
        targets = torch.from_numpy(rng.integers(0, v + 1, size=(b, t)))
        accum = int(rng.integers(1, 9)) if i != 1 else 1
        cases.append(function_case(ref.micro_batch_loss, [logits, targets, accum], rng=rng, grad_args=(0,)))
    return cases


def _ce_inputs(rng, shape, v, dtype, ignore_index, n_extreme, n_ignored):
    """Logits of ordinary size with ``n_extreme`` kept rows of spread 1e4 (exp overflows, softmax underflows)
    and ``n_ignored`` positions whose target is ignore_index."""
    n = int(np.prod(shape))
    logits = rng.standard_normal((n, v)) * 2
    targets = rng.integers(0, v, size=n)
    order = rng.permutation(n)
    ignored, extreme = order[:n_ignored], order[n_ignored:n_ignored + n_extreme]
    logits[extreme] = np.round(rng.standard_normal((len(extreme), v)) * 1e4)
    logits[extreme, 0] = 1e4                       # a positive maximum, well above exp's range
    targets[extreme] = rng.integers(1, v, size=len(extreme))   # never the maximum: its probability underflows
    if ignore_index >= 0:
        targets[targets == ignore_index] = (ignore_index + 1) % v
    targets[ignored] = ignore_index
    return (torch.from_numpy(logits.reshape(*shape, v)).to(dtype),
            torch.from_numpy(targets.reshape(shape)))


@hidden_test("ch09.cross_entropy", forbid=CROSS_ENTROPY_OPERATORS, allow=CROSS_ENTROPY_ALLOWED)
def cross_entropy(rng):
    cases = []
    for i in range(10):
        dtype = [torch.float64, torch.float32][i % 3 == 1]
        shape = (int(rng.integers(6, 13)),) if i % 2 else (int(rng.integers(2, 4)), int(rng.integers(3, 7)))
        v = int(rng.choice([2, 5, 17, 50, 1000])) if i != 3 else 2048        # long rows too
        ignore_index = -100 if i % 4 else int(rng.integers(0, v))           # a real class may be the ignored one
        n = int(np.prod(shape))
        logits, targets = _ce_inputs(rng, shape, v, dtype, ignore_index, n_extreme=1 + (i % 2), n_ignored=1 + (i % 3))
        kwargs = {} if ignore_index == -100 and i % 3 else {"ignore_index": ignore_index}
        cases.append(function_case(ref.cross_entropy, [logits, targets], kwargs, rng=rng, grad_args=(0,),
                                   describe=f"(logits {list(logits.shape)} {str(dtype).replace('torch.', '')}, "
                                            f"{n} positions, 1 or 2 rows of spread 1e4, "
                                            f"targets with ignore_index={ignore_index} in places)"))
    logits, targets = _ce_inputs(rng, (4,), 6, torch.float64, -100, n_extreme=1, n_ignored=4)
    cases.append(function_case(ref.cross_entropy, [logits, targets], rng=rng, grad_args=(0,),
                               describe="(every position ignored: the mean over no positions is NaN, as F.cross_entropy gives)"))
    return cases


def _grads(rng, dtype, scale):
    shapes = [tuple(int(s) for s in rng.integers(1, 5, size=int(rng.integers(0, 3)))) for _ in range(int(rng.integers(1, 5)))]
    return [torch.from_numpy(np.asarray(rng.standard_normal(s) * scale)).to(dtype) for s in shapes]


def _describe_grads(grads, max_norm, norm):
    shapes = ", ".join(str(list(g.shape)) for g in grads)
    return f"(grads of shapes {shapes} in {str(grads[0].dtype).replace('torch.', '')}, total norm {norm:.4g}, max_norm={max_norm:.4g})"


@hidden_test("ch09.clip_grad_norm", forbid=CLIP_BUILTINS)
def clip_grad_norm(rng):
    cases = []
    for i in range(10):
        dtype = DTYPES[i % 2]
        grads = _grads(rng, dtype, scale=float(rng.choice([1e-3, 0.5, 3.0])))
        norm = float(ref.clip_grad_norm(grads, 1.0)[0])
        # Clip hard, clip a little, leave alone (max_norm above the norm), tiny norms where the 1e-6 matters.
        max_norm = [norm * 0.1, norm * 0.9, norm * 2.0, norm + 1.0, 1e-6 + norm * 0.5][i % 5]
        cases.append(function_case(ref.clip_grad_norm, [grads, max_norm], describe=_describe_grads(grads, max_norm, norm)))
    zeros = [torch.zeros(3, 2), torch.zeros(4)]
    cases.append(function_case(ref.clip_grad_norm, [zeros, 1.0], describe=_describe_grads(zeros, 1.0, 0.0)))
    return cases


def _adamw_run(rng, dtype, n_steps, decay, lr, betas, eps):
    """Param groups, defaults and steps for run_optimizer: matrices (decayed) and vectors (not) in two groups, the
    second with betas and eps of its own half the time; a learning rate changed before every step; the first
    vector without a gradient at step 1 and at one later step (so its step count lags the others'), the first
    matrix without one at a later step."""
    def tensor(shape, scale=1.0):
        return torch.from_numpy(np.asarray(rng.standard_normal(shape) * scale)).to(dtype)
    shapes = [[(int(rng.integers(2, 5)), int(rng.integers(2, 5))) for _ in range(int(rng.integers(1, 4)))],
              [(int(rng.integers(2, 6)),) for _ in range(int(rng.integers(1, 3)))]]
    groups = [{"params": [tensor(s) for s in shapes[0]], "weight_decay": decay},
              {"params": [tensor(s) for s in shapes[1]], "weight_decay": 0.0}]
    if rng.random() < 0.5:
        groups[1].update(betas=(0.8, 0.95), eps=eps * 10)
    flat = shapes[0] + shapes[1]
    scales = [float(rng.choice([1e-3, 1e-2, 0.1, 1.0])) for _ in flat]      # gradients of different sizes
    # the first vector (not decayed) and, at one later step, the first matrix (decayed): a parameter without a
    # gradient is left alone, weight decay included
    skip = {(0, len(shapes[0])), (int(rng.integers(1, n_steps)), len(shapes[0])), (int(rng.integers(1, n_steps)), 0)}
    steps = [{"lr": [lr * float(rng.uniform(0.2, 1.0))] * 2,
              "grads": [None if (k, j) in skip else tensor(s, scales[j]) for j, s in enumerate(flat)]}
             for k in range(n_steps)]
    defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": decay}
    return groups, defaults, steps, len(shapes[0])


@hidden_test("ch09.adamw", forbid=ADAMW_KERNELS, allow=ADAMW_ALLOWED)
def adamw(rng):
    cases = []
    for i in range(8):
        dtype = torch.float32 if i % 4 == 1 else torch.float64
        decay = 0.0 if i == 0 else float(rng.choice([0.01, 0.1, 0.3]))
        lr = float(rng.choice([1e-3, 1e-2, 0.05, 0.1]))
        betas = [(0.9, 0.999), (0.9, 0.95), (0.8, 0.99), (0.5, 0.9)][i % 4]
        eps = float(rng.choice([1e-8, 1e-6, 1e-4, 1e-3]))
        n_steps = int(rng.integers(4, 8))
        groups, defaults, steps, vector = _adamw_run(rng, dtype, n_steps, decay, lr, betas, eps)
        late = next(k for k in range(1, n_steps) if steps[k]["grads"][vector] is None) if n_steps > 1 else 0
        idle = next(k for k in range(1, n_steps) if steps[k]["grads"][0] is None)
        text = (f"({n_steps} steps in {str(dtype).replace('torch.', '')}, {len(steps[0]['grads'])} parameters in 2 groups, "
                f"lr={lr:g} times a factor changed before every step, betas={betas}, eps={eps:g}, weight_decay={decay:g} "
                f"on the first group; parameter {vector} has no gradient at steps 1 and {late + 1}, parameter 0 "
                f"at step {idle + 1})")
        cases.append(optimizer_case(ref.AdamW, groups, defaults, steps, describe=text))
    return cases


@hidden_test("ch09.training_memory")
def training_memory(rng):
    cases = []
    for i in range(10):
        n_layer, n_head = int(rng.integers(2, 49)), int(rng.choice([1, 2, 4, 8, 12, 16, 32]))
        n_embd = n_head * 16 * int(rng.integers(1, 17))
        batch, seq_len = int(rng.integers(1, 17)), int(rng.choice([32, 64, 128, 1024, 2048, 4096]))
        n_params = 12 * n_layer * n_embd ** 2 + int(rng.integers(1_000, 60_000)) * n_embd
        flags = {"mixed_precision": i % 3 != 2, "dropout": i % 4 in (1, 2), "checkpointing": i in (1, 5, 8)}
        kwargs = {k: v for k, v in flags.items() if v or i % 5 == 0}     # defaults left out, or given as False
        settings = ", ".join(f"{k}={v}" for k, v in flags.items())
        cases.append(function_case(ref.training_memory, [n_params, n_layer, n_embd, n_head, batch, seq_len], kwargs,
                                   describe=f"(n_params={n_params:,}, n_layer={n_layer}, n_embd={n_embd}, "
                                            f"n_head={n_head}, batch={batch}, seq_len={seq_len}, {settings})"))
    return cases


@hidden_test("ch09.flops_per_token")
def flops_per_token(rng):
    cases = [function_case(ref.flops_per_token, [124_475_904, 786_432, 12, 768, 1024])]     # GPT-2 small
    for _ in range(7):
        n_layer, n_embd = int(rng.integers(1, 13)), 64 * int(rng.integers(1, 13))
        seq_len, vocab = int(rng.choice([64, 128, 256, 1024])), int(rng.integers(50, 60_000))
        n_embedding = seq_len * n_embd + (vocab * n_embd if rng.random() < 0.5 else 0)
        n_params = n_embedding + 12 * n_layer * n_embd ** 2 + int(rng.integers(0, 10_000))
        cases.append(function_case(ref.flops_per_token, [n_params, n_embedding, n_layer, n_embd, seq_len]))
    return cases


@hidden_test("ch09.mfu")
def mfu(rng):
    cases = []
    for i in range(8):
        fpt = float(rng.uniform(1e6, 2e9))
        peak = float(rng.choice([65e12, 312e12, 989e12, 2e11]))
        devices = [1, 2, 8, 64][i % 4]
        tok_s = float(rng.uniform(0.05, 0.6)) * peak * devices / fpt
        cases.append(function_case(ref.mfu, [fpt, tok_s, peak, devices]))
    cases.append(function_case(ref.mfu, [8.5e8, 1.3e5, 312e12]))          # n_devices defaults to 1
    return cases


@hidden_test("ch09.shard_indices")
def shard_indices(rng):
    cases = []
    for world in (1, 2, 3, 4, 8):
        n = world * int(rng.integers(1, 7))
        cases += [function_case(ref.shard_indices, [n, r, world]) for r in range(world)]
    cases += [raises_case([10, 0, 3], exception="ValueError"), raises_case([7, 1, 2], exception="ValueError"),
              raises_case([8, 2, 2], exception="ValueError"), raises_case([8, -1, 2], exception="ValueError")]
    return cases


@hidden_test("ch09.all_reduce_mean")
def all_reduce_mean(rng):
    cases = []
    for i in range(6):
        dtype = DTYPES[i % 2]
        world = [2, 3, 2, 4, 2, 3][i]
        counts = [float(rng.integers(1, 200)) for _ in range(world)]
        sums = [c * float(rng.uniform(1.0, 5.0)) for c in counts]
        per_rank = [[torch.tensor(s, dtype=dtype), torch.tensor(c, dtype=dtype)] for s, c in zip(sums, counts)]
        text = f"on {world} ranks ({str(dtype).replace('torch.', '')}): " + ", ".join(
            f"rank {r} loss_sum={s_:.4g} count={c:g}" for r, (s_, c) in enumerate(zip(sums, counts)))
        cases.append(ranks_case(ref.all_reduce_mean, per_rank, describe=text))
    # One process, no process group: the plain mean.
    cases.append(function_case(ref.all_reduce_mean, [torch.tensor(12.5, dtype=torch.float64),
                                                     torch.tensor(5.0, dtype=torch.float64)],
                               describe="in one process without a process group: loss_sum=12.5, count=5"))
    return cases


# ---- the visible checks' stored cases ------------------------------------------------------

def _zoo_schedules(step, max_lr, min_lr, warmup, max_steps):
    """Known-wrong schedules, stored so the visible check can name the one a learner wrote."""
    def cosine(progress, floor=min_lr):
        return floor + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - floor)
    if step < warmup:
        return {"off_by_one": max_lr * step / warmup}
    p = min((step - warmup) / (max_steps - warmup), 1.0)
    return {"to_zero": cosine(p, 0.0), "over_max_steps": cosine(min((step - warmup) / max_steps, 1.0)) if step < max_steps else min_lr,
            "no_warmup_offset": cosine(min(step / max_steps, 1.0)) if step < max_steps else min_lr,
            "keeps_going": cosine((step - warmup) / (max_steps - warmup))}


def _plain(tensors):
    """A list of tensors as nested lists (the check-data writer encodes tensors, not lists of them)."""
    return [t.tolist() for t in tensors]


def _cross_entropy_data(g):
    """Stored cases for check_cross_entropy: ordinary logits, ignored positions, a custom ignore_index,
    logits around 1000 (exp overflows) and rows of spread 1e4 (softmax underflows to 0)."""
    def rounded(*shape, scale=2.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale * 100).round() / 100

    plain_x, plain_t = rounded(6, 5), torch.randint(0, 5, (6,), generator=g)
    with torch.enable_grad():
        plain_x.requires_grad_(True)
        loss = ref.cross_entropy(plain_x, plain_t)
        grad, = torch.autograd.grad(loss, plain_x)
    per_position = -(plain_x - plain_x.logsumexp(-1, keepdim=True)).gather(-1, plain_t[:, None]).squeeze(-1)
    plain = {"logits": plain_x.detach(), "targets": plain_t, "loss": loss.detach(), "grad": grad,
             "sum": per_position.sum().detach()}

    masked_x, masked_t = rounded(2, 4, 5), torch.randint(0, 5, (2, 4), generator=g)
    masked_t[0, 1] = masked_t[1, 3] = -100
    keep = masked_t != -100
    losses = -(masked_x - masked_x.logsumexp(-1, keepdim=True)).gather(-1, masked_t.clamp(min=0)[..., None]).squeeze(-1)
    masked = {"logits": masked_x, "targets": masked_t, "loss": ref.cross_entropy(masked_x, masked_t),
              "counted": (losses * keep).sum() / keep.numel(), "sum": (losses * keep).sum()}

    custom_t = torch.tensor([[3, 0, 1, 3], [2, 3, 4, 1]])
    custom = {"targets": custom_t, "ignore_index": 3, "loss": ref.cross_entropy(masked_x, custom_t, ignore_index=3),
              "ignoring_nothing": ref.cross_entropy(masked_x, custom_t)}

    offset_x, offset_t = 1000 + rounded(3, 5), torch.randint(0, 5, (3,), generator=g)
    spread_x = rounded(3, 5, scale=1e4)
    spread_x = spread_x - spread_x.amax(-1, keepdim=True)          # the maximum is 0: exp cannot overflow here
    spread_t = (spread_x.argmax(-1) + 1) % 5                        # never the maximum: its probability underflows
    return {"plain": plain, "masked": masked, "custom": custom,
            "offset": {"logits": offset_x, "targets": offset_t, "loss": ref.cross_entropy(offset_x, offset_t)},
            "spread": {"logits": spread_x, "targets": spread_t, "loss": ref.cross_entropy(spread_x, spread_t)}}


def _adamw_mistake(mistake):
    """A known-wrong AdamW (the visible check names the one a learner wrote by matching its stored steps)."""
    class Mistaken(ref.AdamW):
        @torch.no_grad()
        def step(self):
            self.calls = getattr(self, "calls", 0) + 1
            for group in self.param_groups:
                lr = self.defaults["lr"] if mistake == "fixed_lr" else group["lr"]
                eps, wd = group["eps"], group["weight_decay"]
                beta1, beta2 = group["betas"]
                for i, p in enumerate(group["params"]):
                    if p.grad is None:
                        if mistake == "decay_no_grad":
                            p.mul_(1 - lr * wd)
                        continue
                    state = self.state[i] if mistake == "by_index" else self.state[p]
                    if not state:
                        state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                    state["step"] = self.calls if mistake == "shared_step" else state["step"] + 1
                    t, m, v, g = state["step"], state["exp_avg"], state["exp_avg_sq"], p.grad
                    if mistake == "l2":
                        g = g + wd * p
                    elif mistake == "decay_no_lr":
                        p.mul_(1 - wd)
                    elif mistake != "decay_after":
                        p.mul_(1 - lr * wd)
                    m.mul_(beta1).add_(g, alpha=1 - beta1)
                    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                    if mistake == "no_bias":
                        m_hat, v_hat = m, v
                    elif mistake == "off_by_one":
                        m_hat, v_hat = m / (1 - beta1 ** (t - 1)), v / (1 - beta2 ** (t - 1))
                    else:
                        m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
                    denom = (v_hat + eps).sqrt() if mistake == "eps_inside" else v_hat.sqrt() + eps
                    p.sub_(lr * m_hat / denom)
                    if mistake == "decay_after":
                        p.mul_(1 - lr * wd)
    return Mistaken


ADAMW_MISTAKES = ("l2", "no_bias", "off_by_one", "eps_inside", "decay_after", "decay_no_lr", "shared_step",
                  "by_index", "fixed_lr", "decay_no_grad")


def _adamw_data():
    """One stored run for check_adamw: two groups whose parameters have the same shapes in the same places (so
    that state kept by position runs, and shows), a learning rate changed at every step, eps and gradients of
    sizes where eps inside the square root shows, the second parameter without a gradient at step 1."""
    g = torch.Generator().manual_seed(2019)

    def rounded(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale * 1000).round() / 1000
    shapes = [(2, 3), (3,), (2, 3), (3,)]
    groups = [{"params": [rounded(*shapes[0]), rounded(*shapes[1])], "weight_decay": 0.1},
              {"params": [rounded(*shapes[2]), rounded(*shapes[3])], "weight_decay": 0.0}]
    defaults = {"lr": 0.05, "betas": (0.9, 0.99), "eps": 1e-3, "weight_decay": 0.1}
    lrs = [0.01, 0.05, 0.04, 0.02, 0.01]
    steps = [{"lr": [lr, lr], "grads": [None if (k, j) == (0, 1) else rounded(*s, scale=0.01 * (j + 1))
                                         for j, s in enumerate(shapes)]} for k, lr in enumerate(lrs)]
    runs = {name: run_optimizer(_adamw_mistake(name), groups, defaults, steps) for name in ADAMW_MISTAKES}
    return _lists({"groups": groups, "defaults": defaults, "steps": steps,
                   "expected": run_optimizer(ref.AdamW, groups, defaults, steps),
                   # the parameters' values only (every fourth output): enough to tell the mistakes apart
                   "mistakes": {name: [t if torch.isfinite(t).all() else torch.full_like(t, float("nan")) for t in out[::4]]
                                for name, out in runs.items()}})


def _lists(obj):
    """Tensors inside lists, tuples and dicts as nested lists (the check-data writer encodes tensors and dicts only)."""
    if isinstance(obj, torch.Tensor):
        return _lists(obj.tolist())
    if isinstance(obj, float):
        return round(obj, 12)
    if isinstance(obj, dict):
        return {k: _lists(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_lists(v) for v in obj]
    return obj


def _memory_mistakes(n_params, n_layer, n_embd, n_head, batch, seq_len, mixed_precision, dropout, checkpointing):
    """Known-wrong accountings of training_memory, for the visible check to name."""
    right = ref.training_memory(n_params, n_layer, n_embd, n_head, batch, seq_len, mixed_precision, dropout,
                                checkpointing)
    e = 2 if mixed_precision else 4
    s, b, h, a = seq_len, batch, n_embd, n_head
    one = ref.training_memory(n_params, 1, n_embd, n_head, batch, seq_len, mixed_precision, dropout, False)["activations"]
    no_scores = e * 16 * s * b * h + (2 * s * b * h if dropout else 0)
    return {"one_moment": 4 * n_params, "master_16bit": 2 * n_params, "one_layer": one,
            "no_scores": (n_layer * e * s * b * h + no_scores) if checkpointing else n_layer * no_scores,
            "float32_activations": ref.training_memory(n_params, n_layer, n_embd, n_head, batch, seq_len, False, dropout,
                                                       checkpointing)["activations"],
            "checkpoint_all": n_layer * e * s * b * h, "right": right}


def check_data():
    """Fixed inputs and expected values for the visible checks (tools/make_check_data.py writes them)."""
    sched = {"max_lr": 1e-3, "min_lr": 1e-4, "warmup": 10, "max_steps": 50}
    steps = list(range(0, 61))
    args = [sched["max_lr"], sched["min_lr"], sched["warmup"], sched["max_steps"]]
    lr = {"schedule": sched, "steps": steps, "lr": [ref.lr_at(s, *args) for s in steps],
          "mistakes": {name: [_zoo_schedules(s, *args).get(name) for s in steps]
                       for name in ("off_by_one", "to_zero", "over_max_steps", "no_warmup_offset", "keeps_going")}}

    g = torch.Generator().manual_seed(9)
    logits = (torch.randn(3, 5, 7, generator=g, dtype=torch.float64) * 200).round() / 100
    targets = torch.randint(0, 7, (3, 5), generator=g)
    mean = torch.nn.functional.cross_entropy(logits.reshape(-1, 7), targets.reshape(-1))
    accum = {"logits": logits, "targets": targets, "accum_steps": 4,
             "loss": ref.micro_batch_loss(logits, targets, 4).item(), "mean_loss": mean.item(),
             "sum_loss": torch.nn.functional.cross_entropy(logits.reshape(-1, 7), targets.reshape(-1),
                                                           reduction="sum").item()}

    ce = _cross_entropy_data(torch.Generator().manual_seed(22))

    grads = [(torch.randn(3, 4, generator=g, dtype=torch.float64) * 100).round() / 100,
             (torch.randn(4, generator=g, dtype=torch.float64) * 100).round() / 100,
             torch.tensor([[3.0, -4.0]], dtype=torch.float64)]
    clip = {"grads": _plain(grads), "cases": []}
    for max_norm in (1.0, 100.0, 3.0):
        norm, clipped = ref.clip_grad_norm(grads, max_norm)
        per_param = [g_ * (max_norm / (g_.norm() + 1e-6)).clamp(max=1.0) for g_ in grads]
        clip["cases"].append({"max_norm": max_norm, "norm": norm.item(), "clipped": _plain(clipped),
                              "per_param": _plain(per_param),
                              "no_eps": _plain(g_ * min(max_norm / norm.item(), 1.0) for g_ in grads)})
    # Norm 5e-7, max_norm 1e-7: here the 1e-6 in max_norm / (total_norm + 1e-6) changes the factor threefold.
    tiny = [torch.tensor([[3e-7, -4e-7]], dtype=torch.float64)]
    clip["tiny"] = {"grads": _plain(tiny), "max_norm": 1e-7, "factor": (ref.clip_grad_norm(tiny, 1e-7)[1][0] / tiny[0])[0, 0].item()}

    gpt2 = {"n_params": 124_475_904, "n_embedding": 786_432, "n_layer": 12, "n_embd": 768, "seq_len": 1024}
    flops = {"gpt2": gpt2, "expected": ref.flops_per_token(**gpt2),
             "with_embedding": ref.flops_per_token(gpt2["n_params"], 0, 12, 768, 1024),
             "no_attention": 6 * (gpt2["n_params"] - gpt2["n_embedding"]),
             "forward_only": 2 * (gpt2["n_params"] - gpt2["n_embedding"]) + 4 * 12 * 768 * 1024}
    util = {"args": [8.5e8, 4.0e5, 312e12, 8], "expected": ref.mfu(8.5e8, 4.0e5, 312e12, 8),
            "one_device": ref.mfu(8.5e8, 4.0e5, 312e12, 1)}
    shard = {"n": 12, "world_size": 3, "shards": _plain(ref.shard_indices(12, r, 3) for r in range(3))}
    return {"lr": lr, "accum": accum, "ce": ce, "clip": clip, "flops": flops, "mfu": util, "shard": shard,
            "adamw": _adamw_data(), "memory": _memory_data()}


def _memory_data():
    """GPT-2 small's shape (124,475,904 parameters, 12 layers of width 768, 12 heads, context 1024), batch 4, in the
    four settings the visible check tries."""
    gpt2 = {"n_params": 124_475_904, "n_layer": 12, "n_embd": 768, "n_head": 12, "batch": 4, "seq_len": 1024}
    settings = [dict(mixed_precision=False, dropout=False, checkpointing=False),
                dict(mixed_precision=True, dropout=True, checkpointing=False),
                dict(mixed_precision=True, dropout=False, checkpointing=False),
                dict(mixed_precision=False, dropout=False, checkpointing=True)]
    return {"config": gpt2, "settings": settings,
            "cases": [_memory_mistakes(**gpt2, **flags) for flags in settings]}
