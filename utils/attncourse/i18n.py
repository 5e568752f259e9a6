"""The course's messages in the learner's language; English is the source and the default.

Every message is written once, in English, as the string or f-string of the code that says it
("inputs are {q.dtype} but you returned {out.dtype}: keep the inputs' dtype").  The catalogue of the
learner package's messages, ``locale/zh/LC_MESSAGES/attncourse.po`` (made by `make translations` from
the code, compiled to the ``.mo`` beside it and read with Python's gettext), translates each of them
with the same ``{placeholders}``.  A message is translated where it is shown: its English is matched
against the catalogue's patterns, and the values the code formatted into it (numbers, shapes, names)
are carried into the Chinese unchanged, so translators never format a value.

    import attncourse
    attncourse.set_language("zh")        # what the first cell of a Chinese notebook does

``ATTNCOURSE_LANGUAGE=zh`` in the environment does the same for a whole process.
"""
import functools
import gettext
import os
import re
from pathlib import Path

LOCALE = Path(__file__).resolve().parent / "locale"
DOMAIN = "attncourse"
LANGUAGES = ("en", "zh")
_state = {"language": os.environ.get("ATTNCOURSE_LANGUAGE", "en")}
PLACEHOLDER = re.compile(r"\{(?!\{)[^{}]*\}")   # a template's {expression}; {{ and }} are literal braces


def set_language(language):
    """Show the course's messages in ``language`` ("en" or "zh") from now on, in this process."""
    if language not in LANGUAGES:
        raise ValueError(f"the course speaks {' and '.join(LANGUAGES)}, not {language!r}")
    _state["language"] = language
    os.environ["ATTNCOURSE_LANGUAGE"] = language       # processes this one starts (ranks, the lab) follow


def language():
    lang = _state["language"]
    return lang if lang in LANGUAGES else "en"


@functools.lru_cache(maxsize=None)
def _patterns(lang):
    """[(first literal, [literals], [placeholders], translation, literal length)] of the catalogue."""
    try:
        catalog = gettext.translation(DOMAIN, LOCALE, languages=[lang])._catalog
    except OSError:
        return []
    out = []
    for english, translated in catalog.items():
        if not english or not isinstance(english, str) or not translated or translated == english:
            continue
        literals = [p.replace("{{", "{").replace("}}", "}") for p in PLACEHOLDER.split(english)]
        out.append((literals, PLACEHOLDER.findall(english), translated, sum(len(p) for p in literals)))
    return out


def _words(text):
    return len(re.findall(r"[A-Za-z]{2,}", text))


def translate(message, lang=None):
    """``message`` (English, as the code formatted it) in the current language; itself where the
    catalogue has no template for it."""
    lang = lang or language()
    if lang == "en" or not isinstance(message, str) or not message.strip():
        return message
    # A value that came out in Chinese leaves the template's space before a Chinese word: drop it.
    # and no space stands before full-width punctuation.
    return _BEFORE_PUNCTUATION.sub("", _CJK_SPACE.sub(r"\1", _translate(message, lang)[0]))


_CJK_SPACE = re.compile(r"([\u4e00-\u9fff）]) (?=[\u4e00-\u9fff（])")
_BEFORE_PUNCTUATION = re.compile(r"(?<=\S) +(?=[（），。：；？！])")


@functools.lru_cache(maxsize=4096)
def _translate(message, lang):
    """(translation, how many characters of ``message`` the catalogue explains)."""
    if message.strip() != message:          # keep the indentation and line ends where they were
        core = message.strip()
        start = message.index(core)
        done, score = _translate(core, lang)
        return message[:start] + done + message[start + len(core):], score
    best, best_score = message, (0 if _words(message) >= 2 else len(message))
    for literals, names, translated, literal_len in _patterns(lang):
        if literal_len <= best_score or not message.startswith(literals[0]) or not message.endswith(literals[-1]):
            continue
        for values in _parses(message, literals):
            done, score = {}, literal_len
            for name, value in zip(names, values):
                if _words(value) >= 2:        # a value that is itself a message: translated too
                    text, explained = _translate(value, lang)
                else:
                    text, explained = value, len(value)
                done.setdefault(name, text)
                score += explained
            if score > best_score:
                best_score = score
                best = PLACEHOLDER.sub(lambda p: done.get(p.group(), p.group()), translated) \
                    .replace("{{", "{").replace("}}", "}")
    if best_score < len(message):
        # Pieces joined by the code (a block of lines, "reason; more"): the parts, each on its own.
        for sep in ("\n", "; "):
            if sep in message:
                parts = [_translate(part, lang) for part in message.split(sep)]
                score = sum(s for _, s in parts) + len(sep) * (len(parts) - 1)
                if score > best_score and any(p != part for (p, _), part in zip(parts, message.split(sep))):
                    best, best_score = ("；" if sep == "; " else sep).join(p for p, _ in parts), score
                break
    return best, best_score


def _parses(message, literals, limit=64):
    """The ways ``message`` splits into the template's literals, with a value (maybe empty: an optional
    part such as {', causal' if causal else ''}) between each two."""
    found = []

    def walk(pos, i, values):
        if len(found) >= limit:
            return
        if i == len(literals) - 1:
            end = len(message) - len(literals[-1])
            if end >= pos and message.endswith(literals[-1]):
                found.append(values + [message[pos:end]])
            return
        at = message.find(literals[i], pos)
        while at != -1 and len(found) < limit:
            walk(at + len(literals[i]), i + 1, values + [message[pos:at]])
            at = message.find(literals[i], at + 1)

    if len(literals) == 1:
        return [[]] if message == literals[0] else []
    if message.startswith(literals[0]):
        walk(len(literals[0]), 1, [])
    return found
