"""The timed part of a session: paired calls in random order, on fresh inputs, verified and cross-checked.

Per pair: a seed from OS randomness; the two models in an order the parent draws; for each, three requests:
`prepare` (its runner makes the inputs from the seed), a cache flush (cold series only: from the flusher's
context on a GPU, in the runner on the CPU), `call` (the timed call; its output is committed to the
runner's arena). The candidate's runner is frozen (SIGSTOP) whenever it is not serving one of its own
requests, so nothing it left running competes with the reference's calls for the CPU; what it left running
on the GPU shows up in `timing.interference_check`.

Every timed input is made when its call is prepared, after the previous call's output was committed, from
a seed nobody could know before: batching or precomputing across calls has nothing to work on. The parent
decides after each pair, with its own random generator, whether to compare the two outputs where they lie
(the candidate's runner frozen meanwhile): all of them for small outputs, a sample for large ones, the first
of every bucket always; the candidate cannot know which calls are checked. Inputs are checked for in-place
changes: by the parent in shared memory on the CPU, by the runners (bytes before and after) on a GPU.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cudal1.core import flags as F
from cudal1.core.types import Flag, Severity, Status, TimingStats
from cudal1.eval import timing
from cudal1.eval.session import Session, Verdict, call_verdict, new_seed

#: Outputs up to this size are verified after every timed call...
VERIFY_ALL_BYTES = 4 << 10
#: ...larger ones in a sample whose expected size is about this many bytes per call, at least 10 % of the calls
#: (plus the first of every bucket): a candidate that caches or skips work on a share f of its calls is caught
#: with probability 1 - 0.9^(f x calls), certain over the hundreds of calls of a series.
VERIFY_BUDGET_BYTES = 64 << 10
STREAM_ESCAPE_MIN_MS = 0.05
#: The physical floor uses the flusher's measured write bandwidth times this margin (peak reads run faster
#: than a fill), so that it stays a lower bound.
FLOOR_BANDWIDTH_MARGIN = 1.5


def verify_probability(output_bytes: int) -> float:
    if output_bytes <= VERIFY_ALL_BYTES:
        return 1.0
    return max(0.1, min(1.0, VERIFY_BUDGET_BYTES / output_bytes))


class Measurement:
    """The timing schedule of one session (module docstring)."""

    def __init__(self, session: Session, bandwidth_gbps: float | None = None):
        self.s = session
        self.cfg = session.cfg
        self.rng = random.SystemRandom()  # the parent's own draws: order and samples no runner can see
        self.last = ""
        self.verified = 0
        self.p_verify = verify_probability(int(session.facts.get("output_bytes", 0)))
        self.bandwidth_gbps = bandwidth_gbps
        # CPU tasks get their inputs through the arenas (`one`): there a flush from another process would not
        # reach the core's own caches, and a runner that made its inputs could work on them before its call.
        self.shipped = session.device_type == "cpu"
        self.spent_s: dict[str, float] = defaultdict(float)  # the parent's wall time per step, for the record

    @contextmanager
    def spending(self, step: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.spent_s[step] += time.perf_counter() - t0

    # ------------------------------------------------------------------ one call

    def one(self, who: str, seed: int, flush: bool, verify: bool,
            shipped: tuple[dict[str, Any], bytes] | None = None) -> tuple[timing.Sample, Any, bool]:
        """One timed call of `who`. On the GPU its runner makes the inputs from the seed (`prepare`), before
        the flush; on the CPU (`shipped`: the reference's inputs, descriptor and bytes) the parent writes
        them into the runner's arena after the flush, while the runner is frozen, and the runner calls its
        model on views of that memory: its process cannot see them before its call starts."""
        ref_call_s = max(self.s.ref_times.get("call", 0.001), 1e-4)
        arena = self.s.ref_arena if who == "ref" else self.s.cand_arena
        runner = self.s.ref if who == "ref" else self.s.cand
        prepare_ms = 0.0
        if shipped is None:
            with self.spending("prepare"):
                reply = self._ask(who, {"op": "prepare", "seed": seed}, "preparing a timed call", ref_call_s)
            prepare_ms = runner.last_request_ms  # the parent's clock, send to reply (no freezing in it)
            if not reply.get("ok"):
                raise Verdict(Status.RUNTIME_ERROR, f"preparing a timed call: {reply.get('message', 'failed')}")
        flush_after = "cand" if who == "cand" else ("ref" if self.last in ("ref", "") else "")
        with self.spending("flush"):
            flush_ms = self.s.flush(who) if flush else None
        message: dict[str, Any] = {"op": "call"}
        if shipped is not None:
            arena.write_region("in", shipped[1])
            message.update(inputs=shipped[0], views=True)
        cpu0 = runner.cpu_ns() if self.shipped else None
        with self.spending("call"):
            reply = self._ask(who, message, "a timed call", ref_call_s)
        outside_ms = runner.last_request_ms
        cpu1 = runner.cpu_ns() if cpu0 is not None else None
        if not reply.get("ok"):
            raise call_verdict(reply, "a timed call")
        mutated = bool(reply.get("mutated"))
        if shipped is not None:  # the parent's own look at the inputs after the call, not the runner's word
            mutated = arena.read_region("in")[: len(shipped[1])] != shipped[1]
        sample = timing.Sample(ms=float(reply["ms"]), stream_ms=float(reply.get("stream_ms", reply["ms"])),
                               outside_ms=outside_ms, prepare_ms=prepare_ms, after=self.last, flush_ms=flush_ms,
                               flush_after=flush_after,
                               cpu_ms=(cpu1 - cpu0) / 1e6 if cpu0 is not None and cpu1 is not None else None)
        self.last = who
        return sample, reply["out"], mutated

    def _ask(self, who: str, message: dict[str, Any], what: str, ref_call_s: float) -> dict[str, Any]:
        if who == "ref":
            return self.s.ask_reference(message, what)[0]
        return self.s.ask_candidate(message, what, ref_call_s)

    def pair(self, flush: bool, verify: bool) -> tuple[timing.Sample, timing.Sample]:
        seed = new_seed()
        order = ("ref", "cand") if self.rng.random() < 0.5 else ("cand", "ref")
        shipped = None
        if self.shipped:
            with self.spending("inputs"):
                reply, _ = self.s.ask_reference({"op": "inputs", "seed": seed}, "making the inputs of a timed call")
                assert self.s.ref_arena is not None
                shipped = (reply["in"], self.s.ref_arena.read_region("in")[: reply.get("in_bytes", 0) or None])
                # The same work in the candidate's runner, on inputs of a seed of their own that the parent
                # overwrites before the call: both processes then come to their calls from the same history.
                self.s.ask_candidate({"op": "inputs", "seed": new_seed()}, "making throwaway inputs",
                                     max(self.s.ref_times.get("call", 0.001), 1e-4))
        samples, outs, mutated = {}, {}, {}
        for who in order:
            samples[who], outs[who], mutated[who] = self.one(who, seed, flush, verify, shipped)
        if mutated["cand"] and not mutated["ref"]:
            raise Verdict(Status.INCORRECT, "the candidate modified its inputs in place in a timed call; the "
                          "reference leaves them unchanged", flag=F.INPUT_MUTATION)
        if verify:
            with self.spending("verify"):
                result = self.s.compare(outs["ref"], outs["cand"], trial=-1,
                                        errors=self.s.reference_errors is not None)
            if not result.ok:
                raise Verdict(Status.INCORRECT, "wrong output in a timed run (correct in the trials): " + result.message,
                              mismatch=result.mismatch, flag=F.TIMED_OUTPUT)
            if result.errors:
                self.s.check_precision(result.errors, "a timed call")
            self.verified += 1
        return samples["ref"], samples["cand"]

    # ------------------------------------------------------------------ series

    def series(self, buckets: int, iters: int, flush: bool) -> timing.PairedSeries:
        series = timing.PairedSeries()
        for _ in range(buckets):
            ref_b, cand_b = [], []
            for i in range(iters):
                verify = i == 0 or self.rng.random() < self.p_verify
                r, c = self.pair(flush, verify)
                ref_b.append(r)
                cand_b.append(c)
            series.ref.append(ref_b)
            series.cand.append(cand_b)
        return series

    def run(self) -> TimingStats:
        cfg = self.cfg
        flush = cfg.flush_l2
        warmup = self.series(1, max(cfg.warmup_iters, 2), flush)
        ref_out = statistics.median(s.prepare_ms + s.outside_ms for s in warmup.all("ref"))
        cand_out = statistics.median(s.prepare_ms + s.outside_ms for s in warmup.all("cand"))
        self.s.ref_times["call"] = statistics.median(s.outside_ms for s in warmup.all("ref")) / 1e3
        iters = timing.iterations_per_bucket(ref_out, cand_out, cfg.target_bucket_ms, cfg.min_iters_per_bucket,
                                             cfg.max_iters_per_bucket, cfg.buckets)
        device = self.s.device_type
        cold = self.series(cfg.buckets, iters, flush)
        clock = timing.clock_check(cold, device)
        if clock is not None:
            # Confirmed on a fresh series before it rejects: a forged or hidden time shows in every series,
            # while the host's passing load (runners starting, another process) moved honest gaps by more
            # than the tolerance in single series on the H200 host. The timing reported is the new series'
            # alone, so a candidate that forged only the first gains nothing.
            self.s.facts["clock_rejected_series"] = {**timing.clock_summary(cold, device), "flag": clock.message}
            cold = self.series(cfg.buckets, iters, flush)
            clock = timing.clock_check(cold, device)
        warm = self.series(cfg.warm_buckets, iters, False) if cfg.warm_buckets and flush else None
        self.s.facts["clock"] = timing.clock_summary(cold, device)
        if cfg.record_samples:
            self.s.facts["samples"] = timing.samples_record(cold)
        self.s.facts["timing_spent_s"] = {k: round(v, 4) for k, v in sorted(self.spent_s.items())}
        for found in (clock, timing.interference_check(cold, device),
                      timing.flush_check(self.s.cpu_flush_ms["ref"], self.s.cpu_flush_ms["cand"])):
            if found is not None:
                self.s.flags.append(found)
        floor_ms = self.floor_ms()
        stats = timing.build_stats(cold, warm, method="cuda_events+device_sync" if device == "cuda" else "host_timer",
                                   iters=iters, round_to_one=cfg.round_toward_one, floor_ms=floor_ms,
                                   verified_calls=self.verified, estimator=cfg.estimator)
        below = timing.floor_check(stats.candidate_ms, floor_ms)
        if below is not None:
            self.s.flags.append(below)
        if device == "cuda":
            ref_gap, cand_gap = timing.stream_escape_ms(cold)
            if cand_gap > ref_gap + max(STREAM_ESCAPE_MIN_MS, 0.1 * stats.candidate_ms):
                self.s.flags.append(Flag(F.STREAM_ESCAPE, Severity.ERROR,
                                         f"{cand_gap:.3f} ms of the candidate's work ran outside the current "
                                         f"stream (reference: {ref_gap:.3f} ms)", source="runtime"))
        return stats

    def floor_ms(self) -> float | None:
        """The task's physical floor: the bytes it must move (inputs read once, outputs written once) at the
        device's measured bandwidth (GPU only: on the CPU the bandwidth of a core is not measured)."""
        if not self.bandwidth_gbps:
            return None
        moved = int(self.s.facts.get("input_bytes", 0)) + int(self.s.facts.get("output_bytes", 0))
        return moved / (FLOOR_BANDWIDTH_MARGIN * self.bandwidth_gbps * 1e6)
