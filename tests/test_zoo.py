"""The mistake zoo against the hidden tests and the visible checks, for every chapter."""
import contextlib
import functools
import importlib
import io
import re

import pytest
import torch

import nbtools
from attncourse.autograde import run_hidden_test
from attncourse.checks import CheckFailed
from attncourse.i18n import set_language, translate
from conftest import CHAPTERS
from fakeclass import candidate_for, cells_tested, reference_target, zoo  # noqa: F401 (tests import both from here)


def _zoo_params():
    for ch in CHAPTERS:
        for v in zoo(ch):
            yield pytest.param(ch, v, id=f"{ch}-{v.name}")


@pytest.mark.parametrize("chapter, variant", list(_zoo_params()))
def test_hidden_tests_fail_exactly_the_declared_cells(chapter, variant):
    own = cells_tested(nbtools.read(nbtools.chapter_notebook(chapter)))[variant.cell]
    assert set(own) & variant.fails, f"{variant.name} must fail at least one test of its own cell {own}"
    candidate = candidate_for(chapter, variant)
    for test_cell in own:
        verdict = run_hidden_test(f"{chapter}.{test_cell.removeprefix('test_')}", candidate)
        if test_cell in variant.fails:
            assert verdict["failures"], f"hidden test {test_cell} passed the wrong variant '{variant.name}'"
        elif test_cell in variant.check_only:
            assert not verdict["failures"], f"'{variant.name}' is lost by {test_cell}'s visible check alone, yet its " \
                                            f"hidden test fails: {verdict['failures'][:1]}"
        else:
            assert not verdict["failures"], f"'{variant.name}' should pass {test_cell}: {verdict['failures'][:1]}"


def _check_message(chapter, variant, language):
    checks = importlib.import_module(f"attncourse.checks.{chapter}")
    set_language(language)
    try:
        with pytest.raises(CheckFailed) as err, contextlib.redirect_stdout(io.StringIO()):
            getattr(checks, variant.check)(candidate_for(chapter, variant))
    finally:
        set_language("en")
    return str(err.value)


@pytest.mark.parametrize("chapter, variant", list(_zoo_params()))
def test_visible_check_names_the_mistake(chapter, variant):
    """In English, the message contains the variant's phrase; in Chinese (a Chinese notebook's kernel),
    it is the catalogue's translation of that same message, values and all."""
    english = _check_message(chapter, variant, "en")
    assert variant.says in english, f"the message should name the mistake: {english}"
    chinese = _check_message(chapter, variant, "zh")
    assert chinese == translate(english, "zh"), (english, chinese)
    assert chinese != english and re.search(r"[\u4e00-\u9fff]", chinese), \
        f"no Chinese for this message (make translations, then translate utils/attncourse/locale): {english}"
    assert not english_left_in(chinese), f"English left in the Chinese message: {english_left_in(chinese)}: {chinese}"


# What may stay in Latin letters inside a Chinese message: names, and the glossary's terms kept in English.
NAMES = {"hugging face", "python", "pytorch", "log-sum-exp", "rotate half", "fairseq", "nat", "nats"}


@functools.lru_cache(maxsize=1)
def _latin_terms():
    """Names and the glossary's English terms, longest first."""
    from i18n_fidelity import load_glossary
    return sorted({e.lower() for e, _, _ in load_glossary()} | NAMES, key=len, reverse=True)


def english_left_in(chinese):
    """Runs of two or more English words in ``chinese`` outside code, values and names: what a Chinese learner
    would read in English.  Left out: `code`, quoted strings, anything in brackets or parentheses (calls,
    shapes, lists; none with Chinese inside), PyTorch's own exception text (after 'Error:'), names and the glossary's English terms."""
    text = re.sub(r"(?s)\b\w*(Error|Exception)[:：].*?(?=[。；]|$)", " ", chinese)     # PyTorch's own words
    text = re.sub(r"`[^`]*`|'[^']*'|\"[^\"]*\"", " ", text)
    for _ in range(3):                                                              # nested brackets
        text = re.sub(r"\([^()（）\u4e00-\u9fff]*\)|\[[^\[\]\u4e00-\u9fff]*\]", " ", text)   # code, not prose
    text = re.sub(r"\S*[_.=<>/+*]\S*", " ", text)                                # code-ish tokens
    for term in _latin_terms():
        text = re.sub(r"(?i)(?<![A-Za-z])" + re.escape(term) + r"s?(?![A-Za-z])", " ", text)
    # formulas keep their names (mean, eps, sin a cos b) in Latin letters: a phrase needs English's small words
    runs = [run for run in re.findall(r"[A-Za-z]{2,}(?:[ ,-]+[A-Za-z]{2,})+", text)
            if set(run.lower().replace(",", " ").split()) & SMALL_WORDS]
    return runs + re.findall(r"(?<![A-Za-z])(?:function|class)(?![A-Za-z])", text)    # a kind formatted in


SMALL_WORDS = {"the", "an", "of", "to", "is", "are", "in", "on", "with", "for", "and", "not", "be", "must", "should",
               "your", "by", "at", "from", "as", "this", "that", "it", "its", "than", "got", "expected", "instead",
               "function", "class", "tokens", "step", "short", "list", "random", "weights", "idx"}


def test_english_left_in_a_chinese_message_is_found():
    garbled = "始终不生成 eos 的序列必须在 max_len = 9 tokens (8 个词元后停止: one step short)；期望 [[2, 4]]"
    assert english_left_in("请传入你的 function softmax 本身") == ["function"]
    assert english_left_in("用例 1 GPT(vocab_size=11) with a random GPT-2's weights on idx [2, 3]") != []
    assert "one step short" in english_left_in(garbled)
    assert english_left_in("抛出了 RuntimeError: The size of tensor a (3) must match。请转置 `k.transpose(-2, -1)`") == []


def test_every_graded_component_has_a_zoo(chapter):
    nb = nbtools.read(nbtools.chapter_notebook(chapter))
    covered = {v.cell for v in zoo(chapter)}
    missing = [gid for gid, tests in cells_tested(nb).items() if tests and gid not in covered]   # paste cells have no tests
    assert not missing, f"solution cells without known-wrong variants: {missing}"


class _ModuleReturningNone(torch.nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, *args, **kwargs):
        return None


# Wrong kinds of code a struggling learner hands a check, beyond the zoo's plausible mistakes.
PROBES = {"not callable": 42, "returns None": lambda *a, **k: None, "raises": lambda *a, **k: 1 / 0,
          "returns a string": lambda *a, **k: "x", "a module returning None": _ModuleReturningNone}


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_check_answers_wrong_kinds_of_code_in_chinese(chapter):
    """Every visible check, handed each probe in a Chinese notebook, fails with a message (not a traceback)
    written in Chinese, with no English left in it."""
    import inspect
    checks = importlib.import_module(f"attncourse.checks.{chapter}")
    wrong = []
    for name, check in inspect.getmembers(checks, inspect.isfunction):
        if not name.startswith("check_") or check.__module__ != checks.__name__:
            continue
        for probe, code in PROBES.items():
            set_language("zh")
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    check(code)
            except CheckFailed as exc:
                said = str(exc)
                if not re.search(r"[\u4e00-\u9fff]", said) or english_left_in(said):
                    wrong.append(f"{name}, {probe}: {english_left_in(said)}: {said[:200]}")
            except Exception as exc:                                     # noqa: BLE001 - a traceback is the bug
                wrong.append(f"{name}, {probe}: {type(exc).__name__}: {exc}")
            finally:
                set_language("en")
    assert not wrong, "\n".join(wrong)
