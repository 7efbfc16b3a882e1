"""The study's GPU micro-benchmark: every (task, recipe) cell compiled, checked and timed on one GPU.

Trusted because the kernels are ours (`kernels.py`), not a policy's: no sandbox is needed, only a careful
clock. Protocol, per task:

1. inputs from the reference's `get_inputs` (seeded), on the GPU; the reference's output in float32;
2. correctness, every cell once: the output is filled with NaN first (an element the kernel misses stays
   NaN), then compared with |y - ref| <= 1e-4 + 1e-4 |ref| (strict float32); a cell that cannot launch
   (staged rows over the shared-memory limit) or raises is a `runtime_error`, one that does not compile a
   `compile_error`;
3. timing, `reps` rounds: each round visits every correct cell and the reference (twice) in a fresh random
   order; each visit flushes the L2 (a write of twice its size) and times one call with a pair of CUDA
   events on the current stream (the kernel is one launch on it; the reference's several kernels are all
   on it too). A cell's time is the median of its `reps` times; its spread the (max - min) / median; its
   speedup the reference's median over its own.

Before the first task the GPU runs about half a second of copies, so its clocks are up. Results are
written after every task (`table.json`, atomically), so a run cut short keeps what it measured, and a
second run measures only what is missing.

Launching: cudal1's raw_cuda (`load_kernels`, which needs cuda-python), else torch's own NVRTC kernel
loader (`torch.cuda._utils._cuda_load_module`, CUBINs from cudal1's compiler). The compiles run first,
in a process pool over every CPU core.
"""

from __future__ import annotations

import json
import logging
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from experimental.contrastive_study.kernels import (
    KERNEL_NAME,
    kernel_args,
    kernel_source,
    launch_config,
    output_shape,
)
from experimental.contrastive_study.ops import StudyTask
from experimental.contrastive_study.recipes import SPACE, Recipe

logger = logging.getLogger(__name__)

RTOL = ATOL = 1e-4  # strict float32 (the evaluator's `strict` profile)


def _compile_one(source: str) -> str:
    """Compile into the disk cache (in a pool worker); '' or the compiler's error."""
    from cudal1.raw_cuda import compile_only
    from cudal1.raw_cuda.errors import RawCudaCompileError

    try:
        compile_only(source, arch=_ARCH)
        return ""
    except RawCudaCompileError as exc:
        return str(exc)[:300] or "compile error"


_ARCH = os.environ.get("CUDAL1_STUDY_ARCH", "sm_90")


def compile_all(sources: Sequence[str], processes: int | None = None) -> list[str]:
    """Compile every source (cached on disk by content), `processes` at a time (default: every core); the
    error of each ('' when fine)."""
    if not sources:
        return []
    with ProcessPoolExecutor(max_workers=processes or os.cpu_count() or 1) as pool:
        return list(pool.map(_compile_one, sources, chunksize=8))


class Launcher:
    """Loads a compiled source and launches its kernel on torch's current stream."""

    def __init__(self) -> None:
        try:
            import cuda.bindings.driver  # noqa: F401 - cudal1.raw_cuda's launcher needs it

            self.mode = "raw_cuda"
        except ImportError:
            self.mode = "torch"

    def load(self, source: str, name: str) -> Callable[..., None]:
        if self.mode == "raw_cuda":
            from cudal1.raw_cuda import load_kernels

            kernel = getattr(load_kernels(source, arch=_ARCH), name)
            return lambda grid, block, args, shared: kernel(grid=(grid,), block=(block,), args=args,
                                                             shared_mem_bytes=shared)
        from torch.cuda._utils import _cuda_load_module

        from cudal1.raw_cuda import compile_only

        kernel = _cuda_load_module(compile_only(source, arch=_ARCH).cubin_bytes, [name])[name]

        def launch(grid: int, block: int, args: Sequence[Any], shared: int) -> None:
            if shared >= 48 * 1024:
                kernel.set_shared_memory_config(shared)
            kernel(grid=(grid, 1, 1), block=(block, 1, 1), args=list(args), shared_mem=shared)

        return launch


def _stats(times_ms: list[float]) -> dict[str, Any]:
    median = statistics.median(times_ms)
    return {"times_ms": [round(t, 5) for t in times_ms], "median_ms": round(median, 5),
            "spread": round((max(times_ms) - min(times_ms)) / median, 4) if median > 0 else None}


def _reference(task: StudyTask, device: Any) -> tuple[Any, list[Any]]:
    import torch

    scope: dict[str, Any] = {}
    exec(compile(task.reference_source(), task.id, "exec"), scope)  # noqa: S102 - the study's own reference
    torch.manual_seed(0)
    with device:  # made on the GPU directly (a CPU randn of 2^28 floats takes seconds)
        inputs = list(scope["get_inputs"]())
    return scope["Model"]().to(device), inputs


def measure_task(task: StudyTask, recipes: Sequence[Recipe], compile_errors: dict[str, str], launcher: Launcher,
                 *, reps: int, flush: Any, sm_count: int, progress: Path | None = None,
                 skip: dict[str, str] | None = None) -> dict[str, Any]:
    """One task's row of the table (module docstring); `skip`: cells known to crash, with why."""
    import torch

    device = torch.device("cuda")
    model, inputs = _reference(task, device)
    x, z = inputs[0], inputs[1] if len(inputs) > 1 else None
    with torch.no_grad():
        expected = model(*inputs)
    y = torch.empty(output_shape(task), device=device)
    cells: dict[str, dict[str, Any]] = {}
    runnable: dict[str, Callable[[], None]] = {}
    for recipe in recipes:
        source = kernel_source(task, recipe)
        if compile_errors.get(source):
            cells[recipe.text] = {"status": "compile_error", "message": compile_errors[source][:200]}
            continue
        if skip and recipe.text in skip:
            cells[recipe.text] = {"status": "runtime_error", "message": skip[recipe.text]}
            continue
        launch = launch_config(task, recipe, sm_count)
        if launch.error:
            cells[recipe.text] = {"status": "runtime_error", "message": launch.error}
            continue
        if progress is not None:  # the parent names this cell if the CUDA context dies in it
            progress.write_text(json.dumps({"task": task.id, "recipe": recipe.text}))
        try:
            kernel = launcher.load(source, KERNEL_NAME[task.family.kind])
            args = kernel_args(task, x, z, y, recipe)

            def call(kernel=kernel, launch=launch, args=args) -> None:
                kernel(launch.grid, launch.block, args, launch.shared_bytes)

            y.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a launch the driver refuses is this cell's verdict
            cells[recipe.text] = {"status": "runtime_error", "message": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        error = ((y - expected).abs() - RTOL * expected.abs()).max().item()
        if not error <= ATOL:  # NaN (an element never written) fails too
            cells[recipe.text] = {"status": "incorrect", "message": f"max excess error {error:.3g}"}
            continue
        runnable[recipe.text] = call
    if progress is not None:
        progress.write_text("{}")

    def reference() -> None:
        with torch.no_grad():
            model(*inputs)

    times: dict[str, list[float]] = {name: [] for name in [*runnable, "__ref__"]}
    rng = random.Random(task.id)
    for _ in range(reps):
        order = [*runnable, "__ref__", "__ref__"]
        rng.shuffle(order)
        events = []
        # The host enqueues a visit (flush, event, launch) in well under the GPU's time for it (>= 100 us of
        # kernel plus the flush), so the queue stays ahead and no event waits on the host; a spin of about
        # 100 us puts it ahead for the round's first visit too.
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(200_000)
        for name in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            flush.zero_()
            start.record()
            (reference if name == "__ref__" else runnable[name])()
            end.record()
            events.append((name, start, end))
        torch.cuda.synchronize()
        for name, start, end in events:
            times[name].append(start.elapsed_time(end))
    ref = _stats(times.pop("__ref__"))
    for name, values in times.items():
        stats = _stats(values)
        cells[name] = {"status": "correct", **stats, "speedup": round(ref["median_ms"] / stats["median_ms"], 4)}
    return {"ref": ref, "cells": {r.text: cells[r.text] for r in recipes}}


def environment() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"gpu": props.name, "capability": f"{props.major}.{props.minor}", "sm_count": props.multi_processor_count,
            "l2_bytes": int(getattr(props, "L2_cache_size", 0) or 0), "torch": torch.__version__,
            "cuda": torch.version.cuda}


def warm_up(seconds: float = 0.5) -> None:
    """Copies on the GPU for about `seconds`, so its clocks are up before the first timing."""
    import torch

    a = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        for _ in range(20):
            b.copy_(a)
        torch.cuda.synchronize()


def run_worker(table_path: str, task_ids: Sequence[str], reps: int, deadline: float, progress: str,
               skip: dict[str, dict[str, str]]) -> None:
    """Measure the tasks missing from the table at `table_path` until `deadline` (time.time()); one process,
    so a kernel that kills the CUDA context costs the cells in flight only (`measure.py` restarts it)."""
    import torch

    from experimental.contrastive_study.ops import task_by_id
    from experimental.contrastive_study.table import load_table, write_table

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    by_id = task_by_id()
    data = load_table(Path(table_path))
    env = environment()
    flush = torch.empty(max(2 * env["l2_bytes"], 64 << 20), dtype=torch.uint8, device="cuda")
    launcher = Launcher()
    data["provenance"].update(environment=env, launcher=launcher.mode, flush_bytes=flush.numel())
    warm_up()
    errors = data.setdefault("compile_errors", {})
    for task_id in task_ids:
        if task_id in data["tasks"] and data["tasks"][task_id].get("cells"):
            continue
        if time.time() > deadline:
            logger.info("time budget spent before %s", task_id)
            break
        task = by_id[task_id]
        started = time.monotonic()
        sources = {kernel_source(task, r): errors.get(f"{task.family.name}|{r.text}", "") for r in SPACE}
        row = measure_task(task, SPACE, sources, launcher, reps=reps, flush=flush, sm_count=env["sm_count"],
                           progress=Path(progress), skip=skip.get(task_id))
        data["tasks"][task_id] = {**task_entry(task), **row, "measure_s": round(time.monotonic() - started, 1)}
        write_table(Path(table_path), data)
        correct = [c["speedup"] for c in row["cells"].values() if c["status"] == "correct"]
        logger.info("%s: ref %.3f ms, %d/%d correct, best %.2fx (%.1f s)", task_id, row["ref"]["median_ms"],
                    len(correct), len(SPACE), max(correct, default=0.0), time.monotonic() - started)


def task_entry(task: StudyTask) -> dict[str, Any]:
    """What the table says of a task besides its measurements."""
    f = task.family
    return {"family": f.name, "kind": f.kind, "rows": task.rows, "cols": task.cols, "held_out": task.held_out,
            "features": task.features, "min_bytes": task.min_bytes}

