"""The Chinese edition: complete, current and faithful catalogues, and the mechanism that keeps them so.

Every catalogue in translations/zh/ must translate every text unit of its English source, with no
stale (fuzzy) entry, and every translation must keep its English's numbers, formulas, inline code,
link targets, Markdown structure and glossary terms (tools/i18n_fidelity.py).  A failure lists each
entry with its chapter and a snippet; `python tools/i18n.py status` prints the same list.
"""
import re
import shutil

import nbformat
import pytest

import i18n
import i18n_fidelity
import nbtools

GLOSSARY = i18n_fidelity.load_glossary()


@pytest.mark.parametrize("name", [s.name for s in i18n.sources()])
def test_catalogue_is_complete_current_and_faithful(name):
    problems = i18n.status(i18n.source(name), GLOSSARY)
    assert not problems, (f"{len(problems)} problem(s) in translations/zh/{name}.po (after an English edit: "
                          "`make translations`, then translate the entries listed):\n" + "\n".join(problems))


def test_units_rebuild_the_source_exactly():
    """Splitting into units and putting them back, translated by the identity, changes nothing."""
    for src in i18n.sources():
        if isinstance(src, i18n.Messages):
            continue
        for location, text in src.texts():
            assert "".join(u for u, _ in i18n.split_units(text)) == text, location
            assert i18n.translate_text(text, lambda k: k) == text, location


def test_code_math_and_tables_rules_are_not_translated():
    text = "# Title\n\nA paragraph with `code` and $x^2$.\n\n```python\nx = 1\n```\n\n$$\nE = mc^2\n$$\n\n" \
           "| name | size |\n| --- | --- |\n| one | two |\n\n- an item\n  continued\n- $y$\n"
    units = [(u.strip(), t) for u, t in i18n.split_units(text) if u.strip()]
    assert units == [("# Title", True), ("A paragraph with `code` and $x^2$.", True), ("```python\nx = 1\n```", False),
                     ("$$\nE = mc^2\n$$", False), ("| name | size |", True), ("| --- | --- |", False),
                     ("| one | two |", True), ("- an item\n  continued", True), ("- $y$", False)]


@pytest.mark.parametrize("zh, complaint", [
    ("有 **8** 个头，$D = 64$，见 `nn.Linear` 和 [第 02 章](../ch02/attention.ipynb)。", None),
    ("有 **9** 个头，$D = 64$，见 `nn.Linear` 和 [第 02 章](../ch02/attention.ipynb)。", "numbers differ"),
    ("有 **8** 个头，$D=128$，见 `nn.Linear` 和 [第 02 章](../ch02/attention.ipynb)。", "formulas differ"),
    ("有 **8** 个头，$D = 64$，见 `Linear` 和 [第 02 章](../ch02/attention.ipynb)。", "inline code differ"),
    ("有 **8** 个头，$D = 64$，见 `nn.Linear` 和 [第 02 章](attention.ipynb)。", "link targets differ"),
    ("- 有 **8** 个头，$D = 64$，见 `nn.Linear` 和 [第 02 章](../ch02/attention.ipynb)。", "Markdown structure"),
    ("There are **8** heads, $D = 64$, see `nn.Linear` and [chapter 02](../ch02/attention.ipynb).", "not written in Chinese"),
    ("有 **8** 个头，$D = 64$，\n见 `nn.Linear` 和 [第 02 章](../ch02/attention.ipynb)。", "line break"),
])
def test_fidelity_checks_catch_each_kind_of_drift(zh, complaint):
    en = "There are **8** heads, $D = 64$, see `nn.Linear` and [chapter 02](../ch02/attention.ipynb)."
    problems = i18n_fidelity.problems(en, zh)
    if complaint is None:
        assert problems == []
    else:
        assert any(complaint in p for p in problems), problems


def test_bold_that_would_not_render_is_caught():
    en = "**Sliding-window attention (滑动窗口注意力)** bounds it."
    assert i18n_fidelity.problems(en, "**滑动窗口注意力**（sliding-window attention）给它设了上限。") == []
    assert any("do not render" in p for p in
               i18n_fidelity.problems(en, "**滑动窗口注意力（sliding-window attention）**给它设了上限。"))


def test_a_citation_in_chinese_says_dengren():
    en = "The original Transformer (Vaswani et al., 2017) used $\\alpha = 0.6$."
    assert i18n_fidelity.problems(en, "原始 Transformer（Vaswani 等人，2017）使用 $\\alpha = 0.6$。") == []
    assert any("等人" in p for p in i18n_fidelity.problems(en, "原始 Transformer（Vaswani et al., 2017）使用 $\\alpha = 0.6$。"))


def test_a_glossary_name_with_capitals_is_written_as_the_glossary_writes_it():
    glossary = i18n_fidelity.load_glossary()
    en = "Chapter 03's flash attention never stores the weights."
    assert i18n_fidelity.problems(en, "第 03 章的 FlashAttention 从不保存权重。", glossary=glossary) == []
    assert any("FlashAttention" in p for p in
               i18n_fidelity.problems(en, "第 03 章的 flash attention 从不保存权重。", glossary=glossary))


def test_glossary_terms_are_checked_longest_first_and_can_be_waived():
    en = "Self-attention adds a rotary position embedding to each query and the keys."
    assert i18n_fidelity.problems(en, "自注意力给每个查询和所有键加上旋转位置编码。", glossary=GLOSSARY) == []
    problems = i18n_fidelity.problems(en, "自注意力给每个问题和所有键加上旋转位置编码。", glossary=GLOSSARY)
    assert len(problems) == 1 and "'query'" in problems[0] and "查询" in problems[0]
    everyday = "The key idea is simple."

    class Entry:
        tcomment = "not a glossary term: key"
    assert i18n_fidelity.problems(everyday, "核心想法很简单。", glossary=GLOSSARY) != []
    assert i18n_fidelity.problems(everyday, "核心想法很简单。", Entry(), glossary=GLOSSARY) == []


def test_glossary_terms_in_the_notebooks_parentheses_are_the_glossarys():
    """A key term's first use gives its Chinese in parentheses: that Chinese is the glossary's."""
    import re
    rows = [line.split(" | ") for line in (nbtools.ROOT / "glossary.md").read_text().splitlines() if line.startswith("| ")]
    known = {re.sub(r"\s+", "", part) for row in rows if len(row) > 1
             for part in re.split(r" / |（|）", row[1]) if part.strip()}
    wrong = []
    for chapter in nbtools.chapters():
        for cell in nbtools.read(nbtools.chapter_notebook(chapter)).cells:
            if cell.cell_type != "markdown":
                continue
            for term, zh in re.findall(r"\*\*([A-Za-z][\w\- ]*?) \(([\u4e00-\u9fff][^()*,]*)\)\*\*", cell.source):
                zh = re.sub(r"\s+", "", zh)     # a part of a term is fine: bidirectional (双向)
                if not any(zh in k for k in known):
                    wrong.append(f"{chapter}: **{term} ({zh})**")
    assert not wrong, "Chinese terms not in the glossary:\n" + "\n".join(wrong)


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A copy of chapter 02's notebook and catalogue that a test may edit."""
    monkeypatch.setattr(i18n, "CATALOGUES", tmp_path / "zh")
    nb_path = tmp_path / "ch02" / "attention.ipynb"
    nb_path.parent.mkdir()
    shutil.copy(nbtools.chapter_notebook("ch02"), nb_path)
    (tmp_path / "zh").mkdir()
    shutil.copy(i18n.ROOT / "translations" / "zh" / "ch02.po", tmp_path / "zh" / "ch02.po")
    src = i18n.Source("ch02", nb_path)
    monkeypatch.setattr(i18n, "source", lambda name: src)
    return src


def test_an_english_edit_marks_its_translation_stale_and_the_page_shows_the_english(scratch):
    nb = nbtools.read(scratch.path)
    cell = next(c for c in nb.cells if c.cell_type == "markdown" and "permutation" in c.source.lower()
                and len(c.source) > 300)
    old = next(u for u, t in i18n.split_units(cell.source) if t and len(u) > 120)
    new = old.rstrip("\n").rstrip(".") + ", as the next figure shows." + old[len(old.rstrip("\n")):]
    cell.source = cell.source.replace(old, new)
    nbformat.write(nb, str(scratch.path))
    assert i18n.status(scratch, GLOSSARY) != []                      # reported before any refresh...
    catalog = i18n.update(scratch)                                    # ...and after `make translations`:
    stale = [m for m in catalog if m.fuzzy]
    assert [m.msgid for m in stale] == [new.rstrip("\n")]             # the one changed unit is fuzzy,
    assert stale[0].msgstr and stale[0].previous_msgid == old.rstrip("\n")   # keeping its old translation
    problems = i18n.status(scratch, GLOSSARY)
    assert len(problems) == 1 and "stale" in problems[0] and "ch02" in problems[0] and "as the next figure" not in \
        problems[0][:40], problems
    page = i18n.translate_notebook(nb, "ch02")
    text = next(c.source for c, o in zip(page.cells, nb.cells) if o.source == cell.source)
    assert new.rstrip("\n") in text                                   # the Chinese page shows the new English
    assert stale[0].msgstr not in text                                # and not the outdated translation
    others = [u for u, t in i18n.split_units(cell.source) if t and u != new]
    assert others and all(u.rstrip("\n") not in text for u in others)  # the rest stays Chinese


def test_figure_descriptions_are_catalogued_and_translated():
    """A figure's alternative text (the code cell's ``mystnb.image.alt``) is a unit of its chapter's catalogue,
    and the Chinese notebook carries its translation; the code, outputs and other metadata stay."""
    nb = nbtools.read(nbtools.chapter_notebook("ch02"))
    described = [c for c in nb.cells if i18n.figure_alt(c)]
    assert len(described) >= 2
    units = dict(i18n.source("ch02").units())
    assert all(units[i18n.figure_alt(c)].endswith(f"#{c.id}:alt") for c in described)
    chinese = {c.id: c for c in i18n.translate_notebook(nb, "ch02").cells}
    for cell in described:
        zh = chinese[cell.id]
        assert zh.source == cell.source and zh.metadata["mystnb"]["image"]["alt"] == i18n.translations("ch02")[i18n.figure_alt(cell)]
        assert re.search(r"[\u4e00-\u9fff]", i18n.figure_alt(zh))
    assert i18n.figure_alt(described[0]) != i18n.figure_alt(chinese[described[0].id])   # the English stays untouched


def test_a_new_paragraph_is_missing_and_a_removed_one_goes(scratch):
    nb = nbtools.read(scratch.path)
    nb.cells.insert(3, nbformat.v4.new_markdown_cell("A brand new paragraph about heads."))
    nbformat.write(nb, str(scratch.path))
    assert any("missing" in p and "brand new" in p for p in i18n.status(scratch, GLOSSARY))
    catalog = i18n.update(scratch)
    assert any(m.msgid == "A brand new paragraph about heads." and not m.msgstr for m in catalog)


@pytest.mark.parametrize("text, says", [('msgid "x"\nmsgstr "y\n', "line 2 is not gettext syntax"),
                                         ('msgid "x"\nmsgstr "y" junk\n', "line 2 is not gettext syntax"),
                                         ('msgid "x"\nmsgstr "y"\n\nmsgid "x"\nmsgstr "z"\n', ".*two entries")])
def test_a_malformed_catalogue_is_a_clear_error(scratch, text, says):
    scratch.catalogue.write_text(text, encoding="utf-8")
    with pytest.raises(i18n.CatalogueError, match=r"ch02\.po: not a valid gettext catalogue: " + says):
        i18n.translations("ch02")
    assert i18n.main(["status", "ch02"]) == 2


def test_readme_zh_is_current():
    """README.zh.md is made from README.md and its catalogue by `make translations`."""
    assert (i18n.ROOT / "README.zh.md").read_text(encoding="utf-8") == i18n.readme_zh(), \
        "README.zh.md is out of date: run `make translations`"


def test_the_compiled_messages_are_current():
    """attncourse reads the .mo that `make translations` compiles from the messages' .po."""
    import gettext
    from attncourse import i18n as runtime
    po = i18n.read_catalogue(i18n.Messages().catalogue)
    compiled = gettext.translation(runtime.DOMAIN, runtime.LOCALE, languages=["zh"])._catalog
    wanted = {m.msgid: m.msgstr for m in po if m.msgstr and not m.fuzzy}
    assert {k: v for k, v in compiled.items() if k} == wanted, "the .mo is out of date: run `make translations`"


def test_messages_are_translated_with_their_values():
    from attncourse.i18n import translate
    english = "hidden test ch02.causal_mask: 2 of 10 randomized cases failed:\n  case 1 (n=7): returned value 0 " \
              "has dtype float32, expected bool\n  case 4 (n=3): returned value 0 has dtype float32, expected bool"
    chinese = translate(english, "zh")
    assert chinese != english and "ch02.causal_mask" in chinese and "float32" in chinese
    assert chinese.count("\n") == 2 and re.search(r"[\u4e00-\u9fff]", chinese.splitlines()[1])
    assert translate("a message no template knows, 42", "zh") == "a message no template knows, 42"
    assert translate(english, "en") == english


def test_a_chinese_release_has_the_same_cells_grade_ids_and_tests():
    english = nbtools.read(nbtools.chapter_notebook("ch04"))
    chinese = i18n.translate_notebook(english, "ch04")
    language = [i for i, c in enumerate(chinese.cells) if c.get("id") == "attncourse-language"]
    assert len(language) == 1 and 'set_language("zh")' in chinese.cells[language[0]].source
    assert chinese.cells[language[0]].metadata.get("nbgrader") is None       # graded by no one
    del chinese.cells[language[0]]
    assert [c.cell_type for c in chinese.cells] == [c.cell_type for c in english.cells]
    for en, zh in zip(english.cells, chinese.cells):
        assert en.metadata.get("nbgrader") == zh.metadata.get("nbgrader")
        assert {**en.metadata, "mystnb": None} == {**zh.metadata, "mystnb": None}   # only a figure's description differs
        if en.cell_type == "code":
            assert en.source == zh.source
    changed = [zh for en, zh in zip(english.cells, chinese.cells) if en.source != zh.source]
    assert changed and all(c.cell_type == "markdown" for c in changed)
    assert chinese.metadata["attncourse"]["language"] == "zh"


@pytest.mark.slow
def test_chinese_notebooks_are_graded_exactly_like_english_ones(tmp_path):
    """A fake class (reference, blank, mistake zoo) handed the Chinese release of chapter 04 gets the
    grades the English one gets."""
    import fakeclass
    from test_fake_class import cell_scores, grade_class
    students = [s for s in fakeclass.build("ch04", tmp_path, language="zh")
                if s.name in ("correct", "blank") or s.name.startswith("zoo-")]
    for d in (tmp_path / "submitted").iterdir():
        if d.name not in {s.name for s in students}:
            shutil.rmtree(d)
    submitted = nbtools.read(tmp_path / "submitted" / "correct" / "ch04" / "positional.ipynb")
    assert "位置编码" in submitted.cells[0].source
    report = grade_class("ch04", tmp_path)
    expected = fakeclass.expected_scores("ch04", students)
    got = cell_scores(tmp_path, "ch04", [s.name for s in students])
    assert got == expected, f"{got}\n{expected}\n{report}"
    # Feedback in the student's language: the checks and hidden tests spoke Chinese in their kernel.
    res = nbtools.nbgrader("generate_feedback", "ch04", "--force", root=tmp_path)
    assert res.returncode == 0, res.stderr
    correct = (tmp_path / "feedback" / "correct" / "ch04" / "positional.html").read_text()
    assert "个随机用例均已通过" in correct, "the hidden tests' summary is not in Chinese"
    zoo = next(s for s in students if s.name.startswith("zoo-"))
    import html
    feedback = html.unescape(re.sub(r"<[^>]+>", "", (tmp_path / "feedback" / zoo.name / "ch04" / "positional.html").read_text()))
    said = re.findall(r"CheckFailed: ([^\n]*)", feedback)
    assert said and all(re.search(r"[\u4e00-\u9fff]", s) for s in said), f"a diagnosis is not in Chinese: {said}"
    # ... and so does the page around them: nbgrader's labels (tools/templates/feedback_attncourse).
    page = (tmp_path / "feedback" / "correct" / "ch04" / "positional.html").read_text()
    assert '<html lang="zh">' in page and "（得分：" in page and "学生的答案" in page and "评分单元格：" in page, page[:2000]
    assert not re.search(r"\(Score: |Student's answer|Grade cell: |\(Top\)", page)


@pytest.mark.slow
def test_validate_speaks_the_notebooks_language(tmp_path):
    """`make validate` on a Chinese notebook: the report and the checks' messages in Chinese."""
    from test_validate import validate
    from zoo.ch02 import VARIANTS
    instructor = nbtools.read(nbtools.chapter_notebook("ch02"))
    release = i18n.translate_notebook(nbtools.strip_solutions(nbtools.strip_hidden_tests(instructor)), "ch02")
    wrong = next(v for v in VARIANTS if v.cell == "causal_mask")
    path = nbtools.write(nbtools.solve(instructor, release, {"causal_mask": wrong.impl}), tmp_path / "attention.ipynb")
    res = validate(path)
    lines = {line.split()[1]: line for line in res.stdout.splitlines() if line and line[0] in "\u2713\u2717\u00b7"}
    assert res.returncode == 1, res.stdout + res.stderr
    assert lines["test_causal_mask"].startswith("\u2717") and re.search(r"[\u4e00-\u9fff]{4}", lines["test_causal_mask"])
    assert wrong.says not in lines["test_causal_mask"], lines["test_causal_mask"]
    assert "可见检查" in res.stdout, res.stdout


def test_no_message_template_has_braces_inside_a_placeholder():
    """A placeholder such as {sorted({...})} cannot be matched (i18n.PLACEHOLDER stops at the inner brace), so the
    message would reach a Chinese learner in English: the code computes such a value first and names it."""
    import polib
    nested = []
    for entry in polib.pofile(str(nbtools.ROOT / "utils/attncourse/locale/zh/LC_MESSAGES/attncourse.po")):
        depth = 0
        for ch in entry.msgid.replace("{{", "").replace("}}", ""):
            depth += (ch == "{") - (ch == "}")
            if depth > 1:
                nested.append(f"{entry.occurrences[:1]}: {entry.msgid[:80]}")
                break
    assert not nested, "\n".join(nested)
