"""The confined grading kernel: ``python -m attncourse.sandbox -f CONNECTION_FILE [kernel args]``.

``tools/grade_class.py`` installs a kernelspec ("attncourse-sandbox") whose command is this module
and tells nbgrader to grade with it.  Before it becomes the ordinary IPython kernel, the process
confines itself, for good (every process it starts inherits all of it):

- **files** (Landlock): it may read the Python environment, the system libraries and the learner
  package, and read and write only its own folder (the submission's working copy) and a private
  temporary directory; the reference solutions, other students' folders, the gradebook and the
  course are out of reach;
- **network** (a network namespace, or Landlock; and seccomp): a kernel whose channels are Unix
  sockets (the grader's provisioner, attncourse/kernel_provisioner.py) gets a network namespace
  of its own with only a loopback interface: its processes may talk to each other over TCP (the
  gloo ranks of chapter 09) and reach nothing else.  Where no namespace can be made, or the
  channels are TCP ports, Landlock lets it bind its own ports and connect to none.  Either way it
  opens no UDP or raw socket (Unix sockets stay: the grading channel is one);
- **Unix sockets** (a mount namespace): the folders where services keep their sockets (/tmp,
  /run, ...) are empty there, with only the kernel's own folders mounted back, so it cannot
  connect to a database or a daemon whose socket path it knows;
- **resources** (rlimits, and pids and memory cgroups where they can be made): address space,
  file size, open files and processes are bounded, so a memory bomb, a disk filler or a fork loop
  fails inside the submission instead of hurting the grader or another student; the memory cgroup
  also lets the grading server measure the whole kernel's peak memory, children included;
- **privileges**: no new privileges, and every capability dropped (root cannot lift its limits).

What was applied is written, as JSON, to ``$ATTNCOURSE_SANDBOX_REPORT`` (if set) before the
kernel starts: the grader reads it from outside to say what held.  On a platform without
Landlock (macOS, old kernels) the kernel still starts, and the report says it is unconfined.

Settings (environment): ATTNCOURSE_SANDBOX_TMP (the private temporary directory, made by the
grader), ATTNCOURSE_KERNEL_MEMORY_MB (default 6144), ATTNCOURSE_KERNEL_FILE_MB (default 256),
ATTNCOURSE_KERNEL_PROCS (default 256; enforced by a pids cgroup this launcher makes for itself when
it runs as root, else by RLIMIT_NPROC; the memory limit also binds the kernel's memory cgroup), ATTNCOURSE_GRADER_CONTROL (the class grader's control socket).
"""
import ctypes
import ctypes.util
import json
import os
import platform
import resource
import shutil
import struct
import sys
import tempfile

# Landlock (linux/landlock.h)
_FS = {"execute": 1 << 0, "write_file": 1 << 1, "read_file": 1 << 2, "read_dir": 1 << 3,
       "remove_dir": 1 << 4, "remove_file": 1 << 5, "make_char": 1 << 6, "make_dir": 1 << 7,
       "make_reg": 1 << 8, "make_sock": 1 << 9, "make_fifo": 1 << 10, "make_block": 1 << 11,
       "make_sym": 1 << 12, "refer": 1 << 13, "truncate": 1 << 14, "ioctl_dev": 1 << 15}
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_READ = _FS["execute"] | _FS["read_file"] | _FS["read_dir"]
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1
_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446     # the same on x86_64 and aarch64
_RULE_PATH, _RULE_PORT = 1, 2
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP, _PR_SET_SECCOMP = 38, 24, 22

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _prctl(option, arg2=0, arg3=0):
    """prctl with every argument passed at full width (a pointer must not be cut to 32 bits)."""
    return _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(arg3), ctypes.c_ulong(0),
                       ctypes.c_ulong(0))


def _checked(res):
    if res < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return res


def _syscall(nr, *args):
    return _checked(_libc.syscall(ctypes.c_long(nr), *args))


def landlock_abi():
    """The kernel's Landlock ABI version, or 0 where there is none."""
    if sys.platform != "linux":
        return 0
    try:
        return _syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except OSError:
        return 0


def _landlock(read_paths, write_paths, file_rules, tcp_bind_ports, abi):
    """Files, and TCP unless ``tcp_bind_ports`` is None (a private network namespace holds TCP)."""
    fs = _FS_BY_ABI[min(abi, 5)]
    net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 and tcp_bind_ports is not None else 0
    scoped = (_SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL) if abi >= 6 else 0
    attr = struct.pack("QQQ", fs, net, scoped) if abi >= 6 else struct.pack("QQ", fs, net) if abi >= 4 \
        else struct.pack("Q", fs)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = _syscall(_SYS_CREATE, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    file_bits = _FS["execute"] | _FS["read_file"] | _FS["write_file"] | _FS["truncate"] | _FS["ioctl_dev"]
    try:
        rules = [(p, _READ) for p in read_paths] + [(p, fs) for p in write_paths] + list(file_rules)
        for path, access in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            if not os.path.isdir(path):
                access &= file_bits
            rule = ctypes.create_string_buffer(struct.pack("=Qi", access & fs, fd), 12)
            try:
                _syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH), rule, ctypes.c_uint32(0))
            finally:
                os.close(fd)
        for port in ([0] + list(tcp_bind_ports)) if net else ():   # 0: an ephemeral port (ipykernel's IOPub pipe)
            rule = ctypes.create_string_buffer(struct.pack("=QQ", _NET_BIND_TCP, port), 16)
            _syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PORT), rule, ctypes.c_uint32(0))
        _syscall(_SYS_RESTRICT, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    return {"filesystem": True, "tcp": bool(net), "signals_and_abstract_sockets": bool(scoped)}


_CLONE_NEWNET, _CLONE_NEWUSER = 0x40000000, 0x10000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def _private_network():
    """Move this process into a new network namespace whose loopback interface is up.  As root
    directly; otherwise inside a new user namespace that maps this user to itself.  False where
    neither may be made (the caller then restricts TCP with Landlock)."""
    if sys.platform != "linux":
        return False
    try:
        _unshare(_CLONE_NEWNET)
        import fcntl
        import socket
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            ifreq = struct.pack("16sH14x", b"lo", 0)
            flags = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, ifreq))[1]
            fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))
        return True
    except OSError:
        return False


# Folders where a machine keeps its services' Unix sockets (a PostgreSQL gradebook's, Docker's, an
# X server's, another user's agents).  Landlock cannot stop connect() on a pathname socket, so the
# kernel gets a mount namespace in which each of these is an empty tmpfs, with only the kernel's own
# folders (and what it may read) mounted back at their places.
SOCKET_FOLDERS = ("/tmp", "/var/tmp", "/run", "/var/run", "/dev/shm", "/var/lib", "/var/spool")
_CLONE_NEWNS, _MS_REC, _MS_PRIVATE, _MS_NOSUID, _MS_NODEV = 0x00020000, 1 << 14, 1 << 18, 2, 4
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT = 428, 429       # the same on x86_64 and aarch64
_OPEN_TREE_CLONE, _AT_RECURSIVE, _MOVE_MOUNT_F_EMPTY_PATH, _AT_FDCWD = 1, 0x8000, 4, -100


def _unshare(flags):
    """unshare(flags); without root, inside a new user namespace that maps this user to itself."""
    if os.geteuid() == 0:
        _checked(_libc.unshare(ctypes.c_int(flags)))
        return
    uid, gid = os.geteuid(), os.getegid()
    _checked(_libc.unshare(ctypes.c_int(_CLONE_NEWUSER | flags)))
    for name, text in [("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")]:
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _mount(source, target, fstype, flags, data=None):
    enc = (lambda x: x.encode() if isinstance(x, str) else x)
    _checked(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)))


def _private_mounts(keep):
    """Hide SOCKET_FOLDERS behind empty tmpfs mounts in a new mount namespace, mounting each path of
    ``keep`` (folders or single files, such as the grading channel's socket) back at its place.
    Return the folders hidden, or [] where no mount namespace may be made."""
    if sys.platform != "linux":
        return []
    hidden = []
    try:
        _unshare(_CLONE_NEWNS)
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)       # nothing mounted here reaches the machine
        for folder in SOCKET_FOLDERS:
            if os.path.islink(folder) or not os.path.isdir(folder):
                continue                                       # /var/run is usually a link to /run
            inside = sorted({os.path.realpath(p) for p in keep
                             if os.path.realpath(p).startswith(folder.rstrip("/") + "/") and os.path.exists(p)})
            inside = [p for p in inside if not any(p.startswith(q + "/") for q in inside)]   # outermost only
            trees = []
            for path in inside:                                # detached copies, taken before the folder is hidden
                fd = _syscall(_SYS_OPEN_TREE, ctypes.c_int(_AT_FDCWD), path.encode(),
                              ctypes.c_uint(_OPEN_TREE_CLONE | _AT_RECURSIVE | os.O_CLOEXEC))
                trees.append((path, fd, os.path.isdir(path)))
            _mount("tmpfs", folder, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m")
            for path, fd, is_dir in trees:
                try:
                    if is_dir:
                        os.makedirs(path, exist_ok=True)
                    else:
                        os.makedirs(os.path.dirname(path), exist_ok=True)
                        open(path, "w").close()
                    _syscall(_SYS_MOVE_MOUNT, ctypes.c_int(fd), b"", ctypes.c_int(_AT_FDCWD), path.encode(),
                             ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH))
                finally:
                    os.close(fd)
            hidden.append(folder)
    except OSError:
        return hidden
    return hidden


# seccomp: socket() may create Unix sockets and TCP sockets (inside the kernel's own network
# namespace, or on the ports Landlock allows), nothing else; io_uring (which would bypass
# Landlock) is refused.
_AUDIT_ARCH = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}


def _seccomp_socket_filter():
    arch = _AUDIT_ARCH.get(platform.machine())
    if arch is None:
        return False
    audit_arch, nr_socket, nr_io_uring_setup = arch
    ld, jeq, ret, alu_and = 0x20, 0x15, 0x06, 0x54
    allow, deny = 0x7FFF0000, 0x00050000 | 1          # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    prog = [
        (ld, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, allow),          # other ABIs: untouched
        (ld, 0, 0, 0), (jeq, 0, 1, nr_io_uring_setup), (ret, 0, 0, deny),
        (jeq, 1, 0, nr_socket), (ret, 0, 0, allow),
        (ld, 0, 0, 16),                                                       # args[0]: domain
        (jeq, 0, 1, 1), (ret, 0, 0, allow),                                   # AF_UNIX
        (jeq, 0, 1, 16), (ret, 0, 0, allow),                                  # AF_NETLINK (zmq lists interfaces)
        (jeq, 2, 0, 2), (jeq, 1, 0, 10), (ret, 0, 0, deny),                   # AF_INET, AF_INET6, else no
        (ld, 0, 0, 24), (alu_and, 0, 0, 0xF),                                 # args[1] & 0xf: the type
        (jeq, 0, 1, 1), (ret, 0, 0, allow), (ret, 0, 0, deny),                # SOCK_STREAM only
    ]
    raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    filt = ctypes.create_string_buffer(raw, len(raw))
    fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(filt))
    fbuf = ctypes.create_string_buffer(fprog, len(fprog))
    if _prctl(_PR_SET_SECCOMP, 2, ctypes.addressof(fbuf)) != 0:   # SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "seccomp")
    return True


def _drop_capabilities():
    for cap in range(64):
        if _prctl(_PR_CAPBSET_DROP, cap) != 0 and ctypes.get_errno() == 22:
            break                                          # EINVAL: past the last capability
    header = struct.pack("Ii", 0x20080522, 0)             # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)                                       # effective, permitted, inheritable: none
    return _libc.capset(ctypes.create_string_buffer(header, 8), ctypes.create_string_buffer(data, 24)) == 0


def _limits(report, cgroups):
    mb = 1 << 20
    memory = int(os.environ.get("ATTNCOURSE_KERNEL_MEMORY_MB", "6144")) * mb
    file_size = int(os.environ.get("ATTNCOURSE_KERNEL_FILE_MB", "256")) * mb
    procs = int(os.environ.get("ATTNCOURSE_KERNEL_PROCS", "256"))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    report.update(memory_mb=memory // mb, file_mb=file_size // mb)
    if "pids" in cgroups:
        report["processes"] = f"pids cgroup ({procs})"
    elif os.geteuid() != 0:
        # RLIMIT_NPROC counts every process of this user: allow what runs now plus the budget.
        mine = sum(1 for p in os.listdir("/proc") if p.isdigit() and _owned(p))
        resource.setrlimit(resource.RLIMIT_NPROC, (mine + procs, mine + procs))
        report["processes"] = f"RLIMIT_NPROC (+{procs})"
    else:
        report["processes"] = "unbounded (root without a pids cgroup)"
    report["memory"] = (f"memory cgroup ({memory // mb} MiB for the kernel and its children)" if "memory" in cgroups
                        else f"RLIMIT_AS ({memory // mb} MiB per process)")


def _owned(pid):
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.geteuid()
    except OSError:
        return False


def _private_home(tmp):
    """Point every per-user cache at the private directory (the real home is out of reach)."""
    # PyTorch's compile caches too: torch._inductor writes TORCHINDUCTOR_CACHE_DIR into the environment
    # of the process that compiled (a grader that ran torch.compile passes /tmp/torchinductor_<user> on).
    for var, sub in [("HOME", ""), ("TMPDIR", ""), ("IPYTHONDIR", "ipython"), ("MPLCONFIGDIR", "matplotlib"),
                     ("JUPYTER_RUNTIME_DIR", "runtime"), ("XDG_CACHE_HOME", "cache"),
                     ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"), ("TRITON_CACHE_DIR", "triton"),
                     ("TORCH_EXTENSIONS_DIR", "torch_extensions")]:
        path = os.path.join(tmp, sub)
        os.makedirs(path, exist_ok=True)
        os.environ[var] = path
    # A matplotlib font cache built once by the grader saves every kernel a rebuild.
    cache = os.environ.get("ATTNCOURSE_MPL_CACHE")
    if cache and os.path.isdir(cache):
        for name in os.listdir(cache):
            if name.startswith("fontlist"):
                shutil.copy(os.path.join(cache, name), os.environ["MPLCONFIGDIR"])


def read_paths():
    """What a grading kernel may read: the interpreter, its packages, system libraries, the learner package."""
    import attncourse
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.dirname(attncourse.__file__)),
             "/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/sys/devices/system/cpu",
             # Processes' status (ipykernel lists its children at shutdown).  Another process's
             # environment, memory and files stay closed: Landlock refuses ptrace-level access to
             # processes outside this kernel's domain.
             "/proc"}
    exe = os.path.realpath(sys.executable)
    paths.add(os.path.dirname(os.path.dirname(exe)))
    # gloo (chapter 09's DDP ranks) reads the PCI devices' attributes to place its network device.
    pci = "/sys/bus/pci/devices"
    if os.path.isdir(pci):
        paths.add(pci)
        paths.update(os.path.realpath(os.path.join(pci, d)) for d in os.listdir(pci))
    return sorted(paths)


def confine(connection_file, cgroups=None):
    """Apply everything, asking the grading server for a channel first; return (connection file
    to use, report dict)."""
    report = {"platform": sys.platform, "landlock_abi": landlock_abi(), "confined": False}
    tmp = os.environ["ATTNCOURSE_SANDBOX_TMP"]
    os.makedirs(tmp, exist_ok=True)
    # The connection file lives in the grader's runtime folder, out of reach once confined.
    conn = os.path.join(tmp, os.path.basename(connection_file))
    shutil.copy(connection_file, conn)
    with open(conn) as f:
        info = json.load(f)
    ipc = info.get("transport") == "ipc"           # channels that need no TCP port in the machine's network
    private_net = ipc and _private_network()
    report["network"] = "private namespace (loopback only)" if private_net else "the machine's"
    cwd, control = os.getcwd(), os.environ.get("ATTNCOURSE_GRADER_CONTROL")
    # The grader's folder of channels stays: it cannot be listed, and each channel wants its token.  The control
    # socket beside it (where launchers ask for channels) is not in it, so a confined kernel never sees it.
    keep = [cwd, tmp, *read_paths(), *([os.path.join(os.path.dirname(control), "channels")] if control else [])]
    if ipc:
        keep.append(os.path.dirname(os.path.abspath(info["ip"])))
    _private_home(tmp)                             # before the mounts: it copies the grader's font cache from /tmp
    # Connected before the mounts hide the control socket (a connected socket outlives its path's mount), and
    # the request sent after them, with what they hid.
    control_socket = _connect_control()
    report["socket_folders_hidden"] = _private_mounts(keep)
    os.chdir(cwd)                                  # through the mount that stays visible
    open_channel(tmp, cgroups or {}, report, control_socket)
    ports = None if private_net else \
        [] if ipc else [int(info[k]) for k in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port") if info.get(k)]
    _limits(report, cgroups or {})
    if _prctl(_PR_SET_NO_NEW_PRIVS, 1) != 0:
        raise OSError(ctypes.get_errno(), "no_new_privs")
    abi = report["landlock_abi"]
    if abi:
        devices = [("/dev/null", _FS["read_file"] | _FS["write_file"]), ("/dev/zero", _FS["read_file"]),
                   ("/dev/urandom", _FS["read_file"]), ("/dev/random", _FS["read_file"])]
        readable, writable = read_paths(), [os.getcwd(), tmp]
        if ipc:
            writable.append(os.path.dirname(os.path.abspath(info["ip"])))    # the channels' sockets
        report.update(_landlock(readable, writable, devices, ports, abi))
        report.update(read=readable, write=writable)
    report["socket_filter"] = _seccomp_socket_filter() if sys.platform == "linux" else False
    # Root, or a user namespace's owner (namespaces made without root): no capability kept.
    report["capabilities_dropped"] = (_drop_capabilities() if os.geteuid() == 0 or private_net
                                      or report["socket_folders_hidden"] else "not root")
    report["confined"] = bool(abi)
    return conn, report


def _connect_control():
    """A connection to the class grader's control socket (ATTNCOURSE_GRADER_CONTROL, removed from the
    environment), or None outside a class run."""
    control = os.environ.pop("ATTNCOURSE_GRADER_CONTROL", None)
    if not control:
        return None
    import socket
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(control)
    return sock


def open_channel(tmp, cgroups, report, sock):
    """Ask the class grader's server for this kernel's grading channel (before confinement).

    The server answers only unconfined callers (it checks NoNewPrivs of the connecting process),
    so a confined kernel cannot ask for a channel in a classmate's name.  The server records
    verdicts for the student whose folder this kernel was started in.
    """
    if sock is None:
        return
    from . import _wire
    with sock:
        rfile, wfile = sock.makefile("rb"), sock.makefile("wb")
        _wire.send(wfile, {"open": os.getcwd(), "tmp": tmp, "cgroup": cgroups.get("pids"),
                           "memory_cgroup": cgroups.get("memory"), "landlock_abi": landlock_abi(),
                           "network": report["network"], "sockets_hidden": report["socket_folders_hidden"]})
        reply, _ = _wire.recv(rfile)
    if "error" in reply:
        raise SystemExit(f"grading channel refused: {reply['error']}")
    os.environ["ATTNCOURSE_GRADING_SOCKET"] = reply["socket"]
    os.environ["ATTNCOURSE_GRADING_TOKEN"] = reply["token"]


def _cgroup_bases():
    """{controller: the folder of this process's own cgroup for it}, for pids and memory, in cgroup v1
    (one hierarchy per controller) or v2 (one hierarchy; a controller must be enabled for children)."""
    mounts, v2 = {}, None
    for line in open("/proc/self/mounts"):
        _, point, fstype, opts = line.split()[:4]
        if fstype == "cgroup":
            mounts.update((o, point) for o in opts.split(",") if o in ("pids", "memory"))
        elif fstype == "cgroup2":
            v2 = point
    own = {}
    for line in open("/proc/self/cgroup"):
        number, controllers, path = line.rstrip("\n").split(":", 2)
        for c in controllers.split(",") if controllers else ["" if number == "0" else None]:
            own[c] = path.lstrip("/")
    bases = {c: os.path.join(mounts[c], own.get(c, "")) for c in ("pids", "memory") if c in mounts and c in own}
    if v2 is not None and "" in own:
        unified = os.path.join(v2, own[""])
        try:
            enabled = open(os.path.join(unified, "cgroup.subtree_control")).read().split()
        except OSError:
            enabled = []
        bases.update((c, unified) for c in ("pids", "memory") if c in enabled and c not in bases)
    return bases


def _make_cgroups():
    """Cgroups of this kernel's own, where this process may make them (root): {"pids": folder,
    "memory": folder}.  The pids cgroup bounds the kernel's processes; the memory cgroup bounds the
    memory of the kernel and every process it starts, and lets the grading server measure their
    peak from outside (a child process that computes and exits is counted)."""
    mb = 1 << 20
    limits = {"pids": [("pids.max", os.environ.get("ATTNCOURSE_KERNEL_PROCS", "256"))],
              "memory": [(f, str(int(os.environ.get("ATTNCOURSE_KERNEL_MEMORY_MB", "6144")) * mb))
                         for f in ("memory.limit_in_bytes", "memory.max")]}
    made, shared = {}, {}
    for kind, base in _cgroup_bases().items():
        path = shared.get(base) or os.path.join(base, f"attncourse-kernel-{os.getpid()}")
        try:
            if path not in shared.values():
                os.mkdir(path)
            if not os.path.exists(os.path.join(path, "cgroup.procs")):   # not a cgroup file system
                raise OSError("not a cgroup")
            for name, value in limits[kind]:
                if os.path.exists(os.path.join(path, name)):
                    with open(os.path.join(path, name), "w") as f:
                        f.write(value)
            if path not in shared.values():
                with open(os.path.join(path, "cgroup.procs"), "w") as f:   # this process and all it starts
                    f.write(str(os.getpid()))
            made[kind] = shared[base] = path
        except OSError:
            try:
                os.rmdir(path)
            except OSError:
                pass
    return made


# What a grading kernel's environment may hold: an explicit list, so that nothing of the grader's (a database
# password, NBGRADER_DB_URL, the course's grading salt, a token of the host) reaches a student's code, its
# printed output or the feedback built from it.
KERNEL_ENVIRONMENT = {
    "PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "VIRTUAL_ENV", "PYTHONHASHSEED",
    "MPLCONFIGDIR", "MPLBACKEND", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY", "GLOO_SOCKET_IFNAME",
    "IPYTHONDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR",
    "ATTNCOURSE_GRADING_KERNEL", "ATTNCOURSE_LANGUAGE", "ATTNCOURSE_SANDBOX_TMP", "ATTNCOURSE_GRADING_SOCKET",
    "ATTNCOURSE_GRADING_TOKEN", "ATTNCOURSE_CELL_TIMEOUT", "ATTNCOURSE_KERNEL_MEMORY_MB", "ATTNCOURSE_KERNEL_FILE_MB",
    "ATTNCOURSE_KERNEL_PROCS", "ATTNCOURSE_KERNEL_DISK_MB", "ATTNCOURSE_LAB_DIR", "ATTNCOURSE_LAB_DATA",
    "ATTNCOURSE_PEAK_TFLOPS",
}


def kernel_environment(env):
    """The part of ``env`` a grading kernel gets: the names of KERNEL_ENVIRONMENT and the locale's LC_*."""
    return {k: v for k, v in env.items() if k in KERNEL_ENVIRONMENT or k.startswith("LC_")}


def launcher_environment(env):
    """The part of ``env`` this launcher reads before it confines itself: the kernel's, and where the grader's
    control socket, font cache and report file are (what a fork of attncourse.zygote is sent: nothing else of the
    grader's ever enters its memory)."""
    return {**kernel_environment(env), **{k: env[k] for k in ("ATTNCOURSE_GRADER_CONTROL", "ATTNCOURSE_MPL_CACHE",
                                                               "ATTNCOURSE_SANDBOX_REPORT") if k in env}}


def main(argv, exec_kernel=True):
    """Confine this process, then become the kernel (``exec_kernel``) or return the kernel's arguments (a fork of
    attncourse.zygote starts the kernel in this process)."""
    if "-f" not in argv:
        raise SystemExit("usage: python -m attncourse.sandbox -f CONNECTION_FILE [ipykernel arguments]")
    i = argv.index("-f")
    tmp = os.environ.get("ATTNCOURSE_SANDBOX_TMP") or tempfile.mkdtemp(prefix="attncourse-kernel-")
    os.environ["ATTNCOURSE_SANDBOX_TMP"] = tmp
    cgroups = _make_cgroups() if sys.platform == "linux" and os.geteuid() == 0 else {}
    out = os.environ.pop("ATTNCOURSE_SANDBOX_REPORT", None)
    report_file = open(out, "w") if out else None      # opened now: once confined, its folder may be hidden
    conn, report = confine(argv[i + 1], cgroups)
    if report_file:
        with report_file:
            json.dump(report, report_file)
    args = argv[:i] + ["-f", conn] + argv[i + 2:]
    kept = kernel_environment(os.environ)
    os.environ.clear()
    os.environ.update(kept)
    if not exec_kernel:
        return args
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *args])


if __name__ == "__main__":
    main(sys.argv[1:])
