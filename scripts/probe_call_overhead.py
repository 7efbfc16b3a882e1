#!/usr/bin/env python3
"""Where does a timed call's harness time go? A probe of the per-call overhead, outside a session (GPU).

Usage: python scripts/probe_call_overhead.py OUT_DIR [--release PATH] [--tasks ID,...] [--calls 200]

The evaluator's clock cross-check records, per timed call, the time to prepare its inputs and the gap
around the call beyond its device time (`protocol.clock.*_prepare_ms`, `*_call_gap_ms`): for small kernels
they decide how many calls a bucket of 100 ms holds, and the outside clock's tolerance. This probe splits
that time three ways, for each task's reference run as a candidate (the null candidate):

1. the candidate runner's setup (`CandidateRole`), profiled in this process;
2. the runner-side work of `prepare` and `call` (`calls.ModelSide`), step by step, in this process, with
   the outputs committed to a device arena as in an evaluation;
3. a request's round trip to a started, sandboxed runner that does nothing (an op before its setup), bare
   and with the freeze and thaw the session puts around every request.

Prints medians in milliseconds and the top functions of (1) and (2); writes probe_call_overhead.json under
OUT_DIR.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
from null_test import as_candidate  # noqa: E402

from cudal1.eval.inside import harness as calls  # noqa: E402
from cudal1.eval.inside.candidate import CandidateRole  # noqa: E402
from cudal1.tasks import load_tasks  # noqa: E402


def top(profile: cProfile.Profile, n: int = 18) -> str:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(n)
    return "\n".join(line for line in out.getvalue().splitlines() if line.strip())[-4000:]


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1e3, 4)


def steps(side: calls.ModelSide, seed: int) -> dict[str, float]:
    """One prepare and one timed call, cut into the steps `ModelSide` takes (seconds each)."""
    t: dict[str, float] = {}

    def lap(name: str, t0: float) -> float:
        now = time.perf_counter()
        t[name] = now - t0
        return now

    t0 = time.perf_counter()
    calls.seed_everything(seed)
    t0 = lap("seed_everything", t0)
    with torch.device(side.device):
        inputs = list(side.ref.get_inputs())
    t0 = lap("get_inputs", t0)
    torch.seed()
    t0 = lap("torch_seed", t0)
    inputs = [x.to(side.device) if isinstance(x, torch.Tensor) else x for x in inputs]
    before = calls.clone_inputs(inputs)
    t0 = lap("clone", t0)
    calls.sync(side.device)
    t0 = lap("sync_after_prepare", t0)
    out, total_ms, _ = side.timed_call(inputs)
    t["device_ms"] = total_ms / 1e3
    t0 = lap("timed_call", t0)
    tree = side.commit(out)
    t0 = lap("commit", t0)
    calls.same_bytes(before, inputs)
    t0 = lap("same_bytes", t0)
    memory = calls.gpu_memory(side.device)
    t0 = lap("gpu_memory", t0)
    json.dumps({"ok": True, "ms": total_ms, "out": tree, "memory": memory})
    lap("reply_json", t0)
    return t


def probe_task(task, n_calls: int) -> dict:
    from cudal1.eval.shared.device_arena import DeviceArena

    message = {"device": "cuda", "task_id": task.id, "ref_source": task.source, "sizes": "full", "seed": 42,
               "threads": 4, "exact_fp32": False, "gpu_memory_fraction": 0.45, "cand_source": as_candidate(task.source),
               "env": {}}
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    role = CandidateRole(message)
    role.setup_reply()
    prof.disable()
    setup_s = time.perf_counter() - t0
    role.side.attach(DeviceArena.create(256 << 20, 256 << 20))
    for k in range(5):  # warm-up: lazy loading, allocator
        role.handle("prepare", {"seed": k})
        role.handle("call", {})
    whole: dict[str, list[float]] = {"prepare": [], "call": []}
    prof_calls = cProfile.Profile()
    for k in range(n_calls):
        prof_calls.enable()
        t0 = time.perf_counter()
        role.handle("prepare", {"seed": 1000 + k})
        t1 = time.perf_counter()
        role.handle("call", {})
        t2 = time.perf_counter()
        prof_calls.disable()
        whole["prepare"].append(t1 - t0)
        whole["call"].append(t2 - t1)
    cut: dict[str, list[float]] = {}
    for k in range(n_calls):
        for name, seconds in steps(role.side, 5000 + k).items():
            cut.setdefault(name, []).append(seconds)
    return {"task": task.id, "setup_ms": round(setup_s * 1e3, 2), "setup_top": top(prof),
            "handle_ms": {k: median_ms(v) for k, v in whole.items()},
            "steps_ms": {k: median_ms(v) for k, v in cut.items()}, "calls_top": top(prof_calls, 25)}


def probe_round_trip(n: int) -> dict:
    from cudal1.eval.runner_process import RunnerProcess

    runner = RunnerProcess("cuda", warm=True)
    try:
        runner.wait_ready()
        bare, frozen = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            runner.request({"op": "noop"}, timeout_s=30.0)
            bare.append(time.perf_counter() - t0)
        runner.freeze()
        for _ in range(n):
            t0 = time.perf_counter()
            runner.thaw()
            runner.request({"op": "noop"}, timeout_s=30.0)
            runner.freeze()
            frozen.append(time.perf_counter() - t0)
        runner.thaw()
        return {"bare_ms": median_ms(bare), "thaw_request_freeze_ms": median_ms(frozen),
                "cgroup": runner.group is not None, "sandbox": runner.info.level}
    finally:
        runner.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--release", type=Path, default=ROOT.parent / "shared/data/cuda-l1/h100.jsonl")
    ap.add_argument("--tasks", default="h100/level2/76,h100/level1/46")
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    wanted = args.tasks.split(",")
    tasks = {t.id: t for t in load_tasks(f"jsonl:{args.release}") if t.id in wanted}
    out = {"round_trip": probe_round_trip(args.calls)}
    print("round trip", out["round_trip"], flush=True)
    out["tasks"] = []
    for task_id in wanted:
        row = probe_task(tasks[task_id], args.calls)
        out["tasks"].append(row)
        print(f"\n== {task_id}: setup {row['setup_ms']} ms; handle {row['handle_ms']}\nsteps {row['steps_ms']}",
              flush=True)
        print(row["setup_top"][-2500:], "\n", row["calls_top"][-3500:], flush=True)
        (args.out_dir / "probe_call_overhead.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
