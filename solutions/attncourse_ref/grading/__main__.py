"""The grading server (see attncourse.autograde for the client side).

Two ways to run it:

- ``python -I -m attncourse_ref.grading``: one session over stdin/stdout.  The maintainers' tests
  (``run_hidden_test`` outside a grading kernel) use this.
- ``python -I -m attncourse_ref.grading --serve``: the class grader's server.  ``tools/grade_class.py``
  starts one per class run, before any kernel, and opens a *channel* per submission attempt by
  writing a JSON line ``{"socket": PATH, "token": SECRET, "record": FILE}`` to its stdin.  The
  server listens on that Unix socket; a kernel must present the token first.  Each connection is
  served by a forked child (the reference is imported once, in the parent), which appends every
  verdict it computes to the record file.  Kernels cannot write that file: the record, not what
  a test cell printed, is what the grader turns into scores.
"""
import importlib
import json
import os
import pkgutil
import selectors
import socket
import sys

from attncourse import _wire

from . import FORBID, REGISTRY, compare, seed_for


def load_chapters():
    """Import every chapter module of this package (chNN.py); each registers its hidden tests."""
    from attncourse_ref import grading
    for info in pkgutil.iter_modules(grading.__path__):
        if info.name.startswith("ch"):
            importlib.import_module(f"attncourse_ref.grading.{info.name}")


def _memory(pid, reset=False):
    """Resident memory of process ``pid`` (bytes): (current, peak since the last reset)."""
    try:
        if reset:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")                           # resets the peak (VmHWM) to the current size
        fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None, None


def _judge(test_id, cases, answer, got, peaks):
    failures = []
    for i, (case, res) in enumerate(zip(cases, answer.get("results", []))):
        if "error" in res:
            reason = f"your code raised {res['error']}"
        else:
            reason = compare(case, [got.get(f"c{i}/out{j}") for j in range(int(res.get("n", 0)))])
        limit = case.call.get("peak_bytes")
        if reason is None and limit is not None:
            peak = peaks.get(i)
            if peak is None:
                reason = "its peak memory was not measured (the case must run between 'begin' and 'end')"
            elif peak > limit:
                reason = (f"peak memory grew by {peak / 2**20:.1f} MiB while it ran; the exercise allows "
                          f"{limit / 2**20:.1f} MiB (it must never build the full score matrix)")
        if reason:
            failures.append(f"case {i + 1} {case.describe}: {reason}")
    if len(answer.get("results", [])) != len(cases):
        failures.append(f"{len(cases)} cases were sent, {len(answer.get('results', []))} answered")
    return failures


def session(rfile, wfile, peer_pid=None, record=None):
    """Serve one kernel until it hangs up.  ``record``: a file object each verdict is appended to."""
    import numpy as np
    import torch
    while True:
        try:
            req, _ = _wire.recv(rfile)
        except EOFError:
            return
        test_id = req.get("test")
        if test_id not in REGISTRY:
            _wire.send(wfile, {"error": f"unknown hidden test {test_id!r}"})
            continue
        seed = seed_for(test_id)
        torch.manual_seed(seed)
        cases = REGISTRY[test_id](np.random.default_rng(seed))
        # A case with a memory bound keeps its inputs back until the kernel says it starts it.
        withheld = {i for i, c in enumerate(cases) if "peak_bytes" in c.call}
        arrays = {f"c{i}/{k}": v for i, c in enumerate(cases) if i not in withheld for k, v in c.arrays.items()}
        _wire.send(wfile, {"cases": [c.call for c in cases], "forbid": list(FORBID.get(test_id, ()))}, arrays)
        peaks, got = {}, {}
        while True:
            msg, arr = _wire.recv(rfile)
            if "begin" in msg and int(msg["begin"]) in withheld:
                i = int(msg["begin"])
                base, _ = _memory(peer_pid, reset=True)
                _wire.send(wfile, {"case": i}, {f"c{i}/{k}": v for k, v in cases[i].arrays.items()})
                end, arr = _wire.recv(rfile)
                _, peak = _memory(peer_pid)
                if base is not None and peak is not None and end.get("end") == i:
                    peaks[i] = peak - base
                got.update({k: v for k, v in arr.items() if k.startswith(f"c{i}/")})
                _wire.send(wfile, {"ok": True})
                continue
            break
        got.update(arr)
        failures = _judge(test_id, cases, msg, got, peaks)
        verdict = {"test": test_id, "n_cases": len(cases), "failures": failures}
        if record is not None:
            record.write(json.dumps({**verdict, "passed": not failures}) + "\n")
            record.flush()
        _wire.send(wfile, verdict)


def _serve_connection(conn, channel):
    """In a forked child: check the token, then serve the kernel on this connection."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    peer_pid = int.from_bytes(creds[:4], "little")
    rfile, wfile = conn.makefile("rb"), conn.makefile("wb")
    hello, _ = _wire.recv(rfile)
    if hello.get("token") != channel["token"]:
        _wire.send(wfile, {"error": "this grading channel belongs to another submission"})
        return
    _wire.send(wfile, {"ok": True})
    with open(channel["record"], "a") as record:
        session(rfile, wfile, peer_pid, record)


def serve():
    """The class grader's server: channels opened on stdin, one forked child per connection."""
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin, selectors.EVENT_READ, None)
    while True:
        for key, _ in sel.select(timeout=1.0):
            if key.data is None:
                line = sys.stdin.readline()
                if not line:
                    return
                channel = json.loads(line)
                if "close" in channel:                # the attempt is over: stop listening there
                    for k in list(sel.get_map().values()):
                        if k.data is not None and k.data["socket"] == channel["close"]:
                            sel.unregister(k.fileobj)
                            k.fileobj.close()
                    continue
                if os.path.exists(channel["socket"]):
                    os.unlink(channel["socket"])
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listener.bind(channel["socket"])
                os.chmod(channel["socket"], 0o666)    # a kernel under another uid may connect
                listener.listen(4)
                sel.register(listener, selectors.EVENT_READ, channel)
                print(json.dumps({"opened": channel["socket"]}), file=sys.__stdout__, flush=True)
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
        sys.stdout = sys.stderr
        serve()
        return
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr          # a stray print must not corrupt the pipe
    session(stdin, stdout, peer_pid=os.getppid())


if __name__ == "__main__":
    main()
