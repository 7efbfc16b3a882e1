#!/usr/bin/env python3
"""Benchmark: candidates evaluated per GPU-hour, end to end in `optimize`, raw-CUDA form vs load_inline form.

Usage: python scripts/bench_optimize.py OUT_DIR [--tasks 2] [--samples 4] [--rounds 2] [--time-budget-s 600]
                                        [--forms raw_cuda,load_inline] [--device cuda]

For each form, `cudal1.loops.optimize` runs on the first N built-in tasks that have scripted kernels
(swish_beta, softmax_manual_lastdim) against a local scripted OpenAI-compatible server. The server answers
with the real kernels of `tests/fixtures/scripted/gpu/<form>/` (a compile error, an off-by-one, a slow
and a fast kernel, in rotation), each made unique by a comment inside its CUDA source, so every candidate
is really built (NVRTC for raw_cuda, nvcc + torch headers for load_inline) and evaluated: nothing comes
from a cache (each form gets a fresh results store and build cache under OUT_DIR). Both forms run the same
work, `--rounds` x `--samples` candidates per task, every round to the end (a time budget inside
`optimize` would drop the builds still running when it expires and undercount the slow form);
`--time-budget-s` only skips the remaining tasks of a form once spent. One GPU: GPU-hours = wall-clock
hours of the optimize calls.

Writes OUT_DIR/bench_optimize.json (per form and task: candidates, verdicts, wall time, best speedup) and
prints a short table last, with the ratio raw_cuda / load_inline.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from cudal1.eval import EvalConfig  # noqa: E402
from cudal1.llm import LLMConfig  # noqa: E402
from cudal1.loops.augment import format_answer  # noqa: E402
from cudal1.loops.optimize import OptimizeConfig, optimize  # noqa: E402
from cudal1.store import ResultsStore  # noqa: E402
from cudal1.tasks import find_task  # noqa: E402
from tests.helpers.scripted_server import ScriptedOpenAIServer  # noqa: E402

KERNELS = ROOT / "tests" / "fixtures" / "scripted" / "gpu"
TASKS = ("swish_beta", "softmax_manual_lastdim")
VARIANTS = ("compile_error", "incorrect", "slow", "fast")
SOURCE_OPENERS = {"raw_cuda": 'SOURCE = r"""\n', "load_inline": 'CUDA_SRC = r"""\n'}


def variant_source(form: str, task: str, variant: str, index: int) -> str:
    """The scripted kernel with a unique comment inside its CUDA source (a distinct build every time)."""
    text = (KERNELS / form / f"{task}__{variant}.py").read_text()
    opener = SOURCE_OPENERS[form]
    if opener not in text:
        raise SystemExit(f"{form}/{task}__{variant}.py has no {opener.strip()!r}")
    return text.replace(opener, f"{opener}// bench variant {index}\n", 1)


def make_script(form: str, task: str):
    def script(index: int, body: dict) -> str:
        variant = VARIANTS[index % len(VARIANTS)]
        code = variant_source(form, task, variant, index)
        return format_answer(code, analysis=f"Scripted answer {index} ({variant}).", design="Scripted.")
    return script


def run_form(form: str, args: argparse.Namespace, out_dir: Path) -> dict:
    """Optimize every task in `form`; candidates evaluated and wall time per task and in total."""
    form_dir = out_dir / form
    form_dir.mkdir(parents=True, exist_ok=True)
    os.environ["CUDAL1_CACHE_DIR"] = str(form_dir / f"cache-{int(time.time())}")  # cold builds
    eval_cfg = EvalConfig(device=args.device, sizes="full", correctness_trials=2, buckets=3, target_bucket_ms=20,
                          warm_buckets=0)
    form_started = time.monotonic()
    rows = []
    with ResultsStore(form_dir / f"results-{int(time.time())}.sqlite") as store:
        for name in TASKS[:args.tasks]:
            if rows and time.monotonic() - form_started > args.time_budget_s:
                print(f"[{form}] time budget spent; skipping {name}", flush=True)
                break
            task = find_task(f"builtin/level1/{name}")
            with ScriptedOpenAIServer(make_script(form, name)) as server:
                config = OptimizeConfig(
                    llm=LLMConfig(spec=f"openai:scripted@{server.base_url}", max_retries=0),
                    rounds=args.rounds, samples=args.samples, form=form, eval=eval_cfg, baselines="none",
                    seed_from_store=False, resume=False, time_budget_s=0.0,
                    out=str(form_dir / f"{name}_best.py"), exemplar_db=str(form_dir / f"exemplars-{name}.sqlite"))
                started = time.monotonic()
                result = optimize(task, config, store=store)
                wall_s = time.monotonic() - started
            verdicts: dict[str, int] = {}
            for h in result.history:
                for status, n in h.statuses.items():
                    verdicts[status] = verdicts.get(status, 0) + n
            rows.append({"task": name, "candidates": result.evaluated, "wall_s": wall_s, "verdicts": verdicts,
                         "best_speedup": result.best_speedup, "stopped": result.stopped})
            print(f"[{form}] {name}: {result.evaluated} candidates in {wall_s:.1f} s, verdicts {verdicts}, "
                  f"best {result.best_speedup}", flush=True)
    candidates = sum(r["candidates"] for r in rows)
    wall_s = sum(r["wall_s"] for r in rows)
    return {"form": form, "tasks": rows, "candidates": candidates, "wall_s": wall_s,
            "per_gpu_hour": candidates / (wall_s / 3600.0) if wall_s > 0 else None}


def _ratio(results: dict[str, dict]) -> float | None:
    raw, inline = results.get("raw_cuda"), results.get("load_inline")
    return (raw["per_gpu_hour"] / inline["per_gpu_hour"]
            if raw and inline and raw["per_gpu_hour"] and inline["per_gpu_hour"] else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--tasks", type=int, default=2, help=f"How many of {', '.join(TASKS)}.")
    parser.add_argument("--samples", type=int, default=4, help="Completions per round.")
    parser.add_argument("--rounds", type=int, default=2, help="Rounds per task.")
    parser.add_argument("--time-budget-s", type=float, default=600.0,
                        help="Per form: no new task starts after this (running rounds always finish).")
    parser.add_argument("--forms", default="raw_cuda,load_inline", help="Comma list of forms to run.")
    parser.add_argument("--device", default="cuda", help="cuda or cuda:N (the kernels need a GPU).")
    args = parser.parse_args(argv)
    if not 1 <= args.tasks <= len(TASKS):
        parser.error(f"--tasks must be 1..{len(TASKS)}")
    import torch

    if not torch.cuda.is_available():
        print("bench_optimize needs a CUDA GPU (the scripted kernels are real CUDA)", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    results: dict[str, dict] = {}
    for form in forms:
        results[form] = run_form(form, args, args.out_dir)
        report = {"gpu": torch.cuda.get_device_name(), "args": {k: str(v) for k, v in vars(args).items()},
                  "forms": results, "ratio_raw_over_load_inline": _ratio(results)}
        (args.out_dir / "bench_optimize.json").write_text(json.dumps(report, indent=2))  # kept if killed later
    ratio = _ratio(results)
    print(f"\n{'form':<12} {'candidates':>10} {'wall s':>8} {'per GPU-hour':>13}")
    for form, r in results.items():
        per_hour = f"{r['per_gpu_hour']:.0f}" if r["per_gpu_hour"] else "-"
        print(f"{form:<12} {r['candidates']:>10} {r['wall_s']:>8.1f} {per_hour:>13}")
    print(f"ratio raw_cuda / load_inline: {ratio:.1f}x" if ratio else "ratio: -")
    return 0


if __name__ == "__main__":
    sys.exit(main())
