"""Stage 3's exemplar database starts from stage 2's successes (and, when asked, the results store's)."""

from __future__ import annotations

import pytest

from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Status
from cudal1.exemplars import ExemplarDB
from cudal1.store import ResultsStore
from cudal1.train.config import RLStageConfig, SelfSupervisedConfig, load_config
from cudal1.train.exemplar_seed import seed_exemplars, seed_source
from cudal1.train.self_supervised import record_successes, stage_exemplar_path
from tests.train.helpers import common_overrides, correct_code, wrong_code


def _rl_config(tmp_path, **extra) -> RLStageConfig:
    return load_config(RLStageConfig, None, common_overrides(tmp_path, num_generations=2, **extra))


def _stage2_folder(tmp_path, tasks):
    """What stage 2 leaves: <out>/final (its policy) and <out>/exemplars.sqlite (its successes)."""
    out = tmp_path / "ss"
    (out / "final").mkdir(parents=True)
    config = load_config(SelfSupervisedConfig, None, common_overrides(tmp_path, output_dir=str(out)))
    db = ExemplarDB(stage_exemplar_path(config))
    results = [EvalResult(Status.CORRECT, task_id=t.id, speedup=s) for t, s in zip(tasks, (1.5, 2.5), strict=True)]
    assert record_successes(db, tasks, [correct_code(t) for t in tasks], results, {"source": "ss"}) == 2
    return out


def test_stage_2_keeps_every_correct_evaluation_in_its_database_by_default(tmp_path, tiny_tasks):
    config = load_config(SelfSupervisedConfig, None, common_overrides(tmp_path))
    assert config.exemplar_db == "auto" and stage_exemplar_path(config) == tmp_path / "run" / "exemplars.sqlite"
    db = ExemplarDB(stage_exemplar_path(config))
    task = tiny_tasks[0]
    results = [EvalResult(Status.CORRECT, task_id=task.id, speedup=v) for v in (2.0, 1.0)]
    results.append(EvalResult(Status.INCORRECT, task_id=task.id))
    codes = [correct_code(task), correct_code(task), wrong_code(task)]
    assert record_successes(db, [task] * 3, codes, results, {}) == 2
    (row,) = db.list(task.id)
    assert row.meta["evaluations"] == 2 and row.score == 1.5


def test_stage_3_started_from_stage_2_s_policy_seeds_from_its_database(tmp_path, tiny_tasks):
    """stage 3 started with an empty database unless the user named one; its first prompts said
    'None yet' although stage 2 had verified kernels of the same tasks."""
    tasks = tiny_tasks[:2]
    stage2 = _stage2_folder(tmp_path, tasks)
    config = _rl_config(tmp_path, model=str(stage2 / "final"))
    assert config.exemplar_seed == "auto" and seed_source(config) == stage2 / "exemplars.sqlite"
    db = ExemplarDB(tmp_path / "rl.sqlite")
    assert seed_exemplars(db, config, tasks) == {"exemplar_db": 2, "store": 0}
    assert sorted(db.best(t.id).score for t in tasks) == [1.5, 2.5]
    assert db.best(tasks[0].id).meta["seeded_from"] == str(stage2 / "exemplars.sqlite")
    assert seed_exemplars(db, config, tasks) == {"exemplar_db": 0, "store": 0}  # a resumed run: not twice
    assert seed_exemplars(ExemplarDB(tmp_path / "x.sqlite"), _rl_config(
        tmp_path, model=str(stage2 / "final"), exemplar_seed="none"), tasks) == {"exemplar_db": 0, "store": 0}
    assert seed_source(_rl_config(tmp_path, model="scratch")) is None
    with pytest.raises(ConfigError, match="is not a file"):
        seed_source(_rl_config(tmp_path, exemplar_seed=str(tmp_path / "missing.sqlite")))


def test_stage_3_can_seed_from_the_results_store(tmp_path, tiny_tasks):
    task, other = tiny_tasks[0], tiny_tasks[1]
    store = ResultsStore(tmp_path / "store.sqlite")
    code = correct_code(task)
    for i, speedup in enumerate((1.0, 3.0, 1.2)):  # one candidate, three evaluations: median 1.2
        store.record_evaluation(task, code, EvalResult(Status.CORRECT, task_id=task.id, speedup=speedup), key=f"k{i}")
    store.record_evaluation(task, wrong_code(task), EvalResult(Status.INCORRECT, task_id=task.id), key="bad")
    db = ExemplarDB(tmp_path / "rl.sqlite")
    config = _rl_config(tmp_path, exemplar_seed_store=True)
    assert seed_exemplars(db, config, [task, other], store) == {"exemplar_db": 0, "store": 1}
    (row,) = db.list(task.id)
    assert row.score == 1.2 and sorted(row.meta["scores"]) == [1.0, 1.2, 3.0] and row.code == code
    assert db.count(other.id) == 0
