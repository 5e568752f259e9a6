"""The built website: chapter pages with stubs and expected outputs, math, glossary, no solutions."""
import html as html_module
import os
import re
import subprocess
import sys

from pathlib import Path

import pytest

import nbtools

# One worker builds the site; the others grade fake classes meanwhile.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("site")]
HTML = nbtools.ROOT / "_build" / "html"


@pytest.fixture(scope="session")       # not "module": xdist may run other modules' tests in between,
def site():                             # and a module fixture would then build the site a second time
    # Seen in CI: two workers each ran a test of this module and built the site at the same time, every
    # notebook executed twice.  A lock makes the second wait and then find everything in the cache.
    res = build()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def build():
    from filelock import FileLock
    (nbtools.ROOT / "_build").mkdir(exist_ok=True)
    with FileLock(str(nbtools.ROOT / "_build" / "site.lock")):
        return subprocess.run([sys.executable, str(nbtools.ROOT / "tools" / "build_site.py")], cwd=nbtools.ROOT,
                              capture_output=True, text=True)


def toc_pages():
    return re.findall(r"file:\s*(site/\S+)", (nbtools.ROOT / "_toc.yml").read_text())


def test_every_chapter_page_shows_stubs_and_outputs(site):
    assert toc_pages(), "no chapter in _toc.yml"
    for page in toc_pages():
        html = (HTML / f"{page}.html").read_text()
        assert "NotImplementedError" in html, page
        assert html.count("<img") >= 1, f"{page}: no figure"
        assert "cell_output" in html, f"{page}: no outputs"


def test_chapter_02_shows_its_figures_and_checks(site):
    html = (HTML / "site" / "ch02" / "attention.html").read_text()
    assert html.count("<img") >= 2                      # saturation plot and the heat map
    assert "fixed case: weights and output match" in html  # the visible check ran with the reference
    assert "attends most to: animal" in html
    assert "sqrt" in html and "mathjax/tex-chtml.js" in html
    assert (HTML / "_static" / "mathjax" / "tex-chtml.js").exists()   # math renders offline


def test_no_solution_text_anywhere_on_the_site(site):
    import build_site
    assert build_site.check_no_leaks(HTML) == []
    text = re.sub(r"<[^>]+>", "", (HTML / "site" / "ch02" / "attention.html").read_text())
    for line in ["weights = torch.softmax(scores, dim=-1)", "self.qkv(x).split(self.d_head",
                 "self.kv_proj(context).split"]:
        assert line not in text, f"solution line on the site: {line}"


def test_landing_and_glossary_pages(site):
    index = (HTML / "intro.html").read_text()
    assert "Chapter map" in index and "Prerequisites" in index
    glossary = (HTML / "glossary.html").read_text()
    assert "自注意力" in glossary and "self-attention" in glossary
    assert 'href="site/ch02/attention.html' in glossary


def test_the_chinese_edition_mirrors_every_page_with_the_same_outputs(site):
    """_build/html/zh/ has every page of the English site, in Chinese, showing the English run's
    outputs (no notebook executed twice), and each page links to its twin in the other language."""
    pages = ["intro", "glossary"] + toc_pages()
    for page in pages:
        en, zh = (HTML / f"{page}.html").read_text(), (HTML / "zh" / f"{page}.html").read_text()
        assert 'lang="zh-CN"' in zh, page
        assert re.search(r"[\u4e00-\u9fff]{20}", re.sub(r"<[^>]+>", "", zh)), f"{page}: no Chinese text"
        depth = "../" * page.count("/")
        assert f'href="{depth}zh/{page}.html"' in en, f"{page}: no link to the Chinese page"
        assert f'href="{depth}../{page}.html"' in zh, f"{page}: no link back to the English page"
        if page.startswith("site/"):
            assert en.count("<img") == zh.count("<img"), page
            assert en.count("cell_output") == zh.count("cell_output"), page
    zh02 = (HTML / "zh" / "site" / "ch02" / "attention.html").read_text()
    assert "attends most to: animal" in zh02 and "缩放点积注意力" in zh02
    assert (HTML / "zh" / "_sources" / "site" / "ch02" / "attention.ipynb").exists()   # the download button


def test_every_chapter_page_launches_its_notebook_on_colab_and_binder(site):
    """Both editions' chapter pages link to Colab and Binder, opening the page's own notebook from the
    published site (the repository's branch and folder set in _config.yml): the student version, whose
    set-up cell installs attncourse; and the site carries the binder/ recipe Binder builds it with."""
    import yaml

    import setup_cell
    config = yaml.safe_load((nbtools.ROOT / "_config.yml").read_text())
    repo, buttons = config["repository"], config["launch_buttons"]
    github = repo["url"].removeprefix("https://github.com/")
    for page in [p for p in toc_pages() if p.startswith("site/")]:
        for edition in ("", "zh/"):
            notebook = f"{edition}{repo['path_to_book']}/{page}.ipynb"
            html = (HTML / f"{edition}{page}.html").read_text()
            colab = f"{buttons['colab_url']}/github/{github}/blob/{repo['branch']}/{notebook}"
            binder = f"{buttons['binderhub_url']}/v2/gh/{github}/{repo['branch']}?urlpath=tree/{notebook}"
            assert colab in html, f"{edition}{page}: no Colab button opening {notebook}"
            assert binder in html, f"{edition}{page}: no Binder button opening {notebook}"
            opened = nbtools.read(HTML / notebook)
            assert any(c.source == setup_cell.source() for c in opened.cells), f"{notebook}: no set-up cell"
            assert not any(nbtools.is_test(c) and "BEGIN HIDDEN TESTS" in c.source for c in opened.cells), notebook
    for f in ("requirements.txt", "postBuild"):
        assert (HTML / "binder" / f).read_text() == (nbtools.ROOT / "binder" / f).read_text()


def test_unchanged_chapters_are_not_executed_again(site):
    # An unchanged build executes no chapter and writes no chapter page again, in either edition, even right after
    # the fixture executed every chapter: a page is written from the executed notebook as the next build writes it
    # (the first rebuild after a fresh build took 24 s and read every page again; it takes 9 s, as later ones do).
    pages = sorted(HTML.glob("site/*/*.html")) + sorted(HTML.glob("zh/site/*/*.html"))
    before = {p: p.stat().st_mtime_ns for p in pages}
    res = build()
    assert res.returncode == 0
    assert "ch02: unchanged" in res.stdout
    assert "executed in" not in res.stdout
    rewritten = [str(p.relative_to(HTML)) for p in pages if p.stat().st_mtime_ns != before[p]]
    assert len(pages) >= 20 and not rewritten, f"pages written again by an unchanged build: {rewritten}"


def explorer_specs(page_html):
    """[(element id, Plotly JSON)] of the explorers on a built page."""
    import json
    found = re.findall(r'<figure class="attn-explorer" id="([^"]+)"[^>]*>.*?<script type="application/json" class="attn-spec">'
                       r'(.*?)</script>', page_html, flags=re.S)
    return [(i, json.loads(data.replace("<\\/", "</"))) for i, data in found]


def test_every_chapter_page_has_explorers_in_both_editions(site):
    """At least two explorers per chapter page, labelled in the page's language, drawn by the site's own
    plotly.js (no CDN), which only pages with an explorer load; explorer data at most 1 MB per page."""
    import plotly.offline
    assert (HTML / "_static" / "plotly.min.js").read_text() == plotly.offline.get_plotlyjs()
    assert (HTML / "_static" / "explorers.js").exists() and (HTML / "zh" / "_static" / "plotly.min.js").exists()
    total = 0
    for page in [p for p in toc_pages() if p.startswith("site/")]:
        en, zh = (HTML / f"{page}.html").read_text(), (HTML / "zh" / f"{page}.html").read_text()
        specs_en, specs_zh = explorer_specs(en), explorer_specs(zh)
        total += len(specs_en)
        assert len(specs_en) >= 2, f"{page}: {len(specs_en)} explorer(s)"
        assert [i for i, _ in specs_en] == [i for i, _ in specs_zh], page
        for (i, a), (_, b) in zip(specs_en, specs_zh):
            assert a["layout"]["meta"]["hint"] != b["layout"]["meta"]["hint"], f"{page} {i}: hint not in Chinese"
            assert re.search(r"[\u4e00-\u9fff]", b["layout"]["meta"]["alt"]), f"{page} {i}: alt text not in Chinese"
        for html in (en, zh):
            assert "_static/plotly.min.js" in html and "_static/explorers.js" in html, page
            assert "cdn.plot.ly" not in html and "require.js" not in html, page
            data = sum(len(d) for d in re.findall(r'class="attn-spec">(.*?)</script>', html, flags=re.S))
            stills = sum(len(d) for d in re.findall(r'src="data:image/png;base64,([^"]*)"', html))
            assert data + stills <= 1_000_000, f"{page}: {data + stills:,} bytes of explorer data"
    assert total >= 20
    assert "plotly.min.js" not in (HTML / "intro.html").read_text()       # loaded only where it is used


def test_every_figure_says_what_it_shows_in_both_editions(site):
    """Every image on a chapter page has alternative text that describes it (a sentence from the notebook
    cell's ``mystnb.image.alt``, not the file name myst-nb falls back to), in the page's language."""
    for page in [p for p in toc_pages() if p.startswith("site/")]:
        for lang, html in (("en", (HTML / f"{page}.html").read_text()), ("zh", (HTML / "zh" / f"{page}.html").read_text())):
            images = [i for i in re.findall(r"<img\b[^>]*>", html) if "logo" not in i]
            assert len(images) >= 2, f"{page} ({lang}): {len(images)} figure(s)"
            for tag in images:
                alt = html_module.unescape(re.search(r'alt="([^"]*)"', tag).group(1))
                long_enough = len(alt) >= (40 if lang == "en" else 12)          # Chinese says as much in fewer characters
                assert long_enough and not re.search(r"\.(png|jpe?g|svg)$", alt), f"{page} ({lang}): alt {alt!r}"
                if lang == "zh":
                    assert re.search(r"[\u4e00-\u9fff]", alt), f"{page}: alt text not in Chinese: {alt!r}"


def test_an_edit_to_the_prose_reuses_the_executed_outputs(site, tmp_path, monkeypatch):
    """The cache is keyed by the code: a changed paragraph or figure description shows at once, without
    executing the notebook again; a changed code cell is executed again."""
    import build_site
    nb = nbtools.read(nbtools.chapter_notebook("ch02"))
    prose = next(c for c in nb.cells if c.cell_type == "markdown")
    prose.source += "\n\nA sentence added by the test."
    edited = nbtools.write(nb, tmp_path / "attention.ipynb")
    monkeypatch.setattr(nbtools, "chapter_notebook", lambda chapter: edited)
    monkeypatch.setattr(nbtools, "execute", lambda *a, **k: pytest.fail("executed again after a prose edit"))
    out = build_site.execute("ch02")
    assert "A sentence added by the test." in next(c for c in out.cells if c.id == prose.id).source
    assert sum(len(c.outputs) for c in out.cells if c.cell_type == "code") > 10
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.source += "\n# a changed line"
    nbtools.write(nb, edited)
    with pytest.raises(pytest.fail.Exception, match="executed again"):
        build_site.execute("ch02")


EXPLORER_PAGE = """<!doctype html><html lang="en"><title>t</title><body>
<figure class="attn-explorer" id="alive" data-ready="1"><div class="attn-controls">
<input id="alive-k" type="range" min="0" max="4" value="0" aria-label="k"></div>
<div class="attn-plot"></div><svg class="main-svg"><text>k = 0</text></svg></figure>
<figure class="attn-explorer" id="dead" data-ready="1"><div class="attn-controls">
<input id="dead-k" type="range" min="0" max="4" value="0" aria-label="k"></div>
<div class="attn-plot"></div><svg class="main-svg"><text>fixed</text></svg></figure>
<script>const a = document.getElementById('alive-k');
a.addEventListener('input', () => setTimeout(() => {
  document.querySelector('#alive .main-svg').innerHTML = '<text>k = ' + a.value + '</text>'; }, 400));</script>
</body></html>"""


def test_the_explorer_check_names_a_control_that_changes_nothing(tmp_path):
    """The browser check can fail: of two explorers, the one whose control redraws nothing is named, mouse and
    keyboard, and the one that redraws late (0.4 s after the input) passes; axe-core names an image without
    alternative text."""
    import browser_check
    if browser_check.find_chromium() is None:
        pytest.skip("no Chromium installed (apt-get install chromium)")
    (tmp_path / "page.html").write_text(EXPLORER_PAGE)
    server = browser_check.serve(tmp_path)
    browser = browser_check.Browser(browser_check.find_chromium())
    try:
        browser.open(f"http://127.0.0.1:{server.server_address[1]}/page.html")
        problems, count = browser_check.explorers(browser, "page.html", keyboard=False)
        browser.evaluate("document.body.appendChild(document.createElement('img')); true")
        inaccessible = browser_check.accessibility(browser)
    finally:
        browser.close()
        server.shutdown()
    assert count == 2 and problems == ["explorer dead: moving dead-k did not change the figure"], problems
    assert [p for p in inaccessible if p.startswith("accessibility (critical): image-alt:")], inaccessible


def test_every_page_works_in_a_browser(site, tmp_path):
    """Headless Chromium opens every page: no JavaScript error, every image and formula renders,
    internal links resolve, searching a key term finds its chapter, axe-core finds no serious or critical
    accessibility problem, and every explorer is drawn and answers each of its controls (one per page by
    keyboard alone), in both editions (tools/browser_check.py).  Screenshots: tmp_path (before/after)."""
    import browser_check
    if browser_check.find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("no Chromium: .ci/run installs Debian's chromium package")
        pytest.skip("no Chromium installed (apt-get install chromium)")
    counts = {}
    failures = browser_check.check(HTML, screenshots=tmp_path, log=lambda line: None, counts=counts)
    assert failures == {}, "\n".join(f"{page}: {p}" for page, problems in failures.items() for p in problems)
    for mode in ("light", "dark", "zh"):
        assert (tmp_path / f"ch02-{mode}.png").stat().st_size > 10_000
    for page in [p for p in toc_pages() if p.startswith("site/")]:
        for edition in ("", "zh/"):
            built = len(explorer_specs((HTML / f"{edition}{page}.html").read_text()))
            assert counts[f"{edition}{page}.html"] == built >= 2, f"{edition}{page}: {counts.get(edition + page + '.html')} of {built} moved"
            name = f"{edition}{page}".replace("/", "_")
            assert (tmp_path / f"{name}-before.png").exists() and (tmp_path / f"{name}-after.png").exists()


def test_what_the_prose_says_about_a_run_is_what_the_run_printed(site):
    """tests/claims.py: each sentence that reports a result is checked against the executed page."""
    import claims
    wrong = []
    for chapter, chapter_claims in claims.CLAIMS.items():
        nb = nbtools.read(nbtools.ROOT / "site" / chapter / nbtools.chapter_notebook(chapter).name)
        prose = claims.normalise(" ".join(c.source for c in nb.cells if c.cell_type == "markdown"))
        for claim in chapter_claims:
            if claims.normalise(claim.says) not in prose:
                wrong.append(f"{chapter}: the text no longer says {claim.says!r}: update tests/claims.py")
                continue
            cell = next((c for c in nb.cells if c.cell_type == "code" and claim.cell in c.source), None)
            out = "" if cell is None else "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
            try:
                holds = bool(out) and claim.holds(out)
            except (StopIteration, IndexError, ValueError):
                holds = False
            if not holds:
                wrong.append(f"{chapter}: the run no longer backs {claim.says!r}; its output:\n{out[-1500:]}")
    assert not wrong, "\n\n".join(wrong)


@pytest.fixture(scope="session")
def public_tree(site, tmp_path_factory):
    import publish
    return publish.publish(tmp_path_factory.mktemp("published") / "public")


def test_the_public_tree_carries_no_answer(public_tree, tmp_path):
    """`make publish`: the site, the student notebooks in both languages, the learner package, the binder recipe,
    the README and the licences, and nothing an answer could be read from; and the check finds a pasted reference
    body, a solution region and a private file where they should not be."""
    import textwrap

    import publish
    out = public_tree
    assert sorted(p.name for p in out.iterdir()) == sorted(publish.FILES + publish.FOLDERS + ["notebooks", "site"])
    for page in toc_pages():
        chapter, name = page.split("/")[1:]
        for edition in ("", "zh/"):
            nb = nbtools.read(out / "notebooks" / edition / chapter / f"{name}.ipynb")
            assert any("NotImplementedError" in c.source for c in nb.cells), f"{edition}{chapter}: not a student version"
    assert (out / "site" / "index.html").exists() and (out / "utils" / "attncourse" / "explore" / "__init__.py").exists()
    assert publish.answers(out) == []
    # The check can fail: a copy of a reference body, a solution region and a course's salt, in a small tree.
    planted = tmp_path / "planted"
    (planted / "utils").mkdir(parents=True)
    body = nbtools.function_body(nbtools.reference_object(
        "from attncourse_ref.attention import scaled_dot_product_attention as reference"))
    (planted / "utils" / "helpers.py").write_text("def attend(q, k, v, mask=None):\n" + textwrap.indent(body, "    "))
    (planted / "notes.md").write_text("### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n")
    (planted / "grading_salt").write_text("abc\n")
    found = {}
    for f, what in publish.answers(planted):
        found.setdefault(str(f), []).append(what)
    assert "the reference body of ch02's sdpa" in found["utils/helpers.py"]
    assert "the marker '### BEGIN SOLUTION'" in found["notes.md"] and found["grading_salt"] == ["a private file or folder"]


def test_a_class_is_graded_from_the_public_tree_and_the_instructors_bundle_alone(public_tree, tmp_path):
    """An adopting instructor's course folder: a copy of the public tree with the instructors' bundle unpacked in
    it, and a Python environment whose learner package, reference and grading server are those two trees' (its
    other packages are reused from this one's); the development tree is not read.  The bundle checks against the
    public tree, notices a changed file, seals with age to a recipient's key only, and grades a class there."""
    import shutil
    import tarfile

    import bundle
    archive = bundle.build(public_tree, tmp_path / "dist")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert "solutions/attncourse_ref/grading/__main__.py" in names and "chapters/ch00/foundations.ipynb" in names
        assert not [n for n in names if n.startswith(("utils/", "site/", "notebooks/")) or "__pycache__" in n]
        course = tmp_path / "course"
        shutil.copytree(public_tree, course, ignore=shutil.ignore_patterns("site"))
        tar.extractall(course, filter="data")

    def run(*args, python=sys.executable, **kw):
        return subprocess.run([str(python), *map(str, args)], capture_output=True, text=True, **kw)
    res = run(course / "tools" / "bundle.py", "verify", "--public", course)
    assert res.returncode == 0 and "match" in res.stdout, res.stdout + res.stderr
    learner = course / "notebooks" / "ch00" / "foundations.ipynb"
    original = learner.read_bytes()
    learner.write_bytes(original.replace(b"NotImplementedError", b"NotImplementedError ", 1))
    res = run(course / "tools" / "bundle.py", "verify", "--public", course)
    assert res.returncode == 1 and "notebooks/ch00/foundations.ipynb: differs" in res.stdout, res.stdout
    learner.write_bytes(original)

    if shutil.which("age"):
        key = tmp_path / "instructor.key"
        subprocess.run(["age-keygen", "-o", str(key)], check=True, capture_output=True)
        recipient = [line.split(": ")[1] for line in key.read_text().splitlines() if "public key" in line][0]
        (tmp_path / "recipients.txt").write_text(recipient + "\n")
        sealed = bundle.build(public_tree, tmp_path / "sealed", recipients=tmp_path / "recipients.txt")
        assert sealed.suffix == ".age" and [p.name for p in sealed.parent.iterdir()] == [sealed.name]
        opened = subprocess.run(["age", "--decrypt", "--identity", str(key), str(sealed)], capture_output=True)
        assert opened.returncode == 0 and opened.stdout[:2] == b"\x1f\x8b"        # the gzip archive
        assert b"attncourse_ref" not in sealed.read_bytes()

    # The new environment: this one's files hard-linked (no copy, no download; a linked file is never written
    # to), without the editable installs of this tree, with the course folder's packages on its path instead.
    env = tmp_path / "env"
    subprocess.run(["cp", "-al", sys.prefix, str(env)], check=True)
    python = env / "bin" / "python"
    site_packages = Path(run("-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", python=python)
                         .stdout.strip())
    for f in site_packages.glob("__editable__*"):
        f.unlink()
    (site_packages / "course.pth").write_text(f"{course / 'utils'}\n{course / 'solutions'}\n")
    for script in ("nbgrader", "alembic"):         # console scripts, on the new interpreter
        text = (env / "bin" / script).read_text().split("\n", 1)[1]
        (env / "bin" / script).unlink()
        (env / "bin" / script).write_text(f"#!{python}\n{text}")
        (env / "bin" / script).chmod(0o755)
    where = run("-I", "-c", "import attncourse, attncourse_ref.grading; print(attncourse.__file__); "
                "print(attncourse_ref.grading.__file__)", python=python, cwd=tmp_path)
    assert where.returncode == 0 and all(line.startswith(str(course)) for line in where.stdout.split()), where

    import fakeclass
    students = fakeclass.build("ch00", course, only={"correct", "blank", "zoo-01"})
    res = run(course / "tools" / "grade_class.py", "ch00", "--root", course, python=python, cwd=course,
              env=dict(os.environ, ATTNCOURSE_CELL_TIMEOUT="60"))
    assert res.returncode == 0, res.stdout + res.stderr
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        got = {s.name: {g.name: g.score for nb in gb.find_submission("ch00", s.name).notebooks for g in nb.grades}
               for s in students}
    assert got == fakeclass.expected_scores("ch00", students), res.stdout
    assert list((course / "verdicts" / "ch00").glob("*.jsonl")), "the course's own grading server recorded nothing"
