"""E5's in-process reference timings: the same cubin and launch specs, launched inside a PyTorch process on
torch's stream, timed by `triton.testing.do_bench` (median) and by torch events around each call after the
same 256 MiB flush the launcher does.

    python tt_torchbench.py SPECS.json REPS

Prints one JSON object per spec on its own line: {"name", "do_bench_ms", "events_ms": [...]}.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import triton
import triton.testing
from tt_client import evaluate
from tt_cuda import Cuda


def main() -> None:
    with open(sys.argv[1]) as f:
        specs = json.load(f)
    reps = int(sys.argv[2])
    torch.zeros(1, device="cuda")
    cu = Cuda()
    cu.init()  # the primary context, which torch uses too
    modules: dict[str, int] = {}
    cache = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    for spec in specs:
        t0 = time.perf_counter()
        dims = {k: int(v) for k, v in spec.get("dims", {}).items()}
        if spec["cubin"] not in modules:
            with open(spec["cubin"], "rb") as f:
                modules[spec["cubin"]] = cu.load_module(f.read())
        g = torch.Generator(device="cuda").manual_seed(int(spec.get("seed", 0)))
        bufs = {}
        for name, b in spec["buffers"].items():
            count = int(evaluate(str(b["count"]), dims))
            if b.get("init") == "random":
                bufs[name] = torch.randn(count, device="cuda", generator=g, dtype=torch.float32)
            else:
                bufs[name] = torch.zeros(count, device="cuda", dtype=torch.float32)
        steps = []
        for step in spec["steps"]:
            func = cu.function(modules[spec["cubin"]], step["kernel"])
            args = []
            for a in step["args"]:
                if "buf" in a:
                    args.append(("p", bufs[a["buf"]].data_ptr()))
                else:
                    value = evaluate(str(a["value"]), dims)
                    args.append((a["type"], float(value) if a["type"] == "f32" else int(value)))
            grid = tuple(int(evaluate(str(v), dims)) for v in step["grid"])
            block = tuple(int(evaluate(str(v), dims)) for v in step["block"])
            steps.append((func, grid, block, int(step.get("smem", 0)), args))
        stream = torch.cuda.current_stream().cuda_stream

        def fn(steps: list = steps, stream: int = stream) -> None:
            for func, grid, block, smem, args in steps:
                cu.launch(func, grid, block, args, stream, smem=smem)

        t_warm = time.perf_counter()
        while time.perf_counter() - t_warm < 0.1:  # as the launcher: 100 ms of calls first
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        bench = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            cache.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        events = [a.elapsed_time(b) for a, b in zip(starts, ends, strict=True)]
        print(json.dumps({"name": spec["name"], "do_bench_ms": bench, "events_ms": events,
                          "wall_s": round(time.perf_counter() - t0, 2), "torch": torch.__version__,
                          "triton": triton.__version__}), flush=True)
        del bufs


if __name__ == "__main__":
    main()
