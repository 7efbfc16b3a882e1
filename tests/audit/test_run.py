"""Audit runs: resumable through the store, chunked, time-budgeted, relabelled, reported (CPU only)."""

from __future__ import annotations

import dataclasses
import json

from cudal1.audit.run import AuditConfig, audit_label, report_audit, run_audit, stored_result
from cudal1.core.machine import describe_machine
from cudal1.core.types import Status
from cudal1.eval.config import EvalConfig
from cudal1.tasks import load_release

from .conftest import synthetic

FAST = EvalConfig(device="cpu", correctness_trials=2, buckets=3, target_bucket_ms=5.0, warm_buckets=0)


class FakeEvaluate:
    """Stores a synthetic verdict per item exactly where the real pipeline would; records what it saw."""

    def __init__(self, store):
        self.store, self.calls = store, []

    def __call__(self, items, cfg, *, store, force, label, run_id, on_result=None):
        self.calls.append([t.id for t, _ in items])
        out = []
        for task, source in items:
            from cudal1.tasks.task import source_hash
            env = describe_machine(cfg.device)
            key, _ = store.lookup(task.hash, source_hash(source), cfg.protocol(), env)
            result = synthetic(Status.CORRECT, 2.0, env=env, protocol=cfg.protocol()).replace(task_id=task.id)
            store.put_evaluation(result, task_hash=task.hash, key=key, label=label, run_id=run_id)
            out.append(result)
        return out


def _config(release, **kw):
    return AuditConfig(release=str(release), eval_config=FAST, **kw)


def test_chunks_resume_and_cover_everything_once(release, store):
    fake = FakeEvaluate(store)
    first = run_audit(_config(release, chunk="1/2", batch_size=1), store, evaluate=fake)
    assert first.evaluated == 2 and first.pending == 1 and len(first.rows) == 2
    second = run_audit(_config(release, chunk="2/2"), store, evaluate=fake)
    assert second.evaluated == 1 and second.pending == 0
    again = run_audit(_config(release), store, evaluate=fake)
    assert again.evaluated == 0 and again.reused == 3
    assert [len(c) for c in fake.calls] == [1, 1, 1]
    assert {r.task_id for r in again.rows} == {"tiny/level1/1", "tiny/level1/2", "tiny/level2/1"}
    assert all(r.published["score_default"] > 0 for r in again.rows)


def test_time_budget_leaves_work_for_later(release, store):
    fake = FakeEvaluate(store)
    outcome = run_audit(_config(release, time_budget_s=-1.0), store, evaluate=fake)
    assert fake.calls == [] and outcome.skipped_for_time == 3 and outcome.pending == 3


def test_results_from_another_label_are_reused_and_relabelled(release, store):
    cfg = _config(release, profile="strict")
    task, cand = load_release(release)[0]
    resolved = cfg.resolved_eval()
    key, _ = stored_result(store, task, cand.hash, resolved)
    env = describe_machine("cpu")
    store.put_task(task.id, task.source, level=1)
    store.put_evaluation(synthetic(Status.CORRECT, 3.0, env, resolved.protocol()).replace(task_id=task.id),
                         task_hash=task.hash, key=key, label="someone-else")
    fake = FakeEvaluate(store)
    outcome = run_audit(dataclasses.replace(cfg, limit=1), store, evaluate=fake)
    assert outcome.reused == 1 and fake.calls == []
    assert len(store.query_evaluations(label=audit_label("tiny", "strict"))) == 1


def test_prefilled_store_then_real_cpu_evaluation_and_report(release, store, tmp_path):
    """Two items pre-filled (one correct, one wrong); the third goes through the real pipeline on CPU."""
    cfg = _config(release)
    resolved = cfg.resolved_eval()
    pairs = load_release(release)
    env = describe_machine("cpu")
    for (task, cand), (status, speedup) in zip(pairs[1:], [(Status.CORRECT, 1.6), (Status.INCORRECT, None)], strict=True):
        key, _ = stored_result(store, task, cand.hash, resolved)
        store.put_task(task.id, task.source, level=task.level)
        store.put_evaluation(synthetic(status, speedup, env, resolved.protocol()).replace(task_id=task.id),
                             task_hash=task.hash, key=key, label=cfg.label)
    outcome = run_audit(cfg, store)
    assert outcome.evaluated == 1 and outcome.reused == 2 and outcome.pending == 0
    by_id = {r.task_id: r for r in outcome.rows}
    assert by_id["tiny/level1/1"].status == "correct", by_id["tiny/level1/1"]
    assert by_id["tiny/level2/1"].status == "incorrect"
    written = report_audit(outcome, cfg, store, tmp_path / "out", plots=False)
    tasks_md = written["audit_tasks.md"].read_text()
    assert "tiny/level2/1 | 2 | incorrect" in tasks_md and "1.60 / 1.50" in tasks_md
    assert "Audit of published speedups" in written["report.md"].read_text()
    # The audit measured this device's peaks once (cached per device name): the report has speed of light.
    assert store.get_meta(f"peaks/{env['gpu_name']}")["copy_bytes_per_s"] > 0
    assert "Speed of light" in written["report.md"].read_text()


H200 = {"device_type": "cuda", "gpu_name": "NVIDIA H200", "torch_version": "2.11.0+cu130", "cuda_version": "13.0"}
H100 = {**H200, "gpu_name": "NVIDIA H100"}


def _store_gpu_results(store, release, label):
    """Results as two GPU machines stored them: the H200 has all 3 items (speedups 2, 3, 4), the H100 two."""
    measured = dataclasses.replace(FAST, profile="strict").resolved("cuda")  # as the GPU machine ran it
    for i, (task, cand) in enumerate(load_release(release)):
        for env, speedup in ((H200, 2.0 + i), (H100, 1.0)) if i < 2 else ((H200, 2.0 + i),):
            key, _ = stored_result(store, task, cand.hash, measured, env)
            store.put_evaluation(synthetic(Status.CORRECT, speedup, env, measured.protocol()).replace(task_id=task.id),
                                 task_hash=task.hash, key=key, label=label)


def test_report_only_anywhere_reads_the_measuring_machines_results(release, store, tmp_path):
    # Results measured on a GPU (another machine's environment) are reported on this CPU-only box: the
    # environment comes from the store (the GPU with the most results, or the one named), nothing runs.
    import pytest

    from cudal1.audit.run import report_only_config, stored_measurement
    from cudal1.core.errors import ConfigError

    gpu_cfg = AuditConfig(release=str(release), eval_config=dataclasses.replace(FAST, device="cuda"))
    _store_gpu_results(store, release, gpu_cfg.label)
    environment, protocol = stored_measurement(store, gpu_cfg.label)
    assert environment["gpu_name"] == "NVIDIA H200"  # 3 results against 2
    assert protocol["target_bucket_ms"] == FAST.target_bucket_ms and protocol["profile"] == "strict"
    fake = FakeEvaluate(store)
    cfg = report_only_config(gpu_cfg, store)
    outcome = run_audit(cfg, store, evaluate=fake)
    assert fake.calls == [] and outcome.pending == 0
    assert sorted(r.speedup for r in outcome.rows) == [2.0, 3.0, 4.0]
    on_h100 = run_audit(report_only_config(gpu_cfg, store, gpu="NVIDIA H100"), store, evaluate=fake)
    assert [r.speedup for r in on_h100.rows] == [1.0, 1.0] and on_h100.pending == 1
    written = report_audit(outcome, cfg, store, tmp_path / "report", plots=False)
    assert written["report.md"].is_file()
    with pytest.raises(ConfigError, match="nothing to report"):
        report_only_config(dataclasses.replace(gpu_cfg, profile="cuda-l1"), store)
    # More results from an older protocol version cannot be looked up: they must not win the choice.
    old = dataclasses.replace(FAST, profile="strict").resolved("cuda")
    a100 = {**H200, "gpu_name": "NVIDIA A100"}
    for i, (task, cand) in enumerate(load_release(release)):
        for copy in range(2):
            store.put_evaluation(synthetic(Status.CORRECT, 9.0, a100, old.protocol() | {"version": "1"})
                                 .replace(task_id=task.id, candidate_hash=cand.hash),
                                 task_hash=task.hash, key=f"old-{i}-{copy}", label=gpu_cfg.label)
    assert stored_measurement(store, gpu_cfg.label)[0]["gpu_name"] == "NVIDIA H200"
    # Nor CPU results from before the CPU clock's revision (their keys lack it).
    cpu = {**H200, "gpu_name": "cpu", "device_type": "cpu"}
    before = {k: v for k, v in dataclasses.replace(FAST, profile="strict").resolved("cpu").protocol().items()
              if k != "cpu_clock"}
    for i, (task, cand) in enumerate(load_release(release)):
        for copy in range(2):
            store.put_evaluation(synthetic(Status.CORRECT, 9.0, cpu, before)
                                 .replace(task_id=task.id, candidate_hash=f"{cand.hash}-{copy}"),
                                 task_hash=task.hash, key=f"cpu-{i}-{copy}", label=gpu_cfg.label)
    assert stored_measurement(store, gpu_cfg.label)[0]["gpu_name"] == "NVIDIA H200"


def test_report_says_which_baselines_were_measured_failed_or_left(release, store, tmp_path):
    """A GPU machine's store with one CUDA graph baseline measured and one illegal capture, read anywhere."""

    from cudal1.audit.run import report_only_config
    from cudal1.baselines.runner import baseline_protocol_version
    from cudal1.store import environment_key

    gpu_cfg = AuditConfig(release=str(release), eval_config=dataclasses.replace(FAST, device="cuda"))
    _store_gpu_results(store, release, gpu_cfg.label)
    cfg = report_only_config(gpu_cfg, store)
    (t1, _), (t2, _), _ = load_release(release)
    version = baseline_protocol_version(cfg.resolved_eval().protocol())
    store.put_baseline(t1.hash, "cuda_graph", environment_key(H200), version, 0.5,
                       extra={"status": "ok", "speedup_vs_eager": 2.0, "task_id": t1.id})
    store.put_baseline(t2.hash, "cuda_graph", environment_key(H200), version, 0.0,
                       extra={"status": "failed", "task_id": t2.id,
                              "reason": "capture_error: operation not permitted when stream is capturing"})
    outcome = run_audit(cfg, store, evaluate=FakeEvaluate(store))
    written = report_audit(outcome, cfg, store, tmp_path / "report", plots=False)
    md = written["report.md"].read_text()
    assert "| cuda_graph | 1 | 1 | 1 |" in md and "| torch_compile | 0 | 0 | 3 |" in md
    # The summary vs the CUDA graph counts the one task that has it, not three with two failures.
    assert "### vs cuda_graph (1 of 3 tasks have this baseline measured)" in md
    assert f"| {t2.id} | cuda_graph | capture_error: operation not permitted" in md
    assert "Protocol null test" not in md  # no eager baseline stored
    coverage = json.loads(written["audit.json"].read_text())["baseline_coverage"]
    assert coverage["tasks"] == 3 and "eager" not in coverage["kinds"] and coverage["null_test"] == []
    assert coverage["failures"] == [{"task_id": t2.id, "baseline": "cuda_graph",
                                     "reason": "capture_error: operation not permitted when stream is capturing"}]

    # Asked per kind (CUDA graph for every task, torch.compile for a one-task sample): each counts its own.
    asked = {"cuda_graph": {t.id for t, _ in outcome.selected}, "torch_compile": {t1.id}}
    md = report_audit(outcome, cfg, store, tmp_path / "asked", plots=False, asked=asked)["report.md"].read_text()
    assert "| Baseline | Asked | Measured | Failed | Not measured |" in md
    assert "| cuda_graph | 3 | 1 | 1 | 1 |" in md and "| torch_compile | 1 | 0 | 0 | 1 |" in md
    assert "| cudnn |" not in md  # nobody asked for it

    # The eager baseline's own paired measurement (reference vs itself) is reported as the null test.
    for task, measured in ((t1, 1.02), (t2, 0.98)):
        store.put_baseline(task.hash, "eager", environment_key(H200), version, 1.0,
                           extra={"status": "ok", "speedup_vs_eager": 1.0, "measured_speedup": measured,
                                  "task_id": task.id})
    written = report_audit(outcome, cfg, store, tmp_path / "null", plots=False)
    md = " ".join(written["report.md"].read_text().split())
    assert "### Protocol null test" in md
    assert ("Null test (the reference timed as a candidate against itself; no bias would read 1.00x), 2 task(s): "
            "median 1.000x (within 1 % of it), p5 0.982x, p95 1.018x (min 0.980x, max 1.020x).") in md
    assert json.loads(written["audit.json"].read_text())["baseline_coverage"]["null_test"] == [0.98, 1.02]

    # Every stored baseline per task, in the cells `cudal1 baseline` prints.
    table = written["audit_baselines.md"].read_text()
    assert "| Task | eager | cuda_graph |" in table
    assert f"| {t1.id} | 1.000 (1.00x) | 0.500 (2.00x) |" in table
    assert f"| {t2.id} | 1.000 (1.00x) | failed: capture_error: operation not permitted when stream is capturing |" in table


def test_cli_audit_counts_only_the_baselines_it_asked_for(release, store, tmp_path):
    # On CPU the CUDA graph fails at once (cached with its reason); torch.compile was not asked for, so it is
    # not a row of "not measured yet".
    from cudal1.cli.main import main

    out = tmp_path / "rep"
    args = ["audit", str(release), "--store", str(store.path), "--no-plots", "--trials", "2", "--buckets", "3"]
    assert main([*args, "--out", str(out), "--baselines", "cuda_graph", "--chunk", "1/2"]) == 0
    md = (out / "report.md").read_text()
    assert "| cuda_graph | 2 | 0 | 2 | 0 |" in md and "| torch_compile |" not in md  # chunk 1/2: 2 of 3 tasks
    assert "| tiny/level1/1 | cuda_graph | cuda_graph needs a CUDA device |" in md
    # A report made later, from the store alone, counts the same: the runs recorded what they asked for.
    assert main([*args, "--out", str(tmp_path / "later"), "--report-only"]) == 0
    assert "| cuda_graph | 2 | 0 | 2 | 0 |" in (tmp_path / "later" / "report.md").read_text()


def test_cli_report_only_without_a_gpu(release, store, tmp_path, capsys):
    from cudal1.cli.main import main

    _store_gpu_results(store, release, audit_label("tiny", "strict"))
    out = tmp_path / "rep"
    args = ["audit", str(release), "--store", str(store.path), "--out", str(out), "--no-plots", "--trials", "2",
            "--buckets", "3", "--report-only"]
    assert main(args) == 0
    printed = " ".join(capsys.readouterr().out.split())  # Rich wraps long lines
    assert "measured on NVIDIA H200" in printed and "3/3 evaluated" in printed
    assert (out / "report.md").is_file()
    assert main([*args, "--profile", "cuda-l1"]) == 2  # nothing stored under that profile: one-line error
    assert "nothing to report" in capsys.readouterr().err

    # --compare-to: the same store reproduces its own report; a report with other verdicts does not (exit 1).
    assert main([*args, "--out", str(tmp_path / "again"), "--compare-to", str(out)]) == 0
    assert json.loads((tmp_path / "again" / "comparison.json").read_text())["reproduced"] is True
    other = json.loads((out / "audit.json").read_text())
    for row in other["tasks"]:
        row["status"] = "compile_error"
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert main([*args, "--out", str(tmp_path / "third"), "--compare-to", str(tmp_path / "other.json")]) == 1
    assert "NOT REPRODUCED: 3 shared tasks; verdicts agree on 0" in " ".join(capsys.readouterr().out.split())
    assert main([*args, "--compare-to", str(tmp_path / "missing.json")]) == 2  # checked before any work


def _fake_gpu(monkeypatch, prebuild):
    """run_audit on a pretend GPU: records the build pass, the worker supply and the batches."""
    import contextlib
    from types import SimpleNamespace

    from cudal1.audit import run as run_mod

    events = []
    supply = SimpleNamespace(fill=lambda: events.append("fill"))
    monkeypatch.setattr(run_mod, "resolve_device", lambda device: "cuda:0")
    monkeypatch.setattr(run_mod, "describe_machine", lambda device: {"device_type": "cuda", "gpu_name": "test"})
    monkeypatch.setattr(run_mod, "_audit_runners", lambda cfg, n: contextlib.nullcontext(supply))
    monkeypatch.setattr(run_mod, "_default_evaluate", lambda items, *a, runners=None, **kw: events.append(
        (len(items), runners is supply)) or [None] * len(items))
    monkeypatch.setattr(run_mod, "prebuild", lambda items, cfg, **kw: prebuild(events, items, kw))
    return events


def test_gpu_audit_builds_every_pending_candidate_before_its_batches(release, store, monkeypatch):
    # One parallel build pass for the whole chunk (batch by batch, each batch waited for its slowest build),
    # while the first runners start; every batch then uses the same warm runners.
    def prebuild(events, items, kw):
        assert callable(kw["should_cancel"]) and not kw["should_cancel"]()  # the time budget can stop it
        assert kw["warm_lazy"] is True  # the GPU is idle during the pass: lazy builds are triggered there
        events.append(("build", len(items)))

    events = _fake_gpu(monkeypatch, prebuild)
    run_audit(_config(release, batch_size=2), store)
    assert events == ["fill", ("build", 3), (2, True), (1, True)]


def test_gpu_audit_survives_a_failed_build_pass_and_report_only_builds_nothing(release, store, monkeypatch):
    def broken(events, items, kw):
        events.append("build")
        raise OSError("No space left on device")

    events = _fake_gpu(monkeypatch, broken)
    outcome = run_audit(_config(release, batch_size=3), store)
    assert events == ["fill", "build", (3, True)] and outcome.evaluated == 3  # each builds when evaluated
    events.clear()
    run_audit(_config(release, environment={"device_type": "cuda", "gpu_name": "test"}), store)
    assert "build" not in events and "fill" not in events


def test_a_timeout_under_a_smaller_limit_is_reported_but_evaluated_again(release, store):
    from cudal1.audit.run import collect_audit

    fake = FakeEvaluate(store)
    run_audit(_config(release), store, evaluate=fake)
    task, cand = load_release(release)[0]
    cfg, env = _config(release).resolved_eval(), describe_machine("cpu")
    key, _ = store.lookup(task.hash, cand.hash, cfg.protocol(), env)
    short = dataclasses.replace(cfg, timeout_s=5.0).limits()
    store.put_evaluation(synthetic(Status.TIMEOUT, protocol={**cfg.protocol(), **short}, env=env)
                         .replace(task_id=task.id, candidate_hash=cand.hash),
                         task_hash=task.hash, key=key, label=_config(release).label)
    # The report shows what is stored, the timeout included; an audit allowing 600 s evaluates it again.
    rows = collect_audit(_config(release), store).rows
    assert len(rows) == 3 and [r.status for r in rows if r.task_id == task.id] == ["timeout"]
    fake.calls.clear()
    run_audit(_config(release), store, evaluate=fake)
    assert fake.calls == [[task.id]]
