"""Chapter 00's explorers (see attncourse.explore)."""
import numpy as np

from . import Explorer, _go, _layout, _r, _slider, _softmax, _t

__all__ = ["temperature", "dot_product"]


def temperature(labels, logits, temperatures=None, probs=None):
    """How a temperature reshapes a softmax: the distribution over ``labels`` as T moves.

    ``probs`` [len(temperatures), len(labels)]: the distributions to show (your own ``softmax`` in a
    notebook); computed here when not given."""
    temperatures = list(np.round(np.geomspace(0.1, 10, 41), 3) if temperatures is None else temperatures)
    probs = _softmax(np.asarray(logits)[None, :], np.asarray(temperatures)[:, None]) if probs is None else probs
    probs = _r(probs)
    start = int(np.argmin(np.abs(np.log(temperatures))))
    go = _go()
    bar = go.Bar(x=list(labels), y=probs[start], marker_color=["#d62728"] + ["#1f77b4"] * (len(labels) - 1),
                 hovertemplate="%{x}: %{y:.3f}<extra></extra>")
    steps = [(f"{t:g}", "restyle", [{"y": [p]}]) for t, p in zip(temperatures, probs)]
    fig = go.Figure([bar], _layout("Softmax with temperature", _t("candidate"), _t("probability"),
                                   sliders=[_slider(steps, _t("temperature T = "), start)], yaxis=dict(range=[0, 1], title=dict(text=_t("probability")))))
    return Explorer("temperature", fig,
                    alt="Bar chart of the probabilities of the candidate answers under one temperature.",
                    hint="Move the temperature: below 1 the top answer takes almost everything, "
                         "above 1 the distribution flattens towards uniform; the order never changes.")


def dot_product(a_length=1.0, b_length=1.0, angles=None):
    """Two vectors in the plane, one turning: their dot product and cosine against the angle."""
    angles = list(range(0, 361, 10) if angles is None else angles)
    go = _go()
    rad = np.radians(angles)
    dots = _r(a_length * b_length * np.cos(rad))
    traces, steps = [], []
    for i, th in enumerate(rad):
        b = [b_length * np.cos(th), b_length * np.sin(th)]
        steps.append((f"{angles[i]}°", "restyle",
                      [{"x": [[0, round(b[0], 4)], [angles[i]]], "y": [[0, round(b[1], 4)], [dots[i]]]}, [1, 3]]))
    traces.append(go.Scatter(x=[0, a_length], y=[0, 0], mode="lines+markers", name=_t("a (fixed)"), xaxis="x", yaxis="y",
                             line=dict(width=4)))
    traces.append(go.Scatter(x=[0, b_length], y=[0, 0], mode="lines+markers", name=_t("b (turning)"), xaxis="x", yaxis="y",
                             line=dict(width=4)))
    traces.append(go.Scatter(x=angles, y=dots, mode="lines", name="a · b", xaxis="x2", yaxis="y2",
                             hovertemplate="angle %{x}°<br>a · b = %{y:.3f}<extra></extra>"))
    traces.append(go.Scatter(x=[angles[0]], y=[dots[0]], mode="markers", name=_t("now"), xaxis="x2", yaxis="y2",
                             marker=dict(size=12), showlegend=False))
    r = max(a_length, b_length) * 1.15
    layout = _layout("The dot product as b turns", height=430,
                     sliders=[_slider(steps, "angle between a and b: ")])
    layout.update(xaxis=dict(domain=[0, 0.42], range=[-r, r], title=dict(text="first coordinate")),
                  yaxis=dict(range=[-r, r], scaleanchor="x", title=dict(text="second coordinate")),
                  xaxis2=dict(domain=[0.55, 1], title=dict(text="angle (degrees)")),
                  yaxis2=dict(anchor="x2", title=dict(text="dot product")))
    fig = go.Figure(traces, layout)
    return Explorer("dot_product", fig,
                    alt="Left: two arrows a and b from the origin. Right: the dot product of a and b against the angle between them.",
                    hint="Turn b: the dot product is largest when the arrows point the same way, zero at 90 degrees "
                         "and most negative when they point apart; it is |a| |b| cos(angle).")
