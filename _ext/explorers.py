"""Sphinx extension: the course's explorers (attncourse.explore) drawn on the static site.

plotly.js comes from the plotly package itself (plotly.offline.get_plotlyjs), copied into the site's
_static/ once: no CDN, so the site works from a folder.  It and explorers.js (the keyboard-operable
controls) are added only to the pages that have an explorer; the browser caches them across pages.
"""
from pathlib import Path

STATIC = Path(__file__).resolve().parent / "static"


def _static_files(app):
    import plotly.offline
    out = Path(app.outdir) / "_static"
    out.mkdir(parents=True, exist_ok=True)
    target = out / "plotly.min.js"
    js = plotly.offline.get_plotlyjs()
    if not target.exists() or target.stat().st_size != len(js.encode()):
        target.write_text(js, encoding="utf-8")
    app.config.html_static_path.append(str(STATIC))


def _page(app, pagename, templatename, context, doctree):
    if "attn-explorer" in context.get("body", ""):
        app.add_js_file("plotly.min.js", priority=600, defer="defer")
        app.add_js_file("explorers.js", priority=601, defer="defer")
        app.add_css_file("explorers.css")


def setup(app):
    app.connect("builder-inited", _static_files)
    app.connect("html-page-context", _page)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
