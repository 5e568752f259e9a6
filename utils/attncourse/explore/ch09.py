"""Chapter 09's explorers (see attncourse.explore)."""
import numpy as np

from . import Explorer, _go, _layout, _menu, _r, _slider

__all__ = ["LR_SCHEDULES", "lr_schedule", "MEMORY_SETUPS", "memory", "LAB_RUNS", "lab_runs"]

# 9.2's schedule, then one setting changed at a time: (label, the arguments of lr_at).
_SECTION = dict(max_lr=6e-4, min_lr=6e-5, warmup_steps=100, max_steps=1000)
LR_SCHEDULES = {
    "section": ("this section's: warmup 100, cosine to step 1000, floor 6e-5", _SECTION),
    "no_warmup": ("no warmup (warmup_steps = 0)", dict(_SECTION, warmup_steps=0)),
    "warmup_1": ("one warmup step (warmup_steps = 1)", dict(_SECTION, warmup_steps=1)),
    "long_warmup": ("long warmup (warmup_steps = 400)", dict(_SECTION, warmup_steps=400)),
    "short_decay": ("earlier end of the decay (max_steps = 600)", dict(_SECTION, max_steps=600)),
    "long_decay": ("decay longer than the run (max_steps = 3000)", dict(_SECTION, max_steps=3000)),
    "floor_0": ("floor at zero (min_lr = 0)", dict(_SECTION, min_lr=0.0)),
    "no_decay": ("no decay (min_lr = max_lr)", dict(_SECTION, min_lr=6e-4)),
}
LR_DIGITS = 9        # learning rates are small numbers: 9 decimals keep 6e-7 to three significant digits


def _grid(n, dense=25, every=5):
    """The steps drawn: every step at the start (the warmup's first steps), then every ``every``-th."""
    return sorted(set(range(min(dense, n))) | set(range(0, n, every)) | {n - 1})


def lr_schedule(steps, schedules):
    """9.2's learning-rate schedule with one setting changed at a time (a drop-down over LR_SCHEDULES).

    ``steps``: the optimizer steps 0 .. S-1; ``schedules`` {key of LR_SCHEDULES: [S] learning rates}, your
    ``lr_at`` at every step with that entry's arguments."""
    go = _go()
    steps = [int(s) for s in steps]
    keys = [k for k in LR_SCHEDULES if k in schedules]
    lrs = {k: np.asarray(schedules[k], dtype=float) for k in keys}
    grid = _grid(len(steps))
    x = [steps[i] for i in grid]

    def ends(k):
        """The end of the warmup and the end of the decay, where they fall inside the steps drawn."""
        args = LR_SCHEDULES[k][1]
        at = [s for s in (args["warmup_steps"], args["max_steps"]) if s in steps]
        return at, _r([lrs[k][steps.index(s)] for s in at], LR_DIGITS)

    hover = "step %{x}<br>learning rate %{y:.3e}<extra></extra>"
    first = keys[0]
    traces = [go.Scatter(x=x, y=_r(lrs["section" if "section" in lrs else first][grid], LR_DIGITS), mode="lines",
                         name="this section's schedule", line=dict(color="#b0b0b0", dash="dash", width=2),
                         hovertemplate=hover),
              go.Scatter(x=x, y=_r(lrs[first][grid], LR_DIGITS), mode="lines", name="chosen schedule",
                         line=dict(color="#d62728", width=2.5), hovertemplate=hover),
              go.Scatter(x=ends(first)[0], y=ends(first)[1], mode="markers", name="end of the warmup and of the decay",
                         marker=dict(size=10, color="#d62728", symbol="circle-open", line=dict(width=2)),
                         hovertemplate=hover)]
    buttons = []
    for k in keys:
        at, lr = ends(k)
        update = {"y": [_r(lrs[k][grid], LR_DIGITS), lr], "x": [x, at]}
        buttons.append((LR_SCHEDULES[k][0], "restyle", [update, [1, 2]]))
    top = max(float(v.max()) for v in lrs.values())
    layout = _layout("Warmup, cosine decay, floor: one setting at a time", "optimizer step", "learning rate",
                     height=460, updatemenus=[_menu(buttons, y=1.2)], margin=dict(l=70, r=20, t=120, b=60),
                     legend=dict(orientation="h", x=0, y=-0.18, yanchor="top"),
                     yaxis=dict(range=[0, top * 1.08], exponentformat="e", title=dict(text="learning rate")))
    fig = go.Figure(traces, layout)
    return Explorer("lr_schedule", fig,
                    alt="Line chart of the learning rate at every optimizer step for the chosen schedule, over "
                        "the dashed schedule of this section.",
                    hint="Pick a change: without warmup the first step already takes the full rate; a longer "
                         "warmup leaves less room for the decay; a shorter max_steps reaches the floor early and "
                         "stays there; a max_steps beyond the run stops while the rate is still high. Hover over "
                         "step 0 to see what the s + 1 in the formula gives.")


# 9.5's memory accounting: the four ways of running a step, as (label, arguments of training_memory).
MEMORY_SETUPS = {
    "fp32": ("all float32", dict(mixed_precision=False, checkpointing=False)),
    "mixed": ("mixed precision", dict(mixed_precision=True, checkpointing=False)),
    "fp32_ckpt": ("all float32,<br>checkpointing", dict(mixed_precision=False, checkpointing=True)),
    "mixed_ckpt": ("mixed precision,<br>checkpointing", dict(mixed_precision=True, checkpointing=True)),
}
_PARTS = {"weights": ("the weights", "#1f77b4"), "grads": ("their gradients", "#aec7e8"),
          "optimizer": ("AdamW's two moments", "#ff7f0e"), "master": ("float32 master copy", "#ffbb78"),
          "activations": ("stored activations", "#2ca02c")}
GIB = 2 ** 30
GPU_BYTES = 80e9     # an 80 GB GPU (A100, H100)


def memory(shapes, seq_lens, results):
    """What a training step holds, part by part, by 9.5's accounting, as the context grows.

    ``shapes``: the models, each a dict with n_params, n_layer, n_embd and n_head; ``seq_lens``: the
    contexts of the slider; ``results[m][key][i]``: your ``training_memory`` (a dict of bytes) for model
    ``m`` with the arguments of ``MEMORY_SETUPS[key]`` at context ``seq_lens[i]`` (one sequence)."""
    go = _go()
    keys = [k for k in MEMORY_SETUPS if k in results[0]]
    n_models = len(shapes)
    traces, idx, layout, annotations, totals = [], [], {}, [], {}
    gib = [{k: [{p: r[p] / GIB for p in list(_PARTS) + ["total"]} for r in res[k]] for k in keys} for res in results]
    start = min(range(len(seq_lens)), key=lambda i: abs(seq_lens[i] - 1024))
    for m, shape in enumerate(shapes):
        ax = "" if m == 0 else str(m + 1)
        dom = [m / n_models + 0.04, (m + 1) / n_models - 0.04]
        for p, (name, colour) in _PARTS.items():
            idx.append(len(traces))
            traces.append(go.Bar(x=list(range(len(keys))), y=_r([gib[m][k][start][p] for k in keys]), name=name,
                                 marker_color=colour, legendgroup=p, showlegend=m == 0, xaxis=f"x{ax}", yaxis=f"y{ax}",
                                 hovertemplate=f"{name}: %{{y:.2f}} GiB<extra></extra>"))
        for i, k in enumerate(keys):      # each stack's total above it, moved by the slider
            total = _r(gib[m][k][start]["total"])
            totals[m, k] = len(annotations)
            annotations.append(dict(text=f"{total:.1f}", xref=f"x{ax}", yref=f"y{ax}", x=i, y=total,
                                    yanchor="bottom", showarrow=False, font=dict(size=11)))
        if max(gib[m][k][i]["total"] for k in keys for i in range(len(seq_lens))) * GIB > GPU_BYTES:
            # one GPU's memory, where this model's step can exceed it: a line across the panel, labelled
            layout.setdefault("shapes", []).append(
                dict(type="line", xref="x" + ax + " domain", yref=f"y{ax}", x0=0, x1=1, y0=GPU_BYTES / GIB,
                     y1=GPU_BYTES / GIB, line=dict(color="black", dash="dash")))
            annotations.append(dict(text="one 80 GB GPU", xref="x" + ax + " domain", yref=f"y{ax}", x=1,
                                    y=GPU_BYTES / GIB, xanchor="right", yanchor="bottom", showarrow=False,
                                    font=dict(size=11), bgcolor="rgba(255, 255, 255, 0.8)"))
        n = shape["n_params"]
        size = f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
        annotations.append(dict(text=f"{size} parameters, {shape['n_layer']} layers of width {shape['n_embd']}",
                                xref="paper", yref="paper", x=sum(dom) / 2, y=1.0, xanchor="center",
                                yanchor="bottom", showarrow=False))
        for i, k in enumerate(keys):      # the setups' names under the bars (annotations are translated)
            annotations.append(dict(text=MEMORY_SETUPS[k][0], xref=f"x{ax}", yref="paper", x=i, y=-0.03,
                                    yanchor="top", showarrow=False, font=dict(size=11)))
        layout[f"xaxis{ax}"] = dict(domain=dom, anchor=f"y{ax}", showticklabels=False, range=[-0.5, len(keys) - 0.5])
        layout[f"yaxis{ax}"] = dict(anchor=f"x{ax}", rangemode="tozero",
                                    title=dict(text="GiB held during a step" if m == 0 else ""))
    steps = []
    for i, s in enumerate(seq_lens):
        bars = {"y": [_r([gib[m][k][i][p] for k in keys]) for m in range(n_models) for p in _PARTS]}
        labels = {}
        for (m, k), a in totals.items():
            total = _r(gib[m][k][i]["total"])
            labels.update({f"annotations[{a}].text": f"{total:.1f}", f"annotations[{a}].y": total})
        steps.append((f"{s:,}", "update", [bars, labels, idx]))
    slider = _slider(steps, "context (tokens of one sequence): ", start)
    slider["pad"] = dict(t=70)
    layout.update(title=dict(text="Memory of one training step with AdamW, one sequence"), height=520,
                  barmode="stack", margin=dict(l=70, r=20, t=110, b=60), annotations=annotations,
                  legend=dict(orientation="h", x=0, y=1.08, yanchor="bottom"), sliders=[slider])
    fig = go.Figure(traces, layout)
    return Explorer("memory", fig,
                    alt="Stacked bars of the memory a training step holds (weights, gradients, AdamW's moments, "
                        "master copy, activations) for each model in float32 and mixed precision, with and "
                        "without activation checkpointing, at one context length.",
                    hint="Lengthen the context: the model state stays put while the activations grow, faster "
                         "than the context because of the attention weights, and checkpointing keeps only a small "
                         "part of them. "
                         "Mixed precision halves the weights and gradients but adds the master copy, so the model "
                         "state is 16 bytes per parameter either way.")


# The lab's runs on this page: (label, which comparison it belongs to).
LAB_GROUPS = {"cpu": "9.7: the CPU mode", "optimizer": "9.7: your AdamW against PyTorch's",
              "resume": "9.8: stopped and resumed against uninterrupted", "ddp": "9.9: two processes against one",
              "widths": "9.12: four widths, the same tokens"}
LAB_RUNS = {"cpu": ("training loss", "cpu"), "cpu_val": ("validation loss", "cpu"),
            "adamw-torch": ("PyTorch's AdamW", "optimizer"), "adamw-mine": ("your AdamW", "optimizer"),
            "once": ("uninterrupted run", "resume"), "resumed": ("stopped, then resumed", "resume"),
            "one": ("one process, the whole batch", "ddp"), "two": ("two processes, half the batch each", "ddp")}
_PAIRS = {"optimizer": ("adamw-torch", "adamw-mine"), "resume": ("once", "resumed"), "ddp": ("one", "two")}


def lab_runs(curves, widths=None):
    """The loss curves of the lab's runs, one comparison at a time (a drop-down).

    ``curves`` {key of LAB_RUNS: (steps, losses)}: what each run's log.csv recorded; ``widths``
    {n_embd: (n_params, steps, validation losses)}: the runs of 9.12."""
    go = _go()
    widths = widths or {}
    traces, groups = [], {}
    dashes = ["solid", "dot", "dash", "dashdot"]
    for key, (name, group) in LAB_RUNS.items():
        if key not in curves:
            continue
        steps, losses = curves[key]
        j = len(groups.get(group, []))
        groups.setdefault(group, []).append(len(traces))
        traces.append(go.Scatter(x=[int(s) for s in steps], y=_r(losses), name=name, mode="lines+markers",
                                 marker=dict(size=4 if j == 0 else 7, symbol="circle" if j == 0 else "x-thin-open"),
                                 line=dict(dash=dashes[j % 4], width=2.5 if j == 0 else 1.5),
                                 hovertemplate="step %{x}: loss %{y:.4f}<extra></extra>"))
    for n_embd, (n_params, steps, losses) in widths.items():
        groups.setdefault("widths", []).append(len(traces))
        traces.append(go.Scatter(x=[int(s) for s in steps], y=_r(losses), mode="lines+markers",
                                 name=f"width {n_embd}: {n_params / 1e6:.2f}M parameters",
                                 hovertemplate="step %{x}: validation loss %{y:.4f}<extra></extra>"))
    buttons = []
    for group, label in LAB_GROUPS.items():
        if group not in groups:
            continue
        if group in _PAIRS and all(k in curves for k in _PAIRS[group]):
            a, b = (np.asarray(curves[k][1], dtype=float) for k in _PAIRS[group])
            n = min(len(a), len(b))
            gap = float(np.abs(a[:n] - b[:n]).max()) if n else float("nan")
            label = f"{label} (largest difference {gap:.1e})"
        visible = [i in groups[group] for i in range(len(traces))]
        buttons.append((label, "restyle", [{"visible": visible}]))
    first = buttons[0][2][0]["visible"]
    for trace, shown in zip(traces, first):
        trace.visible = shown
    layout = _layout("The lab's runs on this page, one comparison at a time", "optimizer step",
                     "loss (nats per character)", height=460, updatemenus=[_menu(buttons, y=1.2)],
                     margin=dict(l=70, r=20, t=120, b=60), legend=dict(orientation="h", x=0, y=-0.18, yanchor="top"))
    fig = go.Figure(traces, layout)
    return Explorer("lab_runs", fig,
                    alt="Line chart of the loss against the optimizer step for the runs of one comparison of this "
                        "page's lab.",
                    hint="Pick a comparison. Where two runs should compute the same thing (your AdamW and "
                         "PyTorch's, a resumed run and an uninterrupted one, two processes and one), their curves "
                         "lie on top of each other, and the largest difference in the menu says how close. For the "
                         "widths, compare the models at each evaluation: same tokens, different sizes.")
