"""Sphinx extension: two fixes to the pages Jupyter Book 1 writes, both found by
tools/browser_check.py (headless Chromium) as errors in every reader's console.

1. sphinx-thebe and sphinx-togglebutton register their inline configuration once per read of the
   sources, and Jupyter Book reads twice (once with filename None, once with ""), so every page
   declared `const THEBE_JS_URL` twice: a JavaScript SyntaxError.  Keep one copy of each script.
2. The theme's default colour mode is empty, so a first visit logged "Got invalid theme mode".
   Default to "auto" (follow the reader's system setting); the template reads `default_mode`.
3. axe-core (tools/browser_check.py) reports two of the theme's buttons as serious accessibility problems
   (label-content-name-mismatch): the search field is labelled "Search" but shows "Search Ctrl+K", and the
   colour-mode button's icons carry titles (Font Awesome turns them into SVG <title>s) that count as text
   outside its label.  The search field takes its name from its visible text, and the icons lose their
   titles and are hidden from assistive technology (the button keeps its label and tooltip).
"""
import re
from pathlib import Path

_SEARCH_FIELD = re.compile(r'(<button class="btn search-button-field[^"]*"[^>]*?) aria-label="[^"]*"')
_THEME_ICON = re.compile(r'<i class="theme-switch fa-solid [^>]*>')


def _quiet_icon(match):
    tag = re.sub(r'\s+title="[^"]*"', "", match.group())
    return tag if "aria-hidden" in tag else tag.replace("<i ", '<i aria-hidden="true" ', 1)


def _fix_page(app, pagename, templatename, context, doctree):
    context["default_mode"] = context.get("default_mode") or "auto"
    seen, kept = set(), []
    for script in context.get("script_files", []):
        key = (getattr(script, "filename", str(script)) or "", tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def _fix_accessibility(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    for page in Path(app.outdir).rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        fixed = _THEME_ICON.sub(_quiet_icon, _SEARCH_FIELD.sub(r"\1", text))
        if fixed != text:
            page.write_text(fixed, encoding="utf-8")


def setup(app):
    app.connect("html-page-context", _fix_page, priority=900)
    app.connect("build-finished", _fix_accessibility)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
