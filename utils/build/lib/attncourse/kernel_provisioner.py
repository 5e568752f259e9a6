"""How the grader starts a confined grading kernel: its channels are Unix sockets in a folder of its own.

The kernelspec "attncourse-sandbox" (tools/confinement.py) names this provisioner.  A kernel whose
channels are Unix sockets needs no TCP port in the grader's network, so the kernel can be given a
private network namespace (attncourse/sandbox.py): there, forked processes may talk over the
loopback address (the gloo ranks of chapter 09's DDP exercises) and reach nothing outside.  The
folder is made for this kernel alone, so no other kernel may bind, or learn, its sockets' names.
"""
import os
import shutil
import tempfile

from jupyter_client.provisioning import LocalProvisioner


class SandboxProvisioner(LocalProvisioner):
    """LocalProvisioner with the "ipc" transport in a private folder (removed with the kernel)."""

    ipc_dir = None

    async def pre_launch(self, **kwargs):
        km = self.parent
        if self.ipc_dir is None or not os.path.isdir(self.ipc_dir):
            # Short: a Unix socket's path may have at most 107 bytes.
            self.ipc_dir = tempfile.mkdtemp(prefix="attncourse-ipc-")
        km.transport, km.cache_ports = "ipc", False
        km.ip = os.path.join(self.ipc_dir, "kernel")
        return await super().pre_launch(**kwargs)

    async def cleanup(self, restart=False):
        await super().cleanup(restart=restart)
        if not restart and self.ipc_dir:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
            self.ipc_dir = None
