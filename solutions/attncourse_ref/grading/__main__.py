"""The grading server (see attncourse.autograde for the client side).

Two ways to run it:

- ``python -I -m attncourse_ref.grading``: one session over stdin/stdout.  The maintainers' tests
  (``run_hidden_test`` outside a grading kernel) use this.
- ``python -I -m attncourse_ref.grading --serve CONTROL --root COURSE``: the class grader's server.
  ``tools/grade_class.py`` starts one per class run, before any kernel; it lives until its stdin
  closes.  Each confined kernel's launcher (attncourse.sandbox), before it confines itself, asks
  on the CONTROL socket for a channel, naming the folder it runs in; the server refuses callers
  that are already confined (NoNewPrivs), so a kernel cannot ask in a classmate's name.  A channel
  is a Unix socket with a secret token.  Each connection is served by a forked child (the reference
  is imported once, in the parent), which appends every verdict to the student's record
  ``COURSE/verdicts/<chapter>/<student>.jsonl``.  Kernels cannot write there: the record, not what
  a test cell printed, is what the grader turns into scores.
- While a kernel lives the server also watches it from outside: a kernel whose folders grow past
  the disk quota, or whose processes reach the process limit (a fork loop), is killed, and the
  grader then disables the cell that did it (tools/grade_class.py).
"""
import contextlib
import importlib
import json
import os
import pkgutil
import secrets
import selectors
import shutil
import signal
import socket
import sys
import time

from attncourse import _wire

from . import ALLOW, FORBID, REGISTRY, compare, seed_for


BROKEN = {}          # chapter -> why its hidden tests could not be loaded


def load_chapters():
    """Import every chapter module of this package (chNN.py); each registers its hidden tests.

    A chapter whose module fails to import is remembered, not fatal: the other chapters still grade,
    and a hidden test of the broken chapter is answered with the reason.
    """
    from attncourse_ref import grading
    for info in pkgutil.iter_modules(grading.__path__):
        if info.name.startswith("ch"):
            try:
                importlib.import_module(f"attncourse_ref.grading.{info.name}")
            except Exception as exc:
                BROKEN[info.name] = f"{type(exc).__name__}: {exc}"


def _status_kb(pid, field):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _tree(pid):
    """``pid`` and its living descendants, this server left out (a kernel's own server, in a test, is its child)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += [c for c in children.get(found[-1], []) if c != os.getpid()]
    return found


def _anonymous_referenced(pids):
    """Bytes of anonymous memory (the heap, tensors; not the code of libraries) that ``pids`` read or wrote
    since their referenced bits were last cleared (/proc/PID/clear_refs), from /proc/PID/smaps; None if
    unreadable."""
    total = 0
    try:
        for pid in pids:
            anonymous = False
            for line in open(f"/proc/{pid}/smaps"):
                if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                    fields = line.split()
                    anonymous = len(fields) < 6 or fields[5] in ("[heap]", "[stack]")
                elif anonymous and line.startswith("Referenced:"):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return total


class PeakMemory:
    """How much a kernel's memory grows at its highest while one case runs, and how much memory the case
    touches, measured from outside.

    With the kernel's memory cgroup (the launcher makes one when it runs as root), every process of
    the kernel counts, children that computed and exited included: cgroup v1's max_usage_in_bytes,
    or v2's memory.peak, reset when the case starts.  Without one, the peak resident memory of each
    process of the kernel still alive when the case ends (a child that has exited is not seen).

    Growth misses memory allocated before the case: a full score matrix written into a buffer the
    submission made (and touched) in advance grows nothing.  So ``touched`` also counts the anonymous
    memory the kernel's processes read or wrote while the case ran (their pages' referenced bits,
    cleared when it starts), wherever it was allocated.
    """

    def __init__(self, pid, cgroup=None):
        self.pid, self.cgroup, self.fd, self.base, self.touched = pid, cgroup, None, None, None
        self.cleared = False

    def _clear_referenced(self):
        self.cleared = True
        for p in _tree(self.pid):
            try:
                with open(f"/proc/{p}/clear_refs", "w") as f:
                    f.write("1")                   # clears the referenced bits of every page
            except OSError:
                self.cleared = False

    def _file(self, name):
        return os.path.join(self.cgroup, name)

    def start(self):
        self._clear_referenced()
        if self.cgroup and os.path.exists(self._file("memory.max_usage_in_bytes")):
            with open(self._file("memory.max_usage_in_bytes"), "w") as f:
                f.write("0")                       # resets the peak to the current usage
            self.base = int(open(self._file("memory.usage_in_bytes")).read())
        elif self.cgroup and os.path.exists(self._file("memory.peak")):
            self.fd = os.open(self._file("memory.peak"), os.O_RDWR)
            os.write(self.fd, b"reset")            # for reads through this descriptor (Linux 6.12+)
            self.base = int(open(self._file("memory.current")).read())
        else:
            for p in _tree(self.pid):
                try:
                    with open(f"/proc/{p}/clear_refs", "w") as f:
                        f.write("5")               # resets the peak (VmHWM) to the current size
                except OSError:
                    pass
            sizes = [_status_kb(p, "VmRSS") for p in _tree(self.pid)]
            self.base = sum(x for x in sizes if x) if sizes and sizes[0] is not None else None
        return self.base

    def stop(self):
        """Growth in bytes since start(), or None where it could not be measured; sets ``touched`` (bytes, or
        None where the referenced bits could not be cleared or read)."""
        self.touched = _anonymous_referenced(_tree(self.pid)) if self.cleared else None
        try:
            if self.base is None:
                return None
            if self.fd is not None:
                peak = int(os.pread(self.fd, 64, 0))
            elif self.cgroup and os.path.exists(self._file("memory.max_usage_in_bytes")):
                peak = int(open(self._file("memory.max_usage_in_bytes")).read())
            else:
                peak = sum(x or 0 for x in (_status_kb(p, "VmHWM") for p in _tree(self.pid)))
            return peak - self.base
        except (OSError, ValueError):
            return None
        finally:
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None


# A memory-bounded case may read or write three times the memory it may grow by: honest tiled attentions on the
# N = 4096 case touched 6.5 to 17 MiB here (allocators reuse freed memory at other addresses), the full score
# matrix alone is 64 MiB.
TOUCH_FACTOR = 3


def _judge(test_id, cases, answer, got, peaks):
    failures = []
    for i, (case, res) in enumerate(zip(cases, answer.get("results", []))):
        if "error" in res:
            reason = f"your code raised {res['error']}"
        else:
            reason = compare(case, [got.get(f"c{i}/out{j}") for j in range(int(res.get("n", 0)))])
        limit = case.call.get("peak_bytes")
        if reason is None and limit is not None:
            peak, touched = peaks.get(i, (None, None))
            if peak is None:
                reason = "its peak memory was not measured (the case must run between 'begin' and 'end')"
            elif peak > limit:
                reason = (f"peak memory grew by {peak / 2**20:.1f} MiB while it ran; the exercise allows "
                          f"{limit / 2**20:.1f} MiB (far less than the tensor the case's description names)")
            elif touched is not None and touched > TOUCH_FACTOR * limit:
                reason = (f"it read or wrote {touched / 2**20:.1f} MiB of memory while it ran; the exercise allows "
                          f"{TOUCH_FACTOR * limit / 2**20:.1f} MiB (such a tensor written into memory made "
                          f"before the case counts too)")
        if reason:
            failures.append(f"case {i + 1} {case.describe}: {reason}")
    if len(answer.get("results", [])) != len(cases):
        failures.append(f"{len(cases)} cases were sent, {len(answer.get('results', []))} answered")
    return failures


def _first_request(record, test_id):
    """(first, earlier verdict): whether this kernel asks for ``test_id`` for the first time, and the verdict
    an earlier kernel of the same grading run obtained for it (None if none); notes the request in the record
    either way.  The server answers each hidden test once per student and run: a kernel that could ask again,
    or a submission that killed its kernel to be graded in a fresh one, would learn from each verdict and
    converge on the reference's outputs by guessing.  The record holds one "sandbox" line per kernel."""
    import fcntl
    fcntl.flock(record.fileno(), fcntl.LOCK_EX)    # the kernel's connections are served by parallel children
    try:
        asked, earlier = False, None
        with open(record.name) as f:
            for line in f:
                entry = json.loads(line) if line.strip() else {}
                if "sandbox" in entry:
                    asked = False                      # a later kernel of the run: its own requests from here
                elif entry.get("asked") == test_id:
                    asked = True
                elif entry.get("test") == test_id and earlier is None and "n_cases" in entry:
                    earlier = {"test": test_id, "n_cases": entry["n_cases"], "failures": entry["failures"]}
        record.write(json.dumps({"asked": test_id} if not asked else {"refused": test_id}) + "\n")
        record.flush()
        return not asked, earlier
    finally:
        fcntl.flock(record.fileno(), fcntl.LOCK_UN)


CASE_CACHE = None    # serve() sets it: a folder of the grader's where each hidden test's built cases are kept
KEPT = None          # a private server (one process, main()) keeps them here instead: {file name: pickled cases}


def build_cases(test_id):
    """The hidden test's cases (inputs and the reference's answers), drawn with the test's seed.  They depend on
    the test and the salt alone, so the class server builds each once per run and keeps it in CASE_CACHE for
    every later kernel (a forked child each): chapter 05's builders take seconds per student otherwise.  The
    folder is the grader's own (its private folder, out of every kernel's reach)."""
    import pickle

    import numpy as np
    import torch
    seed = seed_for(test_id)
    name = f"{test_id}.{seed}.pickle"
    if KEPT is not None and name in KEPT:
        return pickle.loads(KEPT[name])             # unpickled afresh, as from the class server's folder
    path = os.path.join(CASE_CACHE, name) if CASE_CACHE else None
    if path and os.path.exists(path):
        try:
            with open(path, "rb") as f:
                return pickle.load(f)
        except Exception:               # half written by a child that died, or unreadable: build again
            pass
    torch.manual_seed(seed)
    cases = REGISTRY[test_id](np.random.default_rng(seed))
    if KEPT is not None:
        with contextlib.suppress(Exception):       # a case that does not pickle is simply built again next time
            KEPT[name] = pickle.dumps(cases)
    if path:
        try:
            tmp = f"{path}.{os.getpid()}"
            with open(tmp, "wb") as f:
                pickle.dump(cases, f)
            os.replace(tmp, path)        # whole or not at all, as several children may build at once
        except Exception:               # a case that does not pickle is simply built again next time
            pass
    return cases


def session(rfile, wfile, peer_pid=None, record=None, memory_cgroup=None):
    """Serve one kernel until it hangs up.  ``record``: a file object each verdict is appended to;
    ``memory_cgroup``: the kernel's, where its launcher made one (memory is then measured for it whole)."""
    while True:
        try:
            req, _ = _wire.recv(rfile)
        except EOFError:
            return
        test_id = req.get("test")
        if test_id not in REGISTRY:
            chapter = str(test_id).split(".", 1)[0]
            why = f"; its chapter failed to load: {BROKEN[chapter]}" if chapter in BROKEN else ""
            _wire.send(wfile, {"error": f"unknown hidden test {test_id!r}{why}"})
            continue
        if record is not None:
            first, earlier = _first_request(record, test_id)
            if not first:
                _wire.send(wfile, {"error": f"hidden test {test_id} was already asked in this kernel: only its first "
                                            "verdict counts"})
                continue
            if earlier is not None:            # an earlier kernel of this run was answered: that verdict stands
                _wire.send(wfile, {"replay": earlier})
                continue
        try:
            cases = build_cases(test_id)
        except Exception as exc:        # the grader's fault, not the student's: say so, and serve the next test
            why = f"{type(exc).__name__}: {exc}"
            if record is not None:
                record.write(json.dumps({"test": test_id, "passed": False, "grading_error": why}) + "\n")
                record.flush()
            _wire.send(wfile, {"error": f"grading error in hidden test {test_id} (not your code): its cases could "
                                        f"not be built ({why}); your instructor will regrade it"})
            continue
        # A case with a memory bound keeps its inputs back until the kernel says it starts it.
        withheld = {i for i, c in enumerate(cases) if "peak_bytes" in c.call}
        arrays = {f"c{i}/{k}": v for i, c in enumerate(cases) if i not in withheld for k, v in c.arrays.items()}
        _wire.send(wfile, {"cases": [c.call for c in cases], "forbid": list(FORBID.get(test_id, ())),
                           "allow": ALLOW.get(test_id)}, arrays)
        peaks, got = {}, {}
        while True:
            msg, arr = _wire.recv(rfile)
            if "begin" in msg and int(msg["begin"]) in withheld:
                i = int(msg["begin"])
                meter = PeakMemory(peer_pid, memory_cgroup)
                meter.start()
                _wire.send(wfile, {"case": i}, {f"c{i}/{k}": v for k, v in cases[i].arrays.items()})
                end, arr = _wire.recv(rfile)
                growth = meter.stop()
                if growth is not None and end.get("end") == i:
                    peaks[i] = (growth, meter.touched)
                got.update({k: v for k, v in arr.items() if k.startswith(f"c{i}/")})
                _wire.send(wfile, {"ok": True})
                continue
            break
        got.update(arr)
        failures = _judge(test_id, cases, msg, got, peaks)
        verdict = {"test": test_id, "n_cases": len(cases), "failures": failures}
        if failures:
            _keep_outputs(record, test_id, msg, got)
        if record is not None:
            record.write(json.dumps({**verdict, "passed": not failures}) + "\n")
            record.flush()
        _wire.send(wfile, verdict)


def _keep_outputs(record, test_id, answer, got):
    """Keep what a failed verdict's code returned, for the class report's diagnosis (tools/report.py matches it
    against the mistake zoo's outputs on the same cases): beside the student's record (``<student>.outputs/``,
    where no kernel can write), or, outside a class run, in ATTNCOURSE_KEEP_OUTPUTS.  Only a verdict given now
    comes here, which is the first of its test in this run (the one that stands), so whatever the file held is
    replaced; a failure to keep them never costs the verdict."""
    folder = record.name.removesuffix(".jsonl") + ".outputs" if record is not None else \
        os.environ.get("ATTNCOURSE_KEEP_OUTPUTS")
    if not folder:
        return
    path = os.path.join(folder, f"{test_id}.npz")
    try:
        import numpy as np
        os.makedirs(folder, exist_ok=True)
        results = json.dumps(answer.get("results", [])).encode()
        with open(f"{path}.{os.getpid()}", "wb") as f:
            np.savez_compressed(f, __results__=np.frombuffer(results, dtype=np.uint8), **got)
        os.replace(f"{path}.{os.getpid()}", path)
    except Exception:
        pass


def _serve_connection(conn, channel):
    """In a forked child: check the token, then serve the kernel on this connection."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    peer_pid = int.from_bytes(creds[:4], "little")
    rfile, wfile = conn.makefile("rb"), conn.makefile("wb")
    hello, _ = _wire.recv(rfile)
    if not secrets.compare_digest(str(hello.get("token", "")), channel["token"]):
        _wire.send(wfile, {"error": "this grading channel belongs to another kernel"})
        return
    _wire.send(wfile, {"ok": True})
    if channel["record"] is None:
        session(rfile, wfile, peer_pid, memory_cgroup=channel["memory_cgroup"])
        return
    with open(channel["record"], "a") as record:
        session(rfile, wfile, peer_pid, record, channel["memory_cgroup"])


def _unconfined(pid):
    """True if process ``pid`` has not given up privileges (a kernel launcher before confinement)."""
    try:
        status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
        return status.get("NoNewPrivs", "1").strip() == "0"
    except OSError:
        return False


class Watch:
    """One live kernel, seen from outside: its folders, its pids and memory cgroups, its quota."""

    def __init__(self, pid, folders, cgroup, memory_cgroup=None):
        self.pid, self.folders, self.cgroup, self.memory_cgroup = pid, folders, cgroup, memory_cgroup
        self.disk_limit = int(os.environ.get("ATTNCOURSE_KERNEL_DISK_MB", "1024")) << 20

    def alive(self):
        try:
            os.kill(self.pid, 0)
            return not open(f"/proc/{self.pid}/stat").read().split(") ", 1)[1].startswith("Z")
        except OSError:
            return False

    def pids(self):
        if self.cgroup:
            try:
                return [int(p) for p in open(os.path.join(self.cgroup, "cgroup.procs")).read().split()]
            except OSError:
                return []
        return [self.pid]

    def over(self):
        """Why this kernel must be stopped, or None."""
        if self.cgroup:
            try:       # tasks (threads too) against the cgroup's own limit: a fork loop sits at the limit
                current, limit = (open(os.path.join(self.cgroup, f)).read().strip() for f in ("pids.current", "pids.max"))
                if limit != "max" and int(current) >= int(limit):
                    return "process limit"
            except OSError:
                pass
        used = 0
        for folder in self.folders:
            for top, _, files in os.walk(folder):
                for f in files:
                    try:
                        used += os.lstat(os.path.join(top, f)).st_blocks * 512
                    except OSError:
                        pass
        return "disk quota" if used > self.disk_limit else None

    def kill(self):
        for _ in range(50):                       # a fork loop keeps making processes: repeat
            pids = self.pids() if self.cgroup else [self.pid]
            if not pids:
                break
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            if not self.cgroup:
                break

    def cleanup(self):
        """Kill what is left, remove the private temporary directory; True once the cgroup is gone
        too (a dead kernel stays in it until its parent reaps it: then try again later)."""
        self.kill()
        shutil.rmtree(self.folders[-1], ignore_errors=True)      # the private temporary directory
        for group in {self.cgroup, self.memory_cgroup} - {None}:
            try:
                os.rmdir(group)
            except FileNotFoundError:
                pass
            except OSError:
                return False
        return True


def _record_path(root, folder):
    """COURSE/verdicts/<chapter>/<student>.jsonl for a kernel started in COURSE/autograded/<student>/<chapter>."""
    rel = os.path.relpath(os.path.realpath(folder), os.path.realpath(os.path.join(root, "autograded")))
    parts = rel.split(os.sep)
    if len(parts) != 2 or parts[0] in ("..", "."):
        return None
    student, chapter = parts
    os.makedirs(os.path.join(root, "verdicts", chapter), exist_ok=True)
    return os.path.join(root, "verdicts", chapter, f"{student}.jsonl")


def _open_channel(conn, root, chan_dir, sel, watches):
    """Answer one request on the control socket: a kernel launcher (not yet confined) asks for its channel.
    Who asks is checked before anything is read (a confined process is hung up on at once), and the read has a
    deadline: a client that sends one byte and waits never holds the server's loop for long."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    pid = int.from_bytes(creds[:4], "little")
    if not _unconfined(pid):
        return
    conn.settimeout(10.0)             # the launcher connects, makes its mounts, then asks: milliseconds
    rfile, wfile = conn.makefile("rb"), conn.makefile("wb")
    req, _ = _wire.recv(rfile)
    record = _record_path(root, req["open"])
    if record is not None:
        chapter = os.path.basename(os.path.dirname(record))
        forbid = {t: list(f) for t, f in FORBID.items() if t.startswith(chapter + ".") and f}
        with open(record, "a") as f:               # one line per kernel; grade_class.py starts a run's record
            f.write(json.dumps({"sandbox": {"landlock_abi": req.get("landlock_abi"),
                                            "cgroup": bool(req.get("cgroup")),
                                            "memory_cgroup": bool(req.get("memory_cgroup")),
                                            "sockets_hidden": req.get("sockets_hidden", []),
                                            "network": req.get("network")},
                                "forbid": forbid}) + "\n")
    memory_cgroup = req.get("memory_cgroup")
    channel = {"socket": os.path.join(chan_dir, secrets.token_hex(16) + ".sock"),
               "token": secrets.token_hex(32), "record": record, "memory_cgroup": memory_cgroup}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(channel["socket"])
    os.chmod(channel["socket"], 0o666)
    listener.listen(4)
    sel.register(listener, selectors.EVENT_READ, channel)
    watches[pid] = Watch(pid, [req["open"], req["tmp"]], req.get("cgroup"), memory_cgroup)
    watches[pid].listener = listener
    _wire.send(wfile, {"socket": channel["socket"], "token": channel["token"]})


def serve(control_path, root):
    """The class grader's server: channels on request, one forked child per kernel connection."""
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control.bind(control_path)
    control.listen(16)
    sel.register(control, selectors.EVENT_READ, "control")
    # Channels live in a folder of their own beside the control socket: a kernel's mount namespace shows it
    # this folder (to reach its channel) and not the control socket.
    chan_dir = os.path.join(os.path.dirname(control_path), "channels")
    os.makedirs(chan_dir, mode=0o711, exist_ok=True)
    os.chmod(chan_dir, 0o711)
    global CASE_CACHE
    CASE_CACHE = os.path.join(os.path.dirname(control_path), "cases")
    os.makedirs(CASE_CACHE, mode=0o700, exist_ok=True)
    watches = {}
    while True:
        for key, _ in sel.select(timeout=0.25):
            if key.data == "stdin":
                if not sys.stdin.readline():
                    for _ in range(20):                       # zombies leave their cgroup once reaped
                        watches = {p: w for p, w in watches.items() if not w.cleanup()}
                        if not watches:
                            break
                        time.sleep(0.25)
                    shutil.rmtree(CASE_CACHE, ignore_errors=True)
                    return
            elif key.data == "control":
                conn, _ = control.accept()
                try:
                    _open_channel(conn, root, chan_dir, sel, watches)
                except Exception:               # a client that hangs up, says nothing or says nonsense
                    pass
                finally:
                    conn.close()
            else:
                conn, _ = key.fileobj.accept()
                if os.fork() == 0:
                    try:
                        sel.close()
                        _serve_connection(conn, key.data)
                    except Exception:                 # a kernel that hangs up mid-message
                        pass
                    finally:
                        os._exit(0)
                conn.close()
        for pid, w in list(watches.items()):
            if not w.alive():
                if w.listener is not None:
                    sel.unregister(w.listener)
                    w.listener.close()
                    w.listener = None
                if w.cleanup():
                    del watches[pid]
            elif w.over():
                w.kill()
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass


def main():
    import torch
    torch.set_num_threads(1)
    load_chapters()
    if "--serve" in sys.argv[1:]:
        args = sys.argv[sys.argv.index("--serve") + 1:]
        sys.stdout = sys.stderr
        serve(args[0], args[args.index("--root") + 1])
        return
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr          # a stray print must not corrupt the pipe
    # A private server answers one process (the zoo tests: every variant of a chapter), with no folder to keep cases
    # in: it keeps them in memory (chapter 05's beam search took 0.7 s to build, for every variant asking).
    global KEPT
    KEPT = {}
    session(stdin, stdout, peer_pid=os.getppid())


if __name__ == "__main__":
    main()
