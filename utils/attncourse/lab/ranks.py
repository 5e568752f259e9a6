"""Run a function on every rank of a small torch.distributed group inside this one process.

    from attncourse.lab.ranks import run_ranks
    outs = run_ranks(all_reduce_mean, [(torch.tensor(6.), torch.tensor(3.)),      # rank 0's arguments
                                       (torch.tensor(2.), torch.tensor(1.))])     # rank 1's
    # -> [tensor(2.), tensor(2.)]: each rank's result, in rank order

Each rank is a thread joined to the others by PyTorch's in-process ("threaded") process group,
which implements the same collectives as gloo and NCCL (all_reduce, broadcast, ...) with no
sockets and no child processes.  That is what lets the visible checks and the hidden tests run
your DDP code on several ranks inside a grading kernel that may not open network connections.
The real thing, several processes under torchrun with gloo or NCCL, is what the training
program does (and what the maintainers' tests run).
"""
import sys
import threading

import torch
import torch.distributed as dist

TIMEOUT = 30.0          # seconds; a rank that never joins a collective must not hang the caller


def run_ranks(fn, per_rank_args, timeout=TIMEOUT):
    """Call ``fn(*per_rank_args[r])`` on rank r of a group of len(per_rank_args) ranks; return the results.

    The first exception raised on any rank is re-raised here, after every rank has stopped.
    """
    from torch.testing._internal.distributed import multi_threaded_pg as threaded

    world_size = len(per_rank_args)
    if dist.is_initialized():
        raise RuntimeError("run_ranks needs torch.distributed to be uninitialised in this process")
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

