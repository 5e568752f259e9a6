"""Notebook transformations shared by the site build, the class grader, the fake class and the tests."""
import ast
import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
from nbgrader.preprocessors import ClearHiddenTests, ClearSolutions

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
_REF_IMPORT = re.compile(r"from (attncourse_ref\.[\w.]+) import (\w+) as reference")
_REF_METHOD = re.compile(r"reference\.(\w+)\(")
# ipykernel warns on every start that it runs over TCP without encryption (loopback ports only):
# the tools' users do not need that line once per chapter.
QUIET_KERNEL = ["--IPKernelApp.log_level=ERROR"]
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def share_cores(ways):
    """When ``ways`` processes run at once, give this one, and what it starts (kernels, graders), its share of the
    cores: cores // ways threads (at least one), unless OMP_NUM_THREADS is set already; alone, a process keeps
    torch's default of a thread per core.  Two notebooks on two cores with two OpenMP threads each spin against
    each other: the site's notebooks took 189 s so and 148 s with a thread each (ch08 70 s and 38 s)."""
    if os.environ.get("OMP_NUM_THREADS") or ways <= 1:
        return os.environ.get("OMP_NUM_THREADS")
    threads = max(1, (os.cpu_count() or 1) // max(1, ways))
    for name in THREAD_VARIABLES:
        os.environ.setdefault(name, str(threads))
    return str(threads)


def chapter_notebook(chapter):
    """The instructor notebook of a chapter: chapters/<chapter>/<one>.ipynb."""
    found = sorted((CHAPTERS / chapter).glob("*.ipynb"))
    if len(found) != 1:
        raise FileNotFoundError(f"expected exactly one notebook in {CHAPTERS / chapter}, found {len(found)}")
    return found[0]


def chapters():
    return sorted(p.name for p in CHAPTERS.iterdir() if p.is_dir() and list(p.glob("*.ipynb")))


def read(path):
    return nbformat.read(str(path), as_version=4)


def grade_info(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


def given_code(release_nb):
    """Sources of the code cells a release gives learners to run unchanged (not their solution cells)."""
    return {c.source for c in release_nb.cells if c.cell_type == "code" and not is_solution(c)}


def is_solution(cell):
    return bool(grade_info(cell).get("solution"))


def is_test(cell):
    info = grade_info(cell)
    return bool(info.get("grade")) and not info.get("solution")


def points(nb):
    """{grade_id: points} of the notebook's test cells, in notebook order."""
    return {grade_info(c)["grade_id"]: float(grade_info(c).get("points", 0)) for c in nb.cells if is_test(c)}


def strip_hidden_tests(nb):
    nb = nbformat.from_dict(nb)
    ClearHiddenTests().preprocess(nb, {})
    return nb


def strip_solutions(nb):
    """Replace solution regions by stubs; outputs stay (how the site shows expected results)."""
    nb = nbformat.from_dict(nb)
    ClearSolutions().preprocess(nb, {"language": "python"})
    return nb


def reference_object(region):
    """The reference function/method a solution region delegates to (`from X import Y as reference`)."""
    m = _REF_IMPORT.search(region)
    if not m:
        raise ValueError("solution region does not name its reference (`from attncourse_ref... import ... as reference`)")
    module = __import__(m.group(1), fromlist=[m.group(2)])
    obj = getattr(module, m.group(2))
    meth = _REF_METHOD.search(region)
    return getattr(obj, meth.group(1)) if meth else obj


def function_body(fn):
    """Source of a function's body without its docstring, dedented."""
    src = textwrap.dedent(inspect.getsource(fn))
    node = ast.parse(src).body[0]
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    lines = src.splitlines()
    return textwrap.dedent("\n".join(lines[body[0].lineno - 1: body[-1].end_lineno]))


def fill_regions(source, body_for):
    """Replace each solution region with ``body_for(region_text)``, keeping the region's indentation."""
    out, region, indent = [], None, ""
    for line in source.splitlines():
        if line.strip() == BEGIN:
            region, indent = [], line[: len(line) - len(line.lstrip())]
        elif line.strip() == END and region is not None:
            out.extend(textwrap.indent(body_for(textwrap.dedent("\n".join(region))), indent).splitlines())
            region = None
        elif region is not None:
            region.append(line)
        else:
            out.append(line)
    return "\n".join(out)


def solve(instructor_nb, release_nb, overrides=None):
    """A submission: the release notebook with every solution cell filled in from the reference,
    except grade_ids in ``overrides`` ({grade_id: function whose body to use, or a source string
    that replaces the whole cell})."""
    overrides = overrides or {}
    solutions = {grade_info(c)["grade_id"]: c.source for c in instructor_nb.cells if is_solution(c)}
    nb = nbformat.from_dict(release_nb)
    for cell in nb.cells:
        if not is_solution(cell):
            continue
        gid = grade_info(cell)["grade_id"]
        if isinstance(overrides.get(gid), str):
            cell.source = overrides[gid]
            continue
        impl = overrides.get(gid)
        cell.source = fill_regions(solutions[gid], lambda region: function_body(impl or reference_object(region)))
    return nb


def write(nb, path):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def nbgrader(*args, root):
    """Run ``nbgrader ARGS`` for the course at ``root`` with this repository's nbgrader_config.py.

    The environment's bin/ goes first on PATH: nbgrader runs ``alembic`` as a subprocess when
    it creates a gradebook.
    """
    bindir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    cmd = [str(bindir / "nbgrader"), *args, f"--CourseDirectory.root={root}"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)


def execute(nb, cwd, timeout=600, interrupt_on_timeout=False):
    """Execute ``nb`` in place in a fresh python3 kernel started in ``cwd``; errors stay in the outputs
    (with ``interrupt_on_timeout``, so does a cell that ran past ``timeout``, as under the grader).  A cell's
    printed text is one output per stream: a busy kernel may flush a print() half-way, and the page would show
    the two halves on two lines."""
    from nbclient import NotebookClient
    NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True, interrupt_on_timeout=interrupt_on_timeout,
                   extra_arguments=QUIET_KERNEL, resources={"metadata": {"path": str(cwd)}}, coalesce_streams=True).execute()
    return nb


def gradebook_url(root):
    """NBGRADER_DB_URL (e.g. PostgreSQL) if set, else the course's SQLite gradebook."""
    return os.environ.get("NBGRADER_DB_URL", f"sqlite:///{Path(root) / 'gradebook.db'}")
