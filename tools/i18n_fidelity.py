"""Does a translated entry say what its English says?  Checked by machine for every entry.

A translation keeps, exactly: the numbers (a scale word may change: "1.3 million" is "130 万"), the formulas ($...$ and $$...$$), the inline code, the
link targets and the Markdown structure (heading level, list marker, table cells) of its English;
it is written in Chinese; and every glossary term of the English appears as the glossary's Chinese
term.  glossary.md is the authority on terms: its table rows are ``| English | 中文 | ... |``; the
Chinese column may give alternatives separated by " / ", a note in full-width parentheses （...） is
not part of the term, and a term in *italics* is also an everyday word (not checked).  Where an English word of the glossary is used in its everyday sense
("the key idea"), the translator says so in a translator comment on the entry:
``# not a glossary term: key``.
"""
import re
from collections import Counter
from pathlib import Path

from attncourse.i18n import PLACEHOLDER

ROOT = Path(__file__).resolve().parent.parent
WAIVER = "not a glossary term:"

_CODE = re.compile(r"(`+)(.+?)\1", re.S)
_DMATH = re.compile(r"\$\$(.+?)\$\$", re.S)
_IMATH = re.compile(r"(?<![\\$])\$(?!\$)(.+?)(?<![\\$])\$", re.S)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_URL = re.compile(r"(?<![(<])\bhttps?://[^\s)>\]]+")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
# A number with its scale word: "1.3 million" and "130 万" are the same number.
_EN_NUMBER = re.compile(r"(\d+(?:[.,]\d+)*)(?:([kKMBT])\b|\s*-?\s*(thousand|million|billion|trillion)\b)?")
_ZH_NUMBER = re.compile(r"(\d+(?:[.,]\d+)*)(?:([kKMBT])(?![A-Za-z])|\s*(万亿|亿|万|千|百万|十亿))?")
_SCALE = {"thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12, "k": 1e3, "K": 1e3, "M": 1e6,
          "B": 1e9, "T": 1e12, "千": 1e3, "万": 1e4, "百万": 1e6, "亿": 1e8, "十亿": 1e9, "万亿": 1e12}


_RANGE = re.compile(r"(\d+(?:\.\d+)?)(\s*(?:to|到|至|-|–|~)\s*\d+(?:\.\d+)?\s*-?\s*)"
                    r"(thousand|million|billion|trillion|万亿|亿|万|千|百万|十亿)")


def _numbers(pattern, text):
    """The numbers of ``text`` (outside code, math and links): values where they are plain numbers
    (so a scale word may differ between the languages), else the digits as written (2.13.0).  A
    range's scale word applies to both ends: "0.5 to 3.2 million" is "50 万到 320 万"."""
    text = _RANGE.sub(lambda m: f"{m.group(1)} {m.group(3)}{m.group(2)}{m.group(3)}", text)
    out = []
    for digits, suffix, word in pattern.findall(text):
        scale = suffix or word
        if re.fullmatch(r"\d{1,3}(?:,\d{3})*(?:\.\d+)?|\d+(?:\.\d+)?", digits):
            value = float(digits.replace(",", "")) * _SCALE.get(scale, 1)
            out.append(f"{value:.10g}")
        else:
            out.append(digits + (scale or ""))
    return out
_CJK = re.compile(r"[\u4e00-\u9fff]")


def _parts(text):
    """(code spans, formulas, link targets, the text with all three removed)."""
    code = [m.group(2).strip() for m in _CODE.finditer(text)]
    text = _CODE.sub(" ", text)
    math = [" ".join(m.group(1).split()) for m in _DMATH.finditer(text)]
    text = _DMATH.sub(" ", text)
    math += [" ".join(m.group(1).split()) for m in _IMATH.finditer(text)]
    text = _IMATH.sub(" ", text)
    links = _LINK.findall(text) + _URL.findall(text)
    text = _URL.sub(" ", _LINK.sub("] ", text))
    return code, math, links, text


def without_code_math_links(text):
    return _parts(text)[3]


def _structure(text):
    """What Markdown makes of the unit's first line: heading level, list marker, table cells."""
    first = text.lstrip("\n").split("\n")[0]
    m = re.match(r"^\s*(#{1,6}\s|[-*+]\s|\d+[.)]\s|>\s?)", first)
    marker = m.group(1).strip() if m else ""
    marker = re.sub(r"\d+", "N", marker)
    cells = len(re.findall(r"(?<!\\)\|", _CODE.sub("", first))) if first.lstrip().startswith("|") else 0
    return marker, cells


def _differ(what, en, zh):
    missing, extra = Counter(en) - Counter(zh), Counter(zh) - Counter(en)
    if not missing and not extra:
        return []
    said = []
    if missing:
        said.append("lacks " + ", ".join(repr(x) for x in missing))
    if extra:
        said.append("adds " + ", ".join(repr(x) for x in extra))
    return [f"{what} differ ({'; '.join(said)})"]


# ---------------------------------------------------------------------------------------------
# The glossary

def load_glossary(path=ROOT / "glossary.md"):
    """[(English term, compiled pattern, [accepted Chinese forms])] from glossary.md's tables."""
    terms = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.startswith("|") or re.match(r"^\|[\s:|-]+\|$", line):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        # a Chinese cell is Chinese, or a name kept in Latin letters (FlashAttention)
        if len(cells) < 2 or cells[0] in ("English", "#") or not (_CJK.search(cells[1]) or re.fullmatch(r"[A-Z]\w*", cells[1])):
            continue
        english = re.sub(r"\$[^$]*\$", "", re.sub(r"\([^)]*\)", "", cells[0])).strip()
        if "/" in english or not english or english.startswith("*"):   # *italic*: also an everyday word
            continue
        chinese = re.sub(r"（[^）]*）", "", cells[1])
        forms = [re.sub(r"\s+", "", f) for f in chinese.split(" / ") if f.strip()]
        terms.setdefault(english, (english, _term_pattern(english), forms))
    return list(terms.values())


def _term_pattern(term):
    words = re.split(r"[\s-]+", term)
    last = words[-1]
    if re.search(r"[^aeiou]y$", last):                     # query -> queries (but key -> keys)
        plural = re.escape(last[:-1]) + "(?:y|ies)"
    else:
        plural = re.escape(last) + "(?:s|es)?"
    body = r"[\s-]+".join([re.escape(w) for w in words[:-1]] + [plural])
    acronym = any(sum(ch.isupper() for ch in w) >= 2 for w in words)
    # A hyphen is a boundary that counts: "low-rank" does not use the term "rank".
    return re.compile(r"(?<![A-Za-z-])" + body + r"(?![A-Za-z-])", 0 if acronym else re.I)


_MD = None


def _emphasis(text):
    """How many bold and italic spans CommonMark renders in ``text`` (Sphinx's MyST parses the same way)."""
    global _MD
    if _MD is None:
        from markdown_it import MarkdownIt
        _MD = MarkdownIt("commonmark")
    html = _MD.render(text)
    return html.count("<strong>") + html.count("<em>")


def waived(entry):
    """Glossary terms the translator marked as used in their everyday sense in this entry."""
    out = set()
    for comment in (getattr(entry, "tcomment", None) or "").splitlines():
        if comment.strip().lower().startswith(WAIVER):
            out |= {t.strip().lower() for t in comment.strip()[len(WAIVER):].split(",") if t.strip()}
    return out


# ---------------------------------------------------------------------------------------------

def problems(en, zh, entry=None, glossary=None):
    """[what is wrong] with the translation ``zh`` of the English unit ``en``."""
    out = []
    en_code, en_math, en_links, en_text = _parts(en)
    zh_code, zh_math, zh_links, zh_text = _parts(zh)
    out += _differ("inline code", en_code, zh_code)
    out += _differ("formulas", en_math, zh_math)
    out += _differ("link targets", en_links, zh_links)
    out += _differ("numbers", _numbers(_EN_NUMBER, en_text), _numbers(_ZH_NUMBER, zh_text))
    if _structure(en) != _structure(zh):
        out.append(f"Markdown structure differs (English {_structure(en)}, Chinese {_structure(zh)})")
    if _emphasis(zh) < _emphasis(en):
        out.append("bold or italics that do not render (a ** or * beside full-width punctuation and a Chinese "
                   "character is not closed: put the English in parentheses outside the markers, **术语**（term）)")
    if _CJK.search(zh_text) and re.search(r"\bet al\b", zh_text):
        out.append("a citation's 'et al.' in Chinese is 等人 (Vaswani 等人，2017)")
    if len(re.findall(r"[A-Za-z]{2,}", en_text)) >= 4 and not _CJK.search(zh_text):
        out.append("not written in Chinese")
    if "\n" in zh.strip() and not zh.lstrip().startswith("|") and not _structure(zh)[0] \
            and _CJK.search(zh) and re.search(r"[\u4e00-\u9fff，。]\n\s*[\u4e00-\u9fff]", zh):
        out.append("a line break between Chinese characters (it shows as a space): join the lines")
    if glossary:
        skip = waived(entry) if entry is not None else set()
        exact = re.sub(r"\s+", "", zh_text + " " + " ".join(zh_code))
        flat = exact.lower()
        # Longest terms first, and a matched term hides its words from shorter ones: "rotary position
        # embedding" (旋转位置编码) does not also ask for "position embedding" (位置嵌入).
        for english, pattern, forms in sorted(glossary, key=lambda g: -len(g[0])):
            if not pattern.search(en_text):
                continue
            en_text = pattern.sub(lambda m: "#" * len(m.group()), en_text)
            if english.lower() in skip:
                continue
            # a form with capitals is a name, written as the glossary writes it (FlashAttention, not flash attention)
            if not any((f in exact) if f != f.lower() else (f in flat) for f in forms):
                out.append(f"glossary term {english!r} is not translated as {' / '.join(forms)!r} "
                           f"(or mark it `# {WAIVER} {english}`)")
    return out




def message_problems(en, zh):
    """[what is wrong] with the translation ``zh`` of the message template ``en``: the same
    ``{placeholders}`` (the values the code formats in), inline code and numbers, and Chinese text."""
    if zh == en:          # kept as it is on purpose: code, a name, a test's input text
        return []
    out = _differ("placeholders", PLACEHOLDER.findall(en), PLACEHOLDER.findall(zh))
    en_rest, zh_rest = PLACEHOLDER.sub(" ", en), PLACEHOLDER.sub(" ", zh)
    out += _differ("inline code", _parts(en_rest)[0], _parts(zh_rest)[0])
    out += _differ("numbers", _numbers(_EN_NUMBER, _parts(en_rest)[3]), _numbers(_ZH_NUMBER, _parts(zh_rest)[3]))
    if len(re.findall(r"[A-Za-z]{2,}", _parts(en_rest)[3])) >= 4 and not _CJK.search(zh):
        out.append("not written in Chinese")
    return out
