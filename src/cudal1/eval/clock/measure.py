"""The timed part of a session: the calibration, then paired calls in random order, verified and bounded.

Calibration (`calibrate`, before the candidate is imported): pairs of calls of the reference's runner and of
the candidate's runner holding the reference's model as a twin, through the same brackets as everything
after. Both are honest then, so each runner's overhead per call (bracket minus reported time) is measured in
the very process the candidate will run in, and the pair's null ratio shows what this pair of processes does
to one model's time (`timing.Calibration`).

Timing (`run`): per pair, fresh inputs from a seed nobody could know before (`session.Session.make_inputs`),
both models called on them in an order drawn here, each in its bracket; the L2 flushed inside each bracket
(cold series) or not (warm series). The parent decides after each pair, with its own random generator,
whether to compare the two outputs (all of them for small outputs, a sample for large ones, the first of
every bucket always) and check the inputs; the candidate cannot know which pairs are checked. Under a profile
with extra trials, a few pairs drawn at random get inputs beyond the reference's distribution; they are
verified and left out of the times. The time that counts, the interval and the checks are `timing.py`'s.

With the GPU clock (`Session.gated`) there is no bound: each call's time is its gated
bracket on the helper's events less the clock's constant `c`, the median of *null* brackets (no model call)
interleaved with the timed pairs throughout the series (`NULL_EVERY`), so that `c` follows the device's clocks
as the calls do. The reference's runner's nulls give `c`; the candidate's runner runs its own, and its calls
pay the smaller of the two (`timing.paid_c`). Neither model's report is read. Its calibration
(`gated_twin`) is the twin's A/A on the same clock, which only widens the interval.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cudal1.core import flags as F
from cudal1.core.types import Flag, Status, TimingStats
from cudal1.eval.clock import timing
from cudal1.eval.outcomes import Verdict
from cudal1.eval.session import CallRecord, Session
from cudal1.eval.shared.protocol import Side

#: Outputs up to this size are verified after every timed call...
VERIFY_ALL_BYTES = 4 << 10
#: ...larger ones in a sample whose expected size is about this many bytes per call, at least 10 % of the calls
#: (plus the first of every bucket): a candidate that caches or skips work on a share f of its calls is caught
#: with probability 1 - 0.9^(f x calls), certain over the hundreds of calls of a series.
VERIFY_BUDGET_BYTES = 64 << 10
#: Share of timed pairs on inputs beyond the reference's distribution, where the profile has extra trials.
HEAVY_SHARE = 1 / 16
STREAM_ESCAPE_MIN_MS = 0.05
#: The physical floor uses the measured bandwidth times this margin, so that it stays a lower bound: on a GPU
#: peak reads run faster than the helper's fill; on the CPU a task's data may sit in the last-level cache, and
#: a loaded host measures its copies slow.
FLOOR_BANDWIDTH_MARGIN = {"cuda": 1.5, "cpu": 4.0}
#: Calibration: pairs for about this much of the parent's wall time (inputs, brackets, checks: measured on the
#: warm-up pairs), between these bounds, per device type. The calibration's error is most of the bound's slack
#: for a small call on a GPU, whose brackets (about a millisecond of harness) scatter by tens of microseconds;
#: the CPU's slack has a floor of its own (`timing.SLACK_MIN_MS`) that a few dozen pairs already reach (96
#: pairs there cost 2-3 s of a 3.4 s evaluation, its cache flushes between calls).
CALIBRATION_S = {"cuda": 0.8, "cpu": 0.3}
CALIBRATION_PAIRS = (24, 384)
#: Warm-up before the calibration: this much of the parent's wall time (both models), at most this many pairs.
CALIBRATION_WARMUP_S = 0.15
CALIBRATION_WARMUP_PAIRS = 64
#: The GPU clock: a null bracket after every this many timed pairs (and one after the first), at least
#: `NULLS_MIN` per measurement.
NULL_EVERY = 3
NULLS_MIN = 8


def verify_probability(output_bytes: int) -> float:
    if output_bytes <= VERIFY_ALL_BYTES:
        return 1.0
    return max(0.1, min(1.0, VERIFY_BUDGET_BYTES / output_bytes))


_core_bandwidth_seen = 0.0
#: Where the best one-core bandwidth this machine measured is kept (under the cache root), per host name.
CORE_BANDWIDTH_FILE = "core_bandwidth.json"
#: One core's copies: this many bytes (cache-resident, as a small task's data may be), the best of this many.
CORE_COPY_BYTES, CORE_COPIES = 2**20, 64


def core_bandwidth_gbps() -> float:
    """One core's copy bandwidth (GB/s, bytes read and written), the best of many short single-threaded copies
    of cache-resident data: times the cores a candidate may use, the CPU's physical floor. Short copies on one
    thread keep the best of them clear of a busy host (each fits well inside a scheduler's time slice; a
    multi-threaded 8 MB copy, which waits for its slowest thread, came out about 1 GB/s at load 8 and raised
    the floor above an honest reduction's time). The best this machine ever measured is kept (in the cache
    root for its host name, and in this process)."""
    global _core_bandwidth_seen
    import numpy as np

    src = np.ones(CORE_COPY_BYTES // 4, dtype=np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(CORE_COPIES):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    measured = 2 * src.nbytes / best / 1e9
    stored = _stored_core_bandwidth()
    _core_bandwidth_seen = max(_core_bandwidth_seen, measured, stored)
    if _core_bandwidth_seen > stored:
        _store_core_bandwidth(_core_bandwidth_seen)
    return _core_bandwidth_seen


def _core_bandwidth_path() -> Any:
    from cudal1.eval.compile import cache_root

    return cache_root() / CORE_BANDWIDTH_FILE


def _stored_core_bandwidth() -> float:
    try:
        data = json.loads(_core_bandwidth_path().read_text())
        value = float(data.get(platform.node(), 0.0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0.0
    return value if math.isfinite(value) and value > 0 else 0.0


def _store_core_bandwidth(gbps: float) -> None:
    path = _core_bandwidth_path()
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
        if not isinstance(data, dict):
            data = {}
        data[platform.node()] = gbps
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except (OSError, ValueError):
        pass  # a cache that cannot be written only costs the next process its own measurement


def sample_of(record: CallRecord) -> timing.Sample:
    """A bracket's figures per call: its times divided by its calls (the helper's and the flush's are the
    bracket's own)."""
    helper, n = record.helper, record.calls
    return timing.Sample(ms=record.reply.ms / n, stream_ms=record.reply.stream_ms / n, bracket_ms=record.bracket_ms / n,
                         model_ms=record.model_ms / n, after=record.after,
                         idle_us=helper.idle_us if helper is not None else None,
                         flush_ms=helper.flush_ms if helper is not None else None,
                         cpu_flush_ms=record.flush_ms, cpu_ms=record.cpu_ms / n if record.cpu_ms is not None else None,
                         call_cpu_ms=record.reply.cpu_ms / n if record.reply.cpu_ms is not None else None,
                         calls=n, stage_ms=record.stage_ms / n if record.stage_ms is not None else None,
                         helper_stage_us=helper.stage_us if helper is not None else None,
                         helper_end_us=helper.end_us if helper is not None else None,
                         gpu_ms=record.gpu_ms / n if record.gpu_ms is not None else None,
                         gpu_stage_ms=getattr(helper, "gpu_stage_ms", None), armed=record.armed)


class Measurement:
    """The calibration and the timing schedule of one session (module docstring)."""

    def __init__(self, session: Session, bandwidth_gbps: float | None = None, cores: int = 1):
        self.s = session
        self.cores = cores  # cores the candidate's sandbox may use (its CPU clock over them bounds its time)
        self.cfg = session.cfg
        self.rng = random.SystemRandom()  # the parent's own draws: samples no runner can see
        self.verified = 0
        self.p_verify = verify_probability(session.facts.output_bytes)
        self.bandwidth_gbps = bandwidth_gbps
        self.heavy = 0.0  # share of heavy pairs, once the trials showed the reference handles such inputs
        self.spent_s: dict[str, float] = defaultdict(float)  # the parent's wall time per step, for the record
        # The GPU clock's null brackets (ms per call), this measurement's, per runner and apart by whether L2
        # was flushed (a flushed bracket's snapshot reads from memory, an unflushed one's may hit L2).
        self.nulls: dict[tuple[str, bool], list[float]] = {(w, f): [] for w in (Side.REF, Side.CAND)
                                                            for f in (True, False)}
        self.twin_null: tuple[float, tuple[float, float]] | None = None  # the GPU clock's A/A (`gated_twin`)
        self.pairs = 0
        self.brackets = 0  # brackets made in the "calls" step (timed pairs and their nulls, calibration too)

    @contextmanager
    def spending(self, step: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.spent_s[step] += time.perf_counter() - t0

    # ------------------------------------------------------------------ pairs and series

    def pair(self, flush: bool, verify: bool) -> tuple[timing.Sample, timing.Sample] | None:
        """One timed pair; None for a pair beyond the reference's distribution (verified, not timed)."""
        heavy = self.heavy > 0 and self.rng.random() < self.heavy
        self.s.facts.reached = "extra trials (timed phase)" if heavy else "timing"
        with self.spending("inputs"):
            try:
                stage = self.s.make_inputs("heavy" if heavy else "reference")
            except Verdict as verdict:
                if heavy and verdict.flag == F.REFERENCE_ERROR:
                    return None
                raise
        with self.spending("calls"):
            ref, cand = self.s.pair(stage, flush=flush, what="a timed call")
        self.brackets += 2
        if verify or heavy:
            with self.spending("verify"):
                self._verify(stage, ref, cand, heavy)
        # The nulls after the check: a null bracket snapshots the output regions again, and what the
        # candidate's process writes in its own null must never stand in for what its timed call wrote.
        if self.s.gated and self.pairs % NULL_EVERY == 0:
            with self.spending("calls"):
                self.null(stage, flush)
            self.brackets += 2
        self.pairs += 1
        return None if heavy else (sample_of(ref), sample_of(cand))

    def null(self, stage: dict, flush: bool) -> None:
        """One null bracket of the GPU clock (no model call) in each runner, in a drawn order, on the staged
        inputs: the reference's gives the clock's constant, the candidate's may lower its own (`timing.paid_c`)."""
        for who in self.rng.sample((Side.REF, Side.CAND), 2):
            record = self.s.call(who, stage, flush=flush, what="the clock's null call", null=True)
            assert record.gpu_ms is not None
            self.nulls[(who, flush)].append(record.gpu_ms / record.calls)

    def clocked(self, series: timing.PairedSeries, flush: bool) -> timing.PairedSeries:
        cand = self.nulls[(Side.CAND, flush)]
        return timing.gpu_clocked(series, statistics.median(self.nulls[(Side.REF, flush)]),
                                  statistics.median(cand) if cand else None)

    def _verify(self, stage: dict, ref: CallRecord, cand: CallRecord, heavy: bool) -> None:
        errors = self.s.reference_errors is not None and not heavy
        call = self.rng.randrange(cand.calls)  # one call of the bracket, drawn here
        result = self.s.compare(ref, cand, trial=-1, call=call, errors=errors)
        if not result.ok and heavy:
            self.s.beyond_distribution_failed(result, " in a timed call", -1)
        elif not result.ok:
            raise Verdict(Status.INCORRECT, "wrong output in a timed run (correct in the trials): " + result.message,
                          mismatch=result.mismatch, flag=F.TIMED_OUTPUT)
        if result.errors:
            self.s.check_precision(result.errors, "a timed call")
        self.s.check_inputs(stage, ref, cand, "a timed call")
        self.verified += 1

    def series(self, buckets: int, iters: int, flush: bool) -> timing.PairedSeries:
        series = timing.PairedSeries()
        for _ in range(buckets):
            ref_b: list[timing.Sample] = []
            cand_b: list[timing.Sample] = []
            while len(ref_b) < iters:
                verify = not ref_b or self.rng.random() < self.p_verify
                pair = self.pair(flush, verify)
                if pair is not None:
                    ref_b.append(pair[0])
                    cand_b.append(pair[1])
            series.ref.append(ref_b)
            series.cand.append(cand_b)
        return series

    # ------------------------------------------------------------------ calibration

    def calibrate(self) -> timing.Calibration | None:
        """The twin series (module docstring): run after `Session.setup`, before the candidate's import. With
        the GPU clock, the device's warm-up (one call per bracket), then the twin's A/A alone (`gated_twin`)."""
        flush = self.cfg.flush_l2
        if self.s.gated:
            self.gated_twin(flush)
            return None
        with self.spending("calibration"):
            # The reference's time per call from the warm-up's best call (the first calls after setting up are
            # slow; fewer calls per bracket than ideal cost only slack).
            took, refs = self._warm_up(flush)
            reference_ms = min(s.ms for s in refs)
            if self.s.set_calls(reference_ms) > 1:  # brackets of several calls: their wall per pair is new
                started = time.perf_counter()
                self.series(1, 2, flush)
                per_pair_s = (time.perf_counter() - started) / 2
            else:  # the warm-up's later pairs, the device warm by then
                per_pair_s = statistics.median(took[len(took) // 2:])
            n = self._twin_pairs(per_pair_s)
            twin = self.series(1, n, flush)
            calibration = timing.calibrate(twin)
        if self.cfg.record_samples:  # the twin's pairs, before the candidate's import
            self.s.facts.samples = {"calibration": timing.samples_record(twin)}
        self.s.facts.calibration = calibration.to_dict() | {
            "warmup_pairs": len(took), "calls_from_reference_ms": round(reference_ms, 6)}
        return calibration

    def gated_twin(self, flush: bool) -> None:
        """The GPU clock's calibration: the device warmed (one call per bracket), then the reference against its
        twin in the candidate's runner (trusted yet), on the GPU clock, for `CALIBRATION_S`: this runner pair's
        null ratio and its interval (`self.twin_null`), by which the speedup's interval is widened
        (`timing.gpu_widened`): two processes can time the same model apart (memory placement, the contexts'
        switches), and a time of 10 us feels a microsecond. The phase's nulls are dropped after it: the timed
        calls' constants come from the timed phase alone."""
        with self.spending("calibration"):
            self.s.calls = self.s.plane.calls = 1  # type: ignore[union-attr]
            took, _ = self._warm_up(flush)
            self.forget_nulls()  # (taken while the device's clocks ramped up)
            n = self._twin_pairs(statistics.median(took[len(took) // 2:]))  # the later pairs: the device warm
            twin = self.series(1, n, flush)
            while len(self.nulls[(Side.REF, flush)]) < NULLS_MIN:
                self.null(self.s.make_inputs(), flush)
            twin = self.clocked(twin, flush)
            ref, cand = [s.ms for s in twin.all(Side.REF)], [s.ms for s in twin.all(Side.CAND)]
            null = statistics.median(ref) / max(statistics.median(cand), 1e-12)
            self.twin_null = (null, timing.bootstrap_ratio(ref, cand))
            self.forget_nulls()
        if self.cfg.record_samples:
            self.s.facts.samples = {"calibration": timing.samples_record(twin)}
        self.s.facts.calibration = {"clock": "gpu", "warmup_pairs": len(took), "pairs": n, "null": round(null, 6),
                                    "null_ci": [round(x, 6) for x in self.twin_null[1]]}

    def _warm_up(self, flush: bool) -> tuple[list[float], list[timing.Sample]]:
        """The device warmed before the twin series (its clocks ramp up under load: an idle H100 is found at
        345 MHz): pairs of one call per bracket for a set wall time, not a count estimated from the first
        pairs, which are the slowest. The parent's seconds per pair, and the reference's samples."""
        took: list[float] = []
        refs: list[timing.Sample] = []
        t0 = time.perf_counter()
        while not took or (time.perf_counter() - t0 < CALIBRATION_WARMUP_S and len(took) < CALIBRATION_WARMUP_PAIRS):
            started = time.perf_counter()
            pair = self.series(1, 1, flush)
            took.append(time.perf_counter() - started)
            refs += pair.all(Side.REF)
        return took, refs

    def _twin_pairs(self, per_pair_s: float) -> int:
        """The twin series' pairs: as many as `CALIBRATION_S` of the parent's time holds, within
        `CALIBRATION_PAIRS`."""
        lo, hi = CALIBRATION_PAIRS
        return int(min(hi, max(lo, round(CALIBRATION_S[self.s.device_type] / max(per_pair_s, 1e-6)))))

    def forget_nulls(self) -> None:
        for series in self.nulls.values():
            series.clear()
        self.pairs = 0

    # ------------------------------------------------------------------ timing

    def run(self, calibration: timing.Calibration | None,
            twin_null: tuple[float, tuple[float, float]] | None = None) -> TimingStats:
        """The timed phase (module docstring). `calibration`: the host clock's twin series (`calibrate`);
        `twin_null`: the GPU clock's (`gated_twin`, measured by the calibrating instance), which widens the
        speedup's interval."""
        cfg = self.cfg
        flush = cfg.flush_l2
        if cfg.extra_trial_count and (self.s.facts.beyond_distribution_trials or 0) > 0:
            self.heavy = HEAVY_SHARE
        warmup = self.series(1, max(cfg.warmup_iters, 2), flush)
        # A bucket's pairs from the brackets' own time (the samples are per call)
        ref_call = statistics.median(s.bracket_ms * s.calls for s in warmup.all(Side.REF))
        cand_call = statistics.median(s.bracket_ms * s.calls for s in warmup.all(Side.CAND))
        self.s.ref_times["call"] = statistics.median(s.ms for s in warmup.all(Side.REF)) / 1e3
        most = min(cfg.max_iters_per_bucket, cfg.gpu_clock_max_iters) if self.s.gated else cfg.max_iters_per_bucket
        iters = timing.iterations_per_bucket(ref_call, cand_call, cfg.target_bucket_ms, cfg.min_iters_per_bucket,
                                             most, cfg.buckets)
        device = self.s.device_type
        cold = self.series(cfg.buckets, iters, flush)
        warm = self.series(cfg.warm_buckets, iters, False) if cfg.warm_buckets and flush else None
        if self.s.gated:
            for flushed in {flush, False} if warm is not None else {flush}:
                while len(self.nulls[(Side.REF, flushed)]) < NULLS_MIN:
                    self.null(self.s.make_inputs(), flushed)
            cold = self.clocked(cold, flush)
            warm = self.clocked(warm, False) if warm is not None else None
            calibration = None
        bound = timing.counted_time(cold.all(Side.CAND), calibration, device, self.cores, cold.all(Side.REF))
        floor_ms = self.floor_ms()
        found: list[Flag | None] = [
            *timing.bound_flags(bound), timing.interference_check(cold),
            timing.reference_slowed(cold, calibration, device), timing.floor_check(bound.counted_ms, floor_ms),
            timing.flush_check([s.cpu_flush_ms for s in cold.all(Side.REF) if s.cpu_flush_ms is not None],
                               [s.cpu_flush_ms for s in cold.all(Side.CAND) if s.cpu_flush_ms is not None])]
        self.s.flags += [f for f in found if f is not None]
        self.s.facts.clock = {"clock": "host", **timing.clock_summary(cold, bound, calibration)}
        if self.s.gated:
            self.s.facts.clock.update(timing.gpu_clock_summary(cold, self.nulls[(Side.REF, flush)], self.s.unarmed,
                                                                    self.nulls[(Side.CAND, flush)]))
        if cfg.record_samples:
            self.s.facts.samples = {**(self.s.facts.samples or {}), **timing.samples_record(cold)}
        stats = timing.build_stats(cold, warm, bound=bound,
                                   method=("gpu_gate_events" if self.s.gated else "cuda_events+device_sync")
                                   if device == "cuda" else "host_timer",
                                   iters=iters, round_to_one=cfg.round_toward_one, floor_ms=floor_ms,
                                   verified_calls=self.verified, estimator=cfg.estimator)
        within = timing.speedup_interval(cold, calibration, device, cores=self.cores)
        if self.s.gated:
            interval = timing.gpu_widened(stats.speedup, within, stats.ref_ms, stats.candidate_ms,
                                          self.nulls[(Side.REF, flush)], self.nulls[(Side.CAND, flush)],
                                          twin_null)
        else:
            interval = timing.widened(stats.speedup, within, calibration)
        stats = dataclasses.replace(stats, speedup_ci=[round(interval[0], 6), round(interval[1], 6)])
        self.s.facts.clock["speedup_ci_within"] = [round(x, 6) for x in within]
        self.s.facts.timing_spent_s = {k: round(v, 4) for k, v in sorted(self.spent_s.items())}
        # What a bracket costs the parent's wall clock, all of it (round trips, freezing, the device's part):
        # where the evaluator's throughput goes.
        self.s.facts.clock["ms_per_bracket"] = round(1e3 * self.spent_s["calls"] / max(self.brackets, 1), 3)
        if device == "cuda" and not self.s.gated:  # (gated: neither model's report is read)
            ref_gap, cand_gap = timing.stream_escape_ms(cold)
            if cand_gap > ref_gap + max(STREAM_ESCAPE_MIN_MS, 0.1 * stats.candidate_ms):
                self.s.flags.append(F.runtime_flag(F.STREAM_ESCAPE, f"{cand_gap:.3f} ms of the candidate's work ran outside the current "
                                         f"stream (reference: {ref_gap:.3f} ms)", source="runtime"))
        return stats

    def floor_ms(self) -> float | None:
        """The task's physical floor: the bytes it must move (inputs read once, outputs written once) at the
        device's measured bandwidth (the helper's fill on a GPU; on the CPU, one core's copy times the cores
        the candidate's sandbox may use)."""
        bandwidth = self.bandwidth_gbps if self.s.device_type == "cuda" else core_bandwidth_gbps() * self.cores
        if not bandwidth:
            return None
        moved = self.s.facts.input_bytes + self.s.facts.output_bytes
        return moved / (FLOOR_BANDWIDTH_MARGIN[self.s.device_type] * bandwidth * 1e6)
