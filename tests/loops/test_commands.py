"""`cudal1 optimize` and `cudal1 augment` in-process (the commands live in cudal1/cli, the loops here)."""

from __future__ import annotations

import json

from cudal1.cli.main import app, main
from tests.helpers.scripted_server import ScriptedOpenAIServer
from tests.loops._scripted import CPU_DIR, answer, code

FAST_EVAL = ["--device", "cpu", "--sizes", "full", "--trials", "2", "--buckets", "2", "--eval-set",
             "target_bucket_ms=5", "--eval-set", "warm_buckets=0", "--eval-set", "warmup_iters=1"]


def test_optimize_a_user_module_file(tmp_path, shared_store_path, capsys):
    out = tmp_path / "mine_best.py"
    with ScriptedOpenAIServer([answer("wrong"), answer("fast")]) as server:
        argv = ["optimize", str(CPU_DIR / "relu_scale_task.py"), "--llm", f"openai:m@{server.base_url}",
                "--rounds", "1", "--samples", "2", "--max-retries", "0", "--store", str(shared_store_path),
                "--out", str(out), "--baselines", "none", "--exemplar-db", str(tmp_path / "ex.sqlite"),
                "--no-seed-from-store", "--json", *FAST_EVAL]
        assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # The best verified candidate is kept (its code below); its speedup on a CPU is whatever the machine's load
    # makes it, so only that there is one. Without --no-seed-from-store the folder's shared store would seed
    # other tests' correct candidates, and on a loaded CPU one of them may time faster than "fast".
    assert summary["task_id"] == "file/relu_scale_task" and summary["best_speedup"] > 0
    assert summary["history"][0]["statuses"] == {"correct": 1, "incorrect": 1}
    assert out.read_text().endswith(code("fast")) and summary["out_path"] == str(out)


def test_optimize_exits_1_without_a_correct_candidate(tmp_path, shared_store_path):
    # Through click's runner: `main()` drops the exit code a command returns with standalone_mode=False.
    from typer.testing import CliRunner

    with ScriptedOpenAIServer([answer("wrong")]) as server:
        argv = ["optimize", str(CPU_DIR / "relu_scale_task.py"), "--llm", f"openai:m@{server.base_url}",
                "--rounds", "1", "--samples", "1", "--store", str(shared_store_path), "--out",
                str(tmp_path / "x.py"), "--baselines", "none", "--exemplar-db", str(tmp_path / "ex.sqlite"),
                "--no-seed-from-store", *FAST_EVAL]
        outcome = CliRunner().invoke(app, argv)
    assert outcome.exit_code == 1 and "no correct candidate found" in outcome.output
    assert not (tmp_path / "x.py").exists()


def test_bad_eval_setting_is_one_line_error(capsys):
    argv = ["optimize", "builtin/level1/swish_beta", "--llm", "openai:m@http://127.0.0.1:1/v1", "--eval-set",
            "warp_speed=9"]
    assert main(argv) == 2
    assert "bad --eval-set" in capsys.readouterr().err


def test_augment_from_a_release(tmp_path, shared_store_path, capsys):
    from cudal1.tasks.sources import load_file

    ref = load_file(CPU_DIR / "relu_scale_task.py").source
    release = tmp_path / "rel.jsonl"
    release.write_text(json.dumps({"level_id": 1, "task_id": 7, "ref_code": ref, "custom_code": code("fast")}) + "\n")
    argv = ["augment", "--from-release", str(release), "--out-dir", str(tmp_path / "data"), "--no-hf-dataset",
            "--store", str(shared_store_path), "--json", *FAST_EVAL]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["examples"] == 1 and summary["dataset_path"] is None
    assert len((tmp_path / "data" / "sft.jsonl").read_text().splitlines()) == 1


def _free_loopback_port() -> int:
    """A loopback port where nothing listens (bound once to get it, then closed)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_optimize_against_an_unreachable_server_fails_and_claims_no_stored_result(tmp_path):
    # A store that already holds a correct, fast candidate for the task (an earlier evaluation): the loop
    # seeds it as an exemplar, yet it is no result of a run whose every LLM request failed.
    import os
    import subprocess
    import sys

    from cudal1.eval import evaluate_candidate
    from cudal1.store import ResultsStore
    from tests.loops._scripted import CPU_EVAL, cpu_task

    store_path, out = tmp_path / "results.sqlite", tmp_path / "best.py"
    with ResultsStore(store_path) as store:
        earlier = evaluate_candidate(cpu_task(), code("fast"), CPU_EVAL, store=store, label="earlier")
        before = store.query_evaluations()
    assert earlier.status.value == "correct" and len(before) == 1
    url = f"http://127.0.0.1:{_free_loopback_port()}/v1"
    argv = [sys.executable, "-m", "cudal1", "optimize", str(CPU_DIR / "relu_scale_task.py"), "--llm",
            f"openai:m@{url}", "--rounds", "2", "--samples", "2", "--max-retries", "0", "--store", str(store_path),
            "--out", str(out), "--baselines", "none", *FAST_EVAL]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}  # loopback, never via a proxy
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)

    assert done.returncode != 0, done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert errors[0].startswith(f"error: could not reach the LLM server at {url} (connection error")
    assert errors[0].endswith("no candidate was generated")
    # Nothing presents the stored candidate as this run's: no result table, no file; the progress line
    # names its speedup only as stored earlier.
    assert "best verified candidate" not in done.stdout and "written to" not in done.stdout
    assert not out.exists() and not out.with_suffix(".py.json").exists()
    stored = f"{earlier.speedup:.2f}x"
    assert all("(stored earlier)" in line for line in (done.stdout + done.stderr).splitlines() if stored in line)
    with ResultsStore(store_path) as store:
        assert store.query_evaluations() == before


def test_optimize_without_the_llm_extra_names_it_in_one_line(tmp_path, monkeypatch, capsys):
    """the error blamed the server ("failed every request (MissingDependencyError...)")."""
    monkeypatch.setitem(__import__("sys").modules, "openai", None)
    argv = ["optimize", "builtin/level1/swish_beta", "--llm", "openai:m@http://127.0.0.1:9/v1", "--store",
            str(tmp_path / "s.sqlite"), *FAST_EVAL]
    assert main(argv) == 2
    captured = capsys.readouterr()
    expected = "error: 'openai' is needed for OpenAI-compatible generation: pip install 'cudal1[llm]'"
    assert captured.err.strip() == expected and captured.out == ""
