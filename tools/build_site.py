"""Build the website: python tools/build_site.py  (what `make site` runs).

1. For every chapter, execute the instructor notebook with the reference solutions (hidden
   tests removed first), unless an executed copy for the same inputs is cached in
   _build/nbcache/ (the key hashes the notebook's code cells and the utils/ and solutions/ packages:
   an edit to the prose reuses the outputs).  Two notebooks run at once where there are two cores
   ($SITE_JOBS sets how many).
2. Strip the solutions from the executed copy, keeping its outputs, into site/<chapter>/.
3. Run Jupyter Book on the repository (execution off) into _build/html.
4. The Chinese edition: translate the Markdown of those same executed copies and of the pages with
   the catalogues in translations/zh/ (tools/i18n.py) into _build/zh/, and build it into
   _build/html/zh/.  No notebook is executed twice: both languages show the same outputs.
5. Refuse to publish if any page or copied source carries solution code or hidden tests: marker
   strings, and every graded reference body compared token by token (tools/leaks.py).

Every generated file is written only when its content changed, so that Sphinx re-reads only what
changed and a rebuild with nothing changed is quick.
"""
import copy
import hashlib
import html
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import i18n  # noqa: E402
import leaks  # noqa: E402
import nbtools  # noqa: E402

ROOT = nbtools.ROOT
CACHE = ROOT / "_build" / "nbcache"
SITE = ROOT / "site"
HTML = ROOT / "_build" / "html"
ZH = ROOT / "_build" / "zh"            # the Chinese book's sources: translated copies (and its doctrees)
ZH_HTML = HTML / "zh"
# Strings that must never reach the published site.
LEAKS = ["BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "attncourse_ref", "attncourse.autograde"]


def inputs_hash(nb):
    """What the executed outputs depend on: the code cells (ids and sources) and the utils/ and solutions/
    packages.  Prose and metadata are not in it: editing them reuses the outputs (see ``execute``)."""
    h = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            h.update(json.dumps([cell.get("id"), cell.source]).encode())
    for pkg in (ROOT / "utils" / "attncourse", ROOT / "solutions" / "attncourse_ref"):
        for f in sorted(pkg.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(str(f.relative_to(ROOT)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def to_execute(chapter):
    """(the instructor notebook with its hidden tests removed, the path of its executed copy in the cache)."""
    nb = nbtools.strip_hidden_tests(nbtools.read(nbtools.chapter_notebook(chapter)))
    return nb, CACHE / chapter / f"{inputs_hash(nb)}.ipynb"


def execute(chapter):
    """The executed instructor notebook (solutions in, hidden tests out), from cache if possible: the cache
    holds the outputs of the same code, which are put into the current notebook, prose and metadata as now.
    A notebook just executed is returned the same way, from its cached copy, so that the next build (the same
    notebook from the cache) writes the same page and Sphinx has nothing to read again: the run's own cell
    metadata (nbclient's timings) stays in the cache."""
    src = nbtools.chapter_notebook(chapter)
    nb, cached = to_execute(chapter)
    if cached.exists():
        print(f"{chapter}: unchanged, using {cached.relative_to(ROOT)}")
    else:
        t0 = time.perf_counter()
        ran = nbtools.execute(copy.deepcopy(nb), src.parent)
        errors = [(i, o.ename, o.evalue) for i, c in enumerate(ran.cells) if c.cell_type == "code"
                  for o in c.outputs if o.output_type == "error"]
        if errors:
            i, name, value = errors[0]
            raise SystemExit(f"{chapter}: the reference run raised {name} in cell {i}: {value}\n"
                             "The site shows the reference's outputs, so this must be fixed first.")
        print(f"{chapter}: executed in {time.perf_counter() - t0:.1f} s")
        for old in (CACHE / chapter).glob("*.ipynb") if (CACHE / chapter).exists() else []:
            old.unlink()
        nbtools.write(ran, cached)
    outputs = {c.id: c for c in nbtools.read(cached).cells if c.cell_type == "code"}
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = outputs[cell.id].outputs, outputs[cell.id].execution_count
    return nb


def check_no_leaks(folder):
    """[(file, what)]: marker strings and graded reference bodies found below ``folder``."""
    found = []
    for f in folder.rglob("*"):
        if f.is_file() and f.suffix in leaks.TEXT_SUFFIXES and "mathjax" not in f.parts:
            text = f.read_text(errors="ignore")
            found += [(f, s) for s in LEAKS if s in text]
    found += [(f, f"the reference body of {ch}'s {gid}") for f, ch, gid in leaks.scan(folder)]
    return found


WIDGET = "application/vnd.jupyter.widget-view+json"


def without_widgets(nb):
    """A static page cannot run a widget (its script would come from a CDN and find no kernel):
    replace each widget's output with a line saying how to use it."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type == "code" and any(WIDGET in o.get("data", {}) for o in cell.outputs):
            cell.outputs = [o for o in cell.outputs if WIDGET not in o.get("data", {})]
            cell.outputs.append(nbformat.v4.new_output(
                "stream", name="stdout", text="[an interactive control: run this notebook in Jupyter to use it]\n"))
    return nb


def explorers_for_site(nb, lang="en"):
    """Each explorer's output (attncourse.explore's Plotly figure) as the page element the site draws with its
    own plotly.js (_ext/explorers.py): the figure's data with its labels in ``lang``, the hint as a caption and,
    for readers without JavaScript, the still image the notebook made with its alternative text."""
    from attncourse import explore
    nb = nbformat.from_dict(nb)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for i, out in enumerate(cell.outputs):
            spec = out.get("data", {}).get(explore.MIME)
            if spec is None:
                continue
            spec = explore.localize(dict(spec), lang)
            meta = spec["layout"]["meta"]
            data = json.dumps(spec, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
            still = out["data"].get("image/png", "")
            alt = html.escape(meta["alt"])
            # controls first (explorers.js fills them): from the figure, Tab reaches them before the plot's own buttons
            figure = (f'<figure class="attn-explorer" id="explorer-{html.escape(meta["explorer"])}" aria-label="{alt}">'
                      f'<div class="attn-controls"></div><div class="attn-plot"></div>'
                      f'<figcaption>{html.escape(meta["hint"])}</figcaption>'
                      f'<script type="application/json" class="attn-spec">{data}</script>'
                      f'<noscript><img class="attn-still" src="data:image/png;base64,{still}" alt="{alt}"></noscript></figure>')
            cell.outputs[i] = nbformat.v4.new_output("display_data", data={"text/html": figure})
    return nb


def write_if_changed(path, text):
    path = Path(path)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def chinese_sources(site_notebooks):
    """Fill _build/zh/ with the Chinese book: translated pages and notebooks, its config and toc."""
    import yaml
    for name in ("intro", "glossary"):
        write_if_changed(ZH / f"{name}.md", i18n.translate_page(name))
    for chapter, (name, nb) in site_notebooks.items():
        zh = explorers_for_site(i18n.translate_notebook(nb, chapter), "zh")
        write_if_changed(ZH / "site" / chapter / name, nbformat.writes(zh) + "\n")
    strings = i18n.translated_book_strings()
    toc = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    toc = re.sub(r"(- caption:\s*)(.+)", lambda m: m.group(1) + strings.get(m.group(2).strip(), m.group(2)), toc)
    write_if_changed(ZH / "_toc.yml", toc)
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    config["title"] = strings.get(config["title"], config["title"])
    config["exclude_patterns"] = ["_build", ".doctrees", "*.txt"]
    config["sphinx"]["local_extensions"] = {k: str(ROOT / v) for k, v in config["sphinx"]["local_extensions"].items()}
    if config.get("repository"):      # the launch buttons open the Chinese notebooks, published under zh/
        config["repository"]["path_to_book"] = "/".join(p for p in ("zh", config["repository"].get("path_to_book", "").strip("/")) if p)
    config["sphinx"]["config"].update(
        language="zh_CN", course_language="zh",
        # jieba segments Chinese for the search index; the glossary's terms are words of its dictionary,
        # so that searching 位置编码 finds the pages that use the term, not only 位置 and 编码 apart.
        html_search_options={"dict": str(ZH / "search-terms.txt")})
    write_if_changed(ZH / "_config.yml", yaml.safe_dump(config, allow_unicode=True, sort_keys=False))
    write_if_changed(ZH / "search-terms.txt", search_dictionary())


def search_dictionary():
    """jieba's user dictionary: every Chinese term of the glossary that is a single word."""
    words = {f for _, _, forms in i18n.i18n_fidelity.load_glossary() for f in forms if re.fullmatch(r"[\u4e00-\u9fff]+", f)}
    return "".join(f"{w} 1000 n\n" for w in sorted(words))


def jupyter_book(source, out, log_name, doctrees=None):
    """Build the book in ``source`` into ``out`` (execution off); the log goes to _build/<log_name>."""
    if doctrees is None:
        cmd = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(source), "--keep-going"]
    else:   # jupyter-book's own build, with an output folder of our choosing
        cmd = [sys.executable, "-c", "import sys; from jupyter_book.sphinx import build_sphinx; r = build_sphinx("
               "sys.argv[1], sys.argv[2], noconfig=True, path_config=sys.argv[1] + '/_config.yml', "
               "confoverrides={'external_toc_path': sys.argv[1] + '/_toc.yml', 'latex_individualpages': False}, "
               "doctreedir=sys.argv[3], "
               "keep_going=True, quiet=True); sys.exit(r if isinstance(r, int) else 1)",
               str(source), str(out), str(doctrees)]
    res = subprocess.run(cmd, cwd=source, capture_output=True, text=True)
    log = res.stdout + res.stderr
    (ROOT / "_build").mkdir(exist_ok=True)
    (ROOT / "_build" / log_name).write_text(log)
    if res.returncode or not (Path(out) / "index.html").exists():
        print(log[-4000:])
        raise SystemExit(f"jupyter-book build failed (full log: _build/{log_name})")
    return [line for line in log.splitlines() if "WARNING" in line]


def execute_all(chapters, jobs=None):
    """{chapter: executed notebook}, ``jobs`` notebooks at once ($SITE_JOBS, else up to 2 on a machine with 2
    cores or more: each kernel is one process, and one alone leaves the other core idle).  The later chapters,
    which train models, start first, so that the short ones fill in beside them."""
    jobs = jobs or int(os.environ.get("SITE_JOBS") or min(2, os.cpu_count() or 1))
    todo = [ch for ch in chapters if not to_execute(ch)[1].exists()]
    if jobs <= 1 or len(todo) <= 1:
        return {ch: execute(ch) for ch in chapters}
    from concurrent.futures import ProcessPoolExecutor
    nbtools.share_cores(min(jobs, len(todo)))          # the kernels' threads, before the pool starts them
    with ProcessPoolExecutor(min(jobs, len(todo))) as pool:
        running = {ch: pool.submit(execute, ch) for ch in sorted(todo, reverse=True)}
        return {ch: running[ch].result() if ch in running else execute(ch) for ch in chapters}


def main():
    site_notebooks = {}
    t0 = time.perf_counter()
    executed = execute_all(nbtools.chapters())
    print(f"notebooks ready in {time.perf_counter() - t0:.1f} s")
    for chapter in nbtools.chapters():
        nb = without_widgets(nbtools.strip_solutions(executed[chapter]))
        name = nbtools.chapter_notebook(chapter).name
        write_if_changed(SITE / chapter / name, nbformat.writes(explorers_for_site(nb)) + "\n")
        site_notebooks[chapter] = (name, nb)
    found = check_no_leaks(SITE)
    if found:
        raise SystemExit("solution text would be published: " + "; ".join(f"{f}: {s!r}" for f, s in found))
    t0 = time.perf_counter()
    warnings = jupyter_book(ROOT, HTML, "jupyter-book.log")
    print(f"English site built in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    chinese_sources(site_notebooks)
    warnings += jupyter_book(ZH, ZH_HTML, "jupyter-book-zh.log", doctrees=ZH / ".doctrees")
    print(f"Chinese site built in {time.perf_counter() - t0:.1f} s")
    # Binder builds the environment of the published site's notebooks from the site's own binder/ (see _config.yml).
    for f in sorted((ROOT / "binder").iterdir()):
        write_if_changed(HTML / "binder" / f.name, f.read_text(encoding="utf-8"))
        (HTML / "binder" / f.name).chmod(f.stat().st_mode)
    found = check_no_leaks(HTML)
    if found:
        raise SystemExit("the built site carries solution text: " + "; ".join(f"{f}: {s!r}" for f, s in found[:5]))
    for w in warnings[:20]:
        print(w)
    print(f"\nThe website is in {HTML}. Open {HTML / 'index.html'} in a browser "
          f"(the Chinese edition: {ZH_HTML / 'index.html'}).")


if __name__ == "__main__":
    main()
