"""Several runner pairs per evaluation (`EvalConfig.runner_pairs`): the same candidate measured again in fresh
runners, so that what differs between processes (a new CUDA context, where memory lands, the allocator's
state, the clocks met on arrival) is seen rather than hidden.

One measurement's interval says how precise its calls were, not how much a new pair of processes would move
it: on an H100, 48 pairs of (interval, another evaluation of the same candidate) held the other speedup 30
times. With several pairs the speedup is the median pair's and its interval spans every pair's interval.
A pair that ends other than `correct` ends the evaluation with its result: a candidate is correct only if it
is correct in every pair.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

from cudal1.core.types import EvalResult, Status


def measured_in_pairs(run: Callable[[], EvalResult], pairs: int) -> EvalResult:
    """`run()` (one measurement in fresh runners) up to `pairs` times, stopping at the first result that is not
    `correct`; their combination (`combined`)."""
    results = [run()]
    while len(results) < pairs and results[-1].status is Status.CORRECT:
        results.append(run())
    return combined(results, pairs)


def combined(results: list[EvalResult], pairs: int) -> EvalResult:
    """One result from several pairs' results: the last one if it is not `correct` (its verdict stands), else
    the pair of the median speedup (the lower of the two middle ones for an even count), its interval widened
    to span every pair's, and every pair's figures in `protocol.runner_pairs`."""
    if len(results) == 1 and pairs == 1:
        return results[0]
    runs = [{"status": r.status.value, "speedup": r.speedup,
             "speedup_ci": r.timing.speedup_ci if r.timing is not None else None} for r in results]
    last = results[-1]
    if last.status is not Status.CORRECT:
        note = f" (runner pair {len(results)} of {pairs})" if len(results) > 1 else ""
        return last.replace(message=last.message + note, protocol={**last.protocol, "runner_pairs": runs})
    speedups = [r.speedup for r in results if r.speedup is not None]
    middle = statistics.median_low(speedups)
    base = next(r for r in results if r.speedup == middle)
    ends = [ci for r in results if r.timing is not None and (ci := r.timing.speedup_ci)]
    timing = base.timing
    if timing is not None and ends:
        lo = min([*(ci[0] for ci in ends), *speedups])
        hi = max([*(ci[1] for ci in ends), *speedups])
        timing = dataclasses.replace(timing, speedup_ci=[round(lo, 6), round(hi, 6)])
    flags = list(base.flags)  # the median pair's, then any rule only another pair raised (its first flag)
    seen = {f.rule for f in flags}
    for r in results:
        for f in r.flags:
            if f.rule not in seen:
                seen.add(f.rule)
                flags.append(f)
    spread = max(speedups) / min(speedups) - 1 if speedups and min(speedups) > 0 else None
    return base.replace(timing=timing, flags=flags, protocol={
        **base.protocol, "runner_pairs": runs,
        "runner_pairs_spread": round(spread, 6) if spread is not None else None})
