"""Pre-started isolated workers: started ahead of need, topped up on each take, all stopped on close."""

from __future__ import annotations

from cudal1.eval.isolation import Limits, WorkerSupply


def test_fill_starts_spares_ahead_and_take_tops_them_up():
    with WorkerSupply("json:dumps", spares=2) as supply:
        assert supply.n_ready == 0
        supply.fill()
        assert supply.n_ready == 2
        spares = list(supply._ready)
        worker = supply.take()
        assert worker is spares[0] and supply.n_ready == 2  # a started one handed out, one more started
        outcome = worker.run({"x": 1}, Limits(timeout_s=60))
        assert outcome.value == '{"x": 1}' and outcome.exit_code == 0
        waiting = list(supply._ready)
    assert supply.n_ready == 0
    for w in waiting:  # close() stopped the ones never taken
        assert w.proc.wait(timeout=10) is not None


def test_pin_confines_waiting_and_new_workers_then_releases_them():
    import os

    import pytest

    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs CPU affinity and two cores")
    one, every = frozenset({min(os.sched_getaffinity(0))}), os.sched_getaffinity(0)
    with WorkerSupply("json:dumps", spares=1) as supply:
        supply.fill()
        waiting = supply._ready[0]
        supply.pin(one)
        assert os.sched_getaffinity(waiting.proc.pid) == one
        assert supply.take() is waiting
        assert os.sched_getaffinity(supply._ready[0].proc.pid) == one  # started while pinned
        supply.pin(None)
        assert os.sched_getaffinity(supply._ready[0].proc.pid) == every
        waiting.discard()


def test_short_series_keep_no_more_spares_than_evaluations():
    from cudal1.eval.pipeline import CUDA_SPARES, worker_supply

    assert worker_supply("cuda:0").spares == CUDA_SPARES
    assert worker_supply("cuda:0", 2).spares == min(2, CUDA_SPARES)
    assert worker_supply("cuda:0", 0).spares == 1
    assert worker_supply("cpu", 8).spares == 1  # a starting worker would compete with the host timers
