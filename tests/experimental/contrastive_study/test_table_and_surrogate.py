"""The task table (experimental.contrastive_study.table) and the SURROGATE table that stands in for the GPU's on a CPU."""

from __future__ import annotations

import pytest

from cudal1.core.types import Status
from experimental.contrastive_study.ops import study_tasks, task_by_id
from experimental.contrastive_study.surrogate import surrogate_table
from experimental.contrastive_study.table import Table, load_table, new_table, write_table


@pytest.fixture(scope="module")
def surrogate():
    return surrogate_table(seed=0)


def test_the_surrogate_says_what_it_is_and_fills_every_cell(surrogate, tmp_path):
    assert surrogate["kind"] == "surrogate" and "NOT measured" in surrogate["provenance"]["method"]
    path = tmp_path / "table.json"
    write_table(path, surrogate)
    table = Table(load_table(path))
    assert table.problems() == [] and len(table.tasks) == len(study_tasks())
    train, held = table.split()
    assert len(train) == 28 and len(held) == 14


def test_the_best_recipe_differs_between_tasks_and_failures_pay_nothing(surrogate):
    table = Table(surrogate)
    assert len({table.best_recipe(t) for t in table.tasks}) >= 8
    task = task_by_id()["study/swish_n26"].to_task()
    assert table.result(task, "T1024 V4 I8 G S1 M0").status is Status.COMPILE_ERROR
    assert table.speedup(task.id, "T1024 V4 I8 G S1 M0") == 0.0 == table.speedup(task.id, None)
    best = table.best_recipe(task.id)
    assert table.result(task, best).speedup == table.best(task.id) > 1.0
    assert table.result(task, "T1 V1").status is Status.INFRA_ERROR


def test_a_partial_table_names_its_problems():
    data = new_table("measured", {})
    data["tasks"]["t"] = {"held_out": False, "cells": {"T64 V1 I1 O S0 M0": {"status": "correct", "speedup": 1.0,
                                                                            "times_ms": [1.0] * 4}},
                          "ref": {"times_ms": [1.0] * 10}}
    problems = Table(data).problems()
    assert "479 recipes not measured" in problems[0] and "fewer than 5 timings" in problems[1]
    with pytest.raises(ValueError):
        new_table("guessed", {})
