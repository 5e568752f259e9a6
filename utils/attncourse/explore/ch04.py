"""Chapter 04's explorers (see attncourse.explore)."""
import numpy as np

from . import Explorer, _go, _layout, _r, _slider

__all__ = ["sinusoidal", "rope"]


def _array(x):
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=float)


def sinusoidal(table):
    """The sinusoidal table read as clocks: ``table`` [P, D] (your ``sinusoidal_table``, in a notebook),
    one hand per pair (2i, 2i+1) at the angle whose sine is table[p, 2i] and cosine table[p, 2i+1], and
    the similarity PE(p) . PE(q) of position p to every position q, for every position p of the table."""
    go = _go()
    pe = _array(table)
    n, d = pe.shape
    pairs = d // 2
    radius = np.linspace(1.0, 0.25, pairs)              # pair 0 (the fastest hand) outermost
    speed = np.arctan2(pe[1, 0::2], pe[1, 1::2]) if n > 1 else np.zeros(pairs)   # the angle turned per position
    dots = pe @ pe.T
    tips_x, tips_y = _r(radius * pe[:, 1::2]), _r(radius * pe[:, 0::2])
    sims = _r(dots)
    info = [[i, 2 * i, 2 * i + 1, round(float(s), 4)] for i, s in enumerate(speed)]
    hands = go.Scatter(x=tips_x[0], y=tips_y[0], mode="markers", xaxis="x", yaxis="y", customdata=info,
                       marker=dict(size=9, color=list(range(pairs)), colorscale="Viridis", line=dict(width=0.5)),
                       showlegend=False,
                       hovertemplate="pair %{customdata[0]} (dimensions %{customdata[1]} and %{customdata[2]})"
                                     "<br>turns %{customdata[3]:.4f} rad per position<extra></extra>")
    curve = go.Scatter(y=sims[0], x0=0, dx=1, mode="lines", xaxis="x2", yaxis="y2", showlegend=False,
                       hovertemplate="position q = %{x}<br>PE(p) · PE(q) = %{y:.3f}<extra></extra>")
    now = go.Scatter(x=[0], y=[sims[0][0]], mode="markers", xaxis="x2", yaxis="y2", marker=dict(size=11),
                     showlegend=False, hovertemplate="position q = p = %{x}<br>PE(p) · PE(p) = %{y:.3f}<extra></extra>")
    # the curve's x stays implicit (x0, dx): null leaves it unset, and the steps do not ship 0 .. P-1 again
    steps = [(f"{p}", "restyle", [{"x": [tips_x[p], None, [p]], "y": [tips_y[p], sims[p], [sims[p][p]]]},
                                  [0, 1, 2]]) for p in range(n)]
    orbits = [dict(type="circle", xref="x", yref="y", x0=-r, y0=-r, x1=r, y1=r, line=dict(width=0.5, color="#cccccc"))
              for r in np.round(radius, 4).tolist()]
    layout = _layout("The sinusoidal encoding of position p: one clock hand per pair of dimensions", height=460,
                     shapes=orbits, sliders=[_slider(steps, "chosen position p = ")])
    layout.update(xaxis=dict(domain=[0, 0.4], range=[-1.1, 1.1], zeroline=False,
                             title=dict(text="cos (dimension 2i + 1), one ring per pair i")),
                  yaxis=dict(range=[-1.1, 1.1], scaleanchor="x", zeroline=False, title=dict(text="sin (dimension 2i)")),
                  xaxis2=dict(domain=[0.52, 1], title=dict(text="other position q")),
                  yaxis2=dict(anchor="x2", title=dict(text="similarity PE(p) · PE(q)")))
    fig = go.Figure([hands, curve, now], layout)
    return Explorer("sinusoidal", fig,
                    alt="Left: one dot per pair of dimensions of the sinusoidal encoding of position p, on its own "
                        "ring, at the angle the pair encodes. Right: the dot product of PE(p) with the encoding of "
                        "every position q.",
                    hint="Move the position: the outer hands (fast pairs) race round, the inner ones (slow pairs) "
                         "barely move, and together they tell every position apart. On the right the curve keeps "
                         "its shape and slides with p, its peak at q = p: the dot product depends only on p - q.")


def rope(qs, ks, pairs=(0, 4)):
    """RoPE on one query and one key: ``qs`` [N, d] holds R_m q for m = 0 .. N-1 and ``ks`` [N, d] R_n k
    (your ``apply_rope`` of the same q and k at every position, in a notebook).  One slider places the
    query, the other the key; the planes of ``pairs`` show both vectors turning, and the map shows every
    score (R_m q) . (R_n k) with a crosshair on the current (m, n)."""
    go = _go()
    q, k = _array(qs), _array(ks)
    n, d = q.shape
    scores = _r(q @ k.T)
    planes = [(f"x{j + 1}" if j else "x", f"y{j + 1}" if j else "y") for j in range(len(pairs))]
    heat_axes = (f"x{len(pairs) + 1}", f"y{len(pairs) + 1}")
    reach = float(max(np.abs(q).max(), np.abs(k).max())) * 1.15
    traces, q_ids, k_ids = [], [], []
    for (xa, ya), i in zip(planes, pairs):
        for vec, ids, name, color, hover in (
                (q, q_ids, "query vector q", "#d62728", f"query, pair {i}<br>(%{{x:.3f}}, %{{y:.3f}})<extra></extra>"),
                (k, k_ids, "key vector k", "#1f77b4", f"key, pair {i}<br>(%{{x:.3f}}, %{{y:.3f}})<extra></extra>")):
            ids.append(len(traces))
            traces.append(go.Scatter(x=[0, round(float(vec[0, 2 * i]), 4)], y=[0, round(float(vec[0, 2 * i + 1]), 4)],
                                     mode="lines+markers", xaxis=xa, yaxis=ya, line=dict(width=4, color=color),
                                     marker=dict(size=[0, 10], color=color), name=name, legendgroup=name,
                                     showlegend=(i == pairs[0]), hovertemplate=hover))
    heat = go.Heatmap(z=scores, x=list(range(n)), y=list(range(n)), colorscale="RdBu", zmid=0, xaxis=heat_axes[0],
                      yaxis=heat_axes[1], colorbar=dict(x=0.95, xanchor="left", len=0.8),
                      hovertemplate="query at m = %{y}<br>key at n = %{x}<br>score %{z:.3f}<extra></extra>")
    q_ids.append(len(traces) + 1)
    k_ids.append(len(traces) + 2)
    row = go.Scatter(x=[-0.5, n - 0.5], y=[0, 0], mode="lines", xaxis=heat_axes[0], yaxis=heat_axes[1],
                     line=dict(color="black", width=1.5), showlegend=False, hoverinfo="skip", name="m")
    col = go.Scatter(x=[0, 0], y=[-0.5, n - 0.5], mode="lines", xaxis=heat_axes[0], yaxis=heat_axes[1],
                     line=dict(color="black", width=1.5, dash="dot"), showlegend=False, hoverinfo="skip", name="n")
    traces += [heat, row, col]

    def arrows(vec, p):
        return [[0, round(float(vec[p, 2 * i]), 4)] for i in pairs], [[0, round(float(vec[p, 2 * i + 1]), 4)] for i in pairs]

    q_steps, k_steps = [], []
    for p in range(n):
        xs, ys = arrows(q, p)
        q_steps.append((f"{p}", "restyle", [{"x": xs + [[-0.5, n - 0.5]], "y": ys + [[p, p]]}, q_ids]))
        xs, ys = arrows(k, p)
        k_steps.append((f"{p}", "restyle", [{"x": xs + [[p, p]], "y": ys + [[-0.5, n - 0.5]]}, k_ids]))
    q_slider, k_slider = _slider(q_steps, "query position m = "), _slider(k_steps, "key position n = ")
    q_slider.update(x=0, len=0.46, pad=dict(t=70))
    k_slider.update(x=0.54, len=0.46, pad=dict(t=70))
    width = 0.54 / len(pairs)
    layout = _layout("RoPE: the query and the key turn with their positions", height=500,
                     sliders=[q_slider, k_slider], legend=dict(x=0, y=1.12, orientation="h"))
    for j, ((xa, ya), i) in enumerate(zip(planes, pairs)):
        x0 = j * (width + 0.03)
        speed = 10000 ** (-2 * i / d)
        layout[f"xaxis{j + 1 if j else ''}"] = dict(
            domain=[x0, x0 + width], range=[-reach, reach], anchor=ya, showticklabels=False,
            title=dict(text=f"pair {i} (dimensions {2 * i}, {2 * i + 1})<br>turns {speed:.3g} rad per position"))
        layout[f"yaxis{j + 1 if j else ''}"] = dict(range=[-reach, reach], scaleanchor=xa, anchor=xa,
                                                  showticklabels=False)
    hx = len(pairs) + 1
    layout[f"xaxis{hx}"] = dict(domain=[0.68, 0.93], anchor=heat_axes[1], title=dict(text="key position n"))
    layout[f"yaxis{hx}"] = dict(anchor=heat_axes[0], autorange="reversed", title=dict(text="query position m"))
    fig = go.Figure(traces, layout)
    return Explorer("rope", fig,
                    alt="Left: the query (red) and the key (blue) in two planes of RoPE, each rotated by its "
                        "position. Right: the score of the rotated query and key for every query position m and "
                        "key position n, with a crosshair on the chosen pair.",
                    hint="Move the query and the key by the same number of positions: in every plane both arrows "
                         "turn by the same angle, the angle between them stays, and the crosshair slides along a "
                         "diagonal of the map, where the colour (the score) does not change. Move only one and the "
                         "score changes: it depends on m - n alone.")
