"""The CLI in-process: --help everywhere, task listing, and evaluation verdicts as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudal1.cli.main import app, main
from cudal1.core.schemas import schema_problems

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


@pytest.mark.parametrize("argv", [[], *_commands()], ids=lambda a: " ".join(a) or "cudal1")
def test_help_at_80_columns_cuts_nothing(argv, capsys, monkeypatch):
    """Rich's help panels cut examples (`'openai:MODEL@ht…`) and option names at 80 columns."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main([*argv, "--help"]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 80 for line in out.splitlines()), out
    body = "\n".join(line for line in out.splitlines() if not line.startswith("Usage:"))  # [ARGS]...
    assert "…" not in out and "..." not in body, out  # click marks a cut summary with "..."


def test_help_in_an_80_column_terminal_keeps_the_llm_example_whole():
    from tests.cli._pty import run_in_terminal

    code, screen = run_in_terminal(["optimize", "--help"], 80)
    assert code == 0 and "'openai:MODEL@http://host:port/v1'" in screen, screen


def test_tasks_list_builtin_json(capsys):
    assert main(["tasks", "list", "--source", "builtin", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) >= 24 and all(r["id"].startswith("builtin/") for r in rows)


def test_tasks_list_at_80_columns_shows_every_id_whole():
    import os
    import subprocess
    import sys

    from cudal1.tasks.sources import load_builtin

    out = subprocess.run([sys.executable, "-m", "cudal1.cli.main", "tasks", "list"], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "80"}, timeout=120).stdout
    assert all(len(line) <= 80 for line in out.splitlines())
    for task in load_builtin():
        assert f"│ {task.id} " in out, task.id


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
    assert schema_problems("eval_result", out) == []  # cudal1/schemas/eval_result.schema.json
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
    assert main([a for a in argv if a != "--json"]) == 0  # the table says which rows come from the store
    table = capsys.readouterr().out
    assert "│ correct* " in table and "│ incorrect* " in table, table
    assert "read from the results store" in " ".join(table.split())


def _bad_inputs(tmp: Path) -> list[tuple[list[str], str]]:
    """(argv, words the one-line error must contain) for bad input a user can type."""
    ref = str(FIXTURES / "tasks" / "tiny_scale_add.py")
    good = str(FIXTURES / "eval" / "correct.py")
    binary = tmp / "binary.py"
    binary.write_bytes(b"\xff\xfe\x00junk")
    (tmp / "r.jsonl").write_text(json.dumps({"level_id": 1, "task_id": 1, "ref_code": "x = 1",
                                             "custom_code": "y = 2"}) + "\n")
    afile = tmp / "afile"
    afile.write_text("x")
    fast = ["--device", "cpu", "--trials", "2", "--buckets", "2"]
    return [
        (["eval", "--ref", ref, "--candidate", str(binary), "--no-store"], "is not UTF-8 text"),
        (["check", str(binary)], "is not UTF-8 text"),
        (["eval", "--ref", ref, "--candidate", str(tmp), "--no-store"], "is a folder"),
        (["eval", "--ref", ref, "--candidate", good, "--no-store", "--store", str(tmp / "s.sqlite")], "not both"),
        (["eval", "--ref", ref, "--candidate", good, "--no-store", "--timeout-s", "-1", *fast],
         "Invalid value for '--timeout-s': -1 is not > 0"),
        (["eval", "--ref", ref, "--candidate", good, "--no-store", "--trials", "0"], "'--trials'"),
        (["eval", "--ref", ref, "--candidate", good, "--no-store", "--profile", "kernelbench-v1"],
         "Invalid value for '--profile'"),
        (["eval", "--ref", ref, "--candidate", good, "--no-store", "--device", "gpu"], "'--device'"),
        (["optimize", "x", "--llm", "openai:m", "--rounds", "0"], "'--rounds'"),
        (["serve", "--max-queue", "0"], "'--max-queue'"),
        (["audit", str(tmp / "nowhere.jsonl"), "--out", str(tmp / "aud"), "--store", str(tmp / "a.sqlite")],
         "no such release file"),
        (["eval", "--candidates-dir", str(tmp / "nowhere"), "--no-store"], "no such folder"),
        (["audit-chunk", "nowhere", "--out", str(tmp / "chunk"), "--device", "cpu", "--data-dir", str(tmp)],
         "no release 'nowhere'"),
        (["audit-ingest", str(tmp / "nowhere"), "--audit-dir", str(tmp / "aud-dir")], "no chunk record at"),
        (["audit-pages", "--audit-dir", str(tmp / "aud-dir")], "holds no static records"),
        (["eval", "--release", str(tmp / "r.jsonl"), "--limit", "0", "--no-store"], "--limit"),
        (["report", "--out", str(afile), "--store", str(tmp / "s.sqlite")], "is a file, not a folder"),
        (["report", "--out", str(tmp / "rep"), "--store", str(tmp / "none.sqlite")], "no results store"),
        (["baseline", "--task", "no_such_task", "--device", "cpu", "--store", str(tmp / "b.sqlite")],
         "no task no_such_task"),
        (["quickstart", "--form", "bogus", "--device", "cpu", "--no-store"], "unknown example form"),
        (["report", "--out", str(afile / "sub"), "--store", str(tmp / "s.sqlite")], "cannot create output folder"),
        (["audit", str(tmp / "r.jsonl"), "--out", str(afile / "sub"), "--store", str(tmp / "a.sqlite")],
         "cannot create output folder"),
        (["judge", good, "--ref", ref, "--result", str(afile), "--prompt-only", "--store", str(tmp / "j.sqlite")],
         "is not a cudal1 eval --json result"),
        (["train", "sft", "--config", str(binary), "--model", "scratch", "--dataset", str(afile), "-o",
          str(tmp / "run")], "cannot read config"),
    ]


def test_bad_input_gets_a_one_line_error(tmp_path, capsys):
    for argv, words in _bad_inputs(tmp_path):
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        err = " ".join((captured.err + captured.out).split())
        assert words in err and "Traceback" not in err, (argv, err)
        assert len(captured.err.strip().splitlines()) == 1, (argv, captured.err)  # one line
    assert not (tmp_path / "none.sqlite").exists()  # a report never creates an empty store
    assert not (tmp_path / "aud").exists()  # a failed audit leaves no empty folder


def test_a_mistyped_option_is_one_line_naming_the_option(capsys):
    """click's usage errors took four lines; an internal field name stood for the flag."""
    assert main(["eval", "--trials", "many"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "'--trials'" in err and "eval --help" in err
    assert "correctness_trials" not in err


def test_the_old_profile_kernelbench_is_the_loose_profile(capsys):
    """`--profile kernelbench` (an old spelling) beside `--policy kernelbench`: measured `loose`, judged by the
    policy named."""
    argv = ["eval", "--ref", str(FIXTURES / "tasks" / "tiny_scale_add.py"), "--candidate",
            str(FIXTURES / "eval" / "correct.py"), "--device", "cpu", "--trials", "1", "--buckets", "2",
            "--profile", "kernelbench", "--policy", "kernelbench", "--json", "--no-store"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["protocol"]["profile"] == "loose" and out["protocol"]["policy"] == "kernelbench"


def test_a_broken_reference_is_not_blamed_on_the_candidate(tmp_path, capsys):
    ref = tmp_path / "badref.py"
    ref.write_text((FIXTURES / "tasks" / "tiny_scale_add.py").read_text().replace(
        "    return [torch.randn(BATCH, DIM)]", "    raise ValueError('bad ref')"))
    argv = ["eval", "--ref", str(ref), "--candidate", str(FIXTURES / "eval" / "correct.py"), "--device", "cpu",
            "--trials", "2", "--buckets", "2", "--json", "--no-store"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["status"] == "infra_error"  # no verdict on the candidate, and nothing stored
    assert out["message"] == ("the reference failed (get_inputs): ValueError: bad ref "
                              "(the reference's failure, not the candidate's)")
    assert [f["rule"] for f in out["flags"]] == ["reference_error"]


def test_check_rejects_a_source_that_does_not_parse(capsys):
    assert main(["check", str(FIXTURES / "eval" / "syntax_error.py")]) == 1
    assert "syntax_error" in capsys.readouterr().out


def test_tasks_show_code_prints_the_module_verbatim(capsys):
    import ast

    from cudal1.tasks import find_task

    assert main(["tasks", "show", "builtin/level1/softmax_manual_lastdim", "--code"]) == 0
    printed = capsys.readouterr().out
    source = find_task("builtin/level1/softmax_manual_lastdim", ["builtin"]).source
    assert source in printed
    ast.parse(source)


def test_version(capsys):
    from cudal1 import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"cudal1 {__version__}"


def test_progress_off_a_terminal_is_plain_periodic_lines():
    import io

    from cudal1.cli.common import PlainProgress

    out = io.StringIO()
    with PlainProgress(interval_s=3600, stream=out) as bar:
        job = bar.add_task("evaluating", total=3, best="")
        hidden = bar.add_task("hidden", total=1, visible=False)
        for i in range(3):
            bar.update(job, advance=1, best=f"best {i + 1}.00x")
        bar.update(hidden, advance=1)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "evaluating: 1/3" in lines[0] and lines[1].endswith("evaluating: 3/3  best 3.00x")


def test_a_batch_redirected_to_a_file_reports_progress(tmp_path):
    """Not on a terminal (CI, nohup): the batch still says how far it is, on stderr, before the end."""
    import subprocess
    import sys

    ref = (FIXTURES / "tasks" / "tiny_scale_add.py").read_text()
    rows = [{"level_id": 1, "task_id": i, "ref_code": ref, "custom_code": (FIXTURES / "eval" / "correct.py").read_text()}
            for i in (1, 2)]
    release = tmp_path / "release.jsonl"
    release.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = subprocess.run([sys.executable, "-m", "cudal1.cli.main", "eval", "--release", str(release), "--device",
                           "cpu", "--trials", "2", "--buckets", "2", "--no-store"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "evaluating: 2/2" in done.stderr


def test_an_unexpected_exception_is_one_line_and_verbose_shows_the_traceback(monkeypatch, capsys):
    """no traceback anywhere; a bug says so in one line, --verbose shows where it was."""
    import cudal1.cli.tasks_cmd as tasks_cmd

    def broken(*args, **kwargs):
        raise KeyError("surprise")

    monkeypatch.setattr(tasks_cmd, "load_tasks", broken)
    assert main(["tasks", "list"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "unexpected KeyError" in err and "Traceback" not in err
    assert main(["--verbose", "tasks", "list"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_check_and_eval_take_a_kernel_form_spec(tmp_path, capsys):
    """`cudal1 check` checks a spec's structure and steps (no Python to analyse); `cudal1 eval -c SPEC.json` on a
    CPU gives the spec's verdicts and otherwise infra_error (needs a GPU), a JSON line, exit 0."""
    from cudal1.kernel_form.examples import RELU_SPEC

    spec = tmp_path / "relu.json"
    spec.write_text(json.dumps(RELU_SPEC, indent=2))
    assert main(["check", str(spec)]) == 0
    assert capsys.readouterr().out.strip() == ("kernel-form spec: valid (1 step(s): relu); build and scan: "
                                               "cudal1 eval")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**RELU_SPEC, "buffers": {"x": {"input": 0}}}))
    assert main(["check", str(bad), "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == {"form": "kernel", "ok": False,
                                                   "error": "buffers: no output: bind at least {\"output\": 0}"}
    ref = str(FIXTURES / "candidates" / "refs" / "relu.py")
    assert main(["eval", "--ref", ref, "--candidate", str(bad), "--json", "--device", "cpu",
                 "--store", str(tmp_path / "results.sqlite")]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["status"] == "compile_error" and out["message"].startswith("kernel-form spec: buffers: no output")
    assert schema_problems("eval_result", out) == []
