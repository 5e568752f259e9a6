"""The Chinese edition: gettext catalogues of the English source, and the copies translated with them.

    python tools/i18n.py update [NAME...]  after an English edit: add new paragraphs, flag changed ones
                                           fuzzy (stale), drop removed ones; rewrites README.zh.md
    python tools/i18n.py status [NAME...]  what is missing, stale or unfaithful (what `make test` checks)
    python tools/i18n.py notebook IN OUT   translate a notebook's Markdown cells (e.g. a release notebook)

English is the source.  Every chapter notebook and page has one catalogue,
``translations/zh/<name>.po``: its entries are the text units of the Markdown (a paragraph, a
heading, a list item or a table row), never code, display math or outputs.  A translated copy
replaces each unit whose entry is translated and not fuzzy, and keeps the English of any other, so
a stale translation is never shown.  The learner package's messages have one more catalogue,
``utils/attncourse/locale/zh/LC_MESSAGES/attncourse.po`` (templates of the code's strings and
f-strings, see Messages), compiled to the .mo that attncourse.i18n reads.  Catalogues are read and
written with polib; a translator can use any gettext tool (Poedit, Weblate, ...).
"""
import argparse
import difflib
import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import polib

sys.path.insert(0, str(Path(__file__).resolve().parent))
import i18n_fidelity  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LANGUAGE = "zh"
CATALOGUES = ROOT / "translations" / LANGUAGE
README_SECTIONS_END = "## For instructors"   # README.zh.md: the README up to this heading


HEADER = """Chinese (zh_CN) translation of {path}: Attention and Transformers.
Made by `python tools/i18n.py update` from the English; translate the msgstr lines only.
A fuzzy entry is stale (its English changed): update the translation, then remove the flag.
Keep numbers, $formulas$, `code` and link targets exactly as in the English."""


class CatalogueError(Exception):
    """A catalogue that cannot be read: the message names the file and the line."""


# ---------------------------------------------------------------------------------------------
# Text units of a Markdown source

_FENCE = re.compile(r"^\s*(```+|~~~+)")
_LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d+[.)])\s+")
_TABLE_RULE = re.compile(r"^\s*\|[\s:|-]+\|\s*$")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s")


def _starts_block(line):
    s = line.strip()
    return (not s or bool(_FENCE.match(line)) or s.startswith("$$") or bool(_HEADING.match(line))
            or s.startswith("|") or bool(_LIST_ITEM.match(line)))


def split_units(text):
    """[(source, translatable)] whose sources, joined, give back ``text`` exactly.

    A unit is a heading, a paragraph, a list item (with its continuation lines), a table row, a
    fenced code block or a display-math block; code, math, table rules and blank lines are not
    translatable, nor is a unit with no words outside inline math and code."""
    lines = text.splitlines(keepends=True)
    units, i = [], 0
    while i < len(lines):
        line, s = lines[i], lines[i].strip()
        j = i + 1
        if not s:
            units.append((line, False))
            i = j
            continue
        fence = _FENCE.match(line)
        if fence:
            while j < len(lines) and not lines[j].strip().startswith(fence.group(1)):
                j += 1
            units.append(("".join(lines[i:j + 1]), False))
            i = j + 1
            continue
        if s.startswith("$$"):
            if not (len(s) >= 4 and s.endswith("$$")):
                while j < len(lines) and not lines[j].rstrip().endswith("$$"):
                    j += 1
                j += 1
            units.append(("".join(lines[i:j]), False))
            i = j
            continue
        if _HEADING.match(line) or s.startswith("|"):
            units.append((line, not _TABLE_RULE.match(line) and _has_words(line)))
            i = j
            continue
        item = _LIST_ITEM.match(line)
        while j < len(lines) and not _starts_block(lines[j]):
            j += 1
        if item:   # continuation lines of an item are indented; a nested item is a unit of its own
            while j < len(lines) and lines[j].strip() and not _starts_block(lines[j]):
                j += 1
        unit = "".join(lines[i:j])
        units.append((unit, _has_words(unit)))
        i = j
    return units


def _has_words(text):
    """Whether ``text`` has words to translate outside its inline code, math and link targets."""
    return bool(re.search(r"[A-Za-z]{2,}", i18n_fidelity.without_code_math_links(text)))


def _msgid(unit):
    """A unit's entry: its text without the final line break (which the copy keeps)."""
    return unit.rstrip("\n")


def translate_text(text, lookup):
    """``text`` with every translatable unit that ``lookup`` (msgid -> str or None) translates."""
    out = []
    for unit, translatable in split_units(text):
        key = _msgid(unit)
        new = lookup(key) if translatable else None
        out.append(new + unit[len(key):] if new else unit)
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# The sources: one catalogue per chapter notebook and per page

@dataclass
class Source:
    name: str            # the catalogue's name: translations/zh/<name>.po
    path: Path           # the English source

    @property
    def catalogue(self):
        return CATALOGUES / f"{self.name}.po"

    def texts(self):
        """[(location, Markdown text)] in source order."""
        if self.path.suffix == ".ipynb":
            nb = nbformat.read(str(self.path), as_version=4)
            texts = []
            for i, c in enumerate(nb.cells):
                where = f"{self.path.name}#{c.get('id', i)}"
                if c.cell_type == "markdown":
                    texts.append((where, c.source))
                elif figure_alt(c):
                    texts.append((where + ":alt", figure_alt(c)))
            return texts
        if self.name == "book":
            return [(p.name, t) for p, t in _book_strings()]
        text = self.path.read_text(encoding="utf-8")
        if self.name == "README":
            return [(self.path.name, text.split(README_SECTIONS_END)[0]), ("README.zh.md", README_NOTE)]
        return [(self.path.name, text)]

    def units(self):
        """[(msgid, location)] of the translatable units, each msgid once, in source order."""
        seen = {}
        for location, text in self.texts():
            for unit, translatable in split_units(text):
                if translatable:
                    seen.setdefault(_msgid(unit), location)
        return list(seen.items())


def figure_alt(cell):
    """The alternative text of a code cell's figure, which the site gives its image (myst-nb reads the
    cell's ``mystnb.image.alt``): a sentence that says what the figure shows, for readers who cannot see it."""
    return cell.get("metadata", {}).get("mystnb", {}).get("image", {}).get("alt", "")


def _book_strings():
    """The site's own strings: the book title in _config.yml and the table of contents' captions."""
    config, toc = ROOT / "_config.yml", ROOT / "_toc.yml"
    title = re.search(r'^title:\s*"?(.*?)"?\s*$', config.read_text(encoding="utf-8"), re.M).group(1)
    captions = re.findall(r"^\s*- caption:\s*(.+?)\s*$", toc.read_text(encoding="utf-8"), re.M)
    return [(config, title)] + [(toc, c) for c in captions]


class Messages(Source):
    """The learner package's messages: every string and f-string of the code that talks to learners (the
    visible checks, the hidden tests' client and summaries, `make validate`, the lab), as templates
    whose ``{placeholders}`` are the f-string's expressions: "inputs are {q.dtype} but ...".  Its
    catalogue lives in the package (attncourse.i18n reads the compiled .mo with gettext)."""
    FILES = ["utils/attncourse/checks/*.py", "utils/attncourse/autograde.py", "utils/attncourse/forbid.py",
             "utils/attncourse/lab/*.py", "utils/attncourse/explore/*.py",
             "utils/attncourse/validate.py", "utils/attncourse/cli.py", "solutions/attncourse_ref/grading/*.py",
             "tools/similarity.py", "tools/report.py"]

    def __init__(self):
        super().__init__("messages", ROOT / "utils" / "attncourse")

    @property
    def catalogue(self):
        return self.path / "locale" / LANGUAGE / "LC_MESSAGES" / "attncourse.po"

    def texts(self):
        raise TypeError("messages are templates, not Markdown")

    def units(self):
        seen = {}
        for pattern in self.FILES:
            for path in sorted(ROOT.glob(pattern)):
                cases = path.parent.name == "grading" and path.name.startswith("ch")
                # The instructors' tools say in Chinese only what they pass to translate().
                for template, line in message_templates(path.read_text(encoding="utf-8"), inputs=cases,
                                                        translated_only=path.parent.name == "tools"):
                    seen.setdefault(template, f"{path.relative_to(ROOT)}:{line}")
        return list(seen.items())


def message_templates(code, inputs=False, translated_only=False):
    """[(template, line)] of the strings and f-strings in ``code`` that read as messages (two words, or
    one word between placeholders), docstrings left out.  ``inputs``: ``code`` builds a hidden test's
    cases, so its plain strings in collections or passed to calls are the test's inputs, not
    messages, and are left out (they must not ship with the learner package).  ``translated_only``: only the
    strings ``code`` passes to ``translate(...)``."""
    import ast
    tree = ast.parse(code)
    skip = set()
    if inputs:
        for node in ast.walk(tree):
            if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
                skip |= {id(v) for v in node.elts if isinstance(v, ast.Constant)}
            elif isinstance(node, ast.Call):
                skip |= {id(v) for v in node.args if isinstance(v, ast.Constant)}
    marked = {id(node.args[0]) for node in ast.walk(tree) if isinstance(node, ast.Call) and node.args
              and isinstance(node.func, ast.Name) and node.func.id == "_t"}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            skip.add(id(node.body[0].value))
        if isinstance(node, ast.JoinedStr):
            skip |= {id(v) for v in ast.walk(node) if v is not node}
    passed = {id(node.args[0]) for node in ast.walk(tree) if isinstance(node, ast.Call) and node.args
              and isinstance(node.func, ast.Name) and node.func.id == "translate"}
    out = []
    for node in ast.walk(tree):
        if id(node) in skip or (translated_only and id(node) not in passed):
            continue
        if isinstance(node, ast.JoinedStr):
            template = "".join(_template_part(v) for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            template = node.value.replace("{", "{{").replace("}", "}}")
        else:
            continue
        literal = i18n_fidelity.PLACEHOLDER.sub(" ", template)
        words = len(re.findall(r"[A-Za-z]{2,}", literal))
        # two words, or one word between placeholders ("case {i} {describe}: {reason}", "{what} in {dtype}");
        # and a space outside the placeholders (a path such as "/proc/{pid}/status" is not a message);
        # or a label of one word that the code marks as one: _t("probability") (attncourse.explore)
        if ((words >= 2 or (words == 1 and "{" in template)) and " " in i18n_fidelity.PLACEHOLDER.sub("", template).strip()) \
                or (id(node) in marked and words >= 1):
            out.append((template, node.lineno))
    return sorted(out, key=lambda t: t[1])


def _template_part(value):
    import ast
    if isinstance(value, ast.Constant):
        return value.value.replace("{", "{{").replace("}", "}}")
    text = ast.unparse(value.value)
    if value.conversion != -1:
        text += "!" + chr(value.conversion)
    if value.format_spec is not None:
        text += ":" + "".join(_template_part(v) for v in value.format_spec.values)
    return "{" + text + "}"


def sources():
    chapters = sorted(p for p in (ROOT / "chapters").glob("ch*/*.ipynb"))
    pages = [Source("intro", ROOT / "intro.md"), Source("glossary", ROOT / "glossary.md"),
             Source("README", ROOT / "README.md"), Source("book", ROOT / "_toc.yml")]
    return [Source(p.parent.name, p) for p in chapters] + pages + [Messages()]


def source(name):
    for s in sources():
        if s.name == name:
            return s
    raise KeyError(f"no source called {name!r}; the catalogues are: {', '.join(s.name for s in sources())}")


# ---------------------------------------------------------------------------------------------
# Catalogues

_PO_LINE = re.compile(r'^(?:#.*|(?:msgctxt|msgid|msgid_plural|msgstr(?:\[\d+\])?)\s+"(?:[^"\\]|\\.)*"'
                      r'|"(?:[^"\\]|\\.)*"|#~.*)?\s*$')


def _where(path):
    path = Path(path)
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def read_catalogue(path):
    """The catalogue at ``path`` (an empty one if there is none), as a polib.POFile.  A malformed file
    raises CatalogueError naming the file and the line: a line that is not gettext syntax (an
    unterminated string, a stray word), or an English text given twice."""
    path = Path(path)
    if not path.exists():
        return _new_catalogue()
    problem = None
    try:
        text = path.read_text(encoding="utf-8")
        bad = next((i for i, line in enumerate(text.splitlines(), 1) if not _PO_LINE.match(line)), None)
        if bad is not None:
            problem = f"line {bad} is not gettext syntax: {text.splitlines()[bad - 1][:60]!r}"
        else:
            po = polib.pofile(text, wrapwidth=0)
            seen = set()
            for m in po:
                if m.msgid in seen:
                    problem = f"the English {_snippet(m.msgid, 50)} has two entries (line {m.linenum})"
                seen.add(m.msgid)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        problem = str(e)
    if problem:
        raise CatalogueError(f"{_where(path)}: not a valid gettext catalogue: {problem}. Fix it with a .po editor, "
                             "or restore it from git and run `python tools/i18n.py update`.")
    return po


def _new_catalogue():
    po = polib.POFile(wrapwidth=0)
    po.metadata = {"Project-Id-Version": "Attention and Transformers", "Language": "zh_CN",
                   "Language-Team": "Chinese (zh_CN)", "MIME-Version": "1.0",
                   "Content-Type": "text/plain; charset=utf-8", "Content-Transfer-Encoding": "8bit",
                   "Plural-Forms": "nplurals=1; plural=0;", "Last-Translator": "the course team",
                   "PO-Revision-Date": "2026-11-23 00:00+0000"}
    return po


def write_catalogue(po, path):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    po.wrapwidth = 0
    path.write_text(str(po), encoding="utf-8")


def update(src):
    """Bring ``src``'s catalogue up to date with the English: new units become empty entries, a changed
    unit keeps its old translation flagged fuzzy (with the previous English, as `#| msgid`), removed
    units go."""
    old = read_catalogue(src.catalogue)
    po = _new_catalogue()
    po.metadata.update({k: v for k, v in old.metadata.items()
                        if k in ("PO-Revision-Date", "Last-Translator") and "YEAR" not in v and "FULL NAME" not in v})
    po.header = HEADER.format(path=_where(src.path))
    translated = {m.msgid: m for m in old if m.msgid and not m.obsolete}
    for msgid, location in src.units():
        prev = translated.get(msgid)
        entry = polib.POEntry(msgid=msgid, msgstr=prev.msgstr if prev else "", occurrences=[(location, "")])
        if prev is not None:
            # Markdown, not format strings: only the fuzzy flag means anything here.
            entry.flags, entry.tcomment = [f for f in prev.flags if f == "fuzzy"], prev.tcomment
            entry.previous_msgid = prev.previous_msgid if prev.fuzzy else None
        po.append(entry)
    current = {m.msgid for m in po}
    _carry_changed(po, [m for m in translated.values() if m.msgid not in current and m.msgstr])
    write_catalogue(po, src.catalogue)
    if isinstance(src, Messages):
        po.save_as_mofile(str(src.catalogue.with_suffix(".mo")))   # what Python's gettext reads
    return po


def _carry_changed(po, gone):
    """Give each new (untranslated) entry the translation of the most similar removed entry, if one is
    similar enough, flagged fuzzy with the previous English: what msgmerge does."""
    for m in po:
        if m.msgstr or not gone:
            continue
        best = max(gone, key=lambda g: difflib.SequenceMatcher(None, g.msgid, m.msgid).ratio())
        if difflib.SequenceMatcher(None, best.msgid, m.msgid).ratio() >= 0.6:
            m.msgstr, m.previous_msgid, m.tcomment = best.msgstr, best.msgid, best.tcomment
            m.flags.append("fuzzy")
            gone.remove(best)


def translations(name):
    """{English unit: Chinese} of the entries that are translated and not stale."""
    return {m.msgid: m.msgstr for m in read_catalogue(source(name).catalogue)
            if m.msgid and m.msgstr and not m.fuzzy and not m.obsolete}


LANGUAGE_CELL = ('import attncourse\n'
                 f'attncourse.set_language("{LANGUAGE}")   # 中文版：可见检查、隐藏测试和反馈的信息都用中文显示')


def translate_notebook(nb, name):
    """A copy of ``nb`` with its Markdown cells and its figures' alternative text in Chinese (code cells and
    outputs untouched), and, before its first code cell (after the set-up cell), one cell that sets the
    course's messages to Chinese."""
    table = translations(name)
    nb = nbformat.from_dict(nb)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = translate_text(cell.source, table.get)
        elif figure_alt(cell):
            cell.metadata["mystnb"]["image"]["alt"] = translate_text(figure_alt(cell), table.get)
    if not any(c.get("id") == "attncourse-language" for c in nb.cells):
        # after the set-up cell (tools/setup_cell.py), which installs attncourse where it is missing
        first_code = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.get("id") != "attncourse-setup"),
                          len(nb.cells))
        cell = nbformat.v4.new_code_cell(LANGUAGE_CELL)
        cell.id = "attncourse-language"
        nb.cells.insert(first_code, cell)
    nb.metadata.setdefault("attncourse", {})["language"] = LANGUAGE   # the edition a submission was written in
    return nb


def translate_page(name):
    return translate_text(source(name).path.read_text(encoding="utf-8"), translations(name).get)


def translated_book_strings():
    table = translations("book")
    return {t: table.get(t, t) for _, t in _book_strings()}


def readme_zh():
    """README.zh.md: the README's sections for learners, in Chinese, with a pointer to the rest."""
    src = source("README")
    text = src.path.read_text(encoding="utf-8").split(README_SECTIONS_END)[0]
    note = translations("README").get(README_NOTE, README_NOTE)
    return translate_text(text, translations("README").get).rstrip("\n") + "\n\n" + note + "\n"


README_NOTE = ("The instructors' and maintainers' sections are in the English [README.md](README.md); "
               "the Chinese website is built by `make site` into `_build/html/zh/`.")


# ---------------------------------------------------------------------------------------------
# Status: missing, stale and unfaithful entries

def status(src, glossary=None):
    """[problem line] for ``src``: untranslated or stale units, and translations that differ from their
    English in numbers, formulas, inline code, link targets, Markdown structure or glossary terms."""
    catalog = read_catalogue(src.catalogue)
    entries = {m.msgid: m for m in catalog if m.msgid and not m.obsolete}
    out = []
    for msgid, location in src.units():
        m = entries.get(msgid)
        where = f"{src.name} ({location})"
        if m is None or not m.msgstr:
            out.append(f"{where}: missing: {_snippet(msgid)}")
        elif m.fuzzy:
            out.append(f"{where}: stale (the English changed): {_snippet(msgid)}")
        else:
            check = i18n_fidelity.message_problems if isinstance(src, Messages) else \
                functools.partial(i18n_fidelity.problems, entry=m, glossary=glossary)
            out += [f"{where}: {p}: {_snippet(msgid)}" for p in check(msgid, m.msgstr)]
    current = {u for u, _ in src.units()}
    out += [f"{src.name}: unused entry (run `python tools/i18n.py update`): {_snippet(k)}"
            for k in entries if k not in current]
    return out


def _snippet(text, n=70):
    text = " ".join(text.split())
    return repr(text if len(text) <= n else text[:n] + "...")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("update", help="refresh the catalogues from the English and rewrite README.zh.md")
    up.add_argument("names", nargs="*", help="catalogue names (default: all)")
    st = sub.add_parser("status", help="list missing, stale and unfaithful entries")
    st.add_argument("names", nargs="*", help="catalogue names (default: all)")
    nbp = sub.add_parser("notebook", help="translate a chapter notebook's Markdown cells")
    nbp.add_argument("input")
    nbp.add_argument("output")
    nbp.add_argument("--chapter", help="the chapter (default: the input's folder name)")
    args = parser.parse_args(argv)
    try:
        if args.command == "update":
            for src in [source(n) for n in args.names] or sources():
                cat = update(src)
                done = sum(1 for m in cat if m.msgstr and not m.fuzzy)
                total = len(cat)
                print(f"{src.catalogue.relative_to(ROOT)}: {done}/{total} translated")
            (ROOT / "README.zh.md").write_text(readme_zh(), encoding="utf-8")
            return 0
        if args.command == "status":
            glossary = i18n_fidelity.load_glossary()
            names = args.names or [s.name for s in sources()]
            found = [p for n in names for p in status(source(n), glossary)]
            for p in found:
                print(p)
            print(f"{len(found)} problem(s) in {len(names)} catalogue(s)")
            return 1 if found else 0
        if args.command == "notebook":
            path = Path(args.input)
            chapter = args.chapter or path.resolve().parent.name
            nbformat.write(translate_notebook(nbformat.read(str(path), as_version=4), chapter), args.output)
            return 0
    except (CatalogueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
