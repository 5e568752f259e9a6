"""`make validate`: a learner's self-check runs the notebook as the grader will and says what passes."""
import subprocess
import sys

import pytest

import nbtools

pytestmark = pytest.mark.slow


def validate(path):
    return subprocess.run([sys.executable, str(nbtools.ROOT / "tools" / "validate.py"), str(path)],
                          capture_output=True, text=True)


def test_validate_lists_done_failing_and_missing_exercises(tmp_path):
    from zoo.ch02 import VARIANTS
    instructor = nbtools.read(nbtools.chapter_notebook("ch02"))
    release = nbtools.strip_solutions(nbtools.strip_hidden_tests(instructor))
    wrong = next(v for v in VARIANTS if v.cell == "causal_mask")
    partial = nbtools.solve(instructor, release, {"causal_mask": wrong.impl})
    partial.cells = [c if nbtools.grade_info(c).get("grade_id") != "equivariance_gap"
                     else next(r for r in release.cells if nbtools.grade_info(r).get("grade_id") == "equivariance_gap")
                     for c in partial.cells]
    res = validate(nbtools.write(partial, tmp_path / "partial" / "attention.ipynb"))
    lines = {line.split()[1]: line for line in res.stdout.splitlines() if line and line[0] in "\u2713\u2717\u00b7"}
    assert res.returncode == 1
    assert "pass" in lines["test_sdpa_unmasked"] and lines["test_sdpa_unmasked"].startswith("\u2713")
    assert lines["test_causal_mask"].startswith("\u2717") and wrong.says in lines["test_causal_mask"]
    assert "not done" in lines["test_equivariance_gap"]
    res = validate(nbtools.write(nbtools.solve(instructor, release), tmp_path / "complete" / "attention.ipynb"))
    assert res.returncode == 0 and "pass for 10 of 10 points" in res.stdout, res.stdout


def test_validate_explains_bad_input(tmp_path):
    res = validate(tmp_path / "missing.ipynb")
    assert res.returncode != 0 and "no such notebook" in res.stderr
    (tmp_path / "broken.ipynb").write_text("{ not json")
    res = validate(tmp_path / "broken.ipynb")
    assert res.returncode != 0 and "not a readable notebook" in res.stderr
    # The learner package's own command line (what `make validate` and `attncourse validate` run).
    res = subprocess.run([sys.executable, "-m", "attncourse", "validate", str(tmp_path / "broken.ipynb")],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "not a readable notebook" in res.stderr
    res = subprocess.run([sys.executable, "-m", "attncourse"], capture_output=True, text=True)
    assert res.returncode == 2 and "attncourse validate NOTEBOOK" in res.stderr
