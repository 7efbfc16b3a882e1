"""Scale-out check: the same candidate set evaluated on one GPU and on every local GPU through one pool.

Goal: throughput ratio (2 GPUs / 1 GPU) >= 1.8x, verdicts identical.

    python scripts/bench_pool.py OUT_DIR [--candidates-from builtin-examples|RELEASE.jsonl] [--n N]
           [--workers ray|local] [--timeout-s S]

Runs the Ray pool (one actor per GPU) when ray is installed, else the local pool. Both runs skip the
results store (every candidate is really evaluated) and `load_inline` candidates are built once before
either run, so that neither run pays the builds. Writes OUT_DIR/bench_pool.json (per-candidate verdicts
of both runs, wall times, ratio) and prints a short summary last.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

from cudal1.core.types import EvalResult
from cudal1.eval.config import EvalConfig
from cudal1.tasks.task import Task


def load_pairs(spec: str, device_type: str, n: int | None) -> list[tuple[Task, str]]:
    """(task, candidate source) pairs from the built-in examples or a JSONL release."""
    if spec == "builtin-examples":
        from cudal1.tasks.sources import example_candidates

        pairs = [(task, source) for task, _, source in example_candidates(device_type)]
    else:
        from cudal1.tasks.sources import load_candidates

        pairs = [(task, cand.source) for task, cand in load_candidates(spec) if cand is not None]
    return pairs[:n] if n else pairs


def make_bench_pool(workers: str, n_gpus: int, config: EvalConfig) -> Any:
    """A pool on the first `n_gpus` GPUs (Ray actors, or local slots)."""
    if workers == "ray":
        from cudal1.service.ray_pool import RayPool, RayPoolConfig

        # Actor output goes to the driver's stderr: a failing actor is otherwise silent here.
        return RayPool(config, RayPoolConfig(address=None, n_actors=n_gpus,
                                             init_kwargs={"num_gpus": n_gpus, "log_to_driver": True},
                                             trace_calls=True))
    from cudal1.service.pool import LocalPool, LocalPoolConfig

    return LocalPool(config, LocalPoolConfig(devices=tuple(f"cuda:{i}" for i in range(n_gpus))))


def save_ray_logs(out_dir: Path, max_bytes: int = 20_000) -> Path:
    """The tail of every log of the current Ray session, in one archive OUT_DIR/ray_logs.tar.gz (for a stuck
    run; one file, so it survives copy tools that limit the number of files)."""
    try:
        import ray

        session = Path(ray._private.worker._global_node.get_session_dir_path())  # noqa: SLF001 - no public API
    except Exception:  # noqa: BLE001 - best effort, never hides the real failure
        session = Path("/tmp/ray/session_latest")
    archive = out_dir / "ray_logs.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for log in sorted((session / "logs").glob("*")):
            if log.is_file() and log.stat().st_size:
                with open(log, "rb") as f:
                    f.seek(max(0, log.stat().st_size - max_bytes))
                    data = f.read()
                info = tarfile.TarInfo(f"ray_logs/{log.name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return archive


def close_within(pool: Any, workers: str, timeout_s: float = 30.0) -> None:
    """Close the pool, but never hang the benchmark on a stuck actor: give up after `timeout_s`."""
    closer = threading.Thread(target=pool.close, daemon=True)
    closer.start()
    closer.join(timeout_s)
    if closer.is_alive():
        print(f"pool.close() did not return within {timeout_s:.0f} s; leaving it", file=sys.stderr)
    if workers == "ray":
        import ray

        ray.shutdown()


def warm_up_every_slot(pool: Any, n_slots: int, pair: tuple[Task, str], timeout_s: float, rounds: int = 4) -> None:
    """Start-up (actors, CUDA, warm workers) off the clock on every GPU, on a candidate without a build (a
    stuck run then tells start-up problems apart from build problems). Each round submits one item per slot
    not warmed yet, each avoiding the next slot (the pool puts it on the shortest remaining lane); which slot
    ran it is checked, since an idle slot may take more than its share."""
    task, source = pair
    t0, warmed = time.monotonic(), set()
    for _ in range(rounds):
        missing = [i for i in range(n_slots) if i not in warmed]
        if not missing:
            break
        futures = [pool.submit(task, source, force=True, avoid_slot=(i + 1) % n_slots if n_slots > 1 else None)
                   for i in missing]
        verdicts = [f.result(timeout=timeout_s).status.value for f in futures]
        warmed |= {f.slot for f in futures if f.slot is not None}
        print(f"[{n_slots} GPU] warm-up {task.id}: {verdicts}, slots warm {sorted(warmed)}, "
              f"{time.monotonic() - t0:.1f} s", flush=True)
    if len(warmed) < n_slots:
        print(f"[{n_slots} GPU] slots {sorted(set(range(n_slots)) - warmed)} not warmed: their start-up is timed",
              flush=True)


def timed_run(workers: str, n_gpus: int, pairs: list[tuple[Task, str]], config: EvalConfig,
              out_dir: Path, timeout_s: float) -> dict[str, Any]:
    """Evaluate every pair on `n_gpus` GPUs; wall time excludes pool start-up."""
    from cudal1.eval.pipeline import uses_load_inline

    pool = make_bench_pool(workers, n_gpus, config)
    try:
        warm_up_every_slot(pool, n_gpus, next((p for p in pairs if not uses_load_inline(p[1])), pairs[0]),
                           timeout_s)
        started = time.monotonic()
        futures = [pool.submit(task, source, force=True) for task, source in pairs]
        results: list[EvalResult] = []
        for (task, _), f in zip(pairs, futures, strict=True):
            results.append(f.result(timeout=max(1.0, started + timeout_s - time.monotonic())))
            print(f"[{n_gpus} GPU] {time.monotonic() - started:6.1f} s {task.id}: {results[-1].status.value}",
                  flush=True)
        wall_s = time.monotonic() - started
    except TimeoutError:
        where = ""
        if workers == "ray":
            try:
                where = f" (Ray logs: {save_ray_logs(out_dir)})"
            except OSError as exc:  # never hide the timeout behind a log-copying error
                where = f" (Ray logs not saved: {exc})"
        raise SystemExit(f"{workers} pool on {n_gpus} GPU(s): no result within {timeout_s:.0f} s{where}") from None
    finally:
        close_within(pool, workers)
    return {"n_gpus": n_gpus, "wall_s": wall_s, "per_s": len(pairs) / wall_s,
            "verdicts": [r.status.value for r in results], "speedups": [r.speedup for r in results]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--candidates-from", default="builtin-examples")
    parser.add_argument("--n", type=int, default=None, help="At most this many candidates.")
    parser.add_argument("--workers", choices=("ray", "local", "auto"), default="auto")
    parser.add_argument("--buckets", type=int, default=7)
    parser.add_argument("--timeout-s", type=float, default=300.0, help="Per run (start-up, then all candidates).")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    import torch

    n_gpus = torch.cuda.device_count()
    if n_gpus < 2:
        print(f"needs >= 2 GPUs, found {n_gpus}", file=sys.stderr)
        return 2
    workers = args.workers
    if workers == "auto":
        try:
            import ray  # noqa: F401

            workers = "ray"
        except ImportError:
            workers = "local"
    config = EvalConfig(device="cuda", buckets=args.buckets)
    pairs = load_pairs(args.candidates_from, "cuda", args.n)
    from cudal1.eval.scheduler import prebuild

    prebuild(list(pairs), config.resolved("cuda"))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    one = timed_run(workers, 1, pairs, config, args.out_dir, args.timeout_s)
    (args.out_dir / "bench_pool_one_gpu.json").write_text(json.dumps(one, indent=2))  # kept if the next run dies
    many = timed_run(workers, n_gpus, pairs, config, args.out_dir, args.timeout_s)
    mismatches = [{"task_id": t.id, "one": a, "many": b}
                  for (t, _), a, b in zip(pairs, one["verdicts"], many["verdicts"], strict=True) if a != b]
    summary = {"workers": workers, "n_candidates": len(pairs), "source": args.candidates_from,
               "gpu": torch.cuda.get_device_name(0), "one_gpu": one, "all_gpus": many,
               "throughput_ratio": many["per_s"] / one["per_s"], "verdicts_match": not mismatches,
               "mismatches": mismatches, "task_ids": [t.id for t, _ in pairs]}
    (args.out_dir / "bench_pool.json").write_text(json.dumps(summary, indent=2))
    print(f"{len(pairs)} candidates via {workers}: 1 GPU {one['wall_s']:.1f} s, {n_gpus} GPUs "
          f"{many['wall_s']:.1f} s, throughput ratio {summary['throughput_ratio']:.2f}x (goal >= 1.8x); "
          f"verdicts match: {not mismatches} ({len(mismatches)} differ)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
