"""Measuring what a computation really allocates on the CPU.

``peak_memory(fn, *args)`` runs ``fn`` once under PyTorch's profiler with ``profile_memory=True``.
The profiler records every allocation and every free made by PyTorch's CPU allocator, with a
timestamp and a size; adding them up in time order gives the memory held at each instant, and
the largest value is the peak.  Only memory allocated *during* the call counts (the inputs
already exist), and it includes temporaries that the Python code never sees (the scores inside
``q @ k.T``, the buffers of ``softmax``).  ``torch.cuda.max_memory_allocated`` does the same on
a GPU; the operating system's resident-set size is too coarse and never goes back down.
"""
import contextlib
import os
import time

from torch.autograd import profiler


@contextlib.contextmanager
def _quiet_fd2():
    """The profiler's C++ side logs to file descriptor 2; keep that out of notebook cells."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def cpu_profile(**options):
    """PyTorch's profiler on the CPU: ``torch.autograd.profiler.profile``, as ``torch.profiler.profile`` runs it, without
    that wrapper, whose start imports torch._inductor (1.5 s, in each process: every grading kernel that measures)."""
    return profiler.profile(use_cpu=True, use_kineto=True, **options)


def peak_memory(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)``; return (its result, peak bytes allocated during the call)."""
    with _quiet_fd2(), cpu_profile(profile_memory=True) as prof:
        result = fn(*args, **kwargs)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.kineto_results.events() if e.name() == "[memory]")
    held = peak = 0
    for _, nbytes in events:          # positive: allocation, negative: free
        held += nbytes
        peak = max(peak, held)
    return result, peak


def wall_time(fn, *args, repeat=3, **kwargs):
    """Best of ``repeat`` wall-clock times of ``fn(*args, **kwargs)``, in seconds (no profiler)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn(*args, **kwargs)
        best = min(best, time.perf_counter() - t)
    return best


def cpu_seconds(*runs, repeats=3):
    """This process's CPU seconds for each of ``runs`` (functions of no argument), the least of ``repeats`` rounds that
    take the runs in turn; returns (seconds, the runs' results).  A busy machine adds time to a run (shared caches and
    memory, a busy twin core), never removes it, and runs taken in turn meet the same machine, so their ratios hold
    when the machine is busy."""
    seconds, outs = [[] for _ in runs], [None] * len(runs)
    for _ in range(repeats):
        for i, run in enumerate(runs):
            start = time.process_time()
            outs[i] = run()
            seconds[i].append(time.process_time() - start)
    return [min(s) for s in seconds], outs
