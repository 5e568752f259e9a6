"""The set-up cell at the top of every chapter notebook: python tools/setup_cell.py  (writes it where it differs)

Where the course's package ``attncourse`` is importable (a clone with `make env`, a course hub, the
grader, Binder) the cell does nothing.  Where it is not (Colab, a bare Jupyter), it installs the package
and what it declares from the course's repository: ``pip install "attncourse @ git+<URL>#subdirectory=utils"``.
The repository's URL is set in one place, ``repository: url:`` in ``_config.yml`` (the website's launch
buttons use it too); this tool writes it into the cell, and tests/test_package.py checks that every
chapter notebook holds exactly the cell this tool makes.

``ATTNCOURSE_INSTALL`` replaces what the cell installs (a wheel file, a fork's URL): the tests point it
at the wheel they built.  The cell is a plain code cell, graded by no one (no nbgrader metadata); the
Chinese edition's language cell comes right after it (tools/i18n.py), since it imports ``attncourse``.
"""
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
CELL_ID = "attncourse-setup"


def repository_url():
    """``repository: url:`` of _config.yml (read without a YAML library: the learner's cell needs none)."""
    text = (ROOT / "_config.yml").read_text(encoding="utf-8")
    block = re.search(r"^repository:\s*\n((?:[ \t]+.*\n?)+)", text, re.M)
    url = block and re.search(r"^\s+url:\s*\"?([^\s\"#]+)", block.group(1), re.M)
    if not url:
        raise SystemExit("_config.yml has no repository: url:")
    return url.group(1).rstrip("/")


def source(url=None):
    """The cell's code."""
    url = url or repository_url()
    return ("# Set-up: installs the course's package where it is missing (Colab, a bare Jupyter); does nothing elsewhere.\n"
            "import importlib, importlib.util, os, subprocess, sys\n"
            "if importlib.util.find_spec(\"attncourse\") is None:\n"
            f"    package = os.environ.get(\"ATTNCOURSE_INSTALL\", \"attncourse @ git+{url}#subdirectory=utils\")\n"
            "    subprocess.run([sys.executable, \"-m\", \"pip\", \"install\", \"-q\", package], check=True)\n"
            "    importlib.invalidate_caches()")


def with_setup_cell(nb, code=None):
    """``nb`` with the set-up cell before its first other code cell (replacing an older one); True if it changed."""
    code = code or source()
    cells = [c for c in nb.cells if c.get("id") == CELL_ID]
    if len(cells) == 1 and cells[0].source == code and nb.cells.index(cells[0]) == _first_code(nb, skip=None):
        return False
    nb.cells = [c for c in nb.cells if c.get("id") != CELL_ID]
    cell = nbformat.v4.new_code_cell(code)
    cell.id = CELL_ID
    nb.cells.insert(_first_code(nb), cell)
    return True


def _first_code(nb, skip=CELL_ID):
    return next((i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.get("id") != skip), len(nb.cells))


def main():
    code = source()
    for path in sorted((ROOT / "chapters").glob("ch*/*.ipynb")):
        # Read, change and write at once: other people edit these notebooks too.
        nb = nbformat.read(str(path), as_version=4)
        if with_setup_cell(nb, code):
            nbformat.write(nb, str(path))
            print(f"{path.relative_to(ROOT)}: set-up cell written")


if __name__ == "__main__":
    sys.exit(main())
