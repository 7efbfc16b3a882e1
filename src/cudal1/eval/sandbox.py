"""The OS sandbox around every runner process: bubblewrap namespaces and an unprivileged uid.

Every process that runs task or candidate code (the reference runner, the candidate runner, candidate
builds) is started through `wrap_command`, which puts it in a bubblewrap (bwrap) sandbox when this host has
one. Measured on the development machine and the H200 host (docs/sandbox.md has the table):

Covered, level "full":
- its own PID namespace (no other process is visible, none can be signalled; a fresh /proc), network
  namespace (no network at all, loopback included), IPC and UTS namespaces, mount namespace;
- the root file system read-only; home folders, /tmp, /var/tmp, /run, /dev/shm, the results store and the
  build caches hidden; a private, size-limited tmpfs for /tmp and /dev/shm; the folders a run must write
  (a candidate's own build folder) bound one by one;
- an unprivileged uid: as root, the sandbox drops to uid 65534 with no capabilities (setpriv) before Python
  starts; otherwise the user's own uid inside a user namespace, with no capabilities;
- a scrubbed environment (only the variables a CUDA, compiler or Python process needs);
- every descendant ends with the sandbox: bwrap kills the whole PID namespace when the runner, or the
  process that started bwrap, dies (`--die-with-parent`);
- GPU access through the NVIDIA device nodes only.
Level "partial": bwrap works but something above is missing (named in `SandboxInfo.missing`), e.g. as root
without setpriv, the sandbox keeps uid 0 mapped into a user namespace. Level "none": no bwrap; runners are
plain child processes (scrubbed environment, private folder, killed with their parent) and the `strict`
profile refuses untrusted candidates unless the user opts out (`EvalConfig.sandbox="none"`).

Not covered: the GPU itself is shared (another context can see timing side effects, not memory); kernel
exploits; reading world-readable files of the host (the root file system is visible, read-only).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: The uid and gid a root parent drops the sandbox to (the conventional 'nobody').
SANDBOX_UID = 65534
#: Namespaces every sandbox gets (user namespaces are added when the parent is not root).
NAMESPACE_FLAGS = ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try")
#: Folders hidden behind an empty tmpfs: where secrets, other users' files and sockets usually live.
HIDDEN_DIRS = ("/root", "/home", "/run", "/var/tmp", "/mnt", "/media", "/srv")
#: Folders the sandbox replaces by its own private, empty ones (tmpfs).
PRIVATE_TMP = ("/tmp", "/dev/shm")
#: Variables passed into a sandbox (everything else is dropped).
PASSTHROUGH_ENV = (
    "PATH", "LANG", "LC_ALL", "TZ", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES", "TORCH_CUDA_ARCH_LIST", "CC", "CXX", "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "MAX_JOBS",
)


@dataclass(frozen=True)
class SandboxInfo:
    """What this host allows: the level recorded with every result, and how it is reached."""

    level: str  # "full" | "partial" | "none"
    mechanism: str  # one line, recorded in results' protocol
    bwrap: str | None = None
    drop_to_uid: int | None = None  # set when a root parent drops the sandbox to an unprivileged uid
    user_namespace: bool = False
    missing: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {"level": self.level, "mechanism": self.mechanism, "missing": list(self.missing)}


@dataclass
class SandboxSpec:
    """The mounts and limits of one sandbox (built by the caller for a runner or a build)."""

    gpu: bool = False
    tmp_bytes: int = 2 * 2**30
    writable: list[str] = field(default_factory=list)  # host folders bound read-write at the same path
    binds: list[tuple[str, str]] = field(default_factory=list)  # (host folder, path inside) bound read-write
    hidden_dirs: list[str] = field(default_factory=list)  # extra folders to hide (cache roots)
    hidden_files: list[str] = field(default_factory=list)  # extra files to hide (the results store)
    env: dict[str, str] = field(default_factory=dict)


def _bwrap_binary() -> str | None:
    explicit = os.environ.get("CUDAL1_BWRAP")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("bwrap")


def _probe(argv: Sequence[str]) -> bool:
    try:
        return subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.lru_cache(maxsize=1)
def detect_sandbox() -> SandboxInfo:
    """The best sandbox this host allows, found by starting a no-op in it once per process."""
    bwrap = _bwrap_binary()
    if bwrap is None:
        return SandboxInfo("none", "no sandbox: bubblewrap (bwrap) is not installed", missing=("bubblewrap",))
    root = os.geteuid() == 0
    base = [bwrap, *NAMESPACE_FLAGS, "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    setpriv = shutil.which("setpriv")
    if root and setpriv:
        drop = [*_DROP_CAPS, "--", setpriv, *_setpriv_args(SANDBOX_UID), "--", "true"]
        if _probe(base + drop):
            return SandboxInfo("full", f"bubblewrap: pid, net, ipc, uts and mount namespaces; uid {SANDBOX_UID} "
                               "without capabilities", bwrap=bwrap, drop_to_uid=SANDBOX_UID)
    userns = ["--unshare-user", "--uid", str(SANDBOX_UID if root else os.getuid()),
              "--gid", str(SANDBOX_UID if root else os.getgid())]
    if _probe(base + userns + ["--", "true"]):
        if root:
            return SandboxInfo("partial", "bubblewrap: pid, net, ipc, uts, mount and user namespaces; uid 0 of the "
                               "host mapped into the sandbox (setpriv missing)", bwrap=bwrap, user_namespace=True,
                               missing=("separate uid",))
        return SandboxInfo("full", "bubblewrap: user, pid, net, ipc, uts and mount namespaces; the user's uid "
                           "without capabilities", bwrap=bwrap, user_namespace=True)
    return SandboxInfo("none", "no sandbox: bubblewrap is installed but cannot create namespaces on this host",
                       missing=("namespaces",))


_DROP_CAPS = ("--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID")


def _setpriv_args(uid: int) -> list[str]:
    return [f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all"]


def _parents(path: str) -> list[str]:
    """'/a/b/c' -> ['/a', '/a/b']: the folders bwrap must create (mode 0755) before binding `path`."""
    parts = Path(path).parts[1:]
    return [str(Path("/", *parts[:i])) for i in range(1, len(parts))]


def _is_under(path: str, folders: Sequence[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def _private_roots() -> list[str]:
    """Folders the sandbox replaces by empty or private ones. One of them on the import path (a script run
    from /tmp or from home puts its folder there) is never bound back: that would undo the hiding."""
    return [*HIDDEN_DIRS, os.path.expanduser("~"), *PRIVATE_TMP]


def python_paths() -> list[str]:
    """Folders a runner's interpreter must read: its prefixes and every import path."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(p for p in sys.path if p)
    return sorted(p for p in paths if os.path.isdir(p))


def sandbox_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The scrubbed environment of a runner: passthrough variables, our import path, a private HOME."""
    env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
    roots = set(_private_roots())
    env.update(HOME="/tmp/home", TMPDIR="/tmp", PYTHONPATH=os.pathsep.join(p for p in sys.path if p and p not in roots),
               PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1", PYTHONNOUSERSITE="1",
               # Rationale: glibc adapts its mmap threshold to what a process freed before, so two runners
               # with different histories pay different page-fault costs for the same allocations (seen
               # as a 1-2 ms per-call asymmetry on 8 MB inputs); a fixed threshold makes them alike.
               MALLOC_MMAP_THRESHOLD_="131072",
               # ...and it gives the heap's free top back to the system past 128 KB, so a call whose
               # temporaries end up at the top (where depends on the process's history: an import moves
               # it) faults its pages in again on every call: 3-29 faults per call in one runner and not
               # the other moved an honest twin of a 0.07 ms CPU call to 0.80x or 1.40x. Kept, they are not.
               MALLOC_TRIM_THRESHOLD_=str(256 << 20),
               # torch.compile compiles in the runner's own thread: its worker pool and progress-bar monitor
               # would otherwise be new Python threads that the thread guard must count as the candidate's.
               TORCHINDUCTOR_COMPILE_THREADS="1")
    env.update(extra or {})
    return env


def wrap_command(argv: Sequence[str], spec: SandboxSpec, info: SandboxInfo | None = None, *,
                 info_fd: int | None = None) -> list[str]:
    """`argv` as started inside the sandbox of `spec` (unchanged when the level is 'none'). With `info_fd`,
    bwrap writes the sandbox's outside pid there (JSON `child-pid`)."""
    info = info or detect_sandbox()
    if info.level == "none" or info.bwrap is None:
        return list(argv)
    hidden = list(HIDDEN_DIRS) + [os.path.expanduser("~")] + spec.hidden_dirs
    hidden = [h for i, h in enumerate(hidden) if h and h not in hidden[:i] and h != "/" and os.path.isdir(h)]
    # The private /tmp and /dev/shm hide everything under them already; a folder under them mounted first
    # would vanish beneath them, and a folder bound under it would get parents no sandbox user can enter.
    hidden = [h for h in hidden if not _is_under(h, PRIVATE_TMP)]
    cmd = [info.bwrap, *NAMESPACE_FLAGS, "--die-with-parent", "--new-session", "--clearenv",
           "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    if spec.gpu:
        for name in sorted(os.listdir("/dev")):
            if name.startswith("nvidia"):
                cmd += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    for folder in hidden:
        cmd += ["--tmpfs", folder]
    size = str(int(spec.tmp_bytes))
    cmd += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp", "--perms", "1777", "--size", size,
            "--tmpfs", "/dev/shm", "--perms", "0777", "--dir", "/tmp/home"]
    # What lies under a hidden folder (or the private /tmp: a virtual environment made there, a checkout under
    # /tmp in CI) but must stay readable (the interpreter, the packages) or writable.
    covered = hidden + list(PRIVATE_TMP)
    roots = set(_private_roots())
    readable = [p for p in python_paths() if _is_under(p, covered) and p not in covered and p not in roots]
    writable = [p for p in spec.writable if p]
    made: set[str] = set()
    for path in readable + writable:
        for parent in _parents(path):
            if _is_under(parent, covered) and parent not in covered and parent not in made:
                made.add(parent)
                cmd += ["--perms", "0755", "--dir", parent]
    for path in readable:
        cmd += ["--ro-bind", path, path]
    for path in writable:
        cmd += ["--bind", path, path]
    for host, inside in spec.binds:
        cmd += ["--bind", host, inside]
    for path in spec.hidden_files:
        for variant in (path, path + "-wal", path + "-shm", path + "-journal"):
            if os.path.isfile(variant):
                cmd += ["--ro-bind", "/dev/null", variant]
    for key, value in sandbox_environment(spec.env).items():
        cmd += ["--setenv", key, value]
    cmd += ["--chdir", "/tmp"]
    if info_fd is not None:
        cmd += ["--info-fd", str(info_fd)]
    if info.user_namespace:
        uid, gid = (SANDBOX_UID, SANDBOX_UID) if os.geteuid() == 0 else (os.getuid(), os.getgid())
        cmd += ["--unshare-user", "--uid", str(uid), "--gid", str(gid), "--"]
    elif info.drop_to_uid is not None:
        setpriv = shutil.which("setpriv") or "setpriv"
        cmd += [*_DROP_CAPS, "--", setpriv, *_setpriv_args(info.drop_to_uid), "--"]
    else:
        cmd += ["--"]
    return cmd + list(argv)
