"""Measure the budgets of COURSE_DESIGN.md: python tools/benchmark.py [chapter ...] [--students N]

Per chapter it prints
  run      seconds to execute the instructor notebook with the reference (kernel start included,
           hidden tests removed): what `make site` and a learner's full run cost; budget 60 s
  submit   seconds to execute one correct submission (the student version, filled in)
  grade    seconds per student to autograde a class of N correct submissions as
           tools/grade_class.py does (one nbgrader run for the class, confined kernels, hidden tests)
  ratio    grade / submit; budget 1.2
and the whole course's run time against its 6-minute budget.  It is a measurement, not a test:
it never fails, it reports.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import confinement  # noqa: E402
import nbtools  # noqa: E402

RUN_BUDGET = {"ch09": 120}
DEFAULT_RUN_BUDGET, COURSE_BUDGET, RATIO_BUDGET = 60, 360, 1.2


def timed_execution(nb, cwd):
    t0 = time.perf_counter()
    nbtools.execute(nb, cwd)
    return time.perf_counter() - t0


def measure(chapter, n_students):
    instructor = nbtools.read(nbtools.chapter_notebook(chapter))
    run = timed_execution(nbtools.strip_hidden_tests(instructor), nbtools.chapter_notebook(chapter).parent)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "chapters").mkdir()
        subprocess.run(["cp", "-r", str(nbtools.CHAPTERS / chapter), str(root / "chapters")], check=True)
        res = nbtools.nbgrader("generate_assignment", chapter, "--force", root=root)
        if res.returncode:
            raise SystemExit(res.stderr)
        name = nbtools.chapter_notebook(chapter).name
        release = nbtools.read(root / "release" / chapter / name)
        correct = nbtools.solve(instructor, release)
        submit = timed_execution(nbtools.read(nbtools.write(correct, root / "probe" / name)), root / "probe")
        for i in range(n_students):
            nbtools.write(correct, root / "submitted" / f"student{i:02d}" / chapter / name)
        # grade_class.py minus its first-time bookkeeping: one autograde run for the class, in the
        # confined kernel with the class's grading server (started outside the timing, as once per class).
        confinement.start_server(root)
        t0 = time.perf_counter()
        confinement.autograde(chapter, root)
        grade = (time.perf_counter() - t0) / n_students
        graded = len(list((root / "autograded").glob(f"*/{chapter}/{name}")))
        if graded != n_students:
            print(f"warning: {chapter}: only {graded} of {n_students} submissions were autograded")
    return run, submit, grade


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("chapters", nargs="*")
    ap.add_argument("--students", type=int, default=3)
    args = ap.parse_args(argv)
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    chapters = args.chapters or nbtools.chapters()
    print(f"{'chapter':<8} {'run':>7} {'budget':>7} {'submit':>7} {'grade':>7} {'ratio':>6}  verdict")
    total = 0.0
    for ch in chapters:
        run, submit, grade = measure(ch, args.students)
        total += run
        budget = RUN_BUDGET.get(ch, DEFAULT_RUN_BUDGET)
        ratio = grade / submit
        verdict = []
        if run > budget:
            verdict.append(f"run over {budget} s")
        if ratio > RATIO_BUDGET:
            verdict.append(f"grading over {RATIO_BUDGET}x")
        print(f"{ch:<8} {run:6.1f}s {budget:6d}s {submit:6.1f}s {grade:6.1f}s {ratio:6.2f}  {'; '.join(verdict) or 'within budget'}",
              flush=True)
    print(f"{'course':<8} {total:6.1f}s {COURSE_BUDGET:6d}s  {'within budget' if total <= COURSE_BUDGET else 'OVER BUDGET'}")
    print(f"(grade = seconds per student in one autograde run of {args.students} correct submissions; "
          f"{os.cpu_count()} CPU cores)")


if __name__ == "__main__":
    main()
