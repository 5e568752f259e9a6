"""Chapter 06's explorers (see attncourse.explore)."""
import numpy as np

from . import Explorer, _go, _heatmap, _layout, _menu, _r, _slider, _t

__all__ = ["gpt_attention_weights", "gpt_attention", "sampling", "speculative", "window_with_sinks"]

_SHOWN = {" ": "␣", "\n": "⏎", "\t": "⇥"}


def _show(char):
    """A character as a label: a space, a line break or a tab made visible."""
    return _SHOWN.get(char, char)


def gpt_attention_weights(model, idx):
    """The attention weights of a GPT on one sequence: float64 [n_layer, n_head, T, T].

    ``model`` (a GPT of the chapter, in eval mode for the call) runs once on ``idx`` [1, T]; every call
    of ``F.scaled_dot_product_attention`` inside it is watched and its softmax weights recomputed from
    the same queries, keys and mask, so these are the weights *your* layers use.  Where the layers
    compute attention some other way, it says so and returns None."""
    import torch
    import torch.nn.functional as F

    found, original = [], F.scaled_dot_product_attention

    def watched(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        if kw.get("enable_gqa") and k.shape[-3] != q.shape[-3]:
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        s = (q.double() @ k.double().transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
        if is_causal:                               # query i sees keys 0 .. i
            allowed = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).tril()
            s = s.masked_fill(~allowed, float("-inf"))
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask.double()
        found.append(torch.softmax(s, dim=-1))
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw)

    was_training = model.training
    model.eval()
    F.scaled_dot_product_attention = watched
    try:
        with torch.no_grad():
            model(idx)
    finally:
        F.scaled_dot_product_attention = original
        model.train(was_training)
    if len(found) == len(model.h):
        return torch.stack([w[0] for w in found])
    # Layers that compute attention another way: their weights cannot be watched, and recomputing them here would
    # spell out the exercise's answer in the learner package.  Say so; the rest of the notebook runs on.
    from ..i18n import translate
    print(translate("The attention explorer reads the weights that F.scaled_dot_product_attention computes; "
                    "your CausalSelfAttention does not call it, so the explorer is left out."))
    return None


def gpt_attention(text, weights):
    """The GPT's attention on a passage, layer by layer and head by head.

    ``text``: the passage (one character per token); ``weights`` [n_layer, n_head, T, T]: the weights of
    each layer's heads on it (:func:`gpt_attention_weights`).  A menu picks a layer and a head, or the
    mean of a layer's heads; hovering a cell names the query and the key."""
    go = _go()
    w = np.asarray(weights.detach().cpu().double().numpy() if hasattr(weights, "detach") else weights, dtype=float)
    n_layer, n_head, T, _ = w.shape
    chars = [_show(c) for c in text]
    assert len(chars) == T, "one character per token"
    states = []
    for layer in range(n_layer):
        for head in range(n_head):
            states.append((f"layer {layer + 1}, head {head + 1}", _r(w[layer, head])))
        states.append((f"layer {layer + 1}, mean of the heads", _r(w[layer].mean(0))))
    pos = list(range(T))
    custom = [[[chars[i], chars[j]] for j in range(T)] for i in range(T)]
    heat = _heatmap(states[0][1], x=pos, y=pos, zmax=1, customdata=custom,
                    hover="query %{y}: %{customdata[0]}<br>key %{x}: %{customdata[1]}<br>weight %{z:.3f}<extra></extra>")
    buttons = [(label, "restyle", [{"z": [z]}]) for label, z in states]
    ticks = dict(tickmode="array", tickvals=pos, ticktext=chars, tickfont=dict(size=10), tickangle=0)
    fig = go.Figure([heat], _layout("The Shakespeare GPT's attention on a line of Hamlet", "key (attended to)",
                                    "query (attending)", height=560, updatemenus=[_menu(buttons, y=1.12)]))
    fig.update_layout(xaxis=ticks, yaxis=dict(autorange="reversed", **ticks))
    return Explorer("gpt_attention", fig,
                    alt="Heat map of the trained GPT's attention weights on a line of Hamlet: one row per query "
                        "character, one column per key character, for the chosen layer and head.",
                    hint="Pick a layer and a head. Everything right of the diagonal is zero (the causal mask). Some "
                         "heads keep to the previous character or two, a band beside the diagonal; others attend to "
                         "one kind of character wherever it is, such as the spaces between the words, in vertical "
                         "stripes. The mean of a layer's heads blurs them together.")


def sampling(labels, probs, temperatures, by_temperature, ks, by_k, ps, by_p, shown=20):
    """The next-token distribution under temperature, top-k and top-p, one panel and one slider each.

    ``labels`` [V]: each token's text; ``probs`` [V]: the unfiltered distribution at temperature 1
    (it picks and orders the ``shown`` likeliest tokens and is drawn grey behind every panel);
    ``by_temperature[i]`` [V] the distribution at ``temperatures[i]``, ``by_k[i]`` with top-k of
    ``ks[i]``, ``by_p[i]`` with top-p of ``ps[i]`` (your next_token_probs's, in a notebook)."""
    from plotly.subplots import make_subplots
    go = _go()
    base = np.asarray(probs.detach().cpu().double().numpy() if hasattr(probs, "detach") else probs, dtype=float)
    order = np.argsort(-base, kind="stable")[:shown]
    names = [_show(labels[i]) for i in order]

    def pick(rows):
        rows = [np.asarray(r.detach().cpu().double().numpy() if hasattr(r, "detach") else r, dtype=float) for r in rows]
        return _r(np.stack(rows)[:, order])

    panels = [(list(temperatures), pick(by_temperature), "softmax temperature T = "),
              (list(ks), pick(by_k), "top-k filter: k = "),
              (list(ps), pick(by_p), "top-p filter: p = ")]
    starts = [int(np.argmin([abs(t - 1.0) for t in temperatures])),
              int(np.argmin([abs(k - 5) for k in ks])), int(np.argmin([abs(p - 0.9) for p in ps]))]
    fig = make_subplots(rows=1, cols=3, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=["temperature (no filter)", "top-k (temperature 1)", "top-p (temperature 1)"])
    sliders, gap = [], 0.04
    width = (1 - 2 * gap) / 3
    for n, ((values, rows, prefix), start) in enumerate(zip(panels, starts)):
        fig.add_trace(go.Bar(x=names, y=_r(base[order]), name="temperature 1, no filter", marker_color="#cccccc",
                             showlegend=n == 0, legendgroup="base",
                             hovertemplate="%{x}: %{y:.3f} with no filter<extra></extra>"), row=1, col=n + 1)
        fig.add_trace(go.Bar(x=names, y=rows[start], name="after the filter", marker_color="#1f77b4", width=0.5,
                             showlegend=n == 0, legendgroup="filtered",
                             hovertemplate="%{x}: %{y:.3f}<extra></extra>"), row=1, col=n + 1)
        steps = [(f"{v:g}", "restyle", [{"y": [row]}, [2 * n + 1]]) for v, row in zip(values, rows)]
        slider = _slider(steps, prefix, start)
        slider.update(x=n * (width + gap), len=width, y=-0.12, yanchor="top", pad=dict(t=30))
        sliders.append(slider)
    fig.update_layout(**_layout(f"The next character after a prompt: the {shown} likeliest, three filters",
                                height=500, barmode="overlay", sliders=sliders,
                                legend=dict(x=width, y=0.98, xanchor="right", yanchor="top",
                                            bgcolor="rgba(255,255,255,0.7)"),
                                margin=dict(l=60, r=20, t=80, b=150)))
    fig.update_yaxes(range=[0, 1])
    fig.update_yaxes(title_text="next-character probability", row=1, col=1)
    fig.update_xaxes(tickfont=dict(size=10), tickangle=0)
    return Explorer("sampling", fig,
                    alt="Three bar charts of the probabilities of the likeliest next characters after a prompt: "
                        "under a temperature, after top-k and after top-p, with the unfiltered distribution in grey "
                        "behind each.",
                    hint="Move each slider. A temperature below 1 piles the probability onto the likeliest "
                         "characters and one above 1 spreads it out, without changing their order; top-k and top-p "
                         "zero the tail and share its probability out among the characters they keep, top-k a fixed "
                         "number of them, top-p as many as it takes to reach p.")


def speculative(text, target_probs, draft_probs, labels, shown=12):
    """Speculative decoding at each position of a passage: the target's distribution p of the next
    character, the draft's q, and p written as min(p, q) (the draft's token accepted) plus
    max(0, p - q) (the correction after a rejection).

    ``text``: the passage; ``target_probs`` and ``draft_probs`` [T, V]: the next-token distributions of
    the target and the draft after each of its characters; ``labels`` [V]: each token's text.  A slider
    picks the position; the right panel draws the chance of accepting the draft's token, the sum of
    min(p, q), along the passage."""
    from plotly.subplots import make_subplots
    go = _go()

    def arr(x):
        return np.asarray(x.detach().cpu().double().numpy() if hasattr(x, "detach") else x, dtype=float)

    p, q = arr(target_probs), arr(draft_probs)
    T = len(text)
    assert p.shape[0] == T and q.shape == p.shape, "one distribution per character of the passage"
    accept = np.minimum(p, q).sum(-1)
    chars = [_show(c) for c in text]
    states = []
    for t in range(T):
        order = np.argsort(-np.maximum(p[t], q[t]), kind="stable")[:shown]
        x = [_show(labels[i]) for i in order]
        states.append((x, _r(np.minimum(p[t], q[t])[order]), _r(np.maximum(0.0, p[t] - q[t])[order]),
                       _r(q[t][order]), _r(p[t][order])))
    x0, keep0, fix0, q0, p0 = states[0]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], horizontal_spacing=0.1,
                        subplot_titles=["the next character: target p and draft q",
                                        "chance that the draft's token is accepted"])
    fig.add_trace(go.Bar(x=x0, y=keep0, customdata=p0, name="accepted draft: min(p, q)", marker_color="#2ca02c",
                         hovertemplate="%{x}: target p %{customdata:.3f}<br>accepted draft min(p, q) %{y:.3f}"
                                       "<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=x0, y=fix0, customdata=p0, name="correction: max(0, p − q)", marker_color="#ff7f0e",
                         hovertemplate="%{x}: target p %{customdata:.3f}<br>correction max(0, p − q) %{y:.3f}"
                                       "<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=x0, y=q0, mode="markers", name="the draft's q", marker=dict(symbol="line-ew-open", size=18,
                             line=dict(width=3, color="#d62728")),
                             hovertemplate="%{x}: draft q %{y:.3f}<extra></extra>"), row=1, col=1)
    pos = list(range(T))
    custom = [[c] for c in chars]
    fig.add_trace(go.Scatter(x=pos, y=_r(accept), mode="lines+markers", name="sum of min(p, q)",
                             marker=dict(size=5), line=dict(color="#2ca02c"), customdata=custom, showlegend=False,
                             hovertemplate="after %{customdata[0]} (position %{x}): %{y:.3f}<extra></extra>"),
                  row=1, col=2)
    fig.add_trace(go.Scatter(x=[0], y=[_r(accept[0])], mode="markers", name="this position", showlegend=False,
                             marker=dict(size=14, color="#d62728"), hoverinfo="skip"), row=1, col=2)
    steps = [(f"{t}: {chars[t]}", "restyle",
              [{"x": [s[0], s[0], s[0], [t]], "y": [s[1], s[2], s[3], [_r(accept[t])]],
                "customdata": [s[4], s[4], None, None]}, [0, 1, 2, 4]])
             for t, s in enumerate(states)]
    fig.update_layout(**_layout("Speculative decoding, one position at a time", height=500, barmode="stack",
                                sliders=[_slider(steps, "after character ")],
                                legend=dict(x=0.45, y=0.98, xanchor="right", yanchor="top", bgcolor="rgba(255,255,255,0.7)"),
                                margin=dict(l=60, r=20, t=80, b=60)))
    fig.update_yaxes(title_text="target probability p", range=[0, 1], row=1, col=1)
    fig.update_yaxes(title_text="sum of min(p, q)", range=[0, 1], row=1, col=2)
    fig.update_xaxes(tickfont=dict(size=11), tickangle=0, row=1, col=1)
    fig.update_xaxes(tickmode="array", tickvals=pos, ticktext=chars, tickfont=dict(size=9), tickangle=0,
                     title_text="position in the passage", row=1, col=2)
    return Explorer("speculative", fig,
                    alt="Left: stacked bars of the target's probabilities of the likeliest next characters, split "
                        "into the part that comes from accepted draft tokens and the part that comes from "
                        "corrections, with the draft's probabilities marked. Right: the chance of accepting the "
                        "draft's token at each position of the passage.",
                    hint="Move along the passage. Each stack is the target's probability p, whatever the draft "
                         "proposed: the green part min(p, q) comes from accepted draft tokens, the orange part "
                         "max(0, p − q) from corrections. The draft is accepted often where the two models agree, "
                         "sure or unsure alike, and seldom where the target, reading the whole line, is sure of a "
                         "character that the draft, reading one, is not.")


def window_with_sinks(masks, sink_masks, sinks, start=0):
    """Sliding-window attention with attention sinks (§6.10): which keys each query sees, and how many a
    rolling cache must hold.  ``masks`` and ``sink_masks`` {window W: bool [T, T]}: your sliding_window_mask
    without sinks and with ``sinks`` of them, queries and keys over the same T positions.  Left, the keys
    each query sees, the sinks' in their own colour; right, how many that is at each position, against
    full attention's.  A slider picks W; it starts at the ``start``-th window."""
    from plotly.subplots import make_subplots
    go = _go()
    windows = list(masks)
    plain = {w: np.asarray(masks[w], dtype=bool) for w in windows}
    with_sinks = {w: np.asarray(sink_masks[w], dtype=bool) for w in windows}
    T = plain[windows[0]].shape[0]
    assert all(m.shape == (T, T) for m in (*plain.values(), *with_sinks.values())), "every mask [T, T], queries by keys"
    assert all((plain[w] <= with_sinks[w]).all() for w in windows), "sinks add keys to a window; they take none away"
    # 1: a key of the window, 2: a key that only the sinks keep
    z = {w: _r(plain[w] + 2 * (with_sinks[w] & ~plain[w])) for w in windows}
    seen = {w: (plain[w].sum(1).tolist(), with_sinks[w].sum(1).tolist()) for w in windows}
    pos = list(range(T))
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=["the keys each query sees", "keys per query: what the cache holds"])
    colors = [[0, "#f0f0f0"], [0.33, "#f0f0f0"], [0.34, "#2171b5"], [0.66, "#2171b5"], [0.67, "#e6550d"], [1, "#e6550d"]]
    first = windows[start]
    fig.add_trace(go.Heatmap(z=z[first], x=pos, y=pos, zmin=0, zmax=2, colorscale=colors, showscale=False, xgap=1,
                             ygap=1, hovertemplate="query %{y}<br>key %{x}<br>%{z} (0 unseen, 1 in the window, 2 a sink)"
                                                   "<extra></extra>"),
                  row=1, col=1)
    hover = "query %{x}: %{y} keys<extra></extra>"
    fig.add_trace(go.Scatter(x=pos, y=[t + 1 for t in pos], mode="lines", name="full attention",
                             line=dict(color="gray", dash="dot"), hovertemplate=hover), row=1, col=2)
    fig.add_trace(go.Scatter(x=pos, y=seen[first][0], mode="lines+markers", name=_t("window"),
                             marker=dict(size=4), line=dict(color="#2171b5"), hovertemplate=hover), row=1, col=2)
    fig.add_trace(go.Scatter(x=pos, y=seen[first][1], mode="lines+markers", name=f"window + {sinks} sinks",
                             marker=dict(size=4), line=dict(color="#e6550d"), hovertemplate=hover), row=1, col=2)

    def title(w):
        most = max(seen[w][1])
        return f"Window W = {w} and {sinks} sinks: a query sees at most {most} of {T} keys"

    # One value per updated trace (0, 2, 3): Plotly repeats a shorter list over the traces.
    steps = [(f"{w}", "update", [{"z": [z[w], None, None], "y": [pos, seen[w][0], seen[w][1]]},
                                 {"title.text": title(w)}, [0, 2, 3]]) for w in windows]
    fig.update_layout(**_layout(title(first), height=500, sliders=[_slider(steps, _t("window W = "), active=start)],
                                # top left of the right panel, which the rising lines leave empty
                                legend=dict(x=0.57, y=0.98, xanchor="left", yanchor="top", bgcolor="rgba(255,255,255,0.7)")))
    fig.update_yaxes(autorange="reversed", title_text="query (position)", row=1, col=1)
    fig.update_xaxes(title_text="key (position)", row=1, col=1)
    fig.update_yaxes(title_text="keys seen", range=[0, T + 1], row=1, col=2)
    fig.update_xaxes(title_text="query (position)", row=1, col=2)
    return Explorer("window_with_sinks", fig,
                    alt="Left: a grid of queries by keys, blue where the sliding window lets a query attend and "
                        "orange where only the sinks do. Right: how many keys each query sees, for full attention, "
                        "the window and the window with sinks.",
                    hint="Move W. The blue band is each query's last W positions, its own included; the orange "
                         "columns are the first positions, kept for every query. On the right, full attention's "
                         "count grows with the text, while the window's stops at W and the window with sinks at "
                         "W plus the sinks: that bound is the rolling cache's size.")
