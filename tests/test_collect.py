"""Collecting submissions from an LMS download (make collect-zip)."""
import shutil
import zipfile

import pytest

import nbtools

pytestmark = pytest.mark.slow


def test_zip_collect_files_each_student(tmp_path):
    shutil.copytree(nbtools.CHAPTERS / "ch02", tmp_path / "chapters" / "ch02")
    assert nbtools.nbgrader("generate_assignment", "ch02", "--force", root=tmp_path).returncode == 0
    release = tmp_path / "release" / "ch02" / "attention.ipynb"
    archive = tmp_path / "downloaded" / "ch02" / "archive"
    archive.mkdir(parents=True)
    with zipfile.ZipFile(archive / "lms-download.zip", "w") as z:
        for student in ("alice", "bob"):
            z.write(release, f"{student}_attention.ipynb")
    res = nbtools.nbgrader("zip_collect", "ch02", "--force", root=tmp_path)
    assert res.returncode == 0, res.stderr
    for student in ("alice", "bob"):
        assert (tmp_path / "submitted" / student / "ch02" / "attention.ipynb").exists(), res.stderr
