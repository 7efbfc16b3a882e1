"""Benchmark the cache-miss build time of the same 20 kernels in both candidate forms.

The 20 kernels: the 10 built-in example candidates (src/cudal1/tasks/builtin/examples/NAME.py, KernelBench
`load_inline` form, and their twins in examples_raw/NAME.py, cudal1's raw form) plus 10 small kernels written
in both forms (scripts/bench_kernels: relu, gelu, add, mul-add, sigmoid, tanh, row-sum, row-max, transpose,
saxpy). Goal of the fast form: a median build <= 1 s against ~60 s for `load_inline`.

- raw form: `cudal1.raw_cuda.compile_only(SOURCE, arch=..., use_cache=False)`, one kernel after another in
  this process, --raw-reps times each (the kernel's time is the median of its reps); the very first
  compile of the process (which loads libnvrtc) is reported apart as `first_build_s`.
- load_inline form: each candidate module is imported in an isolated child
  (`cudal1.eval.inside.build_child:prepare_candidate`, the compile service's build child) with a fresh
  TORCH_EXTENSIONS_DIR of its own, so every build is a cache miss; --threads children run in parallel (each
  runs ninja with MAX_JOBS=2). A build's time is the `load_inline` call's own seconds as recorded by the
  child's build hooks (`build_s`; the child's wall time with interpreter start and imports is `wall_s`).
  Parallel builds share the machine's cores, so each is slower than it would be alone. --inline-levers
  picks `plain` (torch exactly as the candidate calls it, the default) or `cudal1` (the compile service's
  adopted build levers). No new build is started once --time-budget-s has passed since the script began;
  running ones are awaited, and the JSON says how many finished.

Run on the GPU machine (arch from the local GPU):
    python scripts/bench_forms.py OUT_DIR --threads 8 --time-budget-s 420
On a CPU-only machine (the raw form only; arch defaults to sm_90):
    python scripts/bench_forms.py OUT_DIR --raw-only
Writes OUT_DIR/bench_forms.json (rewritten after each finished load_inline build, so a killed run keeps its
partial results) and prints a table last: count, failures, median and p90 build seconds per form, and the
ratio of the medians. Limits: build time only (nothing is launched); NVRTC must be loadable for the raw
form (else `compile_only` falls back to nvcc, and the JSON's `raw_compiler` says so).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kernels import SIMPLE_KERNELS  # noqa: E402 (the folder beside this script)

from cudal1.eval.compile import BuildLevers  # noqa: E402
from cudal1.eval.runner_process import usable_cpu_count  # noqa: E402
from cudal1.raw_cuda import compile_only, normalize_arch  # noqa: E402
from cudal1.tasks.builtin import BUILTIN_DIR  # noqa: E402

ENTRY_PREPARE = "cudal1.eval.inside.build_child:prepare_candidate"
PLAIN_LEVERS = BuildLevers.none().to_dict()  # every lever off, new ones included


@dataclass(frozen=True)
class KernelPair:
    """One kernel in both forms: the raw form's CUDA source and the load_inline form's whole module."""

    name: str
    origin: str  # "builtin" or "simple"
    raw_source: str
    inline_module: str


def _module_string(path: Path, name: str) -> str:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = ast.literal_eval(node.value)
            if isinstance(value, str):
                return value
    raise ValueError(f"{path}: no module-level string {name}")


def kernel_pairs() -> list[KernelPair]:
    """The 20 kernels: the built-in examples that have a raw twin, then the simple kernels."""
    pairs = []
    for raw_path in sorted((BUILTIN_DIR / "examples_raw").glob("*.py")):
        inline_path = BUILTIN_DIR / "examples" / raw_path.name
        if inline_path.is_file():
            pairs.append(KernelPair(raw_path.stem, "builtin", _module_string(raw_path, "SOURCE"),
                                    inline_path.read_text()))
    pairs.extend(KernelPair(k.name, "simple", k.raw_source(), k.inline_module()) for k in SIMPLE_KERNELS)
    return pairs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    # --workers: the flag's name before "workers" came to mean an evaluator pool only; still accepted.
    p.add_argument("--threads", "--workers", dest="threads", type=int, default=max(1, usable_cpu_count() // 2),
                   help="load_inline builds in parallel (default: half the cores; each runs 2 ninja jobs)")
    p.add_argument("--time-budget-s", type=float, default=420.0,
                   help="start no new load_inline build after this many seconds")
    p.add_argument("--timeout-s", type=float, default=600.0, help="limit of one load_inline build child")
    p.add_argument("--raw-only", action="store_true", help="only the raw form (no GPU or torch CUDA needed)")
    p.add_argument("--raw-reps", type=int, default=3, help="cache-miss compiles per raw kernel")
    p.add_argument("--arch", default=None,
                   help="target, e.g. 9.0 or sm_90 (default: the local GPU; sm_90 without one in --raw-only)")
    p.add_argument("--inline-levers", choices=("plain", "cudal1"), default="plain",
                   help="plain: load_inline as written; cudal1: the compile service's build levers")
    return p.parse_args(argv)


def resolve_arch(arch: str | None, raw_only: bool) -> str:
    """'X.Y' (TORCH_CUDA_ARCH_LIST form) of the target: --arch, else the local GPU, else 9.0 if raw-only."""
    if arch:
        sm = normalize_arch(arch)[3:]
        return f"{sm[:-1]}.{sm[-1]}" if sm.isdigit() else arch
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor}"
    if raw_only:
        return "9.0"
    raise SystemExit("no CUDA GPU here: pass --arch (e.g. 9.0) or use --raw-only")


def bench_raw(pairs: list[KernelPair], arch: str, reps: int) -> dict[str, Any]:
    """Cache-miss NVRTC builds, sequential; per kernel the median of `reps` builds."""
    target = normalize_arch(arch)
    rows, first_build_s, compiler = [], None, None
    for pair in pairs:
        times, error = [], ""
        for _ in range(reps):
            try:
                result = compile_only(pair.raw_source, arch=target, use_cache=False)
            except Exception as exc:  # noqa: BLE001 - recorded as a failed build, the benchmark goes on
                error = f"{type(exc).__name__}: {str(exc)[:300]}"
                break
            compiler = result.compiler
            if first_build_s is None:
                first_build_s = result.seconds
            times.append(result.seconds)
        rows.append({"name": pair.name, "origin": pair.origin, "ok": not error, "error": error,
                     "build_s": statistics.median(times) if times and not error else None, "reps_s": times})
    return {"arch": target, "compiler": compiler, "first_build_s": first_build_s, "results": rows}


def run_inline_build(pair: KernelPair, scratch: Path, arch: str, levers: str, timeout_s: float) -> dict[str, Any]:
    """One cache-miss load_inline build of `pair`, in an isolated child with a fresh extension directory."""
    from cudal1.eval.compile import BuildLevers, build_environment
    from cudal1.eval.isolated import Limits, run_isolated

    key = f"bench-forms-{pair.name}-{os.getpid()}-{time.time_ns()}"
    env = build_environment(key, arch, cache_dir=scratch)
    payload = {"source": pair.inline_module, "init_inputs": None, "device": "cpu",
               "levers": PLAIN_LEVERS if levers == "plain" else BuildLevers().to_dict()}
    start = time.monotonic()
    out = run_isolated(ENTRY_PREPARE, payload, limits=Limits(timeout_s=timeout_s), env=env)
    value = out.value or {}
    builds = value.get("builds", [])
    ok = bool(value.get("ok")) and bool(builds)
    return {"name": pair.name, "origin": pair.origin, "ok": ok, "n_builds": len(builds),
            "build_s": sum(float(b.get("seconds", 0.0)) for b in builds) if ok else None,
            "wall_s": round(time.monotonic() - start, 3),
            "log": "" if ok else (value.get("log") or out.describe_failure() or "no load_inline call recorded")}


def bench_inline(pairs: list[KernelPair], args: argparse.Namespace, arch: str, started: float,
                 on_progress: Any) -> dict[str, Any]:
    """Parallel cache-miss load_inline builds under the time budget; `on_progress(partial)` after each."""
    scratch = Path(tempfile.mkdtemp(prefix="cudal1-bench-forms-"))
    queue, rows = list(pairs), []
    pending: set[Future] = set()
    pool_start = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        while queue or pending:
            while queue and len(pending) < args.threads and time.monotonic() - started < args.time_budget_s:
                pending.add(pool.submit(run_inline_build, queue.pop(0), scratch, arch, args.inline_levers,
                                        args.timeout_s))
            if not pending:
                break
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            rows.extend(f.result() for f in done)
            on_progress({"results": rows, "not_started": len(queue)})
    return {"levers": args.inline_levers, "threads": args.threads, "scratch_dir": str(scratch),
            "pool_wall_s": round(time.monotonic() - pool_start, 3), "not_started": len(queue),
            "results": rows}


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]


def form_stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """count, failures, median/p90/max build seconds over the successful builds."""
    times = [r["build_s"] for r in rows if r["ok"] and r["build_s"] is not None]
    return {"count": len(rows), "ok": len(times), "failures": sum(not r["ok"] for r in rows),
            "median_s": statistics.median(times) if times else None, "p90_s": _p90(times) if times else None,
            "max_s": max(times) if times else None}


def summarize(raw: dict[str, Any], inline: dict[str, Any] | None) -> dict[str, Any]:
    """Per-form statistics and the ratio of the medians (load_inline over raw)."""
    out = {"raw": form_stats(raw["results"])}
    if inline is not None:
        out["load_inline"] = form_stats(inline["results"])
        a, b = out["load_inline"]["median_s"], out["raw"]["median_s"]
        out["median_ratio_inline_over_raw"] = a / b if a and b else None
    return out


def print_table(summary: dict[str, Any], raw: dict[str, Any], inline: dict[str, Any] | None) -> None:
    def fmt(x: Any, digits: int = 3) -> str:
        return "-" if x is None else f"{x:.{digits}f}"

    print(f"{'form':12} {'count':>5} {'ok':>4} {'fail':>5} {'median_s':>9} {'p90_s':>8} {'max_s':>8}")
    for form in ("raw", "load_inline"):
        if form in summary:
            s = summary[form]
            print(f"{form:12} {s['count']:>5} {s['ok']:>4} {s['failures']:>5} {fmt(s['median_s']):>9} "
                  f"{fmt(s['p90_s']):>8} {fmt(s['max_s']):>8}")
    print(f"raw: {raw['compiler']} for {raw['arch']}, first build of the process {fmt(raw['first_build_s'])} s")
    if inline is not None:
        print(f"load_inline: {inline['levers']} levers, {inline['threads']} in parallel, "
              f"{len(inline['results'])} finished, {inline['not_started']} not started; median ratio "
              f"load_inline/raw {fmt(summary.get('median_ratio_inline_over_raw'), 1)}x")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out_path = args.out_dir / "bench_forms.json"
    arch = resolve_arch(args.arch, args.raw_only)
    pairs = kernel_pairs()
    meta = {"args": {k: str(v) for k, v in vars(args).items()}, "arch": arch, "kernels": len(pairs),
            "date": time.strftime("%Y-%m-%d"), "cpu_count": usable_cpu_count(), "pairs": [
                {k: v for k, v in asdict(p).items() if k in ("name", "origin")} for p in pairs]}

    def write(raw: dict[str, Any], inline: dict[str, Any] | None) -> None:
        out_path.write_text(json.dumps({**meta, "summary": summarize(raw, inline), "raw": raw,
                                        "load_inline": inline}, indent=1))

    raw = bench_raw(pairs, arch, args.raw_reps)
    write(raw, None)
    inline = None
    if not args.raw_only:
        inline = bench_inline(pairs, args, arch, started,
                              lambda partial: write(raw, {"levers": args.inline_levers, **partial}))
        write(raw, inline)
    print(f"{len(pairs)} kernels; JSON: {out_path}", file=sys.stderr)
    print_table(summarize(raw, inline), raw, inline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
