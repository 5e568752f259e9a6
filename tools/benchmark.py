"""Measure the budgets of COURSE_DESIGN.md: python tools/benchmark.py [chapter ...] [--students N]

With --class-size N (e.g. 200) it instead grades a generated class of N submissions of the first
chapter given (default ch02) serially and with --jobs at once, and prints both times.

Per chapter it prints
  run      seconds to execute the instructor notebook with the reference (kernel start included,
           hidden tests removed): what `make site` and a learner's full run cost; budget 60 s
  submit   seconds to execute one correct submission (the student version, filled in)
  grade    seconds each further student adds to an autograde run of N correct submissions as
           tools/grade_class.py does (one nbgrader run for the class, confined kernels, hidden tests)
  start    the run's fixed start-up, paid once per class (a run for 1 student minus `grade`)
  ratio    grade / submit; budget 1.2
and the whole course's run time against its 6-minute budget.  Where the site is built (`make site`), it
then prints each chapter page's weight in both editions: the page's own bytes, its explorers' data
(figures and still images; budget 1 MB) and the plotting library's script that pages with explorers load
once and the browser caches; and each chapter's share of the last `make test` (its tests and its fake class,
against a budget of 240 s), read from _build/test-durations.json (`--pages` prints only these two).  It is a measurement, not a test: it never
fails, it reports.
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
        # grade_class.py minus its first-time bookkeeping: autograde runs in the confined kernel with
        # the class's grading server (started outside the timing, as once per class).  A run for one
        # student, then one for the class: their difference is what each further student costs, the
        # rest is the run's fixed start-up (nbgrader's own, paid once per class).
        confinement.start_server(root)
        t0 = time.perf_counter()
        confinement.autograde(chapter, root, "student00")
        one = time.perf_counter() - t0
        t0 = time.perf_counter()
        confinement.autograde(chapter, root)
        everyone = time.perf_counter() - t0
        grade = (everyone - one) / (n_students - 1)
        graded = len(list((root / "autograded").glob(f"*/{chapter}/{name}")))
        if graded != n_students:
            print(f"warning: {chapter}: only {graded} of {n_students} submissions were autograded")
    return run, submit, grade, one - grade


def large_class(chapter, size, jobs):
    """Seconds to grade a generated class of ``size`` (correct, blank and mistake-zoo students in
    turn) with tools/grade_class.py, serially and with ``jobs`` at once; and whether the grades agree."""
    import fakeclass
    from nbgrader.api import Gradebook
    times, grades = {}, {}
    for mode in (1, jobs):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            kinds = [s for s in fakeclass.build(chapter, root, demonstrations=True) if s.name == "correct" or s.name == "blank"
                     or s.name.startswith("zoo-")]
            names = {s.name for s in kinds}
            for d in (root / "submitted").iterdir():
                if d.name not in names:
                    subprocess.run(["rm", "-rf", str(d)], check=True)
            for i in range(size - len(kinds)):                       # copies up to the class size
                src = root / "submitted" / kinds[i % len(kinds)].name
                subprocess.run(["cp", "-r", str(src), str(root / "submitted" / f"s{i:04d}-{src.name}")], check=True)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, str(Path(__file__).parent / "grade_class.py"), chapter, "--root", str(root),
                            "--jobs", str(mode)], check=True, capture_output=True)
            times[mode] = time.perf_counter() - t0
            with Gradebook(nbtools.gradebook_url(root)) as gb:
                grades[mode] = {s.student.id: s.score for s in gb.find_assignment(chapter).submissions}
    return times[1], times[jobs], grades[1] == grades[jobs] and len(grades[1]) == size


EXPLORER_BUDGET = 1_000_000
HTML = nbtools.ROOT / "_build" / "html"


def page_weights():
    """Each chapter page's bytes in both editions: the HTML, its explorers' data, its images; and the shared scripts."""
    import re
    if not (HTML / "intro.html").exists():
        print("page weights: no built site (make site)")
        return
    print(f"\n{'page':<30} {'html':>9} {'explorers':>10} {'n':>3} {'images':>9}  verdict")
    for page in sorted(HTML.glob("site/ch*/*.html")) + sorted(HTML.glob("zh/site/ch*/*.html")):
        text = page.read_text(encoding="utf-8")
        data = sum(len(d) for d in re.findall(r'class="attn-spec">(.*?)</script>', text, flags=re.S))
        data += sum(len(d) for d in re.findall(r'src="data:image/png;base64,([^"]*)"', text))
        images = sum((page.parent / src).stat().st_size for src in set(re.findall(r'<img[^>]+src="(?!data:)([^"]+)"', text))
                     if (page.parent / src).exists())
        n = text.count('<figure class="attn-explorer"')
        print(f"{str(page.relative_to(HTML)):<30} {len(text.encode()):9,} {data:10,} {n:3d} {images:9,}  "
              f"{'within budget' if data <= EXPLORER_BUDGET else 'explorer data OVER 1 MB'}")
    js = HTML / "_static" / "plotly.min.js"
    if js.exists():
        print(f"shared, loaded once and cached: plotly.min.js {js.stat().st_size:,} bytes, "
              f"explorers.js {(HTML / '_static' / 'explorers.js').stat().st_size:,} bytes")


# Each chapter's share of `make test` (its reference, zoo, explorer and translation tests and its fake class):
# a chapter whose tests pass this is seen the day it lands (the whole suite's target is 12 minutes on 2 cores).
CHAPTER_TEST_BUDGET = 240


def test_costs():
    """Each chapter's test cost in the last `make test` run (_build/test-durations.json), against its budget."""
    import json
    import re
    path = nbtools.ROOT / "_build" / "test-durations.json"
    if not path.exists():
        print("\ntest costs: no record of a test run (run `make test`)")
        return
    record = json.loads(path.read_text())
    durations = record["durations"]
    print(f"\n{'chapter':<8} {'tests':>7} {'fake class':>11} {'all':>8} {'budget':>7}  verdict   (last make test)")
    for ch in nbtools.chapters():
        mine = {k: v for k, v in durations.items() if re.search(rf"(?<![0-9]){ch}(?![0-9])", k)}
        fake = sum(v for k, v in mine.items() if "test_fake_class" in k)
        total = sum(mine.values())
        print(f"{ch:<8} {total - fake:6.1f}s {fake:10.1f}s {total:7.1f}s {CHAPTER_TEST_BUDGET:6d}s  "
              f"{'within budget' if total <= CHAPTER_TEST_BUDGET else 'OVER BUDGET'}")
    rest = sum(v for k, v in durations.items() if not re.search(r"ch0\d", k))
    print(f"{'other':<8} {rest:6.1f}s (the site and browser check, attacks, scale, exchange, ...); "
          f"all tests: {sum(durations.values()):.0f} s of work")
    timeline = record.get("timeline") or {}
    if timeline:
        # How well the workers were kept busy: a worker that waits for the other at the end wastes a core.
        start, end = min(s for _, s, _ in timeline.values()), max(e for _, _, e in timeline.values())
        for worker in sorted({w for w, _, _ in timeline.values()}):
            spans = [(s, e) for w, s, e in timeline.values() if w == worker]
            print(f"worker {worker}: in tests {sum(e - s for s, e in spans):.0f} s of the run's {end - start:.0f} s, "
                  f"done {end - max(e for _, e in spans):.0f} s before the last test ended")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("chapters", nargs="*")
    ap.add_argument("--students", type=int, default=4, help="class size for the grading time (at least 2)")
    ap.add_argument("--class-size", type=int, default=0,
                    help="also grade a generated class of this size serially and in parallel (e.g. 200)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--pages", action="store_true", help="only the built site's page weights")
    args = ap.parse_args(argv)
    if args.pages:
        page_weights()
        test_costs()
        return
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    if args.class_size:
        chapter = (args.chapters or ["ch02"])[0]
        serial, parallel, same = large_class(chapter, args.class_size, args.jobs)
        print(f"{chapter}: a class of {args.class_size} graded in {serial:.0f} s serially, {parallel:.0f} s with "
              f"JOBS={args.jobs} (speed-up {serial / parallel:.2f}x on {os.cpu_count()} cores); "
              f"grades {'identical' if same else 'DIFFER'}")
        return
    chapters = args.chapters or nbtools.chapters()
    if args.students < 2:
        raise SystemExit("--students: at least 2 (the cost per student is the difference between 1 and N)")
    print(f"{'chapter':<8} {'run':>7} {'budget':>7} {'submit':>7} {'grade':>7} {'start':>7} {'ratio':>6}  verdict")
    total = 0.0
    for ch in chapters:
        run, submit, grade, start = measure(ch, args.students)
        total += run
        budget = RUN_BUDGET.get(ch, DEFAULT_RUN_BUDGET)
        ratio = grade / submit
        verdict = []
        if run > budget:
            verdict.append(f"run over {budget} s")
        if ratio > RATIO_BUDGET:
            verdict.append(f"grading over {RATIO_BUDGET}x")
        print(f"{ch:<8} {run:6.1f}s {budget:6d}s {submit:6.1f}s {grade:6.1f}s {start:6.1f}s {ratio:6.2f}  "
              f"{'; '.join(verdict) or 'within budget'}",
              flush=True)
    print(f"{'course':<8} {total:6.1f}s {COURSE_BUDGET:6d}s  {'within budget' if total <= COURSE_BUDGET else 'OVER BUDGET'}")
    print(f"(grade = seconds each further student adds to one autograde run of {args.students} correct "
          f"submissions; start = that run's fixed start-up; {os.cpu_count()} CPU cores)")
    page_weights()
    test_costs()


if __name__ == "__main__":
    main()
