"""scripts/audit_release.py: its phases (a sample, then everything, then baselines) end in one report of the
whole release (CPU; evaluations faked where the real pipeline would store them)."""

from __future__ import annotations

import json

from cudal1.audit import run
from cudal1.tasks import load_release
from tests.helpers.scripts import load_script

from .test_run import FakeEvaluate


def _script():
    return load_script("audit_release")


def test_the_report_after_all_phases_covers_the_whole_release(release, store, tmp_path, monkeypatch, capsys):
    fake = FakeEvaluate(store)
    monkeypatch.setattr(run, "_default_evaluate", fake)
    monkeypatch.setattr(run, "_ensure_peaks", lambda cfg, store: None)
    out = tmp_path / "out"
    args = [str(out), "--release", str(release), "--store", str(store.path), "--device", "cpu",
            "--sample-per-level", "1", "--baselines", "", "--all-baselines", "", "--no-plots"]
    assert _script().main(args) == 0
    assert sorted(len(c) for c in fake.calls) == [1, 2]  # the sample (one per level), then the rest
    summary = json.loads((out / "summary.json").read_text())
    assert summary["phases"]["sample"]["evaluated"] == 2 and summary["phases"]["all"]["evaluated"] == 1
    assert summary["phases"]["sample_baselines"]["baselines_measured"] == 0
    # The last phase selects only the sample; the report still shows every task of the release.
    assert "| selected | 3 |" in (out / "report" / "report.md").read_text()
    assert "pending (not yet evaluated): 0" in capsys.readouterr().out


def test_baseline_phases_count_what_they_measured_and_reused(release, store, tmp_path, monkeypatch):
    from cudal1.baselines import BaselineRecord, runner

    monkeypatch.setattr(run, "_default_evaluate", FakeEvaluate(store))
    monkeypatch.setattr(run, "_ensure_peaks", lambda cfg, store: None)
    first = load_release(release)[0][0]
    monkeypatch.setattr(runner, "measure_baseline", lambda task, kind, *a, **k: BaselineRecord(
        task_id=task.id, task_hash=task.hash, name=kind, status="ok", ms=1.0, speedup_vs_eager=1.0,
        cached=task.id == first.id))
    out = tmp_path / "out"
    assert _script().main([str(out), "--release", str(release), "--store", str(store.path), "--device", "cpu",
                           "--baselines", "", "--all-baselines", "cuda_graph", "--no-plots"]) == 0
    phases = json.loads((out / "summary.json").read_text())["phases"]
    assert phases["all_baselines"]["baselines_measured"] == 2 and phases["all_baselines"]["baselines_reused"] == 1
    assert phases["all_baselines"]["baselines_left_for_later"] == 0
    assert phases["sample_baselines"]["baselines_measured"] == 0  # no kinds asked for the sample
