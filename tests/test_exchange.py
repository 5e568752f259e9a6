"""The JupyterHub route, end to end, through nbgrader's own exchange on a temporary exchange folder.

The instructor releases a chapter to the exchange; two students (the fake class's "correct" and
"blank", each a different nbgrader user with a home folder of their own) fetch it, do their work
and submit; the instructor collects, grades with the course's grader (what `make autograde` runs),
makes the feedback (`make feedback`) and releases it; each student fetches their feedback.  The
grades are those the fake class expects.  The instructor runs nbgrader's commands; a student's
fetch, submit and fetch-feedback are what the *Assignments* tab of their Jupyter does (nbgrader's
assignment list runs the exchange inside the notebook server, as here, with the student's own
configuration).  Only the exchange's root is a temporary folder instead of
/usr/local/share/nbgrader/exchange.
"""
import re
import shutil
from pathlib import Path

import pytest
from nbgrader.auth import Authenticator
from nbgrader.coursedir import CourseDirectory
from nbgrader.exchange import ExchangeFactory
from traitlets.config import Config

import fakeclass
import nbtools
import test_fake_class as fake_class_test

pytestmark = pytest.mark.slow
CHAPTER = "ch00"                       # the cheapest chapter to grade
STUDENTS = ("correct", "blank")
COURSE_ID = "attention-transformers"   # nbgrader_config.py's CourseDirectory.course_id


def instructor(*args, course, exchange):
    """nbgrader as the instructor: in the course folder, with the course's nbgrader_config.py."""
    # One OS user plays every role here, so collect's check that a submission's owner is the
    # student it names would only warn; a hub has one OS user per student.
    res = nbtools.nbgrader(*args, f"--Exchange.root={exchange}", "--CollectApp.check_owner=False", root=course)
    assert res.returncode == 0, f"nbgrader {' '.join(args)}:\n{res.stdout}{res.stderr}"
    return res


def student(name, action, *, home, exchange):
    """Student ``name`` clicks ``action`` (FetchAssignment, Submit, FetchFeedback) in the Assignments tab:
    nbgrader's exchange with the student's configuration (the exchange, the course's id), working in
    their home folder, with a cache of their own."""
    home.mkdir(parents=True, exist_ok=True)
    c = Config()
    c.Exchange.root, c.Exchange.cache, c.Exchange.assignment_dir = str(exchange), str(home / ".cache"), str(home)
    c.CourseDirectory.course_id, c.CourseDirectory.assignment_id, c.CourseDirectory.student_id = COURSE_ID, CHAPTER, name
    app = getattr(ExchangeFactory(config=c), action)
    app(coursedir=CourseDirectory(config=c), authenticator=Authenticator(config=c), config=c).start()


def test_release_fetch_submit_collect_autograde_feedback_through_the_exchange(tmp_path):
    course, exchange, homes = tmp_path / "course", tmp_path / "exchange", tmp_path / "home"
    exchange.mkdir()
    # The fake class: release/ and, for each student, the notebook they will hand in.
    # Without the demonstrations, which chapter 00's fake class runs for both (tests/test_fake_class.py).
    students = fakeclass.build(CHAPTER, course, only=STUDENTS, demonstrations=())
    work = tmp_path / "work"
    shutil.move(course / "submitted", work)          # the students' work, not yet handed in
    name = nbtools.chapter_notebook(CHAPTER).name

    instructor("release_assignment", CHAPTER, course=course, exchange=exchange)
    for s in STUDENTS:
        home = homes / s
        student(s, "FetchAssignment", home=home, exchange=exchange)
        fetched = home / CHAPTER / name
        assert fetched.read_bytes() == (course / "release" / CHAPTER / name).read_bytes()
        shutil.copy(work / s / CHAPTER / name, fetched)          # the student's work on the fetched notebook
        student(s, "Submit", home=home, exchange=exchange)

    instructor("collect", CHAPTER, course=course, exchange=exchange)
    assert sorted(p.name for p in (course / "submitted").iterdir()) == sorted(STUDENTS)
    report = fake_class_test.grade_class(CHAPTER, course)                 # make autograde
    expected = fakeclass.expected_scores(CHAPTER, students)
    got = fake_class_test.cell_scores(course, CHAPTER, STUDENTS)
    assert got == expected, f"grades differ from the expected ones (got, expected):\n{got}\n{expected}\n\n{report}"

    instructor("generate_feedback", CHAPTER, "--force", course=course, exchange=exchange)     # make feedback
    instructor("release_feedback", CHAPTER, course=course, exchange=exchange)
    total = sum(expected["correct"].values())
    for s in STUDENTS:
        student(s, "FetchFeedback", home=homes / s, exchange=exchange)
        found = list((homes / s / CHAPTER / "feedback").glob(f"*/{Path(name).with_suffix('.html')}"))
        assert len(found) == 1, f"{s}: no feedback fetched"
        score = sum(expected[s].values())
        # nbgrader's feedback page states the notebook's total first
        first = re.search(r"Score: ([\d.]+) / ([\d.]+)", found[0].read_text())
        assert first and (float(first[1]), float(first[2])) == (score, total), f"{s}: {first and first[0]}"
