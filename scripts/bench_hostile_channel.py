"""The channel's attackers against honest controls: verdicts, what each costs the evaluator, and the output
aliasing gain.

    PYTHONPATH=src python scripts/bench_hostile_channel.py OUT_DIR [--device cpu] [--repeat 3]
        [--profile strict] [--only nan_time,alias_output] [--ref tests/fixtures/candidates/refs/relu_large.py]

Every candidate of `tests/fixtures/channel/` (a runner that sends NaN or zero times, strings for numbers,
unknown fields, replies nested past the parser's recursion or bloated past their size, garbage frames,
numbers past 64 bits; that kills itself at a step drawn anew each attempt; that computes into its runner's
output region) is evaluated `repeat` times through the real evaluator beside the honest controls
(`honest_control.py`, and `alias_twin.py`, the in-place twin of `alias_output.py`), interleaved in rounds.
Printed per candidate: its verdicts, the message of the first, its median evaluation wall time over the
honest control's (the goal: within 2x), and for the aliasing pair the median speedup of `alias_output` over
that of `alias_twin` (the goal: no gain above 1.05x; a `hack_detected` verdict gains nothing either). The
aliasing figure needs calls the clock resolves: on a GPU, `--ref .../relu_large.py` (about 1 ms a call) with
`--only alias_output`.
Everything, per evaluation, in OUT_DIR/hostile_channel.json, written after every round.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from cudal1.eval import EvalConfig, evaluate_candidate  # noqa: E402
from cudal1.tasks.sources import load_file  # noqa: E402

CHANNEL = ROOT / "tests" / "fixtures" / "channel"
RELU = ROOT / "tests" / "fixtures" / "candidates" / "refs" / "relu.py"
CONTROLS = ("honest_control", "alias_twin")


def summarize(runs: dict[str, list[dict]]) -> list[dict]:
    """One row per candidate: verdicts, first message, wall time over the honest control's, speedups."""
    honest_s = statistics.median(r["wall_s"] for r in runs["honest_control"]) if runs.get("honest_control") else None
    rows = []
    for name, evals in sorted(runs.items()):
        speedups = [r["speedup"] for r in evals if r["speedup"] is not None]
        wall = statistics.median(r["wall_s"] for r in evals)
        rows.append({"candidate": name, "n": len(evals),
                     "verdicts": dict(Counter(r["status"] for r in evals)),
                     "message": evals[0]["message"][:160],
                     "wall_s": round(wall, 2), "wall_vs_honest": round(wall / honest_s, 2) if honest_s else None,
                     "speedup_median": statistics.median(speedups) if speedups else None,
                     "any_nan": any(r["non_finite"] for r in evals)})
    twin = [r["speedup"] for r in runs.get("alias_twin", []) if r["speedup"]]
    alias = [r["speedup"] for r in runs.get("alias_output", []) if r["speedup"]]
    for row in rows:
        if row["candidate"] == "alias_output":
            row["alias_gain"] = (round(statistics.median(alias) / statistics.median(twin), 3)
                                 if alias and twin else None)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", default="strict")
    parser.add_argument("--only", default="", help="comma-separated fixture names (the controls always run)")
    parser.add_argument("--ref", type=Path, default=RELU, help="the reference (a relu: every fixture computes one)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    names = sorted(p.stem for p in CHANNEL.glob("*.py"))
    if args.only:
        wanted = set(args.only.split(",")) | set(CONTROLS)
        names = [n for n in names if n in wanted]
    task = load_file(args.ref)
    cfg = EvalConfig(device=args.device, profile=args.profile)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for round_index in range(args.repeat):
        for name in names:
            t0 = time.perf_counter()
            result = evaluate_candidate(task, (CHANNEL / f"{name}.py").read_text(), cfg)
            wall = time.perf_counter() - t0
            data = result.to_dict()
            runs[name].append({"round": round_index, "status": result.status.value, "speedup": result.speedup,
                               "message": result.message, "wall_s": wall,
                               "flags": [f.rule for f in result.flags],
                               "non_finite": bool(result.non_finite_figures()) or (
                                   result.speedup is not None and not math.isfinite(result.speedup)),
                               "candidate_ms": data["candidate_ms"], "ref_ms": data["ref_ms"]})
            print(f"round {round_index} {name}: {result.status.value} "
                  f"{'' if result.speedup is None else f'{result.speedup:.3f}x '}{wall:.1f} s", flush=True)
        report = {"device": args.device, "profile": args.profile, "repeat": args.repeat, "ref": str(args.ref),
                  "summary": summarize(runs), "runs": runs}
        (args.out / "hostile_channel.json").write_text(json.dumps(report, indent=1))
    print(f"\n{'candidate':20s} {'verdicts':38s} {'wall/honest':>11s} {'speedup':>8s}  note")
    for row in summarize(runs):
        verdicts = ", ".join(f"{k} {v}" for k, v in row["verdicts"].items())
        speedup = "" if row["speedup_median"] is None else f"{row['speedup_median']:.3f}"
        note = f"alias gain {row['alias_gain']}" if row.get("alias_gain") is not None else row["message"][:70]
        print(f"{row['candidate']:20s} {verdicts:38s} {row['wall_vs_honest'] or 0:11.2f} {speedup:>8s}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
