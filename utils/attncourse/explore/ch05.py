"""Chapter 05's explorers (see attncourse.explore)."""
import math

import numpy as np

from . import Explorer, _go, _heatmap, _layout, _menu, _r, _slider

__all__ = ["attention", "beam", "KINDS"]

KINDS = {"encoder": "encoder self-attention", "decoder": "decoder self-attention (causal)",
         "cross": "decoder cross-attention"}


def _array(x):
    return np.asarray(x.detach().cpu().double().numpy() if hasattr(x, "detach") else x, dtype=float)


def _labels(tokens):
    """Axis labels for characters: a space shown as ␣, and repeated characters made distinct (a category
    axis would merge equal labels) by invisible zero-width spaces."""
    seen, out = {}, []
    for t in tokens:
        t = "␣" if t == " " else t
        out.append(t + "\u200b" * seen.get(t, 0))
        seen[t] = seen.get(t, 0) + 1
    return out


def attention(source, output, maps):
    """Every attention of the trained dates Transformer on one translation (§5.11), head by head.

    ``maps`` {(kind, block): weights [H, queries, keys]}, kind "encoder" (self-attention over the source,
    [H, S, S]), "decoder" (causal self-attention over the decoder's input <bos> + output, [H, T, T]) or
    "cross" (decoder queries over the source, [H, T, S]), with T = len(output) + 1 (the last position
    writes <eos>); ``source`` and ``output`` the date and the model's translation."""
    go = _go()
    src = _labels(list(source))
    writes = _labels(list(output) + ["<eos>"])
    reads = _labels(["<bos>"] + list(output))
    axes = {"encoder": (src, src, "source character (key)", "source character (query)"),
            "decoder": (reads, writes, "decoder input (key)", "position, by the character it writes (query)"),
            "cross": (src, writes, "source character (key)", "position, by the character it writes (query)")}
    order = sorted(maps, key=lambda kb: (list(KINDS).index(kb[0]), kb[1]))
    states = []
    for kind, block in order:
        w = _array(maps[kind, block])
        xs, ys, xtitle, ytitle = axes[kind]
        if w.ndim != 3 or w.shape[2] != len(xs) or w.shape[1] > len(ys):
            raise ValueError(f"{kind} block {block}: expected weights [H, queries, {len(xs)}], got shape {list(w.shape)}")
        ys = ys[: w.shape[1]]
        for h in range(w.shape[0]):
            states.append((f"{KINDS[kind]}, block {block}, head {h}", _r(w[h]), xs, ys, xtitle, ytitle))
        states.append((f"{KINDS[kind]}, block {block}, mean of the {w.shape[0]} heads", _r(w.mean(0)), xs, ys,
                       xtitle, ytitle))
    label, z, xs, ys, xtitle, ytitle = states[0]
    heat = _heatmap(z, x=xs, y=ys, zmax=1, hover="query %{y}<br>key %{x}<br>weight %{z:.3f}<extra></extra>")
    buttons = [(label, "update", [{"z": [z], "x": [xs], "y": [ys]},       # new data re-types the axes: keep them
                                  {"xaxis.title.text": xtitle, "yaxis.title.text": ytitle, "xaxis.type": "category",
                                   "yaxis.type": "category", "yaxis.autorange": "reversed"}])
               for label, z, xs, ys, xtitle, ytitle in states]
    menu = _menu(buttons, y=1.1)
    menu["name"] = "which attention"
    fig = go.Figure([heat], _layout(f"The dates Transformer on {source!r} → {output}", xtitle, ytitle, height=620,
                                    updatemenus=[menu], margin=dict(l=70, r=20, t=120, b=70),
                                    xaxis=dict(type="category", tickangle=0, title=dict(text=xtitle)),
                                    yaxis=dict(type="category", autorange="reversed", title=dict(text=ytitle))))
    return Explorer("attention", fig,
                    alt="Heat map of one attention head of the trained dates Transformer on one date: the encoder's "
                        "self-attention, the decoder's causal self-attention or its cross-attention, chosen in a menu.",
                    hint="Walk through the menu. Encoder heads mix each character with others of the source; the "
                         "decoder's self-attention stays on or left of the diagonal (causal); cross-attention heads "
                         "send each output digit to the source characters it is copied or derived from. Compare a "
                         "head with the mean of its block: the last block's cross-attention, averaged, is what §5.11's "
                         "figure drew.")


def beam(source, target, steps, answer):
    """Beam search on one date (§5.10), step by step: the hypotheses the beam holds before each step.

    ``steps`` [[(prefix, log P)]]: for each decoding step, the unfinished hypotheses (their text after
    <bos>) and their log-probabilities, as your beam_search handed them to the decoder; ``target`` the
    correct translation, ``answer`` the one beam search returned."""
    go = _go()
    states = []
    for hyps in steps:
        best = {}
        for text, log_p in hyps:                         # a hypothesis handed over twice is shown once
            best.setdefault(text, float(log_p))
        ranked = sorted(best.items(), key=lambda kv: -kv[1])
        states.append([(text if text else "<bos>", log_p, target.startswith(text)) for text, log_p in ranked])
    width = max(len(s) for s in states)
    lowest = min(lp for s in states for _, lp, _ in s)

    def part(state, right):
        xs = [lp for _, lp, ok in state if ok == right]
        return dict(x=_r(xs), y=[t for t, _, ok in state if ok == right], p=_r([math.exp(v) for v in xs]))

    hover = "hypothesis %{y}<br>log P = %{x:.3f}<br>probability P = %{customdata:.3f}<extra></extra>"
    first = [part(states[0], False), part(states[0], True)]
    traces = [go.Scatter(x=first[i]["x"], y=first[i]["y"], customdata=first[i]["p"], mode="markers",
                         name=name, marker=dict(size=14, color=color), hovertemplate=hover)
              for i, (name, color) in enumerate([("another hypothesis", "#1f77b4"),
                                                 ("a prefix of the correct answer", "#2ca02c")])]
    slider_steps = []
    for t, state in enumerate(states):
        parts = [part(state, False), part(state, True)]
        slider_steps.append((f"{t}", "update", [{"x": [p["x"] for p in parts], "y": [p["y"] for p in parts],
                                                 "customdata": [p["p"] for p in parts]},
                                                {"yaxis.categoryarray": [text for text, _, _ in state],
                                                 "yaxis.type": "category", "yaxis.autorange": "reversed"}]))
    slider = _slider(slider_steps, "tokens written: ")
    slider["pad"] = dict(t=60)
    fig = go.Figure(traces, _layout(f"Beam search of width {width} on {source!r}<br>answer {answer}, correct {target}",
                                    "log P (the hypothesis' log-probability)", "hypothesis (its text so far)", height=540,
                                    sliders=[slider], margin=dict(l=110, r=20, t=70, b=170),
                                    legend=dict(orientation="h", x=0, y=-0.5, yanchor="top"),
                                    xaxis=dict(range=[lowest - 0.5, 0.3], zeroline=True,
                                               title=dict(text="log P (the hypothesis' log-probability)")),
                                    yaxis=dict(type="category", categoryorder="array",
                                               categoryarray=[text for text, _, _ in states[0]],
                                               autorange="reversed", automargin=True,
                                               title=dict(text="hypothesis (its text so far)"))))
    return Explorer("beam", fig,
                    alt="Dot plot of the hypotheses in the beam after a number of decoding steps, each at its "
                        "log-probability; green ones are prefixes of the correct answer.",
                    hint="Step through the decoding. The beam keeps its best hypotheses over all extensions; watch "
                         "where the leader and the runner-up part, and how far behind the others fall. A beam only "
                         "finds answers the model itself scores higher: it cannot rescue a correct answer that the "
                         "model ranks second.")
