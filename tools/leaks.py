"""Find graded reference code where learners can see it: site pages, downloads, release notebooks.

Marker strings ("BEGIN SOLUTION") only catch the careless case.  This compares *code*: every
graded reference body (the function or method a solution region delegates to, in every chapter)
is reduced to its tokens (comments, docstrings, layout and HTML markup gone), cut into runs of
``RUN`` tokens, and a document leaks a body when it contains at least half of the body's runs.
A body pasted with other spacing, comments or line breaks, or rendered into highlighted HTML, is
still found; one rewritten with other names is not (that is no longer the reference's text).
"""
import html
import io
import json
import re
import tokenize
from functools import lru_cache

import nbtools

RUN = 10
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d*)?(?:e-?\d+)?|\*\*|//|==|!=|<=|>=|->|[^\s\w]")
TEXT_SUFFIXES = {".html", ".ipynb", ".md", ".txt", ".js", ".json", ".py"}


def code_tokens(source):
    """Tokens of Python source without comments."""
    try:
        kept = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        kept = [source]
    return _TOKEN.findall(" ".join(kept))


def text_tokens(text):
    """Tokens of a page or a notebook file: tags and comments dropped, entities and JSON escapes undone."""
    text = re.sub(r"<[^>]+>", "", text)
    text = html.unescape(text).replace("\\n", "\n").replace('\\"', '"')
    return _TOKEN.findall(re.sub(r"#[^\n]*", "", text))           # comments (and CSS colours) out


def _runs(tokens):
    if len(tokens) <= RUN:
        return {tuple(tokens)}
    return {tuple(tokens[i:i + RUN]) for i in range(len(tokens) - RUN + 1)}


@lru_cache(maxsize=None)
def reference_bodies():
    """{(chapter, solution grade_id): set of token runs} for every graded reference body."""
    bodies = {}
    for chapter in nbtools.chapters():
        for cell in nbtools.read(nbtools.chapter_notebook(chapter)).cells:
            if not nbtools.is_solution(cell):
                continue
            region = cell.source.split(nbtools.BEGIN, 1)[1].split(nbtools.END, 1)[0]
            tokens = code_tokens(nbtools.function_body(nbtools.reference_object(region)))
            if len(tokens) >= 6:                        # `return x.tril()` alone proves nothing
                bodies[(chapter, nbtools.grade_info(cell)["grade_id"])] = _runs(tokens)
    return bodies


def leaked_bodies(text):
    """[(chapter, grade_id)] of the reference bodies that ``text`` carries."""
    runs = _runs(text_tokens(text))
    return [key for key, body in reference_bodies().items() if len(body & runs) * 2 >= len(body)]


def notebook_text(raw):
    """A notebook file's code and outputs as plain text (its JSON quoting would split the runs)."""
    try:
        nb = json.loads(raw)
    except ValueError:
        return raw
    parts = []
    for cell in nb.get("cells", []):
        parts.append("".join(cell.get("source", "")))
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            parts += ["".join(v) for k, v in out.get("data", {}).items() if k.startswith("text/")]
    return "\n".join(parts)


def scan(folder):
    """[(file, chapter, grade_id)] for every text file below ``folder`` that carries a reference body."""
    found = []
    for f in sorted(folder.rglob("*")):
        if f.is_file() and f.suffix in TEXT_SUFFIXES and "mathjax" not in f.parts:
            text = f.read_text(errors="ignore")
            found += [(f, ch, gid) for ch, gid in leaked_bodies(notebook_text(text) if f.suffix == ".ipynb" else text)]
    return found
