"""The paired timing protocol on CPU (host timers): what is and is not inside a timed span, the order of
calls, and the summary figures."""

from __future__ import annotations

import contextlib
import random
import time

import pytest
import torch

from cudal1.eval import timing
from cudal1.eval.timing import PairedSeries, Sample

CPU = torch.device("cpu")


def test_the_context_of_a_call_is_not_timed():
    """The reference's memory-pool switch (any context) is entered before the clock starts and left after."""
    events = []

    @contextlib.contextmanager
    def slow_context():
        events.append("enter")
        time.sleep(0.05)
        yield
        time.sleep(0.05)
        events.append("exit")

    def call():
        events.append("call")
        time.sleep(0.002)
        return 7

    out, sample = timing.time_call(call, CPU, flush=None, context=slow_context)
    assert out == 7
    assert events == ["enter", "call", "exit"]
    assert 1.5 <= sample.total_ms < 30, sample  # the 2 ms call, none of the 100 ms of the context


def test_run_series_wraps_only_reference_calls_and_randomizes_order():
    inside = {"depth": 0}
    seen: list[tuple[str, int]] = []

    @contextlib.contextmanager
    def ref_context():
        inside["depth"] += 1
        yield
        inside["depth"] -= 1

    def run_ref(k):
        seen.append(("ref", inside["depth"]))
        return torch.full((2,), float(k))

    def run_cand(k):
        seen.append(("cand", inside["depth"]))
        return torch.full((2,), float(k))

    pairs = []
    series = timing.run_series(run_ref, run_cand, n_sets=3, buckets=4, iters=5, device=CPU, flush=None,
                               rng=random.Random(0), on_pair=lambda k, r, c: pairs.append((k, r, c)),
                               refresh=None, ref_context=ref_context)
    assert {who: {d for w, d in seen if w == who} for who in ("ref", "cand")} == {"ref": {1}, "cand": {0}}
    assert len(series.ref) == len(series.cand) == 4 and all(len(b) == 5 for b in series.ref + series.cand)
    assert [k for k, _, _ in pairs] == [i % 3 for i in range(20)]
    assert all(torch.equal(r, c) for _, r, c in pairs)
    firsts = [seen[i][0] for i in range(0, len(seen), 2)]
    assert 0 < firsts.count("ref") < 20  # both orders occur


def test_summary_is_the_median_of_bucket_ratios_with_an_iqr_stability():
    def bucket(ms):
        return [Sample(ms, ms), Sample(ms, ms)]

    series = PairedSeries(ref=[bucket(2.0), bucket(3.0), bucket(4.0), bucket(2.0)],
                          cand=[bucket(1.0), bucket(1.0), bucket(1.0), bucket(2.0)])
    ref_ms, cand_ms, speedup, stability, buckets = timing.summarize_series(series)
    assert buckets == [2.0, 3.0, 4.0, 1.0]
    assert speedup == pytest.approx(2.5)
    assert stability == pytest.approx((3.25 - 1.75) / 2.5)
    assert (ref_ms, cand_ms) == (2.5, 1.0)


@pytest.mark.parametrize(("raw", "rounded"), [(1.756, 1.75), (0.874, 0.88), (1.0, 1.0), (2.0, 2.0)])
def test_round_toward_one(raw, rounded):
    assert timing.round_toward_one(raw) == rounded
