"""An audit by chunks: each chunk plans what the committed records leave, fits its budget, writes its record
line by line; a later run continues where it stopped; items and baselines are shared across releases by
content; the pages are rebuilt from the records alone and say what has not run on a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudal1.audit.chunks import ChunkConfig, CostModel, done_keys, ingest_chunks, plan_chunk, run_chunk
from cudal1.audit.pages import PagesConfig, rebuild
from cudal1.audit.records import read_chunk, read_chunks
from cudal1.audit.select import select_items
from cudal1.audit.static_half import write_static_records
from cudal1.baselines.runner import BaselineRecord
from cudal1.core.errors import SourceError
from cudal1.core.types import EvalResult, KernelClass, Status, TimingStats
from cudal1.eval.config import PROTOCOL_VERSION
from cudal1.tasks import load_release

from .conftest import release_rows

#: One evaluation costs 10 s and nothing else does: a budget of 25 s holds two.
COSTS = CostModel(fixed_s=0.0, eval_s=10.0, build_wave_s=0.0, baseline_s=0.0, compile_baseline_s=0.0,
                  compile_warm_s=0.0)


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def data(tmp_path):
    """Two releases of the same three tasks: `second` publishes the first two candidates of `first` again and
    another candidate for the third task."""
    folder = tmp_path / "data"
    folder.mkdir()
    first = release_rows()
    second = [dict(r) for r in first]
    second[2]["custom_code"] = second[2]["custom_code"].replace("x * 5", "x * 3")  # now right
    _write(folder / "first.jsonl", first)
    _write(folder / "second.jsonl", second)
    audit = tmp_path / "audit"
    for name in ("first", "second"):
        write_static_records(folder / f"{name}.jsonl", audit)
    return folder, audit


class FakeGPU:
    """`evaluate_many` and `ensure_baselines` stand-ins that answer at once, as the evidence pass would."""

    def __init__(self):
        self.evaluated: list[str] = []
        self.baselines: list[tuple[str, str]] = []

    def evaluate(self, pairs, cfg, *, on_result=None, **_):
        assert cfg.profile == "evidence"
        results = []
        for i, (task, source) in enumerate(pairs):
            self.evaluated.append(task.id)
            wrong = "x * 5" in source
            result = EvalResult(
                status=Status.INCORRECT if wrong else Status.CORRECT, speedup=None if wrong else 2.0,
                timing=None if wrong else TimingStats(ref_ms=1.0, candidate_ms=0.5, speedup=2.0, stability=0.01,
                                                       bucket_speedups=[2.0], speedup_warm=1.8),
                kernel_class=KernelClass.PYTORCH_ONLY, duration_s=3.0, message="output 0: off" if wrong else "",
                protocol={"profile": "evidence", "version": PROTOCOL_VERSION, "reached": "done", "stops": []})
            on_result(i, result)
            results.append(result)
        return results

    def measure(self, tasks, kinds, cfg, *, on_result=None, **_):
        assert cfg.profile == "strict"
        for task in tasks:
            for kind in kinds:
                self.baselines.append((task.id, kind))
                on_result(task, kind, BaselineRecord(task.id, task.hash, kind, "ok", ms=0.5,
                                                     speedup_vs_eager=1.0 if kind == "eager" else 1.25,
                                                     ref_ms=1.0, measured_speedup=1.01))


def _chunk(data, fake, release, out, **kw):
    folder, audit = data
    config = ChunkConfig(release=release, out_dir=str(out), audit_dir=str(audit), data_dir=str(folder),
                         budget_s=25.0, device="cpu", baselines=("eager", "cuda_graph"), costs=COSTS, **kw)
    return run_chunk(config, evaluate=fake.evaluate, measure=fake.measure)


def test_chunks_continue_where_the_committed_records_stopped(data, tmp_path):
    folder, audit = data
    fake = FakeGPU()
    first = _chunk(data, fake, "first", tmp_path / "run1")
    assert [t.id for t, _ in first.plan.items] == ["first/level1/1", "first/level1/2"]  # 2 x 10 s fit 25 s
    assert first.evaluated == 2 and first.baselines == 2 and first.left == []  # eager's null test comes last
    chunk = read_chunk(first.path)
    assert chunk.complete and chunk.release == "first" and chunk.header["purpose"] == "audit"
    assert chunk.header["protocol"]["profile"] == "evidence" and chunk.header["environment"]["gpu_name"] == "cpu"
    assert chunk.header["planned"] == ["first/level1/1", "first/level1/2"] and chunk.header["code_sha256"]
    assert "source" not in json.dumps(chunk.results) and "ModelNew" not in first.path.read_text()
    # Not ingested yet: a second run would plan the same items.
    assert [t.id for t, _ in _chunk(data, FakeGPU(), "first", tmp_path / "again").plan.items][0] == "first/level1/1"
    assert ingest_chunks([tmp_path / "run1"], audit) == [audit / "chunks" / first.path.name]
    assert ingest_chunks([tmp_path / "run1"], audit) == []  # the same record again: nothing to do
    second = _chunk(data, fake, "first", tmp_path / "run2")
    assert [t.id for t, _ in second.plan.items] == ["first/level2/1"] and second.plan.pending == 1
    ingest_chunks([tmp_path / "run2"], audit)
    # The other release: two of its pairs are the same content (done), its third candidate is new; the shared
    # tasks' baselines are done on this card.
    other = _chunk(data, fake, "second", tmp_path / "run3")
    assert [t.id for t, _ in other.plan.items] == ["second/level2/1"] and other.plan.baselines == []
    ingest_chunks([tmp_path / "run3"], audit)
    # Nothing left to evaluate: the deferred baselines (eager's null test) of the tasks evaluated on this card.
    last = _chunk(data, fake, "second", tmp_path / "run4")
    assert not last.plan.items and [(t.id, k) for t, k in last.plan.baselines] == [
        ("second/level1/1", "eager"), ("second/level1/2", "eager"), ("second/level2/1", "eager")]
    ingest_chunks([tmp_path / "run4"], audit)
    assert _chunk(data, fake, "second", tmp_path / "run5").plan.empty
    assert fake.evaluated == ["first/level1/1", "first/level1/2", "first/level2/1", "second/level2/1"]
    tasks = [f"level{lv}/{n}" for lv, n in ((1, 1), (1, 2), (2, 1))]
    assert sorted(fake.baselines) == sorted([(f"first/{t}", "cuda_graph") for t in tasks]
                                            + [(f"second/{t}", "eager") for t in tasks])


def test_plan_fits_the_budget_and_takes_at_least_one(data):
    folder, _ = data
    items = select_items(load_release(folder / "first.jsonl"))
    assert len(plan_chunk(items, set(), set(), (), 5.0, COSTS).items) == 1  # over budget, but one goes
    assert len(plan_chunk(items, set(), set(), (), 1000.0, COSTS, max_items=2).items) == 2
    done = {(items[0][0].hash, items[0][1].hash)}
    plan = plan_chunk(items, done, set(), ("cuda_graph", "eager"), 1000.0, COSTS)
    assert [t.id for t, _ in plan.items] == ["first/level1/2", "first/level2/1"] and plan.pending == 2
    assert [(t.id, k) for t, k in plan.baselines] == [("first/level1/2", "cuda_graph"),
                                                      ("first/level2/1", "cuda_graph")]
    # Nothing pending: the baselines of the tasks evaluated here only.
    rest = plan_chunk(items, {(t.hash, c.hash) for t, c in items}, set(), ("eager",), 1000.0, COSTS, here=done)
    assert [(t.id, k) for t, k in rest.baselines] == [("first/level1/1", "eager")]


def test_a_record_cut_short_keeps_what_it_measured(data, tmp_path):
    fake = FakeGPU()
    outcome = _chunk(data, fake, "first", tmp_path / "run")
    lines = outcome.path.read_text().splitlines()
    cut = tmp_path / "cut" / outcome.path.name
    cut.parent.mkdir()
    cut.write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])  # killed while writing line 4
    chunk = read_chunk(cut)
    assert not chunk.complete and len(chunk.results) == 2 and chunk.elapsed_s >= 0
    assert done_keys([chunk]) == done_keys(read_chunks(tmp_path / "run"))
    with pytest.raises(SourceError, match="not a chunk record"):
        read_chunk(_write(tmp_path / "x.jsonl", [{"kind": "result"}]))


def test_pages_from_the_records_alone(data, tmp_path, monkeypatch):
    """The pages say what has not run on a GPU; a release with results gets a standard audit folder that
    `cudal1 audit --report-only --from-audit` reads back byte for byte."""
    from cudal1.cli.main import main

    folder, audit = data
    fake = FakeGPU()
    ingest_chunks([_chunk(data, fake, "first", tmp_path / "run1").path], audit)
    rebuild(PagesConfig(audit_dir=str(audit), earlier=(), plots=False))
    readme = (audit / "README.md").read_text()
    assert "| first | 3 | 3 | 2 | 1 of 3 |" in readme and "| second | 3 | 3 | 2 | 1 of 3 |" in readme
    assert "saves 2 of them" in readme
    page = (audit / "first.md").read_text()
    assert "**Not yet run on a GPU: 1 of 3 tasks.**" in page and "Card: cpu." in page
    assert "| first/level1/1 | 2.00x | 2.00x | 1.60x | 1.00x | yes | cpu |" in page  # ours vs CUDA graphs 2/1.25
    saved = json.loads((audit / "first" / "audit.json").read_text())
    assert saved["label"] == "audit:first:strict" and len([t for t in saved["tasks"]
                                                          if t["label"] == saved["label"]]) == 2
    # Against an earlier audit of the release: every changed verdict, and what the source alone says now.
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "audit.json").write_text(json.dumps({"label": "audit:first:strict", "meta": {}, "tasks": [
        {"task_id": "first/level1/1", "label": "audit:first:strict", "status": "compile_error", "flags": []},
        {"task_id": "first/level1/2", "label": "audit:first:strict", "status": "correct", "flags": [],
         "speedup": 2.0}]}))
    rebuild(PagesConfig(audit_dir=str(audit), earlier=(f"first={earlier}",), plots=False))
    compared = (audit / "first-vs-earlier.md").read_text()
    assert "2 shared tasks; verdicts agree on 1; 1 changed" in compared
    assert "| first/level1/1 | compile_error | correct | unexplained | same flags |" in compared
    assert "| compile_error | runs | 1 |" in (audit / "first.md").read_text()
    assert "[first-vs-earlier.md](first-vs-earlier.md)" in (audit / "README.md").read_text()
    # A re-check of one task (its record says so): shown beside the committed result, never replacing it.
    recheck = _chunk(data, fake, "first", tmp_path / "run2", tasks=("first/level1/1",), redo=True)
    assert read_chunk(recheck.path).header["purpose"] == "recheck" and recheck.evaluated == 1
    ingest_chunks([recheck.path], audit)
    rebuild(PagesConfig(audit_dir=str(audit), earlier=(), plots=False))
    assert "1 results evaluated again (cpu): 1 with the committed `strict` verdict" in (audit / "first.md").read_text()
    regen = tmp_path / "regen"
    monkeypatch.setenv("CUDAL1_STORE", str(tmp_path / "none.sqlite"))
    assert main(["audit", "--report-only", "--from-audit", str(audit / "first"), "--out", str(regen),
                 "--no-plots"]) == 0
    for name in ("audit.json", "audit_tasks.md", "audit_baselines.md", "report.md", "report.html"):
        assert (regen / name).read_bytes() == (audit / "first" / name).read_bytes(), name


def test_ingest_refuses_a_record_of_another_release_file(data, tmp_path):
    folder, audit = data
    outcome = _chunk(data, FakeGPU(), "first", tmp_path / "run")
    text = outcome.path.read_text()
    head, _, rest = text.partition("\n")
    forged = tmp_path / "forged" / "first-x.jsonl"
    forged.parent.mkdir()
    forged.write_text(json.dumps({**json.loads(head), "release_sha256": "0" * 64}) + "\n" + rest)
    with pytest.raises(SourceError, match="another version of release 'first'"):
        ingest_chunks([forged], audit)


def test_a_real_chunk_on_the_cpu_through_the_script(data, tmp_path):
    """The GPU command, on the CPU: one real evaluation under the evidence pass (the CUDA graph cannot be
    measured on a CPU: recorded as failed, with why); then, nothing left to evaluate, eager's null test."""
    from tests.helpers.scripts import load_script

    folder, audit = data
    script = load_script("audit_release")
    argv = ["chunk", "--release", "first", "--audit-dir", str(audit), "--data-dir", str(folder), "--device", "cpu",
            "--budget-s", "300", "--baselines", "cuda_graph,eager", "--task", "first/level1/1"]
    assert script.main([*argv, "--out", str(tmp_path / "out1")]) == 0
    [path] = (tmp_path / "out1").glob("first-*.jsonl")
    chunk = read_chunk(path)
    assert [r["status"] for r in chunk.results] == ["correct"] and chunk.results[0]["profile"] == "evidence"
    assert chunk.results[0]["reached"] == "done" and chunk.complete and chunk.end["left"] == []
    [graph] = chunk.baselines
    assert graph["name"] == "cuda_graph" and graph["status"] == "failed" and "CUDA" in graph["reason"]
    assert script.main(["ingest", str(tmp_path / "out1"), "--audit-dir", str(audit), "--no-plots"]) == 0
    assert script.main([*argv, "--out", str(tmp_path / "out2")]) == 0
    [path] = (tmp_path / "out2").glob("first-*.jsonl")
    chunk = read_chunk(path)
    assert not chunk.results and [(b["name"], b["status"]) for b in chunk.baselines] == [("eager", "ok")]
    assert chunk.baselines[0]["measured_speedup"] > 0
