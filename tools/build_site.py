"""Build the website: python tools/build_site.py  (what `make site` runs).

1. For every chapter, execute the instructor notebook with the reference solutions (hidden
   tests removed first), unless an executed copy for the same inputs is cached in
   _build/nbcache/ (the key hashes the notebook and the utils/ and solutions/ packages).
2. Strip the solutions from the executed copy, keeping its outputs, into site/<chapter>/.
3. Run Jupyter Book on the repository (execution off) into _build/html.
4. Refuse to publish if any page or copied source carries solution code or hidden tests: marker
   strings, and every graded reference body compared token by token (tools/leaks.py).
"""
import hashlib
import subprocess
import sys
import time
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import leaks  # noqa: E402
import nbtools  # noqa: E402

ROOT = nbtools.ROOT
CACHE = ROOT / "_build" / "nbcache"
SITE = ROOT / "site"
HTML = ROOT / "_build" / "html"
# Strings that must never reach the published site.
LEAKS = ["BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "attncourse_ref", "attncourse.autograde"]


def inputs_hash(nb_path):
    h = hashlib.sha256(nb_path.read_bytes())
    for pkg in (ROOT / "utils" / "attncourse", ROOT / "solutions" / "attncourse_ref"):
        for f in sorted(pkg.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(str(f.relative_to(ROOT)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def execute(chapter):
    """The executed instructor notebook (solutions in, hidden tests out), from cache if possible."""
    src = nbtools.chapter_notebook(chapter)
    cached = CACHE / chapter / f"{inputs_hash(src)}.ipynb"
    if cached.exists():
        print(f"{chapter}: unchanged, using {cached.relative_to(ROOT)}")
        return nbtools.read(cached)
    nb = nbtools.strip_hidden_tests(nbtools.read(src))
    t0 = time.perf_counter()
    nbtools.execute(nb, src.parent)
    errors = [(i, o.ename, o.evalue) for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"]
    if errors:
        i, name, value = errors[0]
        raise SystemExit(f"{chapter}: the reference run raised {name} in cell {i}: {value}\n"
                         "The site shows the reference's outputs, so this must be fixed first.")
    print(f"{chapter}: executed in {time.perf_counter() - t0:.1f} s")
    for old in (CACHE / chapter).glob("*.ipynb") if (CACHE / chapter).exists() else []:
        old.unlink()
    nbtools.write(nb, cached)
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


def main():
    for chapter in nbtools.chapters():
        nb = without_widgets(nbtools.strip_solutions(execute(chapter)))
        nbtools.write(nb, SITE / chapter / nbtools.chapter_notebook(chapter).name)
    found = check_no_leaks(SITE)
    if found:
        raise SystemExit("solution text would be published: " + "; ".join(f"{f}: {s!r}" for f, s in found))
    book = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(ROOT), "--keep-going"]
    res = subprocess.run(book, cwd=ROOT, capture_output=True, text=True)
    log = res.stdout + res.stderr
    (ROOT / "_build").mkdir(exist_ok=True)
    (ROOT / "_build" / "jupyter-book.log").write_text(log)
    if res.returncode or not (HTML / "index.html").exists():
        print(log[-4000:])
        raise SystemExit("jupyter-book build failed (full log: _build/jupyter-book.log)")
    found = check_no_leaks(HTML)
    if found:
        raise SystemExit("the built site carries solution text: " + "; ".join(f"{f}: {s!r}" for f, s in found[:5]))
    warnings = [line for line in log.splitlines() if "WARNING" in line]
    for w in warnings[:20]:
        print(w)
    print(f"\nThe website is in {HTML}. Open {HTML / 'index.html'} in a browser.")


if __name__ == "__main__":
    main()
