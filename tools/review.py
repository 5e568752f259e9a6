"""Submissions that reach for the grading machinery: their points are held until an instructor reads them.

    python tools/review.py CHAPTER [--root DIR]                      list what is held (review_<chapter>.csv)
    python tools/review.py CHAPTER --release STUDENT [--root DIR]    release a student's held points

The run-time guards of a from-scratch exercise (attncourse.forbid) live in the learner's own process, so code
there can try to switch them off: torch's private machinery (``torch._C.DisableTorchFunction``,
``_disable_current_modes``), a dispatch or torch-function mode of its own, a function's ``__globals__`` or
``__code__``, ``vars()`` or ``__dict__`` of a module, ``sys.modules``, an attribute of torch or the course's modules
replaced, ``getattr`` with a computed name on them, frames, ``gc``'s object lists, ``ctypes``.  None of that belongs in an honest solution (the reference
and every zoo variant are checked to use none of it: tests/test_review.py), so it is not granted silently:
tools/grade_class.py holds the points of every test cell the code can reach (its own exercise's for a solution
cell; every later test cell for a cell the student added or changed) by setting nbgrader's manual score to 0,
lists the student first in its report under "needs review" with the lines, and writes review_<chapter>.csv.
Releasing sets the manual scores back to none, so nbgrader's automatic scores stand again.
"""
import argparse
import ast
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbtools  # noqa: E402

# Dunder attributes that reach into functions, frames, modules and classes rather than compute anything.
INTROSPECTION = {"__globals__", "__code__", "__closure__", "__dict__", "__builtins__", "__subclasses__",
                 "__defaults__", "__kwdefaults__", "__self__", "__func__", "__wrapped__"}
# Names of torch's switches for its own dispatch (private or not).
SWITCHES = {"DisableTorchFunction", "DisableTorchFunctionSubclass", "TorchFunctionMode", "TorchDispatchMode",
            "_disable_current_modes", "_pop_mode", "_pop_mode_temporarily", "_push_mode", "_get_current_dispatch_mode",
            "__torch_function__", "__torch_dispatch__", "_set_torch_function_mode", "_len_torch_function_stack",
            "_DisableFuncTorch", "_ExcludeDispatchKeyGuard", "_AutoDispatchBelowAutograd"}
FRAMES = {"_getframe", "f_globals", "f_locals", "f_back", "f_builtins", "get_objects", "get_referrers",
          "get_referents", "currentframe"}
GUARDED_ROOTS = ("torch", "attncourse")


def _module_aliases(tree):
    """Names a cell binds to torch's or the course's modules and objects by import: {name: module path}."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in GUARDED_ROOTS:
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in GUARDED_ROOTS:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _private(part):
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _chain(node):
    """(root name, [attribute names]) of ``a.b.c``, or (None, names) when the root is not a plain name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return (node.id if isinstance(node, ast.Name) else None), parts[::-1]


def machinery(source, aliases=None):
    """[(line number, what)] where ``source`` reaches for the grading machinery (see the module's docstring).
    ``aliases``: the notebook's imports of torch and the course ({name: module}), which a cell may use
    without importing them itself."""
    try:
        tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))
    except SyntaxError:
        return []
    aliases = {**dict.fromkeys(GUARDED_ROOTS, ""), **(aliases or {}), **_module_aliases(tree)}
    found = []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            paths = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [f"{node.module or ''}.{a.name}" for a in node.names]
            for path in paths:
                parts = path.split(".")
                if parts[0] in GUARDED_ROOTS and any(_private(p) for p in parts):
                    what = f"imports private machinery ({path})"
                elif parts[-1] in SWITCHES:
                    what = f"imports a dispatch switch ({path})"
                elif parts[0] in ("ctypes", "gc"):
                    what = f"imports {parts[0]}"
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                root, parts = _chain(target)
                if isinstance(target, ast.Attribute) and root in aliases:
                    what = f"replaces an attribute of a library module ({'.'.join([root, *parts])})"
        elif isinstance(node, ast.Attribute):
            root, parts = _chain(node)
            if root == "sys" and parts[:1] == ["modules"]:
                what = "reaches modules through sys.modules"
            elif node.attr in INTROSPECTION:
                what = f"reads {node.attr}"
            elif node.attr in SWITCHES:
                what = f"uses a dispatch switch ({node.attr})"
            elif node.attr in FRAMES:
                what = f"reaches into frames or the object graph ({node.attr})"
            elif root in aliases and _private(node.attr):
                what = f"uses a private attribute ({'.'.join([root, *parts])})"
        elif isinstance(node, ast.Name) and node.id in SWITCHES and node.id not in ("__torch_function__",):
            what = f"uses a dispatch switch ({node.id})"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in ("__torch_function__",
                                                                                        "__torch_dispatch__"):
            what = f"defines {node.name}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name, args = node.func.id, node.args
            if name in ("vars", "globals") and (args or name == "globals"):
                what = f"calls {name}()"
            elif name in ("getattr", "setattr", "delattr", "hasattr") and args:
                root, _ = _chain(args[0])
                attr = args[1] if len(args) > 1 else None
                constant = isinstance(attr, ast.Constant) and isinstance(attr.value, str)
                if root in aliases and (not constant or _private(attr.value)):
                    what = f"{name} on {ast.unparse(args[0])} with " + \
                        (f"a private name ({attr.value})" if constant else "a computed name")
                elif constant and attr.value in INTROSPECTION | SWITCHES:
                    what = f"{name} of {attr.value}"
        if what:
            found.append((node.lineno, what))
    return sorted(set(found))


def notebook_aliases(nb):
    aliases = {}
    for cell in nb.cells:
        if cell.cell_type == "code":
            try:
                aliases.update(_module_aliases(ast.parse(cell.source)))
            except SyntaxError:
                pass
    return aliases


def findings(submission, release_nb):
    """[(cell index, grade_id or "cell N", line number, what, line)] for the student's own code: solution cells
    and cells the release does not give unchanged (test cells are the grader's)."""
    given = nbtools.given_code(release_nb)
    aliases = notebook_aliases(submission)
    out = []
    for i, cell in enumerate(submission.cells):
        if cell.cell_type != "code" or nbtools.is_test(cell) or (cell.source in given and not nbtools.is_solution(cell)):
            continue
        lines = cell.source.splitlines()
        for lineno, what in machinery(cell.source, aliases):
            out.append((i, nbtools.grade_info(cell).get("grade_id", f"cell {i}"), lineno, what,
                        lines[lineno - 1].strip() if lineno <= len(lines) else ""))
    return out


def held_cells(submission, hits):
    """Test cells whose points a hit holds: a solution cell's own tests (those before the next solution cell),
    every later test cell for any other cell."""
    held = set()
    for i, *_ in hits:
        solution = nbtools.is_solution(submission.cells[i])
        for cell in submission.cells[i + 1:]:
            if solution and nbtools.is_solution(cell):
                break
            if nbtools.is_test(cell):
                held.add(nbtools.grade_info(cell)["grade_id"])
    return held


def review_path(root, chapter):
    return Path(root) / f"review_{chapter}.csv"


def hold(chapter, root, student, submission, release_nb):
    """Hold the points a submission's machinery could reach; return [(cell, line number, what, line)], held
    cells. The student's previous entries in review_<chapter>.csv are replaced."""
    from nbgrader.api import Gradebook, MissingEntry
    hits = findings(submission, release_nb)
    held = held_cells(submission, hits)
    name = nbtools.chapter_notebook(chapter).stem
    # A regrade starts afresh: what an earlier run held (and nothing an instructor graded by hand) is let go first.
    before = {c for r in rows(root, chapter) if r["student"] == student and r["state"] == "held" for c in r["held"].split()}
    if held or before:
        with Gradebook(nbtools.gradebook_url(root)) as gb:
            for cell in before | held:
                try:
                    gb.find_grade(cell, name, chapter, student).manual_score = 0 if cell in held else None
                except MissingEntry:
                    pass
            gb.db.commit()
    entries = [r for r in rows(root, chapter) if r["student"] != student]
    entries += [{"student": student, "cell": gid, "line": str(lineno), "what": what, "code": code,
              "held": " ".join(sorted(held)), "state": "held"} for _, gid, lineno, what, code in hits]
    _write(root, chapter, entries)
    return [h[1:] for h in hits], held


def release(chapter, root, student):
    """Let nbgrader's automatic scores stand again for a student's held cells; return the cells released."""
    from nbgrader.api import Gradebook, MissingEntry
    entries = rows(root, chapter)
    cells = {c for r in entries if r["student"] == student and r["state"] == "held" for c in r["held"].split()}
    name = nbtools.chapter_notebook(chapter).stem
    with Gradebook(nbtools.gradebook_url(root)) as gb:
        for cell in cells:
            try:
                gb.find_grade(cell, name, chapter, student).manual_score = None
            except MissingEntry:
                pass
        gb.db.commit()
    for r in entries:
        if r["student"] == student:
            r["state"] = "released"
    _write(root, chapter, entries)
    return sorted(cells)


FIELDS = ["student", "cell", "line", "what", "code", "held", "state"]


def rows(root, chapter):
    path = review_path(root, chapter)
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _write(root, chapter, rows):
    with open(review_path(root, chapter), "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        w.writerows(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("chapter")
    ap.add_argument("--root", default=str(nbtools.ROOT), help="course directory (default: this repository)")
    ap.add_argument("--release", metavar="STUDENT", help="release this student's held points")
    args = ap.parse_args(argv)
    if args.release:
        cells = release(args.chapter, args.root, args.release)
        if not cells:
            print(f"{args.release}: nothing held in {args.chapter}")
            return 1
        print(f"{args.release}: released {', '.join(cells)} (nbgrader's automatic scores stand)")
        return 0
    entries = rows(args.root, args.chapter)
    for r in entries:
        print(f"{r['state']:<9} {r['student']}  {r['cell']} line {r['line']}: {r['what']}: {r['code']}")
    if not entries:
        print(f"nothing held in {args.chapter}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
