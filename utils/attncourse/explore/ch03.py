"""Chapter 03's explorers (see attncourse.explore)."""
import numpy as np

from . import Explorer, _go, _heatmap, _layout, _menu, _r, _slider

__all__ = ["heads", "online_softmax", "sliding_window", "ROLES"]

# What each head of §3.4 was written to do, in the order of the notebook's `heads`.
ROLES = ("coreference: pronouns and states look for animate nouns", "verbs look for nouns",
         "nouns look for verbs", "function words look at each other")


def heads(tokens, weights):
    """What different heads look at (§3.4): the attention weights of each head of one layer over the
    same sentence, and their mean.  ``weights`` [H, N, N]: one sentence's per-head weights (your
    MultiHeadAttention's, in a notebook)."""
    go = _go()
    w = np.asarray(weights.detach().cpu().double().numpy() if hasattr(weights, "detach") else weights, dtype=float)
    if w.ndim != 3 or w.shape[1:] != (len(tokens), len(tokens)):
        raise ValueError(f"heads expects weights [H, N, N] with N = {len(tokens)} tokens, got shape {list(w.shape)}")
    n_heads = w.shape[0]
    states = [(f"head {h}: {ROLES[h]}" if h < len(ROLES) else f"head {h}", _r(w[h])) for h in range(n_heads)]
    states.append((f"mean of the {n_heads} heads (nn.MultiheadAttention's default)", _r(w.mean(0))))
    top = [max(0.05, float(np.ceil(np.max(z) * 20) / 20)) for _, z in states]   # each map's own colour scale
    heat = _heatmap(states[0][1], x=list(tokens), y=list(tokens), zmax=top[0])
    buttons = [(label, "restyle", [{"z": [z], "zmax": [t]}]) for (label, z), t in zip(states, top)]
    menu = _menu(buttons, y=1.1)
    menu["name"] = "attention head"
    fig = go.Figure([heat], _layout("Each head's attention weights over the same sentence", "key (attended to)",
                                    "query (attending)", height=540, updatemenus=[menu],
                                    margin=dict(l=70, r=20, t=120, b=60),
                                    yaxis=dict(autorange="reversed", title=dict(text="query (attending)"))))
    return Explorer("heads", fig,
                    alt="Heat map of one attention head's weights over one sentence, queries as rows and keys as "
                        "columns; a menu picks the head or the mean of all heads.",
                    hint="Switch heads: each one draws a different map of the same sentence, because each has its "
                         "own query and key projections. Then pick the mean: the relations blur into one another, "
                         "which is why the heads are kept apart until the output projection mixes their outputs.")


def online_softmax(scores, block_size, partial, full):
    """Tiled attention for one query, one block of keys at a time (§3.6).

    ``scores`` [N]: the query's scaled scores q·k_j / sqrt(d) over N keys; ``partial`` [n_blocks, d_v]: the
    output after each block, i.e. attention over the keys seen so far (your tiled_attention on the first
    blocks of keys, in a notebook); ``full`` [d_v]: the output of full attention over all keys.
    The running maximum m and running sum l are shown as they stand after each block, from their
    definitions: m = the largest score seen, l = the sum of e^(s_j - m) over the keys seen."""
    go = _go()
    s = np.asarray(scores.detach().cpu().double().numpy() if hasattr(scores, "detach") else scores, dtype=float)
    s = s.reshape(-1)
    n = len(s)
    ends = list(range(block_size, n, block_size)) + [n]
    partial = np.asarray(partial.detach().cpu().double().numpy() if hasattr(partial, "detach") else partial,
                         dtype=float).reshape(len(ends), -1)
    full = np.asarray(full.detach().cpu().double().numpy() if hasattr(full, "detach") else full, dtype=float).reshape(-1)
    keys = list(range(n))
    features = list(range(full.shape[0]))
    final_terms = np.exp(s - s.max())
    seen_color, unseen_color = "#1f77b4", "#d9d9d9"
    states, m_old = [], None
    for t, end in enumerate(ends):
        m = s[:end].max()
        terms = np.where(np.arange(n) < end, np.exp(s - m), 0.0)
        rescale = 0.0 if m_old is None else float(np.exp(m_old - m))
        states.append(dict(end=end, m=float(m), l=float(terms.sum()), rescale=rescale, terms=_r(terms),
                           colors=[seen_color if j < end else unseen_color for j in keys], out=_r(partial[t])))
        m_old = m
    lo, hi = float(s.min()), float(s.max())
    pad = 0.1 * (hi - lo)
    first = states[0]
    shown = _r(s)
    traces = [
        go.Bar(x=keys, y=shown, marker_color=first["colors"], name="score s_j (grey: not read yet)",
               xaxis="x", yaxis="y", hovertemplate="key %{x}<br>score %{y:.3f}<extra></extra>"),
        go.Scatter(x=[-0.5, n - 0.5], y=[round(first["m"], 4)] * 2, mode="lines", name="running max m",
                   xaxis="x", yaxis="y", line=dict(color="#d62728", width=2),
                   hovertemplate="running max m = %{y:.3f}<extra></extra>"),
        go.Bar(x=keys, y=first["terms"], name="e^(s_j - m) so far", xaxis="x2", yaxis="y2",
               marker_color="#1f77b4", hovertemplate="key %{x}<br>e^(s_j - m) = %{y:.4f}<extra></extra>"),
        go.Scatter(x=keys, y=_r(final_terms), mode="markers", name="e^(s_j - m) after the last block",
                   xaxis="x2", yaxis="y2", marker=dict(color="#d62728", symbol="line-ew-open", size=12, line=dict(width=2)),
                   hovertemplate="key %{x}<br>after the last block %{y:.4f}<extra></extra>"),
        go.Bar(x=features, y=first["out"], name="output so far: acc / ℓ", xaxis="x3", yaxis="y3",
               marker_color="#1f77b4", hovertemplate="feature %{x}<br>so far %{y:.4f}<extra></extra>"),
        go.Scatter(x=features, y=_r(full), mode="markers", name="full attention's output", xaxis="x3", yaxis="y3",
                   marker=dict(color="#d62728", symbol="line-ew-open", size=12, line=dict(width=2)),
                   hovertemplate="feature %{x}<br>full attention %{y:.4f}<extra></extra>"),
    ]

    def title(st, t):
        return (f"Block {t} of {len(ends)}: running max {st['m']:.3f}, running sum ℓ = {st['l']:.3f}, "
                f"rescaling factor e^(m − m') = {st['rescale']:.3f}")

    steps = [(f"{t + 1}", "update",          # traces 0-2 and 4; the score bars' colours mark the keys read
              [{"marker.color": [st["colors"], "#d62728", "#1f77b4", "#1f77b4"],
                "y": [shown, [round(st["m"], 4)] * 2, st["terms"], st["out"]]},
               {"title.text": title(st, t + 1)}, [0, 1, 2, 4]])
             for t, st in enumerate(states)]
    slider = _slider(steps, "key blocks read: ")
    slider["pad"] = dict(t=60)
    layout = _layout(title(first, 1), height=560, sliders=[slider],
                     legend=dict(orientation="h", x=0, y=-0.45, yanchor="top"), margin=dict(l=60, r=20, t=70, b=180))
    layout.update(xaxis=dict(domain=[0, 0.3], title=dict(text="key j, in reading order")),
                  yaxis=dict(range=[lo - pad, hi + pad], title=dict(text="score of key j")),
                  xaxis2=dict(domain=[0.36, 0.66], title=dict(text="key j, in reading order")),
                  yaxis2=dict(anchor="x2", range=[0, 1.05], title=dict(text="e^(s_j - m)")),
                  xaxis3=dict(domain=[0.73, 1], title=dict(text="output feature")),
                  yaxis3=dict(anchor="x3", title=dict(text="output value")))
    fig = go.Figure(traces, layout)
    return Explorer("online_softmax", fig,
                    alt="Three panels for one query as tiled attention reads the keys block by block: its scores "
                        "with the running maximum, the terms e^(s_j - m) of the running sum, and the output so far "
                        "beside full attention's.",
                    hint="Step through the blocks. When a block holds a score above the running maximum, every "
                         "earlier term shrinks by the same factor e^(m − m'): that is the rescaling of ℓ and acc. "
                         "After the last block the terms and the output equal full attention's exactly.")


def sliding_window(n, masks, causal_masks):
    """Local attention (§3.7): which scores a sliding window of each width keeps, alone and with a causal
    mask.  ``masks`` {window w: bool [n, n]} (your sliding_window_mask, in a notebook), ``causal_masks``
    {w: bool [n, n]}: the same windows & a causal mask."""
    go = _go()
    windows = list(masks)
    z = {w: (_r(np.asarray(masks[w], dtype=float)), _r(np.asarray(causal_masks[w], dtype=float))) for w in windows}
    counts = {w: (int(np.asarray(masks[w]).sum()), int(np.asarray(causal_masks[w]).sum())) for w in windows}
    pos = list(range(n))
    colors = [[0, "#f0f0f0"], [1, "#2171b5"]]
    hover = "query %{y}<br>key %{x}<br>may attend: %{z}<extra></extra>"
    traces = [go.Heatmap(z=z[windows[0]][0], x=pos, y=pos, zmin=0, zmax=1, colorscale=colors, showscale=False,
                         xgap=1, ygap=1, xaxis="x", yaxis="y", hovertemplate=hover),
              go.Heatmap(z=z[windows[0]][1], x=pos, y=pos, zmin=0, zmax=1, colorscale=colors, showscale=False,
                         xgap=1, ygap=1, xaxis="x2", yaxis="y2", hovertemplate=hover)]

    def title(w):
        both, causal = counts[w]
        return (f"Window w = {w}: {both} of {n * n} scores both sides, {causal} with a causal mask")

    steps = [(f"{w}", "update", [{"z": [z[w][0], z[w][1]]}, {"title.text": title(w)}]) for w in windows]
    slider = _slider(steps, "window size w = ")
    slider["pad"] = dict(t=60)
    layout = _layout(title(windows[0]), height=500, sliders=[slider], margin=dict(l=60, r=20, t=70, b=120))
    layout.update(xaxis=dict(domain=[0, 0.45], title=dict(text="key j (both sides)")),
                  yaxis=dict(autorange="reversed", title=dict(text="query i (attending)")),
                  xaxis2=dict(domain=[0.55, 1], title=dict(text="key j (causal)")),
                  yaxis2=dict(anchor="x2", autorange="reversed", title=dict(text="query i (attending)")))
    fig = go.Figure(traces, layout)
    return Explorer("sliding_window", fig,
                    alt="Two grids of queries by keys, blue where a sliding window lets the query attend: on both "
                        "sides, and with a causal mask.",
                    hint="Widen the window: each row gains up to 2 keys per step, so the count grows like N(2w + 1), "
                         "linear in N, until the window covers the whole sequence and the mask is full attention's.")
