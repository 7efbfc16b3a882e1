"""Control groups around a runner's sandbox, where the host lets this process make them.

A `RunnerGroup` holds every process of one runner's sandbox (and whatever they start later). It gives the
parent what no process inside can fake or escape:

- the CPU time the whole group used, in nanoseconds, exited processes and threads included (the CPU clock
  of the timing cross-check: on a busy CPU host, wall time is noisy, CPU time is not);
- a hard memory limit enforced by the kernel (cgroup v1 `memory.limit_in_bytes`, v2 `memory.max` where the
  memory controller is delegated), and whether the kernel killed inside it for lack of memory;
- freezing and thawing the whole group at once;
- the list of its processes, and killing all of them.

Made under this process's own cgroup of each hierarchy (v1: cpuacct, memory, freezer, pids; v2: the unified
tree), so outer limits keep applying. Where none can be made (no permission, no cgroup file system), the
parent falls back to /proc: SIGSTOP for freezing, resident memory polling, and no CPU clock.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

V1_CONTROLLERS = ("cpuacct", "memory", "freezer", "pids")
PREFIX = "cudal1-"
_counter = itertools.count()


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, type, options) of the cgroup file systems."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                pre, _, post = line.partition(" - ")
                fields, rest = pre.split(), post.split()
                if len(fields) > 4 and rest and rest[0] in ("cgroup", "cgroup2"):
                    out.append((fields[4], rest[0], set(rest[-1].split(","))))
    except OSError:
        pass
    return out


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and '' for the unified (v2) tree."""
    paths: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for c in (controllers.split(",") if controllers else [""]):
                    paths[c] = path
    except OSError:
        pass
    return paths


@functools.lru_cache(maxsize=1)
def _layout() -> dict[str, Path]:
    """Where to make groups: v1 controller -> parent folder, or {"unified": folder} for v2. Empty: none."""
    mounts, own = _mounts(), _own_paths()
    v1 = {}
    for point, kind, options in mounts:
        if kind != "cgroup":
            continue
        for controller in V1_CONTROLLERS:
            if controller in options and controller in own:
                folder = Path(point) / own[controller].lstrip("/")
                if os.access(folder, os.W_OK):
                    v1[controller] = folder
    if "cpuacct" in v1 and "memory" in v1:
        return v1
    for point, kind, _ in mounts:
        if kind == "cgroup2" and "" in own:
            folder = Path(point) / own[""].lstrip("/")
            if os.access(folder, os.W_OK):
                return {"unified": folder}
    return {}


class RunnerGroup:
    """One group per runner (module docstring)."""

    def __init__(self, folders: dict[str, Path]):
        self.folders = folders
        self.unified = "unified" in folders

    @classmethod
    def create(cls) -> RunnerGroup | None:
        """A new, empty group, or None where this host lets us make none."""
        layout = _layout()
        if not layout:
            return None
        name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        folders: dict[str, Path] = {}
        try:
            for controller, parent in layout.items():
                folder = parent / name
                folder.mkdir()
                folders[controller] = folder
        except OSError as exc:
            logger.debug("no cgroup for runners (%s)", exc)
            for folder in folders.values():
                _rmdir(folder)
            return None
        return cls(folders)

    def add(self, pids: list[int]) -> None:
        for folder in self.folders.values():
            for pid in pids:
                try:
                    (folder / "cgroup.procs").write_text(str(pid))
                except OSError:
                    continue  # gone already

    def cpu_ns(self) -> int | None:
        """CPU time used by every process the group ever held (nanoseconds)."""
        try:
            if self.unified:
                for line in (self.folders["unified"] / "cpu.stat").read_text().splitlines():
                    if line.startswith("usage_usec"):
                        return int(line.split()[1]) * 1000
                return None
            return int((self.folders["cpuacct"] / "cpuacct.usage").read_text())
        except (OSError, ValueError, KeyError):
            return None

    def set_memory_limit(self, limit_bytes: int) -> bool:
        """A hard limit the kernel enforces; False where the memory controller is not ours."""
        target = (self.folders.get("unified"), "memory.max") if self.unified else (self.folders.get("memory"),
                                                                                  "memory.limit_in_bytes")
        if target[0] is None or not (target[0] / target[1]).exists():
            return False
        try:
            (target[0] / target[1]).write_text(str(int(limit_bytes)))
            return True
        except OSError:
            return False

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the group for exceeding its memory limit."""
        try:
            if self.unified:
                text = (self.folders["unified"] / "memory.events").read_text()
            else:
                text = (self.folders["memory"] / "memory.oom_control").read_text()
        except (OSError, KeyError):
            return False
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                return True
        return False

    def freeze(self, frozen: bool = True) -> bool:
        try:
            if self.unified:
                (self.folders["unified"] / "cgroup.freeze").write_text("1" if frozen else "0")
            else:
                (self.folders["freezer"] / "freezer.state").write_text("FROZEN" if frozen else "THAWED")
            return True
        except (OSError, KeyError):
            return False

    def pids(self) -> list[int]:
        folder = next(iter(self.folders.values()), None)
        try:
            return [int(p) for p in (folder / "cgroup.procs").read_text().split()] if folder else []
        except (OSError, ValueError):
            return []

    def remove(self) -> None:
        """Remove the group's folders (after its processes are gone; never raises)."""
        self.freeze(False)
        for folder in self.folders.values():
            _rmdir(folder)


def _rmdir(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


def reap_stale_groups(owner_pid: int | None = None) -> int:
    """End what the groups of parents that are gone still hold (thawed first: a frozen process cannot act on
    its SIGKILL), and remove them; returns how many folders went. `owner_pid`: only that parent's, which the
    caller knows is gone (the reaper: its parent may still be a zombie, which looks alive). A group is one
    folder per controller: all of them are handled together, so that its freezer is thawed before the
    processes its other folders hold are waited for."""
    import signal
    import time

    groups: dict[str, dict[str, Path]] = {}
    for controller, parent in _layout().items():
        for folder in parent.glob(PREFIX + "*"):
            groups.setdefault(folder.name, {})[controller] = folder
    removed = 0
    for name, folders in sorted(groups.items()):
        try:
            owner = int(name[len(PREFIX):].split("-")[0])
        except ValueError:
            continue
        if owner_pid is not None and owner != owner_pid:
            continue
        if owner_pid is None and (owner == os.getpid() or _alive(owner)):
            continue
        group = RunnerGroup(folders)
        group.freeze(False)
        for pid in group.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for _ in range(100):
            if not group.pids():
                break
            time.sleep(0.02)
        for folder in folders.values():
            _rmdir(folder)
            removed += not folder.exists()
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
