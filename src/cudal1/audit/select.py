"""Which items of a published release an audit run evaluates: level filter, per-level sample, limit, chunk.

Selection is deterministic for a given release and seed, so several runs (or several machines) that use
the same options and different `--chunk I/N` cover the release exactly once between them. Chunks are
taken round-robin (item k goes to chunk k mod N) so each chunk holds a similar mix of levels and cost.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from cudal1.core.errors import ConfigError
from cudal1.tasks.task import Candidate, Task

Item = tuple[Task, Candidate]


def parse_chunk(text: str | None) -> tuple[int, int] | None:
    """`"2/5"` -> (2, 5) (1-based chunk index, number of chunks); None or "" -> None."""
    if not text:
        return None
    head, sep, tail = text.partition("/")
    try:
        index, count = int(head), int(tail)
    except ValueError:
        raise ConfigError(f"--chunk must look like I/N (e.g. 2/5), not {text!r}") from None
    if not sep or count < 1 or not 1 <= index <= count:
        raise ConfigError(f"--chunk {text!r}: need 1 <= I <= N")
    return index, count


def select_items(pairs: Sequence[tuple[Task, Candidate | None]], *, levels: Sequence[int] = (),
                 sample_per_level: int | None = None, seed: int = 0, limit: int | None = None,
                 task_ids: Sequence[str] = ()) -> list[Item]:
    """The release items an audit covers, in release order.

    Rows without a published candidate are skipped; `task_ids` keeps only those tasks. `sample_per_level` keeps
    K items per level chosen with `random.Random(seed)` (all of a level with fewer); `limit` then keeps the first N.
    """
    wanted = set(task_ids)
    items = [(t, c) for t, c in pairs if c is not None and (not levels or t.level in levels)
             and (not wanted or t.id in wanted)]
    if sample_per_level is not None:
        if sample_per_level < 1:
            raise ConfigError("--sample-per-level must be >= 1")
        rng = random.Random(seed)
        keep: set[int] = set()
        for level in sorted({t.level for t, _ in items}, key=lambda lv: (lv is None, lv or 0)):
            indices = [i for i, (t, _) in enumerate(items) if t.level == level]
            keep.update(rng.sample(indices, min(sample_per_level, len(indices))))
        items = [item for i, item in enumerate(items) if i in keep]
    if limit is not None:
        if limit < 0:
            raise ConfigError("--limit must be >= 0")
        items = items[:limit]
    return items


def chunk_items(items: Sequence[Item], chunk: tuple[int, int] | None) -> list[Item]:
    """The items of chunk (I, N), round-robin; all items when `chunk` is None."""
    if chunk is None:
        return list(items)
    index, count = chunk
    return list(items[index - 1::count])
