"""A learner's self-check before submitting: python tools/validate.py path/to/notebook.ipynb

Runs the notebook top to bottom in a fresh kernel, as the grader will (same per-cell timeout,
ATTNCOURSE_CELL_TIMEOUT, default 120 s), and prints one line per graded test cell: passes the
visible checks, fails (with the check's message), or not done yet.  The hidden tests run only at
grading time; passing here is necessary, not sufficient.  Exit status 0 when every test cell passes.
"""
import argparse
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbtools  # noqa: E402
from attncourse.i18n import set_language, translate  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def verdict(cell):
    """('pass' | 'not done' | 'fail', message) from a test cell's outputs."""
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if not errors:
        return "pass", ""
    err = errors[0]
    text = ANSI.sub("", f"{err.get('ename')}: {err.get('evalue')}")
    if err.get("ename") in ("NotDoneYet", "NotImplementedError") or "not implemented yet" in text:
        return "not done", translate("replace `raise NotImplementedError()` with your code")
    if err.get("ename") == "NameError":
        return "fail", text + " " + translate("(did the cell that defines it run without an error?)")
    return "fail", text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebook")
    args = ap.parse_args(argv)
    path = Path(args.notebook).resolve()
    if not path.exists():
        raise SystemExit(f"no such notebook: {path}")
    try:
        nb = nbtools.read(path)
    except Exception as exc:
        raise SystemExit(f"{path} is not a readable notebook: {exc}")
    # A Chinese notebook (make release LANG=zh) gets its report in Chinese, as its checks speak Chinese.
    set_language(nb.metadata.get("attncourse", {}).get("language", "en"))
    tests = [c for c in nb.cells if nbtools.is_test(c)]
    if not tests:
        raise SystemExit(f"{path.name} has no graded test cells: is it a chapter notebook of this course?")
    timeout = int(os.environ.get("ATTNCOURSE_CELL_TIMEOUT", "120"))
    print(translate(f"running {path.name} top to bottom (cell timeout {timeout} s, as the grader) ..."), flush=True)
    os.environ["ATTNCOURSE_GRADING_KERNEL"] = "1"            # demos shrink as they do under the grader
    nbtools.execute(nb, path.parent, timeout=timeout, interrupt_on_timeout=True)
    points = {"pass": 0.0, "total": 0.0}
    width = max(len(nbtools.grade_info(c)["grade_id"]) for c in tests)
    symbol = {"pass": "\u2713", "fail": "\u2717", "not done": "\u00b7"}
    for cell in (c for c in nb.cells if nbtools.is_test(c)):
        gid, pts = nbtools.grade_info(cell)["grade_id"], float(nbtools.grade_info(cell).get("points", 0))
        state, message = verdict(cell)
        points["total"] += pts
        points["pass"] += pts if state == "pass" else 0
        said = {"pass": translate("passes its visible checks"), "fail": translate("fails a visible check"),
                "not done": translate("not done yet")}[state]
        print(f"{symbol[state]} {gid:<{width}}  {pts:g} pt  {said}" + (f": {message}" if message else ""))
    print("\n" + translate(f"visible checks pass for {points['pass']:g} of {points['total']:g} points. The hidden "
                           "tests (run when your notebook is graded) try many more shapes, dtypes and seeds."))
    return 0 if points["pass"] == points["total"] else 1


if __name__ == "__main__":
    sys.exit(main())
