"""Explorers: figures the reader moves (sliders, selectors, hover), one function per explorer.

Each function takes arrays (the chapter's own results: the reference's on the website, the learner's in
a notebook) and returns an :class:`Explorer`, a Plotly figure whose controls are data (Plotly's
sliders and update menus, every state computed in advance), so the same figure runs with no kernel:

- in a notebook (JupyterLab, VS Code, Colab), where it renders like any Plotly figure;
- on the website, where tools/build_site.py turns it into a page element drawn by the site's own copy
  of plotly.js (no CDN) and _ext/explorers.js gives each control a native, keyboard-operable twin.

Every explorer carries ``alt`` (what the figure shows, for screen readers and the still image) and
``hint`` (what to try and what to notice).  Its strings are English in the code and shown in the
learner's language: :func:`localize` translates them with the learner package's catalogue (``make
translations`` extracts them from this file), in a notebook and for the Chinese website alike.

Explorers never run while grading: notebooks call them under ``if not attncourse.GRADING``.
"""
import base64
import functools
import gettext
import io
import json

import numpy as np

from ..i18n import DOMAIN, LOCALE, PLACEHOLDER, language, translate

MIME = "application/vnd.plotly.v1+json"
DIGITS = 4            # decimals kept in an explorer's numbers: enough to read, small to ship


def _go():
    import plotly.graph_objects as go      # imported on first use: grading never draws an explorer
    return go


def _t(label):
    """A reader-visible label of one word ("probability"): marked so that `make translations` extracts it (a
    string of two words or more is extracted without the mark); :func:`localize` translates it."""
    return label


def _r(x, digits=DIGITS):
    """A tensor or array as nested lists of rounded floats (what the page ships)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.round(np.asarray(x, dtype=float), digits).tolist()


class Explorer:
    """A Plotly figure with what a reader needs beside it: ``alt`` text and a ``hint``."""

    def __init__(self, name, fig, alt, hint):
        self.name, self.fig, self.alt, self.hint = name, fig, alt, hint

    def spec(self, lang=None):
        """The figure as Plotly JSON ({data, layout}), its strings in ``lang`` (default: the learner's)."""
        spec = json.loads(self.fig.to_json())
        spec["layout"]["meta"] = {"explorer": self.name, "alt": self.alt, "hint": self.hint}
        spec["layout"].pop("template", None)         # the page's style; 8 KB of defaults per figure otherwise
        return localize(spec, lang)

    def still_png(self, lang=None):
        return still(self.spec(lang))

    def _repr_mimebundle_(self, include=None, exclude=None):
        import plotly.io as pio
        spec = self.spec()
        fig = _go().Figure(spec)
        html = pio.to_html(fig, include_plotlyjs="cdn", full_html=False, config={"displaylogo": False})
        return {MIME: spec, "text/html": html, "image/png": base64.b64encode(still(spec)).decode(),
                "text/plain": f"{spec['layout']['meta']['alt']}\n{spec['layout']['meta']['hint']}"}

    def show(self):
        from IPython.display import display
        display(self)


# ---------------------------------------------------------------------------------------------------
# Translation: the strings a reader sees, never the data

_TEXT_KEYS = {"text", "name", "label", "prefix", "hovertemplate", "alt", "hint", "suffix"}


def _is_text(key, value):
    """Whether ``value`` is reader-visible text: under a text key, or under a dotted path that ends in one
    (a control's relayout step sets "title.text")."""
    return isinstance(value, str) and key.rsplit(".", 1)[-1] in _TEXT_KEYS


def localize(spec, lang=None):
    """``spec`` with its labels, titles, hints and hover texts in ``lang`` (the learner's language by
    default), translated by the learner package's catalogue; numbers and data arrays are untouched."""
    lang = lang or language()
    if lang == "en":
        return spec
    exact = _labels(lang)

    def text(v):        # a label of one word ("probability", "temperature T = ") is looked up as it is
        return exact.get(v) or translate(v, lang)

    def walk(node):
        if isinstance(node, dict):
            return {k: (text(v) if _is_text(k, v) else walk(v))
                    for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node
    return walk(spec)


@functools.lru_cache(maxsize=None)
def _labels(lang):
    """{English: translation} of the catalogue's entries without placeholders."""
    try:
        catalog = gettext.translation(DOMAIN, LOCALE, languages=[lang])._catalog
    except OSError:
        return {}
    return {k.replace("{{", "{").replace("}}", "}"): v.replace("{{", "{").replace("}}", "}")
            for k, v in catalog.items() if isinstance(k, str) and k and v and not PLACEHOLDER.search(k)}


def strings(spec):
    """Every label, title, hint and hover text of ``spec`` (what :func:`localize` translates)."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if _is_text(k, v):
                    found.append(v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(spec)
    return found


# ---------------------------------------------------------------------------------------------------
# The still image: the figure's first state, drawn by matplotlib (print, no JavaScript, GitHub)

def _axis(layout, axis):
    """Layout of a trace's axis ("x2" -> layout["xaxis2"])."""
    return layout.get(axis[0] + "axis" + axis[1:], {})


def _title(node):
    title = node.get("title", {})
    return title.get("text", "") if isinstance(title, dict) else str(title or "")


def still(spec, dpi=60):
    """PNG bytes of the figure as it first appears: heat maps, lines, markers and bars (vertical, horizontal,
    stacked) of every visible trace, one panel per pair of axes laid out as the figure places them (rows by
    the y domain, columns by the x domain), with the figure's title and axis titles."""
    import matplotlib
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    layout = spec["layout"]
    traces = [t for t in spec["data"] if t.get("visible", True) is True]
    panels = sorted({(t.get("xaxis", "x"), t.get("yaxis", "y")) for t in traces} or {("x", "y")},
                    key=lambda p: (-_axis(layout, p[1]).get("domain", [0, 1])[0], _axis(layout, p[0]).get("domain", [0, 1])[0]))
    rows = sorted({tuple(_axis(layout, y).get("domain", [0, 1])) for _, y in panels}, key=lambda d: -d[0])
    cols = max(sum(1 for _, y in panels if tuple(_axis(layout, y).get("domain", [0, 1])) == r) for r in rows)
    fig = matplotlib.figure.Figure(figsize=(min(4.2 * cols, 13), 3.2 * len(rows) + 0.4), dpi=dpi)
    FigureCanvasAgg(fig)
    placed = {}
    for xa, ya in panels:
        r = rows.index(tuple(_axis(layout, ya).get("domain", [0, 1])))
        c = placed.setdefault(r, 0)
        placed[r] += 1
        ax = fig.add_subplot(len(rows), cols, r * cols + c + 1)
        stacked = {}
        labelled = False
        for t in traces:
            if (t.get("xaxis", "x"), t.get("yaxis", "y")) != (xa, ya):
                continue
            kind = t.get("type", "scatter")
            if kind == "heatmap":
                z = np.asarray(t["z"], dtype=float)
                reversed_y = _axis(layout, ya).get("autorange") == "reversed"
                ax.imshow(z, aspect="auto", cmap="viridis", origin="upper" if reversed_y else "lower")
            elif kind == "bar":
                horizontal = t.get("orientation") == "h"
                values = np.asarray(t["x" if horizontal else "y"], dtype=float)
                where = [str(v) for v in t.get("y" if horizontal else "x", range(len(values)))]
                base = stacked.get(tuple(where), np.zeros(len(values))) if layout.get("barmode") in ("stack", "relative") else 0
                (ax.barh if horizontal else ax.bar)(where, values, **({"left": base} if horizontal else {"bottom": base}),
                                                    label=t.get("name"))
                if layout.get("barmode") in ("stack", "relative"):
                    stacked[tuple(where)] = base + values
                labelled |= bool(t.get("name")) and t.get("showlegend", True)
                if not horizontal:
                    ax.tick_params(axis="x", labelrotation=45)
            elif kind == "scatter":
                x = t.get("x", list(range(len(t.get("y", [])))))
                style = "o" if t.get("mode") == "markers" else "-"
                ax.plot(x, t.get("y", []), style, label=t.get("name"))
                labelled |= bool(t.get("name")) and t.get("showlegend", True)
        ax.set_xlabel(_title(_axis(layout, xa)))
        ax.set_ylabel(_title(_axis(layout, ya)))
        for axis, scale in ((xa, ax.set_xscale), (ya, ax.set_yscale)):
            if _axis(layout, axis).get("type") == "log":
                scale("log")
        if labelled:
            ax.legend(fontsize=7)
    fig.suptitle(_title(layout), fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close("all")
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------------
# Building blocks

def _slider(steps, prefix, active=0):
    """A Plotly slider over precomputed states: steps = [(label, method, args)]."""
    return dict(active=active, currentvalue=dict(prefix=prefix), pad=dict(t=40),
                steps=[dict(label=label, method=method, args=args) for label, method, args in steps])


def _menu(buttons, active=0, x=0.0, y=1.18, name=""):
    """A Plotly drop-down over precomputed states: buttons = [(label, method, args)]; ``name`` labels it on the
    website (without one, the figure's title names it for screen readers)."""
    return dict(type="dropdown", active=active, x=x, y=y, xanchor="left", yanchor="top", showactive=True, name=name,
                buttons=[dict(label=label, method=method, args=args) for label, method, args in buttons])


def _layout(title, xtitle=None, ytitle=None, height=420, **extra):
    layout = dict(title=dict(text=title), height=height, margin=dict(l=60, r=20, t=80, b=60),
                  xaxis=dict(title=dict(text=xtitle or "")), yaxis=dict(title=dict(text=ytitle or "")))
    layout.update(extra)
    return layout


def _heatmap(z, x=None, y=None, hover="query %{y}<br>key %{x}<br>weight %{z:.3f}<extra></extra>", zmax=None, **kw):
    return _go().Heatmap(z=z, x=x, y=y, colorscale="Viridis", zmin=0, zmax=zmax, hovertemplate=hover, **kw)


def _softmax(x, temperature=1.0):
    z = np.asarray(x, dtype=float) / temperature
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------------------------
# The chapters' explorers, one module per chapter (attncourse.explore.temperature, ...)

from .ch00 import *  # noqa: E402,F401,F403
from .ch01 import *  # noqa: E402,F401,F403
from .ch02 import *  # noqa: E402,F401,F403
from .ch03 import *  # noqa: E402,F401,F403
from .ch04 import *  # noqa: E402,F401,F403
from .ch05 import *  # noqa: E402,F401,F403
from .ch06 import *  # noqa: E402,F401,F403
from .ch07 import *  # noqa: E402,F401,F403
from .ch08 import *  # noqa: E402,F401,F403
from .ch09 import *  # noqa: E402,F401,F403
