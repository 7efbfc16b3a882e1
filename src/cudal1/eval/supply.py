"""Runners started ahead of their work, and which cores each kind of process runs on.

A runner's start (interpreter, torch, a CUDA context) takes seconds, an evaluation about as long:
`RunnerSupply` keeps spares started, so an evaluation takes two ready runners. `core_split` is the one policy
for cores: on a GPU host, each GPU keeps a few cores for its timed processes (the two model runners, which
take turns; the device's helper; the parent's evaluating thread, which spins on doorbells during a bracket),
and everything else (spares starting, builds) runs on the rest.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from cudal1.eval.runner_process import RunnerProcess
from cudal1.eval.sandbox import SandboxInfo, SandboxSpec

logger = logging.getLogger(__name__)

#: Cores a GPU keeps for timing: two for the model runners (one runs while the other is frozen; on the H200
#: host runners starting beside a timed pair doubled a launch-bound reference's time), one for the device's
#: helper and one for the parent's evaluating thread, both of which spin during a call's bracket.
TIMING_CORES = 4
#: On a CPU device: cores kept for the evaluation while builds run beside it.
CPU_EVALUATION_CORES = 2


@dataclass(frozen=True)
class CoreSplit:
    """Cores of the timed processes of one device, and the rest."""

    runners: frozenset[int]
    others: frozenset[int]
    helper: frozenset[int] | None = None
    parent: frozenset[int] | None = None


def core_split(device: str, keep: int | None = None) -> CoreSplit | None:
    """The cores of `device`'s timed processes among those this process may use. GPU N gets cores
    [N x keep, (N + 1) x keep) of the list, N its physical index (through CUDA_VISIBLE_DEVICES), so that the
    GPUs of one host, in one process or in one process per GPU, do not share theirs; on a CPU device the
    first two cores. None without affinity, or with too few cores to leave two for the rest."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if not device.startswith("cuda"):
        keep = keep or CPU_EVALUATION_CORES
        if len(cores) < keep + 2:
            return None
        return CoreSplit(runners=frozenset(cores[:keep]), others=frozenset(cores[keep:]))
    keep = keep or TIMING_CORES
    index = physical_gpu_index(int(device.partition(":")[2] or 0))
    own = cores[index * keep:(index + 1) * keep]
    rest = [c for c in cores if c not in own]
    if len(own) < keep or len(rest) < 2:
        return None
    runners = frozenset(own[:2])
    helper = frozenset(own[2:3]) or None
    parent = frozenset(own[3:4]) or None
    return CoreSplit(runners=runners, others=frozenset(rest), helper=helper, parent=parent)


def cpu_model_cores(threads: int) -> frozenset[int]:
    """On a CPU device: the cores both model runners run on (they take turns), the last `threads` of those
    this process may use, leaving the first to the parent where there are more; every core otherwise. The
    sandbox's CPU clock over their count bounds a call's wall time from below (`timing.counted_time`)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    threads = max(1, threads)
    return frozenset(cores[-threads:] if len(cores) > threads else cores)


def usable_cpu_count() -> int:
    """Cores this process may run on (its affinity mask: taskset, cgroups' cpusets, Slurm), not the host's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def physical_gpu_index(visible: int) -> int:
    """The host's index of this process's visible GPU `visible` (CUDA_VISIBLE_DEVICES=2,3 makes cuda:1 GPU 3);
    `visible` itself when the variable is unset or names GPUs by UUID."""
    names = [n.strip() for n in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if n.strip()]
    if visible < len(names) and names[visible].isdigit():
        return int(names[visible])
    return visible


class RunnerSupply:
    """Hands out started runners, starting a replacement each time one is taken (at most `total` in all when
    given: a series of known length wastes no starts at its end). Each evaluation takes two. On a GPU the
    runners handed out run on cores of their own, the spares on the rest (`core_split`)."""

    def __init__(self, device: str, *, spares: int = 2, total: int | None = None, spec: SandboxSpec | None = None,
                 info: SandboxInfo | None = None):
        self.device, self.spares, self.total = device, spares, total
        self.spec = spec or SandboxSpec(gpu=device.startswith("cuda"))
        self.info = info
        self._started = 0
        self._ready: list[RunnerProcess] = []
        split = core_split(device) if device.startswith("cuda") else None
        self._default = (split.runners, split.others) if split is not None else None
        self._cpus: tuple[frozenset[int] | None, frozenset[int] | None] | None = self._default

    def pin(self, cpus: frozenset[int] | None, others: frozenset[int] | None = None) -> None:
        """From now on a runner handed out runs on `cpus` only, the ones waiting on `others` (None: every
        core); `pin(None)`: back to the default (`core_split` on a GPU, every core on a CPU)."""
        self._cpus = (cpus, others) if cpus is not None else self._default
        if self._cpus is None:
            for runner in self._ready:
                runner.pin(None)
            return
        others = self._cpus[1]
        for runner in self._ready:
            runner.pin(others)

    @property
    def timed_cores(self) -> frozenset[int] | None:
        """The cores of the runners handed out (None: every core)."""
        return self._cpus[0] if self._cpus is not None else None

    def take(self) -> RunnerProcess:
        """A started runner; spares that died while waiting are discarded, never handed out."""
        while self._ready and self._ready[0].proc.poll() is not None:
            self._ready.pop(0).close()
        runner = self._ready.pop(0) if self._ready else self._spawn()
        if self._cpus is not None:
            runner.pin(self._cpus[0])
        try:
            self.fill()
        except OSError:  # no spare now (out of processes or files): the next take starts one itself
            logger.warning("could not start a spare runner", exc_info=True)
        return runner

    def fill(self) -> None:
        """Start spares up to `spares` now (e.g. while a batch's builds run)."""
        while len(self._ready) < self.spares and (self.total is None or self._started < self.total):
            self._ready.append(self._spawn())

    @property
    def n_ready(self) -> int:
        return len(self._ready)

    def _spawn(self) -> RunnerProcess:
        runner = RunnerProcess(self.device, warm=True, spec=self.spec, info=self.info,
                               cpus=self._cpus[1] if self._cpus is not None else None)
        self._started += 1
        return runner

    def close(self) -> None:
        for runner in self._ready:
            runner.close()
        self._ready.clear()

    def __enter__(self) -> RunnerSupply:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
