"""Autograde every submission of one chapter: python tools/grade_class.py CHAPTER [--root DIR].

Whom grading trusts (COURSE_DESIGN.md): nothing a submission's kernel reports.
- One grading server per class run (attncourse_ref.grading --serve) computes every hidden test's
  verdict outside the kernel and records it where no kernel can write (verdicts/<chapter>/).
- nbgrader runs each submission in the confined kernel "attncourse-sandbox" (attncourse.sandbox):
  it reads only the Python environment and its own folder, writes only there and in a private
  temporary directory, opens no network connection, and has bounded memory, file size, processes
  and disk.
- After nbgrader, the grader reconciles: a test cell that nbgrader scored but whose recorded
  verdict is missing or failed scores 0, and so does a cell whose exercise forbids a built-in that
  the submitted source names.  Every such change is listed in the report and in audit_<chapter>.csv.

One broken submission never stops the others: nbgrader goes on after a failing notebook, and
when a submission kills its kernel (os._exit, a crash, the watchdog stopping a fork loop or a
disk filler) this script finds the cell that did it, disables that cell (or the solution cell a
killed test cell was exercising) in a copy, keeps the original under salvaged/<student>/<chapter>/,
and grades the copy, so the student loses only the points of what broke.
"""
import argparse
import csv
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbtools  # noqa: E402
import confinement  # noqa: E402
import review  # noqa: E402
import similarity  # noqa: E402

DISABLED = ('raise RuntimeError("The grader disabled this cell: running it killed the Python kernel '
            '(os._exit, a crash or running out of memory), which would have lost the grades of the whole notebook.")')
MAX_SALVAGE_ROUNDS = 6

# Source patterns that have no business in an exercise solution: each is listed, not judged.
SUSPICIOUS = {
    "imports the reference": r"attncourse_ref",
    "touches the grading client": r"attncourse\.autograde|_wire|run_hidden_test|\bgrade\s*\(",
    "replaces a library attribute": r"^\s*(torch|np|numpy|nn|F|math|attncourse|checks)(\.\w+)+\s*=[^=]",
    "setattr/delattr": r"\b(setattr|delattr)\s*\(",
    "sys.modules / builtins": r"sys\.modules|__builtins__|\bbuiltins\b",
    "dynamic import or code": r"__import__|importlib|(?<![\w.])(exec|eval|compile)\s*\(",
    "profilers and tracers": r"setprofile|settrace",
    "ends the process": r"os\._exit|os\.abort|os\.kill|ctypes|signal\.",
    "subprocesses": r"subprocess|os\.system|os\.popen",
    "environment": r"os\.environ",
}


def ensure_assignment(chapter, root):
    """The gradebook must know the chapter's cells; generate_assignment records them."""
    if not (Path(root) / "release" / chapter).exists():
        res = nbtools.nbgrader("generate_assignment", chapter, "--force", root=root)
        if res.returncode:
            raise SystemExit(f"generate_assignment {chapter} failed:\n{res.stdout}{res.stderr}")


def autograde_input(submission, source):
    """What nbgrader executes: the submission with its test cells replaced by the source's."""
    tests = {nbtools.grade_info(c)["grade_id"]: c.source for c in source.cells if nbtools.is_test(c)}
    nb = nbformat.from_dict(submission)
    for cell in nb.cells:
        gid = nbtools.grade_info(cell).get("grade_id")
        if gid in tests:
            cell.source = tests[gid]
    return nb


def killing_cell(nb, workdir, timeout):
    """Index of the first cell during which the kernel dies, or None."""
    nb = nbformat.from_dict(nb)
    client = NotebookClient(nb, timeout=timeout, kernel_name=confinement.KERNEL, allow_errors=True,
                            interrupt_on_timeout=True, resources={"metadata": {"path": str(workdir)}})
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            try:
                client.execute_cell(cell, i)
            except DeadKernelError:
                return i
    return None


def disable_killer(submission, source, workdir, timeout):
    """Run the notebook cell by cell; disable the cell that kills the kernel.  Returns its name or None.

    When a test cell dies, it was running the student's code: the nearest solution cell above
    it that is still enabled is disabled instead (test cells are restored by nbgrader anyway).
    """
    i = killing_cell(autograde_input(submission, source), workdir, timeout)
    if i is None:
        return None
    if nbtools.is_test(submission.cells[i]):
        above = [j for j in range(i - 1, -1, -1)
                 if nbtools.is_solution(submission.cells[j]) and submission.cells[j].source != DISABLED]
        if not above:
            return None
        i = above[0]
    submission.cells[i].source = DISABLED
    return nbtools.grade_info(submission.cells[i]).get("grade_id", f"cell {i}")


def students_code(root, chapter, student):
    """The submission as the student wrote it: the original kept under salvaged/ when the grader disabled a
    cell that killed the kernel (the graded copy holds the grader's replacement text there), else as submitted."""
    name = nbtools.chapter_notebook(chapter).name
    original = Path(root) / "salvaged" / student / chapter / name
    return original if original.exists() else Path(root) / "submitted" / student / chapter / name


def audit(sub_path, release_nb=None):
    """[(cell grade_id or index, what, line)] for suspicious lines outside test cells and outside the
    code the release gives unchanged (the set-up cell installs with pip: not the student's doing)."""
    given = set() if release_nb is None else nbtools.given_code(release_nb)
    found = []
    for idx, cell in enumerate(nbtools.read(sub_path).cells):
        if cell.cell_type != "code" or nbtools.is_test(cell) or (cell.source in given and not nbtools.is_solution(cell)):
            continue
        for line in cell.source.splitlines():
            for what, pattern in SUSPICIOUS.items():
                if re.search(pattern, line):
                    found.append((nbtools.grade_info(cell).get("grade_id", f"cell {idx}"), what, line.strip()))
    return found


def notebook_score(root, chapter, student):
    from nbgrader.api import Gradebook, MissingEntry
    with Gradebook(nbtools.gradebook_url(root)) as gb:
        try:
            sub = gb.find_submission(chapter, student)
        except MissingEntry:
            return None
        return sub.score, sub.max_score


def precheck(chapter, student, root):
    """None if the submission has a readable notebook of the right name, else why not."""
    sub_dir = Path(root) / "submitted" / student / chapter
    expected = nbtools.chapter_notebook(chapter).name
    found = sorted(p.name for p in sub_dir.glob("*.ipynb"))
    if expected not in found:
        return f"not graded: no {expected} in {sub_dir} (found: {', '.join(found) or 'nothing'})"
    try:
        nbtools.read(sub_dir / expected)
    except Exception as exc:
        return f"not graded: unreadable notebook ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    return None


# Cell metadata nbgrader has read (cell type, the metadata as JSON): the class's notebooks repeat the release's,
# and nbgrader checks its schema itself on every cell (3 ms each: 2 s of a 10-student class).
_READABLE = set()


def restore_test_cells(chapter, student, root, source):
    """Put back what an honest grader grades with: every test cell of the source notebook.

    A submission that deleted a test cell, re-labelled one, copied one (two cells with one grade id, which
    nbgrader refuses: an honest learner's copy-paste), or left a cell with nbgrader metadata that nbgrader
    cannot read (which would stop nbgrader for the whole class) is repaired in place: malformed metadata is
    dropped, a copy loses its metadata as nbgrader's own handling intends (the first cell of each grade id,
    by position, is the one graded; the copy still runs as ordinary code), and each missing test cell is
    re-inserted after the solution cell it follows in the source.  The original is kept under salvaged/.
    Returns what changed.
    """
    from nbgrader.nbgraderformat import MetadataValidator
    path = Path(root) / "submitted" / student / chapter / nbtools.chapter_notebook(chapter).name
    nb = nbtools.read(path)
    validator, notes = MetadataValidator(), []
    for i, cell in enumerate(nb.cells):
        if "nbgrader" not in cell.metadata:
            continue
        key = (cell.cell_type, json.dumps(cell.metadata["nbgrader"], sort_keys=True))
        if key in _READABLE:
            continue
        try:
            validator.validate_cell(cell)
            _READABLE.add(key)
        except Exception:              # any shape nbgrader cannot read
            notes.append(f"dropped unreadable nbgrader metadata of cell {i}")
            del cell.metadata["nbgrader"]
    seen = set()
    for i, cell in enumerate(nb.cells):
        gid = nbtools.grade_info(cell).get("grade_id")
        if gid is not None and gid in seen:
            del cell.metadata["nbgrader"]
            notes.append(f"cell {i} repeats the grade id {gid} (a copied cell): the first one is graded, the copy runs as plain code")
        seen.add(gid)
    tests = {nbtools.grade_info(c)["grade_id"] for c in nb.cells if nbtools.is_test(c)}
    previous = None
    for cell in source.cells:
        gid = nbtools.grade_info(cell).get("grade_id")
        if nbtools.is_test(cell) and gid not in tests:
            at = next((j + 1 for j, c in enumerate(nb.cells) if previous and nbtools.grade_info(c).get("grade_id") == previous),
                      len(nb.cells))
            nb.cells.insert(at, cell)
            notes.append(f"restored the deleted or re-labelled test cell {gid}")
        if gid:
            previous = gid
    if notes:
        backup = Path(root) / "salvaged" / student / chapter
        if not (backup / path.name).exists():
            backup.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, backup / path.name)
        nbtools.write(nb, path)
    return notes


def course_salt(root):
    """The salt the hidden tests draw their cases with: ATTNCOURSE_GRADING_SALT where set, else the course's
    own, made once (secret, random) and kept beside the gradebook in ``grading_salt``: a regrade draws the
    same cases, another course or term draws others, and no kernel sees it (attncourse.sandbox)."""
    if os.environ.get("ATTNCOURSE_GRADING_SALT"):
        return os.environ["ATTNCOURSE_GRADING_SALT"]
    path = Path(root) / "grading_salt"
    if not path.exists():
        import secrets
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(16) + "\n")
        print(f"a fresh grading salt for this course in {path}: keep it with the gradebook (a regrade needs it)")
    return path.read_text().strip()


def shard_of(student, n):
    """1..n, stable across machines and runs (a hash of the student id, not the order of a listing)."""
    return int(hashlib.sha256(student.encode()).hexdigest(), 16) % n + 1


def done_marker(chapter, student, root):
    return Path(root) / "verdicts" / chapter / f"{student}.done"


def is_finished(chapter, student, root):
    """Graded and reconciled by an earlier run, and the submission has not changed since."""
    marker = done_marker(chapter, student, root)
    sub = Path(root) / "submitted" / student / chapter / nbtools.chapter_notebook(chapter).name
    return marker.exists() and graded(chapter, student, root) and marker.stat().st_mtime >= sub.stat().st_mtime


def graded(chapter, student, root):
    return (Path(root) / "autograded" / student / chapter / nbtools.chapter_notebook(chapter).name).exists()


def regrade_after_crash(chapter, student, root, source, timeout):
    """The submission's notebook was dropped (its kernel died): disable what kills it, grade the copy."""
    name = nbtools.chapter_notebook(chapter).name
    sub_path = Path(root) / "submitted" / student / chapter / name
    backup = Path(root) / "salvaged" / student / chapter
    submission, disabled = nbtools.read(sub_path), []
    for _ in range(MAX_SALVAGE_ROUNDS):
        with tempfile.TemporaryDirectory() as work:
            for f in sub_path.parent.iterdir():
                if f.is_file() and f != sub_path:
                    shutil.copy(f, work)
            cell = disable_killer(submission, source, work, timeout)
        if cell is None:
            break
        disabled.append(cell)
        if not (backup / name).exists():
            backup.mkdir(parents=True, exist_ok=True)
            shutil.copy(sub_path, backup / name)
        nbtools.write(submission, sub_path)
        confinement.autograde(chapter, root, student)
        if graded(chapter, student, root):
            return (f"graded after disabling {', '.join(disabled)}: it killed the kernel "
                    f"(original kept in {backup})")
    if not disabled:
        return "not graded: nbgrader failed on this notebook, but it runs without killing its kernel"
    return f"not graded: the kernel kept dying after disabling {', '.join(disabled)}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("chapter")
    ap.add_argument("--root", default=str(nbtools.ROOT), help="course directory (default: this repository)")
    ap.add_argument("--student", action="append", help="grade only these students")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS") or 1),
                    help="grade this many submissions at once (default: $JOBS or 1)")
    ap.add_argument("--shard", default=None, metavar="I/N",
                    help="grade only the I-th of N disjoint shares of the class (machines sharing one PostgreSQL gradebook)")
    ap.add_argument("--regrade", action="store_true", help="grade again students this course already finished")
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    os.environ["ATTNCOURSE_GRADING_KERNEL"] = "1"           # the salvage runs behave like nbgrader's
    os.environ["ATTNCOURSE_GRADING_SALT"] = course_salt(root)     # for the grading server (kernels never see it)
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    timeout = int(os.environ.get("ATTNCOURSE_CELL_TIMEOUT", "120"))
    source = nbtools.read(Path(root) / "chapters" / args.chapter / nbtools.chapter_notebook(args.chapter).name)
    ensure_assignment(args.chapter, root)
    students = args.student or sorted(p.parent.name for p in (root / "submitted").glob(f"*/{args.chapter}") if p.is_dir())
    if args.shard:
        i, n = (int(x) for x in args.shard.split("/"))
        if not 1 <= i <= n:
            raise SystemExit(f"--shard {args.shard}: expected I/N with 1 <= I <= N")
        students = [s for s in students if shard_of(s, n) == i]
    if not students:
        print(f"no submissions found in {root / 'submitted'}/<student>/{args.chapter}/")
        return 0
    t0 = time.perf_counter()
    status = {s: precheck(args.chapter, s, root) for s in students}
    finished = {s for s in students if status[s] is None and not args.regrade and is_finished(args.chapter, s, root)}
    for s in finished:
        status[s] = "graded earlier (kept; --regrade grades it again)"
    ok = [s for s in students if status[s] is None]
    repaired = {s: restore_test_cells(args.chapter, s, root, source) for s in ok}
    # A run starts each student's record of verdicts afresh; every kernel of the run (a retry alone, a salvage
    # after a crash) then adds to it, and the first verdict of each hidden test stands across all of them.
    for s in ok:
        (root / "verdicts" / args.chapter / f"{s}.jsonl").unlink(missing_ok=True)
        shutil.rmtree(root / "verdicts" / args.chapter / f"{s}.outputs", ignore_errors=True)
    # One nbgrader run per share of the students (JOBS shares, run at once): its start-up is paid
    # once per share.  nbgrader goes on with the next student when one fails; what failed is
    # picked up below.
    shares = [share for share in (ok[i::max(1, args.jobs)] for i in range(max(1, args.jobs))) if share]
    with ThreadPoolExecutor(max(1, len(shares))) as pool:
        list(pool.map(lambda share: confinement.autograde(args.chapter, root, only=share), shares))
    batch = time.perf_counter() - t0
    for s in ok:
        status[s] = "graded" if graded(args.chapter, s, root) else None
    for s in ok:
        if status[s] is None and len(ok) > 1:
            # nbgrader may have stopped a run at someone else's notebook: alone, this one may pass.
            confinement.autograde(args.chapter, root, s)
            status[s] = "graded" if graded(args.chapter, s, root) else None
        if status[s] is None:
            try:
                status[s] = regrade_after_crash(args.chapter, s, root, source, timeout)
            except Exception as exc:  # never let one student stop the class
                status[s] = f"not graded: {type(exc).__name__}: {exc}"
        if repaired[s] and status[s].startswith("graded"):
            status[s] += "; " + "; ".join(repaired[s])
    for s in ok:
        if status[s].startswith("graded") and confinement.read_record(root, args.chapter, s)[0] is None:
            # The launcher asks the server for a channel before any student code runs, so a missing
            # record is the grader's fault, never the student's: grade this one again, alone.
            confinement.autograde(args.chapter, root, s)
            if confinement.read_record(root, args.chapter, s)[0] is None:
                status[s] = "not graded: the grading server recorded nothing for its kernel (grade it again with --student)"
    # The server's record decides: scores nbgrader gave without a passing verdict become 0.
    release = nbtools.read(root / "release" / args.chapter / nbtools.chapter_notebook(args.chapter).name)
    confinement_seen = set()
    for s in ok:
        if graded(args.chapter, s, root):      # also "not graded" ones that nbgrader scored: their scores must not stand
            facts, changes = confinement.reconcile(args.chapter, root, s, source, release)
            confinement_seen.add(confinement.describe(facts))
            for cell, why in changes:
                status[s] += f"; {cell}: {why}"
        if status[s].startswith("graded"):
            # Code that reaches for the grading machinery: the points it could reach wait for an instructor.
            _, held = review.hold(args.chapter, root, s, nbtools.read(students_code(root, args.chapter, s)), release)
            if held:
                status[s] += f"; NEEDS REVIEW: points of {', '.join(sorted(held))} held (tools/review.py)"
            # Only now is this student finished: a run stopped before here grades them again.
            done_marker(args.chapter, s, root).write_text(status[s] + "\n")
    rows, flagged = [], []
    for student in students:
        score = notebook_score(root, args.chapter, student)
        sub = students_code(root, args.chapter, student)
        hits = audit(sub, release) if sub.exists() and status[student].startswith("graded") else []
        flagged += [(student, *h) for h in hits]
        rows.append((student, score, status[student], len(hits)))
    confinement_note = "; ".join(sorted(confinement_seen)) or "no submission was graded"
    audit_path = root / f"audit_{args.chapter}.csv"
    with open(audit_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "cell", "pattern", "line"])
        w.writerow(["(all)", "", "grading kernels", confinement_note])
        w.writerows(flagged)
    width = max(len(r[0]) for r in rows)
    print(f"grading kernels: {confinement_note}\n")
    held = [r for r in review.rows(root, args.chapter) if r["state"] == "held" and r["student"] in ok]
    if held:
        print(f"NEEDS REVIEW: {len({r['student'] for r in held})} submission(s) reach for the grading machinery; "
              f"their points there are held until you read the lines and release them "
              f"(make release-held CH={args.chapter} STUDENT=<name>):")
        for r in held:
            print(f"  {r['student']}  {r['cell']} line {r['line']}: {r['what']}: {r['code']}")
        print()
    print(f"{'student':<{width}}  {'score':>11}  audit  status")
    for student, score, state, n in rows:
        s = "-" if score is None or not state.startswith("graded") else f"{score[0]:g} / {score[1]:g}"
        print(f"{student:<{width}}  {s:>11}  {n or '':>5}  {state}")
    print(f"\nautograded {len(ok)} submission(s) in {time.perf_counter() - t0:.1f} s "
          f"({batch / max(len(ok), 1):.1f} s each in the class run)")
    if flagged:
        print(f"\n{len(flagged)} suspicious line(s) listed in {audit_path}: read them before releasing grades.")
    # Near-copies of the reference and between classmates, over the whole class (tools/similarity.py).
    copies = similarity.report(args.chapter, root)
    if copies:
        print("\n" + "\n".join(similarity.describe(args.chapter, copies)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
