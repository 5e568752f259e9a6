"""Sphinx extension: two fixes to the pages Jupyter Book 1 writes, both found by
tools/browser_check.py (headless Chromium) as errors in every reader's console.

1. sphinx-thebe and sphinx-togglebutton register their inline configuration once per read of the
   sources, and Jupyter Book reads twice (once with filename None, once with ""), so every page
   declared `const THEBE_JS_URL` twice: a JavaScript SyntaxError.  Keep one copy of each script.
2. The theme's default colour mode is empty, so a first visit logged "Got invalid theme mode".
   Default to "auto" (follow the reader's system setting); the template reads `default_mode`.
"""


def _fix_page(app, pagename, templatename, context, doctree):
    context["default_mode"] = context.get("default_mode") or "auto"
    seen, kept = set(), []
    for script in context.get("script_files", []):
        key = (getattr(script, "filename", str(script)) or "", tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def setup(app):
    app.connect("html-page-context", _fix_page, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
