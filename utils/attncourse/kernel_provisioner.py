"""How the grader starts a confined grading kernel: its channels are Unix sockets in a folder of its own.

The kernelspec "attncourse-sandbox" (tools/confinement.py) names this provisioner.  A kernel whose
channels are Unix sockets needs no TCP port in the grader's network, so the kernel can be given a
private network namespace (attncourse/sandbox.py): there, forked processes may talk over the
loopback address (the gloo ranks of chapter 09's DDP exercises) and reach nothing outside.  The
folder is made for this kernel alone, so no other kernel may bind, or learn, its sockets' names.
"""
import asyncio
import os
import select
import shutil
import signal
import sys
import tempfile
import time

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.provisioning import LocalProvisioner


class ForkedKernel:
    """What LocalProvisioner needs of a Popen, for a kernel that attncourse.zygote forked (not this process's
    child): followed through a pidfd, so that a reused pid is never mistaken for it."""

    stdin = stdout = stderr = None

    def __init__(self, pid):
        self.pid, self.returncode = pid, None
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:                       # already gone
            self._fd, self.returncode = None, -signal.SIGKILL

    def poll(self):
        if self.returncode is None and select.select([self._fd], [], [], 0)[0]:
            os.close(self._fd)
            self._fd, self.returncode = None, -signal.SIGKILL   # its exit status is its parent's to read
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"kernel {self.pid} still running")
            select.select([self._fd], [], [], 0.1)
        return self.returncode

    def send_signal(self, signum):
        if self.poll() is None:
            signal.pidfd_send_signal(self._fd, signum)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def terminate(self):
        self.send_signal(signal.SIGTERM)


class SandboxProvisioner(LocalProvisioner):
    """LocalProvisioner with the "ipc" transport in a private folder (removed with the kernel); the kernel is
    forked by the grader's zygote ($ATTNCOURSE_ZYGOTE, tools/confinement.py) where there is one."""

    ipc_dir = None

    async def pre_launch(self, **kwargs):
        km = self.parent
        if self.ipc_dir is None or not os.path.isdir(self.ipc_dir):
            # Short: a Unix socket's path may have at most 107 bytes.
            self.ipc_dir = tempfile.mkdtemp(prefix="attncourse-ipc-")
        km.transport, km.cache_ports = "ipc", False
        km.ip = os.path.join(self.ipc_dir, "kernel")
        return await super().pre_launch(**kwargs)

    async def launch_kernel(self, cmd, **kwargs):
        zygote = os.environ.get("ATTNCOURSE_ZYGOTE")
        if not zygote or "attncourse.sandbox" not in cmd:
            return await super().launch_kernel(cmd, **kwargs)
        from .sandbox import launcher_environment
        from .zygote import request_kernel
        cwd = str(kwargs.get("cwd") or os.getcwd())
        out, err = (kwargs.get(k) or getattr(sys, f"__{k}__") for k in ("stdout", "stderr"))
        try:
            with open(os.devnull) as null:
                pid = request_kernel(zygote, cmd[cmd.index("attncourse.sandbox") + 1:],
                                     launcher_environment(kwargs.get("env") or os.environ), cwd,
                                     [null.fileno(), _fileno(out), _fileno(err)])
        except (OSError, RuntimeError, ValueError) as exc:  # no zygote after all: a kernel of its own
            print(f"attncourse: the kernels' zygote failed ({exc}); starting the kernel alone", file=sys.stderr)
            return await super().launch_kernel(cmd, **kwargs)
        self.process = ForkedKernel(pid)
        self.pid = self.pgid = pid                       # the fork made itself a session leader
        self.cwd = cwd
        return self.connection_info

    async def post_launch(self, **kwargs):
        """Return once the kernel has bound its sockets (or has died, or 60 s have passed): the client's sockets
        then connect at once, where a socket that connects to a path not yet bound retries only 0.1 s later."""
        await super().post_launch(**kwargs)
        km = self.parent
        paths = [f"{km.ip}-{getattr(km, f'{name}_port')}" for name in ("shell", "iopub", "stdin", "control", "hb")]
        deadline = time.monotonic() + 60
        while not all(os.path.exists(p) for p in paths) and self.process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    async def kill(self, restart=False):
        """SIGKILL, then wait (at most 5 s) until the kernel is gone: jupyter_client polls every 0.1 s after a kill,
        and a killed kernel is gone within milliseconds."""
        await super().kill(restart=restart)
        deadline = time.monotonic() + 5
        while self.process is not None and self.process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.002)

    async def cleanup(self, restart=False):
        await super().cleanup(restart=restart)
        if not restart and self.ipc_dir:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
            self.ipc_dir = None


def _fileno(stream):
    return stream if isinstance(stream, int) else stream.fileno()


class QuickReadyClient(AsyncKernelClient):
    """The kernel client nbgrader's grading uses (nbgrader_config.py): jupyter_client's wait for a new kernel, with
    iopub read in 20 ms slices instead of 0.2 s.  Its last step drains iopub until 0.2 s pass with no message, so
    every kernel start waited 0.2 s, idle (a zoo student's notebook takes 1 to 3 s); a message that comes later
    belongs to the kernel_info request, which nbclient, reading only its own requests' replies, never reads."""

    async def _wait_for_ready(self, timeout=None):
        channel = self.iopub_channel
        get_msg = channel.get_msg

        async def quick(timeout=None, **kwargs):
            return await get_msg(timeout=None if timeout is None else min(timeout, 0.02), **kwargs)
        channel.get_msg = quick
        try:
            await AsyncKernelClient._async_wait_for_ready(self, timeout)
        finally:
            del channel.get_msg

    wait_for_ready = _wait_for_ready
