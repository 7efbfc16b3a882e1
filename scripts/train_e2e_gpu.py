"""End-to-end run of all three training stages in one go (meant for one 10-minute call on the H200).

    PYTHONPATH=src python scripts/train_e2e_gpu.py OUT_DIR --release ../shared/data/cuda-l1/h100.jsonl \
        --tasks 4 --minutes 9

What it does:
1. Stage-1 data: the release's optimized kernels for `--tasks` tasks (shortest reference first), each run
   through the hardened evaluator (`evaluate_many`, builds in parallel); only CORRECT ones are kept. With
   `--trusted-jsonl` (rows `task_id`, `code`, optional `status`) precomputed verdicts are used instead.
2. Stage 1 (SFT) of a small Llama trained from scratch with the byte tokenizer (`--model-spec`), on each
   kernel under the plain prompt and under the contrastive prompt showing it as the scored exemplar (stage
   3's format: a model trained from scratch writes parseable answers only to prompts like those it saw).
3. Stage 2: one self-supervised round (sample, evaluate, keep successes, fine-tune).
4. Stage 3: a few contrastive GRPO steps, the exemplar database seeded with the stage-1 kernels.
Each stage gets a share of the time budget and stops cleanly when it is spent. Everything lands in
OUT_DIR (per-stage run directories with config.yaml, log_history.json, summary.json and TensorBoard
events when tensorboard is installed) and OUT_DIR/e2e_summary.json; a short table is printed last.

A CPU dry run (no GPU, tiny model): `--device cpu --source tests/train/fixtures/tasks --trusted-jsonl F
--model-spec scratch --max-length 4096`.
Needs: trl and datasets (wheels on the GPU machine); tested with TRL 1.16 / transformers 5.24 on CPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

logger = logging.getLogger("train_e2e")

DEFAULT_MODEL = "scratch:hidden=512,layers=8,heads=8,intermediate=1536,max_positions=32768"  # ~27M parameters


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--release", type=Path, help="CUDA-L1 JSONL release (tasks and their optimized kernels).")
    p.add_argument("--source", default="", help="Task source for --trusted-jsonl rows (instead of --release).")
    p.add_argument("--trusted-jsonl", type=Path, help="Precomputed verdicts: rows task_id, code[, status].")
    p.add_argument("--tasks", type=int, default=4, help="Number of tasks.")
    p.add_argument("--minutes", type=float, default=9.0, help="Total wall-clock budget.")
    p.add_argument("--time-budget-s", type=float, default=0.0, help="Per-stage budget (default: from --minutes).")
    p.add_argument("--model-spec", default=DEFAULT_MODEL, help="Model trained from scratch.")
    p.add_argument("--device", default="auto", help="Evaluator device (auto, cuda, cpu).")
    p.add_argument("--max-length", type=int, default=16384, help="SFT max sequence length (byte tokens).")
    p.add_argument("--sft-steps", type=int, default=2000, help="Upper bound; the stage budget usually ends SFT first.")
    p.add_argument("--grpo-steps", type=int, default=12, help="Upper bound; the stage budget usually ends GRPO first.")
    p.add_argument("--completion-tokens", type=int, default=2048,
                   help="Sampled completion length (stages 2, 3); byte tokens, so it must cover a whole kernel.")
    p.add_argument("--temperature", type=float, default=0.7,
                   help="Sampling temperature of stages 2 and 3 (a 1,500-byte kernel sampled at 1.0 rarely "
                        "survives intact, even from a model that has memorised it).")
    p.add_argument("--top-p", type=float, default=0.9,
                   help="Nucleus mass of stages 2 and 3: cuts the rare bytes that derail a memorised kernel (at "
                        "0.7 and no nucleus, 0 of 24 samples on the H200 were correct).")
    return p.parse_args(argv)


def collect_trusted(args: argparse.Namespace, budget_s: float) -> tuple[list, list[dict]]:
    """(tasks, rows of correct kernels) from the release (evaluated now) or a trusted JSONL."""
    from cudal1.eval import EvalConfig, Status, evaluate_many
    from cudal1.tasks import load_release, load_tasks

    if args.trusted_jsonl:
        tasks = {t.id: t for t in load_tasks(args.source)} if args.source else {}
        rows = [json.loads(line) for line in args.trusted_jsonl.read_text().splitlines() if line.strip()]
        rows = [r for r in rows if r.get("status", "correct") == "correct" and r["task_id"] in tasks]
        chosen = list(dict.fromkeys(r["task_id"] for r in rows))[:args.tasks]
        return [tasks[i] for i in chosen], [r for r in rows if r["task_id"] in chosen]
    pairs = [(t, c) for t, c in load_release(args.release) if c is not None]
    pairs.sort(key=lambda p: len(p[0].source) + len(p[1].source))  # short ones: cheap to build and to train on
    pairs = pairs[:2 * args.tasks]
    cfg = EvalConfig(device=args.device, correctness_trials=3, buckets=3, target_bucket_ms=20.0,
                     timeout_s=min(120.0, budget_s), build_timeout_s=max(60.0, budget_s))
    results = evaluate_many([(t, c.source) for t, c in pairs], cfg)
    rows = [{"task_id": t.id, "code": c.source, "ref_code": t.source, "speedup": r.speedup}
            for (t, c), r in zip(pairs, results, strict=True) if r.status is Status.CORRECT][:args.tasks]
    for (t, _), r in zip(pairs, results, strict=True):
        logger.info("release kernel %s: %s %s", t.id, r.status.value, r.message[:100])
    by_id = {t.id: t for t, _ in pairs}
    return [by_id[r["task_id"]] for r in rows], rows


def report_to() -> str:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return "none"
    return "tensorboard"


def common(args: argparse.Namespace, out: Path, stage: str, budget_s: float) -> dict:
    import torch

    # save_steps: no mid-run checkpoints, the run is too short to resume (the final model is always saved).
    return {"output_dir": str(out / stage), "source": args.source or "builtin", "split": "all", "store": "none",
            "report_to": report_to(), "eval_device": args.device, "eval_trials": 3, "eval_buckets": 3,
            "eval_timeout_s": 120.0, "time_budget_s": budget_s, "bf16": torch.cuda.is_available(),
            "use_cpu": not torch.cuda.is_available(), "logging_steps": 1, "save_steps": 100_000,
            "warmup_ratio": 0.0, "lr_scheduler_type": "constant", "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": 1, "eval_threads": 8}


def stage1_rows(tasks: list, rows: list[dict], prompt_token_budget: int) -> list[dict]:
    """Stage-1 SFT rows: each kernel under the plain prompt, and under the contrastive prompt that shows it as
    the one scored exemplar (stage 3's format; a model trained from scratch knows only the formats it saw)."""
    from cudal1.exemplars.db import ScoredCode
    from cudal1.llm.prompts import build_contrastive_prompt
    from cudal1.train.common import fenced

    by_id = {t.id: t for t in tasks}
    plain = [{"task_id": r["task_id"], "code": r["code"], "ref_code": r.get("ref_code") or by_id[r["task_id"]].source}
             for r in rows]
    contrastive = [{"prompt": build_contrastive_prompt(by_id[r["task_id"]].source,
                                                       [ScoredCode(r["code"], float(r.get("speedup") or 1.0))],
                                                       token_budget=prompt_token_budget),
                    "completion": [{"role": "assistant", "content": fenced(r["code"])}], "task_id": r["task_id"]}
                   for r in rows]
    return plain + contrastive


#: Kept back from the last stage: a GRPO step that starts before the deadline still finishes (16 s on the
#: H200 with 4 generations of ~1,300 tokens; the budget is checked between steps), then the policy is saved.
FINAL_MARGIN_S = 40.0


def run_stages(args: argparse.Namespace, tasks: list, rows: list[dict], stage_s: float,
               deadline: float | None = None) -> dict:
    """Stages 1-3 in order; returns one summary dict per stage. With `deadline` (a `time.monotonic()` value)
    stage 3 gets whatever is left before it (a stage-2 round often ends early), at least 30 s."""
    from cudal1.exemplars import ExemplarDB
    from cudal1.train.config import RLStageConfig, SelfSupervisedConfig, SFTStageConfig, load_config
    from cudal1.train.rl import run_rl
    from cudal1.train.self_supervised import run_self_supervised
    from cudal1.train.sft import run_sft

    out = args.out_dir
    data = out / "stage1.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in stage1_rows(tasks, rows, args.max_length // 2)))
    sft = run_sft(load_config(SFTStageConfig, None, {
        **common(args, out, "sft", stage_s), "model": args.model_spec, "dataset": str(data),
        "max_steps": args.sft_steps, "max_length": args.max_length, "learning_rate": 1e-3,
        "eval_fraction": 0.0, "gradient_checkpointing": True}), tasks=tasks)
    ss = run_self_supervised(load_config(SelfSupervisedConfig, None, {
        **common(args, out, "self_supervised", stage_s), "model": sft.final_model_dir, "rounds": 1,
        "samples_per_task": 4, "max_new_tokens": args.completion_tokens, "temperature": args.temperature,
        "top_p": args.top_p,
        "generation_batch_size": 8, "max_steps": 4, "max_length": args.max_length, "learning_rate": 1e-4}), tasks=tasks)
    db = ExemplarDB(out / "exemplars.sqlite")
    for r in rows:
        db.add(r["task_id"], r["code"], float(r.get("speedup") or 1.0), {"model": "cuda-l1-release"})
    rl_s = stage_s if deadline is None else max(30.0, deadline - time.monotonic() - FINAL_MARGIN_S)
    rl = run_rl(load_config(RLStageConfig, None, {
        **common(args, out, "rl", rl_s), "model": ss.final_model_dir, "num_generations": 4,
        "per_device_train_batch_size": 4, "max_steps": args.grpo_steps,
        "max_completion_length": args.completion_tokens, "temperature": args.temperature, "top_p": args.top_p,
        "learning_rate": 1e-5, "beta": 0.01,
        "exemplar_db": str(out / "exemplars.sqlite"), "prompt_token_budget": args.max_length // 2}), tasks=tasks)
    return {"sft": sft.summary, "self_supervised": ss.summary, "rl": rl.summary}


def _per_batch(rl: dict, key: str) -> str:
    values = [b.get(key) for b in rl.get("reward_batches") or []]
    return " ".join("-" if v is None else f"{v:.2f}" for v in values) or "-"


def print_table(summary: dict) -> None:
    sft, ss, rl = summary["stages"]["sft"], summary["stages"]["self_supervised"], summary["stages"]["rl"]
    last_round = (ss.get("rounds") or [{}])[-1]
    rows = [("tasks / stage-1 kernels", f"{summary['tasks']} / {summary['kernels']}"),
            ("stage 1 loss first -> last", f"{sft.get('first_loss')} -> {sft.get('last_loss')}"),
            ("stage 2 success rate", f"{last_round.get('success_rate')}"),
            ("stage 3 raw reward first -> last", f"{rl.get('raw_reward_first')} -> {rl.get('raw_reward_last')}"),
            ("stage 3 raw reward per batch", _per_batch(rl, "raw_reward_mean")),
            ("stage 3 success rate per batch", _per_batch(rl, "success_rate")),
            ("stage 3 steps", f"{rl.get('steps')}"), ("wall s", f"{summary['wall_s']:.0f}")]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.release and not args.trusted_jsonl:
        print("give --release PATH or --trusted-jsonl PATH (with --source)", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        handlers=[logging.FileHandler(args.out_dir / "e2e.log"), logging.StreamHandler()])
    started = time.monotonic()
    total_s = args.minutes * 60
    tasks, rows = collect_trusted(args, budget_s=0.3 * total_s)
    if not rows:
        print("no kernel passed the evaluator; nothing to train on", file=sys.stderr)
        return 1
    left_s = total_s - (time.monotonic() - started)
    stage_s = args.time_budget_s or max(30.0, left_s / 3.5)
    stages = run_stages(args, tasks, rows, stage_s, deadline=None if args.time_budget_s else started + total_s)
    summary = {"tasks": len(tasks), "kernels": len(rows), "stage_budget_s": stage_s, "stages": stages,
               "wall_s": time.monotonic() - started}
    (args.out_dir / "e2e_summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print_table(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
