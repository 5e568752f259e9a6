"""Sphinx extension: every page of the English site links to the same page of the Chinese one and back.

The English site is _build/html/, the Chinese one _build/html/zh/ (tools/build_site.py builds both
from the same sources; the Chinese book sets ``course_language = "zh"``).  The link is a plain
``<a>`` under the book's title in the left sidebar, and a ``<link rel="alternate" hreflang>`` in the
page's head for search engines.
"""
from pathlib import Path

# language -> (its name, in itself; the folder of its site under the English site's root)
LANGUAGES = {"en": ("English", "", "en"), "zh": ("中文", "zh/", "zh-CN")}
SWITCH = {"en": "阅读中文版", "zh": "Read in English"}


def other_language_url(pagename, here):
    """The URL, relative to page ``pagename`` of the ``here`` site, of the same page in the other language."""
    other = "zh" if here == "en" else "en"
    to_english_root = "../" * pagename.count("/") + ("../" if here == "zh" else "")
    return other, f"{to_english_root}{LANGUAGES[other][1]}{pagename}.html"


def _page_context(app, pagename, templatename, context, doctree):
    here = app.config.course_language
    other, url = other_language_url(pagename, here)
    context["other_language"] = {"url": url, "label": SWITCH[here], "hreflang": LANGUAGES[other][2]}
    context["metatags"] = context.get("metatags", "") + \
        f'\n<link rel="alternate" hreflang="{LANGUAGES[other][2]}" href="{url}" />'


def _add_sidebar(app, config):
    config.templates_path.append(str(Path(__file__).parent / "templates"))
    if not config.html_sidebars:
        config.html_sidebars = {"**": ["navbar-logo.html", "language-switch.html", "icon-links.html",
                                       "search-button-field.html", "sbt-sidebar-nav.html"]}


def setup(app):
    app.add_config_value("course_language", "en", "html")
    app.connect("config-inited", _add_sidebar)
    app.connect("html-page-context", _page_context)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
