"""Structure of every chapter notebook: nbgrader metadata, solution regions, test cells, releases."""
import importlib
import pkgutil
import re


import nbtools
from attncourse_ref import grading


def _notebook(chapter):
    return nbtools.read(nbtools.chapter_notebook(chapter))


def registered_tests():
    for info in pkgutil.iter_modules(grading.__path__):
        importlib.import_module(f"attncourse_ref.grading.{info.name}")
    return set(grading.REGISTRY)


def test_chapter_folder_holds_only_its_notebook(chapter):
    # nbgrader copies every file of the folder into the student release.
    files = [p for p in (nbtools.CHAPTERS / chapter).rglob("*") if p.is_file() and ".ipynb_checkpoints" not in p.parts]
    assert [p.suffix for p in files] == [".ipynb"], files


def test_grade_ids_are_unique_and_test_cells_locked(chapter):
    ids = [nbtools.grade_info(c)["grade_id"] for c in _notebook(chapter).cells if nbtools.grade_info(c)]
    assert len(ids) == len(set(ids))
    for c in _notebook(chapter).cells:
        if nbtools.is_test(c):
            assert nbtools.grade_info(c)["locked"] and nbtools.grade_info(c)["points"] > 0


def test_solution_cells_delegate_to_the_reference_in_one_region(chapter):
    for c in _notebook(chapter).cells:
        if nbtools.is_solution(c):
            assert c.source.count(nbtools.BEGIN) == 1 == c.source.count(nbtools.END), nbtools.grade_info(c)
            region = c.source.split(nbtools.BEGIN, 1)[1].split(nbtools.END, 1)[0]
            assert callable(nbtools.reference_object(region))
        else:
            assert "attncourse_ref" not in c.source, "only solution regions may name the reference"


def test_test_cells_run_a_visible_check_then_a_registered_hidden_test(chapter):
    registry = registered_tests()
    for c in _notebook(chapter).cells:
        if not nbtools.is_test(c):
            continue
        gid = nbtools.grade_info(c)["grade_id"]
        assert gid.startswith("test_")
        visible, _, hidden = c.source.partition("### BEGIN HIDDEN TESTS")
        assert "checks.check_" in visible, f"{gid}: no visible check"
        m = re.search(r'grade\("([\w.]+)"', hidden)
        assert m and m.group(1) == f"{chapter}.{gid.removeprefix('test_')}", f"{gid}: hidden test id"
        assert m.group(1) in registry, f"{m.group(1)} is not registered on the grading server"


def test_student_version_has_stubs_and_no_solutions(chapter):
    nb = _notebook(chapter)
    student = nbtools.strip_solutions(nbtools.strip_hidden_tests(nb))
    text = "\n".join(c.source for c in student.cells)
    for leak in ["attncourse_ref", "BEGIN SOLUTION", "HIDDEN TESTS", "attncourse.autograde"]:
        assert leak not in text
    stubs = sum("raise NotImplementedError()" in c.source for c in student.cells if nbtools.is_solution(c))
    assert stubs == sum(nbtools.is_solution(c) for c in nb.cells)


def test_points_are_what_the_chapter_promises(chapter):
    pts = nbtools.points(_notebook(chapter))
    assert pts and all(p > 0 for p in pts.values())
    text = "\n".join(c.source for c in _notebook(chapter).cells if c.cell_type == "markdown")
    for n, promised in re.findall(r"### Exercise (\d+) \((\d+) points?\)", text):
        assert int(promised) > 0
    promised = sum(int(p) for _, p in re.findall(r"### Exercise (\d+) \((\d+) points?\)", text))
    if promised:
        assert promised == sum(pts.values()), "exercise headings and test-cell points disagree"


def test_learner_package_does_not_spell_out_the_reference():
    """utils/ ships to learners: no line of a reference implementation may appear in it."""
    import inspect
    import attncourse_ref
    ref_dir = nbtools.ROOT / "solutions" / "attncourse_ref"
    ref_lines = set()
    for path in ref_dir.glob("*.py"):
        for line in path.read_text().splitlines():
            line = line.strip()
            if len(line) > 30 and not line.startswith(("#", '"""', "def ", "class ", "from ", "import ", "return ")) \
                    and "super().__init__" not in line and "nn.Linear(" not in line and "nn.Parameter(" not in line:
                ref_lines.add(line)
    assert inspect.getfile(attncourse_ref)
    leaks = []
    for path in (nbtools.ROOT / "utils" / "attncourse").rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip() in ref_lines:
                leaks.append(f"{path.relative_to(nbtools.ROOT)}:{n}: {line.strip()}")
    assert not leaks, "reference code in the learner package:\n" + "\n".join(leaks)


def test_release_notebooks_carry_no_reference_body(chapter):
    """What learners download: no graded reference body of any chapter, in any spelling (tools/leaks.py)."""
    import nbformat
    import leaks
    student = nbtools.strip_solutions(nbtools.strip_hidden_tests(_notebook(chapter)))
    assert leaks.leaked_bodies(leaks.notebook_text(nbformat.writes(student))) == []


def test_leak_detector_finds_a_reformatted_copy():
    """The detector must catch a reference body pasted with other layout and comments, and in HTML."""
    import html
    import leaks
    (chapter, gid), _ = next(iter(leaks.reference_bodies().items()))
    nb = _notebook(chapter)
    region = next(c.source for c in nb.cells if nbtools.grade_info(c).get("grade_id") == gid).split(nbtools.BEGIN)[1]
    body = nbtools.function_body(nbtools.reference_object(region))
    reformatted = "\n".join(line.strip() + "   # a comment" for line in body.splitlines())
    assert (chapter, gid) in leaks.leaked_bodies(reformatted)
    assert (chapter, gid) in leaks.leaked_bodies("<pre><span>" + html.escape(body).replace(" ", "</span> <span>") + "</pre>")
    assert (chapter, gid) not in leaks.leaked_bodies("def f(x):\n    return x + 1\n")


def test_fake_students_skip_only_demonstrations_no_graded_cell_needs(chapter):
    """The fake classes' students (all but correct and blank) run without the chapter's demonstrations
    (tools/fakeclass.py): their graded cells, set-up and imports stay as they are, and every emptied cell
    binds no name that a kept cell reads."""
    import fakeclass
    nb = _notebook(chapter)
    short = fakeclass.without_demonstrations(nb, nb)
    kept_reads, skipped = set(), []
    for before, after in zip(nb.cells, short.cells):
        if after.source == fakeclass.SKIPPED:
            assert not nbtools.grade_info(before) and before.cell_type == "code"
            skipped.append(fakeclass._names(before.source)[0])
        else:
            assert after.source == before.source
            if after.cell_type == "code":
                kept_reads |= fakeclass._names(after.source)[1]
    assert skipped, "no demonstration skipped: the fake classes grade every demonstration of every student"
    assert not set().union(*skipped) & kept_reads
    assert "import torch" in "".join(c.source for c in short.cells)


def test_skipping_demonstrations_keeps_what_graded_cells_read():
    """A global read inside a solution's function, bound by a later cell, keeps that cell (a fixed point); a
    cell binding what only a skipped cell reads is skipped."""
    import nbformat
    import fakeclass
    v4 = nbformat.v4
    solution = v4.new_code_cell("def f(x):\n    return helper(x) * SCALE\n",
                                metadata={"nbgrader": {"solution": True, "grade": False, "grade_id": "f", "locked": False}})
    test = v4.new_code_cell("assert f(1) == 6\n",
                            metadata={"nbgrader": {"solution": False, "grade": True, "grade_id": "test_f",
                                                   "locked": True, "points": 1}})
    cells = [v4.new_code_cell("import math\nhelper = lambda x: 2 * x\n"), v4.new_code_cell("data = list(range(9))\n"),
             solution, v4.new_code_cell("print(sum(data))\n"), v4.new_code_cell("SCALE = 3\n"), test,
             v4.new_code_cell("plot = [f(d) for d in data]\n")]
    short = fakeclass.without_demonstrations(v4.new_notebook(cells=cells))
    assert [c.source == fakeclass.SKIPPED for c in short.cells] == [False, True, False, True, False, False, True]


def test_a_print_flushed_half_way_is_one_output(tmp_path):
    """What the site shows of a print() is one piece of text even when the kernel sent it in two (as a busy
    machine's kernel did: "'it' attends most to:" and " animal (weight 0.54)" on two lines of the ch02 page)."""
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import sys, time\nsys.stdout.write(\"'it' attends most to:\")\nsys.stdout.flush()\ntime.sleep(0.3)\n"
        "print(' animal')")])
    nbtools.execute(nb, tmp_path)
    streams = [o for o in nb.cells[0].outputs if o.output_type == "stream"]
    assert [o.text for o in streams] == ["'it' attends most to: animal\n"]
