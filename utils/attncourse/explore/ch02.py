"""Chapter 02's explorers (see attncourse.explore)."""
from . import Explorer, _go, _heatmap, _layout, _menu, _r, _slider, _t

__all__ = ["scaling", "masks", "MASKS"]


def scaling(dims, unscaled, scaled):
    """Why divide by sqrt(d): one query's softmax weights over the same keys, from unscaled and from
    scaled scores, as the dimension d grows.  ``unscaled[i]`` and ``scaled[i]`` [n_keys] belong to
    ``dims[i]`` (sorted from the largest weight down, so that the shapes compare)."""
    go = _go()
    unscaled, scaled = _r(unscaled), _r(scaled)
    keys = list(range(1, len(unscaled[0]) + 1))
    hover = "key %{x}<br>weight %{y:.3f}<extra></extra>"
    traces = [go.Bar(x=keys, y=unscaled[0], name=_t("q·k (unscaled)"), hovertemplate=hover),
              go.Bar(x=keys, y=scaled[0], name="q·k / sqrt(d) (scaled)", hovertemplate=hover)]
    steps = [(f"{d}", "restyle", [{"y": [u, s]}, [0, 1]]) for d, u, s in zip(dims, unscaled, scaled)]
    fig = go.Figure(traces, _layout("One query's weights over 16 keys, largest first", "key (sorted by weight)",
                                    _t("weight"), barmode="group", yaxis=dict(range=[0, 1], title=dict(text=_t("weight"))),
                                    sliders=[_slider(steps, _t("dimension d = "))]))
    return Explorer("scaling", fig,
                    alt="Two bar charts of one query's attention weights over 16 keys, from unscaled and scaled scores.",
                    hint="Raise d: unscaled scores grow like sqrt(d), so one key takes nearly all the weight (a saturated "
                         "softmax with tiny gradients); scaled scores keep the weights spread at every d.")


MASKS = {"none": "no mask", "padding": "padding mask (the last two keys are padding)", "causal": "causal mask",
         "both": "padding and causal"}


def masks(tokens, weights):
    """The attention weights of one sentence under each mask: ``weights`` {"none", "padding", "causal",
    "both"} -> [N, N] (your scaled_dot_product_attention's, in a notebook)."""
    go = _go()
    states = [(MASKS[k], _r(weights[k])) for k in MASKS if k in weights]
    heat = _heatmap(states[0][1], x=list(tokens), y=list(tokens), zmax=1)
    buttons = [(label, "restyle", [{"z": [w]}]) for label, w in states]
    fig = go.Figure([heat], _layout("Attention weights under a mask", "key (attended to)", "query (attending)",
                                    height=480, updatemenus=[_menu(buttons, name=_t("mask"))],
                                    yaxis=dict(autorange="reversed", title=dict(text="query (attending)"))))
    return Explorer("masks", fig,
                    alt="Heat map of attention weights, queries as rows and keys as columns, under the chosen mask.",
                    hint="Switch the mask: a padding mask empties the padded columns in every row, a causal mask "
                         "empties everything right of the diagonal; every row still sums to 1.")
