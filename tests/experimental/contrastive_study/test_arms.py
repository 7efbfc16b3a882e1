"""How the study's arms spend their evaluations (experimental.contrastive_study.arms), on the SURROGATE table: noisy
evaluations, equal distinct-evaluation budgets, the no-feedback lookup, the multi-turn refinement."""

from __future__ import annotations

import random

import pytest

from cudal1.core.rewards import reward_of
from experimental.contrastive_study import arms
from experimental.contrastive_study.arms import Protocol, TableEvaluations, lookup_rankings, search
from experimental.contrastive_study.ops import task_by_id, visible_features
from experimental.contrastive_study.prompting import RefineHistory
from experimental.contrastive_study.surrogate import surrogate_table
from experimental.contrastive_study.table import Table

PROTOCOL = Protocol(exemplars=2, budget=8, round_size=4, checkpoints=(2, 4, 8))


@pytest.fixture(scope="module")
def table():
    return Table(surrogate_table())


def _held(table):
    by_id = task_by_id()
    _, held = table.split()
    features = {t: visible_features(table.tasks[t]["features"], "kind") for t in table.tasks}
    return {t: by_id[t].to_task() for t in held}, features


def test_every_evaluation_draws_the_measured_noise_with_its_interval(table):
    task = task_by_id()["study/swish_n26"].to_task()
    recipe = table.best_recipe(task.id)
    evals = TableEvaluations(table, seed=0)
    results = [evals(task, recipe) for _ in range(20)]
    speedups = [r.speedup for r in results]
    assert len(set(speedups)) == 20 and abs(sum(speedups) / 20 / table.best(task.id) - 1) < 0.02
    assert TableEvaluations(table, seed=0)(task, recipe).speedup == speedups[0]  # reproducible
    lo, hi = results[0].timing.speedup_ci
    assert lo < speedups[0] < hi and reward_of(results[0], estimate="lower") == pytest.approx(lo)
    louder = table.draw(task.id, recipe, random.Random(0), scale=10.0)
    assert louder[1][1] / louder[1][0] > hi / lo  # noise_scale widens the interval
    assert table.draw(task.id, "T1024 V4 I8 G S1 M0", random.Random(0)) == (0.0, None)  # a failure


def test_every_arm_spends_the_same_distinct_evaluations_even_when_its_policy_repeats(table, tmp_path, monkeypatch):
    tasks, features = _held(table)
    monkeypatch.setattr(arms, "sample", lambda model, tok, prompts, n, seed: [["T256 V4 I2 G S0 M0"] * n
                                                                              for _ in prompts])
    for style in ("bucket", "plain", "refine"):
        runs = search(table, tasks, features, style, PROTOCOL, 0, tmp_path / style, policy=(None, None))
        for run in runs.values():
            assert len(run.evaluated) == len(set(run.evaluated)) == 8
            assert run.samples == 4 * 8 and run.fallback >= 8 - 2 - 1  # one new recipe, the rest at random
    uniform = search(table, tasks, features, "uniform", PROTOCOL, 0, tmp_path / "u")
    assert all(len(set(r.evaluated)) == 8 and r.fallback == 0 for r in uniform.values())


def test_the_lookup_proposes_what_worked_on_training_tasks_of_the_same_visible_features(table, tmp_path):
    tasks, features = _held(table)
    ranking = lookup_rankings(table, list(tasks), features)
    train, _ = table.split()
    for tid, order in ranking.items():
        assert len(order) == 480 and len(set(order)) == 480
        siblings = [t for t in train if table.tasks[t]["kind"] == table.tasks[tid]["kind"]]
        top = order[0]
        assert sum(table.speedup(t, top) / table.best(t) for t in siblings) == pytest.approx(
            max(sum(table.speedup(t, r) / table.best(t) for t in siblings) for r in order))
    runs = search(table, tasks, features, "lookup", PROTOCOL, 0, tmp_path, lookup=ranking)
    for tid, run in runs.items():
        assert run.evaluated[2:] == [r for r in ranking[tid] if r not in run.evaluated[:2]][:6]


def test_refinement_shows_a_trajectory_its_own_last_attempts(table, tmp_path, monkeypatch):
    history = RefineHistory(turns=2)
    for recipe, score in (("a", 1.0), ("b", 3.0), ("c", 2.0)):
        history.add("t", recipe, score)
    assert history.shown("t") == [("c", 2.0), ("b", 3.0)] and history.shown("other") == []
    tasks, features = _held(table)
    seen = []

    def fake_sample(model, tok, prompts, n, seed):
        seen.extend(prompts)
        return [[random.Random(len(seen) + i).choice(table.correct_recipes(next(iter(tasks))))] for i in
                range(len(prompts))]

    monkeypatch.setattr(arms, "sample", fake_sample)
    search(table, tasks, features, "refine", PROTOCOL, 0, tmp_path, policy=(None, None))
    assert all(p.count(";") <= 2 for p in seen)  # at most its last two attempts
    assert len(seen) >= 14 * 4 and seen[0].startswith(features[next(iter(tasks))][0] + " :")
