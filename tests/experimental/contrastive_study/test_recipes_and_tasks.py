"""The study's recipe grammar, tasks and split (experimental.contrastive_study.recipes, experimental.contrastive_study.ops)."""

from __future__ import annotations

import torch

from experimental.contrastive_study.kernels import output_shape
from experimental.contrastive_study.ops import FAMILIES, HELD_OUT_FAMILIES, KINDS, StudyTask, study_tasks
from experimental.contrastive_study.recipes import BY_TEXT, SPACE, distance, parse_recipe


def test_the_grammar_has_several_hundred_recipes_with_six_fields():
    assert len(SPACE) == 480 == len(BY_TEXT)
    assert parse_recipe(" T256 V4 I2 G S0 M1 </s>") == "T256 V4 I2 G S0 M1"
    assert parse_recipe("T128 V3 I2 G S0 M1") is None and parse_recipe(None) is None
    assert distance(BY_TEXT["T256 V4 I2 G S0 M1"], BY_TEXT["T64 V4 I2 O S0 M1"]) == 2


def test_tasks_families_sizes_and_the_held_out_split():
    tasks = study_tasks()
    assert len(tasks) == 42 and len({t.id for t in tasks}) == 42
    assert {f.kind for f in FAMILIES.values()} == set(KINDS) and len(FAMILIES) == 12
    held = [t for t in tasks if t.held_out]
    assert len(held) >= 10 and {t.family.name for t in held} == set(HELD_OUT_FAMILIES)
    assert {t.family.kind for t in held} == set(KINDS)  # whole families of every kind
    assert all(3 <= len(f.shapes) <= 4 for f in FAMILIES.values())
    assert min(t.min_bytes for t in tasks) >= 512 * 2**20  # none launch-bound
    assert tasks[-1].held_out and not tasks[0].held_out  # training tasks first
    swish = next(t for t in tasks if t.id == "study/swish_n27")
    assert swish.features == ["ew", "in1", "heavy", "p1", "fullout", "r0", "c27"]
    assert not any(f.name in " ".join(t.features) for t in tasks for f in FAMILIES.values())  # no family names


def test_every_reference_runs_and_gives_the_output_the_kernels_write():
    for family in FAMILIES.values():
        task = StudyTask(family, 64, 256) if family.kind != "ew" else StudyTask(family, 1, 1024)
        scope: dict = {}
        exec(task.reference_source().replace(f"ROWS = {task.rows}", "ROWS = 8").replace(f"COLS = {task.cols}",
                                                                                     "COLS = 32"), scope)
        out = scope["Model"]()(*scope["get_inputs"]())
        small = StudyTask(family, 8 if family.kind != "ew" else 1, 32)
        assert tuple(out.shape) == output_shape(small) and out.dtype == torch.float32, family.name
        assert scope["get_init_inputs"]() == []
