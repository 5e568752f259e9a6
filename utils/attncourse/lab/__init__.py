"""Chapter 09's GPU training lab: a generic training program that runs the learner's own code.

- ``attncourse.lab.train``: the program (``python -m attncourse.lab.train``, or under torchrun).
- ``attncourse.lab.export(path, ...)``: write the notebook's exercise cells and model to a module.
- ``attncourse.lab.FallbackGPT``: a GPT made of PyTorch's own layers, for running the lab
  without your chapter 06 model.
- ``attncourse.lab.data``: Shakespeare tokenised once to memory-mapped files.
- ``attncourse.lab.hardware``: which device (CUDA, Apple's MPS, the CPU) and what it can do; peak FLOP/s (for MFU).
- ``attncourse.lab.compare``: the CPU mode against the classic minimal-GPT recipe, side by side.
- ``attncourse.lab.ranks``: run a function on several ranks of a gloo process group, from one call.

Nothing here is a graded exercise: the training program imports those from your module.

Importing this package before torch chooses how OpenMP's idle CPU threads wait (unless
OMP_WAIT_POLICY is already set; see ``choose_wait_policy``): they spin (ACTIVE) where the cores are
free, and sleep (PASSIVE) where other work shares them: a grading kernel, several training processes
on one machine (torchrun), or other processes keeping half the cores busy now (measured over 0.2 s,
not the load average, which still counts work that has just finished).  A training run says its
choice and why in its first lines.  Spinning threads
answer at once and sleeping ones must be woken, so on an idle machine spinning is twice as fast; on
a busy machine spinning threads take the cores from the processes they wait for.  Measured on a
2-core machine (tokens per second of the training program, 80 steps, one process with PyTorch's
default threads):

    policy      minimal recipe's model     CPU mode (--preset cpu)
                idle      busy (load 6-7)   idle      busy (load 6)
    ACTIVE      22,775    671               45,083    5,411
    PASSIVE     11,827    4,342             22,433    19,816
    (unset)     22,526    387               43,800    1,296

Under torchrun with 2 processes (one thread each, torchrun's default) the policy makes no
difference on the idle machine (22,187 / 22,333 / 22,959); PASSIVE is kept there in case a process
is given more threads than its share of the cores.

It also sets PYTORCH_ENABLE_MPS_FALLBACK=1 (unless set): on Apple's GPU an operator that MPS lacks
then runs on the CPU instead of stopping the run.
"""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def busy_cores(window=0.2):
    """How many cores other processes keep busy now: the machine's busy time over ``window`` seconds
    (Linux's /proc/stat), less this process's own; None where it cannot be read."""
    def sample():
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]      # user nice system idle iowait irq softirq steal
        return sum(ticks) - ticks[3] - ticks[4], sum(ticks)
    try:
        (busy0, total0), own0 = sample(), time.process_time()
        time.sleep(window)
        (busy1, total1), own1 = sample(), time.process_time()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    cores = os.cpu_count() or 1
    return max(0.0, (busy1 - busy0) / (total1 - total0) * cores - (own1 - own0) / window)


def choose_wait_policy(environ=os.environ, busy=None, cores=None, load=None):
    """(policy, why): PASSIVE where other work shares the cores now (a grading kernel, torchrun's processes,
    other processes keeping half the cores busy), else ACTIVE.  What runs now, not the load average: that
    trails by minutes and still counts the learner's own work that just finished (a notebook's cells, a
    previous run), which made a run started right after one train at half speed."""
    cores = cores or os.cpu_count() or 1
    if environ.get("ATTNCOURSE_GRADING_KERNEL") == "1":
        return "PASSIVE", "a grading kernel, beside other students' kernels"
    if int(environ.get("LOCAL_WORLD_SIZE", "1")) > 1:
        return "PASSIVE", f"{environ['LOCAL_WORLD_SIZE']} training processes on this machine (torchrun)"
    if busy is None and load is None:
        busy = busy_cores()
    if busy is not None:
        return ("PASSIVE" if busy >= cores / 2 else "ACTIVE",
                f"other processes keep {busy:.1f} of {cores} cores busy now")
    load = os.getloadavg()[0] if load is None and hasattr(os, "getloadavg") else (load or 0.0)
    return ("PASSIVE" if load >= cores / 2 else "ACTIVE",
            f"the load average over the last minute is {load:.1f} on {cores} cores")


# Chosen once per process, before torch (imported just below) starts its threads, and said in a training run's
# first lines.  A choice of ours is not handed down to the processes ``run`` starts: each chooses at its start.
if "OMP_WAIT_POLICY" in os.environ:
    WAIT_POLICY = (os.environ["OMP_WAIT_POLICY"], "set in the environment (OMP_WAIT_POLICY)")
    _OUR_WAIT_POLICY = None
else:
    WAIT_POLICY = choose_wait_policy()
    os.environ["OMP_WAIT_POLICY"] = _OUR_WAIT_POLICY = WAIT_POLICY[0]
# On Apple's GPU (MPS), an operator that MPS lacks runs on the CPU (PyTorch warns once) instead of
# stopping the run.  PyTorch reads this once, when it is imported.
os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")

from .fallback import FallbackGPT  # noqa: E402
from .learner import LabError, export  # noqa: E402

__all__ = ["FallbackGPT", "LabError", "export", "workdir", "run", "torchrun"]


def workdir(path=None):
    """The folder where the notebook writes mylab.py and training runs write their output.

    ``path``, else $ATTNCOURSE_LAB_DIR, else a new folder of its own in the system's temporary
    directory (the chapter's own folder stays clean: nbgrader hands out every file in it).  Of its
    own: two notebooks running at once (two learners on one hub, the site build beside a test)
    sharing one folder would overwrite each other's mylab.py and interleave their logs.
    """
    chosen = path or os.environ.get("ATTNCOURSE_LAB_DIR")
    if not chosen:
        return Path(tempfile.mkdtemp(prefix="attncourse-lab-"))
    folder = Path(chosen)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def run(args, cwd, timeout=None, env=None):
    """Run a command (a list) in ``cwd``, printing its output as it comes; returns the exit status.

    The notebook uses it for the training commands, so what you see is what a terminal would
    show (minus the progress bar, which needs a terminal).  ``env``: extra environment variables.
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    if _OUR_WAIT_POLICY is not None and env.get("OMP_WAIT_POLICY") == _OUR_WAIT_POLICY:
        del env["OMP_WAIT_POLICY"]         # chosen at this process's start: the new one chooses at its own
    proc = subprocess.Popen([str(a) for a in args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    try:
        for line in proc.stdout:
            sys.stdout.write(line)
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()


def torchrun():
    """The torchrun launcher of the running Python environment."""
    return str(Path(sys.executable).with_name("torchrun"))
