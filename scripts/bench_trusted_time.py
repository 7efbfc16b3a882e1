"""How much time a forgery keeps: the forging room of the trusted time, per call size, printed as a table.

    PYTHONPATH=src python scripts/bench_trusted_time.py OUT_DIR [--device cuda] [--profile strict] [--repeat 2]
        [--bracket-work-ms 0.5,0] [--sizes 20us,100us,1ms,launch_bound] [--fractions 0.1,0.2,0.4,0.8] [--clock host,gpu]

On one task family at three sizes (tests/fixtures/timing/chain_*.py: about 0.02, 0.1 and 1 ms per call on an
H200), the honest twin (`honest_chain.py`) and a forging fixture (`forge_reply.py`) that reports only (1 - f)
of each call's real time, for f = 10, 20, 40 and 80 %, all through the real evaluator in one batch, its static
filter off (what is measured is the clocks' bound alone). Per size: the honest twin's speedup and time that
counts, each forgery's verdict, speedup and the time it kept hidden per call (the honest twin's time that
counts minus the forgery's: what the forgery gained), in microseconds and as a share of the call, the
slack of the bound that counted and that of the paired bound. Goal: at most max(5 us, 10 % of the call) per
call. Each `--bracket-work-ms` value is one batch (0: one call per
bracket), so that the brackets' own effect is seen side by side in one run. Full figures in
OUT_DIR/trusted_time.json, written after each batch (with every call's figures, the calibration's included);
last, where each bracket's time went, per model and phase (`bracket_parts`).
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

from cudal1.eval import EvalConfig, evaluate_many  # noqa: E402
from cudal1.eval.clock.timing import quantile  # noqa: E402
from cudal1.tasks.sources import load_file  # noqa: E402

TIMING = ROOT / "tests" / "fixtures" / "timing"
SIZES = ("20us", "100us", "1ms")
#: Also offered: `launch_bound` (chain_launch_bound.py, twelve small ops, ~0.05-0.09 ms a call of 36 kernels),
#: whose twin is honest_launch_bound.py: where an offset per kernel between the runners would show.
EXTRA_SIZES = ("launch_bound",)
FRACTIONS = (0.1, 0.2, 0.4, 0.8)

#: The forgery (the red team's reply forger): the replies that report calls are rewritten on their way out to
#: KEEP = (1 - f) of each call's time. It replaces nothing the guards watch (the instance-method forger, used
#: here before, is now named by them), so what bounds it is the clock alone.
FORGER = (TIMING / "forge_reply.py").read_text()
FORGER_KEEP = "KEEP = 1 / 3"


def row(result, honest_counted: float | None) -> dict:
    clock = result.protocol.get("clock") or {}
    counted = clock.get("counted_ms")
    hidden = (honest_counted - counted) * 1e3 if (honest_counted is not None and counted is not None) else None
    return {"status": result.status.value, "speedup": result.speedup, "message": result.message[:200],
            "speedup_ci": result.timing.speedup_ci if result.timing is not None else None,
            "counted_ms": counted, "reported_ms": clock.get("reported_ms"), "bound_ms": clock.get("bound_ms"),
            "slack_ms": clock.get("slack_ms"), "hidden_us": hidden, "clock": clock,
            "calibration": result.protocol.get("calibration"), "samples": result.protocol.get("samples"),
            "flags": [f.rule for f in result.flags]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--profile", default="strict")
    ap.add_argument("--repeat", type=int, default=2, help="honest twins per size (their spread is the noise)")
    ap.add_argument("--bracket-work-ms", default=str(EvalConfig.bracket_work_ms),
                    help="comma-separated values, one batch each (0: one call per bracket)")
    ap.add_argument("--sizes", default=",".join(SIZES),
                    help="comma-separated, of " + ", ".join(SIZES + EXTRA_SIZES))
    ap.add_argument("--fractions", default=",".join(str(f) for f in FRACTIONS),
                    help="hidden shares of the forgeries, comma-separated")
    ap.add_argument("--clock", default="gpu",
                    help="comma-separated clocks (host, gpu: EvalConfig.gpu_clock), one batch each per "
                         "--bracket-work-ms value")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out: dict = {"device": args.device, "profile": args.profile, "batches": []}
    for clock in args.clock.split(","):
        for work in (float(w) for w in args.bracket_work_ms.split(",")):
            out["batches"].append(batch(args, work, clock))
            (args.out_dir / "trusted_time.json").write_text(json.dumps(out, indent=1, default=str))
    print(f"figures in {args.out_dir / 'trusted_time.json'}")


def batch(args: argparse.Namespace, work: float, clock: str = "host") -> dict:
    """One batch of the honest twins and the forgeries at every size, with `work` ms of calls per bracket,
    timed by `clock`."""
    items, labels = [], []
    sizes = args.sizes.split(",")
    for size in sizes:
        task = load_file(TIMING / f"chain_{size}.py")
        honest = (TIMING / ("honest_launch_bound.py" if size == "launch_bound" else "honest_chain.py")).read_text()
        for r in range(args.repeat):
            items.append((task, honest + f"\n# twin {r}\n"))
            labels.append((size, "honest", r))
        for f in (float(x) for x in args.fractions.split(",") if x):
            items.append((task, FORGER.replace(FORGER_KEEP, f"KEEP = {1.0 - f!r}")))
            labels.append((size, f"forged {int(f * 100)} %", f))
    # The static filter off: measured here is the clocks' own bound.
    cfg = EvalConfig(device=args.device, profile=args.profile, record_samples=True, skip_static=True,
                     bracket_work_ms=work, gpu_clock=clock == "gpu")
    t0 = time.monotonic()
    results = evaluate_many(items, cfg, force=True)
    wall = time.monotonic() - t0
    out: dict = {"clock": clock, "bracket_work_ms": work, "wall_s": round(wall, 1), "sizes": {}}
    print(f"clock {clock}, bracket_work_ms {work}: {wall:.1f} s ({len(items)} evaluations)")
    print(f"{'size':12s} {'case':12s} {'status':14s} {'speedup':>8s} {'counted us':>11s} {'reported us':>12s} "
          f"{'hidden us':>10s} {'hidden %':>9s} {'slack us':>9s} {'paired':>7s} {'calls':>5s}")
    for size in sizes:
        mine = [(label, r) for label, r in zip(labels, results, strict=True) if label[0] == size and r is not None]
        twins = [r for label, r in mine if label[1] == "honest" and (r.protocol.get("clock") or {}).get("counted_ms")]
        honest_counted = statistics.median(r.protocol["clock"]["counted_ms"] for r in twins) if twins else None
        rows = []
        for label, r in mine:
            entry = {"case": label[1], **row(r, honest_counted if label[1] != "honest" else None)}
            rows.append(entry)
            hidden = entry["hidden_us"]
            share = (100 * hidden / (honest_counted * 1e3)) if hidden is not None and honest_counted else None
            entry["hidden_share"] = share
            print(f"{size:12s} {label[1]:12s} {entry['status']:14s} {entry['speedup'] or 0:8.3f} "
                  f"{(entry['counted_ms'] or 0) * 1e3:11.1f} {(entry['reported_ms'] or 0) * 1e3:12.1f} "
                  f"{hidden if hidden is not None else float('nan'):10.1f} "
                  f"{share if share is not None else float('nan'):9.1f} "
                  f"{(entry['slack_ms'] or 0) * 1e3:9.1f} "
                  f"{(entry['clock'].get('slacks_ms', {}).get('paired wall') or float('nan')) * 1e3:7.1f} "
                  f"{entry['clock'].get('calls_per_bracket', 1):5d}")
        out["sizes"][size] = {"honest_counted_ms": honest_counted, "rows": rows}
    print_twins(out)
    print_parts(out)
    return out


def print_twins(batch_out: dict) -> None:
    """Each honest twin's speedup beside its interval (does it hold the true 1.0?) and beside what the
    evaluation knew before the candidate's import: the twin calibration's null ratio and interval (the
    reference against its twin in the candidate's runner). A null that tracks the twin's speedup could
    correct it; one that does not can only widen the interval."""
    print("honest twins: speedup [interval] holds 1.0 | calibration null [interval] | ref us, cand us | "
          "constants c, cand c us")
    for size, entry in batch_out["sizes"].items():
        for r in entry["rows"]:
            if r["case"] != "honest" or r["speedup"] is None:
                continue
            ci = r.get("speedup_ci") or [float("nan")] * 2
            cal = r.get("calibration") or {}
            null_ci = cal.get("null_ci") or [float("nan")] * 2
            clock = r["clock"]
            ref_us = 1e3 * r["speedup"] * (r["counted_ms"] or 0)
            print(f"{size:12s} {r['speedup']:6.3f} [{ci[0]:.3f}, {ci[1]:.3f}] {str(ci[0] <= 1.0 <= ci[1]):5s} | "
                  f"{cal.get('null', float('nan')):6.3f} [{null_ci[0]:.3f}, {null_ci[1]:.3f}] | "
                  f"{ref_us:8.1f}, {1e3 * (r['counted_ms'] or 0):8.1f} | "
                  f"{clock.get('c_us', float('nan')):7.1f}, {clock.get('cand_c_us', float('nan')):7.1f}")


def bracket_parts(samples: dict) -> dict:
    """Where each model's bracket went, per phase (the calibration's twin pairs, the timed calls): medians per
    call in microseconds of the report, the staging (bracket start to go), the runner's part beyond its report
    (go to done, less the report) and the end probe (done to the bracket's end), with their interquartile
    ranges. The runner's part is what a forger's process can shorten, and what moves between phases."""
    out: dict = {}
    for phase, series in (("calibration", samples.get("calibration")), ("timed", samples)):
        for who in ("ref", "cand"):
            rows = [r for bucket in (series or {}).get(who, []) for r in bucket]
            if not rows or rows[0][8] is None:
                continue
            parts = {"reported": [r[0] for r in rows], "staging": [r[8] for r in rows],
                     "runner": [r[3] - r[0] for r in rows], "end": [r[2] - r[8] - r[3] for r in rows]}
            out[f"{phase}.{who}"] = {k: {"median_us": round(1e3 * statistics.median(v), 1),
                                         "iqr_us": round(1e3 * (quantile(v, 0.75) - quantile(v, 0.25)), 1)} for k, v in parts.items()}
    return out


def print_parts(batch_out: dict) -> None:
    print("bracket parts, median us per call (IQR): reported | staging | runner beyond report | end probe")
    for size, entry in batch_out["sizes"].items():
        for r in entry["rows"]:
            r["parts"] = parts = bracket_parts(r.get("samples") or {})
            for key, p in parts.items():
                cells = " | ".join(f"{p[k]['median_us']:7.1f} ({p[k]['iqr_us']:5.1f})"
                                   for k in ("reported", "staging", "runner", "end"))
                print(f"{size:12s} {r['case']:12s} {key:17s} {cells}")


if __name__ == "__main__":
    main()
