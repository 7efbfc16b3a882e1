"""Fill torch.compile's caches for many baselines at once, before they are timed one at a time.

A `torch_compile` baseline compiles in its timed evaluation, serially, with one compile thread (the
evaluator's thread guard); a cold compile of a level-2/3 model takes tens of seconds. `warm_compile_caches`
first runs each pending (task, compile kind) once in its own isolated child, several at a time, exactly as
the evaluation will construct and call it (same generated source, seed, problem sizes, device, fp32
numerics and no-grad mode), so inductor's on-disk caches (FX graph, Triton kernels; shared by the processes
of one user) are filled in parallel and the timed evaluations load from them. Nothing is measured or stored here; a failure
only means the timed evaluation compiles (or fails) itself and reports why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cudal1.baselines.variants import baseline_source
from cudal1.eval.config import EvalConfig
from cudal1.eval.evaluation import compile_cache_env, sandbox_spec
from cudal1.eval.inside.candidate import import_candidate
from cudal1.eval.inside.harness import make_inputs, sync, use_device, use_exact_fp32
from cudal1.eval.isolated import Limits, run_isolated
from cudal1.eval.supply import usable_cpu_count
from cudal1.tasks.task import Task, load_reference

logger = logging.getLogger(__name__)

#: Baseline kinds whose first call compiles.
COMPILE_KINDS: frozenset[str] = frozenset({"torch_compile", "torch_compile_reduce_overhead"})

WARM_ENTRY = "cudal1.baselines.warm:compile_in_worker"

#: What a (task, kind) not started because `should_stop` said so maps to.
SKIPPED = "skipped (stopped)"


def compile_in_worker(payload: dict[str, Any]) -> dict[str, Any]:
    """Isolated entry: construct the baseline's `ModelNew` as the evaluator does and call it twice."""
    from pathlib import Path

    import torch


    device = use_device(payload["device"])
    ref = load_reference(payload["ref_source"], payload["task_id"], sizes=payload["sizes"])
    if payload.get("exact_fp32"):
        use_exact_fp32()  # as the runners do, after the reference: inductor keys its caches on it
    module = import_candidate(payload["source"], Path.cwd())  # as the candidate's runner imports it
    started = time.perf_counter()
    torch.manual_seed(payload["seed"])
    model = module.ModelNew(*ref.get_init_inputs()).to(device)
    inputs = make_inputs(ref, device, payload["seed"])
    with torch.no_grad():
        for _ in range(2):  # reduce-overhead records its CUDA graph on a later call than the first
            model(*inputs)
    sync(device)
    return {"seconds": time.perf_counter() - started}


def warm_compile_caches(pairs: Sequence[tuple[Task, str]], cfg: EvalConfig, *, parallel: int | None = None,
                        timeout_s: float | None = None,
                        should_stop: Callable[[], bool] | None = None) -> dict[tuple[str, str], float | str]:
    """Compile each (task, kind) of `pairs` once, `parallel` at a time (default: half the CPU cores).

    `cfg` is the resolved evaluation config of the timed runs (device, sizes, seed). Returns, per
    (task id, kind), the seconds the compiling call took, or the reason it failed or was skipped
    (`should_stop` is asked before each one starts).
    """

    pairs = [(t, k) for t, k in pairs if k in COMPILE_KINDS]
    if not pairs:
        return {}
    threads = max(1, min(len(pairs), parallel or usable_cpu_count() // 2))
    limits = Limits(timeout_s=timeout_s or cfg.build_timeout_s, memory_bytes=None)

    def one(pair: tuple[Task, str]) -> float | str:
        task, kind = pair
        if should_stop is not None and should_stop():
            return SKIPPED
        payload = {"task_id": task.id, "ref_source": task.source, "device": cfg.device, "sizes": cfg.sizes,
                   "seed": cfg.seed, "exact_fp32": cfg.uses_exact_fp32,
                   "source": baseline_source(task, kind, cfg.sizes, clone_outputs=False)}
        outcome = run_isolated(WARM_ENTRY, payload, limits=limits, device=cfg.device,
                               spec=sandbox_spec(cfg.device, shared_compile_cache=True), env=compile_cache_env())
        if outcome.value is not None:
            return float(outcome.value["seconds"])
        return outcome.error or ("timed out" if outcome.timed_out else f"exit {outcome.exit_code}")

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="cudal1-warm-compile") as pool:
        done = dict(zip([(t.id, k) for t, k in pairs], pool.map(one, pairs), strict=True))
    skipped = sum(v == SKIPPED for v in done.values())
    failed = sum(isinstance(v, str) for v in done.values()) - skipped
    logger.info("torch.compile caches warmed for %d of %d baseline(s) in %.1f s, %d at a time (%d failed, "
                "%d skipped: stopped)", len(done) - failed - skipped, len(done), time.monotonic() - started,
                threads, failed, skipped)
    return done
