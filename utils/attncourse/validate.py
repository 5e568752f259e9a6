"""A learner's self-check before submitting: attncourse validate path/to/notebook.ipynb

Runs the notebook top to bottom in a fresh kernel, as the grader will (same per-cell timeout,
ATTNCOURSE_CELL_TIMEOUT, default 120 s), and prints one line per graded test cell: passes the
visible checks, fails (with the check's message), or not done yet.  The hidden tests run only at
grading time; passing here is necessary, not sufficient.  Exit status 0 when every test cell passes.

It needs only the learner package and what it declares (nbformat, nbclient, ipykernel): no make,
no nbgrader, no course repository.  A notebook that still holds hidden-test regions (an instructor's
copy) has them run only where the course's grading package (attncourse_ref) is installed; elsewhere
they are left out, and the report says so.
"""
import argparse
import importlib.util
import os
import re
import sys
from pathlib import Path

from .i18n import set_language, translate

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# A hidden-test region (spaces written \x20, so that the catalogue's extraction sees no message here)
HIDDEN = re.compile(r"^[\t\x20]*###\x20BEGIN\x20HIDDEN\x20TESTS[\t\x20]*\n.*?^[\t\x20]*###\x20END\x20HIDDEN\x20TESTS[\t\x20]*(\n|$)",
                    re.M | re.S)
# ipykernel warns on every start that it runs over TCP without encryption (loopback ports only).
QUIET_KERNEL = ["--IPKernelApp.log_level=ERROR"]


def grade_info(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


def is_test(cell):
    info = grade_info(cell)
    return bool(info.get("grade")) and not info.get("solution")


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


def without_hidden_tests(nb):
    """Remove the hidden-test regions of the test cells; True if there were any."""
    found = False
    for cell in nb.cells:
        if is_test(cell) and HIDDEN.search(cell.source):
            cell.source, found = HIDDEN.sub("", cell.source).rstrip("\n"), True
    return found


def execute(nb, cwd, timeout):
    """Execute ``nb`` in place in a fresh python3 kernel started in ``cwd``, as the grader does: errors
    stay in the outputs, and so does a cell that ran past ``timeout``."""
    from nbclient import NotebookClient
    NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True, interrupt_on_timeout=True,
                   extra_arguments=QUIET_KERNEL, resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def main(argv=None, prog=None):
    import nbformat
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("notebook")
    args = ap.parse_args(argv)
    path = Path(args.notebook).resolve()
    if not path.exists():
        raise SystemExit(f"no such notebook: {path}")
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception as exc:
        raise SystemExit(f"{path} is not a readable notebook: {exc}")
    # A Chinese notebook (make release LANG=zh) gets its report in Chinese, as its checks speak Chinese.
    set_language(nb.metadata.get("attncourse", {}).get("language", "en"))
    tests = [c for c in nb.cells if is_test(c)]
    if not tests:
        raise SystemExit(f"{path.name} has no graded test cells: is it a chapter notebook of this course?")
    # The hidden tests need the grading server (attncourse_ref), which learners do not have.
    hidden_left_out = importlib.util.find_spec("attncourse_ref") is None and without_hidden_tests(nb)
    timeout = int(os.environ.get("ATTNCOURSE_CELL_TIMEOUT", "120"))
    print(translate(f"running {path.name} top to bottom (cell timeout {timeout} s, as the grader) ..."), flush=True)
    os.environ["ATTNCOURSE_GRADING_KERNEL"] = "1"            # demos shrink as they do under the grader
    execute(nb, path.parent, timeout)
    points = {"pass": 0.0, "total": 0.0}
    width = max(len(grade_info(c)["grade_id"]) for c in tests)
    symbol = {"pass": "\u2713", "fail": "\u2717", "not done": "\u00b7"}
    for cell in (c for c in nb.cells if is_test(c)):
        gid, pts = grade_info(cell)["grade_id"], float(grade_info(cell).get("points", 0))
        state, message = verdict(cell)
        points["total"] += pts
        points["pass"] += pts if state == "pass" else 0
        said = {"pass": translate("passes its visible checks"), "fail": translate("fails a visible check"),
                "not done": translate("not done yet")}[state]
        padded = gid.ljust(width)
        print(translate(f"{symbol[state]} {padded}  {pts:g} pt  {said}") + (f": {message}" if message else ""))
    print("\n" + translate(f"visible checks pass for {points['pass']:g} of {points['total']:g} points. The hidden "
                           "tests (run when your notebook is graded) try many more shapes, dtypes and seeds."))
    if hidden_left_out:
        print(translate("This notebook holds hidden tests, but the course's grading package (attncourse_ref) is not "
                        "installed here: they were left out, and only the visible checks ran."))
    return 0 if points["pass"] == points["total"] else 1


if __name__ == "__main__":
    sys.exit(main())
