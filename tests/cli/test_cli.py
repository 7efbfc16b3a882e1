"""The CLI in-process: --help everywhere, task listing, and evaluation verdicts as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudal1.cli.main import app, main

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _commands():
    import typer.main

    group = typer.main.get_command(app)
    names = []
    for name, cmd in group.commands.items():
        names.append([name])
        for sub in getattr(cmd, "commands", {}):
            names.append([name, sub])
    return names


@pytest.mark.parametrize("argv", _commands(), ids=lambda a: " ".join(a))
def test_help_for_every_command(argv, capsys):
    assert main([*argv, "--help"]) == 0
    assert "Usage" in capsys.readouterr().out


def test_tasks_list_builtin_json(capsys):
    assert main(["tasks", "list", "--source", "builtin", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) >= 24 and all(r["id"].startswith("builtin/") for r in rows)


def test_tasks_show(capsys):
    assert main(["tasks", "show", "builtin/level1/matmul_square", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["id"] == "builtin/level1/matmul_square" and info["inputs"]


def test_unknown_source_is_one_line_error(capsys):
    assert main(["tasks", "list", "--source", "/no/such/place"]) == 2
    err = capsys.readouterr().err
    assert "unknown task source" in err and "Traceback" not in err


def test_eval_missing_file_is_one_line_error(capsys):
    assert main(["eval", "--candidate", "/no/file.py", "--ref", "/no/ref.py", "--no-store"]) == 2
    assert "no such candidate file" in capsys.readouterr().err


@pytest.mark.parametrize("name, status", [
    ("correct", "correct"), ("wrong_values", "incorrect"), ("wrong_shape", "incorrect"),
    ("raising", "runtime_error"), ("hanging", "timeout"),
])
def test_eval_statuses(name, status, capsys):
    argv = ["eval", "--ref", str(FIXTURES / "tasks" / "tiny_scale_add.py"),
            "--candidate", str(FIXTURES / "eval" / f"{name}.py"), "--device", "cpu", "--trials", "2",
            "--buckets", "2", "--timeout-s", "8" if status == "timeout" else "120", "--json", "--no-store"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["status"] == status
    for key in ("speedup", "ref_ms", "candidate_ms", "stability", "flags", "message"):
        assert key in out
    assert (out["speedup"] is not None) == (status == "correct")


def test_check_exit_code_gates_on_rejection(capsys):
    corpus = FIXTURES / "candidates"
    assert main(["check", str(corpus / "exploits" / "stream_python.py"), "--ref", str(corpus / "refs" / "relu.py"),
                 "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["kernel_class"] == "pytorch_only"
    assert any(f["rule"] == "extra_cuda_stream" and f["severity"] == "error" for f in report["flags"])
    assert main(["check", str(corpus / "honest" / "cuda_relu.py")]) == 0
    assert "kernel class: custom_cuda" in capsys.readouterr().out


def test_eval_batch_through_a_local_pool_stores_every_result(tmp_path, capsys):
    ref = (FIXTURES / "tasks" / "tiny_scale_add.py").read_text()
    rows = [{"level_id": 1, "task_id": i, "ref_code": ref, "custom_code": (FIXTURES / "eval" / f"{name}.py").read_text()}
            for i, name in ((1, "correct"), (2, "wrong_values"))]
    release = tmp_path / "release.jsonl"
    release.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = tmp_path / "store.sqlite"
    argv = ["eval", "--release", str(release), "--workers", "local", "--device", "cpu", "--trials", "2",
            "--buckets", "2", "--json", "--store", str(store)]
    assert main(argv) == 0
    first = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert sorted(r["status"] for r in first) == ["correct", "incorrect"]
    assert main(argv) == 0  # the pool wrote the store: the second run is served from it
    second = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert sorted(r["status"] for r in second) == ["correct", "incorrect"] and all(r["cached"] for r in second)
