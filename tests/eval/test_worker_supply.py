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


def test_pin_puts_the_worker_handed_out_on_its_own_cores_and_the_rest_elsewhere():
    import os

    import pytest

    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs CPU affinity and two cores")
    every = frozenset(os.sched_getaffinity(0))
    timed, rest = frozenset({min(every)}), every - {min(every)}
    with WorkerSupply("json:dumps", spares=1) as supply:
        supply.fill()
        waiting = supply._ready[0]
        supply.pin(timed, others=rest)
        assert os.sched_getaffinity(waiting.proc.pid) == rest  # waiting or starting: off the timed cores
        assert supply.take() is waiting
        assert os.sched_getaffinity(waiting.proc.pid) == timed  # handed out: the timed cores only
        assert os.sched_getaffinity(supply._ready[0].proc.pid) == rest  # started while pinned
        supply.pin(None)
        assert os.sched_getaffinity(supply._ready[0].proc.pid) == every
        waiting.discard()


def test_a_series_of_known_length_starts_no_more_workers_than_it_takes():
    with WorkerSupply("json:dumps", spares=2, total=3) as supply:
        supply.fill()
        taken = [supply.take() for _ in range(3)]
        assert supply.n_ready == 0 and supply._started == 3
        for worker in taken:
            worker.discard()


def test_short_series_keep_no_more_spares_than_evaluations():
    from cudal1.eval.pipeline import CUDA_SPARES, worker_supply

    assert worker_supply("cuda:0").spares == CUDA_SPARES
    assert worker_supply("cuda:0", 2).spares == min(2, CUDA_SPARES)
    assert worker_supply("cuda:0", 0).spares == 1
    assert worker_supply("cpu", 8).spares == 1  # a starting worker would compete with the host timers


def test_pool_sizes_follow_the_cores_this_process_may_use_not_the_host():
    import os
    import subprocess
    import sys

    import pytest

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from cudal1.eval.isolation import usable_cpu_count; print(usable_cpu_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
