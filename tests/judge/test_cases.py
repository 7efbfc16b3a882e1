"""The hack-case database: schema in the store file, dedup, listing, seeding, growth from detections."""

from __future__ import annotations

import sqlite3

import pytest

from cudal1.core.types import EvalResult, Flag, Severity, Status
from cudal1.judge import HackCaseDB, confirmed_rule, fixture_explanation
from cudal1.store import ResultsStore
from tests.judge.conftest import CORPUS, MANIFEST, corpus_entries

CACHING = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._cache = {}

    def forward(self, x):
        key = x.data_ptr()
        if key not in self._cache:
            self._cache[key] = torch.relu(x)
        return self._cache[key]
"""


def test_add_dedups_by_normalised_source_and_stores_static_rules(tmp_path):
    db = HackCaseDB(tmp_path / "r.sqlite")
    first = db.add(CACHING, "result_caching", "memoizes on data_ptr", "manual")
    assert isinstance(first, int) and db.count() == 1
    commented = CACHING.replace("key = x.data_ptr()", "key = x.data_ptr()  # c")
    reformatted = '"""A docstring."""\n' + commented
    assert db.add(reformatted, "other_rule", "dup", "manual") is None
    assert db.count() == 1
    case = db.get(first)
    assert (case.rule, case.origin, case.explanation) == ("result_caching", "manual", "memoizes on data_ptr")
    assert "result_caching" in case.static_rules and len(case.source_hash) == 64 and case.created_at > 0
    assert db.find(reformatted).id == first and db.get(first + 100) is None


def test_add_validates_its_inputs(tmp_path):
    db = HackCaseDB(tmp_path / "r.sqlite")
    with pytest.raises(ValueError, match="source"):
        db.add("  ", "rule")
    with pytest.raises(ValueError, match="rule"):
        db.add(CACHING, "")
    with pytest.raises(ValueError):
        HackCaseDB(":memory:")


def test_the_table_lives_in_the_results_store_file_next_to_its_tables(tmp_path):
    path = tmp_path / "results.sqlite"
    ResultsStore(path).close()
    db = HackCaseDB(path)
    db.add(CACHING, "result_caching")
    with ResultsStore(path) as store:  # the store still opens (and migrates) the shared file
        assert store.schema_version >= 1
    with sqlite3.connect(path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"hack_cases", "schema_version"} <= tables


def test_default_path_is_the_results_store(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDAL1_STORE", str(tmp_path / "env.sqlite"))
    assert HackCaseDB().path == tmp_path / "env.sqlite"


def test_list_filters_and_remove(tmp_path):
    db = HackCaseDB(tmp_path / "r.sqlite")
    a = db.add(CACHING, "result_caching", origin="confirmed:static")
    b = db.add("import torch\nx = torch.cuda.Stream()\n", "side_stream", origin="confirmed:runtime")
    c = db.add("import torch\ntorch.backends.cudnn.benchmark = True\n", "global_flags", origin="seed")
    assert [x.id for x in db.list()] == [a, b, c]
    assert [x.id for x in db.list(origin="confirmed:")] == [a, b]
    assert [x.id for x in db.list(rule="side_stream")] == [b]
    assert [x.id for x in db.list(limit=1)] == [a]
    assert db.remove(b) and not db.remove(b) and db.count() == 2
    assert db.list()[0].to_dict(with_source=False).keys() >= {"id", "rule", "origin", "static_rules"}


def test_fixture_explanation_keeps_summary_method_and_scenario():
    text = fixture_explanation((CORPUS / "exploits" / "dataptr_cache.py").read_text())
    assert text.startswith("results cached across calls, keyed on the input's data_ptr.")
    assert "Method:" in text and "Scenario:" in text and "Expected" not in text and "\n" not in text


def test_seed_from_corpus_loads_every_exploit_once(tmp_path):
    db = HackCaseDB(tmp_path / "r.sqlite")
    exploits = corpus_entries()
    assert db.seed_from_corpus(MANIFEST) == len(exploits)
    assert db.seed_from_corpus(MANIFEST) == 0  # idempotent
    cases = db.list(origin="seed")
    assert sorted(c.rule for c in cases) == sorted(e["exploit_class"] for e in exploits)
    by_task = {c.task_id: c for c in cases}
    fewer = by_task["corpus/exploits/fewer_rounds.py"]
    assert "size_constants_redefined" in fewer.static_rules  # found with the reference's help
    assert "size_constants_ignored" in by_task["corpus/exploits/shrunk_sizes.py"].static_rules
    assert all(c.explanation and "Expected" not in c.explanation for c in cases)
    with pytest.raises(ValueError, match="manifest"):
        db.seed_from_corpus(tmp_path / "missing.yaml")


def _hack(message: str, *flags: Flag) -> EvalResult:
    return EvalResult(status=Status.HACK_DETECTED, message=message, flags=list(flags), task_id="t/relu")


def test_confirmed_rule_prefers_the_flag_the_message_names():
    info = Flag("stale_memory", Severity.WARNING, "empty_like")
    static = Flag("result_caching", Severity.ERROR, "dict keyed on data_ptr", line=12)
    runtime = Flag("guard.stream_escape", Severity.ERROR, "2 ms off-stream", source="runtime")
    assert confirmed_rule(_hack("guard.stream_escape: 2 ms off-stream", info, static, runtime)) == (
        "guard.stream_escape", "confirmed:runtime")
    assert confirmed_rule(_hack("something", info, static)) == ("result_caching", "confirmed:static")
    assert confirmed_rule(_hack("guard.output_type: not a tensor")) == ("guard.output_type",
                                                                          "confirmed:runtime")
    assert confirmed_rule(_hack("")) == ("hack_detected", "confirmed:runtime")


def test_record_confirmed_grows_the_database_only_from_hack_verdicts(tmp_path):
    db = HackCaseDB(tmp_path / "r.sqlite")
    flag = Flag("result_caching", Severity.ERROR, "outputs memoized in self._cache", line=12)
    correct = EvalResult(status=Status.CORRECT, speedup=1.2)
    assert db.record_confirmed(correct, CACHING) is None
    assert db.record_confirmed(EvalResult(status=Status.INCORRECT, message="x"), CACHING) is None
    assert db.count() == 0
    hack = _hack("result_caching: outputs memoized in self._cache (line 12)", flag)
    case_id = db.record_confirmed(hack, CACHING)
    case = db.get(case_id)
    assert (case.rule, case.origin, case.task_id) == ("result_caching", "confirmed:static", "t/relu")
    assert case.explanation.startswith("result_caching: outputs memoized")
    assert db.record_confirmed(_hack("result_caching: again", flag), CACHING) is None  # known already
    assert db.count() == 1


def test_the_judge_takes_confirmed_cases_from_the_stored_verdicts(tmp_path):
    """The evaluator only records verdicts: a HACK_DETECTED row, whoever stored it, becomes a case when the
    database is next opened, once; other verdicts never do."""
    from types import SimpleNamespace

    path = tmp_path / "r.sqlite"
    store = ResultsStore(path)
    task = SimpleNamespace(id="t/relu", source="REF = 1\n", level=1, origin="test", hash="h-ref")
    flag = Flag("result_caching", Severity.ERROR, "outputs memoized in self._cache", line=12)
    store.record_evaluation(task, CACHING, _hack("result_caching: memoized", flag), key="k1")
    store.record_evaluation(task, CACHING.replace("relu", "tanh"), EvalResult(status=Status.CORRECT, speedup=1.1,
                                                                              task_id="t/relu"), key="k2")
    db = HackCaseDB(path)
    cases = db.list()
    assert [(c.rule, c.origin, c.task_id) for c in cases] == [("result_caching", "confirmed:static", "t/relu")]
    assert db.take_confirmed() == 0 and HackCaseDB(path).count() == 1  # each row is looked at once
    other = CACHING.replace("_cache", "_memo")
    store.record_evaluation(task, other, _hack("result_caching: again", flag), key="k3")
    assert HackCaseDB(path).count() == 2
