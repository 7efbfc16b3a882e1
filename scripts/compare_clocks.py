#!/usr/bin/env python3
"""The same release sample under both clocks, side by side: what the GPU clock changes in the speedups.

    PYTHONPATH=src python scripts/compare_clocks.py OUT_DIR [--release PATH] [--per-level 4] [--seed 0]
        [--profile strict] [--time-budget-s 400] [--order host,gpu] [--device cuda] [--set KEY=VALUE]

The host clock times a call with the host's view of it (launch gaps included, as KernelBench's and CUDA-L1's
events do); the GPU clock (`EvalConfig.gpu_clock`) times it on the GPU's own timeline with its launches queued
ahead. The sample (`bench_eval.sample_release`: N tasks per level, seeded, levels interleaved) is evaluated
once per clock, in the order given, each clock with half the time budget, builds shared (the first clock's
pass builds them). Prints, per task, each clock's verdict and speedup and their ratio, then the medians and
each clock's candidates per hour; writes OUT_DIR/compare_clocks.json after each clock.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_eval import sample_release  # noqa: E402

from cudal1.cli.options import parse_sets  # noqa: E402
from cudal1.core.errors import ConfigError  # noqa: E402
from cudal1.eval import EvalConfig, evaluate_many  # noqa: E402


def one_clock(pairs, clock: str, profile: str, budget_s: float, device: str = "cuda",
              sets: dict | None = None) -> dict:
    cfg = EvalConfig(device=device, profile=profile, gpu_clock=clock == "gpu", **(sets or {}))
    t0 = time.monotonic()
    results = evaluate_many(pairs, cfg, force=True, label=f"clock {clock}",
                            should_stop=lambda: time.monotonic() - t0 > budget_s)
    wall_s = time.monotonic() - t0
    rows = {}
    for (task, _), r in zip(pairs, results, strict=True):
        if r is None:
            continue
        clock_facts = r.protocol.get("clock") or {}
        rows[task.id] = {"status": r.status.value, "speedup": r.speedup, "clock": clock_facts.get("clock"),
                         "c_us": clock_facts.get("c_us"), "cand_c_paid_us": clock_facts.get("cand_c_paid_us"),
                         "twin_null": (r.protocol.get("calibration") or {}).get("null"),
                         "ref_ms": r.ref_ms, "candidate_ms": r.candidate_ms, "interval": r.timing.speedup_ci if r.timing else None,
                         "ms_per_bracket": clock_facts.get("ms_per_bracket"),
                         "duration_s": r.duration_s, "message": r.message[:160]}
    return {"wall_s": round(wall_s, 1), "evaluated": len(rows),
            "candidates_per_hour": round(3600 * len(rows) / wall_s, 1) if wall_s else None, "rows": rows}


def table(out: dict, order: list[str]) -> None:
    a, b = order
    ra, rb = out[a]["rows"], out[b]["rows"]
    print(f"{'task':<22} {a + ' verdict':<16} {a:>8} {b + ' verdict':<16} {b:>8} {'gpu/host':>9}")
    ratios = []
    for task in sorted(set(ra) | set(rb)):
        x, y = ra.get(task, {}), rb.get(task, {})
        sx, sy = x.get("speedup"), y.get("speedup")
        by = {a: sx, b: sy}
        ratio = by["gpu"] / by["host"] if by.get("gpu") and by.get("host") else None
        if ratio is not None:
            ratios.append(ratio)
        print(f"{task:<22} {x.get('status', '-'):<16} {sx or 0:>8.3f} {y.get('status', '-'):<16} {sy or 0:>8.3f} "
              f"{ratio if ratio is not None else float('nan'):>9.3f}")
    if ratios:
        print(f"gpu/host speedup ratio over {len(ratios)} tasks correct under both: median "
              f"{statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")
    for clock in order:
        per_bracket = [r["ms_per_bracket"] for r in out[clock]["rows"].values() if r.get("ms_per_bracket")]
        bracket = f", one bracket {statistics.median(per_bracket):.2f} ms (median)" if per_bracket else ""
        print(f"clock {clock}: {out[clock]['evaluated']} evaluated in {out[clock]['wall_s']} s, "
              f"{out[clock]['candidates_per_hour']} candidates/hour{bracket}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--release", type=Path, default=ROOT.parent / "shared/data/cuda-l1/h100.jsonl")
    ap.add_argument("--per-level", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default="strict")
    ap.add_argument("--device", default="cuda", help="cuda (cpu: a check of the script; one clock there)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="Any other evaluation setting for both clocks (repeatable), as `cudal1 eval --set`.")
    ap.add_argument("--time-budget-s", type=float, default=400.0)
    ap.add_argument("--order", default="host,gpu", help="the two clocks in the order they run")
    args = ap.parse_args()
    order = [c.strip() for c in args.order.split(",")]
    if sorted(order) != ["gpu", "host"]:
        raise SystemExit("--order: host,gpu or gpu,host")
    if not args.release.is_file():
        raise SystemExit(f"--release: no file {args.release}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    try:
        sets = parse_sets(EvalConfig, args.sets)
    except ConfigError as exc:
        raise SystemExit(str(exc)) from None
    pairs = sample_release(args.release, args.per_level, args.seed)
    out: dict = {"release": str(args.release), "tasks": [t.id for t, _ in pairs], "profile": args.profile}
    for clock in order:
        out[clock] = one_clock(pairs, clock, args.profile, args.time_budget_s / 2, args.device, sets)
        (args.out_dir / "compare_clocks.json").write_text(json.dumps(out, indent=1, default=str))
    table(out, order)


if __name__ == "__main__":
    main()
