"""Run a function on every rank of a small torch.distributed group, from one call.

    from attncourse.lab.ranks import run_ranks
    outs = run_ranks(all_reduce_mean, [(torch.tensor(6.), torch.tensor(3.)),      # rank 0's arguments
                                       (torch.tensor(2.), torch.tensor(1.))])     # rank 1's
    # -> [tensor(2.), tensor(2.)]: each rank's result, in rank order

On Linux each rank is a process of its own, forked from this one (so a function defined in a
notebook needs no import), joined to the others by the **gloo** backend over the loopback
address: the same backend ``torchrun`` uses on CPUs.  The grading kernel runs in a private
network namespace, so its ranks can reach each other and nothing else.

Where forking or a loopback connection is not possible (macOS and Windows, where forking a
process that runs PyTorch is unsafe or absent; a grading kernel confined without a network
namespace of its own), each rank is a thread, joined by PyTorch's in-process ("threaded")
process group, which implements the same collectives with no sockets.
"""
import os
import pickle
import selectors
import signal
import socket
import sys
import tempfile
import threading
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = 30.0          # seconds; a rank that never joins a collective must not hang the caller


def run_ranks(fn, per_rank_args, timeout=TIMEOUT, processes=None):
    """Call ``fn(*per_rank_args[r])`` on rank r of a group of len(per_rank_args) ranks; return the results.

    ``processes``: True for one gloo process per rank, False for threads, None to use processes
    wherever they work (see the module's docstring).  The first exception raised on any rank is
    re-raised here, after every rank has stopped.  A profile function set with ``sys.setprofile``
    (the grader's watch on calls) sees every rank's calls; what it noticed (its ``hit``) comes back.
    """
    if dist.is_initialized():
        raise RuntimeError("run_ranks needs torch.distributed to be uninitialised in this process")
    if processes is None:
        processes = ranks_can_be_processes()
    return (_in_processes if processes else _in_threads)(fn, per_rank_args, timeout)


def ranks_can_be_processes():
    """True on Linux where two processes of this one can talk over the loopback address."""
    if sys.platform != "linux":
        return False
    try:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            with socket.create_connection(server.getsockname(), timeout=1.0):
                return True
    except OSError:        # a confined kernel without a network of its own may not connect
        return False


def _loopback_interface():
    names = {name for _, name in socket.if_nameindex()}
    return next((n for n in ("lo", "lo0") if n in names), "lo")


# ---- one process per rank, gloo -----------------------------------------------------------------

def _rank_process(fn, args, rank, world_size, store_path, timeout, profiler, out_fd):
    """A forked rank: join the group, run, write (status, value, what the profiler noticed); never return."""
    try:
        sys.setprofile(None)
        torch.set_num_threads(1)                 # ranks share the cores; small tensors need no threads
        os.environ["GLOO_SOCKET_IFNAME"] = _loopback_interface()
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout))
        # Every rank connected before any runs the learner's code: a rank that returns at once (no
        # collective at all) must not leave while a peer is still connecting (gloo: "connectFullMesh
        # failed ... Connection closed by peer", which hid the real mistake under load).
        dist.barrier()
        sys.setprofile(profiler)
        try:
            reply = ("ok", fn(*args))
        finally:
            sys.setprofile(None)
    except BaseException as exc:  # noqa: B902  (the caller re-raises it)
        reply = ("error", exc)
    hit = getattr(profiler, "hit", None)
    try:
        payload = pickle.dumps((*reply, hit))
    except Exception:            # an unpicklable result or exception: say what it was
        what = reply[1]
        text = f"{type(what).__name__}: {what}" if reply[0] == "error" else f"an unpicklable {type(what).__name__}"
        payload = pickle.dumps(("error", RuntimeError(f"rank {rank} returned {text}"), hit))
    try:
        with os.fdopen(out_fd, "wb") as f:
            f.write(payload)
    finally:
        os._exit(0)              # no atexit handlers, no flushing of the parent's buffers


def _in_processes(fn, per_rank_args, timeout):
    world_size = len(per_rank_args)
    profiler = sys.getprofile()
    with tempfile.TemporaryDirectory(prefix="attncourse-ranks-") as tmp:
        store_path = os.path.join(tmp, "store")
        pids, readers = [], {}
        try:
            for rank, args in enumerate(per_rank_args):
                r, w = os.pipe()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)   # 3.12+: "fork() of a multi-threaded process"
                    pid = os.fork()
                if pid == 0:
                    os.close(r)
                    _rank_process(fn, args, rank, world_size, store_path, timeout, profiler, w)
                os.close(w)
                pids.append(pid)
                readers[r] = (rank, bytearray())
            replies = _collect(readers, timeout)
        finally:
            for fd in readers:
                os.close(fd)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)     # ranks still waiting for a failed one
                except ProcessLookupError:
                    pass
                os.waitpid(pid, 0)
    hits = [hit for _, _, hit in replies.values() if hit]
    if hits and profiler is not None and getattr(profiler, "hit", "") is None:
        profiler.hit = hits[0]
    errors = [value for status, value, _ in replies.values() if status == "error"]
    done = sorted(rank for rank, (status, _, _) in replies.items() if status == "ok")
    if errors and done and type(errors[0]) is RuntimeError:    # gloo: a peer left while this rank waited
        raise RuntimeError(f"rank(s) {done} had already returned when another rank failed in a collective: "
                           "does every rank make the same collective calls in the same order? "
                           f"(gloo: {str(errors[0]).split(' This is typically')[0]})")
    if errors:
        raise errors[0]
    if len(replies) < world_size:
        missing = sorted(set(range(world_size)) - set(replies))
        raise TimeoutError(f"rank(s) {missing} were still running after {timeout:.0f} s: does every rank make "
                           "the same collective calls in the same order?")
    return [replies[rank][1] for rank in range(world_size)]


def _collect(readers, timeout):
    """{rank: (status, value, hit)} from the ranks' pipes until all answered, one failed, or time ran out."""
    replies, deadline = {}, time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        for fd in readers:
            sel.register(fd, selectors.EVENT_READ)
        while len(sel.get_map()) and time.monotonic() < deadline:
            for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
                rank, buf = readers[key.fd]
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    buf += chunk
                    continue
                sel.unregister(key.fd)
                try:
                    replies[rank] = pickle.loads(bytes(buf))
                except Exception:
                    replies[rank] = ("error", RuntimeError(f"rank {rank} ended without an answer "
                                                           "(it exited or was killed)"), None)
                if replies[rank][0] == "error":
                    return replies
    return replies


# ---- one thread per rank, PyTorch's in-process process group -----------------------------------

def _in_threads(fn, per_rank_args, timeout):
    from torch.testing._internal.distributed import multi_threaded_pg as threaded

    world_size = len(per_rank_args)
    results, errors = [None] * world_size, [None] * world_size
    store = dist.HashStore()
    profiler = sys.getprofile()     # a grader watching calls (sys.setprofile) keeps watching every rank

    def worker(rank):
        sys.setprofile(profiler)
        try:
            dist.init_process_group("threaded", rank=rank, world_size=world_size, store=store)
            results[rank] = fn(*per_rank_args[rank])
        except BaseException as exc:            # noqa: B902  (SystemExit too: a rank released by the others' failure)
            errors[rank] = exc
            threaded.ProcessLocalGroup.exception_handle(exc)     # wake ranks waiting in a collective
        finally:
            sys.setprofile(None)
            if dist.is_initialized():
                dist.destroy_process_group()

    threaded.ProcessLocalGroup.reset()
    threaded._install_threaded_pg()
    torch._C._distributed_c10d._set_thread_isolation_mode(True)   # each thread has its own group registry
    try:
        threads = [threading.Thread(target=worker, args=(r,), daemon=True) for r in range(world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        if any(t.is_alive() for t in threads):
            threaded.ProcessLocalGroup.exception_handle(TimeoutError())
            for t in threads:
                t.join(5.0)
            raise TimeoutError(f"some ranks were still waiting after {timeout:.0f} s: does every rank make "
                               "the same collective calls in the same order?")
    finally:
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        threaded._uninstall_threaded_pg()
        threaded.ProcessLocalGroup.reset()
    first = next((e for e in errors if e is not None and not isinstance(e, SystemExit)), None)
    first = first or next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results
