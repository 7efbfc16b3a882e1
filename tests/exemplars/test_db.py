"""ExemplarDB: storage, dedup by normalised source, best-score retention, eviction, concurrency."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time

import pytest

from cudal1.exemplars.db import AddResult, ExemplarDB, normalize_source, normalized_hash

CODE = '''import torch

class ModelNew(torch.nn.Module):
    """Doubles."""

    def forward(self, x):
        return x * 2  # fast
'''
SAME_NORMALISED = '''import torch
# a leading comment


class ModelNew( torch.nn.Module ):
    def forward(self,x):
        # different comment, no docstring, other spacing
        return x*2
'''
DIFFERENT = CODE.replace("x * 2", "x + x")


def test_normalisation_ignores_comments_docstrings_blank_lines_and_formatting():
    assert normalize_source(CODE) == normalize_source(SAME_NORMALISED)
    assert normalized_hash(CODE) == normalized_hash(SAME_NORMALISED) != normalized_hash(DIFFERENT)
    # code that does not parse: comments, trailing spaces and blank lines still go
    assert normalize_source("def f(:  \n\n  # c\n  x = 1  # y\n") == "def f(:\n  x = 1"


def test_add_list_best_count_and_meta(tmp_path):
    db = ExemplarDB(tmp_path / "results.sqlite")
    assert db.best("t1") is None and db.count("t1") == 0
    assert db.add("t1", CODE, 1.5, {"model": "m1", "step": 3}) is AddResult.INSERTED
    assert db.add("t1", DIFFERENT, 2.5, {"model": "m2"}) is AddResult.INSERTED
    assert db.add("t2", CODE, 0.9) is AddResult.INSERTED
    assert db.count("t1") == 2 and db.count("t2") == 1 and db.tasks() == ["t1", "t2"]
    rows = db.list("t1")
    assert [r.score for r in rows] == [2.5, 1.5]
    assert db.best("t1").code == DIFFERENT
    meta = rows[1].meta
    assert meta["model"] == "m1" and meta["step"] == 3 and meta["task_id"] == "t1"
    assert meta["norm_hash"] == normalized_hash(CODE) and meta["created_s"] > 0
    with sqlite3.connect(tmp_path / "results.sqlite") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_duplicate_is_one_more_evaluation_and_the_score_is_their_median(tmp_path):
    """a duplicate kept the best score ever seen, a winner's curse under evaluation noise (a recheck
    moved a 3.05x exemplar to 1.48x). The score is now the median of every evaluation of that source."""
    db = ExemplarDB(tmp_path / "db.sqlite")
    assert db.add("t", CODE, 1.2, {"model": "a"}) is AddResult.INSERTED
    assert db.add("t", SAME_NORMALISED, 1.0, {"model": "b"}) is AddResult.LOWERED
    assert db.list("t")[0].score == pytest.approx(1.1) and db.list("t")[0].code == CODE
    assert db.add("t", SAME_NORMALISED, 3.05, {"model": "b"}) is AddResult.IMPROVED  # one lucky draw
    (only,) = db.list("t")
    assert only.score == 1.2 and only.code == CODE and only.meta["model"] == "a"  # median of 1.0, 1.2, 3.05
    assert only.meta["scores"] == [1.2, 1.0, 3.05] and only.meta["evaluations"] == 3
    assert db.add("t", CODE, [1.2]) is AddResult.DUPLICATE  # median of 1.0, 1.2, 1.2, 3.05 is 1.2
    old = ExemplarDB(tmp_path / "max.sqlite", statistic="max")
    for score in (1.2, 1.0, 3.05):
        old.add("t", CODE, score)
    assert old.best("t").score == 3.05


def test_scores_kept_are_bounded_and_copied_with_their_history(tmp_path):
    from cudal1.exemplars.db import MAX_SCORES_KEPT

    db = ExemplarDB(tmp_path / "a.sqlite")
    db.add("t", CODE, [1.0] * (MAX_SCORES_KEPT + 5) + [2.0])
    assert db.best("t").meta["evaluations"] == MAX_SCORES_KEPT and db.best("t").meta["scores"][-1] == 2.0
    db.add("t", DIFFERENT, 2.5, {"model": "m"})
    copy = ExemplarDB(tmp_path / "b.sqlite")
    assert copy.copy_from(db, ["t", "absent"], seeded_from="a") == 2
    rows = {r.code: r for r in copy.list("t")}
    assert rows[CODE].meta["evaluations"] == MAX_SCORES_KEPT and rows[CODE].score == 1.0
    assert rows[DIFFERENT].meta["model"] == "m" and rows[DIFFERENT].meta["seeded_from"] == "a"


def test_a_file_written_before_scores_were_kept_still_opens(tmp_path):
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE exemplars(id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL, "
                     "norm_hash TEXT NOT NULL, source_hash TEXT NOT NULL, code TEXT NOT NULL, score REAL NOT NULL, "
                     "model TEXT NOT NULL DEFAULT '', meta_json TEXT NOT NULL DEFAULT '{}', created_s REAL NOT NULL, "
                     "updated_s REAL NOT NULL, UNIQUE(task_id, norm_hash))")
        conn.execute("INSERT INTO exemplars(task_id, norm_hash, source_hash, code, score, created_s, updated_s) "
                     "VALUES ('t', ?, 'h', ?, 3.0, 0, 0)", (normalized_hash(CODE), CODE))
    db = ExemplarDB(path)
    assert db.best("t").meta["scores"] == [3.0] and db.best("t").meta["context"] == ""
    db.add("t", CODE, 1.0)
    assert db.best("t").score == 2.0 and db.best("t").meta["scores"] == [3.0, 1.0]
    db.add("t", CODE, 9.0, context="H100 | strict | 17 | full")  # the migrated file takes the new key
    assert ExemplarDB(path).count("t") == 2 and ExemplarDB(path, context="").best("t").score == 2.0


def test_scores_are_keyed_by_what_measured_them(tmp_path):
    """An H100's and an A100's speedups of one source are two rows whose scores never mix; a database opened
    with a context (a run's GPU, profile, protocol and sizes) shows and counts that context's rows only."""
    from cudal1.core.types import EvalResult, Status
    from cudal1.exemplars.db import score_context

    h100 = score_context(EvalResult(Status.CORRECT, environment={"gpu_name": "NVIDIA H100"},
                                    protocol={"profile": "strict", "version": "17", "sizes": "full"}))
    a100 = score_context({"environment": {"gpu_name": "NVIDIA A100"},
                          "protocol": {"profile": "cuda-l1", "version": "17", "sizes": "full"}})
    assert h100 == "NVIDIA H100 | strict | 17 | full" and a100 != h100 and score_context(EvalResult(Status.CORRECT)) == ""
    db = ExemplarDB(tmp_path / "ex.sqlite")
    db.add("t", CODE, [2.0, 2.2], context=h100)
    db.add("t", CODE, 5.0, context=a100)
    db.add("t", DIFFERENT, 1.5, context=a100)
    assert db.count("t") == 3  # no context: every row
    on_h100 = ExemplarDB(tmp_path / "ex.sqlite", context=h100)
    assert [(r.score, r.meta["scores"]) for r in on_h100.list("t")] == [(2.1, [2.0, 2.2])]
    on_h100.add("t", CODE, 2.4)  # the database's own context by default
    assert on_h100.best("t").meta["scores"] == [2.0, 2.2, 2.4] and on_h100.count("t") == 1
    assert ExemplarDB(tmp_path / "ex.sqlite", context=a100).best("t").meta["scores"] == [5.0]
    copy = ExemplarDB(tmp_path / "copy.sqlite")
    copy.copy_from(db, ["t"])
    assert ExemplarDB(tmp_path / "copy.sqlite", context=a100).count("t") == 2  # contexts travel with the rows


def test_eviction_drops_lowest_scores(tmp_path):
    db = ExemplarDB(tmp_path / "db.sqlite", max_per_task=3)
    for i, score in enumerate([1.0, 3.0, 2.0, 0.5, 4.0]):
        db.add("t", f"x = {i}\n", score)
    assert sorted(r.score for r in db.list("t")) == [2.0, 3.0, 4.0]
    assert db.add("t", "y = 1\n", 0.1) is AddResult.EVICTED
    assert db.count("t") == 3
    db.add("other", "z = 1\n", 0.1)
    assert db.count("other") == 1  # eviction is per task


def test_rejects_bad_inputs(tmp_path):
    with pytest.raises(ValueError):
        ExemplarDB(":memory:")
    db = ExemplarDB(tmp_path / "db.sqlite")
    with pytest.raises(ValueError):
        db.add("t", CODE, float("nan"))


def test_concurrent_writers_from_threads_and_two_handles(tmp_path):
    path = tmp_path / "db.sqlite"
    handles = [ExemplarDB(path), ExemplarDB(path)]

    def writer(k: int) -> None:
        for i in range(25):
            handles[k % 2].add("t", f"v = {i % 20}\n", float(k * 100 + i))

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = handles[0].list("t")
    assert len(rows) == 20  # 20 distinct normalised sources
    by_code = {r.code: r for r in rows}
    # "v = 4" was written by every writer at i = 4 and 24 (k * 100 + i): no evaluation lost, median of all 8.
    assert sorted(by_code["v = 4\n"].meta["scores"]) == [4.0, 24.0, 104.0, 124.0, 204.0, 224.0, 304.0, 324.0]
    assert by_code["v = 4\n"].score == 164.0


def _open_and_add(path: str, start: float, k: int) -> None:
    while time.time() < start:  # every process opens the fresh file at the same moment
        pass
    ExemplarDB(path).add("t", f"v = {k}\n", float(k))


def test_processes_opening_a_fresh_file_at_once(tmp_path):
    """Training ranks open the database together: switching a new file to WAL must wait, not fail."""
    ctx = multiprocessing.get_context("spawn")
    for round_ in range(3):
        path = str(tmp_path / f"fresh{round_}.sqlite")
        start = time.time() + 1.5
        procs = [ctx.Process(target=_open_and_add, args=(path, start, k)) for k in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0] * 6
        assert len(ExemplarDB(path).list("t")) == 6
