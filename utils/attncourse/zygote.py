"""Grading kernels started as forks of one process that has already imported torch and ipykernel.

    python -m attncourse.zygote SOCKET        (tools/confinement.py starts it beside the grading server)

Every grading kernel used to start a Python, import ipykernel, and import torch in the notebook's first cell:
about 1.5 s of a student's 3 to 5 s.  This process pays those imports once per class run and forks a kernel for
each request of the grader's provisioner (attncourse/kernel_provisioner.py).  The fork then does what
``python -m attncourse.sandbox`` does, in the same order: it confines itself for good (attncourse.sandbox), and
only then becomes the IPython kernel.  A kernel is a fresh fork of a process that never runs a student's code,
so nothing one student does reaches another.

The socket sits in the grader's private folder, beside the control socket: a confined kernel's mount namespace
does not show it, and only processes that have not given up privileges (the grader's, never a kernel) are
answered.  The process was started with the kernels' environment only (attncourse.sandbox.KERNEL_ENVIRONMENT),
so its memory holds nothing of the grader's; each kernel gets the environment its provisioner would have given
it.  It ends when its standard input closes: with the grader.
"""
import importlib.util
import json
import os
import select
import signal
import socket
import struct
import sys
import traceback


def _peer_unconfined(conn):
    pid, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    try:
        status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    except OSError:
        return False
    return status.get("NoNewPrivs", "1").strip() == "0"


def _receive(conn):
    """(request dict, [stdin, stdout, stderr] file descriptors): one line of JSON and the three descriptors."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise ConnectionError("request cut short")
        data += more
    return json.loads(data), fds


def _kernel(request, fds):
    """In the fork: become the confined kernel the request asks for (what ``python -m attncourse.sandbox`` and
    ``python -m ipykernel_launcher`` would do); never returns."""
    code = 1
    try:
        os.setsid()                                      # its own process group, as a launched kernel has
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)    # the kernel's own children are its to wait for
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if "matplotlib" in sys.modules:                  # imported by _warm, before this kernel's environment
            sys.modules["matplotlib"].rcParams["backend"] = os.environ.get("MPLBACKEND") or INLINE
        # The learner package is imported afresh, under this kernel's environment (GRADING, the language).
        for name in [m for m in sys.modules if m == "attncourse" or m.startswith("attncourse.")]:
            del sys.modules[name]
        from attncourse import sandbox
        args = sandbox.main(request["argv"], exec_kernel=False)
        import tempfile
        tempfile.tempdir = None                          # found again from the kernel's TMPDIR, not the zygote's
        sys.argv = [importlib.util.find_spec("ipykernel_launcher").origin, *args]
        from ipykernel import kernelapp
        kernelapp.launch_new_instance(argv=args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:                                # noqa: BLE001 - reported where a launched kernel's is
        traceback.print_exc()
    finally:
        try:
            import atexit
            atexit._run_exitfuncs()                      # the kernel's own, as a normal exit runs them
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


INLINE = "module://matplotlib_inline.backend_inline"        # ipykernel's default backend


def _warm():
    """Do once what every kernel would otherwise repeat (about 0.8 s of a fake student's 3.5): import pyplot, and
    format one traceback as IPython does (pygments compiles its lexers' rules, stack_data builds its classes and
    inspect maps every loaded module to its file, once per process).  Nothing of a student's is involved.
    matplotlib reads its settings now, from the shared font cache (MPLCONFIGDIR, tools/confinement.py) with
    ipykernel's backend; a kernel's own MPLBACKEND is applied in ``_kernel``."""
    os.environ.setdefault("MPLBACKEND", INLINE)
    import matplotlib.pyplot  # noqa: F401
    from IPython.core import ultratb
    try:
        raise ValueError("warm-up")
    except ValueError:
        ultratb.AutoFormattedTB(mode="Context", tb_offset=0).structured_traceback(*sys.exc_info())


def serve(path):
    """Answer requests at ``path`` until standard input closes (the grader holds its other end, so this process
    ends with the grader, however the grader ends)."""
    if sys.path and sys.path[0] in ("", os.getcwd()):    # as ipykernel_launcher: not the folder it started in
        del sys.path[0]
    import ipykernel.kernelapp  # noqa: F401  (what every kernel imports first)
    import numpy  # noqa: F401
    import torch  # noqa: F401
    _warm()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)        # kernels are reaped by the system: no zombie stays
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    os.chmod(path + ".new", 0o600)
    listener.listen(16)
    os.rename(path + ".new", path)                       # the grader waits for this name: ready
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready:
            if not os.read(sys.stdin.fileno(), 1 << 16):
                return
            continue
        conn, _ = listener.accept()
        with conn:
            try:
                conn.settimeout(5)                       # the grader's provisioner sends at once
                if not _peer_unconfined(conn):
                    continue
                if os.fork() == 0:
                    # The request is read in the fork: this process never holds one kernel's request (its paths,
                    # its environment) for the next fork to find in its memory.
                    listener.close()
                    _start(conn)
            except OSError as exc:
                print(f"attncourse.zygote: request refused: {exc}", file=sys.stderr)


def _start(conn):
    """In the fork: read the request, answer with this process's pid, become the kernel; never returns."""
    try:
        request, fds = _receive(conn)
        conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
        conn.close()
    except BaseException:                                # noqa: BLE001 - the caller sees the connection close
        traceback.print_exc()
        os._exit(1)
    _kernel(request, fds)


def request_kernel(path, argv, env, cwd, stdio):
    """Ask the zygote at ``path`` for a kernel (``argv``: the sandbox's arguments, -f CONNECTION_FILE ...);
    ``stdio`` its stdin, stdout and stderr (file descriptors).  Returns the kernel's pid; raises OSError when
    there is no zygote, RuntimeError when it hangs up (it does on a caller that gave up privileges)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect(path)
        reply = b""
        try:
            socket.send_fds(conn, [json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode() + b"\n"], list(stdio))
            while not reply.endswith(b"\n"):
                more = conn.recv(4096)
                if not more:
                    break
                reply += more
        except ConnectionError:
            pass
    if not reply.endswith(b"\n"):
        raise RuntimeError("the grading kernels' zygote refused the request (see the grader's log)")
    return int(json.loads(reply)["pid"])


if __name__ == "__main__":
    serve(sys.argv[1])
