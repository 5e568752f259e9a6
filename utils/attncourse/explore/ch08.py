"""Chapter 08's explorers (see attncourse.explore)."""
import numpy as np

from . import Explorer, _go, _heatmap, _layout, _r, _slider, _t

__all__ = ["BALANCING", "capacity", "expert_load"]

# The three ways of 8.11 to keep the experts busy, keyed as the notebook's `balancing` dict.
BALANCING = {"neither": "no load balancing", "load-balancing loss": "load-balancing loss",
             "bias update": "bias update (DeepSeek-V3)"}
_COLOURS = {"neither": "#d62728", "load-balancing loss": "#1f77b4", "bias update": "#2ca02c"}


def _shown(char):
    """A character as a tick label: a space and a line break made visible."""
    return {" ": "␣", "\n": "↵", "\t": "⇥"}.get(char, char)


def _ax(n):
    """Plotly's name suffix of the n-th pair of axes: "", "2", "3", ..."""
    return "" if n == 1 else str(n)


def _np(x):
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x)


def capacity(tokens, n_experts, factors, capacities, routes, layer=0):
    """What a capacity limit would drop in each trained MoE: for one passage, which experts each character
    goes to (the gate in colour), and which of those assignments fall over the capacity.

    ``tokens``: the passage's T characters; ``n_experts``: E.  ``factors`` and ``capacities``: the capacity
    factors of the slider and the capacity ceil(c * T * k / E) of each.  ``routes`` {key of BALANCING: (gates [T, k],
    experts [T, k], kept [len(factors), T, k])}: one MoE layer's routing of the passage (the experts and
    gates your router chose) and, for every factor, your ``capacity_mask`` (True: the assignment fits)."""
    go = _go()
    labels = [_shown(c) for c in tokens]
    n_tok = len(labels)
    keys = [k for k in BALANCING if k in routes]
    gates = {k: _np(routes[k][0]) for k in keys}
    experts = {k: _np(routes[k][1]).astype(int) for k in keys}
    kept = {k: _np(routes[k][2]).astype(bool) for k in keys}
    n_exp = int(n_experts)
    traces, restyled, layout = [], [], {}
    rows = len(keys)
    gap = 0.07
    height = (1 - gap * (rows - 1)) / rows
    for r, key in enumerate(keys):
        top = round(1 - r * (height + gap), 6)
        bottom = max(0.0, round(top - height, 6))
        hx, hy, bx, by = ("x" + _ax(2 * r + 1), "y" + _ax(2 * r + 1), f"x{2 * r + 2}", f"y{2 * r + 2}")
        z = [[None] * n_tok for _ in range(n_exp)]
        g = _r(gates[key])
        for t in range(n_tok):
            for s, e in enumerate(experts[key][t]):
                z[e][t] = g[t][s]
        routed = np.bincount(experts[key].reshape(-1), minlength=n_exp)
        heat = _heatmap(z, x=list(range(n_tok)), y=list(range(n_exp)), zmax=1, xaxis=hx, yaxis=hy,
                        customdata=[labels] * n_exp, hoverongaps=False, showscale=r == 0,
                        colorbar=dict(title=dict(text=_t("gate")), len=0.5, y=0.75),
                        hover="character %{customdata} (position %{x})<br>expert %{y}<br>gate %{z:.3f}"
                              "<extra></extra>")
        dropped = [go.Scatter(x=[], y=[], mode="markers", xaxis=hx, yaxis=hy, name="dropped assignment",
                              marker=dict(symbol="x", size=10, color="#ff3030", line=dict(width=1, color="white")),
                              showlegend=r == 0, legendgroup="dropped",
                              hovertemplate="position %{x}, expert %{y}: dropped<extra></extra>")]
        bars = [go.Bar(y=list(range(n_exp)), x=routed.tolist(), orientation="h", xaxis=bx, yaxis=by,
                       name="tokens routed", marker_color="#c7c7c7", showlegend=r == 0, legendgroup="routed",
                       hovertemplate="expert %{y}: %{x} tokens routed<extra></extra>"),
                go.Bar(y=list(range(n_exp)), x=routed.tolist(), orientation="h", xaxis=bx, yaxis=by,
                       name="tokens kept", marker_color=_COLOURS[key], showlegend=False,
                       hovertemplate="expert %{y}: %{x} tokens kept<extra></extra>"),
                go.Scatter(x=[0, 0], y=[-0.5, n_exp - 0.5], mode="lines", xaxis=bx, yaxis=by, name=_t("capacity"),
                           line=dict(color="black", dash="dash"), showlegend=r == 0, legendgroup="capacity",
                           hovertemplate="capacity %{x}<extra></extra>")]
        first = len(traces)
        traces += [heat] + dropped + bars
        restyled.append((key, first + 1, first + 3, first + 4))
        layout["xaxis" + _ax(2 * r + 1)] = dict(
            domain=[0, 0.7], anchor=hy, tickvals=list(range(n_tok)), ticktext=labels, tickangle=0,
            title=dict(text="character of the passage" if r == rows - 1 else ""))
        layout["yaxis" + _ax(2 * r + 1)] = dict(domain=[bottom, top], anchor=hx, dtick=1, range=[-0.5, n_exp - 0.5],
                                                zeroline=False, title=dict(text=_t("expert")))
        layout[f"xaxis{2 * r + 2}"] = dict(domain=[0.76, 1], anchor=by, range=[0, max(n_tok, 1) + 0.5],
                                           title=dict(text="tokens per expert" if r == rows - 1 else ""))
        layout[f"yaxis{2 * r + 2}"] = dict(domain=[bottom, top], anchor=bx, dtick=1, range=[-0.5, n_exp - 0.5],
                                           showticklabels=False)
        layout.setdefault("annotations", []).append(
            dict(text=BALANCING[key], xref="paper", yref="paper", x=0, y=top, xanchor="left", yanchor="bottom",
                 showarrow=False, font=dict(size=13)))
    steps = []
    for i, (c, cap) in enumerate(zip(factors, capacities)):
        update, idx = {"x": [], "y": []}, []
        for key, marks, kept_bar, line in restyled:
            over = ~kept[key][i]
            tok, slot = np.nonzero(over)
            update["x"].append(tok.tolist())
            update["y"].append(experts[key][tok, slot].tolist())
            idx.append(marks)
            update["x"].append(np.bincount(experts[key][kept[key][i]], minlength=n_exp).tolist())
            update["y"].append(list(range(n_exp)))
            idx.append(kept_bar)
            update["x"].append([int(cap), int(cap)])
            update["y"].append([-0.5, n_exp - 0.5])
            idx.append(line)
        steps.append((f"{c:g} (capacity {int(cap)} tokens)", "restyle", [update, idx]))
    start = min(range(len(factors)), key=lambda i: abs(factors[i] - 1.0))
    update, idx = steps[start][2]
    for j, trace in enumerate(idx):                 # the figure opens at the factor closest to 1
        traces[trace].update(x=update["x"][j], y=update["y"][j])
    slider = _slider(steps, "capacity factor c = ", start)
    slider["pad"] = dict(t=60)
    base = _layout(f"Capacity in layer {layer}: which assignments of a {n_tok}-character passage fit",
                   height=230 * rows + 210, barmode="overlay", sliders=[slider],
                   legend=dict(orientation="h", x=0, y=1.0 + 28 / (230 * rows), yanchor="bottom"),
                   margin=dict(l=60, r=20, t=110, b=60))
    base.update(layout)
    fig = go.Figure(traces, base)
    return Explorer("capacity", fig,
                    alt="For each of the trained MoE models, a grid of experts (rows) by the characters of one "
                        "passage (columns) coloured by the gate of each assignment, with the assignments over "
                        "capacity crossed out, and bars of how many tokens each expert was sent and kept.",
                    hint="Lower the capacity factor: the crosses appear first at the busiest experts, and each "
                         "expert drops the characters that come last, because tokens queue in order. Compare the "
                         "rows: the better balanced a router, the lower the factor at which it still drops nothing.")


def expert_load(steps, loads, every=5):
    """How the experts' workload evolves during training, with each way of balancing it.

    ``steps`` [S]: the training steps; ``loads`` {key of BALANCING: [S, L, E]}: at each step, the fraction
    of that step's (token, slot) assignments that went to each expert of each MoE layer.  Shown as
    multiples of an even share (1 = 1/E of the assignments): the bars at one step (every ``every``-th
    step, the slider), and the busiest expert of each layer over the whole run."""
    go = _go()
    keys = [k for k in BALANCING if k in loads]
    steps = [int(s) for s in steps]
    share = {k: _np(loads[k]).astype(float) * _np(loads[k]).shape[-1] for k in keys}     # 1 = an even share
    n_layer, n_exp = share[keys[0]].shape[1:]
    shown = sorted({0, len(steps) - 1} | {i for i, s in enumerate(steps) if s % every == 0})
    busiest = {k: share[k].max(axis=-1) for k in keys}                                  # [S, L]
    top = max(float(share[k].max()) for k in keys) * 1.05
    line_top = max(float(busiest[k].max()) for k in keys) * 1.05
    traces, bar_idx, layout = [], [], {}
    width = 1 / n_layer
    for l in range(n_layer):
        up, down = _ax(l + 1), str(n_layer + l + 1)
        dom = [l * width + 0.02, (l + 1) * width - 0.02]
        for j, k in enumerate(keys):
            bar_idx.append(len(traces))
            traces.append(go.Bar(x=list(range(n_exp)), y=_r(share[k][shown[0], l]), name=BALANCING[k],
                                 marker_color=_COLOURS[k], legendgroup=k, showlegend=l == 0,
                                 xaxis=f"x{up}", yaxis=f"y{up}",
                                 hovertemplate="expert %{x}: %{y:.2f} times an even share<extra></extra>"))
        for j, k in enumerate(keys):
            traces.append(go.Scatter(x=steps, y=_r(busiest[k][:, l]), mode="lines", name=BALANCING[k],
                                     line=dict(color=_COLOURS[k], width=1.5), legendgroup=k, showlegend=False,
                                     xaxis=f"x{down}", yaxis=f"y{down}",
                                     hovertemplate="step %{x}: busiest expert %{y:.2f} times an even share"
                                                   "<extra></extra>"))
        layout.setdefault("shapes", []).append(                  # the slider's step, on the curves below
            dict(type="line", xref=f"x{down}", yref="y" + down + " domain", x0=steps[shown[0]], x1=steps[shown[0]],
                 y0=0, y1=1, line=dict(color="gray", dash="dot")))
        traces.append(go.Scatter(x=[-0.5, n_exp - 0.5], y=[1, 1], mode="lines", showlegend=False, hoverinfo="skip",
                                 line=dict(color="gray", dash="dot"), xaxis=f"x{up}", yaxis=f"y{up}",
                                 name="even share"))
        layout[f"xaxis{up}"] = dict(domain=dom, anchor=f"y{up}", dtick=1, title=dict(text=_t("expert")))
        layout[f"yaxis{up}"] = dict(domain=[0.55, 1], anchor=f"x{up}", range=[0, top],
                                        title=dict(text="load / even share" if l == 0 else ""))
        layout[f"xaxis{down}"] = dict(domain=dom, anchor=f"y{down}", title=dict(text="training step"))
        layout[f"yaxis{down}"] = dict(domain=[0, 0.33], anchor=f"x{down}", range=[0, line_top],
                                      title=dict(text="busiest / even share" if l == 0 else ""))
        layout.setdefault("annotations", []).append(
            dict(text=f"MoE layer {l}", xref="paper", yref="paper", x=sum(dom) / 2, y=1.0, xanchor="center",
                 yanchor="bottom", showarrow=False))
    slider_steps = []
    for i in shown:
        bars = {"y": [_r(share[k][i, l]) for l in range(n_layer) for k in keys]}
        lines = {f"shapes[{l}].{end}": steps[i] for l in range(n_layer) for end in ("x0", "x1")}
        slider_steps.append((f"{steps[i]}", "update", [bars, lines, bar_idx]))
    slider = _slider(slider_steps, "training step: ")
    slider["pad"] = dict(t=70)
    layout.update(dict(title=dict(text="The experts' load during training, three ways of balancing"), height=600,
                       margin=dict(l=60, r=20, t=110, b=60), barmode="group",
                       legend=dict(orientation="h", x=0, y=1.07, yanchor="bottom"), sliders=[slider]))
    fig = go.Figure(traces, layout)
    return Explorer("expert_load", fig,
                    alt="Top: for each MoE layer, bars of each expert's share of one training step's assignments, "
                        "as a multiple of an even share, for the three ways of balancing. Bottom: the busiest "
                        "expert's share in each layer over the whole run.",
                    hint="Slide through training and compare how far each colour's bars stray from the dotted "
                         "line of an even share; the lower curves follow each layer's busiest expert over the whole "
                         "run. Without balancing nothing pulls an overloaded expert back; the loss does it through "
                         "the gradient, the bias update step by step without any term in the loss.")
