"""Host cost of one kernel launch: the raw-CUDA form against PyTorch's own ops, side by side in one process.

    PYTHONPATH=src python scripts/bench_launch.py OUT_DIR [--launches 2000]

For kernels of a few microseconds the launch is the time: a raw-CUDA `ModelNew` whose launcher costs more
host time than the PyTorch ops it replaces cannot win, however good its kernel. Measured per launch, in
microseconds of wall time with the GPU kept busy (the queue never drains, so the host side is what is
timed): an empty raw-CUDA kernel through `kernels.<name>(...)`, the same with an int64 and two tensor
arguments, and `torch.add(x, 1, out=y)`, `x.add_(1)` and `torch.empty_like` as PyTorch's references.
Prints a table and writes OUT_DIR/bench_launch.json. Needs a GPU.
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

SOURCE = r'''
extern "C" __global__ void empty() {}
extern "C" __global__ void touch(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
'''


def per_launch_us(fn, launches: int, repeats: int = 5) -> float:
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(launches):
            fn()
        host = time.perf_counter() - t0
        torch.cuda.synchronize()
        times.append(host / launches * 1e6)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--launches", type=int, default=2000)
    args = ap.parse_args()
    import torch

    from cudal1.raw_cuda import load_kernels

    kernels = load_kernels(SOURCE)
    x = torch.randn(1024, device="cuda")
    y = torch.empty_like(x)
    n = x.numel()
    cases = {
        "raw_cuda empty kernel (no arguments)": lambda: kernels.empty(grid=1, block=32),
        "raw_cuda kernel, 2 tensors + int64": lambda: kernels.touch(grid=(4,), block=(256,), args=(x, y, n)),
        "torch.add(x, 1, out=y)": lambda: torch.add(x, 1, out=y),
        "x.add_(1)": lambda: x.add_(1),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
    }
    results = {name: round(per_launch_us(fn, args.launches), 2) for name, fn in cases.items()}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "launches": args.launches,
            "us_per_launch": results}
    (args.out_dir / "bench_launch.json").write_text(json.dumps(info, indent=1))
    print(f"{'launch':40s} us per launch (host)")
    for name, us in results.items():
        print(f"{name:40s} {us:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
