"""Train/test task splits, so a policy is evaluated on tasks it never trained on.

CUDA-L1 trained and reported on the same 250 KernelBench tasks (design section 5, "known criticism"). A
`TaskSplit` holds task ids out for testing: within each level, tasks are ordered by
sha256(f"{seed}:{task_id}") and the first round(test_fraction x n) go to the test set (at least one when
the level has two tasks or more and the fraction is positive). The result depends only on the ids, the
seed and the fraction, not on load order; it is stored as JSON and reused, so a split file is the record
of what was held out.

Limits: adding tasks to a level can move a few existing tasks between sets (the count per level
changes); keep the split file of a study fixed once training has started.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.core.errors import ConfigError
from cudal1.tasks.task import Task

SPLIT_NAMES = ("train", "test", "all")


def _rank(seed: int, task_id: str) -> str:
    return hashlib.sha256(f"{seed}:{task_id}".encode()).hexdigest()


@dataclass(frozen=True)
class TaskSplit:
    """Which task ids are for training and which are held out for testing."""

    seed: int
    test_fraction: float
    train: list[str] = field(default_factory=list)
    test: list[str] = field(default_factory=list)

    def ids(self, name: str) -> set[str]:
        """The ids of the `train` or `test` set (`all`: both)."""
        if name not in SPLIT_NAMES:
            raise ConfigError(f"split must be one of {', '.join(SPLIT_NAMES)}, not {name!r}")
        if name == "all":
            return set(self.train) | set(self.test)
        return set(self.train if name == "train" else self.test)

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "test_fraction": self.test_fraction, "train": list(self.train),
                "test": list(self.test)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskSplit:
        return cls(seed=int(d["seed"]), test_fraction=float(d["test_fraction"]), train=list(d["train"]),
                   test=list(d["test"]))

    def save(self, path: str | Path) -> Path:
        """Write the split as JSON."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> TaskSplit:
        """Read a split written by `save`; `ConfigError` when unreadable."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot read split file {path}: {exc}") from None


def make_split(tasks: Sequence[Task], *, test_fraction: float = 0.2, seed: int = 0) -> TaskSplit:
    """Deterministic split stratified by level (see the module docstring)."""
    if not 0.0 <= test_fraction < 1.0:
        raise ConfigError(f"test_fraction must be in [0, 1), got {test_fraction}")
    by_level: dict[Any, list[str]] = defaultdict(list)
    for task in tasks:
        by_level[task.level].append(task.id)
    train: list[str] = []
    test: list[str] = []
    for level in sorted(by_level, key=lambda lv: (lv is None, lv or 0)):
        ids = sorted(set(by_level[level]), key=lambda i: _rank(seed, i))
        n_test = round(test_fraction * len(ids))
        if test_fraction > 0 and len(ids) >= 2:
            n_test = min(max(n_test, 1), len(ids) - 1)
        test.extend(sorted(ids[:n_test]))
        train.extend(sorted(ids[n_test:]))
    return TaskSplit(seed=seed, test_fraction=test_fraction, train=train, test=test)


def load_or_make_split(path: str | Path, tasks: Sequence[Task], *, test_fraction: float = 0.2,
                       seed: int = 0) -> TaskSplit:
    """The split stored at `path`, or a new one (saved there) when the file does not exist."""
    path = Path(path)
    if path.is_file():
        return TaskSplit.load(path)
    split = make_split(tasks, test_fraction=test_fraction, seed=seed)
    split.save(path)
    return split


def select_tasks(tasks: Sequence[Task], name: str, split: TaskSplit | None) -> list[Task]:
    """The tasks of split `name` (`all`, or no split given: every task), in input order.

    Tasks missing from the split file (added after it was made) belong to no set but `all`.
    """
    if name == "all" or split is None:
        if name not in SPLIT_NAMES:
            raise ConfigError(f"split must be one of {', '.join(SPLIT_NAMES)}, not {name!r}")
        return list(tasks)
    wanted = split.ids(name)
    return [t for t in tasks if t.id in wanted]
