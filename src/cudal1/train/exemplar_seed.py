"""What stage 3's exemplar database starts with: stage 2's successes, and optionally the results store's.

Without seeding, contrastive RL's first prompts say "None yet" for every task: the policy is asked to beat
nothing, and the first groups' exemplars are whatever it happens to write. Stage 2 (`self_supervised.py`)
already evaluated correct candidates of the same tasks; by default stage 3 starts from them:

- `exemplar_seed="auto"`: the `exemplars.sqlite` beside the model's folder (stage 2 saves its policy in
  `<output_dir>/final` and its database in `<output_dir>/exemplars.sqlite`), when there is one;
- `exemplar_seed=<path>`: that database; `"none"`: start empty;
- `exemplar_seed_store=True`: also the results store's correct evaluations of each task (of the same task
  version: the task's content hash), one exemplar per candidate with every stored evaluation's speedup
  (its score is the database's statistic of them, the median by default).

Only tasks the stage's database has no exemplar of are seeded, so a resumed run (or a database shared on
purpose) is not seeded twice (a task counts as seeded when the database has exemplars of its own score context,
`ExemplarDB.context`). Exemplars keep the context that measured them (`exemplars.db.score_context`): a
store row of another GPU or protocol lands in its own context, which a database of this run's context does
not show.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cudal1.core.errors import ConfigError
from cudal1.core.types import Status
from cudal1.exemplars import ExemplarDB
from cudal1.exemplars.db import score_context
from cudal1.tasks.task import Task
from cudal1.train.config import RLStageConfig
from cudal1.train.self_supervised import EXEMPLARS_FILE

logger = logging.getLogger(__name__)


def seed_source(config: RLStageConfig) -> Path | None:
    """The database `exemplar_seed` names (None: none to seed from); `ConfigError` for a missing path."""
    if config.exemplar_seed == "none":
        return None
    if config.exemplar_seed == "auto":
        model_dir = Path(config.model)
        candidate = model_dir.parent / EXEMPLARS_FILE
        return candidate if model_dir.is_dir() and candidate.is_file() else None
    path = Path(config.exemplar_seed)
    if not path.is_file():
        raise ConfigError(f"exemplar_seed {path} is not a file; give an exemplar database, auto or none")
    return path


def seed_exemplars(db: ExemplarDB, config: RLStageConfig, tasks: Sequence[Task], store: Any = None) -> dict[str, int]:
    """Seed `db` for the tasks it has no exemplar of (see the module docstring); returns exemplars added per
    origin ("exemplar_db", "store")."""
    empty = [t for t in tasks if db.count(t.id) == 0]
    added = {"exemplar_db": 0, "store": 0}
    source = seed_source(config)
    if empty and source is not None and source.resolve() != db.path.resolve():
        added["exemplar_db"] = db.copy_from(ExemplarDB(source), [t.id for t in empty], seeded_from=str(source))
    if empty and config.exemplar_seed_store and store is not None:
        added["store"] = seed_from_store(db, store, [t for t in empty if db.count(t.id) == 0])
    if any(added.values()):
        logger.info("exemplar database seeded: %d from %s, %d from the results store", added["exemplar_db"],
                    source, added["store"])
    return added


def seed_from_store(db: ExemplarDB, store: Any, tasks: Sequence[Task]) -> int:
    """Each task's correct stored candidates (its current version) as exemplars; returns how many."""
    added = 0
    for task in tasks:
        scores: dict[tuple[str, str], list[float]] = {}
        for row in store.query_evaluations(task_id=task.id, status=Status.CORRECT):
            speedup = row.get("speedup")
            if row.get("task_hash") == task.hash and speedup is not None and math.isfinite(speedup) and speedup > 0:
                context = score_context(row.get("result") or {})
                scores.setdefault((row["candidate_hash"], context), []).append(float(speedup))
        for (candidate_hash, context), values in scores.items():
            candidate = store.get_candidate(candidate_hash)
            if candidate is not None:
                db.add(task.id, candidate["source"], values, {"source": "results_store",
                                                              "candidate_hash": candidate_hash}, context=context)
                added += 1
    return added
