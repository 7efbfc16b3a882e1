"""Doorbells: counters in shared memory that two processes spin on (cudal1.eval.shared.doorbell)."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from cudal1.eval.shared.doorbell import ARMED, DONE, GO, Doorbell, DoorbellTimeout


def _echo(fd: int, rounds: int) -> None:
    bell = Doorbell.attach(fd)
    for seq in range(1, rounds + 1):
        bell.ring(ARMED, seq)
        bell.wait(GO, seq, 30)
        bell.ring(DONE, seq)


def test_a_round_trip_between_two_processes():
    bell = Doorbell.create()
    child = mp.get_context("fork").Process(target=_echo, args=(bell.fd, 200))
    child.start()
    try:
        trips = []
        for seq in range(1, 201):
            bell.wait(ARMED, seq, 30)
            t0 = time.perf_counter()
            bell.ring(GO, seq)
            trips.append(bell.wait(DONE, seq, 30) - t0)
        assert sorted(trips)[100] < 0.05  # spinning, not sleeping: far below a scheduler tick even here
    finally:
        child.join(10)
        bell.close()


def test_a_wait_that_is_never_rung_times_out_and_ticks_meanwhile():
    bell = Doorbell.create()
    ticks = []
    with pytest.raises(DoorbellTimeout):
        bell.wait(DONE, 1, 0.1, tick=lambda: ticks.append(1))
    assert ticks
    with pytest.raises(ValueError):
        bell.wait(DONE, 1, 5, tick=lambda: (_ for _ in ()).throw(ValueError("the watchdog says stop")))
    bell.close()
