"""The grader's side of confined grading: the class's grading server, the confined kernelspec,
nbgrader runs that use them, and the reconciliation of nbgrader's scores with the server's record.

See attncourse/sandbox.py (the kernel's confinement) and attncourse_ref/grading/__main__.py (the
server) for the other two sides.
"""
import ast
import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbtools

KERNEL = "attncourse-sandbox"
PROVISIONER = "attncourse-sandbox-provisioner"     # utils/pyproject.toml registers it
_server = _zygote = None
_server_lock = threading.Lock()     # JOBS=N: grader threads must share one server, not race to start several
atexit.register(lambda: stop_server())


def ensure_kernelspec():
    """Install the confined kernelspec into this environment (idempotent)."""
    # The provisioner gives each kernel Unix-socket channels in a folder of its own, which lets the
    # kernel live in a private network namespace.  log_level=ERROR: ipykernel's warnings (e.g. that
    # its channels are not encrypted; no other kernel can reach them) would print once per student.  xmode=Plain:
    # a traceback as Python prints it, each frame's line of code and the error (IPython's default, Context, has
    # stack_data parse and pygments colour every frame's scope: a third of a failing student's kernel time).
    spec = {"argv": [sys.executable, "-m", "attncourse.sandbox", "-f", "{connection_file}",
                     "--IPKernelApp.log_level=ERROR", "--InteractiveShell.xmode=Plain", "--ext=attncourse.diagnose"],
            "display_name": "Python 3 (attncourse grading sandbox)", "language": "python",
            "metadata": {"debugger": False,
                         "kernel_provisioner": {"provisioner_name": PROVISIONER}}}
    from importlib.metadata import entry_points
    if not entry_points(group="jupyter_client.kernel_provisioners", name=PROVISIONER):
        raise SystemExit(f"the grading kernel's provisioner {PROVISIONER!r} is not installed in this environment: "
                         "run `make env` (or `pip install -e utils`) again")
    path = Path(sys.prefix) / "share" / "jupyter" / "kernels" / KERNEL / "kernel.json"
    if not path.exists() or json.loads(path.read_text()) != spec:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(spec, indent=1))


def _mpl_cache():
    """Build matplotlib's font cache once, for every kernel to copy (saves each a rebuild)."""
    cache = Path(tempfile.gettempdir()) / "attncourse-mpl-cache"
    if not list(cache.glob("fontlist*")):
        cache.mkdir(exist_ok=True)
        subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], env=dict(os.environ, MPLCONFIGDIR=str(cache)),
                       capture_output=True)
    return str(cache)


def start_server(root):
    """Start the class's grading server for the course at ``root`` (once) and point kernel launchers at it."""
    with _server_lock:
        return _start_server(root)


def _start_server(root):
    global _server
    if _server is not None and _server.poll() is None and _server.root == str(root):
        return _server
    stop_server()
    ensure_kernelspec()
    private = tempfile.mkdtemp(prefix="attncourse-grader-")
    os.chmod(private, 0o711)             # kernels may reach a socket whose name they were given, not list
    control = os.path.join(private, "control.sock")
    env = {k: v for k, v in os.environ.items() if k != "ATTNCOURSE_GRADING_KERNEL"}
    env["OMP_NUM_THREADS"] = "1"
    _server = subprocess.Popen([sys.executable, "-I", "-m", "attncourse_ref.grading", "--serve", control,
                                "--root", str(root)], stdin=subprocess.PIPE, env=env)
    _server.root = str(root)
    _server.private = private
    if not _started(_server, control):
        raise SystemExit("the grading server did not start (is the reference package attncourse_ref installed?)")
    os.environ["ATTNCOURSE_GRADER_CONTROL"] = control
    os.environ["ATTNCOURSE_MPL_CACHE"] = _mpl_cache()
    _start_zygote(os.path.join(private, "zygote.sock"))
    return _server


def _start_zygote(path):
    """Start the grading kernels' zygote (attncourse/zygote.py: kernels forked with torch already imported) and
    point the provisioner at it; without one (not Linux, or ATTNCOURSE_KERNEL_ZYGOTE=0), each kernel starts a
    Python of its own."""
    global _zygote
    os.environ.pop("ATTNCOURSE_ZYGOTE", None)
    if not sys.platform.startswith("linux") or os.environ.get("ATTNCOURSE_KERNEL_ZYGOTE") == "0":
        return
    from attncourse.sandbox import kernel_environment
    # MPLCONFIGDIR: the zygote imports matplotlib once, from the font cache every kernel would copy.
    env = dict(kernel_environment(os.environ), MPLCONFIGDIR=os.environ["ATTNCOURSE_MPL_CACHE"])
    _zygote = subprocess.Popen([sys.executable, "-m", "attncourse.zygote", path], stdin=subprocess.PIPE,
                               env=env, cwd=tempfile.gettempdir())
    if _started(_zygote, path):
        os.environ["ATTNCOURSE_ZYGOTE"] = path
    else:
        print("warning: the grading kernels' zygote did not start; each kernel starts its own Python", file=sys.stderr)


def _started(proc, path):
    """Whether ``proc`` made its socket ``path`` (within 30 s, while it runs)."""
    for _ in range(600):
        if os.path.exists(path) or proc.poll() is not None:
            break
        time.sleep(0.05)
    return os.path.exists(path)


def stop_server():
    global _server, _zygote
    os.environ.pop("ATTNCOURSE_ZYGOTE", None)
    for proc in (_zygote, _server):
        if proc is not None:
            proc.stdin.close()               # both end when their standard input closes
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    if _server is not None:
        shutil.rmtree(_server.private, ignore_errors=True)     # its sockets and kernels' channels
    _server = _zygote = None


def autograde(chapter, root, student=None, only=None):
    """One nbgrader autograde run in confined kernels: the class, one ``student``, or the students
    in ``only`` (one run for a share of the class: nbgrader's start-up is paid once per share)."""
    start_server(root)
    who = ["--student", student] if student else []
    if only is not None:
        others = sorted(p.parent.name for p in (Path(root) / "submitted").glob(f"*/{chapter}")
                        if p.parent.name not in set(only))
        if any("," in s for s in [*others, *only]):
            # nbgrader's exclude list is comma-separated: with such ids, one run per student.
            return [autograde(chapter, root, s) for s in only][-1]
        who = ["--student", "*", f"--CourseDirectory.student_id_exclude={','.join(others)}"]
    # Several graders may share one SQLite gradebook (JOBS=N): wait for its lock instead of failing.
    db = [] if os.environ.get("NBGRADER_DB_URL") else [f"--CourseDirectory.db_url={nbtools.gradebook_url(root)}?timeout=120"]
    # nbgrader checks every cell's nbgrader metadata against its schema twice per notebook (0.19 s a student, with
    # jsonschema compiling the schema for each cell); grade_class.restore_test_cells has checked the same cells
    # already and dropped what nbgrader could not read (tools/benchmark.py grades notebooks made from the release), and
    # the cells nbgrader overwrites come from its gradebook.
    return nbtools.nbgrader("autograde", chapter, *who, "--create", "--force", *db,
                            f"--Execute.kernel_name={KERNEL}", "--CheckCellMetadata.enabled=False", root=root)


# ---- reconciliation ----------------------------------------------------------------------------

def hidden_ids(source_nb):
    """{test cell grade_id: hidden test id} from the instructor notebook's hidden regions."""
    ids = {}
    for cell in source_nb.cells:
        if nbtools.is_test(cell):
            m = re.search(r'grade\("([\w.]+)"', cell.source.partition("### BEGIN HIDDEN TESTS")[2])
            if m:
                ids[nbtools.grade_info(cell)["grade_id"]] = m.group(1)
    return ids


def read_record(root, chapter, student):
    """(sandbox facts of the student's last kernel or None, {hidden test id: passed}, {hidden test id:
    forbidden built-ins}, [hidden test ids asked again], {hidden test id: grading error}) from the server's
    record of this run's kernels.  The server answers each test once per student and run (a later kernel
    gets the first verdict again), so a test has one verdict: the first."""
    path = Path(root) / "verdicts" / chapter / f"{student}.jsonl"
    facts, verdicts, forbid, refused, errors = None, {}, {}, [], {}
    if path.exists():
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if "sandbox" in entry:
                facts, forbid = entry["sandbox"], entry.get("forbid", {})
            elif "refused" in entry:
                refused.append(entry["refused"])
            elif "grading_error" in entry:
                errors.setdefault(entry["test"], entry["grading_error"])
            elif "test" in entry:
                verdicts.setdefault(entry["test"], bool(entry["passed"]))
    return facts, verdicts, forbid, refused, errors


def forbidden_uses(named, paths):
    """Forbidden built-ins that the submission's solution cells, or cells it added or changed, name:
    as an attribute (F.layer_norm), an imported name, or a string of that name (getattr(F, "...")).
    ``named``: ``names_in`` of the submission, scanned once for all its hidden tests.  Spellings built at
    run time escape this scan; the grading client's run-time guard and the audit (dynamic code) cover those."""
    finals = {_final(p) for p in paths}
    found = []
    for names, strings in named:
        names = names | (strings & finals)             # getattr(F, "layer_norm")
        found += sorted(p for p in paths if _final(p) in names)
    return found


def names_in(submission, release_nb):
    """[(names, string constants)] of each cell that ``forbidden_uses`` scans: the attributes and imported
    names it uses, and its strings (every word of a cell that does not parse is both)."""
    given = nbtools.given_code(release_nb)
    out = []
    for cell in submission.cells:
        if cell.cell_type != "code" or nbtools.is_test(cell) or (cell.source in given and not nbtools.is_solution(cell)):
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            words = set(re.findall(r"\w+", cell.source))
            out.append((words, words))
            continue
        names, strings = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.add(node.name.rsplit(".", 1)[-1])
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.add(node.value)
        out.append((names, strings))
    return out


def _final(path):
    """The name code would use: layer_norm for torch.nn.functional.layer_norm, _softmax for aten::_softmax."""
    return path.split("::")[-1].rsplit(".", 1)[-1]


def reconcile(chapter, root, student, source_nb, release_nb):
    """Make the gradebook agree with the server's record; return [(cell, why)] for every change."""
    from nbgrader.api import Gradebook, MissingEntry
    name = nbtools.chapter_notebook(chapter).stem
    facts, verdicts, forbid, refused, errors = read_record(root, chapter, student)
    sub_path = Path(root) / "submitted" / student / chapter / f"{name}.ipynb"
    submission = nbtools.read(sub_path)
    changes, named = [], names_in(submission, release_nb)
    with Gradebook(nbtools.gradebook_url(root)) as gb:
        for cell, test_id in hidden_ids(source_nb).items():
            try:
                grade = gb.find_grade(cell, name, chapter, student)
            except MissingEntry:
                continue
            uses = forbidden_uses(named, forbid.get(test_id, ()))
            why = None
            if test_id in refused:
                changes.append((cell, f"{test_id} asked twice: the first verdict stands"))
            if test_id in errors and test_id not in verdicts:
                changes.append((cell, f"GRADING ERROR in {test_id} (the grader's, not the student's: its cases could "
                                      f"not be built: {errors[test_id]}); regrade this cell once it is fixed"))
            if uses:
                why = f"the submission calls {', '.join(sorted(set(uses)))}, which {test_id} forbids"
            elif not verdicts.get(test_id, False):
                why = ("no verdict recorded by the grading server" if test_id not in verdicts
                       else "the grading server recorded a failed verdict")
            if why and (grade.auto_score or 0) > 0:
                changes.append((cell, f"{why}: nbgrader's {grade.auto_score:g} point(s) set to 0"))
                grade.auto_score = 0
            elif why and uses:
                changes.append((cell, why))
        gb.db.commit()
    return facts, changes


def describe(facts):
    """One line on what confinement held for a submission's kernel, and what did not (without root,
    no cgroup can be made; without namespaces, the machine's socket folders stay in view)."""
    if facts is None:
        return "no confined kernel ran"
    if not facts.get("landlock_abi"):
        return "UNCONFINED: this platform has no Landlock; the kernel could read and write as the grader"
    network = facts.get("network") or "the machine's"
    held = [f"Landlock ABI {facts['landlock_abi']}", f"network: {network}"]
    missing = []
    if facts.get("cgroup"):
        held.append("processes: pids cgroup")
    else:
        missing.append("no pids cgroup (not root): RLIMIT_NPROC counts every process of the grader's user")
    if facts.get("memory_cgroup"):
        held.append("memory: cgroup, children included")
    else:
        missing.append("no memory cgroup (not root): a child process that exits before its case ends is left "
                       "out of the peak-memory measurement")
    if facts.get("sockets_hidden"):
        held.append("Unix socket folders hidden")
    else:
        missing.append("no mount namespace: the kernel can connect to a Unix socket whose path it knows")
    return f"confined ({', '.join(held)})" + (f"; NOT HELD: {'; '.join(missing)}" if missing else "")
