"""Comparing two audit reports: verdicts, speedup ratios, baselines, and what counts as reproduced."""

from __future__ import annotations

import copy
import json

import pytest

from cudal1.audit.compare import compare_audits, load_audit
from cudal1.cli.main import main
from cudal1.core.errors import SourceError

LABEL = "audit:r:strict"


def _task(task_id: str, status: str, speedup: float | None, survives: bool | None = None,
          label: str = LABEL) -> dict:
    return {"task_id": task_id, "label": label, "status": status, "speedup": speedup, "survives": survives}


def _baseline(speedup: float | None, status: str = "ok") -> dict:
    return {"status": status, "measured_speedup": speedup, "speedup_vs_eager": speedup}


def earlier_report() -> dict:
    return {
        "label": LABEL, "meta": {"machine": "GPU X"},
        "tasks": [_task("a", "correct", 2.0, True), _task("b", "correct", 1.5, False),
                  _task("c", "incorrect", None, False), _task("d", "correct", 3.0, True),
                  _task("a", "incorrect", None, label="audit:r:cuda-l1")],
        "baseline_coverage": {"per_task": {
            "a": {"eager": _baseline(1.0), "cuda_graph": _baseline(1.2)},
            "b": {"eager": _baseline(0.99), "cuda_graph": _baseline(2.0)},
            "c": {"cuda_graph": _baseline(None, "failed")},
        }},
    }


def _scaled(report: dict, factor: float, tasks: tuple[str, ...] = ("a", "b", "d")) -> dict:
    new = copy.deepcopy(report)
    for row in new["tasks"]:
        if row["task_id"] in tasks and row["speedup"] is not None:
            row["speedup"] *= factor
    return new


def test_identical_reports_reproduce_with_unit_ratios():
    result = compare_audits(earlier_report(), earlier_report())
    assert result.reproduced
    assert result.shared == ["a", "b", "c", "d"] and result.verdicts_agree == 4
    series = {s.name: s for s in result.series}
    assert series["candidate speedup vs eager"].ratios == {"a": 1.0, "b": 1.0, "d": 1.0}
    assert series["baseline cuda_graph vs eager"].ratios == {"a": 1.0, "b": 1.0}
    assert series["baseline eager (null test)"].median() == 1.0
    assert result.survival == (4, 2, 2)
    assert result.lines()[0].startswith("REPRODUCED: 4 shared tasks")


def test_rows_of_other_profiles_are_not_compared():
    new = earlier_report()
    new["tasks"][-1]["status"] = "correct"  # the cuda-l1 profile's row of task a
    assert compare_audits(earlier_report(), new).reproduced


def test_a_changed_verdict_fails_and_is_named():
    new = earlier_report()
    new["tasks"][2]["status"] = "correct"
    new["tasks"][2]["speedup"] = 1.1
    result = compare_audits(earlier_report(), new)
    assert not result.reproduced
    assert result.verdict_changes == {"c": ("incorrect", "correct")}
    assert "verdict changed: c: incorrect -> correct" in result.lines()


def test_a_baseline_that_now_fails_is_a_change():
    new = earlier_report()
    new["baseline_coverage"]["per_task"]["b"]["cuda_graph"] = _baseline(None, "failed")
    result = compare_audits(earlier_report(), new)
    assert not result.reproduced and result.baseline_status_changes == {"b cuda_graph": ("ok", "failed")}


def test_a_systematic_shift_moves_the_median_out_of_the_band():
    new = _scaled(earlier_report(), 1.2)
    assert not compare_audits(earlier_report(), new, tolerance=0.1).reproduced
    assert compare_audits(earlier_report(), new, tolerance=0.25).reproduced
    slower = _scaled(earlier_report(), 1 / 1.2)  # the band is symmetric in ratio: 1/1.2 fails like 1.2
    assert not compare_audits(earlier_report(), slower, tolerance=0.1).reproduced


def test_one_noisy_task_is_listed_but_does_not_fail():
    new = _scaled(earlier_report(), 1.5, tasks=("d",))
    result = compare_audits(earlier_report(), new)
    assert result.reproduced
    candidate = result.series[0]
    assert candidate.outside(0.1) == {"d": 1.5} and candidate.median() == 1.0
    assert "  d: 1.500" in result.lines()


def test_only_shared_tasks_are_compared_and_none_shared_is_not_a_reproduction():
    small = earlier_report()
    small["tasks"] = [row for row in small["tasks"] if row["task_id"] == "a"]
    result = compare_audits(earlier_report(), small)
    assert result.reproduced and result.shared == ["a"] and result.only_earlier == 3
    small["tasks"] = [_task("z", "correct", 1.0)]
    assert not compare_audits(earlier_report(), small).reproduced


def test_another_profile_or_protocol_is_not_a_reproduction_another_machine_is_noted():
    new = earlier_report()
    new["meta"]["machine"] = "GPU Y"
    other_gpu = compare_audits(earlier_report(), new)
    assert other_gpu.reproduced
    assert "note: different machines (GPU X vs GPU Y): speedups compared across machines" in other_gpu.lines()
    new["meta"].update(profile="cuda-l1", protocol={"version": "4"})
    result = compare_audits(earlier_report(), new)
    assert not result.reproduced
    assert "different profiles (? vs cuda-l1): verdicts or speedups mean something else" in result.lines()
    assert "different protocol versions (? vs 4): verdicts or speedups mean something else" in result.lines()
    assert compare_audits(new, new).reproduced


def test_load_audit_accepts_a_folder_and_rejects_what_is_not_a_report(tmp_path):
    (tmp_path / "audit.json").write_text(json.dumps(earlier_report()))
    assert load_audit(tmp_path)["label"] == LABEL
    with pytest.raises(SourceError, match="no audit report"):
        load_audit(tmp_path / "missing")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SourceError, match="not JSON"):
        load_audit(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(SourceError, match="no 'tasks' list"):
        load_audit(tmp_path / "other.json")
    with pytest.raises(SourceError, match="tolerance"):
        compare_audits(earlier_report(), earlier_report(), tolerance=0)


def test_cli_exit_codes_and_json(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(earlier_report()))
    b.write_text(json.dumps(_scaled(earlier_report(), 1.3)))
    assert main(["audit-compare", str(a), str(a), "--json", str(tmp_path / "out" / "c.json")]) == 0
    assert json.loads((tmp_path / "out" / "c.json").read_text())["reproduced"] is True
    assert main(["audit-compare", str(a), str(b)]) == 1
    assert "NOT REPRODUCED" in capsys.readouterr().out
    assert main(["audit-compare", str(a), str(tmp_path / "nope.json")]) == 2


def test_a_speedup_lost_on_one_side_is_not_a_reproduction():
    new = earlier_report()
    new["tasks"][0]["speedup"] = None  # task a: still correct, but no speedup
    new["baseline_coverage"]["per_task"]["b"]["cuda_graph"]["measured_speedup"] = 0.0
    result = compare_audits(earlier_report(), new)
    assert not result.reproduced
    assert set(result.missing) == {"a", "b cuda_graph"}


def test_the_verdict_does_not_depend_on_which_report_comes_first():
    # Two tasks with ratios 0.5 and 1.35: an arithmetic median would pass one way (0.925) and fail the
    # other (1.37); the geometric median is 0.82 one way and its reciprocal the other.
    a, b = earlier_report(), earlier_report()
    b["tasks"][0]["speedup"] = 1.0   # a: 2.0 -> 1.0
    b["tasks"][1]["speedup"] = 2.025  # b: 1.5 -> 2.025
    b["tasks"][3]["status"] = a["tasks"][3]["status"] = "incorrect"
    forward, backward = compare_audits(a, b), compare_audits(b, a)
    assert abs(forward.series[0].median() * backward.series[0].median() - 1) < 1e-12
    assert forward.reproduced == backward.reproduced is False
    assert compare_audits(a, b, tolerance=0.25).reproduced == compare_audits(b, a, tolerance=0.25).reproduced


def test_a_report_without_a_label_keeps_its_own_rows():
    a = earlier_report()
    del a["label"]  # its first row's label is the run's: the cuda-l1 row of task a stays out
    assert compare_audits(a, earlier_report()).reproduced
    a["label"] = "audit:r:other"
    with pytest.raises(SourceError, match="no task rows of its run"):
        compare_audits(a, earlier_report())


def test_malformed_parts_of_a_report_do_not_crash():
    new = earlier_report()
    del new["tasks"][1]["status"]
    new["baseline_coverage"]["per_task"]["a"] = None
    new["meta"] = "not a mapping"
    result = compare_audits(earlier_report(), new)
    assert result.verdict_changes == {"b": ("correct", "None")} and not result.reproduced
    del new["baseline_coverage"]
    lines = compare_audits(earlier_report(), new).lines()
    assert "baselines: none compared (stored kinds on the shared tasks: 2 earlier, 0 new)" in lines


def test_the_band_is_stated_as_it_is_applied():
    result = compare_audits(earlier_report(), _scaled(earlier_report(), 0.905))
    assert not result.reproduced  # 0.905 < 1/1.1
    assert "every median ratio within x1.1 (0.909-1.100)" in result.lines()[0]
