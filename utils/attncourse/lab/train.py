"""The lab's training program: your GPT and your training pieces (mylab.py), trained for real.

One command, whatever the hardware:

    python -m attncourse.lab.train --preset cpu                      # a CPU, or one GPU
    torchrun --standalone --nproc_per_node=8 -m attncourse.lab.train --preset gpt2 --grad-accum 4
    # several machines: the same command on each, with a rendezvous endpoint instead of --standalone
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \\
             --rdzv-id=gpt2 -m attncourse.lab.train --preset gpt2 --grad-accum 2

It imports from mylab.py (written by the notebook's export cell; --code PATH for another file)
the learner's lr_at, micro_batch_loss, clip_grad_norm, flops_per_token, mfu, shard_indices,
all_reduce_mean and model class GPT; --model fallback trains attncourse.lab.FallbackGPT instead, and
--optimizer mine steps with the learner's AdamW class instead of torch.optim.AdamW.
It trains on a CUDA GPU, else Apple's GPU (MPS), else the CPU (--device to choose; it says which
and why).  On a CUDA GPU it uses bfloat16 autocast (float16 with loss scaling where bfloat16 is
missing), TF32 matrix products, fused AdamW and torch.compile (--compile off to switch it off); on
Apple's GPU bfloat16 autocast where it works there and fused AdamW; under torchrun,
DistributedDataParallel over NCCL (GPUs) or gloo (CPUs).  What a device cannot do falls back with
a note (attncourse.lab.hardware).  It logs to
OUT/log.csv, draws OUT/loss.png, checkpoints to OUT/ckpt.pt (model, optimizer, schedule
position, data sampler and RNG states: --resume continues exactly; on several machines put
--out-dir on a filesystem they share), and samples at the end.
"""
import argparse
import contextlib
import csv
import dataclasses
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import data as labdata
from . import hardware, learner
from ..i18n import language, translate
from .fallback import FallbackGPT, gpt2_style_init


@dataclasses.dataclass
class Config:
    # the learner's code and model
    code: str = "mylab.py"
    model: str = "mine"                # "mine": class --model-class of --code; "fallback": FallbackGPT
    model_class: str = "GPT"
    init: str = "gpt2"                 # "gpt2": chapter 06's initialisation applied to your model; "mine": its own
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 64
    vocab_size: int = 0                # 0: the corpus's; larger pads the table (GPT-2: 50304)
    dropout: float = 0.0
    # batch: rows per process per micro-step; micro-steps per optimizer step (per process)
    batch_size: int = 12
    grad_accum: int = 1
    # optimisation (the schedule is the learner's lr_at)
    max_steps: int = 2000              # 0 with --time-budget: as many as fit, measured during the warmup
    warmup_steps: int = 100
    warmup_fraction: float = 0.1       # a run fitted to the time: the warmup is this share of its steps (at most warmup_steps)
    lr: float = 1e-3
    min_lr: float = 1e-4
    weight_decay: float = 0.1
    optimizer: str = "torch"           # "torch": torch.optim.AdamW (fused on a GPU); "mine": the class AdamW of --code
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    # the run
    seed: int = 1337
    data_dir: str = ""
    out_dir: str = "out"
    eval_interval: int = 250
    eval_batches: int = 20
    log_interval: int = 10             # steps between rows of log.csv
    print_interval: int = 0            # steps between printed lines (no progress bar); 0: log_interval
    resume: bool = False
    stop_after: int = 0                # stop (and checkpoint) once this many steps are done; 0: run to max_steps
    time_budget: float = 0.0           # seconds of training; 0: no limit
    device: str = "auto"               # auto (CUDA, else Apple's MPS, else the CPU), cuda, mps, cpu
    dtype: str = "auto"                # auto (bfloat16 on a GPU that has it, else float16 on CUDA, float32; float32 on CPU), float32, bfloat16, float16
    compile: str = "auto"              # auto (on for CUDA), on, off
    threads: int = 0                   # CPU threads for this process; 0: PyTorch's default
    peak_tflops: float = 0.0           # per device; 0: the table (GPU) or a measurement (CPU)
    sample_tokens: int = 300
    temperature: float = 0.8
    progress: str = "auto"             # auto (a bar when stderr is a terminal), on, off
    quiet: bool = False


PRESETS = {
    # The classic minimal-GPT CPU recipe (nanoGPT's "I only have a laptop" Shakespeare run).
    "minimal": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, grad_accum=1, lr=1e-3,
                    min_lr=1e-4, warmup_steps=100, max_steps=2000, beta2=0.99, dropout=0.0),
    # This lab's CPU mode: half the depth (twice the steps per second), a higher learning rate, and a
    # schedule fitted to a fixed wall time (max_steps 0: as many steps as fit in --time-budget seconds).
    "cpu": dict(n_layer=2, n_head=4, n_embd=128, block_size=64, batch_size=12, grad_accum=1, lr=2e-3,
                min_lr=2e-4, warmup_steps=100, max_steps=0, time_budget=40.0, beta2=0.99, dropout=0.0,
                eval_interval=100, eval_batches=10, log_interval=20, print_interval=100),
    # GPT-2 small (124M parameters with the vocabulary padded to 50,304) on GPUs: about 0.5M tokens per
    # optimizer step with 8 GPUs and --grad-accum 4 (one GPU: --grad-accum 32).
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304, batch_size=16,
                 grad_accum=4, lr=6e-4, min_lr=6e-5, warmup_steps=20, max_steps=200, beta2=0.95, dropout=0.0,
                 eval_interval=100, eval_batches=10, log_interval=10),
}


# ---- set-up ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Runtime:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    autocast_dtype: object      # torch.dtype or None
    why: str = ""               # why this device (printed at the start)
    notes: list = dataclasses.field(default_factory=list)   # what the device cannot do, and what runs instead

    @property
    def main(self):
        return self.rank == 0


def setup(cfg):
    """Processes, device and numerics.  Under torchrun (RANK and WORLD_SIZE set) join the process group."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    device, why = hardware.choose_device(cfg.device, local_rank, world_size)
    notes = []
    use_cuda = device.type == "cuda"
    if use_cuda:
        torch.cuda.set_device(device)
        # TF32: float32 matrix products on tensor cores (10-bit mantissa inputs, float32 accumulation).
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if distributed:
        if not dist.is_available():
            raise learner.LabError("this PyTorch has no torch.distributed: run one process, without torchrun")
        backend, note = hardware.dist_backend(device)
        notes += [note] if note else []
        # env:// rendezvous: torchrun has set MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE.
        dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    autocast_dtype, note = hardware.autocast_dtype(device, cfg.dtype)
    notes += [note] if note else []
    return Runtime(rank, local_rank, world_size, device, autocast_dtype, why, notes)


def build_model(cfg, lab, vocab_size):
    if cfg.model == "fallback":
        cls = FallbackGPT
    else:
        cls = learner.model_class(lab, cfg.model_class)
        learner.check_model(cls)
    model = cls(vocab_size=vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer, n_head=cfg.n_head,
                n_embd=cfg.n_embd, dropout=cfg.dropout)
    if cfg.model != "fallback" and cfg.init == "gpt2":
        # Chapter 06 applies gpt2_init from outside the class, and the lab imports only the class:
        # PyTorch's default N(0, 1) embeddings, read back by the tied head, would start near 86 nats.
        model.apply(gpt2_style_init)
    return model


def first_loss_warning(loss, vocab_size, cfg, say):
    """Say so when the first loss is far above ln V, what a model that guesses uniformly scores."""
    uniform = math.log(vocab_size)
    if math.isfinite(loss) and loss <= 2 * uniform:
        return False
    how = ("initialise it as chapter 06 does (leave out --init mine)" if cfg.init == "mine"
           else "look at how your embedding and output head start")
    say(f"warning: the first loss is {loss:.1f} nats, far above ln V = {uniform:.2f} (a uniform guess): the model "
        f"starts out confident and wrong, and spends its first steps undoing that; {how}")
    return True


def embedding_params(model, vocab_size):
    """Parameters of lookup tables that do no matrix product (see flops_per_token in the notebook).

    Every nn.Embedding counts, except a token table that is also the output head's matrix
    (weight tying), recognised by identity with an nn.Linear's weight or, when the model has no
    nn.Linear with vocab_size outputs, by its vocab_size rows.
    """
    tables = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    heads = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == vocab_size]
    n = 0
    for t in tables:
        tied = any(t is h for h in heads) or (not heads and t.shape[0] == vocab_size)
        if not tied:
            n += t.numel()
    return n


def make_optimizer(model, cfg, device, notes=None, lab=None):
    """AdamW; weight decay on matrices and embeddings only (not on biases and norm gains).  With
    --optimizer mine the learner's class AdamW from ``lab`` (one parameter at a time, as
    torch.optim.AdamW does on a CPU); else torch.optim.AdamW: on a GPU the fused kernel, where PyTorch
    refuses it the ordinary one, with a line in ``notes``."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    if cfg.optimizer == "mine":
        cls = learner.optimizer_class(lab)
        return cls(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-8, weight_decay=cfg.weight_decay)
    if hardware.fused_adamw(device):       # one kernel for the whole update instead of several per tensor
        try:
            return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=True)
        except (RuntimeError, ValueError) as exc:
            if notes is not None:
                notes.append(f"fused AdamW is not available on {device.type} with this PyTorch ({str(exc).splitlines()[0]}): the ordinary AdamW")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def check_pieces(lab, cfg, rt):
    """Call the learner's functions once with the run's own numbers; explain what comes back wrong."""
    lr = lab.lr_at(0, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.max_steps)
    if not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr < 0:
        raise learner.LabError(f"lr_at(0, ...) returned {lr!r}; it should return a non-negative float")
    rows = cfg.batch_size * rt.world_size
    idx = lab.shard_indices(rows, rt.rank, rt.world_size)
    if not isinstance(idx, torch.Tensor) or idx.dtype != torch.long or idx.numel() != cfg.batch_size:
        raise learner.LabError(f"shard_indices({rows}, {rt.rank}, {rt.world_size}) should return {cfg.batch_size} "
                               f"long row indices, got {idx!r}")


# ---- checkpoints ------------------------------------------------------------------------------

def rng_state(device):
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    elif device.type == "mps":
        state["mps"] = torch.mps.get_rng_state()
    return state


def set_rng_state(state, device):
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
    elif device.type == "mps" and "mps" in state:
        torch.mps.set_rng_state(state["mps"])


def gather(obj, rt):
    if rt.world_size == 1:
        return [obj]
    out = [None] * rt.world_size
    dist.all_gather_object(out, obj)
    return out


def save_checkpoint(path, step, raw_model, opt, scaler, sampler, cfg, rt, chars):
    """Everything a resumed run needs to continue exactly: weights, optimizer moments, the schedule's
    position (step and its settings), the data sampler's state and every rank's random state."""
    rngs = gather(rng_state(rt.device), rt)
    if rt.main:
        ckpt = {"format": 1, "step": step, "model": raw_model.state_dict(), "optimizer": opt.state_dict(),
                "scaler": scaler.state_dict() if scaler else None, "sampler": sampler.state_dict(), "rng": rngs,
                "config": dataclasses.asdict(cfg), "world_size": rt.world_size, "chars": chars}
        tmp = path.with_suffix(".tmp")
        torch.save(ckpt, tmp)
        os.replace(tmp, path)           # a crash while saving leaves the previous checkpoint intact
    if rt.world_size > 1:
        dist.barrier()


def load_checkpoint(path, raw_model, opt, scaler, sampler, cfg, rt):
    if not path.exists():
        raise learner.LabError(f"--resume: no checkpoint at {path}")
    # On the CPU: random states must be CPU tensors; load_state_dict moves weights and moments to the device.
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    old = ckpt["config"]
    if cfg.max_steps == 0:
        cfg.max_steps = old["max_steps"]          # a schedule fitted to a time budget: keep it
    for key in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "max_steps", "warmup_steps", "lr", "min_lr"):
        if old[key] != getattr(cfg, key):
            raise learner.LabError(f"--resume: the checkpoint was made with {key}={old[key]}, this run has "
                                   f"{getattr(cfg, key)}; resume with the same model and schedule")
    if ckpt["world_size"] * old["batch_size"] != rt.world_size * cfg.batch_size:
        raise learner.LabError("--resume: the global batch (processes x --batch-size) differs from the checkpoint's")
    raw_model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    if scaler and ckpt["scaler"]:
        scaler.load_state_dict(ckpt["scaler"])
    sampler.load_state_dict(ckpt["sampler"])
    rngs = ckpt["rng"]
    set_rng_state(rngs[rt.rank] if len(rngs) == rt.world_size else rngs[0], rt.device)
    return ckpt["step"]


# ---- the run ----------------------------------------------------------------------------------

class Log:
    FIELDS = ["step", "lr", "train_loss", "val_loss", "grad_norm", "tokens_per_s", "mfu", "elapsed_s"]

    def __init__(self, path, resume_step):
        self.path = path
        kept = []
        if resume_step and path.exists():
            with open(path) as f:
                kept = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, self.FIELDS)
            w.writeheader()
            w.writerows(kept)

    def write(self, **row):
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self.FIELDS).writerow({k: ("" if v is None else repr(v) if isinstance(v, float) else v)
                                                     for k, v in row.items()})


def evaluate(model, corpus, val_offsets, lab, cfg, rt, autocast):
    """Mean validation loss over fixed batches; each rank scores its shard, all_reduce_mean combines."""
    model.eval()
    loss_sum = torch.zeros((), device=rt.device)
    count = torch.zeros((), device=rt.device)
    with torch.no_grad():
        for offsets in val_offsets:
            mine = offsets[lab.shard_indices(len(offsets), rt.rank, rt.world_size)]
            x, y = (t.to(rt.device) for t in labdata.rows(corpus.val, mine, cfg.block_size))
            with autocast():
                logits = model(x)
            loss_sum += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
            count += y.numel()
    model.train()
    return float(lab.all_reduce_mean(loss_sum, count))


def sample(model, corpus, cfg, rt, autocast, prompt="\n"):
    """Text from the trained model: draw each next character from softmax(logits / temperature)."""
    model.eval()
    torch.manual_seed(cfg.seed)
    idx = torch.tensor([corpus.encode(prompt)], device=rt.device)
    with torch.no_grad():
        for _ in range(cfg.sample_tokens):
            with autocast():
                logits = model(idx[:, -cfg.block_size:])[:, -1, :corpus.vocab_size].float()
            nxt = torch.distributions.Categorical(logits=logits / cfg.temperature).sample()
            idx = torch.cat([idx, nxt[:, None]], dim=1)
    model.train()
    return corpus.decode(idx[0, len(prompt):].tolist())


def _cjk_font():
    """The name of a font with Chinese glyphs (Debian: fonts-noto-cjk), or None.  Matplotlib's font cache may
    predate the fonts: the system's CJK font files are then added to it."""
    from matplotlib import font_manager

    def known():
        names = {f.name for f in font_manager.fontManager.ttflist if "CJK" in f.name}
        # simplified Chinese sans first (the course's text), then any other CJK face
        return min(names, key=lambda n: ("Sans" not in n, "SC" not in n, n), default=None)
    if known() is None:
        for path in font_manager.findSystemFonts():
            if "CJK" in os.path.basename(path):
                font_manager.fontManager.addfont(path)
    return known()


def plot_labels():
    """The run plot's labels and the font family to draw them with: in the learner's language (set_language), or
    in English where matplotlib has no font with Chinese glyphs (it would draw empty boxes)."""
    labels = ["training loss (one batch)", "validation loss", "optimizer step", "cross-entropy (nats per character)",
              "Training run"]
    cjk = _cjk_font() if language() == "zh" else None
    if cjk is None:
        return labels, None
    return [translate(label) for label in labels], [cjk, "sans-serif"]


def plot(log_path, out_path):
    # A Figure without pyplot: no window, and no change to the backend of a notebook that calls train().
    import matplotlib
    from matplotlib.figure import Figure
    with open(log_path) as f:
        rows = list(csv.DictReader(f))
    (train_label, val_label, xlabel, ylabel, title), family = plot_labels()
    with matplotlib.rc_context({"font.family": family} if family else {}):
        fig = Figure(figsize=(6, 3.5))
        ax = fig.add_subplot()
        tr = [(int(r["step"]), float(r["train_loss"])) for r in rows if r["train_loss"]]
        va = [(int(r["step"]), float(r["val_loss"])) for r in rows if r["val_loss"]]
        if tr:
            ax.plot(*zip(*tr), label=train_label, alpha=0.7)
        if va:
            ax.plot(*zip(*va), "o-", label=val_label)
        ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_path, dpi=100)


CALIBRATION_STEPS = 8


def fit_schedule(step, start, mark_time, mark_step, cfg, rt):
    """(max_steps, deadline) for a run of cfg.time_budget seconds, from the speed of the steps so far.

    The deadline leaves time for the final evaluation (eval_batches forward passes, a third of a
    training step each); max_steps is how many steps fit before it, counting the evaluations
    every eval_interval steps.  Every rank gets the same numbers.
    """
    now = time.perf_counter()
    per_step = (now - mark_time) / max(step - mark_step, 1)
    eval_s = cfg.eval_batches * per_step / (3 * cfg.grad_accum)
    deadline = start + cfg.time_budget - eval_s
    steps = step + (deadline - now) / (per_step + eval_s / cfg.eval_interval)
    agreed = torch.tensor([steps, deadline - start], device=rt.device)
    if rt.world_size > 1:
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return max(int(agreed[0]), step + 1, cfg.warmup_steps + 1), start + float(agreed[1])


def schedule_step(step, now, warm_end, deadline, max_steps, warmup_steps):
    """The step handed to lr_at when the schedule follows the clock (a time-budget run).

    After the warmup, the fraction of the time from the warmup's end to the deadline that has
    passed, scaled to the steps from warmup_steps to max_steps: the cosine reaches its floor when
    the time runs out, however the machine's speed changes on the way.
    """
    frac = min((now - warm_end) / max(deadline - warm_end, 1e-9), 1.0)
    return min(warmup_steps + int(frac * (max_steps - warmup_steps)), max_steps - 1)


def train(cfg):
    """Run training with ``cfg``; returns a summary dict (on every rank)."""
    if cfg.max_steps <= 0 and cfg.time_budget <= 0:
        raise learner.LabError("--max-steps 0 (fit the schedule to the time) needs --time-budget SECONDS")
    rt = setup(cfg)
    # In the learner's language (attncourse.set_language / ATTNCOURSE_LANGUAGE), like the errors.
    talk = rt.main and not cfg.quiet
    say = (lambda *a, **k: print(*map(translate, a), **k)) if talk else (lambda *a, **k: None)
    say.raw = print if talk else (lambda *a, **k: None)         # text that is not a message (the sample)
    try:
        lab = learner.load(cfg.code, need=learner.FUNCTIONS + (("AdamW",) if cfg.optimizer == "mine" else ()))
        check_pieces(lab, cfg, rt)
        if rt.local_rank == 0:
            labdata.prepare(cfg.data_dir or None)           # once per machine
        if rt.world_size > 1:
            dist.barrier()
        corpus = labdata.load(cfg.data_dir or None)
        vocab_size = max(cfg.vocab_size, corpus.vocab_size)
        torch.manual_seed(cfg.seed)                         # the same initial weights on every rank
        raw_model = build_model(cfg, lab, vocab_size).to(rt.device)
        return _train(cfg, rt, lab, corpus, raw_model, vocab_size, say)
    finally:
        if rt.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _train(cfg, rt, lab, corpus, raw_model, vocab_size, say):
    torch.manual_seed(cfg.seed + rt.rank)                   # dropout differs across ranks, as it should
    out = Path(cfg.out_dir)
    if rt.main:
        out.mkdir(parents=True, exist_ok=True)
    opt = make_optimizer(raw_model, cfg, rt.device, rt.notes, lab)
    scaler = torch.amp.GradScaler(rt.device.type) if rt.autocast_dtype == torch.float16 else None
    global_rows = cfg.batch_size * rt.world_size
    sampler = labdata.BatchSampler(len(corpus.train), cfg.block_size, global_rows, cfg.seed)
    val_gen = torch.Generator().manual_seed(cfg.seed + 1)
    val_offsets = [torch.randint(0, len(corpus.val) - cfg.block_size - 1, (global_rows,), generator=val_gen)
                   for _ in range(cfg.eval_batches)]
    step = 0
    if cfg.resume:
        step = load_checkpoint(out / "ckpt.pt", raw_model, opt, scaler, sampler, cfg, rt)
        say(f"resumed from {out / 'ckpt.pt'} at step {step}")

    use_compile, note = hardware.compile_choice(rt.device, cfg.compile)
    rt.notes += [note] if note else []
    model = torch.compile(raw_model) if use_compile else raw_model
    eval_model = model
    if rt.world_size > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[rt.local_rank] if rt.device.type == "cuda" else None)

    def autocast():
        if rt.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=rt.device.type, dtype=rt.autocast_dtype)

    n_params = sum(p.numel() for p in raw_model.parameters())
    n_embedding = embedding_params(raw_model, vocab_size)
    fpt = lab.flops_per_token(n_params, n_embedding, cfg.n_layer, cfg.n_embd, cfg.block_size)
    if cfg.peak_tflops or rt.device.type == "cuda" or not cfg.quiet:
        peak, peak_source = hardware.peak_flops(rt.device, cfg.peak_tflops or None, rt.autocast_dtype)
    else:
        peak, peak_source = None, "not measured"
    tokens_per_step = cfg.batch_size * cfg.block_size * cfg.grad_accum * rt.world_size
    say(f"device {rt.device}: {rt.why}")
    if rt.device.type == "cpu":
        from . import WAIT_POLICY
        say(f"idle CPU threads: OMP_WAIT_POLICY={WAIT_POLICY[0]} ({translate(WAIT_POLICY[1])})")
    for note in rt.notes:
        say(f"on {rt.device}: {note}")
    say(f"model: {type(raw_model).__name__}, {n_params / 1e6:.2f}M parameters "
        f"({n_embedding / 1e6:.3f}M in lookup tables), {fpt / 1e6:.1f} MFLOPs per token")
    say(f"device: {rt.device} x {rt.world_size} process(es), autocast {rt.autocast_dtype or 'off'}, "
        f"compile {'on' if use_compile else 'off'}; {tokens_per_step:,} tokens per optimizer step")
    if cfg.optimizer == "mine":
        say(f"optimizer: your AdamW ({type(opt).__name__} from {cfg.code}), one parameter at a time")
    say(f"peak: {peak / 1e12:.2f} TFLOP/s per device ({peak_source})" if peak else f"peak FLOP/s: {peak_source}")

    log = Log(out / "log.csv", step) if rt.main else None
    fit_steps = cfg.max_steps == 0 and cfg.time_budget > 0 and not cfg.resume
    max_steps = cfg.max_steps or 10 ** 9                  # provisional while fitting: the warmup ignores it
    last_step = min(max_steps, cfg.stop_after or max_steps)
    bar = None
    if rt.main and (cfg.progress == "on" or (cfg.progress == "auto" and sys.stderr.isatty())) and not cfg.quiet:
        from tqdm.auto import tqdm
        bar = tqdm(total=last_step, initial=step, unit="step", dynamic_ncols=True)
    params = [p for p in raw_model.parameters() if p.requires_grad]
    first_step = step
    start = mark_time = time.perf_counter()
    mark_step = step
    val_loss = tok_s = util = None
    timed_steps, timed_s = 0, 0.0       # training time without the first step, evaluations and saving
    stop = False
    deadline = warm_end = None          # a time-budget run: after the warmup the schedule follows the clock
    end_by = None                       # a time-budget run: when training stops (the final evaluation follows)
    while step < last_step and not stop:
        sched = step
        if deadline is not None and step >= cfg.warmup_steps:
            warm_end = warm_end or time.perf_counter()
            sched = schedule_step(step, time.perf_counter(), warm_end, deadline, max_steps, cfg.warmup_steps)
        lr = lab.lr_at(sched, cfg.lr, cfg.min_lr, cfg.warmup_steps, max_steps)
        for group in opt.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=rt.device)
        for micro in range(cfg.grad_accum):
            offsets = sampler.next()[lab.shard_indices(global_rows, rt.rank, rt.world_size)]
            x, y = labdata.rows(corpus.train, offsets, cfg.block_size)
            if rt.device.type == "cuda":                      # page-locked memory: the copy overlaps compute
                x, y = x.pin_memory().to(rt.device, non_blocking=True), y.pin_memory().to(rt.device, non_blocking=True)
            # DDP averages gradients across processes after every backward; skip that until the last micro-step.
            sync = micro == cfg.grad_accum - 1 or rt.world_size == 1
            with (contextlib.nullcontext() if sync else model.no_sync()):
                with autocast():
                    logits = model(x)
                    loss = lab.micro_batch_loss(logits, y, cfg.grad_accum)
                (scaler.scale(loss) if scaler else loss).backward()
            loss_sum += loss.detach().float() * cfg.grad_accum * y.numel()
        if scaler:
            scaler.unscale_(opt)
        grads = [p.grad for p in params if p.grad is not None]
        norm, clipped = lab.clip_grad_norm(grads, cfg.grad_clip)
        with torch.no_grad():
            for g, c in zip(grads, clipped):
                g.copy_(c)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if bar:
            bar.update(1)
        if step == 1 and rt.main:
            first_loss_warning(float(loss_sum) / (tokens_per_step // rt.world_size), vocab_size, cfg, say)
        if step == first_step + 1:                          # the first step warms up (compilation, caches):
            mark_time, mark_step = time.perf_counter(), step   # leave it out of the throughput
        if cfg.time_budget and not cfg.resume and step == first_step + CALIBRATION_STEPS:
            # Every time-budget run stops training early enough for its final evaluation to end on time.
            fitted, end_by = fit_schedule(step, start, mark_time, mark_step, cfg, rt)
        if fit_steps and step == first_step + CALIBRATION_STEPS:
            max_steps, deadline = fitted, end_by
            if cfg.warmup_fraction > 0:      # the same share of any budget, not a fixed count of steps
                cfg.warmup_steps = max(1, min(cfg.warmup_steps, round(cfg.warmup_fraction * max_steps)))
            last_step = 10 ** 9 if not cfg.stop_after else cfg.stop_after    # the clock decides when to stop
            cfg.max_steps = max_steps                      # checkpoints record the schedule's length
            say(f"time budget {cfg.time_budget:.0f} s: after the warmup ({cfg.warmup_steps} steps) the learning rate "
                f"follows the clock and reaches min_lr as the time runs out (max_steps = {max_steps}, predicted from "
                f"the first steps)")
            if bar:
                bar.total = max_steps

        if cfg.time_budget:
            limit = (end_by - start) if end_by is not None else cfg.time_budget
            flag = torch.tensor(float(time.perf_counter() - start >= limit), device=rt.device)
            if rt.world_size > 1:
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)   # every rank stops at the same step
            stop = bool(flag)
        final = step == last_step or stop
        evaluate_now = step % cfg.eval_interval == 0 or final
        if step % cfg.log_interval == 0 or evaluate_now:
            count = torch.tensor(float(tokens_per_step // rt.world_size), device=rt.device)
            train_loss = float(lab.all_reduce_mean(loss_sum, count))
            now = time.perf_counter()
            if step > mark_step:
                tok_s = (step - mark_step) * tokens_per_step / (now - mark_time)
                util = lab.mfu(fpt, tok_s, peak, rt.world_size) if peak else None
                timed_steps, timed_s = timed_steps + step - mark_step, timed_s + now - mark_time
            val_loss = evaluate(eval_model, corpus, val_offsets, lab, cfg, rt, autocast) if evaluate_now else None
            if rt.main:
                log.write(step=step, lr=lr, train_loss=train_loss, val_loss=val_loss, grad_norm=float(norm),
                          tokens_per_s=tok_s, mfu=util, elapsed_s=now - start)
                # each part a message of its own, so that the line reads in the learner's language
                parts = [translate(f"train loss {train_loss:.3f}")] + \
                    ([translate(f"val loss {val_loss:.3f}")] if val_loss is not None else []) + \
                    ([translate(f"{tok_s:,.0f} tokens per second")] if tok_s else []) + \
                    ([f"MFU {util:.1%}"] if util else [])
                text = ("，" if language() == "zh" else ", ").join(parts)
                if bar:
                    bar.set_postfix_str(text)
                elif step % (cfg.print_interval or cfg.log_interval) == 0 or final:
                    if deadline is not None:
                        where = translate(f"step {step:>5} ({now - start:2.0f} of {cfg.time_budget:.0f} s)")
                    else:
                        where = translate(f"step {step:>5} of {min(last_step, max_steps)}")
                    say(f"{where}  lr {lr:.2e}  {text}", flush=True)
            if evaluate_now and not final:
                save_checkpoint(out / "ckpt.pt", step, raw_model, opt, scaler, sampler, cfg, rt, corpus.chars)
            mark_time, mark_step = time.perf_counter(), step   # evaluation and saving are not training time
    if bar:
        bar.close()
    elapsed = time.perf_counter() - start
    save_checkpoint(out / "ckpt.pt", step, raw_model, opt, scaler, sampler, cfg, rt, corpus.chars)
    mean_tok_s = timed_steps * tokens_per_step / timed_s if timed_s else None
    summary = {"steps": step, "elapsed_s": elapsed, "val_loss": val_loss, "tokens_per_s": tok_s,
               "mean_tokens_per_s": mean_tok_s, "mfu": util,
               "n_params": n_params, "flops_per_token": fpt, "tokens_per_step": tokens_per_step,
               "world_size": rt.world_size, "device": str(rt.device), "warmup_steps": cfg.warmup_steps}
    if rt.main:
        plot(out / "log.csv", out / "loss.png")
        if cfg.sample_tokens:
            summary["sample"] = sample(raw_model, corpus, cfg, rt, autocast)
            say.raw("---- sample ----\n" + summary["sample"] + "\n----------------")
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        say(f"done: {step} steps in {elapsed:.1f} s ({mean_tok_s or 0:,.0f} tokens/s on average), "
            f"validation loss {val_loss:.4f}; "
            f"log {out / 'log.csv'}, plot {out / 'loss.png'}, checkpoint {out / 'ckpt.pt'}")
    return summary


# ---- command line --------------------------------------------------------------------------------

CHOICES = {"optimizer": ["torch", "mine"], "model": ["mine", "fallback"], "init": ["gpt2", "mine"], "device": list(hardware.DEVICES), "compile": ["auto", "on", "off"],
           "dtype": ["auto", "float32", "bfloat16", "float16"], "progress": ["auto", "on", "off"]}
HELP = {
    "code": "your module (written by the notebook's export cell)",
    "model": "mine: the class --model-class of --code; fallback: attncourse.lab.FallbackGPT",
    "init": "gpt2: chapter 06's initialisation applied to your model (N(0, 0.02) weights, zero biases); mine: your class's own",
    "model_class": "the name of your model class in --code",
    "optimizer": "torch: torch.optim.AdamW (fused on a GPU); mine: your class AdamW from --code",
    "vocab_size": "0: the corpus's characters; larger pads the table (GPT-2: 50304)",
    "batch_size": "rows per process per micro-step",
    "grad_accum": "micro-steps per optimizer step, per process",
    "warmup_fraction": "with --max-steps 0: the warmup's share of the steps that fit (at most --warmup-steps); 0: --warmup-steps",
    "max_steps": "optimizer steps; 0 with --time-budget: as many as fit, the schedule following the clock",
    "time_budget": "seconds of training; 0: no limit",
    "stop_after": "stop (and checkpoint) after this many steps, the schedule still aiming at --max-steps",
    "resume": "continue exactly from OUT/ckpt.pt",
    "log_interval": "steps between rows of OUT/log.csv",
    "print_interval": "steps between printed lines when there is no progress bar; 0: --log-interval",
    "eval_interval": "steps between validation losses (and checkpoints)",
    "device": "auto: a CUDA GPU, else Apple's GPU (MPS), else the CPU",
    "dtype": "auto: bfloat16 autocast on a GPU that has it, float16 on a CUDA GPU that has not, float32 on a CPU",
    "compile": "torch.compile; auto: on for CUDA (never on Apple's GPU)",
    "threads": "CPU threads for this process; 0: PyTorch's default",
    "peak_tflops": "one device's peak for MFU; 0: the table (GPU) or a measurement (CPU)",
    "sample_tokens": "characters to sample at the end",
    "quiet": "print nothing (the log, the plot and the checkpoint are still written)",
}

def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m attncourse.lab.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), help="a named configuration; other flags override it")
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        text = HELP.get(f.name, "") + f" (default {f.default!r})"
        if isinstance(f.default, bool):
            p.add_argument(flag, action="store_true", default=None, help=HELP.get(f.name))
        else:
            p.add_argument(flag, type=type(f.default), default=None, choices=CHOICES.get(f.name), help=text)
    args = vars(p.parse_args(argv))
    values = dict(PRESETS.get(args.pop("preset") or "", {}))
    values.update({k: v for k, v in args.items() if v is not None})
    return Config(**values)


def main(argv=None):
    cfg = parse(argv)
    try:
        train(cfg)
    except learner.LabError as exc:
        print(translate(f"error: {exc}"), file=sys.stderr)
        return 2
    except TypeError as exc:
        if "MPS" not in str(exc) or "float64" not in str(exc):
            raise
        print(translate(f"error: Apple's GPU (MPS) has no float64 ({str(exc).splitlines()[0]}): keep your code in float32, or train on the CPU with --device cpu"), file=sys.stderr)
        return 2
    except NotImplementedError as exc:
        if "MPS" in str(exc):               # an operator Apple's GPU lacks, not an unfinished exercise
            print(translate(f"error: {str(exc).splitlines()[0]} (run with PYTORCH_ENABLE_MPS_FALLBACK=1 set before Python starts, or --device cpu)"), file=sys.stderr)
            return 2
        tb = exc.__traceback__
        while tb.tb_next:
            tb = tb.tb_next
        print(translate(f"error: {tb.tb_frame.f_code.co_name} in {cfg.code} is not implemented yet: finish that "
                        "exercise in the notebook and run the export cell again"), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
