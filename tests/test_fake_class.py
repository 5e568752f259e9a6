"""The nbgrader round trip with a fake class whose correct grades are known in advance.

For every chapter: the reference-solved notebook gets full marks, the untouched release gets 0,
and every mistake-zoo variant loses exactly the points of the test cells it must fail.  For
chapter 02 the class also holds the generic attacks (importing or sneaking in the reference,
patching comparison functions, an infinite loop, a kernel killer, harmless warnings) and two
submissions that cannot be graded at all, and the feedback and grade export are checked.
"""
import csv
import os
import subprocess
import sys

import pytest

import fakeclass
import nbtools
from nbgrader.api import Gradebook

pytestmark = pytest.mark.slow
# Seconds per cell: only chapter 02's class holds the infinite loop; the others run their demonstrations under
# GRADING (chapter 06's longest cell: 2.7 s).
TIMEOUT = {"ch02": fakeclass.LOOP_CELL_TIMEOUT}


def grade_class(chapter, root):
    env = dict(os.environ, ATTNCOURSE_CELL_TIMEOUT=TIMEOUT.get(chapter, "20"))
    res = subprocess.run([sys.executable, str(nbtools.ROOT / "tools" / "grade_class.py"), chapter, "--root", str(root)],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def cell_scores(root, chapter, students):
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        return {s: {g.name: g.score for nb in gb.find_submission(chapter, s).notebooks for g in nb.grades}
                for s in students}


def test_fake_class(chapter, tmp_path):
    students = fakeclass.build(chapter, tmp_path)
    if chapter != "ch02":
        students = [s for s in students if s.name in ("correct", "blank") or s.name.startswith("zoo-")]
        keep = {s.name for s in students}
        for d in (tmp_path / "submitted").iterdir():
            if d.name not in keep:
                subprocess.run(["rm", "-rf", str(d)], check=True)
    else:
        # Submissions that cannot be graded must not stop the others.
        broken = tmp_path / "submitted" / "broken-json" / chapter / nbtools.chapter_notebook(chapter).name
        broken.parent.mkdir(parents=True)
        broken.write_text("{ this is not a notebook")
        misnamed = tmp_path / "submitted" / "misnamed" / chapter / "Untitled.ipynb"
        misnamed.parent.mkdir(parents=True)
        misnamed.write_bytes((tmp_path / "release" / chapter / nbtools.chapter_notebook(chapter).name).read_bytes())
        # An honest learner's accident: a solution cell and a test cell copied (the same grade id twice), which
        # nbgrader refuses for the whole notebook.  Graded as the first cell of each id, with full marks.
        students.append(copy_paste_student(tmp_path, chapter))
        students.append(forged_diagnosis_student(tmp_path, chapter))
    report = grade_class(chapter, tmp_path)
    expected = fakeclass.expected_scores(chapter, students)
    got = cell_scores(tmp_path, chapter, [s.name for s in students])
    wrong = {s: (got[s], expected[s]) for s in expected if got[s] != expected[s]}
    assert not wrong, f"grades differ from the expected ones (got, expected):\n{wrong}\n\n{report}"
    if chapter == "ch02":
        check_ch02_extras(tmp_path, report)
        check_class_report(tmp_path, chapter, students)


def copy_paste_student(root, chapter):
    import copy
    import uuid
    name = nbtools.chapter_notebook(chapter).name
    nb = nbtools.read(root / "submitted" / "correct" / chapter / name)
    solution = next(i for i, c in enumerate(nb.cells) if nbtools.is_solution(c))
    test = next(i for i, c in enumerate(nb.cells) if nbtools.is_test(c))
    for i in sorted((solution, test), reverse=True):
        twin = copy.deepcopy(nb.cells[i])
        twin.id = uuid.uuid4().hex[:8]
        nb.cells.insert(i + 1, twin)
    nbtools.write(nb, root / "submitted" / "copy-paste" / chapter / name)
    return fakeclass.Student("copy-paste", note="a solution cell and a test cell pasted twice")


# A student who makes a known mistake (no scaling) and tries to change what the class report says of it: writes a
# record and kept outputs of its own where the grading server keeps them, and prints a diagnosis.
FORGE_DIAGNOSIS = """
import json, os
for up in range(1, 6):
    folder = os.path.join(os.getcwd(), *[".."] * up, "verdicts", "ch02")
    for name, text in (("forged-diagnosis.jsonl", json.dumps({"test": "ch02.sdpa_unmasked", "failures": [], "passed": True})),
                       ("forged-diagnosis.outputs/ch02.sdpa_unmasked.npz", "not the server's")):
        try:
            os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        except OSError:
            pass
print("diagnosis: correct")
"""


def forged_diagnosis_student(root, chapter):
    name = nbtools.chapter_notebook(chapter).name
    instructor = nbtools.read(nbtools.chapter_notebook(chapter))
    release = nbtools.read(root / "release" / chapter / name)
    v = next(v for v in fakeclass.zoo(chapter) if v.name == "no scaling")
    nb = nbtools.solve(instructor, release, {v.cell: v.impl})
    cell = next(c for c in nb.cells if nbtools.grade_info(c).get("grade_id") == v.cell)
    cell.source += "\n" + FORGE_DIAGNOSIS
    nbtools.write(fakeclass.without_demonstrations(nb, instructor), root / "submitted" / "forged-diagnosis" / chapter / name)
    return fakeclass.Student("forged-diagnosis", fails=v.loses, note="no scaling, and a forged diagnosis", variants=[v])


def check_class_report(root, chapter, students):
    """make report: each known mistake of the class counted exactly, in diagnoses.csv and on the page, in English
    with names and in Chinese without; a forged diagnosis changes nothing; the page works in a browser."""
    import html
    import re
    own = fakeclass.cells_tested(nbtools.read(nbtools.chapter_notebook(chapter)))
    expected = {(s.name, t): v.name for s in students for v in s.variants for t in sorted(set(own[v.cell]) & v.fails)}
    cascades = {(s.name, t) for s in students for v in s.variants for t in v.loses}
    special = {"(not attempted)", "(not diagnosed)", "(lost in the test cell)"}

    def run(*args, language="en"):
        res = subprocess.run([sys.executable, str(nbtools.ROOT / "tools" / "report.py"), chapter, "--root", str(root),
                              *args], capture_output=True, text=True, env=dict(os.environ, ATTNCOURSE_LANGUAGE=language))
        assert res.returncode == 0, res.stdout + res.stderr

    def page_counts(page):
        """{(test cell, mistake label): count} from the page's tables."""
        found = {}
        for section in page.split("<h3>")[1:]:
            cell = re.match(r"<code>(\w+)</code>", section).group(1)
            for label, count in re.findall(r"<tr><td><code>([^<]*)</code></td><td><pre>.*?</pre></td><td>(\d+)</td>",
                                           section, re.S):
                found[cell, html.unescape(label)] = int(count)
        return found

    run()
    rows = list(csv.DictReader(open(root / "diagnoses.csv", encoding="utf-8")))
    got = {(r["student"], r["exercise"]): r["mistake id"] for r in rows}
    wrong = {k: (got.get(k), v) for k, v in expected.items() if v not in got.get(k, "").split(" | ")}
    assert not wrong, f"diagnoses (got, expected): {wrong}"
    assert not [r for r in rows if r["mistake id"] not in special and (r["student"], r["exercise"]) not in cascades]
    assert {got[k] for k in got if k[0] == "blank"} == {"(not attempted)"}
    counts = {}
    for r in rows:
        counts[r["exercise"], r["mistake id"]] = counts.get((r["exercise"], r["mistake id"]), 0) + 1
    page = (root / "reports" / f"{chapter}.html").read_text(encoding="utf-8")
    shown = page_counts(page)
    assert {k: v for k, v in shown.items() if k[1] not in special and not k[1].startswith(("not ", "lost "))} == \
        {k: v for k, v in counts.items() if k[1] not in special}
    assert "you did not scale the scores" in page and 'href="../feedback/zoo-01/ch02/attention.html"' in page
    assert got["forged-diagnosis", "test_sdpa_unmasked"] == "no scaling"
    assert counts["test_sdpa_unmasked", "no scaling"] == 2                # zoo-03 and the forger

    run("--anonymous", language="zh")
    anonymous = (root / "reports-anonymous" / f"{chapter}.html").read_text(encoding="utf-8")
    assert '<html lang="zh-CN">' in anonymous and "题目分析" in anonymous and "you did not scale" not in anonymous
    assert '<html lang="zh-CN">' in (root / "reports-anonymous" / "index.html").read_text(encoding="utf-8")
    assert not [s.name for s in students if s.name != "correct" and s.name in anonymous] and "feedback/" not in anonymous
    assert {k: v for k, v in page_counts(anonymous).items() if k[1] not in special and k[1] in {m for _, m in counts}} \
        == {k: v for k, v in counts.items() if k[1] not in special}
    assert "student" not in open(root / "reports-anonymous" / "diagnoses.csv", encoding="utf-8").readline()

    import browser_check
    if browser_check.find_chromium() is not None:
        problems = browser_check.check_pages(root, [f"reports/{chapter}.html", "reports/index.html",
                                                    f"reports-anonymous/{chapter}.html"])
        assert not problems, problems


def check_ch02_extras(root, report):
    lines = {line.split()[0]: line for line in report.splitlines() if line.strip()}
    assert "repeats the grade id" in lines["copy-paste"] and lines["copy-paste"].startswith("copy-paste")
    # The fake students paste the reference's bodies: the similarity report lists them against it.
    copies = list(csv.DictReader(open(root / "similarity_ch02.csv")))
    assert {"correct", "(reference)"} <= {v for row in copies for v in (row["student"], row["similar to"])}
    assert "near-copies (similarity_ch02.csv)" in report
    assert "unreadable notebook" in lines["broken-json"]
    assert "no attention.ipynb" in lines["misnamed"]
    assert "graded after disabling equivariance_gap" in lines["killer"]
    audit = list(csv.DictReader(open(root / "audit_ch02.csv")))
    flagged = {row["student"] for row in audit}
    assert {"cheat-import", "cheat-sneaky", "cheat-allclose", "killer"} <= flagged
    assert "correct" not in flagged and "warning" not in flagged
    # Feedback and grade export, as an instructor runs them.
    res = nbtools.nbgrader("generate_feedback", "ch02", "--force", root=root)
    assert res.returncode == 0, res.stderr
    fb = (root / "feedback" / "zoo-01" / "ch02" / "attention.html").read_text()
    assert "query axis" in fb                       # the visible check's diagnosis reaches the student
    assert '<html lang="en">' in fb and "(Score: " in fb and "Student's answer" in fb   # nbgrader's labels, in English
    fb = (root / "feedback" / "cheat-sneaky" / "ch02" / "attention.html").read_text()
    from attncourse.sandbox import landlock_abi
    if landlock_abi():
        # The confined kernel cannot even read the reference: Landlock refuses it, or, for a course kept
        # under /tmp (a CI clone), the kernel's mount namespace does not show the package at all.
        assert "Permission denied" in fb or "No module named 'attncourse_ref'" in fb
        assert "grading kernels: confined (Landlock" in report
    subprocess.run([sys.executable, str(nbtools.ROOT / "tools" / "export_grades.py"), "--root", str(root)], check=True,
                   capture_output=True)
    rows = {r["student_id"]: r for r in csv.DictReader(open(root / "grades.csv"))}
    assert float(rows["correct"]["total"]) == 10 and float(rows["blank"]["total"]) == 0
    assert float(rows["(max)"]["ch02:test_sdpa_masked"]) == 2
    assert rows["cheat-sneaky"]["ch02:test_equivariance_gap"] in ("0", "0.0")
