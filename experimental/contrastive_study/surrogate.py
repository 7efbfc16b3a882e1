"""A SURROGATE task table: an analytic roofline model of the study's kernels on an H200. Not a measurement.

It exists so that the study's CPU pipeline (pre-training, stage 3, the arms, the statistics) can be built
and tested before the GPU table is measured; a table it writes says `"kind": "surrogate"` and the study
refuses to publish results from it. Its numbers are guesses with the right *shape*: time is bytes over an
effective bandwidth (vector width, coalescing, memory-level parallelism, occupancy, staging, bank
conflicts) or instructions over the issue rate, plus block-scheduling and reduction costs; the references
are PyTorch's unfused kernels. Failures follow the same limits as the real kernels (a static tile above
48 KB does not compile, staged rows above 227 KB cannot launch). Every timing gets 1.5 % log-normal noise,
and every (family, recipe) a fixed 6 % quirk, so landscapes are not perfectly smooth.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import Any

from experimental.contrastive_study.bench import task_entry
from experimental.contrastive_study.kernels import MAX_DYNAMIC_SHARED_BYTES, launch_config
from experimental.contrastive_study.ops import StudyTask, study_tasks
from experimental.contrastive_study.recipes import SPACE, Recipe
from experimental.contrastive_study.table import new_table

SMS = 132
DRAM_BPS = 4.0e12  # achievable copy bandwidth (KINDS.md measured about 4.3 TB/s)
L2_BPS = 9.0e12
L2_BYTES = 50e6
ISSUE_PER_S = SMS * 128 * 1.98e9  # FP32 lanes x clock
STATIC_SHARED_BYTES = 48 * 1024
#: instructions per element of each family's math (rough counts of the CUDA math functions)
INSTRUCTIONS = {"swish": 24, "gelu": 30, "mish": 48, "axpby_relu": 4, "row_sum": 2, "row_l2norm": 3,
                "logsumexp": 14, "softmax": 26, "rmsnorm": 6, "layernorm": 9, "transpose_add": 4,
                "transpose_gelu": 30}
#: the reference's tensor passes (reads + writes of a full tensor, PyTorch eager) and kernels
REFERENCE = {"swish": (5, 2), "gelu": (11, 5), "mish": (7, 3), "axpby_relu": (9, 4), "row_sum": (1.05, 1),
             "row_l2norm": (3.05, 3), "logsumexp": (6, 6), "softmax": (9, 5), "rmsnorm": (6, 5),
             "layernorm": (11, 7), "transpose_add": (3, 1), "transpose_gelu": (11, 5)}
VECTOR_EFFICIENCY = {1: 0.78, 2: 0.93, 4: 1.0}


def _quirk(family: str, recipe: Recipe, sigma: float = 0.06) -> float:
    seed = int(hashlib.sha256(f"{family}|{recipe.text}".encode()).hexdigest()[:12], 16)
    return math.exp(random.Random(seed).gauss(0.0, sigma))


def _mlp(threads_per_sm: float, bytes_per_thread: float) -> float:
    """Bandwidth share reached with this many bytes in flight per SM (about 40 KB saturate it)."""
    return min(1.0, (threads_per_sm * bytes_per_thread / 40e3) ** 0.6)


def _resident_blocks(threads: int, shared: float) -> int:
    by_threads = max(1, 2048 // threads)
    by_shared = int(228 * 1024 // shared) if shared else 32
    return min(by_threads, by_shared, 32)


def _block_time(blocks: int, resident: int) -> float:
    """Block scheduling: about 1 us of an SM slot per block, overlapped by the resident blocks."""
    return blocks * 1.0e-6 / (SMS * resident)


def _ew(task: StudyTask, r: Recipe, grid: int) -> float | str:
    f = task.family
    shared = r.threads * r.items * r.vec * 4 * r.stage
    if shared > STATIC_SHARED_BYTES:
        return "compile_error"
    resident = _resident_blocks(r.threads, shared)
    threads_per_sm = min(2048, resident * r.threads)
    eff = VECTOR_EFFICIENCY[r.vec] * _mlp(threads_per_sm, r.items * r.vec * 4 * f.inputs)
    if r.mapping and r.items > 1:
        eff /= 1 + 0.3 * math.log2(r.items) * (4 / r.vec) ** 0.5  # strided lanes, partly rescued by L1
    if r.stage:
        eff *= 0.86 * (0.8 if r.mapping and r.vec == 1 else 1.0)
    if r.grid_stride:
        eff *= min(1.0, grid / (SMS * resident))
    t_mem = (f.inputs + 1) * task.numel * 4 / (DRAM_BPS * eff)
    t_math = task.numel * INSTRUCTIONS[f.name] * (1.15 if r.vec == 1 else 1.0) / ISSUE_PER_S
    return max(t_mem, t_math) + 0.2 * min(t_mem, t_math) + _block_time(grid, resident)


def _row(task: StudyTask, r: Recipe, grid: int, shared: int) -> float | str:
    f = task.family
    if shared > MAX_DYNAMIC_SHARED_BYTES:
        return "runtime_error"
    wsize = r.threads if r.mapping else 32
    workers_per_block = 1 if r.mapping else r.threads // 32
    resident = _resident_blocks(r.threads, shared)
    resident_workers = SMS * resident * workers_per_block
    active = min(1.0, task.rows / resident_workers)
    busy = min(1.0, task.cols / (r.vec * wsize * r.items))  # threads of a worker with something to load
    eff = VECTOR_EFFICIENCY[r.vec] * _mlp(min(2048, resident * r.threads) * busy, r.items * r.vec * 4)
    eff *= active ** 0.8
    if r.grid_stride:
        eff *= min(1.0, grid * workers_per_block / max(1.0, min(task.rows, resident_workers)))
    row_bytes = task.cols * 4
    t = task.numel * 4 / (DRAM_BPS * eff)
    if not f.row_out:
        t += task.numel * 4 / (DRAM_BPS * VECTOR_EFFICIENCY[r.vec] * max(0.3, active))
    again = f.passes - 1 + (0 if f.row_out else 1) - 1  # later passes that re-read the row
    if again > 0:
        if r.stage:
            t += again * task.numel * 4 / (SMS * 128 * 4 * 1.98e9) * (2.0 if r.vec == 1 else 1.0)
        else:
            footprint = min(task.rows, resident_workers) * row_bytes
            bandwidth = L2_BPS if footprint < L2_BYTES else DRAM_BPS
            t += again * task.numel * 4 / (bandwidth * eff)
    reductions = f.passes if f.row_out else f.passes - 1
    per_reduction = (0.35e-6 + r.threads / 32 * 8e-9) if r.mapping else 0.06e-6
    t += task.rows * reductions * per_reduction / (SMS * resident * workers_per_block / (r.threads // 32 if r.mapping else 1))
    t += task.numel * INSTRUCTIONS[f.name] / ISSUE_PER_S
    return t + _block_time(grid, resident)


def _tr(task: StudyTask, r: Recipe, grid: int) -> float | str:
    f = task.family
    if r.stage:
        shared = r.items * 32 * (32 * r.vec + (0 if r.mapping else 1)) * 4
        if shared > STATIC_SHARED_BYTES:
            return "compile_error"
        resident = _resident_blocks(r.threads, shared)
        eff = VECTOR_EFFICIENCY[r.vec] * 0.93 * _mlp(min(2048, resident * r.threads), r.items * 4 * 8)
        if r.mapping:  # unpadded tile: bank conflicts on the transposed read
            eff *= {1: 0.42, 2: 0.6, 4: 0.78}[r.vec]
        read_eff = write_eff = eff
    else:
        resident = _resident_blocks(r.threads, 0)
        base = _mlp(min(2048, resident * r.threads), r.items * r.vec * 4)
        strided = 0.16 + 0.04 * math.log2(r.vec)  # a 32-byte sector per 4-byte access, partly merged in L2
        read_eff = base * (VECTOR_EFFICIENCY[r.vec] if r.mapping == 0 else strided * 1.3)
        write_eff = base * (strided if r.mapping == 0 else VECTOR_EFFICIENCY[r.vec])
    if r.grid_stride:
        fill = min(1.0, grid / (SMS * resident))
        read_eff, write_eff = read_eff * fill, write_eff * fill
    n4 = task.numel * 4
    t = n4 / (DRAM_BPS * read_eff) + n4 / (DRAM_BPS * write_eff)
    if f.inputs == 2:
        t += n4 / (DRAM_BPS * (write_eff if not r.stage else read_eff))
    t += task.numel * INSTRUCTIONS[f.name] / ISSUE_PER_S
    return t + _block_time(grid, resident)


def cell_time_s(task: StudyTask, recipe: Recipe) -> float | str:
    """The model's kernel time in seconds, or the failure status it predicts."""
    launch = launch_config(task, recipe, SMS)
    kind = task.family.kind
    if kind == "ew":
        t = _ew(task, recipe, launch.grid)
    elif kind == "row":
        t = _row(task, recipe, launch.grid, launch.shared_bytes)
    else:
        t = _tr(task, recipe, launch.grid)
    return t if isinstance(t, str) else (t + 3e-6) * _quirk(task.family.name, recipe)


def reference_time_s(task: StudyTask) -> float:
    passes, kernels = REFERENCE[task.family.name]
    eff = 0.3 if task.family.name == "transpose_add" else 0.92  # PyTorch reads the transposed view strided
    t = passes * task.numel * 4 / (DRAM_BPS * 0.92)
    if task.family.name == "transpose_add":
        t += task.numel * 4 / (DRAM_BPS * eff)
    return t + kernels * 6e-6


def surrogate_table(seed: int = 0, reps: int = 5) -> dict[str, Any]:
    """The whole study's table from the model, with `reps` noisy timings per cell (module docstring)."""
    rng = random.Random(seed)
    data = new_table("surrogate", {"method": "experimental.contrastive_study.surrogate: analytic roofline model, NOT measured",
                                   "reps": reps, "seed": seed})
    for task in study_tasks():
        ref = [reference_time_s(task) * 1e3 * math.exp(rng.gauss(0, 0.015)) for _ in range(2 * reps)]
        ref_median = sorted(ref)[len(ref) // 2]
        cells: dict[str, Any] = {}
        for recipe in SPACE:
            t = cell_time_s(task, recipe)
            if isinstance(t, str):
                cells[recipe.text] = {"status": t, "message": "surrogate: over the shared-memory limit"}
                continue
            times = sorted(t * 1e3 * math.exp(rng.gauss(0, 0.015)) for _ in range(reps))
            median = times[len(times) // 2]
            cells[recipe.text] = {"status": "correct", "times_ms": [round(v, 5) for v in times],
                                  "median_ms": round(median, 5), "spread": round((times[-1] - times[0]) / median, 4),
                                  "speedup": round(ref_median / median, 4)}
        data["tasks"][task.id] = {**task_entry(task), "cells": cells,
                                  "ref": {"times_ms": [round(v, 5) for v in ref], "median_ms": round(ref_median, 5)}}
    return data
