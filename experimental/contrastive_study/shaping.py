"""How stage 3's advantages treat measurement noise, measured on the study's noisy rewards.

GRPO standardises each group's rewards. A group whose candidates are all correct and within measurement noise
of each other then gets advantages of +-1 (+-1.5 after the clip) however small its spread: the policy is
pushed by noise as hard as by a 2x difference. Stage 3 smooths rewards (z-score per group, clip to +-1.5),
and TRL then divided by the group's std again (`scale_rewards: group`), which restores unit scale and undoes
the clip. This module measures, on groups of 8 recipes that policies of the study actually proposed for
training tasks (the pre-trained improver's, and a GRPO-trained policy's, whose groups are tighter), with the
table's per-cell noise drawn as the study draws it (`Table.draw`, at `noise_scales` x the measured sigma),
what each advantage scheme (`SCHEMES`) gives:
- `fidelity`: the correlation, pooled over every completion of every group, between the advantage computed
  from the noisy rewards and the candidate's true relative gain in its group ((v - mean v) / mean v over the
  table's medians): how much of the push goes where the speed really is;
- `noise_share`: sum (A_noisy - A_true)^2 / sum A_noisy^2, A_true the same scheme on the table's medians:
  how much of the advantage is noise;
- `tie_advantage`: the mean |A| in groups whose true relative spread (max - min) / mean is below 1 %.

Run: `scripts/contrastive_study.py advantages OUT --table T` (after `run`, which leaves the policies).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cudal1.core.rewards import smooth_rewards
from cudal1.exemplars import ExemplarDB
from experimental.contrastive_study.arms import fill_db, seed_recipes, sub_seed
from experimental.contrastive_study.improver import sample
from experimental.contrastive_study.prompting import StudyPromptBuilder
from experimental.contrastive_study.table import Table

#: Relative dead bands measured for stage 3's smoothing followed by TRL's centring (`scale_rewards: none`).
NOISE_FLOORS = (0.0, 0.005, 0.01, 0.02, 0.05, 0.1)
#: TRL's own epsilon of its group scaling.
_TRL_EPS = 1e-4


def _center(values: list[float], size: int) -> list[float]:
    out: list[float] = []
    for start in range(0, len(values), size):
        chunk = values[start:start + size]
        mean = statistics.fmean(chunk)
        out.extend(v - mean for v in chunk)
    return out


def _trl_group_scale(values: list[float], size: int) -> list[float]:
    out: list[float] = []
    for start in range(0, len(values), size):
        chunk = values[start:start + size]
        mean = statistics.fmean(chunk)
        std = statistics.stdev(chunk) if len(chunk) > 1 else 0.0
        out.extend((v - mean) / (std + _TRL_EPS) for v in chunk)
    return out


def advantages(rewards: list[float], scheme: str, size: int) -> list[float]:
    """The advantages GRPO would train on for raw speedup rewards under a scheme of `SCHEMES`."""
    if scheme == "smooth+trl-group":  # stage 3 before: smoothing, then TRL's group scaling
        return _trl_group_scale(smooth_rewards(rewards, clip_k=1.5, group_size=size), size)
    if scheme.startswith("smooth+trl-none@"):
        floor = float(scheme.split("@")[1])
        return _center(smooth_rewards(rewards, clip_k=1.5, group_size=size, noise_floor=floor), size)
    if scheme == "raw+trl-group":  # no smoothing: TRL's standardisation alone
        return _trl_group_scale(rewards, size)
    raise ValueError(f"unknown scheme {scheme!r}")


SCHEMES = ("smooth+trl-group", "raw+trl-group", *(f"smooth+trl-none@{f:g}" for f in NOISE_FLOORS))


def sample_groups(table: Table, policy: Any, features: dict[str, list[str]], task_ids: Sequence[str], *,
                  rounds: int, size: int, seed: int, work_dir: Path) -> list[tuple[str, list[str | None]]]:
    """`rounds` groups of `size` answers per task from `policy` to bucket-style prompts over a database seeded
    with 4 random correct recipes per task (as the study's training starts)."""
    from experimental.contrastive_study.arms import TableEvaluations
    from experimental.contrastive_study.ops import task_by_id

    seeds = seed_recipes(table, list(task_ids), 4, sub_seed("shaping", seed))
    evals = TableEvaluations(table, sub_seed("shaping-evals", seed))
    scores = {tid: {r: evals.score(tid, r) for r in chosen} for tid, chosen in seeds.items()}
    db = fill_db(ExemplarDB(work_dir / "shaping.sqlite", context=table.context), seeds, scores)
    builder = StudyPromptBuilder(db, "bucket", 4, features, seed=seed)
    by_id = task_by_id()
    groups = []
    model, tok = policy
    for r in range(rounds):
        prompts = [builder.build(by_id[tid].to_task(), r) for tid in task_ids]
        for tid, answers in zip(task_ids, sample(model, tok, prompts, size, sub_seed("shaping-round", seed, r)),
                                strict=True):
            groups.append((tid, answers))
    return groups


def _corr(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else 0.0


def measure(table: Table, groups: list[tuple[str, list[str | None]]], *, noise_scales: Sequence[float] = (1.0, 10.0),
            draws: int = 10, seed: int = 0) -> dict[str, Any]:
    """Each scheme's fidelity, noise share and tie advantage (module docstring) at each noise scale."""
    size = len(groups[0][1])
    true = [table.speedup(tid, r) for tid, answers in groups for r in answers]
    gains, ties = [], []
    for g in range(len(groups)):
        chunk = true[g * size:(g + 1) * size]
        mean = statistics.fmean(chunk)
        gains.extend((v - mean) / mean if mean > 0 else 0.0 for v in chunk)
        ties.append(mean > 0 and min(chunk) > 0 and (max(chunk) - min(chunk)) / mean < 0.01)
    out: dict[str, Any] = {"groups": len(groups), "group_size": size, "tie_groups": sum(ties),
                           "correct_rate": round(statistics.fmean(v > 0 for v in true), 4), "schemes": {}}
    for scale in noise_scales:
        rng = random.Random(sub_seed("shaping-noise", seed, scale))
        found: dict[str, dict[str, list[float]]] = {s: {"fidelity": [], "noise_share": [], "tie_advantage": []}
                                                    for s in SCHEMES}
        sigmas = [table.noise(tid, r, scale) for tid, answers in groups for r in answers]
        for _ in range(draws):
            noisy = [table.draw(tid, r, rng, scale)[0] for tid, answers in groups for r in answers]
            for scheme in SCHEMES:
                a_noisy = advantages(noisy, scheme, size)
                a_true = advantages(true, scheme, size)
                found[scheme]["fidelity"].append(_corr(a_noisy, gains))
                found[scheme]["noise_share"].append(
                    sum((x - y) ** 2 for x, y in zip(a_noisy, a_true, strict=True)) / max(1e-12, sum(x * x for x in a_noisy)))
                tie_values = [abs(a) for g, tie in enumerate(ties) if tie for a in a_noisy[g * size:(g + 1) * size]]
                found[scheme]["tie_advantage"].append(statistics.fmean(tie_values) if tie_values else 0.0)
        out["schemes"][f"noise x{scale:g}"] = {
            "median_sigma": round(statistics.median(s for s in sigmas if s > 0), 5),
            **{scheme: {k: round(statistics.fmean(v), 4) for k, v in values.items()} for scheme, values in found.items()}}
    return out


def measure_run(out_dir: Path, table_path: Path, *, rounds: int = 5, draws: int = 10) -> dict[str, Any]:
    """`measure` on the groups of a study run's policies: its first pre-trained improver's and, when the run
    has one, the first seed's GRPO-trained contrastive policy's, at the measured noise and at 10x it (about the
    2.5 % median difference between two evaluations of one kernel through the evaluator on an H100)."""
    import json

    from cudal1.train.models import load_policy
    from experimental.contrastive_study.arms import Protocol
    from experimental.contrastive_study.ops import visible_features
    from experimental.contrastive_study.run import study_table

    record = json.loads((out_dir / "protocol.json").read_text())
    protocol = Protocol(**{**record["protocol"], "checkpoints": tuple(record["protocol"]["checkpoints"])})
    table = study_table(table_path, protocol)
    train_ids, _ = table.split()
    features = {t: visible_features(list(table.tasks[t]["features"]), protocol.feature_set) for t in table.tasks}
    sources = {"pre-trained improver": out_dir / "pretrain" / "p0" / "final"}
    trained = sorted((out_dir / "work").glob("seed*/grpo-bucket/train/grpo/final"))
    if trained:
        sources[f"after GRPO ({trained[0].relative_to(out_dir / 'work').parts[0]}, grpo-bucket)"] = trained[0]
    out: dict[str, Any] = {}
    for name, path in sources.items():
        groups = sample_groups(table, load_policy(str(path)), features, train_ids, rounds=rounds, size=8, seed=0,
                               work_dir=out_dir / "work" / "shaping")
        out[name] = measure(table, groups, draws=draws)
    return out
