"""Paired timing of reference and candidate: the protocol behind every speedup cudal1 reports.

Per timed call (CUDA): flush L2 by rewriting a buffer of twice its size, record a start event, call the
model, record an event on the current stream, wait for the WHOLE device (`torch.cuda.synchronize`), record
the end event. The primary time is start -> end, so work queued on any stream or by any thread before
the device wait is counted; the stream-only time (start -> current-stream event) is kept to flag work
that escaped the current stream. On CPU, `time.perf_counter` around the call and a cache-sized write as
the flush.

Reference and candidate alternate in random order within each iteration, over input sets that rotate
and are refilled with fresh values (salted seeds) before every pair (so neither can profit from caching
by address, shape or value). The speedup is the median over buckets of (mean reference time / mean candidate time); the
stability figure is the interquartile range of bucket speedups over their median. A second, shorter
series without the flush gives the warm-cache speedup (CUDA-L1's condition), reported beside it.

Covered: side streams, async threads that finish before the device wait, caching across calls, warm-L2
inflation, order effects. Not covered here: clocks/thermal state (measured as found; compare ratios from
one run), work started by threads after the device wait (the thread guard catches those).
"""

from __future__ import annotations

import contextlib
import functools
import random
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from cudal1.core.types import TimingStats

CPU_FLUSH_BYTES = 32 * 2**20  # larger than the last-level cache of common server CPUs' per-core share
MIN_CUDA_FLUSH_BYTES = 256 * 2**20


@dataclass
class Sample:
    total_ms: float  # device-wide
    stream_ms: float  # current stream only (== total_ms on CPU)


@dataclass
class PairedSeries:
    ref: list[list[Sample]] = field(default_factory=list)  # per bucket
    cand: list[list[Sample]] = field(default_factory=list)


def make_flusher(device: torch.device) -> Callable[[], None]:
    """A callable that evicts the last-level cache before a timed call."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 0)
        buf = torch.empty(max(2 * l2, MIN_CUDA_FLUSH_BYTES) // 4, dtype=torch.float32, device=device)
        return lambda: buf.fill_(1.0)
    cpu_buf = torch.empty(CPU_FLUSH_BYTES // 4, dtype=torch.float32)
    return lambda: cpu_buf.fill_(1.0)


def time_call(fn: Callable[[], Any], device: torch.device, flush: Callable[[], None] | None,
              context: Callable[[], AbstractContextManager] | None = None) -> tuple[Any, Sample]:
    """Time one call by the protocol of the module docstring; returns (output, sample).

    `context` (e.g. the reference's private memory pool) is entered before the clock starts and left after
    it stops, so its own cost is never charged to the call: reference and candidate are timed alike.
    """
    with context() if context is not None else contextlib.nullcontext():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            if flush is not None:
                flush()
                # Wait for the flush itself: work the model puts on another stream must not overlap it.
                torch.cuda.synchronize(device)
            start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            start.record()
            out = fn()
            mid.record()
            torch.cuda.synchronize(device)
            end.record()
            end.synchronize()
            return out, Sample(start.elapsed_time(end), start.elapsed_time(mid))
        if flush is not None:
            flush()
        t0 = time.perf_counter()
        out = fn()
        ms = (time.perf_counter() - t0) * 1e3
        return out, Sample(ms, ms)


def iterations_per_bucket(ref_ms: float, cand_ms: float, target_bucket_ms: float, lo: int, hi: int) -> int:
    """Timed calls per model per bucket so that a bucket takes about `target_bucket_ms` per model."""
    slowest = max(ref_ms, cand_ms, 1e-3)
    return int(min(hi, max(lo, round(target_bucket_ms / slowest))))


def run_series(run_ref: Callable[[int], Any], run_cand: Callable[[int], Any], *, n_sets: int, buckets: int,
               iters: int, device: torch.device, flush: Callable[[], None] | None, rng: random.Random,
               on_pair: Callable[[int, Any, Any], None], refresh: Callable[[int, int], None] | None,
               ref_context: Callable[[], AbstractContextManager] | None = None) -> PairedSeries:
    """Interleaved, randomly ordered timed calls of both models, `iters` per model per bucket.

    `run_ref(k)`/`run_cand(k)` call a model on input set k and must not wait for the device themselves
    (`time_call` does, for both alike); `on_pair(k, ref_out, cand_out)` checks and releases the outputs of
    one iteration; `refresh(step, k)` refills input set k before each pair (untimed); `ref_context` is
    entered around each reference call, outside its timed span.
    """
    series = PairedSeries()
    step = 0
    for _ in range(buckets):
        ref_b: list[Sample] = []
        cand_b: list[Sample] = []
        for _ in range(iters):
            k = step % n_sets
            if refresh is not None:
                refresh(step, k)
            step += 1
            outs: dict[str, Any] = {}
            for who in (("ref", "cand") if rng.random() < 0.5 else ("cand", "ref")):
                fn = functools.partial(run_ref if who == "ref" else run_cand, k)
                outs[who], sample = time_call(fn, device, flush, ref_context if who == "ref" else None)
                (ref_b if who == "ref" else cand_b).append(sample)
            on_pair(k, outs.pop("ref"), outs.pop("cand"))
        series.ref.append(ref_b)
        series.cand.append(cand_b)
    return series


def _quantile(values: list[float], q: float) -> float:
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def round_toward_one(speedup: float) -> float:
    """CUDA-L1's conservative rounding: two decimals, rounded toward 1 (floor above 1, ceil below)."""
    import math

    scaled = speedup * 100
    return (math.floor(scaled + 1e-9) if speedup >= 1 else math.ceil(scaled - 1e-9)) / 100


def summarize_series(series: PairedSeries, *, stream_only: bool = False) -> tuple[float, float, float, float, list[float]]:
    """(ref_ms, cand_ms, speedup, stability, bucket_speedups) of a paired series."""
    def t(s: Sample) -> float:
        return s.stream_ms if stream_only else s.total_ms
    bucket_speedups = []
    for ref_b, cand_b in zip(series.ref, series.cand, strict=True):
        ref_mean = statistics.fmean(t(s) for s in ref_b)
        cand_mean = statistics.fmean(t(s) for s in cand_b)
        bucket_speedups.append(ref_mean / max(cand_mean, 1e-9))
    ref_ms = statistics.median(t(s) for b in series.ref for s in b)
    cand_ms = statistics.median(t(s) for b in series.cand for s in b)
    median = statistics.median(bucket_speedups)
    stability = (_quantile(bucket_speedups, 0.75) - _quantile(bucket_speedups, 0.25)) / max(median, 1e-9)
    return ref_ms, cand_ms, median, stability, bucket_speedups


def stream_escape_ms(series: PairedSeries) -> tuple[float, float]:
    """Median time each model's work ran past the end of the current stream: (ref, candidate)."""
    def gap(buckets: list[list[Sample]]) -> float:
        return statistics.median(s.total_ms - s.stream_ms for b in buckets for s in b)
    return gap(series.ref), gap(series.cand)


def build_stats(cold: PairedSeries, warm: PairedSeries | None, *, method: str, iters: int,
                round_to_one: bool) -> TimingStats:
    ref_ms, cand_ms, speedup, stability, buckets = summarize_series(cold)
    warm_values: tuple[float | None, float | None, float | None] = (None, None, None)
    if warm is not None and warm.ref:
        w_ref, w_cand, w_speedup, _, _ = summarize_series(warm)
        warm_values = (w_speedup, w_ref, w_cand)
    if round_to_one:
        speedup = round_toward_one(speedup)
        warm_values = (round_toward_one(warm_values[0]) if warm_values[0] else None, *warm_values[1:])
    return TimingStats(ref_ms=ref_ms, candidate_ms=cand_ms, speedup=speedup, stability=stability,
                       bucket_speedups=buckets, speedup_warm=warm_values[0], ref_ms_warm=warm_values[1],
                       candidate_ms_warm=warm_values[2], method=method, iterations=iters * len(buckets))
