"""Doorbells: the few microseconds of one timed call's bracket, spent spinning on shared memory.

A socket round trip costs tens of microseconds and wakes a sleeping process on whatever core the scheduler
picks (12-66 us measured; docs/log.md, 2026-12-04); that is noise inside the parent's clock. A doorbell is one
page of shared memory (a sealed memfd, mapped by the parent and one runner) holding counters, each written by
one side only and on a cache line of its own. The runner, once its request has arrived, writes `armed` and
spins until the parent writes `go`; the parent spins until the runner writes `done`. A round trip between two
spinning processes on their own cores takes well under a microsecond.

On the CPU, where the call's own work is measured by the sandbox's CPU clock (its cgroup), spinning would
count as work; there a doorbell also holds two eventfds (one per direction) and a waiting side blocks on its
eventfd instead (`blocking`): a wake-up costs tens of microseconds of wall time and no CPU time.

Nothing here is trusted on the runner's word: a runner that rings early, late or never only changes the
parent's own clock readings, which are the evidence (`session.Session.call`).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import select
import time
from collections.abc import Callable

PAGE = 4096
#: Word offsets (int64), one 64-byte cache line apart: the parent writes GO, the runner ARMED and DONE.
GO, ARMED, DONE = 0, 8, 16
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


#: How often a blocked waiter wakes up to run its `tick`.
BLOCKED_TICK_S = 0.05


class Doorbell:
    """One page of counters shared by the parent and one runner (module docstring); with `events`, the
    eventfds a blocking waiter sleeps on: `to_runner` (GO) and `to_parent` (ARMED, DONE)."""

    def __init__(self, fd: int, owner: bool, events: tuple[int, int] | None = None):
        self.fd, self.owner = fd, owner
        self.map = mmap.mmap(fd, PAGE)
        self.words = memoryview(self.map).cast("q")
        self.events = events  # (to the runner, to the parent)

    @classmethod
    def create(cls, *, blocking: bool = False) -> Doorbell:
        fd = os.memfd_create("cudal1-doorbell", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, PAGE)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        events = (os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK), os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)) \
            if blocking else None
        return cls(fd, owner=True, events=events)

    @classmethod
    def attach(cls, fd: int, events: tuple[int, int] | None = None) -> Doorbell:
        if os.fstat(fd).st_size < PAGE:
            raise ValueError("a doorbell is one page")
        return cls(fd, owner=False, events=events)

    @property
    def descriptors(self) -> tuple[int, ...]:
        """What a runner needs to attach it: the page, then the eventfds where blocking."""
        return (self.fd, *(self.events or ()))

    # ------------------------------------------------------------------ either side

    def ring(self, word: int, value: int) -> None:
        self.words[word] = value
        if self.events is not None:
            os.eventfd_write(self.events[0] if word == GO else self.events[1], 1)

    def read(self, word: int) -> int:
        return int(self.words[word])

    def wait(self, word: int, value: int, timeout_s: float, tick: Callable[[], None] | None = None) -> float:
        """Spin (then poll) until `word` reaches `value` (counters only grow: a side that failed half-way
        rings its last one, which ends every wait before it), or block on the eventfd where blocking; the
        `time.perf_counter()` at which it was seen. Raises DoorbellTimeout past `timeout_s`; `tick` runs
        every few thousand spins or every BLOCKED_TICK_S, and once more before a timeout (it may raise: a
        preempted wait whose first look is past the deadline still asks the watchdog first)."""
        words = self.words
        if words[word] >= value:
            return time.perf_counter()
        if self.events is not None:
            return self._block(word, value, timeout_s, tick)
        start = time.perf_counter()
        spin_until, deadline = start + SPIN_S, start + timeout_s
        n = 0
        while True:
            if words[word] >= value:
                return time.perf_counter()
            n += 1
            if n > SPIN_TURNS:
                os.sched_yield()
            if n % TICK_EVERY == 0:
                now = time.perf_counter()
                if tick is not None:  # before the deadline's check: a watchdog's own error says more
                    tick()
                if now > deadline:
                    raise DoorbellTimeout(f"no ring within {timeout_s:.1f} s")
                if now > spin_until:
                    time.sleep(POLL_S)
                    n = TICK_EVERY - 1  # check the deadline after every poll

    def _block(self, word: int, value: int, timeout_s: float, tick: Callable[[], None] | None) -> float:
        assert self.events is not None
        event = self.events[0] if word == GO else self.events[1]
        deadline = time.perf_counter() + timeout_s
        while True:
            if self.words[word] >= value:
                return time.perf_counter()
            left = deadline - time.perf_counter()
            if left <= 0:
                if tick is not None:
                    tick()
                raise DoorbellTimeout(f"no ring within {timeout_s:.1f} s")
            if select.select([event], [], [], min(left, BLOCKED_TICK_S))[0]:
                try:
                    os.eventfd_read(event)
                except BlockingIOError:
                    pass
            elif tick is not None:
                tick()

    def close(self) -> None:
        for event in self.events or ():
            try:
                os.close(event)
            except OSError:
                pass
        try:
            self.words.release()
            self.map.close()
        except (BufferError, ValueError):
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass
