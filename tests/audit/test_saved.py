"""`--report-only` from a saved audit alone: `cudal1 audit` and scripts/audit_release.py rewrite the report from
an audit.json (as committed under docs/audit/) when the results store that produced it is not there."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cudal1.audit.run import AuditConfig, report_only_config
from cudal1.cli.main import main
from cudal1.store import ResultsStore, environment_key
from cudal1.tasks import load_release
from tests.helpers.scripts import load_script

from .test_run import FAST, H200, _store_gpu_results

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "audit_release.py"
SAME_FILES = ("audit.json", "audit_tasks.md", "audit_baselines.md", "report.md")


def _fill_gpu_store(path: Path, release: Path) -> None:
    """What a GPU machine's store holds after an audit: 3 results, one CUDA graph measured, one failed, and
    the eager null test."""
    from cudal1.baselines.runner import baseline_protocol_version

    with ResultsStore(path) as store:
        gpu_cfg = AuditConfig(release=str(release), eval_config=dataclasses.replace(FAST, device="cuda"))
        _store_gpu_results(store, release, gpu_cfg.label)
        version = baseline_protocol_version(report_only_config(gpu_cfg, store).resolved_eval().protocol())
        (t1, _), (t2, _), _ = load_release(release)
        env = environment_key(H200)
        store.put_baseline(t1.hash, "cuda_graph", env, version, 0.5,
                           extra={"status": "ok", "speedup_vs_eager": 2.0, "task_id": t1.id})
        store.put_baseline(t2.hash, "cuda_graph", env, version, 0.0,
                           extra={"status": "failed", "task_id": t2.id, "reason": "capture_error: not permitted"})
        store.put_baseline(t1.hash, "eager", env, version, 1.0,
                           extra={"status": "ok", "speedup_vs_eager": 1.0, "measured_speedup": 1.01,
                                  "task_id": t1.id})


@pytest.fixture
def saved(release, tmp_path, monkeypatch):
    """A report folder made by `cudal1 audit --report-only` from a store, then the store and the release
    removed: only the saved files are left, as in a checkout of the repository."""
    monkeypatch.setenv("CUDAL1_STORE", str(tmp_path / "no-default-store.sqlite"))
    gpu_store = tmp_path / "gpu" / "store.sqlite"
    gpu_store.parent.mkdir()
    _fill_gpu_store(gpu_store, release)
    folder = tmp_path / "saved"
    assert main(["audit", str(release), "--store", str(gpu_store), "--out", str(folder), "--no-plots",
                 "--report-only"]) == 0
    shutil.rmtree(gpu_store.parent)
    release.unlink()
    assert "### vs cuda_graph (1 of 3 tasks have this baseline measured)" in (folder / "report.md").read_text()
    return folder


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ))


def _same_report(a: Path, b: Path) -> None:
    assert json.loads((a / "audit.json").read_text()) == json.loads((b / "audit.json").read_text())
    for name in SAME_FILES:
        assert (a / name).read_text() == (b / name).read_text(), name


def test_cli_report_only_from_the_saved_audit_alone(saved, tmp_path):
    regen = tmp_path / "regen"
    done = _run("-m", "cudal1", "audit", "--report-only", "--from-audit", str(saved), "--out", str(regen),
                "--no-plots")
    assert done.returncode == 0, done.stderr
    printed = " ".join(done.stdout.split())
    assert "measured on NVIDIA H200" in printed and f"saved in {saved / 'audit.json'}" in printed
    assert "audit:tiny:strict: 3/3 evaluated; 3 correct" in printed
    _same_report(saved, regen)
    # No store given and none at the default place: the --out folder's own audit.json, rewritten in place.
    before = (saved / "audit.json").read_text()
    assert main(["audit", "--report-only", "--out", str(saved), "--no-plots"]) == 0
    assert (saved / "audit.json").read_text() == before
    assert not Path(os.environ["CUDAL1_STORE"]).exists()  # a report never creates a store


def test_audit_release_script_report_only_from_its_saved_report(saved, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(saved, out / "report")
    done = _run(str(SCRIPT), str(out), "--report-only", "--no-plots")
    assert done.returncode == 0, done.stderr
    assert "reporting results measured on NVIDIA H200" in done.stdout and "pending (not yet evaluated): 0" in done.stdout
    _same_report(saved, out / "report")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["by_kernel_class"]["pytorch_only"]["rows"] == 3 and summary["phases"] == {}
    assert not (out / "store.sqlite").exists()
    # --from-audit names a saved report elsewhere (e.g. docs/audit/...).
    elsewhere = tmp_path / "elsewhere"
    assert _run(str(SCRIPT), str(elsewhere), "--report-only", "--no-plots", "--from-audit", str(saved)).returncode == 0
    _same_report(saved, elsewhere / "report")


def _script_main(argv: list[str]) -> int:
    return load_script("audit_release").main(argv)


def test_bad_saved_audits_are_one_line_errors(saved, tmp_path, capsys):
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"tasks": [{"task_id": "x", "status": "bogus"}]}))
    cases = [
        (["--report-only", "--out", str(tmp_path / "empty")], "no results store at"),
        (["--report-only", "--from-audit", str(SCRIPT)], "is not an audit report (not JSON"),
        (["--report-only", "--from-audit", str(broken)], "task entry 0 is not a report row"),
        (["other.jsonl", "--report-only", "--from-audit", str(saved)], "is the audit of release 'tiny', not 'other'"),
        (["--report-only", "--from-audit", str(saved), "--profile", "cuda-l1"], "under profile 'strict'"),
        (["--report-only", "--from-audit", str(saved), "--gpu", "NVIDIA H100"], "not on 'NVIDIA H100'"),
        (["--report-only", "--from-audit", str(saved), "--level", "1"], "is reported whole"),
        (["--report-only", "--from-audit", str(saved), "--store", str(tmp_path / "s.sqlite")], "not both"),
        (["--out", str(tmp_path / "x")], "give the RELEASE file"),
    ]
    for argv, words in cases:
        assert main(["audit", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
    assert main(["audit", "--from-audit", str(saved)]) == 2  # a saved audit is only ever reported
    assert "use it with --report-only" in capsys.readouterr().err

    assert _script_main([str(tmp_path / "nothing"), "--report-only", "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no results store at") and len(err.splitlines()) == 1
    assert not (tmp_path / "nothing" / "store.sqlite").exists()
    assert _script_main([str(tmp_path / "o"), "--report-only", "--from-audit", str(broken)]) == 2
    assert "task entry 0 is not a report row" in capsys.readouterr().err
