"""The study on a CPU: pre-train once, then every arm of every seed, resumable; and the summary with its CIs.

`run_seed` writes `OUT/seeds/seed<N>.json` after every arm (a seed or an arm already there is skipped, so an
interrupted study resumes where it stopped). `summarize` reads every seed file and writes the results: per
arm and seed the held-out curve (fraction of each task's best found after 4 ... 64 evaluations, mean over
held-out tasks), the one-shot metrics, the training curves of the RL arms, 95 % CIs over seeds per arm and
paired by seed for the contrasts, the task split and the table's provenance (with the table itself and the
spot-check's agreement with the evaluator).
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cudal1.study.arms import ARMS, Protocol, curve, sampled_with_exemplars, search, train_grpo
from cudal1.study.improver import ImproverSize, pretrain
from cudal1.study.ops import task_by_id
from cudal1.study.stats import mean_ci, paired_ci, prediction_interval
from cudal1.study.table import Table

logger = logging.getLogger(__name__)

#: The contrasts reported with paired CIs: (arm, minus this arm).
CONTRASTS = (("grpo-bucket", "grpo-plain"), ("grpo-bucket", "grpo-shuffled"), ("grpo-bucket", "grpo-random"),
             ("grpo-bucket", "evolution"), ("evolution", "sft-only"), ("evolution", "random-search"),
             ("grpo-plain", "sft-only"))
PRIMARY = "held_out_auc"


def _tasks(table: Table, ids: list[str]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    by_id = task_by_id()
    return ({tid: by_id[tid].to_task() for tid in ids},
            {tid: list(table.tasks[tid]["features"]) for tid in table.tasks})


def run_arm(arm: str, table: Table, start: Path, protocol: Protocol, seed: int, work_dir: Path) -> dict[str, Any]:
    """One arm of one seed (see arms.py): training (RL arms), the held-out search, the one-shot samples."""
    from cudal1.train.models import load_policy

    train_ids, held_ids = table.split()
    train, features = _tasks(table, train_ids)
    held, _ = _tasks(table, held_ids)
    trains, style = ARMS[arm]
    started = time.monotonic()
    record: dict[str, Any] = {}
    policy = None
    if trains == "grpo":
        model, tok, record["training"] = train_grpo(start, table, train, features, style, protocol, seed,
                                                    work_dir / "train")
        policy = (model, tok)
    elif style != "uniform":
        policy = load_policy(str(start))
    runs = search(table, held, features, style, protocol, seed, work_dir, policy)
    record["held_out"] = {tid: {"curve": curve(table, tid, run.evaluated, protocol.checkpoints),
                                "evaluations": len(run.evaluated), "samples": run.samples,
                                "correct_rate": round(statistics.fmean(table.speedup(tid, r) > 0
                                                                       for r in run.evaluated), 5)}
                          for tid, run in runs.items()}
    record["one_shot"] = sampled_with_exemplars(table, held, features, style, protocol, seed, work_dir, policy)
    record["seconds"] = round(time.monotonic() - started, 1)
    return record


def run_seed(out_dir: Path, table: Table, seed: int, *, arms: list[str], protocol: Protocol, start: Path) -> Path:
    """Every arm of one seed into `out_dir/seeds/seed<seed>.json` (resumable: done arms are skipped)."""
    path = out_dir / "seeds" / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.is_file() else {"seed": seed, "arms": {}}
    for arm in arms:
        if arm in data["arms"]:
            continue
        record = run_arm(arm, table, start, protocol, seed, out_dir / "work" / f"seed{seed}" / arm)
        data["arms"][arm] = record
        path.write_text(json.dumps(data))
        at_budget = statistics.fmean(e["curve"][-1] for e in record["held_out"].values())
        logger.info("seed %d %s: held-out best at budget %.3f of the best (%.0f s)", seed, arm, at_budget,
                    record["seconds"])
    return path


def run_study(out_dir: Path, table_path: Path, seeds: list[int], *, arms: list[str] | None = None,
              protocol: Protocol | None = None, pretrain_examples: int = 40000, size: ImproverSize | None = None,
              allow_surrogate: bool = False) -> Path:
    """Pre-train (once, cached in OUT/pretrain), then run each seed; returns the seeds' folder."""
    import torch

    protocol = protocol or Protocol()
    size = size or ImproverSize()

    torch.set_num_threads(1)
    table = Table.load(table_path)
    if table.kind != "measured" and not allow_surrogate:
        raise ValueError(f"{table_path} is a {table.kind} table: results come from a measured one "
                         "(pass allow_surrogate for a pipeline test)")
    problems = table.problems()
    if problems:
        raise ValueError(f"{table_path}: {problems[0]} (and {len(problems) - 1} more problems)")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    start = pretrain(out_dir / "pretrain", seed=0, examples=pretrain_examples, size=size)
    record_path = out_dir / "protocol.json"
    if not record_path.is_file():  # once: the pre-trained improver's check on synthetic landscapes
        from cudal1.study.improver import exemplar_reading
        from cudal1.train.models import load_policy

        record_path.write_text(json.dumps({
            "protocol": asdict(protocol), "improver": asdict(size), "pretrain_examples": pretrain_examples,
            "table": str(table_path), "table_kind": table.kind,
            "improver_exemplar_reading_synthetic": exemplar_reading(*load_policy(str(start)))}, indent=1))
    logger.info("pre-trained improver ready (%.0f s)", time.monotonic() - started)
    for seed in seeds:
        run_seed(out_dir, table, seed, arms=arms or list(ARMS), protocol=protocol, start=start)
    return out_dir / "seeds"


def _mean_curve(record: dict[str, Any]) -> list[float]:
    curves = [e["curve"] for e in record["held_out"].values()]
    return [round(statistics.fmean(c[i] for c in curves), 5) for i in range(len(curves[0]))]


def seed_metrics(record: dict[str, Any]) -> dict[str, Any]:
    """One arm-seed's metrics (the docstring of scripts/contrastive_study.py defines them)."""
    held = record["held_out"]
    one = record["one_shot"].values()
    mean_curve = _mean_curve(record)
    out = {"held_out_curve": mean_curve, "held_out_best_at_budget": mean_curve[-1],
           PRIMARY: round(statistics.fmean(mean_curve[1:]), 5),  # the checkpoints after the seeded evaluations
           "held_out_correct_rate": round(statistics.fmean(e["correct_rate"] for e in held.values()), 5),
           "held_out_samples": round(statistics.fmean(e["samples"] for e in held.values()), 2),
           "held_out_evaluations": round(statistics.fmean(e["evaluations"] for e in held.values()), 2),
           "one_shot_fraction_of_best": round(statistics.fmean(e["fraction_of_best"] for e in one), 5),
           "one_shot_correct_rate": round(statistics.fmean(e["correct_rate"] for e in one), 5)}
    if "training" in record:
        steps = record["training"]["steps"]
        window = max(1, len(steps) // 10)
        out["train_fraction_of_best_first"] = round(statistics.fmean(s["fraction_of_best"] for s in steps[:window]), 5)
        out["train_fraction_of_best_last"] = round(statistics.fmean(s["fraction_of_best"] for s in steps[-window:]), 5)
        out["train_curve"] = [s["fraction_of_best"] for s in steps]
    return out


def summarize(out_dir: Path, table_path: Path, spotcheck_path: Path | None = None) -> dict[str, Any]:
    """Every seed file into the study's results (module docstring); written to OUT/contrastive_study.json,
    with the spot-check's agreement (`spotcheck.json` beside the table, or `spotcheck_path`) when there is one."""
    table = Table.load(table_path)
    seeds = [json.loads(p.read_text()) for p in sorted((out_dir / "seeds").glob("seed*.json"))]
    arms = [a for a in ARMS if all(a in s["arms"] for s in seeds)]
    per_seed = {arm: {s["seed"]: seed_metrics(s["arms"][arm]) for s in seeds} for arm in arms}
    scalars = ("held_out_best_at_budget", "held_out_auc", "held_out_correct_rate", "held_out_samples",
               "held_out_evaluations", "one_shot_fraction_of_best", "one_shot_correct_rate",
               "train_fraction_of_best_last")
    results: dict[str, Any] = {}
    for arm in arms:
        values = list(per_seed[arm].values())
        results[arm] = {k: mean_ci([v[k] for v in values]) for k in scalars if k in values[0]}
        results[arm]["held_out_curve"] = [round(statistics.fmean(v["held_out_curve"][i] for v in values), 5)
                                          for i in range(len(values[0]["held_out_curve"]))]
    contrasts = {}
    for a, b in CONTRASTS:
        if a in per_seed and b in per_seed:
            common = sorted(set(per_seed[a]) & set(per_seed[b]))
            contrasts[f"{a} - {b}"] = {k: paired_ci([per_seed[a][s][k] for s in common],
                                                    [per_seed[b][s][k] for s in common])
                                       for k in ("held_out_best_at_budget", "held_out_auc", "one_shot_fraction_of_best")}
    protocol = json.loads((out_dir / "protocol.json").read_text())
    train_ids, held_ids = table.split()
    summary = {"table_kind": table.kind, "protocol": protocol, "seeds": [s["seed"] for s in seeds],
               "split": {"train": train_ids, "held_out": held_ids,
                         "held_out_families": sorted({table.tasks[t]["family"] for t in held_ids})},
               "arms": results, "contrasts": contrasts, "per_seed": per_seed,
               "landscapes": {tid: table.landscape(tid) for tid in table.tasks},
               "table": {"provenance": table.data.get("provenance", {}), "path": str(table_path),
                         "cells": table.data}}
    spotcheck_path = spotcheck_path or Path(table_path).parent / "spotcheck.json"
    if spotcheck_path.is_file():
        summary["table"]["spotcheck"] = json.loads(spotcheck_path.read_text())
    (out_dir / "contrastive_study.json").write_text(json.dumps(summary, indent=1))
    return summary


def markdown_table(summary: dict[str, Any]) -> str:
    """The results as a Markdown table (mean [95 % CI] over seeds)."""
    def fmt(ci: dict[str, Any] | None) -> str:
        if not ci or ci.get("mean") is None:
            return "-"
        if ci.get("lo") is None:
            return f"{ci['mean']:.3f}"
        return f"{ci['mean']:.3f} [{ci['lo']:.3f}, {ci['hi']:.3f}]"

    lines = ["| arm | held-out: best found @ budget (fraction of best) | held-out AUC | one-shot fraction of best "
             "(k exemplars) | one-shot correct rate |", "|---|---|---|---|---|"]
    for arm, r in summary["arms"].items():
        lines.append(f"| {arm} | {fmt(r.get('held_out_best_at_budget'))} | {fmt(r.get('held_out_auc'))} | "
                     f"{fmt(r.get('one_shot_fraction_of_best'))} | {fmt(r.get('one_shot_correct_rate'))} |")
    lines += ["", "| contrast (paired by seed) | best found @ budget | AUC | one-shot |", "|---|---|---|---|"]
    for name, c in summary["contrasts"].items():
        lines.append(f"| {name} | {fmt(c['held_out_best_at_budget'])} | {fmt(c['held_out_auc'])} | "
                     f"{fmt(c['one_shot_fraction_of_best'])} |")
    return "\n".join(lines)


def against(summary: dict[str, Any], committed: dict[str, Any], metric: str = PRIMARY) -> dict[str, Any]:
    """Each arm's `metric` in this run, per seed, against the 95 % prediction interval of the committed
    study's seeds (`stats.prediction_interval`). A seed re-runs bit for bit only on the same machine and
    libraries; elsewhere the pre-training and GRPO numerics differ, so it is a new draw from the same spread."""
    out: dict[str, Any] = {}
    for arm, seeds in summary["per_seed"].items():
        earlier = committed.get("per_seed", {}).get(arm)
        if not earlier:
            continue
        spread = [v[metric] for v in earlier.values()]
        lo, hi = prediction_interval(spread)
        now = [v[metric] for v in seeds.values()]
        out[arm] = {"now": now, "committed_seeds": len(spread), "interval": [round(lo, 4), round(hi, 4)],
                    "inside": all(lo <= v <= hi for v in now)}
    return out
