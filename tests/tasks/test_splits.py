"""Train/test splits: deterministic, stratified by level, disjoint, stored as JSON."""

from __future__ import annotations

import pytest

from cudal1.core.errors import ConfigError
from cudal1.tasks.splits import TaskSplit, load_or_make_split, make_split, select_tasks
from cudal1.tasks.task import Task


def _tasks(n_per_level: dict[int, int]) -> list[Task]:
    return [Task(id=f"x/level{lv}/t{i}", source="", level=lv) for lv, n in n_per_level.items() for i in range(n)]


def test_split_is_deterministic_stratified_and_disjoint():
    tasks = _tasks({1: 100, 2: 100, 3: 50})
    a = make_split(tasks, test_fraction=0.2, seed=7)
    b = make_split(list(reversed(tasks)), test_fraction=0.2, seed=7)
    assert a == b
    assert not set(a.train) & set(a.test) and len(a.train) + len(a.test) == 250
    per_level = {lv: sum(t.startswith(f"x/level{lv}/") for t in a.test) for lv in (1, 2, 3)}
    assert per_level == {1: 20, 2: 20, 3: 10}
    assert make_split(tasks, test_fraction=0.2, seed=8).test != a.test


def test_small_levels_still_hold_one_out_and_keep_one():
    split = make_split(_tasks({1: 2, 2: 1}), test_fraction=0.1)
    assert len(split.test) == 1 and "x/level2/t0" in split.train


def test_split_file_round_trip_and_reuse(tmp_path):
    tasks = _tasks({1: 10})
    path = tmp_path / "splits.json"
    first = load_or_make_split(path, tasks, test_fraction=0.3, seed=1)
    assert path.is_file()
    again = load_or_make_split(path, tasks, test_fraction=0.5, seed=99)  # the file wins
    assert again == first == TaskSplit.load(path)


def test_select_tasks_keeps_input_order():
    tasks = _tasks({1: 10})
    split = make_split(tasks, test_fraction=0.3)
    test = select_tasks(tasks, "test", split)
    assert [t.id for t in test] == [t.id for t in tasks if t.id in set(split.test)]
    assert len(select_tasks(tasks, "all", split)) == 10
    with pytest.raises(ConfigError):
        select_tasks(tasks, "dev", split)
