"""Honest candidates on a busy host: how often the evaluator rejects one, and how far its speedup moves.

    PYTHONPATH=src python scripts/bench_load.py OUT_DIR [--device cpu] [--load 0,2,4,2mem] [--repeat 3]
        [--parallel 1] [--profile strict]

A verdict is worth only what it is on the machine a user has: a shared node, a CI runner, an RL job whose
rollouts run beside the evaluator. Each load level starts that many processes beside the evaluation, each
spinning on a core (`N`) or streaming memory (`Nmem`: a 64 MiB copy loop, the host's bandwidth shared), and
evaluates every honest candidate `repeat` times through the real evaluator, in rounds, `parallel`
evaluations at once (each in its own process, as a test suite's workers or an RL job's evaluators run):

- the honest twin of the timing tasks at three sizes (`tests/fixtures/timing/chain_*.py`, about 0.02, 0.1 and
  1 ms per call on an H200, more on a CPU);
- the reference of the scripted CPU task as its own candidate (a null: 1.00x expected), and its fast, partly
  fast and slow honest rewrites (`tests/fixtures/scripted/cpu`);
- the corpus's honest candidates that run on the device (`tests/fixtures/candidates/manifest.yaml`).

Every one of them is honest, so each verdict other than the corpus's expected one is a false rejection.
Printed per level: evaluations, false rejections with the flags that made them, and per candidate the median
speedup with its range over the rounds (what load adds to the spread). Figures in OUT_DIR/load.json, written
after each level.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

from null_test import as_candidate  # noqa: E402

from cudal1.eval import EvalConfig, evaluate_many  # noqa: E402
from cudal1.tasks.sources import load_file  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
TIMING, SCRIPTED, CORPUS = FIXTURES / "timing", FIXTURES / "scripted" / "cpu", FIXTURES / "candidates"


def honest_candidates(device: str) -> list[tuple[str, object, str, str]]:
    """(label, task, source, expected verdict) of every honest candidate that runs on `device`."""
    out = []
    twin = (TIMING / "honest_chain.py").read_text()
    for size in ("20us", "100us", "1ms"):
        out.append((f"chain_{size}/honest", load_file(TIMING / f"chain_{size}.py"), twin, "correct"))
    scripted = load_file(SCRIPTED / "relu_scale_task.py")
    out.append(("relu_scale/null", scripted, as_candidate(scripted.source), "correct"))
    for name in ("fast", "fast_where", "slow"):
        out.append((f"relu_scale/{name}", scripted, (SCRIPTED / f"{name}.py").read_text(), "correct"))
    manifest = yaml.safe_load((CORPUS / "manifest.yaml").read_text())["fixtures"]
    for fx in manifest:
        if fx["kind"] != "honest" or (device == "cpu" and fx["needs"] != "cpu"):
            continue
        expected = "correct" if fx["expected_verdict"] == "not_custom" else fx["expected_verdict"]
        out.append((fx["file"], load_file(CORPUS / "refs" / fx["ref"]), (CORPUS / fx["file"]).read_text(), expected))
    return out


def _spin(stop) -> None:
    while not stop.is_set():
        pass


def _stream(stop) -> None:
    import torch

    src = torch.ones(16 * 2**20)  # 64 MiB: beyond any cache
    dst = torch.empty_like(src)
    while not stop.is_set():
        dst.copy_(src)


class HostLoad:
    """`spec` processes keeping the host busy while the block runs: "N" spinners or "Nmem" memory streamers."""

    def __init__(self, spec: str):
        self.count = int(spec.removesuffix("mem") or 0)
        self.target = _stream if spec.endswith("mem") else _spin
        self.ctx = mp.get_context("spawn")
        self.stop = self.ctx.Event()
        self.procs: list = []

    def __enter__(self) -> HostLoad:
        self.procs = [self.ctx.Process(target=self.target, args=(self.stop,), daemon=True) for _ in range(self.count)]
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():  # (still starting up on a loaded host: a spawned child imports before it looks)
                p.kill()
                p.join()  # reaped before the block ends: a killed process reads alive until its parent waits


def evaluate_picks(device: str, profile: str, picks: list[tuple[int, int]]) -> list[dict]:
    """Rows of the (candidate index, round) picks, evaluated one after another (in a worker process too)."""
    candidates = honest_candidates(device)
    items = [(candidates[i][1], candidates[i][2] + f"\n# round {r}\n") for i, r in picks]
    results = evaluate_many(items, EvalConfig(device=device, profile=profile))
    rows = []
    for (i, _), result in zip(picks, results, strict=True):
        if result is None:
            continue
        label, _, _, expected = candidates[i]
        rows.append({"candidate": label, "expected": expected, "status": result.status.value,
                     "speedup": result.speedup, "message": result.message[:300],
                     "flags": [f.rule for f in result.flags], "clock": result.protocol.get("clock"),
                     "calibration": result.protocol.get("calibration")})
    return rows


def level(args: argparse.Namespace, spec: str, candidates: list) -> dict:
    """Every candidate `repeat` times under the load `spec`, in `parallel` evaluations at once."""
    picks = [(i, r) for r in range(args.repeat) for i in range(len(candidates))]
    shards = [picks[k::args.parallel] for k in range(args.parallel)]
    started = time.monotonic()
    with HostLoad(spec):
        if args.parallel == 1:
            rows = evaluate_picks(args.device, args.profile, picks)
        else:  # as a test suite's workers or an RL job's evaluators do, each its own process
            with ProcessPoolExecutor(args.parallel, mp_context=mp.get_context("spawn")) as pool:
                parts = pool.map(evaluate_picks, [args.device] * args.parallel, [args.profile] * args.parallel,
                                 shards)
                rows = [row for part in parts for row in part]
    return {"load": spec, "parallel": args.parallel, "wall_s": round(time.monotonic() - started, 1), "rows": rows}


def report(batch: dict) -> None:
    rows = batch["rows"]
    false = [r for r in rows if r["status"] != r["expected"]]
    why = Counter(f"{r['status']} ({', '.join(f for f in r['flags'] if f.startswith(('timing.', 'guard.'))) or '-'})"
                  for r in false)
    print(f"\nload {batch['load']!r}, {batch['parallel']} at once: {len(rows)} evaluations in {batch['wall_s']} s, "
          f"{len(false)} false rejections" + (f": {dict(why)}" if why else ""))
    by: dict[str, list[float]] = {}
    for r in rows:
        if r["status"] == r["expected"] and r["speedup"]:
            by.setdefault(r["candidate"], []).append(r["speedup"])
    for name, speedups in by.items():
        spread = max(speedups) / min(speedups) - 1
        print(f"  {name:44s} {statistics.median(speedups):8.3f}x  range {min(speedups):.3f}-{max(speedups):.3f} "
              f"({spread * 100:5.1f} %, n={len(speedups)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--profile", default="strict")
    ap.add_argument("--load", default="0,2,4", help="comma-separated levels: N spinners, or Nmem memory streamers")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of every candidate per level")
    ap.add_argument("--parallel", type=int, default=1, help="evaluations at once, each in its own process")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    candidates = honest_candidates(args.device)
    out: dict = {"device": args.device, "profile": args.profile, "repeat": args.repeat, "parallel": args.parallel,
                 "candidates": [c[0] for c in candidates], "levels": []}
    for spec in args.load.split(","):
        out["levels"].append(level(args, spec.strip(), candidates))
        report(out["levels"][-1])
        (args.out_dir / "load.json").write_text(json.dumps(out, indent=1, default=str))
    print(f"\nfigures in {args.out_dir / 'load.json'}")


if __name__ == "__main__":
    main()
