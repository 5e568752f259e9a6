"""Grading a large class: parallel grading, an interrupted run that resumes, and machines that grade
disjoint shards into one real PostgreSQL gradebook.  Each test uses a small chapter 04 class whose
correct grades are known in advance (tools/fakeclass.py)."""
import csv
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import fakeclass
import nbtools
from nbgrader.api import Gradebook

pytestmark = pytest.mark.slow
CH = "ch04"
# Seconds per cell: chapter 04's cells take well under one, but a kernel started without the zygote imports torch.
TIMEOUT = "20"
GRADER = [sys.executable, str(nbtools.ROOT / "tools" / "grade_class.py"), CH]


def fake_class(root, keep=None):
    # No student runs the demonstrations: chapter 04's fake class does (tests/test_fake_class.py); here only
    # the grades of parallel, sharded and resumed runs count.
    students = fakeclass.build(CH, root, demonstrations=())
    if keep is not None:
        students = [s for s in students if s.name in keep]
        for d in (root / "submitted").iterdir():
            if d.name not in keep:
                shutil.rmtree(d)
    return students


def scores(db_url, names):
    with Gradebook(db_url) as gb:
        return {s: {g.name: g.score for nb in gb.find_submission(CH, s).notebooks for g in nb.grades} for s in names}


def run(root, *args, env=None):
    res = subprocess.run([*GRADER, "--root", str(root), *args], capture_output=True, text=True,
                         env={**os.environ, "ATTNCOURSE_CELL_TIMEOUT": TIMEOUT, **(env or {})})
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


# test_fake_class grades chapter 04's whole class; these tests check the machinery on a part of it.
PARALLEL_CLASS = {"correct", "blank", "loop", "killer", "cheat-sneaky", "zoo-01", "zoo-02"}  # a hang and a crash among them
SMALL_CLASS = {"correct", "blank", "zoo-01", "zoo-02"}     # two in each of 2 shards (grade_class.shard_of)


def test_parallel_grading_matches_the_known_grades(tmp_path):
    students = fake_class(tmp_path, keep=PARALLEL_CLASS)
    report = run(tmp_path, "--jobs", "2", env={"ATTNCOURSE_CELL_TIMEOUT": fakeclass.LOOP_CELL_TIMEOUT})
    expected = fakeclass.expected_scores(CH, students)
    got = scores(nbtools.gradebook_url(tmp_path), expected)
    assert got == expected, report
    with Gradebook(nbtools.gradebook_url(tmp_path)) as gb:        # one submission per student, no duplicates
        assert sorted(s.student.id for s in gb.find_assignment(CH).submissions) == sorted(expected)


def test_an_interrupted_run_resumes_without_regrading(tmp_path):
    students = fake_class(tmp_path, keep=SMALL_CLASS)
    # This run starts each kernel as a Python of its own (no zygote, as on a machine that cannot fork one); the
    # run that resumes it forks them from the zygote: the two ways grade alike.
    proc = subprocess.Popen([*GRADER, "--root", str(tmp_path), "--jobs", "1", "--shard", "1/1"],
                            env=dict(os.environ, ATTNCOURSE_CELL_TIMEOUT=TIMEOUT, ATTNCOURSE_KERNEL_ZYGOTE="0"),
                            start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    markers = tmp_path / "verdicts" / CH
    deadline = time.time() + 900
    while time.time() < deadline and not list(markers.glob("*.done")) and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)             # a power cut: grader, nbgrader and kernels at once
    proc.wait()
    done_before = {p.stem: p.stat().st_mtime for p in markers.glob("*.done")}
    assert done_before, "no student finished before the cut"
    report = run(tmp_path)
    expected = fakeclass.expected_scores(CH, students)
    assert scores(nbtools.gradebook_url(tmp_path), expected) == expected, report
    for s, mtime in done_before.items():                 # finished students were kept, not graded again
        assert (markers / f"{s}.done").stat().st_mtime == mtime
        assert "graded earlier" in next(line for line in report.splitlines() if line.startswith(s + " "))
    again = run(tmp_path, "--regrade", "--student", "blank")
    assert "graded earlier" not in next(line for line in again.splitlines() if line.startswith("blank "))


# ---- PostgreSQL ---------------------------------------------------------------------------------

def _pg_bin():
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def postgres(tmp_path):
    """A throw-away PostgreSQL server on the loopback address (Debian's package; see README)."""
    pg = _pg_bin()
    if pg is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql; .ci/run installs it)")
    data = Path(tempfile.mkdtemp(prefix="attncourse-pg-"))      # reachable by the postgres user
    as_user = []
    if os.geteuid() == 0:                            # initdb refuses to run as root
        shutil.chown(data, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*as_user, str(pg / "initdb"), "-D", str(data), "--auth=trust", "-U", "grader"],
                   check=True, capture_output=True)
    port = _free_port()
    server = subprocess.Popen([*as_user, str(pg / "postgres"), "-D", str(data), "-p", str(port), "-k", str(data),
                               "-c", "listen_addresses=127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if subprocess.run([str(pg / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)], capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        subprocess.run([str(pg / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "grader", "course"],
                       check=True, capture_output=True)
        yield f"postgresql://grader@127.0.0.1:{port}/course"
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(data, ignore_errors=True)


def test_shards_on_two_machines_fill_one_postgresql_gradebook(tmp_path, postgres):
    machines = [tmp_path / "machine1", tmp_path / "machine2"]
    students = fake_class(machines[0], keep=SMALL_CLASS)
    shutil.copytree(machines[0], machines[1])          # each machine has the course folder and the submissions
    env = {"NBGRADER_DB_URL": postgres}
    nbtools_env = dict(os.environ, **env)
    for m in machines:                                  # both record the assignment in the shared gradebook
        res = subprocess.run([str(Path(sys.executable).parent / "nbgrader"), "generate_assignment", CH, "--force",
                              f"--CourseDirectory.root={m}"], cwd=nbtools.ROOT, env=nbtools_env, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
    graders = [subprocess.Popen([*GRADER, "--root", str(m), "--shard", f"{i + 1}/2"], env=dict(nbtools_env, ATTNCOURSE_CELL_TIMEOUT=TIMEOUT),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i, m in enumerate(machines)]
    reports = [g.communicate(timeout=1800)[0] for g in graders]
    assert all(g.returncode == 0 for g in graders), reports
    graded = [{line.split()[0] for line in r.splitlines() if " graded" in line} for r in reports]
    assert graded[0] and graded[1] and not graded[0] & graded[1], "the shards must be disjoint and both non-empty"
    expected = fakeclass.expected_scores(CH, students)
    assert scores(postgres, expected) == expected, "\n".join(reports)
    out = tmp_path / "grades.csv"
    subprocess.run([sys.executable, str(nbtools.ROOT / "tools" / "export_grades.py"), "--root", str(machines[0]),
                    "--out", str(out)], check=True, env=nbtools_env, capture_output=True)
    rows = {r["student_id"]: r for r in csv.DictReader(open(out))}
    assert set(expected) <= set(rows)
    for s, cells in expected.items():
        assert float(rows[s]["total"]) == sum(cells.values())


def test_grader_threads_share_one_server(tmp_path, monkeypatch):
    """JOBS=N starts graders in threads: they must all use one server.  Two racing servers would
    leave a kernel talking to one that exits, and that student's verdicts would be lost."""
    import threading
    import confinement
    confinement.stop_server()
    started, popen = [], subprocess.Popen

    def counting_popen(*args, **kwargs):
        proc = popen(*args, **kwargs)
        if "--serve" in args[0]:
            started.append(proc)
        return proc
    monkeypatch.setattr(confinement.subprocess, "Popen", counting_popen)
    barrier = threading.Barrier(8)

    def start():
        barrier.wait()
        confinement.start_server(tmp_path)
    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    private = os.path.dirname(os.environ["ATTNCOURSE_GRADER_CONTROL"])
    try:
        assert len(started) == 1
        assert os.path.exists(os.path.join(private, "control.sock"))
    finally:
        confinement.stop_server()
        for proc in started:
            proc.kill()
        os.environ.pop("ATTNCOURSE_GRADER_CONTROL", None)
    assert not os.path.exists(private), "the grader's private folder outlived its server"
