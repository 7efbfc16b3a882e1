"""Doorbells: the few microseconds of one timed call's bracket, spent spinning on shared memory.

A socket round trip costs tens of microseconds and wakes a sleeping process on whatever core the scheduler
picks (12-66 us measured; docs/log.md, 2026-12-04); that is noise inside the parent's clock. A doorbell is one
page of shared memory (a sealed memfd, mapped by the parent and one runner) holding counters, each written by
one side only and on a cache line of its own. The runner, once its request has arrived, writes `armed` and
spins until the parent writes `go`; the parent spins until the runner writes `done`. A round trip between two
spinning processes on their own cores takes well under a microsecond.

Nothing here is trusted on the runner's word: a runner that rings early, late or never only changes the
parent's own clock readings, which are the evidence (`session.Bracket`).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import time
from collections.abc import Callable

PAGE = 4096
#: Word offsets (int64), one 64-byte cache line apart: the parent writes GO and ARG, the runner ARMED and DONE.
GO, ARG, ARMED, DONE = 0, 1, 8, 16
#: A waiting side spins this many times before it yields its core at every turn (`sched_yield`: nothing is
#: lost where the core is its own, and a machine with more waiting processes than cores still makes progress)...
SPIN_TURNS = 512
#: ...and after this long it polls with short sleeps (a long call costs a core no longer than this; a call
#: longer than this is measured to within the poll interval, well under 1 % of it).
SPIN_S = 0.02
POLL_S = 50e-6
#: How often a spinning waiter runs its `tick` (deadline and watchdog checks).
TICK_EVERY = 4096


class DoorbellTimeout(Exception):
    """The other side did not ring within the deadline."""


class Doorbell:
    """One page of counters shared by the parent and one runner (module docstring)."""

    def __init__(self, fd: int, owner: bool):
        self.fd, self.owner = fd, owner
        self.map = mmap.mmap(fd, PAGE)
        self.words = memoryview(self.map).cast("q")

    @classmethod
    def create(cls) -> Doorbell:
        fd = os.memfd_create("cudal1-doorbell", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, PAGE)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        return cls(fd, owner=True)

    @classmethod
    def attach(cls, fd: int) -> Doorbell:
        if os.fstat(fd).st_size < PAGE:
            raise ValueError("a doorbell is one page")
        return cls(fd, owner=False)

    # ------------------------------------------------------------------ either side

    def ring(self, word: int, value: int) -> None:
        self.words[word] = value

    def read(self, word: int) -> int:
        return int(self.words[word])

    def wait(self, word: int, value: int, timeout_s: float, tick: Callable[[], None] | None = None) -> float:
        """Spin (then poll) until `word` holds `value`; the `time.perf_counter()` at which it was seen.
        Raises DoorbellTimeout past `timeout_s`; `tick` runs every few thousand spins (it may raise)."""
        words = self.words
        if words[word] == value:
            return time.perf_counter()
        start = time.perf_counter()
        spin_until, deadline = start + SPIN_S, start + timeout_s
        n = 0
        while True:
            if words[word] == value:
                return time.perf_counter()
            n += 1
            if n > SPIN_TURNS:
                os.sched_yield()
            if n % TICK_EVERY == 0:
                now = time.perf_counter()
                if now > deadline:
                    raise DoorbellTimeout(f"no ring within {timeout_s:.1f} s")
                if tick is not None:
                    tick()
                if now > spin_until:
                    time.sleep(POLL_S)
                    n = TICK_EVERY - 1  # check the deadline after every poll

    def close(self) -> None:
        try:
            self.words.release()
            self.map.close()
        except (BufferError, ValueError):
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass
