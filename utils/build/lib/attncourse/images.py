"""Images for chapter 07: scikit-learn's bundled photographs and digits, a small training loop for
the show-only cells, attention capture from PyTorch's built-in attention, and the figures."""
import types

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


# ---- data ---------------------------------------------------------------------------------------------
def photo(size=224, name="china.jpg"):
    """One of scikit-learn's two sample photographs ('china.jpg', 'flower.jpg'), centre-cropped to a square and
    resized: a float32 tensor [3, size, size] with values in [0, 1]."""
    from sklearn.datasets import load_sample_images
    data = load_sample_images()
    image = data.images[[f.rsplit("/", 1)[-1] for f in data.filenames].index(name)]
    x = torch.from_numpy(np.array(image)).permute(2, 0, 1).float() / 255   # [3, 427, 640]
    h, w = x.shape[1:]
    s = min(h, w)
    x = x[:, (h - s) // 2:(h - s) // 2 + s, (w - s) // 2:(w - s) // 2 + s]
    return F.interpolate(x[None], size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0].clamp(0, 1)


def digits(test_size=0.2, seed=0):
    """scikit-learn's 1,797 handwritten digits (8 x 8, grey levels 0..16), split with stratification.

    Returns a namespace with x_train, x_test (float32 [N, 1, 8, 8], standardised with the training
    set's mean and standard deviation), y_train, y_test (long [N]) and raw_test (the test images in
    [0, 1], for drawing).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16
    y = torch.tensor(d.target)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=test_size, stratify=y, random_state=seed)
    mean, std = x_train.mean(), x_train.std()
    return types.SimpleNamespace(x_train=(x_train - mean) / std, x_test=(x_test - mean) / std,
                                 y_train=y_train, y_test=y_test, raw_test=x_test)


# ---- training (show-only cells) ------------------------------------------------------------------------
def train_classifier(model, x, y, epochs, batch_size=64, lr=2e-3, weight_decay=0.05, label_smoothing=0.1, seed=0):
    """AdamW with a one-cycle learning rate, cross-entropy with label smoothing; returns the mean loss per epoch.

    The same seed gives the same batches, so two models trained with it see the same data in the same order.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = -(-len(x) // batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=epochs * steps_per_epoch, pct_start=0.1)
    g = torch.Generator().manual_seed(seed)
    model.train()
    losses = []
    for _ in range(epochs):
        order, total = torch.randperm(len(x), generator=g), 0.0
        for start in range(0, len(x), batch_size):
            idx = order[start:start + batch_size]
            loss = F.cross_entropy(model(x[idx]), y[idx], label_smoothing=label_smoothing)
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
            total += loss.item() * len(idx)
        losses.append(total / len(x))
    model.eval()
    return losses


@torch.no_grad()
def accuracy(model, x, y):
    model.eval()
    return (model(x).argmax(-1) == y).float().mean().item()


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())


def capture_attention(model, *inputs):
    """Run ``model(*inputs)`` and return the weights of every nn.MultiheadAttention inside it, in call order:
    a list of [B, heads, N_q, N_k] tensors.

    The encoder's fused inference path skips the attention modules, so the model runs with autograd on
    (same outputs); each attention module is then asked once more for its weights (need_weights=True).
    """
    found, hooks = [], []

    def hook(module, args, kwargs, output):
        q, k, v = (list(args) + [kwargs.get(n) for n in ("query", "key", "value")][len(args):])[:3]
        extra = {n: kwargs[n] for n in ("key_padding_mask", "attn_mask", "is_causal") if n in kwargs}
        _, w = module.forward(q, k, v, need_weights=True, average_attn_weights=False, **extra)
        found.append(w.detach())

    for m in model.modules():
        if isinstance(m, nn.MultiheadAttention):
            hooks.append(m.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.enable_grad():
            model(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return found


# ---- figures ---------------------------------------------------------------------------------------------
def show_image(image, ax, grid=None, title=None):
    """Draw a [3, H, W] or [1, H, W] image; ``grid=p`` draws the p x p patch boundaries."""
    img = image.detach().permute(1, 2, 0).numpy()
    ax.imshow(img.squeeze(-1) if img.shape[-1] == 1 else img, cmap="gray_r" if img.shape[-1] == 1 else None)
    if grid:
        for t in np.arange(grid, image.shape[1], grid) - 0.5:
            ax.axhline(t, color="white", lw=0.8)
        for t in np.arange(grid, image.shape[2], grid) - 0.5:
            ax.axvline(t, color="white", lw=0.8)
    ax.set(xticks=[], yticks=[], title=title or "")


def show_token_sequence(pieces, ax, title=None):
    """Draw a list of small [C, p, p] images in one row with gaps, as the sequence a Transformer reads."""
    C, p, _ = pieces[0].shape
    canvas = np.ones((p, len(pieces) * (p + 2) - 2, 3))
    for n, piece in enumerate(pieces):
        img = piece.detach().permute(1, 2, 0).numpy()
        canvas[:, n * (p + 2):n * (p + 2) + p] = img if C == 3 else 1 - img
    ax.imshow(canvas.clip(0, 1))
    ax.set(xticks=[(n * (p + 2) + p / 2) for n in range(len(pieces))], xticklabels=range(len(pieces)), yticks=[],
           title=title or "")


def draw_window_masks(mask, H, W, M, axes, title=""):
    """Draw a shifted-window mask [nW, M*M, M*M] (0 = may attend) on two axes.

    Left: the H x W token grid, windows outlined; each token is coloured by the group of tokens it
    may attend to in its window (one colour per group, counted from the window's first token).
    Right: each window's M*M x M*M mask, laid out like the windows (dark = may not attend).
    Windows are numbered row by row, so window k sits at window-row k // (W/M), window-column k % (W/M).
    """
    mask = torch.as_tensor(mask).detach().float()
    nh, nw = H // M, W // M
    if tuple(mask.shape) != (nh * nw, M * M, M * M):
        axes[0].set_title(f"{title}: shape {list(mask.shape)}, expected {[nh * nw, M * M, M * M]}")
        return
    groups = np.zeros((H, W))
    canvas = np.full((nh * (M * M + 1) - 1, nw * (M * M + 1) - 1), np.nan)
    for k in range(nh * nw):
        wy, wx = divmod(k, nw)
        allowed = (mask[k] == 0).numpy()
        first = allowed.argmax(-1)                     # the first token each token may attend to
        labels = {f: n for n, f in enumerate(sorted(set(first.tolist())))}
        for t in range(M * M):
            ty, tx = divmod(t, M)
            groups[wy * M + ty, wx * M + tx] = labels[first[t]]
        r, c = wy * (M * M + 1), wx * (M * M + 1)
        canvas[r:r + M * M, c:c + M * M] = allowed
    axes[0].imshow(groups, cmap="Set2", vmin=0, vmax=8)
    for t in np.arange(M, max(H, W), M) - 0.5:
        if t < H:
            axes[0].axhline(t, color="black", lw=2)
        if t < W:
            axes[0].axvline(t, color="black", lw=2)
    axes[0].set(xticks=[], yticks=[], title=f"{title}: token groups in each window")
    cmap = plt.get_cmap("Greys_r").with_extremes(bad="tab:red")     # red lines separate the windows
    axes[1].imshow(np.ma.masked_invalid(canvas), cmap=cmap, vmin=0, vmax=1)
    axes[1].set(xticks=[], yticks=[], title=f"{title}: mask of each window (white = may attend)")


def draw_digit_attention(images, maps, labels, predictions, grid):
    """Digits [K, 1, 8, 8] in [0, 1] above the class token's attention over their patches ([K, grid*grid])."""
    k = len(images)
    fig, axes = plt.subplots(2, k, figsize=(1.6 * k, 3.6))
    for i in range(k):
        axes[0, i].imshow(images[i, 0].numpy(), cmap="gray_r")
        axes[0, i].set(xticks=[], yticks=[], title=f"label {int(labels[i])}\npredicted {int(predictions[i])}")
        axes[1, i].imshow(images[i, 0].numpy(), cmap="gray_r")
        heat = maps[i].reshape(grid, grid).numpy()
        axes[1, i].imshow(np.kron(heat, np.ones((8 // grid, 8 // grid))), cmap="magma", alpha=0.6, vmin=0,
                          vmax=max(float(maps.max()), 1e-9))
        for (r, c), w in np.ndenumerate(heat):
            axes[1, i].text((c + 0.5) * 8 / grid - 0.5, (r + 0.5) * 8 / grid - 0.5, f"{w:.2f}", ha="center",
                            va="center", color="cyan", fontsize=8)
        axes[1, i].set(xticks=[], yticks=[])
    axes[1, 0].set_ylabel("class token's\nattention")
    fig.tight_layout()
    return fig
