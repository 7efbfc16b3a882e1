#!/usr/bin/env python3
"""Why does an honest twin not time 1.0 at small calls under the GPU clock? Arms that each change one thing (GPU).

Usage: python scripts/probe_twin_offset.py OUT_DIR [--sizes launch_bound,20us] [--repeat 3]
       [--arms plain,base,no_evidence,keep_cache,expandable] [--time-budget-s 240] [--device cuda]

The honest twin of `chain_<size>.py` (the reference's own computation as `ModelNew`) measured 0.906 and
0.926 on the launch-bound family (36 kernels a call, ~91 us) and 0.84-1.11 at 20 us, while the gated twin
before the candidate's import (the same code in the same two runners) showed no such offset. Each arm runs the
evaluator from a scratch copy of `src/` with one change:

- `plain`: today's code, as it is;
- `base`: today's code with the twin timed again after the import (below);
- `no_evidence`: `precision_evidence=false` (the reference's float64 run, and the cache emptying after it, gone);
- `keep_cache`: the candidate's runner keeps PyTorch's allocator cache at the import (no `empty_cache()`);
- `expandable`: both runners with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.

Every arm but `plain` also times the twin again after the import, before the timed phase (`after_import`
in the calibration record): if the offset appears there and not before, it comes with the import (`plain`
shows whether those extra calls move the timed phase). Arms run
interleaved, so drift of the card touches each alike. Per evaluation it prints the speedup, its interval, the
twin's null before and after the import, both runners' constants, and, from the recorded calls, the speedup
with the reference's constant paid by both (is the min() of the constants the cause?) and each model's median
call split by what ran just before it (`after`: "" is first in its pair, right after the reference made the
pair's inputs). Writes results.jsonl (one evaluation a line, as it goes) and summary.json under OUT_DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMING = ROOT / "tests" / "fixtures" / "timing"

#: The twin timed again after the import (every arm): the pre-import record is kept beside it.
AFTER_IMPORT = ("evaluation.py", """        session.trials()
""", """        session.trials()
        if session.gated:  # probe: the twin again, now that the (identical) candidate is imported
            kept = (session.facts.calibration, session.facts.samples, measurement.twin_null)
            measurement.gated_twin(cfg.flush_l2)
            after, after_samples = session.facts.calibration, (session.facts.samples or {}).get("calibration")
            session.facts.calibration = {**(kept[0] or {}), "after_import": after}
            session.facts.samples = {**(kept[1] or {}), "calibration_after_import": after_samples}
            measurement.twin_null = kept[2]
""")

PATCHES: dict[str, list[tuple[str, str, str]]] = {
    "plain": [],
    "base": [],
    "no_evidence": [],
    "keep_cache": [("inside/candidate.py", """            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
""", """            torch.cuda.synchronize(self.device)
""")],
    "expandable": [("sandbox.py", """               TORCHINDUCTOR_COMPILE_THREADS="1")
""", """               TORCHINDUCTOR_COMPILE_THREADS="1", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
""")],
}
SETTINGS = {"no_evidence": ["precision_evidence=false"]}


def scratch_copy(arm: str, out: Path) -> Path:
    """`src/` copied under OUT/arms/ARM with the arm's patches (each must apply exactly once)."""
    dest = out / "arms" / arm / "src"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(ROOT / "src", dest, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name, old, new in ([] if arm == "plain" else [AFTER_IMPORT]) + PATCHES[arm]:
        path = dest / "cudal1" / "eval" / name
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"arm {arm}: the patch of {name} does not apply (the code changed): fix this script")
        path.write_text(text.replace(old, new))
    return dest


def evaluate(arm: str, src: Path, size: str, device: str, timeout_s: float) -> dict:
    ref = TIMING / f"chain_{size}.py"
    twin = TIMING / ("honest_launch_bound.py" if size == "launch_bound" else "honest_chain.py")
    cmd = [sys.executable, "-m", "cudal1", "eval", "--ref", str(ref), "--candidate", str(twin), "--device", device,
           "--no-store", "--json", "--set", "record_samples=true"]
    for s in SETTINGS.get(arm, []):
        cmd += ["--set", s]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"arm": arm, "size": size, "error": (proc.stderr or proc.stdout)[-800:], "wall_s": time.perf_counter() - t0}
    return {"arm": arm, "size": size, "wall_s": round(time.perf_counter() - t0, 1), "result": json.loads(lines[-1])}


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def figures(entry: dict) -> dict:
    """What one evaluation says about the offset (module docstring)."""
    r = entry.get("result") or {}
    proto = r.get("protocol") or {}
    clock, cal, samples = proto.get("clock") or {}, proto.get("calibration") or {}, proto.get("samples") or {}
    after = cal.get("after_import") or {}
    out = {"arm": entry["arm"], "size": entry["size"], "status": r.get("status"), "speedup": r.get("speedup"),
           "interval": (r.get("timing") or {}).get("speedup_ci"), "null_before": cal.get("null"),
           "null_after_import": after.get("null"), "c_us": clock.get("c_us"), "cand_c_us": clock.get("cand_c_us"),
           "cand_c_paid_us": clock.get("cand_c_paid_us"), "unarmed": clock.get("unarmed_calls"),
           "error": entry.get("error")}
    ref_rows = [row for bucket in samples.get("ref", []) for row in bucket]
    cand_rows = [row for bucket in samples.get("cand", []) for row in bucket]
    c, paid = clock.get("c_us"), clock.get("cand_c_paid_us")
    if ref_rows and cand_rows and c is not None and paid is not None:
        # A recorded call's ms is its bracket less the constant it paid: the candidate's again with the reference's.
        shift_ms = (paid - c) / 1e3
        ref_ms = statistics.median(row[0] for row in ref_rows)
        cand_ms = statistics.median(row[0] + shift_ms for row in cand_rows)
        out["speedup_c_ref_both"] = ref_ms / max(cand_ms, 1e-9)
    for who, rows in (("ref", ref_rows), ("cand", cand_rows)):
        by_after: dict[str, list[float]] = {}
        for row in rows:
            by_after.setdefault(str(row[7]), []).append(row[0] * 1e3)
        out[f"{who}_us_by_after"] = {k: round(median_or_none(v) or 0.0, 3) for k, v in sorted(by_after.items())}
    return out


def show(f: dict) -> str:
    def x(v: float | None, fmt: str = "{:.3f}") -> str:
        return "-" if v is None else fmt.format(v)
    interval = f["interval"] or [None, None]
    if f.get("error"):
        return f"{f['arm']:<12} {f['size']:<12} ERROR {f['error'][-200:]!r}"
    return (f"{f['arm']:<12} {f['size']:<12} {f['status']:<14} {x(f['speedup'])} [{x(interval[0])}, {x(interval[1])}] "
            f"twin before {x(f['null_before'])} after {x(f['null_after_import'])} | c {x(f['c_us'], '{:.1f}')} "
            f"cand c {x(f['cand_c_us'], '{:.1f}')} paid {x(f['cand_c_paid_us'], '{:.1f}')} | c_ref both "
            f"{x(f.get('speedup_c_ref_both'))} | ref us by after {f['ref_us_by_after']} cand {f['cand_us_by_after']} "
            f"| unarmed {f['unarmed']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--sizes", default="launch_bound,20us")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--arms", default="plain,base,no_evidence,keep_cache,expandable")
    ap.add_argument("--time-budget-s", type=float, default=240.0, help="no new evaluation starts after this")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in PATCHES]
    if unknown:
        raise SystemExit(f"unknown arm(s) {', '.join(unknown)}: one of {', '.join(PATCHES)}")
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    missing = [s for s in sizes if not (TIMING / f"chain_{s}.py").exists()]
    if missing:
        raise SystemExit(f"no fixture chain_<size>.py for {', '.join(missing)} under {TIMING}")
    args.out.mkdir(parents=True, exist_ok=True)
    sources = {arm: scratch_copy(arm, args.out) for arm in arms}
    started, rows = time.perf_counter(), []
    # Alternate the arms' order between rounds: drift of the card touches every arm alike.
    plan = [(r, size, arm) for r in range(args.repeat) for size in sizes
            for arm in (arms if r % 2 == 0 else list(reversed(arms)))]
    with open(args.out / "results.jsonl", "a") as log:
        for r, size, arm in plan:
            left = args.time_budget_s - (time.perf_counter() - started)
            if left < 20:
                print(f"budget spent: stopped before round {r}, {size}, {arm}", flush=True)
                break
            try:
                entry = evaluate(arm, sources[arm], size, args.device, timeout_s=max(left, 30))
            except subprocess.TimeoutExpired:
                entry = {"arm": arm, "size": size, "error": "timed out (budget)"}
            log.write(json.dumps(entry) + "\n")
            log.flush()
            rows.append(figures(entry))
            print(show(rows[-1]), flush=True)
    summary: dict[str, dict] = {}
    for f in rows:
        if f.get("speedup") is not None:
            s = summary.setdefault(f"{f['arm']}/{f['size']}", {"speedups": [], "after_import": [], "c_ref_both": []})
            s["speedups"].append(round(f["speedup"], 4))
            s["after_import"].append(f["null_after_import"])
            s["c_ref_both"].append(round(f["speedup_c_ref_both"], 4) if f.get("speedup_c_ref_both") else None)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print("summary (speedups per arm and size; twin after import; with the reference's constant for both):")
    for key, s in summary.items():
        print(f"  {key:<26} {s['speedups']}  after import {s['after_import']}  c_ref both {s['c_ref_both']}")


if __name__ == "__main__":
    main()
