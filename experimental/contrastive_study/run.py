"""The study on a CPU: the pre-trainings, then every arm of every seed, resumable; and the summary with its CIs.

`run_study` loads the table, relabels its held-out tasks (`perturb.py`, unless `perturb_fields` is 0),
pre-trains `pretrain_seeds` improvers (cached in `OUT/pretrain/p<k>`; study seed s starts from p = s mod
pretrain_seeds) and runs each seed: `run_seed` writes `OUT/seeds/seed<N>.json` after every arm (a seed or
an arm already there is skipped, so an interrupted study resumes where it stopped). `summarize` reads every
seed file and writes the results (`seed_metrics` defines the per-seed metrics): 95 % t intervals over seeds
per arm, the contrasts paired by seed (the primary one at 95 %, the others a family with Holm-adjusted
p-values and Bonferroni intervals), the seeds the primary contrast would need for a +-0.01 interval, the
task split, the perturbation, and the provenance of both halves (the table's, and this run's).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from experimental.contrastive_study.arms import (
    ARMS,
    ORDERED,
    Protocol,
    curve,
    lookup_rankings,
    one_shot,
    search,
    search_seed,
    seed_recipes,
    train_grpo,
)
from experimental.contrastive_study.improver import ImproverSize, pretrain
from experimental.contrastive_study.ops import task_by_id, visible_features
from experimental.contrastive_study.perturb import perturb_table
from experimental.contrastive_study.provenance import provenance
from experimental.contrastive_study.stats import (
    adjusted_ci,
    holm,
    mean_ci,
    p_value,
    paired_ci,
    prediction_interval,
    t_975,
)
from experimental.contrastive_study.table import Table, load_table

logger = logging.getLogger(__name__)

PRIMARY = "held_out_log_regret"
#: The study's question: contrastive GRPO (bucket-sampled exemplars) against plain GRPO, on `PRIMARY`.
PRIMARY_CONTRAST = ("grpo-bucket", "grpo-plain")
#: The other contrasts, one family for the multiplicity correction: (arm, minus this arm).
SECONDARY = (("grpo-bucket", "grpo-shuffled"), ("grpo-bucket", "grpo-random"), ("grpo-bucket", "grpo-refine"),
             ("grpo-refine", "grpo-plain"), ("grpo-bucket", "evolution"), ("evolution", "sft-only"),
             ("evolution", "random-search"), ("grpo-plain", "sft-only"), ("lookup", "random-search"),
             ("grpo-bucket", "lookup"))
#: The half-width the primary contrast's 95 % interval is sized for.
TARGET_HALF_WIDTH = 0.01
SCALARS = ("held_out_log_regret", "held_out_fraction", "held_out_best_at_budget", "evaluations_to_95",
           "evaluations_to_99", "reached_99", "held_out_correct_rate", "held_out_samples", "held_out_fallback",
           "held_out_copies", "one_shot_fraction_of_best", "one_shot_correct_rate", "mechanism_true_scores",
           "mechanism_permuted_scores", "mechanism", "train_fraction_of_best_first", "train_fraction_of_best_last",
           "train_copies_last", "cpu_s")
CONTRAST_METRICS = ("held_out_log_regret", "held_out_fraction", "evaluations_to_99", "one_shot_fraction_of_best")


def study_table(table_path: Path, protocol: Protocol) -> Table:
    """The table the arms see: as measured, its held-out tasks relabelled (`perturb.py`) unless
    `perturb_fields` is 0."""
    data = load_table(table_path)
    if protocol.perturb_fields:
        data = perturb_table(data, protocol.perturb_fields, protocol.perturb_seed)
    return Table(data)


def _tasks(table: Table, ids: list[str], feature_set: str) -> tuple[dict[str, Any], dict[str, list[str]]]:
    by_id = task_by_id()
    return ({tid: by_id[tid].to_task() for tid in ids},
            {tid: visible_features(list(table.tasks[tid]["features"]), feature_set) for tid in table.tasks})


def run_arm(arm: str, table: Table, start: Path, protocol: Protocol, seed: int, work_dir: Path) -> dict[str, Any]:
    """One arm of one seed (see arms.py): training (RL arms), the held-out searches, the one-shot samples."""
    from cudal1.train.models import load_policy

    train_ids, held_ids = table.split()
    train, features = _tasks(table, train_ids, protocol.feature_set)
    held, _ = _tasks(table, held_ids, protocol.feature_set)
    trains, style = ARMS[arm]
    shutil.rmtree(work_dir, ignore_errors=True)  # what an interrupted run of this arm left
    started, cpu = time.monotonic(), time.process_time()
    record: dict[str, Any] = {}
    policy = None
    if trains == "grpo":
        model, tok, record["training"] = train_grpo(start, table, train, features, style, protocol, seed,
                                                    work_dir / "train")
        policy = (model, tok)
    elif style not in ORDERED:
        policy = load_policy(str(start))
    lookup = lookup_rankings(table, held_ids, features) if style == "lookup" else None
    record["held_out"] = []
    for repeat in range(protocol.search_repeats):
        runs = search(table, held, features, style, protocol, seed, work_dir, policy, repeat=repeat, lookup=lookup)
        record["held_out"].append({
            tid: {"curve": curve(table, tid, run.evaluated, protocol.checkpoints), "evaluations": len(run.evaluated),
                  "to_95": _evaluations_to(table, tid, run.evaluated, 0.95),
                  "to_99": _evaluations_to(table, tid, run.evaluated, 0.99),
                  "samples": run.samples, "fallback": run.fallback, "copies": run.copies,
                  "correct_rate": round(statistics.fmean(table.speedup(tid, r) > 0 for r in run.evaluated), 5)}
            for tid, run in runs.items()})
    record["one_shot"] = one_shot(table, held, features, style, protocol, seed, work_dir, policy, lookup)
    record["seconds"] = round(time.monotonic() - started, 1)
    record["cpu_s"] = round(time.process_time() - cpu, 1)
    return record


def _evaluations_to(table: Table, tid: str, evaluated: list[str], fraction: float) -> int | None:
    """The evaluations spent when the best found first reached `fraction` of the task's best (None: never)."""
    target = fraction * table.best(tid)
    return next((i + 1 for i, r in enumerate(evaluated) if table.speedup(tid, r) >= target), None)


def run_seed(out_dir: Path, table: Table, seed: int, *, arms: list[str], protocol: Protocol, start: Path) -> Path:
    """Every arm of one seed into `out_dir/seeds/seed<seed>.json` (resumable: done arms are skipped)."""
    path = out_dir / "seeds" / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.is_file() else {"seed": seed, "arms": {}}
    data["pretrain_seed"] = seed % protocol.pretrain_seeds
    _, held_ids = table.split()
    data["seed_recipes"] = {repeat: seed_recipes(table, held_ids, protocol.exemplars, search_seed(seed, repeat))
                            for repeat in range(protocol.search_repeats)}  # every arm's first evaluations
    for arm in arms:
        if arm in data["arms"]:
            continue
        record = run_arm(arm, table, start, protocol, seed, out_dir / "work" / f"seed{seed}" / arm)
        data["arms"][arm] = record
        path.write_text(json.dumps(data, separators=(",", ":")))
        logger.info("seed %d %s: held-out log-regret %.4f (%.0f s, %.0f CPU s)", seed, arm,
                    seed_metrics(record, protocol.exemplars)[PRIMARY], record["seconds"], record["cpu_s"])
    return path


def run_study(out_dir: Path, table_path: Path, seeds: list[int], *, arms: list[str] | None = None,
              protocol: Protocol | None = None, size: ImproverSize | None = None,
              allow_surrogate: bool = False) -> Path:
    """Pre-train (each pre-training seed once, cached in OUT/pretrain), then run each seed; returns the seeds'
    folder. A folder already holding a protocol must be continued with the same one."""
    import torch

    protocol = protocol or Protocol()
    size = size or ImproverSize()
    torch.set_num_threads(1)
    raw = load_table(table_path)
    if raw["kind"] != "measured" and not allow_surrogate:
        raise ValueError(f"{table_path} is a {raw['kind']} table: results come from a measured one "
                         "(pass allow_surrogate for a pipeline test)")
    problems = Table(raw).problems()
    if problems:
        raise ValueError(f"{table_path}: {problems[0]} (and {len(problems) - 1} more problems)")
    table = study_table(table_path, protocol)
    out_dir.mkdir(parents=True, exist_ok=True)
    record_path = out_dir / "protocol.json"
    settings = json.loads(json.dumps(asdict(protocol)))
    record = json.loads(record_path.read_text()) if record_path.is_file() else {
        "protocol": settings, "improver": asdict(size), "table": str(table_path),
        "table_kind": table.kind, "pretrain": {}, "runs": []}
    if record["protocol"] != settings:
        raise ValueError(f"{out_dir} holds a study run with another protocol ({record_path}); use a new folder")
    record["runs"].append(provenance(seeds=seeds, arms=arms or list(ARMS)))
    for p in sorted({s % protocol.pretrain_seeds for s in seeds}):
        started, cpu = time.monotonic(), time.process_time()
        start = pretrain(out_dir / "pretrain" / f"p{p}", seed=p, examples=protocol.pretrain_examples, size=size,
                         feature_set=protocol.feature_set)
        if str(p) not in record["pretrain"]:  # once: the pre-trained improver's check on synthetic landscapes
            from cudal1.train.models import load_policy
            from experimental.contrastive_study.improver import exemplar_reading

            record["pretrain"][str(p)] = {
                "seconds": round(time.monotonic() - started, 1), "cpu_s": round(time.process_time() - cpu, 1),
                "exemplar_reading_synthetic": exemplar_reading(*load_policy(str(start)),
                                                               feature_set=protocol.feature_set)}
            logger.info("pre-training %d ready (%.0f s)", p, time.monotonic() - started)
        record_path.write_text(json.dumps(record, indent=1))
    for seed in seeds:
        start = out_dir / "pretrain" / f"p{seed % protocol.pretrain_seeds}" / "final"
        run_seed(out_dir, table, seed, arms=arms or list(ARMS), protocol=protocol, start=start)
    record["runs"][-1]["finished"] = provenance()["date"]
    record_path.write_text(json.dumps(record, indent=1))
    return out_dir / "seeds"


def seed_metrics(record: dict[str, Any], k0: int) -> dict[str, Any]:
    """One arm-seed's metrics, means over held-out tasks and the repeated searches (scripts/contrastive_study.py
    defines them): the log-regret ln(best / best found) at the checkpoints after the k0 seeded evaluations."""
    searches = [e for repeat in record["held_out"] for e in repeat.values()]
    curves = [e["curve"] for e in searches]
    n_ck = len(curves[0])
    budget = max(e["evaluations"] for e in searches)
    mean_curve = [round(statistics.fmean(c[i] for c in curves), 5) for i in range(n_ck)]
    after_seeds = slice(1, n_ck) if n_ck > 1 else slice(0, 1)
    regret = statistics.fmean(statistics.fmean(-math.log(max(v, 1e-6)) for v in c[after_seeds]) for c in curves)
    one = list(record["one_shot"].values())
    out: dict[str, Any] = {
        "held_out_curve": mean_curve, PRIMARY: round(regret, 5), "held_out_fraction": round(math.exp(-regret), 5),
        "held_out_best_at_budget": mean_curve[-1],
        "evaluations_to_95": round(statistics.fmean(e["to_95"] or budget + 1 for e in searches), 3),
        "evaluations_to_99": round(statistics.fmean(e["to_99"] or budget + 1 for e in searches), 3),
        "reached_99": round(statistics.fmean(e["to_99"] is not None for e in searches), 5),
        "held_out_correct_rate": round(statistics.fmean(e["correct_rate"] for e in searches), 5),
        "held_out_samples": round(statistics.fmean(e["samples"] for e in searches), 2),
        "held_out_fallback": round(statistics.fmean(e["fallback"] for e in searches), 3),
        "held_out_copies": round(statistics.fmean(e["copies"] / max(1, e["samples"]) for e in searches), 5),
        "one_shot_fraction_of_best": round(statistics.fmean(e["fraction_of_best"] for e in one), 5),
        "one_shot_correct_rate": round(statistics.fmean(e["correct_rate"] for e in one), 5),
        "cpu_s": record.get("cpu_s")}
    if "true_scores" in one[0]:
        true = statistics.fmean(e["true_scores"] for e in one)
        permuted = statistics.fmean(e["permuted_scores"] for e in one)
        out.update(mechanism_true_scores=round(true, 5), mechanism_permuted_scores=round(permuted, 5),
                   mechanism=round(true - permuted, 5))
    if "training" in record:
        steps = record["training"]["steps"]
        window = max(1, len(steps) // 10)
        out["train_fraction_of_best_first"] = round(statistics.fmean(s["fraction_of_best"] for s in steps[:window]), 5)
        out["train_fraction_of_best_last"] = round(statistics.fmean(s["fraction_of_best"] for s in steps[-window:]), 5)
        out["train_copies_last"] = round(statistics.fmean(s.get("copies", 0.0) for s in steps[-window:]), 5)
        out["train_curve"] = [s["fraction_of_best"] for s in steps]
    return out


def _contrast(per_seed: dict[str, dict[int, dict]], a: str, b: str, alpha: float | None) -> dict[str, Any]:
    common = sorted(set(per_seed[a]) & set(per_seed[b]))
    out: dict[str, Any] = {}
    for k in CONTRAST_METRICS:
        diffs = [per_seed[a][s][k] - per_seed[b][s][k] for s in common]
        entry = {**paired_ci([per_seed[a][s][k] for s in common], [per_seed[b][s][k] for s in common]),
                 "p": p_value(diffs)}
        if alpha is not None:
            entry["adjusted"] = adjusted_ci(diffs, alpha)
        out[k] = entry
    return out


def by_pretraining(per_seed: dict[str, dict[int, dict]], a: str, b: str,
                   pretrain_of: dict[int, int | None]) -> dict[str, Any]:
    """The primary contrast per pre-training (the mean over the seeds that started from it) and the interval
    over pre-trainings: what generalises over pre-trainings, not only over the seeds after them."""
    clusters: dict[str, list[float]] = {}
    for s in sorted(set(per_seed[a]) & set(per_seed[b])):
        clusters.setdefault(str(pretrain_of.get(s)), []).append(per_seed[a][s][PRIMARY] - per_seed[b][s][PRIMARY])
    means = {p: round(statistics.fmean(v), 5) for p, v in clusters.items()}
    return {"means": means, "seeds": {p: len(v) for p, v in clusters.items()},
            "over_pretrainings": mean_ci(list(means.values()))}


def seeds_needed(diffs: list[float], half_width: float = TARGET_HALF_WIDTH) -> int | None:
    """Seeds the paired contrast would need for a 95 % interval of +-`half_width`, at its observed spread."""
    if len(diffs) < 2:
        return None
    sd = statistics.stdev(diffs)
    n = 2
    while t_975(n - 1) * sd / math.sqrt(n) > half_width and n < 100000:
        n += 1
    return n


def summarize(out_dir: Path, table_path: Path, spotcheck_path: Path | None = None) -> dict[str, Any]:
    """Every seed file into the study's results (module docstring), written to OUT/contrastive_study.json."""
    record = json.loads((out_dir / "protocol.json").read_text())
    protocol = Protocol(**{**record["protocol"], "checkpoints": tuple(record["protocol"]["checkpoints"])})
    table = study_table(table_path, protocol)
    seeds = [json.loads(p.read_text()) for p in sorted((out_dir / "seeds").glob("seed*.json"),
                                                        key=lambda p: int(p.stem[4:]))]
    arms = [a for a in ARMS if any(a in s["arms"] for s in seeds)]  # each over the seeds that ran it
    per_seed = {arm: {s["seed"]: seed_metrics(s["arms"][arm], protocol.exemplars) for s in seeds if arm in s["arms"]}
                for arm in arms}
    results: dict[str, Any] = {}
    for arm in arms:
        values = list(per_seed[arm].values())
        results[arm] = {k: mean_ci([v[k] for v in values]) for k in SCALARS if values[0].get(k) is not None}
        results[arm]["held_out_curve"] = [round(statistics.fmean(v["held_out_curve"][i] for v in values), 5)
                                          for i in range(len(values[0]["held_out_curve"]))]
    contrasts: dict[str, Any] = {}
    a, b = PRIMARY_CONTRAST
    if a in per_seed and b in per_seed:
        primary = _contrast(per_seed, a, b, None)
        diffs = [per_seed[a][s][PRIMARY] - per_seed[b][s][PRIMARY] for s in sorted(set(per_seed[a]) & set(per_seed[b]))]
        primary["seeds_for_target"] = seeds_needed(diffs)
        primary["by_pretraining"] = by_pretraining(per_seed, a, b, {s["seed"]: s.get("pretrain_seed") for s in seeds})
        contrasts[f"{a} - {b}"] = {"role": "primary", **primary}
    family = [(x, y) for x, y in SECONDARY if x in per_seed and y in per_seed]
    alpha = 0.05 / max(1, len(family))
    for x, y in family:
        contrasts[f"{x} - {y}"] = {"role": "secondary", **_contrast(per_seed, x, y, alpha)}
    adjusted = holm({name: c[PRIMARY]["p"] for name, c in contrasts.items() if c["role"] == "secondary"})
    for name, p in adjusted.items():
        contrasts[name][PRIMARY]["p_holm"] = p
    train_ids, held_ids = table.split()
    raw_table = load_table(table_path)
    summary = {
        "answers": answers(results, contrasts, protocol),
        "table_kind": table.kind, "protocol": record["protocol"], "improver": record["improver"],
        "pretrain": record["pretrain"], "seeds": [s["seed"] for s in seeds],
        "pretrain_seed_of": {s["seed"]: s.get("pretrain_seed") for s in seeds},
        "multiplicity": (f"the primary contrast ({a} - {b}, {PRIMARY}) is the study's one question: a plain 95 % "
                         f"t interval. The {len(family)} secondary contrasts are one family: Holm-adjusted "
                         f"p-values (p_holm, on {PRIMARY}) and Bonferroni intervals at {1 - alpha:.4f} "
                         "(`adjusted`); their unadjusted 95 % intervals are shown for reading only."),
        "split": {"train": train_ids, "held_out": held_ids,
                  "held_out_families": sorted({table.tasks[t]["family"] for t in held_ids})},
        "perturbation": table.data.get("perturbation"),
        "arms": results, "contrasts": contrasts, "per_seed": per_seed,
        "landscapes": {tid: table.landscape(tid) for tid in table.tasks},
        "provenance": {"gpu_half": raw_table.get("provenance", {}), "cpu_half": record["runs"]},
        "table": {"path": str(table_path), "sha256": hashlib.sha256(Path(table_path).read_bytes()).hexdigest()}}
    spotcheck_path = spotcheck_path or Path(table_path).parent / "spotcheck.json"
    if spotcheck_path.is_file():
        spot = json.loads(spotcheck_path.read_text())
        summary["table"]["spotcheck"] = {k: v for k, v in spot.items() if k != "rows"}
    (out_dir / "contrastive_study.json").write_text(json.dumps(summary, indent=1))
    return summary


def answers(results: dict[str, Any], contrasts: dict[str, Any], protocol: Protocol) -> dict[str, Any]:
    """What the study was built to show, in one place: the primary contrast and its interval's half-width, how
    much room the no-feedback lookup leaves, the within-policy mechanism per arm, and the budgets spent."""
    name = " - ".join(PRIMARY_CONTRAST)
    out: dict[str, Any] = {"budget": {"distinct_evaluations_per_held_out_task": protocol.budget,
                                      "searches_per_policy": protocol.search_repeats,
                                      "random_fill_per_task": {a: r["held_out_fallback"]["mean"]
                                                               for a, r in results.items() if "held_out_fallback" in r}}}
    if name in contrasts:
        ci = contrasts[name][PRIMARY]
        out["primary"] = {"contrast": name, "metric": PRIMARY, "mean": ci["mean"], "lo": ci["lo"], "hi": ci["hi"],
                          "half_width": round((ci["hi"] - ci["lo"]) / 2, 5) if ci["lo"] is not None else None,
                          "target_half_width": TARGET_HALF_WIDTH, "seeds": ci["n"]}
    if "lookup" in results:
        fraction = results["lookup"]["held_out_fraction"]["mean"]
        out["lookup"] = {"held_out_fraction_of_best": fraction, "room": round(1 - fraction, 5),
                         "held_out_log_regret": results["lookup"][PRIMARY]["mean"]}
    out["mechanism"] = {a: r["mechanism"] for a, r in results.items() if "mechanism" in r}
    return out


def markdown_table(summary: dict[str, Any]) -> str:
    """The results as Markdown tables (mean [95 % CI] over seeds)."""
    def fmt(ci: dict[str, Any] | None, digits: int = 3) -> str:
        if not ci or ci.get("mean") is None:
            return "-"
        if ci.get("lo") is None:
            return f"{ci['mean']:.{digits}f}"
        return f"{ci['mean']:.{digits}f} [{ci['lo']:.{digits}f}, {ci['hi']:.{digits}f}]"

    lines = ["| arm | held-out log-regret (primary) | geo. fraction of best | evaluations to 0.99 | one-shot "
             "fraction of best | mechanism: true - permuted scores | training, last 10 % |",
             "|---|---|---|---|---|---|---|"]
    for arm, r in summary["arms"].items():
        lines.append(f"| {arm} | {fmt(r.get(PRIMARY), 4)} | {fmt(r.get('held_out_fraction'))} | "
                     f"{fmt(r.get('evaluations_to_99'), 1)} | {fmt(r.get('one_shot_fraction_of_best'))} | "
                     f"{fmt(r.get('mechanism'))} | {fmt(r.get('train_fraction_of_best_last'))} |")
    lines += ["", "| contrast (paired by seed) | role | log-regret | p (Holm) | evaluations to 0.99 | one-shot |",
              "|---|---|---|---|---|---|"]
    for name, c in summary["contrasts"].items():
        p = c[PRIMARY].get("p_holm", c[PRIMARY].get("p"))
        lines.append(f"| {name} | {c['role']} | {fmt(c[PRIMARY], 4)} | {p if p is None else f'{p:.3g}'} | "
                     f"{fmt(c['evaluations_to_99'], 1)} | {fmt(c['one_shot_fraction_of_best'])} |")
    return "\n".join(lines)


def against(summary: dict[str, Any], committed: dict[str, Any], metric: str = PRIMARY) -> dict[str, Any]:
    """Each arm's `metric` in this run, per seed, against the committed study's seeds: the same seed's committed
    value where there is one (`reproduced`: equal to the 5 decimals kept), and the prediction interval of the
    committed seeds (`stats.prediction_interval`) at a 95 % level for all the arms at once (Bonferroni: each
    arm's at 1 - 0.05/arms; nine arms at 95 % each would put one outside a third of the time). A seed re-runs
    bit for bit only on the same machine and libraries; elsewhere the pre-training and GRPO numerics differ,
    so it is a new draw from the same spread, which the interval judges."""
    earlier_of = committed.get("per_seed", {})
    arms = [arm for arm in summary["per_seed"] if earlier_of.get(arm)]
    out: dict[str, Any] = {}
    for arm in arms:
        earlier = {str(seed): v for seed, v in earlier_of[arm].items()}
        spread = [v[metric] for v in earlier.values()]
        lo, hi = prediction_interval(spread, alpha=0.05 / len(arms))
        now = {str(seed): v[metric] for seed, v in summary["per_seed"][arm].items()}
        same = {seed: earlier[seed][metric] for seed in now if seed in earlier}
        out[arm] = {"now": list(now.values()), "committed_seeds": len(spread), "interval": [round(lo, 4), round(hi, 4)],
                    "level": f"95 % for {len(arms)} arms at once", "inside": all(lo <= v <= hi for v in now.values()),
                    "same_seed_committed": same or None,
                    "reproduced": all(abs(now[s] - v) <= 5e-6 for s, v in same.items()) if same else None}
    return out
