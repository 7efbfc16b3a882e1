"""The spot-check's sample and agreement (experimental.contrastive_study.spotcheck; the evaluation itself needs a GPU)."""

from __future__ import annotations

import pytest

from experimental.contrastive_study.spotcheck import agreement, choose_cells
from experimental.contrastive_study.surrogate import surrogate_table
from experimental.contrastive_study.table import Table


def test_the_sample_spans_families_ranks_and_failures():
    table = Table(surrogate_table())
    cells = choose_cells(table, 60)
    assert len(cells) == 60 == len(set(cells))
    families = {table.tasks[t]["family"] for t, _ in cells}
    assert len(families) == 12
    statuses = {table.cell(t, r)["status"] for t, r in cells}
    assert "correct" in statuses and statuses - {"correct"}  # failures are checked too
    swish = sorted(table.speedup(t, r) for t, r in cells if t == "study/swish_n26")
    assert swish[0] == 0.0 and swish[-1] == table.best("study/swish_n26")  # a failure ... the best


def test_agreement_statistics():
    rows = [{"kind": "ew", "table_status": "correct", "table_speedup": s, "evaluator_status": "correct",
             "evaluator_speedup": s * 0.9} for s in (1.0, 2.0, 3.0)]
    rows.append({"kind": "row", "table_status": "compile_error", "table_speedup": None,
                 "evaluator_status": "compile_error", "evaluator_speedup": None})
    rows.append({"kind": "row", "table_status": "correct", "table_speedup": 1.0})  # not evaluated (budget)
    found = agreement(rows)
    assert found["evaluated"] == 4 and found["status_agreement"] == 1.0 and found["spearman"] == pytest.approx(1.0)
    assert found["within_1_25x"] == 1.0 and found["median_ratio_by_kind"] == {"ew": 0.9}


def test_spotcheck_records_as_it_goes_and_a_second_run_does_the_rest(tmp_path, monkeypatch):
    """The evaluator is a stand-in here (the real one needs a GPU for raw-CUDA candidates)."""
    import json

    import cudal1.service.evaluator as service
    from cudal1.core.types import EvalResult, Status
    from experimental.contrastive_study.spotcheck import spotcheck
    from experimental.contrastive_study.table import write_table

    table_path = tmp_path / "table.json"
    write_table(table_path, surrogate_table())
    seen = []

    class FakeEvaluator:
        def __init__(self, limit):
            self.limit = limit

        def evaluate(self, pairs, *, on_result, force, should_stop):
            for i, (task, source) in enumerate(pairs[: self.limit]):
                seen.append(task.id)
                assert "class ModelNew" in source and force
                on_result(i, EvalResult(Status.CORRECT, task_id=task.id, speedup=1.0))

        def close(self):
            pass

    limits = iter([10, 100])
    monkeypatch.setattr(service, "make_evaluator", lambda spec, config, **kw: FakeEvaluator(next(limits)))
    first = spotcheck(table_path, tmp_path, n=50)
    assert first["evaluated"] == 10 and json.loads((tmp_path / "spotcheck.json").read_text())["evaluated"] == 10
    second = spotcheck(table_path, tmp_path, n=50)
    assert second["evaluated"] == 50 and len(seen) == 50 and second["cells"] == 50
