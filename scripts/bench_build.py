"""Benchmark cache-miss builds of KernelBench `load_inline` candidates: plain torch vs the cudal1 compile service.

For the `load_inline` candidates of a CUDA-L1 style JSONL release (field `custom_code`, reference in
`ref_code`), each candidate is built twice from an empty cache, in the same run and the same process pool:
  (a) plain: the candidate as written (no hooks, no levers), in its own fresh TORCH_EXTENSIONS_DIR;
  (b) cudal1: `prepare_candidate` with the adopted build levers (`BuildLevers()` defaults).
Both import the candidate and instantiate `ModelNew(*get_init_inputs())` on the GPU (most candidates build
lazily in __init__), each in an isolated child; when that child succeeded and the candidate has more
`load_inline`/`load` call sites than recorded builds (the compile service's test), a second child
(`warm_lazy_builds`, same environment and levers) runs one forward on the reference's inputs, so that builds
made lazily in `forward` are measured too. A job's builds and build seconds include those lazy builds, and
its wall time covers both children; a failed lazy build leaves the job ok (the evaluation would judge it)
but out of the build-time statistics. Jobs are interleaved (a, b, a, b, ...) so that both see the same
machine load.

Run on the GPU machine (a 9-minute call each; on 16 cores both modes of 72 candidates took ~3,850 worker
seconds plain and ~920 with the levers):
    python scripts/bench_build.py OUT_DIR --limit 72 --threads 16 --time-budget-s 420 --timeout-s 160
    python scripts/bench_build.py OUT_DIR --limit 72 --threads 16 --modes cudal1   # wall time of the pool alone
Writes OUT_DIR/bench_build.json after every finished job (partial results survive a kill) and prints a
short table last: per mode, jobs, successful builds, failures, median and p90 per-candidate build seconds
(jobs whose every build succeeded), worker-busy seconds (throughput), then two median per-candidate ratios
plain/cudal1 — of build time where both modes built, and of time to a verdict (built or failed) over
every candidate, with how many failed fast as certain failures (`BuildLevers.fail_fast_unbound` and
`fail_fast_duplicate_module`) — and the pool's wall time for all jobs of both modes. No new build is launched after
--time-budget-s; running ones are awaited (keep --timeout-s below what remains of the call).
Both modes run in the same environment (MAX_JOBS=2, TORCH_CUDA_ARCH_LIST of the GPU); in (a) the hooks
only time the calls (every lever off, verbose untouched).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from cudal1.eval.compile import BuildLevers, build_call_sites, build_environment, lazy_records, local_arch
from cudal1.eval.isolated import Limits, run_isolated
from cudal1.eval.supply import usable_cpu_count

DEFAULT_JSONL = "/work/shared/data/cuda-l1/h100.jsonl"
ENTRY_PREPARE = "cudal1.eval.inside.build_child:prepare_candidate"
ENTRY_WARM = "cudal1.eval.inside.build_child:warm_lazy_builds"
ENTRY_INIT = "cudal1.eval.inside.build_child:reference_init_inputs"
# (a) uses the same child but with every lever off and no decision file: torch exactly as the candidate
# calls it (the hooks only time the calls); verbose stays as the candidate wrote it.
PLAIN_LEVERS = BuildLevers.none().to_dict()  # every lever off, new ones included
FAIL_FAST_VARIANTS = ("unbound", "duplicate_module")  # build records of a certain failure raised at once


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--jsonl", default=DEFAULT_JSONL)
    p.add_argument("--limit", type=int, default=None, help="first N load_inline candidates")
    # --workers: the flag's name before "workers" came to mean an evaluator pool only; still accepted.
    p.add_argument("--threads", "--workers", dest="threads", type=int, default=usable_cpu_count(),
                   help="builds in parallel")
    p.add_argument("--time-budget-s", type=float, default=480.0, help="launch no new build after this")
    p.add_argument("--timeout-s", type=float, default=600.0, help="limit of one build child")
    p.add_argument("--arch", default=None, help="TORCH_CUDA_ARCH_LIST (default: the local GPU)")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--modes", default="plain,cudal1",
                   help="plain,cudal1 (both, interleaved: the per-candidate ratios) or cudal1 alone (the pool's "
                        "wall time to build every candidate with the levers)")
    args = p.parse_args(argv)
    args.modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not args.modes or set(args.modes) - {"plain", "cudal1"} or len(set(args.modes)) < len(args.modes):
        p.error("--modes: plain,cudal1 or cudal1 or plain")
    return args


def load_candidates(path: str, limit: int | None) -> list[dict[str, Any]]:
    rows = []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if "load_inline" in (row.get("custom_code") or ""):
                rows.append(row)
    return rows[:limit] if limit else rows


def init_inputs_for(row: dict[str, Any], env: dict[str, str]) -> list[Any] | None:
    out = run_isolated(ENTRY_INIT, {"ref_source": row["ref_code"]}, limits=Limits(timeout_s=120), env=env)
    return (out.value or {}).get("init_inputs")


def run_job(job: dict[str, Any], scratch: Path, arch: str, device: str, timeout_s: float) -> dict[str, Any]:
    """One cache-miss build, (a) or (b), in a fresh extension directory of its own."""
    key = f"bench-{job['mode']}-{job['index']}-{os.getpid()}-{time.time_ns()}"
    env = build_environment(key, arch, cache_dir=scratch)
    env["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", device.split(":")[-1]).split(",")[0]
    levers = PLAIN_LEVERS if job["mode"] == "plain" else BuildLevers().to_dict()
    payload = {"source": job["source"], "device": "cuda:0" if device.startswith("cuda") else "cpu",
               "levers": levers}
    start = time.monotonic()
    out = run_isolated(ENTRY_PREPARE, {**payload, "init_inputs": job["init_inputs"]},
                       limits=Limits(timeout_s=timeout_s), env=env)
    value = out.value or {}
    builds = value.get("builds", [])
    if value.get("ok") and build_call_sites(job["source"]) > len(builds):
        warm = run_isolated(ENTRY_WARM, {**payload, "ref_source": job["ref_source"]},
                            limits=Limits(timeout_s=timeout_s), env=env)
        lazy = lazy_records((warm.value or {}).get("builds", []), job["init_inputs"] is not None)
        builds = builds + [{**b, "lazy": True} for b in lazy]
    return {"mode": job["mode"], "index": job["index"], "task": job["task"], "wall_s": time.monotonic() - start,
            "build_s": sum(b.get("seconds", 0.0) for b in builds), "n_builds": len(builds),
            "ok": bool(value.get("ok")), "builds": builds, "log": value.get("log") or out.describe_failure()
            if not value.get("ok") else ""}


def built(r: dict[str, Any]) -> bool:
    """The job built something and every build succeeded (a failed lazy build leaves its child ok)."""
    return bool(r["ok"] and r["n_builds"] and all(b.get("ok") for b in r["builds"]))


def summarize(results: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    def stats(mode: str) -> dict[str, Any]:
        rows = [r for r in results if r["mode"] == mode]
        built_s = sorted(r["build_s"] for r in rows if built(r))
        p90 = built_s[min(len(built_s) - 1, int(round(0.9 * (len(built_s) - 1))))] if built_s else None
        return {"jobs": len(rows), "with_builds": len(built_s), "failures": sum(not r["ok"] for r in rows),
                "median_build_s": statistics.median(built_s) if built_s else None, "p90_build_s": p90,
                "worker_busy_s": sum(r["wall_s"] for r in rows)}

    plain, ours = stats("plain"), stats("cudal1")
    pairs = {}
    for r in results:  # ratios only where both modes built successfully
        if built(r):
            pairs.setdefault(r["index"], {})[r["mode"]] = r["build_s"]
    ratios = [p["plain"] / p["cudal1"] for p in pairs.values()
              if p.get("plain") and p.get("cudal1")]
    # Time to a verdict (built, or failed) of every candidate both modes finished: what an evaluation waits.
    verdicts: dict[int, dict[str, float]] = {}
    for r in results:
        verdicts.setdefault(r["index"], {})[r["mode"]] = r["wall_s"]
    ratios_all = [v["plain"] / v["cudal1"] for v in verdicts.values() if v.get("plain") and v.get("cudal1")]
    fail_fast = sum(any(b.get("variant") in FAIL_FAST_VARIANTS for b in r["builds"])
                    for r in results if r["mode"] == "cudal1")
    return {"plain": plain, "cudal1": ours, "median_ratio_plain_over_cudal1":
            statistics.median(ratios) if ratios else None, "pairs_built": len(ratios),
            "median_ratio_to_verdict_all": statistics.median(ratios_all) if ratios_all else None,
            "pairs_all": len(ratios_all), "cudal1_fail_fast": fail_fast, "pool_wall_s": wall_s}


def print_table(summary: dict[str, Any]) -> None:
    def fmt(x: Any) -> str:
        return "-" if x is None else f"{x:.1f}"

    print(f"{'mode':8} {'jobs':>5} {'built':>6} {'fail':>5} {'median_s':>9} {'p90_s':>7} {'busy_s':>8}")
    for mode in ("plain", "cudal1"):
        s = summary[mode]
        print(f"{mode:8} {s['jobs']:>5} {s['with_builds']:>6} {s['failures']:>5} "
              f"{fmt(s['median_build_s']):>9} {fmt(s['p90_build_s']):>7} {fmt(s['worker_busy_s']):>8}")
    ratio = summary["median_ratio_plain_over_cudal1"]
    print(f"median per-candidate build ratio plain/cudal1, both built: {fmt(ratio)}x ({summary['pairs_built']} "
          f"candidates)")
    print(f"median time-to-verdict ratio plain/cudal1, all candidates: {fmt(summary['median_ratio_to_verdict_all'])}x "
          f"({summary['pairs_all']} candidates; {summary['cudal1_fail_fast']} failed fast as certain failures)")
    modes = " and ".join(m for m in ("plain", "cudal1") if summary[m]["jobs"])
    print(f"pool wall time (all jobs, {modes}): {summary['pool_wall_s']:.1f} s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out_path = args.out_dir / "bench_build.json"
    arch = local_arch(args.arch)
    rows = load_candidates(args.jsonl, args.limit)
    scratch = Path(tempfile.mkdtemp(prefix="cudal1-bench-"))
    init_env = build_environment("bench-init", arch, cache_dir=scratch)
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        inits = list(pool.map(lambda r: init_inputs_for(r, init_env), rows))
        jobs = [{"mode": mode, "index": i, "task": f"{r.get('level_id')}/{r.get('task_id')}",
                 "source": r["custom_code"], "ref_source": r["ref_code"], "init_inputs": inits[i]}
                for i, r in enumerate(rows) for mode in args.modes]
        results: list[dict[str, Any]] = []
        pending: set = set()
        pool_start = time.monotonic()
        queue = list(jobs)
        while queue or pending:
            while queue and len(pending) < args.threads and time.monotonic() - start < args.time_budget_s:
                pending.add(pool.submit(run_job, queue.pop(0), scratch, arch, args.device, args.timeout_s))
            if not pending:
                break
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                results.append(fut.result())
            summary = summarize(results, time.monotonic() - pool_start)
            out_path.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "arch": arch,
                                            "summary": summary, "not_started": len(queue),
                                            "results": results}, indent=1))
    print(f"{len(results)} of {len(jobs)} builds finished; {len(queue)} not started; full JSON: {out_path}",
          file=sys.stderr)
    print_table(summarize(results, time.monotonic() - pool_start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
