"""`cudal1 report`, `cudal1 baseline` (eager on CPU, with its null test) and the help texts, in process."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudal1.cli.main import main
from cudal1.core.types import EvalResult, KernelClass, Status, TimingStats
from cudal1.store import ResultsStore
from cudal1.tasks import Task

FIXTURES = Path(__file__).parent.parent / "fixtures"

REF = (__import__("pathlib").Path(__file__).parents[1] / "fixtures" / "tasks" / "tiny_scale_add.py").read_text()


def _fill(path):
    with ResultsStore(path) as store:
        for i, (status, speedup) in enumerate([(Status.CORRECT, 2.0), (Status.CORRECT, 0.8),
                                               (Status.INCORRECT, None)]):
            task = Task(id=f"x/level{1 + i % 2}/t{i}", source=REF + f"\n# {i}\n", level=1 + i % 2)
            store.put_task(task.id, task.source, level=task.level)
            digest = store.put_candidate(f"cand {i}", task_id=task.id,
                                         meta={"published": {"score_default": 1.5}})
            timing = TimingStats(1.0, 1.0 / speedup, speedup, 0.0, [speedup]) if speedup else None
            result = EvalResult(status=status, speedup=speedup, timing=timing, task_id=task.id,
                                candidate_hash=digest, kernel_class=KernelClass.CUSTOM_CUDA,
                                environment={"gpu_name": "FakeGPU", "torch_version": "2.x"})
            store.put_evaluation(result, task_hash=task.hash, key=f"k{i}", label="model-a")


@pytest.mark.parametrize("command", ["report", "baseline", "audit"])
def test_help(command, capsys):
    assert main([command, "--help"]) == 0
    assert "Usage" in capsys.readouterr().out


def test_report_from_a_synthetic_store(tmp_path):
    store = tmp_path / "s.sqlite"
    _fill(store)
    out = tmp_path / "report"
    assert main(["report", "--store", str(store), "--out", str(out), "--no-plots", "--title", "T"]) == 0
    md = (out / "report.md").read_text()
    assert md.startswith("# T") and "model-a" in md and "FakeGPU" in md
    assert "| all | 1.27 | 1.00 |" in md  # mean of [2, 0.8, 1 (failure)] and its median
    assert "Audit of published speedups" in md
    html = (out / "report.html").read_text()
    assert "<table>" in html and "<script" not in html


def _one_task_three_evaluations(path):
    with ResultsStore(path) as store:
        task = Task(id="x/level1/t", source=REF, level=1)
        store.put_task(task.id, task.source, level=task.level)
        for i, speedup in enumerate((1.5, 2.0, None)):
            digest = store.put_candidate(f"cand {i}", task_id=task.id)
            timing = TimingStats(1.0, 1.0 / speedup, speedup, 0.0, [speedup]) if speedup else None
            result = EvalResult(status=Status.CORRECT if speedup else Status.INCORRECT, speedup=speedup,
                                timing=timing, task_id=task.id, candidate_hash=digest,
                                environment={"gpu_name": "cpu", "device_type": "cpu"})
            store.put_evaluation(result, task_hash=task.hash, key=f"k{i}", label="")


def test_report_keeps_every_evaluation_and_says_how_it_counts(tmp_path, capsys):
    """3 evaluations of one task gave a report of "1 result rows" and nothing else."""
    store = tmp_path / "s.sqlite"
    _one_task_three_evaluations(store)
    assert main(["report", "--store", str(store), "--out", str(tmp_path / "r"), "--no-plots"]) == 0
    assert capsys.readouterr().out.startswith("3 evaluation(s) of 1 task(s) from 1 label(s)")
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## Every evaluation (3)" in md and "1 result rows, one per task and run" in md
    section = md.split("## Every evaluation (3)")[1]
    assert section.count("| x/level1/t |") == 3 and "| 2.00 |" in section and "| incorrect |" in section
    assert "CPU timings are noisy" in md  # the header warns: speedups measured on a CPU


def test_report_without_matplotlib_writes_no_plots_and_says_so(tmp_path, capsys, monkeypatch):
    """`cudal1 report --out report/` failed on a base install and left an empty folder."""
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    store = tmp_path / "s.sqlite"
    _fill(store)
    assert main(["report", "--store", str(store), "--out", str(tmp_path / "report")]) == 0
    assert "No plots: matplotlib is not installed (pip install 'cudal1[report]')" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == ["report.html", "report.md"]
    assert main(["report", "--store", str(store), "--out", str(tmp_path / "asked"), "--plots"]) == 2
    assert "pip install 'cudal1[report]'" in capsys.readouterr().err
    assert not (tmp_path / "asked").exists()


def test_a_failed_report_leaves_no_empty_folder(tmp_path, capsys, monkeypatch):
    import cudal1.cli.report_cmd as report_cmd

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(report_cmd, "write_report", fail)
    store = tmp_path / "s.sqlite"
    _fill(store)
    assert main(["report", "--store", str(store), "--out", str(tmp_path / "new")]) == 2
    assert "disk full" in capsys.readouterr().err and not (tmp_path / "new").exists()


def test_unknown_label_is_one_line_error(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    _fill(store)
    assert main(["report", "--store", str(store), "--out", str(tmp_path / "r"), "--label", "nope"]) == 2
    assert "no results labelled nope" in capsys.readouterr().err


def test_baseline_eager_on_cpu_prints_the_null_test(tmp_path, capsys):
    """`cudal1 baseline --kind eager` measures the reference against itself and says how close to 1.00x."""
    task = str(FIXTURES / "tasks" / "tiny_scale_add.py")
    args = ["baseline", "--source", task, "--kind", "eager", "--device", "cpu", "--trials", "2",
            "--buckets", "3", "--store", str(tmp_path / "s.sqlite"), "--no-peaks"]
    assert main(args) == 0
    printed = " ".join(capsys.readouterr().out.split())  # Rich wraps long lines
    assert "(1.00x)" in printed
    assert "Null test (the reference timed as a candidate against itself; no bias would read 1.00x), 1 task(s): " \
        "median" in printed
    assert "unbiased" not in printed  # it read as a claim, beside a median of 0.95x on a CPU


def test_the_null_test_says_how_far_its_median_lies_from_one():
    from cudal1.baselines.runner import BaselineRecord, null_test_summary

    def eager(x):
        return BaselineRecord(task_id="t", task_hash="h", name="eager", status="ok", ms=1.0, ref_ms=1.0,
                              measured_speedup=x)

    assert "median 0.950x (5% low: speedups here lean that way)" in null_test_summary([eager(0.94), eager(0.95),
                                                                                        eager(0.96)])
    assert "(within 1 % of it)" in null_test_summary([eager(1.004)])


def test_baseline_table_shows_time_speedup_and_the_start_of_a_failure_reason():
    from rich.console import Console

    from cudal1.baselines import BaselineRecord
    from cudal1.cli.baseline_cmd import baseline_table

    records = [BaselineRecord("t/a", "h", "eager", "ok", ms=2.0, speedup_vs_eager=1.0),
               BaselineRecord("t/a", "h", "cuda_graph", "failed", reason="capture_error: [bad] capture")]
    console = Console(record=True, width=200)
    console.print(baseline_table(records, ["eager", "cuda_graph", "cudnn"], "baselines"))
    text = console.export_text()
    assert "2.000 (1.00x)" in text and "failed: capture_error: [bad] capture" in text  # brackets kept
    assert text.split("t/a")[1].split("\n")[0].rstrip(" │").endswith("-")  # cudnn: not measured
    narrow = Console(record=True, width=60)  # the task id is cut last, never
    long_id = "builtin/level2/gemm_layernorm_swish"
    narrow.print(baseline_table([BaselineRecord(long_id, "h", "eager", "ok", ms=2.0, speedup_vs_eager=1.0)],
                                ["eager", "torch_compile", "cuda_graph"], "baselines"))
    assert f"│ {long_id} │" in narrow.export_text()


def test_rows_the_report_cannot_use_are_skipped_and_counted(tmp_path, capsys):
    """One `correct` row with a NaN speedup (as an older version could store it) made `cudal1 report` fail as
    "a bug" for the whole store, leaving an empty report/plots/: it is left out, and the report says so."""
    import json
    import sqlite3

    store = tmp_path / "s.sqlite"
    _fill(store)
    with sqlite3.connect(store) as conn:  # the first correct row (2.0x) as an older version wrote it
        (row_id, text), = conn.execute("SELECT id, result_json FROM evaluations WHERE speedup = 2.0").fetchall()
        data = json.loads(text)
        data["speedup"] = data["timing"]["speedup"] = float("nan")
        conn.execute("UPDATE evaluations SET speedup = NULL, result_json = ? WHERE id = ?", (json.dumps(data), row_id))
    out = tmp_path / "report"
    assert main(["report", "--store", str(store), "--out", str(out), "--no-plots"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "unexpected" not in captured.err
    assert "Skipped 1 stored evaluation(s) that cannot be reported (x/level1/t0: a correct verdict with speedup " \
           "nan)" in " ".join(captured.out.split())
    md = (out / "report.md").read_text()
    assert "| skipped | 1 stored evaluation(s)" in md and "x/level2/t1" in md and "nan" not in md.split("skipped")[0]
