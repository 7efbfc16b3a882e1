#!/usr/bin/env python3
"""Where does the scatter of launch-bound speedups come from? A probe outside the evaluator (GPU).

Usage: python scripts/probe_process_timing.py OUT_DIR [--release PATH] [--tasks ID,...] [--pairs 6]
                                              [--calls 300] [--variants shared,split,swap,same-process]

A speedup is the ratio of two models' times measured in two processes; a reference timed against itself
should give 1.00x. For launch-bound tasks it does not, evaluation by evaluation (the null test: 0.87x to
1.04x). This probe times one task's reference in pairs of fresh worker processes, alternating the two
workers call by call in random order, each call on new inputs and timed like the evaluator's timed call
(device events around it, a device-wide wait inside), and prints the spread of the ratio over the pairs:

- `shared`: both workers may run on the same two cores (the evaluator's layout);
- `split`: each worker on a core of its own;
- `swap`: each on a core of its own, the cores exchanged every 25 calls;
- `same-process`: two instances of the model in one worker (how single-process harnesses time), the control.

If the ratio scatters across pairs while each pair's own figure is stable, the cause lives in the processes
(not in the clock, not in the GPU's state, which both workers share). Writes probe.json under OUT_DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

WORKER = r"""
import json, sys, time, torch
src, copies, device = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ns = {"__name__": "probe_task"}
exec(compile(open(src).read(), "task", "exec"), ns)
torch.manual_seed(0)
init = ns["get_init_inputs"]() if "get_init_inputs" in ns else []
models = [ns["Model"](*init).to(device).eval() for _ in range(copies)]
def fresh(seed):
    torch.manual_seed(seed)
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in ns["get_inputs"]()]
def timed(model, inputs):
    with torch.no_grad():
        if device == "cpu":
            t0 = time.perf_counter(); model(*inputs); return (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); model(*inputs); torch.cuda.synchronize(); end.record(); end.synchronize()
        return start.elapsed_time(end)
for k in range(3):
    for m in models:
        timed(m, fresh(k))
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    inputs = fresh(req["seed"])
    print(json.dumps({"ms": timed(models[req.get("copy", 0)], inputs)}), flush=True)
"""


class Worker:
    def __init__(self, task_file: Path, copies: int, cores: set[int], device: str):
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(task_file), str(copies), device],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pin(cores)

    def pin(self, cores: set[int]) -> None:
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            try:
                os.sched_setaffinity(int(tid), cores)
            except OSError:
                pass

    def ready(self) -> None:
        assert json.loads(self.proc.stdout.readline())["ready"]

    def call(self, seed: int, copy: int = 0) -> float:
        self.proc.stdin.write(json.dumps({"seed": seed, "copy": copy}) + "\n")
        self.proc.stdin.flush()
        return float(json.loads(self.proc.stdout.readline())["ms"])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def one_pair(task_file: Path, variant: str, calls: int, cores: list[int], rng: random.Random,
             device: str) -> dict:
    a_core, b_core, shared = {cores[0]}, {cores[1]}, set(cores[:2])
    sets = {"same-process": [shared], "shared": [shared, shared]}.get(variant, [a_core, b_core])
    workers = [Worker(task_file, 2 if variant == "same-process" else 1, cpus, device) for cpus in sets]
    for worker, cpus in zip(workers, sets, strict=True):
        worker.ready()
        worker.pin(cpus)  # again: threads the CUDA runtime started
    times: dict[str, list[float]] = {"a": [], "b": []}
    for i in range(calls):
        if variant == "swap" and i and i % 25 == 0:
            flipped = (i // 25) % 2 == 1
            workers[0].pin(b_core if flipped else a_core)
            workers[1].pin(a_core if flipped else b_core)
        seed = rng.randrange(1 << 30)
        for who in rng.sample(["a", "b"], 2):
            if variant == "same-process":
                times[who].append(workers[0].call(seed, copy=0 if who == "a" else 1))
            else:
                times[who].append(workers[0 if who == "a" else 1].call(seed))
    for w in workers:
        w.close()
    a, b = statistics.median(times["a"]), statistics.median(times["b"])
    halves = [statistics.median(times["a"][h::2]) / statistics.median(times["b"][h::2]) for h in (0, 1)]
    return {"a_ms": a, "b_ms": b, "ratio": a / b, "ratio_halves": halves}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--release", type=Path, default=ROOT.parent / "shared/data/cuda-l1/h100.jsonl")
    ap.add_argument("--tasks", default="h100/level2/1,h100/level2/71")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--variants", default="shared,split,swap,same-process")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the probe itself")
    ap.add_argument("--time-budget-s", type=float, default=300.0)
    args = ap.parse_args()
    from cudal1.tasks import load_release

    args.out_dir.mkdir(parents=True, exist_ok=True)
    wanted = args.tasks.split(",")
    tasks = {t.id: t for t, _ in load_release(args.release) if t.id in wanted}
    cores = sorted(os.sched_getaffinity(0))
    rng = random.Random(0)
    deadline = time.monotonic() + args.time_budget_s
    rows = []
    for task_id in wanted:
        task_file = args.out_dir / f"{task_id.replace('/', '_')}.py"
        task_file.write_text(tasks[task_id].source)
        for variant in args.variants.split(","):
            ratios = []
            for _ in range(args.pairs):
                if time.monotonic() > deadline:
                    break
                row = {"task": task_id, "variant": variant, **one_pair(task_file, variant, args.calls, cores, rng, args.device)}
                rows.append(row)
                ratios.append(row["ratio"])
                print(f"{task_id:22s} {variant:13s} a {row['a_ms'] * 1e3:8.1f} us  b {row['b_ms'] * 1e3:8.1f} us  "
                      f"ratio {row['ratio']:.3f}  halves {row['ratio_halves'][0]:.3f}/{row['ratio_halves'][1]:.3f}",
                      flush=True)
                (args.out_dir / "probe.json").write_text(json.dumps(rows, indent=1))
            if len(ratios) > 1:
                spread = statistics.median(abs(r - 1) for r in ratios)
                print(f"== {task_id} {variant}: median |ratio - 1| {spread * 100:.2f} %, "
                      f"range {min(ratios):.3f}-{max(ratios):.3f}", flush=True)


if __name__ == "__main__":
    main()
