"""GPU check of the kernel-only form: build the relu example through the sandbox, run it through the trusted
launcher, compare with torch, and time it against do_bench-style event timing of the same cubin.

    PYTHONPATH=src python scripts/kernel_form_check.py OUT_DIR [--sizes 1048576,16777216,67108864] [--reps 100]

Per size (float32 elements): the launcher's time (driver events on its own stream around the step, per rep, an
L2 flush of 256 MB before each rep outside the events) and `triton.testing.do_bench` of the same launch on
torch's current stream (when triton is missing, the same loop written here: torch events around each call, the
same flush), in milliseconds, and their ratio; also the build's wall time through the sandbox, NVRTC's time, the
scan's time and flags, and the largest difference from `torch.relu`. Writes OUT_DIR/kernel_form_check.json and
prints it. Needs a GPU: without one it says so and exits with code 2.
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

FLUSH_BYTES = 256 * 2**20  # what triton.testing.do_bench clears between reps


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="folder for kernel_form_check.json")
    parser.add_argument("--sizes", default="1048576,16777216,67108864",
                        help="comma-separated element counts of x (float32)")
    parser.add_argument("--reps", type=int, default=100, help="timed reps per measurement")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls before timing")
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: expected comma-separated integers")
    if not args.sizes or min(args.sizes) < 1 or args.reps < 1 or args.warmup < 0:
        parser.error("need at least one size >= 1, --reps >= 1 and --warmup >= 0")
    return args


def event_bench_ms(fn, reps: int, warmup: int) -> float:
    """do_bench's loop, for when triton is missing: flush, event, call, event, per rep; the median."""
    import torch

    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    torch.cuda.synchronize()
    for start, end in zip(starts, ends, strict=True):
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def reference_bench_ms(fn, reps: int, warmup: int) -> tuple[float, str]:
    try:
        from triton.testing import do_bench
    except ImportError:
        return event_bench_ms(fn, reps, warmup), "event loop (triton missing)"
    # do_bench's own budgets (milliseconds of warm-up and of timed reps: 25 and 100), not counts.
    return float(do_bench(fn, return_mode="median")), "triton.testing.do_bench"


def measure(args: argparse.Namespace) -> dict:
    import torch

    from cudal1.eval.kernel_build import build_kernel_form
    from cudal1.kernel_form.examples import RELU_SPEC
    from cudal1.kernel_form.launcher import TrustedLauncher, bind_buffers
    from cudal1.kernel_form.spec import check_against_source, parse_spec
    from cudal1.raw_cuda.compiler import device_arch

    spec = parse_spec(RELU_SPEC)
    check_against_source(spec)
    arch = device_arch()
    build = build_kernel_form(spec, arch=arch, device="cuda")
    launcher = TrustedLauncher(build.cubin, spec, device_index=torch.cuda.current_device())
    out = {"device": torch.cuda.get_device_name(), "arch": arch, "compiler": build.compiler,
           "build_wall_s": round(build.wall_s, 3), "nvrtc_s": round(build.compile_s, 3),
           "scan_s": round(build.scan.seconds, 5), "scan": build.scan.to_dict(), "sizes": []}
    for n in args.sizes:
        x = torch.randn(n, device="cuda")
        y = torch.full_like(x, float("nan"))
        buffers = bind_buffers(spec, [x], [y])
        call = launcher.prepare(buffers, launcher.dims_for(buffers))
        launcher.run(call)
        max_abs_err = float((y - torch.relu(x)).abs().max())
        t0 = time.perf_counter()
        timing = launcher.time(call, reps=args.reps, warmup=args.warmup, l2_flush_bytes=FLUSH_BYTES)
        launcher_wall_s = time.perf_counter() - t0
        func = launcher.functions["relu"]

        def on_torch_stream(call=call, func=func) -> None:
            handle = torch.cuda.current_stream().cuda_stream
            for launch in call.launches:
                launcher.backend.launch(func, launch, handle)

        ref_ms, ref_how = reference_bench_ms(on_torch_stream, args.reps, args.warmup)
        out["sizes"].append({"n": n, "max_abs_err": max_abs_err, "launcher_median_ms": timing.median_ms,
                             "launcher_mean_ms": timing.mean_ms, "launcher_min_ms": min(timing.times_ms),
                             "reference_median_ms": ref_ms, "reference": ref_how,
                             "ratio_launcher_over_reference": timing.median_ms / ref_ms if ref_ms > 0 else None,
                             "launcher_wall_s": round(launcher_wall_s, 3)})
    out["correct"] = all(s["max_abs_err"] == 0.0 for s in out["sizes"])
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("kernel_form_check: needs a GPU (torch.cuda.is_available() is False); nothing was measured",
              file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    figures = measure(args)
    path = args.out_dir / "kernel_form_check.json"
    path.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    return 0 if figures["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
