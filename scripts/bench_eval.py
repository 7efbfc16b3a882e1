#!/usr/bin/env python3
"""Evaluator benchmarks on the GPU machine: throughput on a release sample, then precision.

Usage: python scripts/bench_eval.py OUT_DIR [--release PATH] [--per-level 10] [--seed 0]
                                    [--precision-n 20] [--time-budget-s 500] [--profile strict]
                                    [--store STORE.sqlite] [--modes serial,overlap]
                                    [--old-src PATH] [--null-n 10] [--runner-pairs 1] [--set KEY=VALUE]

1. Throughput: a fixed sample of a JSONL release (N tasks per level, seeded), compile included, on a cold
   build cache, per `--modes`: serial (all `load_inline` builds in parallel, then every candidate evaluated
   by the full protocol, `--profile`) and/or overlap (each candidate evaluated as soon as its build is done,
   beside the others' builds); with overlap, its speedups are compared with quiet ones (the serial run's,
   else a re-time after the builds). Prints candidates and correct-and-timed candidates per GPU-hour, and
   the ratio to KernelBench's harness estimated from its reference figures (`kernelbench_estimate_s`).
2. Precision: up to `--precision-n` candidates that were correct in (1) (topped up with the built-in
   examples) evaluated three times in the same run (each in `--runner-pairs` fresh runner pairs); prints the
   median relative difference of speedups and how often one evaluation's interval holds the others.
3. With `--old-src PATH` (the `src/` of an earlier cudal1, e.g. a git worktree of the last commit before the
   trust boundary), the same sample first goes through that evaluator in a subprocess, on its own cold
   cache: the cost of the boundary, old protocol against new in one run.
4. With `--null-n N`, the references of N sample tasks timed as candidates against themselves (the null
   test; unbiased: 1.00x).
Writes bench_eval.json (every result) under OUT_DIR; prints a short table last.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from cudal1.cli.options import parse_sets  # noqa: E402
from cudal1.core.errors import ConfigError  # noqa: E402
from cudal1.eval import EvalConfig, Status, evaluate_many  # noqa: E402
from cudal1.tasks import load_release  # noqa: E402
from cudal1.tasks.sources import example_candidates  # noqa: E402


def sample_release(path: Path, per_level: int, seed: int):
    rng = random.Random(seed)
    by_level: dict[int, list] = {}
    for task, cand in load_release(path):
        if cand is not None:
            by_level.setdefault(task.level, []).append((task, cand.source))
    picked = [rng.sample(by_level[level], min(per_level, len(by_level[level]))) for level in sorted(by_level)]
    # Levels interleaved, so a run cut short by its budget still covers every level.
    return [pair for row in itertools.zip_longest(*picked) for pair in row if pair is not None]


def throughput(pairs, cfg: EvalConfig, deadline: float, store=None, overlap_builds: bool = False) -> dict:
    """Candidates per GPU-hour, compile included (builds first, or beside the evaluations)."""
    t0 = time.monotonic()
    builds_done: list[float] = []
    ended: dict[int, float] = {}  # index -> seconds since t0 when its result came back (the timeline)

    def on_build(done: int, total: int) -> None:
        if done == total:
            builds_done.append(time.monotonic() - t0)

    # force: every candidate is really evaluated (and stored, when a store is given), never read back.
    evaluated = evaluate_many(pairs, cfg, store=store, force=True, label="bench_eval", on_build=on_build,
                              on_result=lambda i, _: ended.__setitem__(i, time.monotonic() - t0),
                              should_stop=lambda: time.monotonic() > deadline, overlap_builds=overlap_builds)
    wall_s = time.monotonic() - t0
    done = [((t, s), r) for (t, s), r in zip(pairs, evaluated, strict=True) if r is not None]
    results = [r for _, r in done]
    n_ok = sum(r.status is Status.CORRECT for r in results)
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    per_eval = [r.duration_s for r in results if r.duration_s]
    return {"n": len(results), "n_load_inline": sum("load_inline" in s for (_, s), _ in done),
            "build_wall_s": builds_done[0] if builds_done else None, "wall_s": wall_s, "statuses": statuses,
            "candidates_per_gpu_hour": 3600 * len(results) / wall_s,
            "correct_timed_per_gpu_hour": 3600 * n_ok / wall_s,
            "median_eval_s": statistics.median(per_eval) if per_eval else None,
            "mean_eval_s": statistics.fmean(per_eval) if per_eval else None,
            "phases": phase_medians(results), "idle_s": idle_between(evaluated, ended),
            "bracket_ms": bracket_costs(results),
            "results": [dict(task=t.id, ended_s=ended.get(i), **r.to_dict())
                        for i, ((t, _), r) in enumerate(zip(pairs, evaluated, strict=True)) if r is not None]}


def phase_medians(results: list) -> dict[str, float]:
    """Median seconds of each evaluation phase over the results that ran it (where the time goes)."""
    phases: dict[str, list[float]] = {}
    for r in results:
        for name, seconds in r.protocol.get("phase_s", {}).items():
            if isinstance(seconds, float):
                phases.setdefault(name, []).append(seconds)
    return {name: round(statistics.median(v), 3) for name, v in phases.items()}


def bracket_costs(results: list) -> dict[str, float | None]:
    """Median over the evaluations of what one bracket cost the parent's wall clock (`clock.ms_per_bracket`:
    round trips, freezing and the device's part together) and, under the GPU clock, of its constant `c` (the
    device's part of a bracket around nothing): the host's share of a bracket is the difference."""
    def median_of(key: str) -> float | None:
        values = [r.protocol["clock"][key] for r in results if isinstance((r.protocol.get("clock") or {}).get(key), float)]
        return round(statistics.median(values), 3) if values else None
    c_us = median_of("c_us")
    return {"per_bracket": median_of("ms_per_bracket"), "gpu_c": None if c_us is None else round(c_us / 1e3, 3)}


def idle_between(evaluated: list, ended: dict[int, float]) -> float:
    """Seconds between the first evaluation's start and the last's end that no evaluation covered (waiting
    for builds or for the scheduler)."""
    spans = sorted((end - (evaluated[i].duration_s or 0.0), end) for i, end in ended.items())
    idle, last = 0.0, spans[0][0] if spans else 0.0
    for start, end in spans:
        idle += max(0.0, start - last)
        last = max(last, end)
    return idle


def _rel_diff(a: float, b: float) -> float:
    return abs(a - b) / ((a + b) / 2)


def _spread(diffs: list[float], rows: list[dict]) -> dict:
    """Count, median and max of relative differences, with the rows they come from."""
    return {"n": len(diffs), "median_rel_diff": statistics.median(diffs) if diffs else None,
            "max_rel_diff": max(diffs) if diffs else None, "rows": rows}


def compare_speedups(timed: list[dict], quiet: dict[str, float]) -> dict:
    """How far the speedups of `timed` (result rows) are from `quiet` (task id -> speedup on a quiet host)."""
    rows = [{"task": r["task"], "overlapped": r["speedup"], "quiet": quiet[r["task"]],
             "rel_diff": _rel_diff(r["speedup"], quiet[r["task"]])}
            for r in timed if r["status"] == "correct" and r.get("speedup") and quiet.get(r["task"])]
    return {**_spread([r["rel_diff"] for r in rows], rows),
            "mean_signed": statistics.fmean((r["overlapped"] - r["quiet"]) / r["quiet"] for r in rows) if rows else None}


def quiet_speedups(pairs, timed: list[dict], cfg: EvalConfig, deadline: float) -> dict[str, float]:
    """The correct candidates of `timed` evaluated again, builds first (cached by now): task id -> speedup."""
    correct = {r["task"] for r in timed if r["status"] == "correct" and r.get("speedup")}
    chosen = [(t, s) for t, s in pairs if t.id in correct]
    again = evaluate_many(chosen, cfg, should_stop=lambda: time.monotonic() > deadline)
    return {t.id: r.speedup for (t, _), r in zip(chosen, again, strict=True) if r is not None and r.speedup}


@contextlib.contextmanager
def cold_build_cache():
    """An empty build cache and no remembered compile errors, so each mode pays its own cache-miss builds."""
    from cudal1.eval.compile import forget_compile_errors

    before = os.environ.get("CUDAL1_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="cudal1-bench-cache-") as cache:
        os.environ["CUDAL1_CACHE_DIR"] = cache
        forget_compile_errors()
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("CUDAL1_CACHE_DIR", None)
            else:
                os.environ["CUDAL1_CACHE_DIR"] = before


def precision(pairs, cfg: EvalConfig, deadline: float, repeats: int = 3) -> dict:
    """Each candidate evaluated `repeats` times, in one batch (builds in parallel, warm workers): the relative
    differences between every two of its speedups, their median and max over all candidates; per candidate
    also its intervals and the calibration's null, to see whether the intervals hold the scatter."""
    if time.monotonic() > deadline:  # the batch would build everything before it first asks
        return _spread([], [])
    repeated = [pair for pair in pairs for _ in range(repeats)]
    results = evaluate_many(repeated, cfg, should_stop=lambda: time.monotonic() > deadline)
    diffs, rows = [], []
    for k, (task, _) in enumerate(pairs):
        runs = [r for r in results[repeats * k: repeats * (k + 1)] if r is not None and r.speedup]
        if len(runs) < 2:
            continue
        mine = [_rel_diff(a.speedup, b.speedup) for a, b in itertools.combinations(runs, 2)]
        diffs += mine
        speedups = [r.speedup for r in runs]
        cis = [r.timing.speedup_ci for r in runs]
        rows.append({"task": task.id, "speedups": speedups, "rel_diffs": mine,
                     "cis": cis, "nulls": [(r.protocol.get("calibration") or {}).get("null") for r in runs],
                     "ci_holds_others": sum(1 for r, ci in zip(runs, cis, strict=True) if ci
                                            for o in speedups if o is not r.speedup and ci[0] <= o <= ci[1]),
                     "stabilities": [r.stability for r in runs]})
    return _spread(diffs, rows)


OLD_RUN = """
import itertools, json, random, sys, time
from cudal1.eval import EvalConfig, evaluate_many
from cudal1.tasks import load_release
release, per_level, seed, out, profile = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
rng = random.Random(seed)
by_level = {}
for task, cand in load_release(release):
    if cand is not None:
        by_level.setdefault(task.level, []).append((task, cand.source))
picked = [rng.sample(by_level[lv], min(per_level, len(by_level[lv]))) for lv in sorted(by_level)]
pairs = [p for row in itertools.zip_longest(*picked) for p in row if p is not None]
t0 = time.monotonic()
results = evaluate_many(pairs, EvalConfig(device="cuda", profile=profile), force=True)
wall = time.monotonic() - t0
rows = [dict(task=t.id, **r.to_dict()) for (t, _), r in zip(pairs, results) if r is not None]
json.dump({"wall_s": wall, "results": rows}, open(out, "w"), default=str)
"""


def old_throughput(old_src: Path, args: argparse.Namespace, pairs: list) -> dict:
    """The same sample through an earlier cudal1 (its own interpreter, PYTHONPATH and cold cache)."""
    import subprocess

    out = args.out_dir / "old_results.json"
    with tempfile.TemporaryDirectory(prefix="cudal1-bench-old-cache-") as cache:
        env = {**os.environ, "PYTHONPATH": str(old_src), "CUDAL1_CACHE_DIR": cache}
        subprocess.run([sys.executable, "-c", OLD_RUN, str(args.release), str(args.per_level), str(args.seed),
                        str(out), args.profile], env=env, check=True, timeout=args.time_budget_s)
    data = json.loads(out.read_text())
    results = data["results"]
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    n_ok = statuses.get("correct", 0)
    per_eval = [r["duration_s"] for r in results if r.get("duration_s")]
    return {"n": len(results), "n_load_inline": sum("load_inline" in s for _, s in pairs), "build_wall_s": None,
            "wall_s": data["wall_s"], "statuses": statuses, "mean_eval_s": None,
            "candidates_per_gpu_hour": 3600 * len(results) / data["wall_s"],
            "correct_timed_per_gpu_hour": 3600 * n_ok / data["wall_s"],
            "median_eval_s": statistics.median(per_eval) if per_eval else None, "results": results}


def null_test(pairs, n: int, cfg: EvalConfig, deadline: float) -> dict:
    """The references of the first `n` tasks timed against themselves."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from null_test import as_candidate

    tasks = list(dict.fromkeys(t for t, _ in pairs))[:n]
    results = evaluate_many([(t, as_candidate(t.source)) for t in tasks], cfg,
                            should_stop=lambda: time.monotonic() > deadline)
    speedups = sorted(r.speedup for r in results if r is not None and r.speedup)
    return {"n": len(speedups), "median": statistics.median(speedups) if speedups else None,
            "min": speedups[0] if speedups else None, "max": speedups[-1] if speedups else None,
            "within_3pct": sum(abs(x - 1) <= 0.03 for x in speedups),
            "not_correct": [(t.id, r.status.value, r.message[:120]) for t, r in zip(tasks, results, strict=True)
                            if r is not None and r.status is not Status.CORRECT]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--release", type=Path, default=ROOT.parent / "shared/data/cuda-l1/h100.jsonl")
    ap.add_argument("--per-level", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision-n", type=int, default=20)
    ap.add_argument("--record-samples", action="store_true",
                    help="Keep every timed call's figures in the results (precision rows too).")
    ap.add_argument("--time-budget-s", type=float, default=500.0)
    ap.add_argument("--throughput-share", type=float, default=0.6)
    ap.add_argument("--profile", default="strict", help="Evaluator profile (strict, cuda-l1, kernelbench-v0).")
    ap.add_argument("--clock", choices=("gpu", "host"), default="gpu",
                    help="On a GPU, the GPU's own timeline (the default) or the parent's host clock (EvalConfig.gpu_clock).")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="Any other evaluation setting (repeatable), as `cudal1 eval --set`.")
    ap.add_argument("--store", type=Path, default=None, help="Also store the throughput sample's results here.")
    ap.add_argument("--old-src", type=Path, default=None,
                    help="src/ of an earlier cudal1: the same sample through it first (old protocol against new).")
    ap.add_argument("--null-n", type=int, default=0, help="Tasks of the sample for the null test (0: none).")
    ap.add_argument("--runner-pairs", type=int, default=EvalConfig.runner_pairs,
                    help="Fresh runner pairs per evaluation in the precision phase (EvalConfig.runner_pairs).")
    ap.add_argument("--modes", default="serial",
                    help="Throughput modes, each on a cold build cache: serial (builds first, evaluate_many's "
                         "default), overlap (evaluations beside the builds), or serial,overlap side by side "
                         "(then the overlapped speedups are compared with the serial ones).")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    # Each build's duration and outcome on stderr ("build KEY: ok=... in S s"): what the build phase waited for.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("cudal1.eval.compile").setLevel(logging.INFO)
    try:
        cfg = EvalConfig(device="cuda", profile=args.profile, record_samples=args.record_samples,
                         gpu_clock=args.clock == "gpu", **parse_sets(EvalConfig, args.sets))
    except ConfigError as exc:
        raise SystemExit(str(exc)) from None
    out: dict = {"config": cfg.to_dict()}
    pairs = sample_release(args.release, args.per_level, args.seed)
    store = None
    if args.store:
        from cudal1.store import ResultsStore

        store = ResultsStore(args.store)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"serial", "overlap"} or len(set(modes)) < len(modes):
        raise SystemExit("--modes: serial, overlap or serial,overlap")
    out["throughput"] = {}
    if args.old_src is not None:
        out["old"] = old = old_throughput(args.old_src, args, pairs)
        (args.out_dir / "bench_eval.json").write_text(json.dumps(out, indent=1, default=str))
        print_throughput("old evaluator", old)
        start = time.monotonic()  # the new evaluator's budget starts now
    share_s = args.time_budget_s * args.throughput_share / len(modes)
    caches = contextlib.ExitStack()  # the last mode's builds serve the precision phase too
    for k, mode in enumerate(modes):
        caches.enter_context(cold_build_cache())
        tp = throughput(pairs, cfg, start + share_s * (k + 1), store if k == 0 else None,  # fixed shares
                        overlap_builds=mode == "overlap")
        out["throughput"][mode] = tp
        (args.out_dir / "bench_eval.json").write_text(json.dumps(out, indent=1, default=str))
        print_throughput(mode, tp)
    if "overlap" in modes:
        overlapped = out["throughput"]["overlap"]["results"]
        quiet = ({r["task"]: r["speedup"] for r in out["throughput"]["serial"]["results"] if r.get("speedup")}
                 if "serial" in modes else quiet_speedups(pairs, overlapped, cfg, start + args.time_budget_s))
        out["overlap_vs_quiet"] = ovq = compare_speedups(overlapped, quiet)
        (args.out_dir / "bench_eval.json").write_text(json.dumps(out, indent=1, default=str))
        print(f"overlapped vs quiet     n={ovq['n']}: median rel diff {ovq['median_rel_diff']}, max "
              f"{ovq['max_rel_diff']}, mean signed {ovq['mean_signed']}", flush=True)
    first = out["throughput"][modes[0]]
    correct = {r["task"] for r in first["results"] if r["status"] == "correct"}
    chosen = [(t, s) for t, s in pairs if t.id in correct]
    chosen += [(t, s) for t, _, s in example_candidates("cuda")]
    with caches:
        out["precision"] = precision(chosen[:args.precision_n], dataclasses.replace(cfg, runner_pairs=args.runner_pairs),
                                     start + args.time_budget_s)
    (args.out_dir / "bench_eval.json").write_text(json.dumps(out, indent=1, default=str))
    pr = out["precision"]
    held = sum(r["ci_holds_others"] for r in pr["rows"])
    asked = sum(len(r["speedups"]) * (len(r["speedups"]) - 1) for r in pr["rows"])
    print(f"precision (n={pr['n']})       median rel diff {pr['median_rel_diff']}, max {pr['max_rel_diff']}; "
          f"an interval held another evaluation's speedup {held} of {asked} times", flush=True)
    if args.null_n:
        out["null"] = null = null_test(pairs, args.null_n, cfg, time.monotonic() + 0.2 * args.time_budget_s)
        (args.out_dir / "bench_eval.json").write_text(json.dumps(out, indent=1, default=str))
        print(f"null test (n={null['n']})       median {null['median']}, min {null['min']}, max {null['max']}; "
              f"not correct: {null['not_correct']}", flush=True)
    if "old" in out:
        new = out["throughput"][modes[0]]
        print(f"boundary cost           new/old candidates per GPU-hour {new['candidates_per_gpu_hour'] / out['old']['candidates_per_gpu_hour']:.2f}; "
              f"statuses old {out['old']['statuses']} new {new['statuses']}", flush=True)


# KernelBench's harness on the H200 host (reference figures, measured with its own code): a cache-miss
# load_inline build takes 65-80 s with 12 builds in parallel, and an evaluation of a compiled candidate
# (5 correctness trials, 100 timed trials) a mean 21 s. Candidates that fail to compile are not evaluated.
KB_BUILD_S, KB_PARALLEL_BUILDS, KB_EVAL_MEAN_S = 72.5, 12, 21.0


def kernelbench_estimate_s(tp: dict) -> float:
    """Wall time KernelBench's harness would need for the same sample, from its reference figures: waves of
    parallel builds for the `load_inline` candidates, then the candidates that compiled, one at a time."""
    waves = -(-tp["n_load_inline"] // KB_PARALLEL_BUILDS)
    compiled = tp["n"] - tp["statuses"].get("compile_error", 0)
    return waves * KB_BUILD_S + compiled * KB_EVAL_MEAN_S


def print_throughput(mode: str, tp: dict) -> None:
    """The throughput figures of one mode, printed as soon as they exist (a later kill keeps them)."""
    print(f"\n== bench_eval, {mode} ==")
    print(f"throughput sample       {tp['n']} candidates ({tp['n_load_inline']} load_inline), statuses {tp['statuses']}")
    builds = f"{tp['build_wall_s']:.1f} s" if tp["build_wall_s"] is not None else "none"
    print(f"builds done after       {builds}; total wall {tp['wall_s']:.1f} s")
    print(f"candidates / GPU-hour   {tp['candidates_per_gpu_hour']:.0f}; correct-and-timed {tp['correct_timed_per_gpu_hour']:.0f}")
    print(f"per-candidate eval      median {tp['median_eval_s']} s, mean {tp['mean_eval_s']} s")
    if "phases" in tp:
        print(f"phases (median s)       {tp['phases']}; idle between evaluations {tp['idle_s']:.1f} s")
    if tp.get("bracket_ms", {}).get("per_bracket") is not None:
        b = tp["bracket_ms"]
        gpu = f"; the GPU clock's constant c {b['gpu_c']} ms" if b["gpu_c"] is not None else ""
        print(f"one bracket (median)    {b['per_bracket']} ms of the parent's wall clock{gpu}")
    kb_s = kernelbench_estimate_s(tp)
    print(f"KernelBench estimate    {kb_s:.0f} s for the same sample (its reference figures, not run here): "
          f"ours {kb_s / tp['wall_s']:.1f}x its candidates per GPU-hour", flush=True)


if __name__ == "__main__":
    main()
