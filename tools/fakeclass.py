"""A fake class for one chapter: submissions whose correct grades are known in advance.

    python tools/fakeclass.py ch02 --root /tmp/course     # writes release + submitted/<student>/ch02/

Used by tests/test_fake_class.py and tools/benchmark.py.  Students:
  correct       every solution cell filled in from the reference package (full marks)
  blank         the release untouched (zero)
  zoo-N         mistake-zoo variants (tests/zoo/<chapter>.py), packed so that each is still seen
                (``pack``): its own test cells lost by it alone, and each cascade once on its own
  cheat-*, loop, killer, warning: the generic attacks of ``generic_students``

Every student but ``correct`` and ``blank`` skips the chapter's demonstrations
(``without_demonstrations``): they differ from ``correct`` only in graded cells, which never depend on
a demonstration, and ``correct`` and ``blank`` still run every cell under grading.  This halves the
cost of a student (ch07: 7.9 s each in the class run with the demonstrations, 3.6 s without).  Tests that
grade a class for something else (the exchange, parallel and sharded grading) skip them for every student.
"""
import argparse
import importlib
import os
import re
import shutil
import symtable
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbtools  # noqa: E402
import nbformat  # noqa: E402
import setup_cell  # noqa: E402

sys.path.insert(0, str(nbtools.ROOT / "tests"))


def zoo(chapter):
    return importlib.import_module(f"zoo.{chapter}").VARIANTS


def reference_target(chapter, cell):
    """(the reference function or method the solution cell ``cell`` delegates to, its class or None)."""
    nb = nbtools.read(nbtools.chapter_notebook(chapter))
    source = next(c.source for c in nb.cells if nbtools.grade_info(c).get("grade_id") == cell)
    target = nbtools.reference_object(source.split(nbtools.BEGIN, 1)[1])
    owner = target.__qualname__.rpartition(".")[0]
    return target, (getattr(importlib.import_module(target.__module__), owner) if owner else None)


def candidate_for(chapter, variant):
    """The variant as the hidden tests see it: a function, or the reference class with one method replaced."""
    target, cls = reference_target(chapter, variant.cell)
    if cls is None:
        return variant.impl
    return type(cls.__name__, (cls,), {target.__name__: variant.impl})


def cells_tested(nb):
    """{solution grade_id: [test grade_ids that follow it before the next solution cell]}."""
    own, current = {}, None
    for c in nb.cells:
        if nbtools.is_solution(c):
            current = nbtools.grade_info(c)["grade_id"]
            own[current] = []
        elif nbtools.is_test(c) and current:
            own[current].append(nbtools.grade_info(c)["grade_id"])
    return own


def pack(variants, own):
    """Group variants into students so that each is still seen: within a group the cells differ, each variant's
    own test cells (``own``: cells_tested) are lost by it alone, and so is each cascade (a downstream test cell
    that a variant loses through another cell's use of its code) for one variant of that cell, its witness.  Other
    downstream losses may coincide: each variant's own cells and each cascade are still checked on their own."""
    witness = {}
    for v in variants:
        for t in sorted(v.loses - set(own[v.cell])):
            witness.setdefault((v.cell, t), v)

    def alone(v):
        """Test cells ``v`` must lose with no other variant of its group losing them."""
        return (set(own[v.cell]) & v.loses) | {t for (_, t), w in witness.items() if w is v}
    groups = []
    for v in variants:
        for g in groups:
            if all(v.cell != o.cell and not (alone(v) & o.loses) and not (alone(o) & v.loses) for o in g):
                g.append(v)
                break
        else:
            groups.append([v])
    return groups


class Student:
    def __init__(self, name, overrides=None, fails=(), note="", variants=()):
        self.name, self.overrides, self.fails, self.note = name, overrides or {}, set(fails), note
        self.variants = list(variants)      # the zoo's mistakes it pastes: what the class report must name


def generic_students(chapter, instructor):
    """Attacks that every chapter must withstand, written against the chapter's first exercises."""
    own = cells_tested(instructor)
    # Graded solution cells only: a paste cell (an earlier chapter's code, no tests of its own) is not attacked.
    sol = [nbtools.grade_info(c)["grade_id"] for c in instructor.cells if nbtools.is_solution(c)
           and own[nbtools.grade_info(c)["grade_id"]]]
    all_tests = set(nbtools.points(instructor))
    first, last = sol[0], sol[-1]
    first_src = next(c.source for c in instructor.cells if nbtools.grade_info(c).get("grade_id") == first)
    name = first_src.split("def ", 1)[1].split("(", 1)[0] if first_src.lstrip().startswith("def ") else None
    variants = zoo(chapter)
    downstream = cascade(instructor, variants, first)
    students = [
        Student("correct"),
        Student("blank", fails=all_tests, note="release untouched"),
        Student("cheat-import", {first: f"from attncourse_ref.{reference_module(first_src)} import {name}"},
                fails=downstream, note="imports the reference"),
        Student("cheat-sneaky", {last: sneaky_reference(instructor, last)}, fails=own[last],
                note="imports the reference around the guard and calls it"),
        Student("cheat-allclose", {first: PATCH_COMPARISONS + wrong_body(instructor, variants, first)}, fails=downstream,
                note="replaces torch/numpy comparison functions, wrong code",
                variants=[next(v for v in variants if v.cell == first)]),
        Student("loop", {last: loop_body(instructor, last)}, fails=own[last], note="infinite loop"),
        Student("killer", {last: kill_body(instructor, last)}, fails=own[last], note="kills its kernel"),
        Student("warning", {first: warn_body(instructor, first)}, note="correct code that warns"),
    ]
    return students


def cascade(instructor, variants, cell):
    """Test cells that fail when ``cell`` is broken: its own, and those of cells that use it (from the zoo)."""
    fails = set(cells_tested(instructor)[cell])
    for v in variants:
        if v.cell == cell:
            fails |= v.loses
    return fails


def reference_module(src):
    return src.split("from attncourse_ref.", 1)[1].split(" ", 1)[0]


def cell_source(nb, gid):
    return next(c.source for c in nb.cells if nbtools.grade_info(c).get("grade_id") == gid)


def with_prelude(nb, gid, prelude):
    """The reference solution of ``gid`` with ``prelude`` lines run at the start of each region."""
    src = cell_source(nb, gid)
    return nbtools.fill_regions(src, lambda region: prelude + "\n" + nbtools.function_body(nbtools.reference_object(region)))


# The cell timeout for a class that holds the "loop" student, which spins a core until then: a class without it
# keeps the default.  Chapter 02's and 04's cells take under 0.5 s under grading (the zygote has imported torch).
LOOP_CELL_TIMEOUT = "8"


def loop_body(nb, gid):
    return with_prelude(nb, gid, "while True:\n    pass")


def kill_body(nb, gid):
    return with_prelude(nb, gid, "import os\nos._exit(1)")


def warn_body(nb, gid):
    return with_prelude(nb, gid, "import warnings\nwarnings.warn('this is a harmless warning', UserWarning)")


def wrong_body(nb, variants, gid):
    """The first zoo variant for ``gid``, pasted in."""
    v = next(v for v in variants if v.cell == gid)     # (cheat-allclose's Student names the same one)
    src = cell_source(nb, gid)
    return nbtools.fill_regions(src, lambda region: nbtools.function_body(v.impl))


def sneaky_reference(nb, gid):
    """Pops the guard variable, imports the reference, hides it from sys.modules, then calls it."""
    src = cell_source(nb, gid)
    head = ("import importlib, os, sys\n"
            "os.environ.pop('ATTNCOURSE_GRADING_KERNEL', None)\n"
            f"_ref = importlib.import_module('attncourse_ref.{reference_module(src)}')\n"
            "for _m in [m for m in sys.modules if m.startswith('attncourse_ref')]:\n"
            "    del sys.modules[_m]\n")
    return head + nbtools.fill_regions(src, lambda region: re.sub(
        r"from attncourse_ref\.[\w.]+ import (\w+) as reference", r"reference = _ref.\1", region))


PATCH_COMPARISONS = """import numpy, torch
torch.allclose = lambda *a, **k: True
torch.equal = lambda *a, **k: True
torch.testing.assert_close = lambda *a, **k: None
numpy.allclose = lambda *a, **k: True
numpy.testing.assert_allclose = lambda *a, **k: None
"""


SKIPPED = "# (a demonstration, skipped in this fake student's notebook: no graded cell uses what it defines)\n"


def _names(source):
    """(names a cell's code binds at module level, module-level names it reads, in its own statements or
    in the functions and classes it defines), or None if it does not parse."""
    try:
        top = symtable.symtable("\n".join(line for line in source.splitlines()
                                          if not line.lstrip().startswith(("%", "!"))), "<cell>", "exec")
    except SyntaxError:
        return None
    binds = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    reads, tables = set(), [top]
    while tables:
        t = tables.pop()
        reads |= {s.get_name() for s in t.get_symbols()
                  if s.is_referenced() and (t is top or s.is_global() or s.is_declared_global())}
        tables += t.get_children()
    return binds, reads


def without_demonstrations(nb, instructor=None):
    """``nb`` with every ungraded code cell that binds no name a graded cell needs (directly or through
    the cells it needs) emptied: what a zoo student's grading must run, and nothing more.  Kept too: a
    cell that does not parse, the set-up cell and the Chinese edition's language cell."""
    nb = nbformat.from_dict(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    # A test cell's hidden tests are in the instructor's notebook only: read them there.
    tests = {nbtools.grade_info(c)["grade_id"]: c.source for c in (instructor or nb).cells if nbtools.is_test(c)}
    names = [_names(tests[nbtools.grade_info(c)["grade_id"]] if nbtools.is_test(c) else c.source) for c in code]
    keep = [nbtools.is_solution(c) or nbtools.is_test(c) or n is None or c.get("id") == setup_cell.CELL_ID
            or "set_language(" in c.source for c, n in zip(code, names)]
    changed = True
    while changed:           # a fixed point: a function may read a global that a later cell binds
        needed = set().union(*(n[1] for k, n in zip(keep, names) if k and n))
        changed = False
        for i, n in enumerate(names):
            if not keep[i] and n[0] & needed:
                keep[i] = changed = True
    for c, k in zip(code, keep):
        if not k:
            c.source, c.outputs = SKIPPED, []
    return nb


_GENERATED = {}     # {(chapter, its notebook's bytes): a folder with the release/ and gradebook.db nbgrader made}


def generate_assignment(chapter, root):
    """``nbgrader generate_assignment`` at ``root`` (release/<chapter>/ and the gradebook's record of its cells),
    run once per process and chapter notebook, then copied: it cost 4 s of CPU when this was written (1.1 s for
    chapter 04 on 3 December 2026, 0.9 s of it CPU), and a test process builds
    chapter 02's and chapter 04's classes several times.  A gradebook that holds more (another chapter's) or
    lives elsewhere (NBGRADER_DB_URL) is always written by nbgrader itself."""
    import atexit
    import tempfile
    key = (chapter, nbtools.chapter_notebook(chapter).read_bytes())
    fresh = not os.environ.get("NBGRADER_DB_URL") and not (root / "gradebook.db").exists()
    if fresh and key in _GENERATED:
        shutil.copytree(_GENERATED[key] / "release" / chapter, root / "release" / chapter, dirs_exist_ok=True)
        shutil.copy(_GENERATED[key] / "gradebook.db", root / "gradebook.db")
        return
    res = nbtools.nbgrader("generate_assignment", chapter, "--force", root=root)
    if res.returncode:
        raise RuntimeError(f"generate_assignment failed:\n{res.stdout}\n{res.stderr}")
    if fresh:
        made = _GENERATED[key] = Path(tempfile.mkdtemp(prefix=f"attncourse-release-{chapter}-"))
        atexit.register(shutil.rmtree, made, True)
        shutil.copytree(root / "release" / chapter, made / "release" / chapter)
        shutil.copy(root / "gradebook.db", made / "gradebook.db")


def build(chapter, root, language="en", only=None, demonstrations=("correct", "blank")):
    """Write release/ and submitted/ for the fake class under ``root``; return [Student].
    ``language="zh"``: the release is the Chinese edition (as `make release LANG=zh` makes it).
    ``demonstrations``: the students who run the chapter's demonstrations (True: every student, as real students
    do; ``()``: none, where a test grades a class for something else than the demonstrations, which every
    chapter's fake class runs).
    ``only``: the names of the students to make (default: the whole class)."""
    root = Path(root)
    (root / "chapters").mkdir(parents=True, exist_ok=True)
    shutil.copytree(nbtools.CHAPTERS / chapter, root / "chapters" / chapter, dirs_exist_ok=True)
    generate_assignment(chapter, root)
    name = nbtools.chapter_notebook(chapter).name
    instructor = nbtools.read(nbtools.chapter_notebook(chapter))
    release = nbtools.read(root / "release" / chapter / name)
    if language != "en":
        import i18n
        release = i18n.translate_notebook(release, chapter)
        nbtools.write(release, root / "release" / chapter / name)
    variants = zoo(chapter)
    students = generic_students(chapter, instructor)
    for i, group in enumerate(pack(variants, cells_tested(instructor))):
        students.append(Student(f"zoo-{i + 1:02d}", {v.cell: v.impl for v in group},
                                fails=set().union(*(v.loses for v in group)),
                                note="; ".join(v.name for v in group), variants=group))
    if only is not None:
        students = [s for s in students if s.name in only]
    for s in students:
        nb = release if s.name == "blank" else nbtools.solve(instructor, release, s.overrides)
        if demonstrations is not True and s.name not in demonstrations:
            nb = without_demonstrations(nb, instructor)
        nbtools.write(nb, root / "submitted" / s.name / chapter / name)
    return students


def expected_scores(chapter, students):
    pts = nbtools.points(nbtools.read(nbtools.chapter_notebook(chapter)))
    return {s.name: {gid: (0.0 if gid in s.fails else p) for gid, p in pts.items()} for s in students}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("chapter")
    ap.add_argument("--root", required=True)
    a = ap.parse_args()
    for s in build(a.chapter, a.root):
        print(f"{s.name:<14} loses {sorted(s.fails) or 'nothing'}  {s.note}")
