"""Chapter 01's explorers (see attncourse.explore)."""
from . import Explorer, _go, _heatmap, _layout, _menu, _r, _slider

__all__ = ["alignment", "output_step", "reversal"]


def _ticks(labels):
    """Axis ticks at 1 .. len(labels) showing ``labels`` (characters repeat, so the axis is numeric)."""
    return list(range(1, len(labels) + 1)), list(labels)


def _cells(rows, cols):
    """customdata of a heat map: [output character, input character] for every cell."""
    return [[[r, c] for c in cols] for r in rows]


def alignment(texts, outputs, weights):
    """The alignment heat map of several held-out dates, one at a time: ``texts[i]`` the input,
    ``outputs[i]`` the characters the model wrote, ``weights[i]`` [len(outputs[i]), len(texts[i])] the
    attention weights of each output step (your decoder's, in a notebook)."""
    go = _go()
    states = []
    for text, out, w in zip(texts, outputs, weights):
        x, xt = _ticks(text)
        y, yt = _ticks(out)
        data = {"z": [_r(w)], "x": [x], "y": [y], "customdata": [_cells(yt, xt)]}
        axes = {"xaxis.tickvals": x, "xaxis.ticktext": xt, "yaxis.tickvals": y, "yaxis.ticktext": yt}
        states.append((str(text), data, axes))
    _, first, axes = states[0]
    heat = _heatmap(first["z"][0], x=first["x"][0], y=first["y"][0], zmax=1, customdata=first["customdata"][0],
                    hover="writing '%{customdata[0]}' (output %{y})<br>reading '%{customdata[1]}' (input %{x})"
                          "<br>weight %{z:.3f}<extra></extra>")
    buttons = [(label, "update", [data, axes]) for label, data, axes in states]
    layout = _layout("Where the decoder looks while it writes each character", "input character",
                     "output character", height=460, updatemenus=[_menu(buttons, x=1.0, name="held-out date")])
    layout["updatemenus"][0]["xanchor"] = "right"
    layout["xaxis"].update(tickmode="array", tickvals=axes["xaxis.tickvals"], ticktext=axes["xaxis.ticktext"])
    layout["yaxis"].update(tickmode="array", tickvals=axes["yaxis.tickvals"], ticktext=axes["yaxis.ticktext"],
                           autorange="reversed")
    fig = go.Figure([heat], layout)
    return Explorer("alignment", fig,
                    alt="Heat map of the attention weights of the date translator: one row per output character, "
                        "one column per input character, for the held-out date chosen.",
                    hint="Pick a date written another way: the year's rows light up the year wherever the format "
                         "puts it, the month's rows the month's name or number, and words that carry no "
                         "information (a weekday) stay dark; a two-digit year is read from its two digits.")


def output_step(texts, outputs, weights, template="YYYY-MM-DD"):
    """One output step of the date translator across several held-out dates: row ``i`` is the attention
    of ``texts[i]``'s step over its input characters (``weights[i]`` [len(outputs[i]), len(texts[i])],
    your decoder's in a notebook).  ``template`` names the output's characters (ISO 8601)."""
    go = _go()
    width = max(len(t) for t in texts)
    x = list(range(1, width + 1))
    y, names = _ticks(texts)
    chars = [list(t) + [""] * (width - len(t)) for t in texts]
    steps = []
    for t, slot in enumerate(template):
        z, written = [], []
        for text, out, w in zip(texts, outputs, weights):
            row = _r(w[t]) if t < len(out) else []
            z.append(row + [None] * (width - len(row)))
            written.append(f"{text}  → {out[t] if t < len(out) else ''}")
        steps.append((f"{t + 1} ({slot})", z, written))
    heat = _heatmap(steps[0][1], x=x, y=y, zmax=1, text=chars, texttemplate="%{text}", textfont=dict(size=11),
                    hover="input character '%{text}' (position %{x})<br>weight %{z:.3f}<extra></extra>")
    layout = _layout("One output character, looked up in every format", "input position", "", height=480,
                     sliders=[_slider([(label, "update", [{"z": [z]}, {"yaxis.ticktext": written}])
                                       for label, z, written in steps], "output character ")])
    layout["margin"]["l"] = 230
    layout["yaxis"].update(tickmode="array", tickvals=y, ticktext=steps[0][2], autorange="reversed")
    fig = go.Figure([heat], layout)
    return Explorer("output_step", fig,
                    alt="Heat map: one row per held-out date, one column per input character (printed in its cell); "
                        "the colour is the attention weight of the chosen output step.",
                    hint="Slide through the ten output characters: for each one the bright cells sit on the same "
                         "part of the date (the year, the month or the day) wherever the format puts it. On the "
                         "hyphens the model needs no input, and its weights spread out.")


def reversal(examples, accuracy):
    """The reversal model's attention, one input length at a time: ``examples`` [(input, target, output,
    weights [len(output), len(input)])] of held-out digit strings (for each length the first one reversed
    correctly and the first one reversed wrongly are shown), ``accuracy`` {length: exact-match fraction}."""
    go = _go()
    lengths = sorted({len(src) for src, _, _, _ in examples})
    panels = ("x", "y", "xaxis", "yaxis"), ("x2", "y2", "xaxis2", "yaxis2")      # right, wrong

    def state(example):
        if example is None:                     # no string of this length was reversed wrongly
            return {"z": [[None]], "x": [1], "y": [1], "customdata": [[["", "", ""]]]}, ([], [], [], [])
        src, tgt, out, w = example
        x, xt = _ticks(src)
        y, yt = _ticks(out)
        want = [tgt[t] if t < len(tgt) else "" for t in range(len(out))]
        cells = [[[yt[r], want[r], xt[c]] for c in range(len(xt))] for r in range(len(yt))]
        return {"z": _r(w), "x": x, "y": y, "customdata": cells}, (x, xt, y, yt)

    steps = []
    for n in lengths:
        right = next((e for e in examples if len(e[0]) == n and "".join(e[2]) == e[1]), None)
        wrong = next((e for e in examples if len(e[0]) == n and "".join(e[2]) != e[1]), None)
        (a, ticks_a), (b, ticks_b) = state(right), state(wrong)
        data, axes = {k: [a[k], b[k]] for k in a}, {}
        for (_, _, xaxis, yaxis), (x, xt, y, yt) in zip(panels, (ticks_a, ticks_b)):
            axes.update({f"{xaxis}.tickvals": x, f"{xaxis}.ticktext": xt, f"{yaxis}.tickvals": y, f"{yaxis}.ticktext": yt})
        share = accuracy.get(n, float("nan"))
        axes["title"] = {"text": f"{n}-digit inputs: {share:.0%} of the held-out ones reversed correctly"}
        steps.append((f"{n}", "update", [data, axes]))
    data, axes = steps[0][2]
    hover = ("writes '%{customdata[0]}' (should be '%{customdata[1]}')<br>reading '%{customdata[2]}' "
             "(input %{x})<br>weight %{z:.3f}<extra></extra>")
    traces = [_heatmap(data["z"][i], x=data["x"][i], y=data["y"][i], customdata=data["customdata"][i], zmax=1,
                       hover=hover, xaxis=xa, yaxis=ya, showscale=(i == 1)) for i, (xa, ya, _, _) in enumerate(panels)]
    layout = _layout(axes["title"]["text"], height=460, sliders=[_slider(steps, "input length ")])
    layout.update(
        xaxis=dict(domain=[0, 0.45], title=dict(text="input digit (a string reversed correctly)")),
        yaxis=dict(title=dict(text="output digit"), autorange="reversed"),
        xaxis2=dict(domain=[0.55, 1], title=dict(text="input digit (a string reversed wrongly)")),
        yaxis2=dict(anchor="x2", autorange="reversed"))
    for _, _, xaxis, yaxis in panels:
        for axis in (xaxis, yaxis):
            layout[axis].update(tickmode="array", tickvals=axes[f"{axis}.tickvals"], ticktext=axes[f"{axis}.ticktext"])
    fig = go.Figure(traces, layout)
    return Explorer("reversal", fig,
                    alt="Two heat maps of the reversal model's attention weights, output digits as rows and input "
                        "digits as columns: a held-out string reversed correctly and one reversed wrongly, of the "
                        "chosen length.",
                    hint="Slide the length: a correct reversal is a clean anti-diagonal, the last input digit first. "
                         "In a wrong one the weights blur or jump a position, and the output drops or repeats a "
                         "digit there. The right map stays empty at a length the model always got right.")
