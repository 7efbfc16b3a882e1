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
