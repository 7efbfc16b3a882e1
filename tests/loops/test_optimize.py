"""`cudal1.loops.optimize` against a real local OpenAI-compatible server and the real evaluator on CPU."""

from __future__ import annotations

import json
import threading

import pytest

from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Mismatch, Status
from cudal1.exemplars import ExemplarDB
from cudal1.llm import LLMConfig
from cudal1.loops.common import GENERATION_ERROR, feedback_from
from cudal1.loops.optimize import OptimizeConfig, baseline_kinds, optimize
from tests.helpers.scripted_server import Reply, ScriptedOpenAIServer
from tests.loops._scripted import CPU_EVAL, PROSE, answer, code, cpu_task


def _config(server, tmp_path, **overrides):
    values = dict(llm=LLMConfig(spec=f"openai:scripted@{server.base_url}", max_retries=0, concurrency=4),
                  rounds=2, samples=3, eval=CPU_EVAL, out=str(tmp_path / "best.py"), baselines="none",
                  seed_from_store=False, exemplar_db=str(tmp_path / "exemplars.sqlite"))
    values.update(overrides)
    return OptimizeConfig(**values)


def _user_text(request) -> str:
    return "\n".join(m["content"] for m in request.body["messages"] if m["role"] == "user")


def _by_round(items_per_round):
    """A script answering request i with items_per_round[round][i % per_round] (rounds are sequential)."""
    per_round = len(items_per_round[0])
    lock = threading.Lock()

    def script(index, body):
        with lock:
            return items_per_round[min(index // per_round, len(items_per_round) - 1)][index % per_round]
    return script


def test_best_improves_when_a_faster_correct_kernel_arrives(tmp_path, store):
    """Round 1: slow-but-correct, wrong, syntax error. Round 2: the fast rewrite, prose, slow again."""
    task = cpu_task()
    script = _by_round([[answer("slow"), answer("wrong"), answer("syntax_error")],
                        [answer("fast"), PROSE, answer("slow")]])
    events = []
    with ScriptedOpenAIServer(script) as server:
        result = optimize(task, _config(server, tmp_path), store=store, progress=events.append)
        requests = list(server.requests)

    first, second = result.history
    assert first.statuses == {"correct": 1, "incorrect": 1, "compile_error": 1}
    assert second.statuses == {"correct": 2, "unparseable": 1}
    assert first.best_so_far is not None and first.best_so_far < 1.0  # the slow one
    assert second.best_so_far > 5 * first.best_so_far
    assert result.best_result.status is Status.CORRECT and result.best_speedup == second.best_so_far
    assert "repeat" not in result.best_source and "torch.relu(x) * 2.0" in result.best_source
    best = ExemplarDB(tmp_path / "exemplars.sqlite").best(task.id)
    assert best is not None and best.score == pytest.approx(result.best_speedup)

    # Round 1 used the plain prompt; round 2 the contrastive one, showing the slow exemplar with its
    # score and the compile error of round 1 as feedback.
    assert [first.prompt_kind, second.prompt_kind] == ["plain", "contrastive"]
    for request in requests[:3]:
        assert "Previous implementations" not in _user_text(request)
    for request in requests[3:]:
        text = _user_text(request)
        assert "Previous implementations" in text and "repeat(192, 1, 1)" in text and "speedup" in text
        assert "Feedback on your previous attempt" in text and "compile_error" in text and "expected ':'" in text

    # Every sample is journaled as done; the unparseable verdict is stored under this run (the others may be
    # cache hits of an earlier test, stored under that test's run).
    assert len(store.done_items(result.run_id)) == 6
    assert "unparseable" in {r["status"] for r in store.query_evaluations(run_id=result.run_id)}
    assert sum(e.kind == "sample" for e in events) == 6
    assert events[-1].kind == "round_end" and events[-1].best_speedup == pytest.approx(result.best_speedup)

    text = result.out_path.read_text()
    assert text.startswith("# cudal1 optimize: best verified candidate for file/relu_scale_task")
    assert "# verdict: correct" in text and "# kernel class: pytorch_only" in text
    assert text.rstrip().endswith(code("fast").rstrip())
    sidecar = json.loads(result.sidecar_path.read_text())
    assert sidecar["result"]["status"] == "correct" and len(sidecar["history"]) == 2


def test_survives_a_server_that_errors_half_the_time(tmp_path, store):
    items = [answer("fast"), answer("slow"), answer("wrong")]

    def script(index, body):
        return Reply.error(500) if index % 2 else items[(index // 2) % len(items)]

    with ScriptedOpenAIServer(script) as server:
        result = optimize(task := cpu_task(), _config(server, tmp_path, samples=4), store=store)
        assert server.request_count == 8

    assert [h.generation_errors for h in result.history] == [2, 2]
    assert all(h.statuses.get(GENERATION_ERROR) == 2 for h in result.history)
    assert result.llm_usage["errors"] == 4
    assert result.best_result is not None and result.best_result.status is Status.CORRECT
    assert "repeat" not in result.best_source
    # Every sample is journaled as done with its verdict (evaluations themselves may be cache hits).
    assert store.done_items(result.run_id) == {f"r{r}/s{s}" for r in (1, 2) for s in range(4)}
    verdicts = [store.get_meta(f"{result.run_id}/r1/s{s}")["status"] for s in range(4)]
    assert sorted(verdicts) == sorted(["correct", "correct", GENERATION_ERROR, GENERATION_ERROR])  # fast, slow
    assert ExemplarDB(tmp_path / "exemplars.sqlite").count(task.id) == 2


def test_stops_after_a_round_in_which_every_request_failed(tmp_path, store):
    with ScriptedOpenAIServer(lambda index, body: Reply.error(401)) as server:  # e.g. a wrong key
        result = optimize(cpu_task(), _config(server, tmp_path, rounds=4, samples=3, run_name="r"), store=store)
        assert server.request_count == 3  # one round, not four

    assert len(result.history) == 1 and result.best_result is None
    assert result.stopped.startswith("the LLM backend failed every request of round 1: ")
    assert "401" in result.stopped
    # The server answered (a refusal, not unreachable): the failure names it, and no candidate came back.
    assert result.failure.startswith(f"the LLM server at {server.base_url} failed every request (HTTP 401")
    assert result.failure.endswith("no candidate was generated") and result.out_path is None

    # The same run once the server answers (here on another port, so named): round 1's failed requests are
    # asked again (they used to count as round 1), then round 2.
    with ScriptedOpenAIServer(lambda index, body: answer("fast")) as server:
        resumed = optimize(cpu_task(), _config(server, tmp_path, rounds=2, samples=3, run_name="r"), store=store)
        assert server.request_count == 6
    assert resumed.resumed and not resumed.stopped and resumed.best_result is not None and not resumed.failure
    assert [h.generation_errors for h in resumed.history] == [0, 0]
    assert [h.statuses for h in resumed.history] == [{"correct": 3}, {"correct": 3}]


def test_without_the_llm_extra_nothing_is_journaled(tmp_path, store, monkeypatch):
    """without `openai` every request failed, the error blamed the server, and the rerun (extra
    installed) counted those failures as its round 1."""
    from cudal1.core.errors import MissingDependencyError

    monkeypatch.setitem(__import__("sys").modules, "openai", None)  # `import openai` raises ImportError
    runs = len(store.list_runs("optimize"))
    config = OptimizeConfig(llm="openai:m@http://127.0.0.1:9/v1", rounds=1, samples=2, eval=CPU_EVAL,
                            baselines="none", run_name="no-extra", exemplar_db=str(tmp_path / "ex.sqlite"))
    with pytest.raises(MissingDependencyError, match=r"pip install 'cudal1\[llm\]'"):
        optimize(cpu_task(), config, store=store)
    assert len(store.list_runs("optimize")) == runs


class _Stop(Exception):
    pass


def test_resumes_after_an_interruption_without_regenerating(tmp_path, store):
    script = _by_round([[answer("slow"), answer("wrong")], [answer("fast"), answer("slow")]])

    def stop_in_round_two(event):
        if event.kind == "sample" and event.round == 2:
            raise _Stop

    with ScriptedOpenAIServer(script) as server:
        config = _config(server, tmp_path, samples=2)
        with pytest.raises(_Stop):
            optimize(cpu_task(), config, store=store, progress=stop_in_round_two)
        assert server.request_count == 4  # round 1, then round 2 generated, one of its samples evaluated

        resumed = optimize(cpu_task(), config, store=store)
        assert server.request_count == 4  # nothing asked again
        assert resumed.resumed and [h.reused for h in resumed.history] == [2, 2]
        assert resumed.history[0].statuses == {"correct": 1, "incorrect": 1}
        assert resumed.history[1].statuses == {"correct": 2}
        assert "repeat" not in resumed.best_source

        extended = optimize(cpu_task(), _config(server, tmp_path, samples=2, rounds=3), store=store)
        assert server.request_count == 6 and extended.run_id == resumed.run_id
        assert [h.reused for h in extended.history] == [2, 2, 0]
        assert store.get_run(resumed.run_id)["status"] == "finished"

        fresh = optimize(cpu_task(), _config(server, tmp_path, samples=2, rounds=1, resume=False), store=store)
        assert fresh.run_id != resumed.run_id and server.request_count == 8


def test_feedback_prefers_the_compile_error_and_stays_short():
    incorrect = EvalResult(status=Status.INCORRECT, message="output 0 differs",
                           mismatch=Mismatch(0, 0, 2.5, 1.0, 10, 100, [3], 1.0, 3.5))
    compile_error = EvalResult(status=Status.COMPILE_ERROR, message="CUDA build failed: kernel.cu(4): error",
                               compile_log="kernel.cu(4): error: expected a ';'\n" + "x" * 5000)
    text = feedback_from([incorrect, compile_error, EvalResult(status=Status.CORRECT, speedup=2.0)])
    assert text.startswith("One of the previous attempts failed with status compile_error.")
    assert "expected a ';'" in text and len(text) <= 1300 and text.endswith("new implementation.")
    only_mismatch = feedback_from([incorrect])
    assert "Worst mismatch: output 0 (trial 0): 10/100 elements off" in only_mismatch
    assert feedback_from([EvalResult(status=Status.CORRECT, speedup=1.5)]) is None


@pytest.mark.parametrize("bad", [dict(rounds=0), dict(samples=0), dict(sampler="nope"), dict(form="triton"),
                                 dict(time_budget_s=-1), dict(sampler_options={"n": 0}),
                                 dict(baselines="eager,warp_drive")])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ConfigError):
        OptimizeConfig(llm="openai:m@http://127.0.0.1:1/v1", **bad)


def test_config_rejects_an_unknown_or_malformed_spec():
    for spec in ("vllm:m", "openai:m@ftp://x"):
        with pytest.raises(ConfigError):
            OptimizeConfig(llm=spec)


def test_on_the_cpu_it_asks_for_pytorch_and_on_a_gpu_for_raw_cuda(tmp_path, store):
    """on the CPU, optimize asked for raw CUDA, which cannot run there."""
    from cudal1.llm.prompts import RAW_CUDA_FORM, TORCH_FORM, resolve_form

    with ScriptedOpenAIServer(lambda index, body: answer("fast")) as server:
        result = optimize(cpu_task(), _config(server, tmp_path, rounds=1, samples=1, run_name="cpu-form"),
                          store=store)
        (prompt,) = [_user_text(r) for r in server.requests]
    assert TORCH_FORM in prompt and "load_kernels" not in prompt and "custom CUDA kernels" not in prompt
    assert result.best_result is not None
    assert OptimizeConfig(llm="openai:m").form == "auto"
    assert resolve_form("auto", "cuda:0") == "raw_cuda" and resolve_form("auto", "remote") == "raw_cuda"
    assert resolve_form("raw_cuda", "cpu") == "raw_cuda" and RAW_CUDA_FORM != TORCH_FORM


def test_run_key_ignores_rounds_but_not_the_model():
    task = cpu_task()
    a = OptimizeConfig(llm="openai:m@http://127.0.0.1:1/v1", rounds=2)
    b = OptimizeConfig(llm="openai:m@http://127.0.0.1:1/v1", rounds=9)
    c = OptimizeConfig(llm="openai:other@http://127.0.0.1:1/v1", rounds=2)
    assert a.run_key(task) == b.run_key(task) != c.run_key(task)
    assert a.form == "auto" and a.sampler == "bucket"
    assert a.run_key(task, "torch") != a.run_key(task, "raw_cuda")  # the form auto became names the run
    assert baseline_kinds("auto", "cpu") == [] and "cuda_graph" in baseline_kinds("auto", "cuda")
    assert baseline_kinds("eager,torch_compile", "cuda") == ["torch_compile"]


def test_evaluates_through_a_pool_when_given(tmp_path, store):
    from cudal1.service import make_pool

    with make_pool("local", CPU_EVAL, store=store) as pool:
        submitted = []
        original = pool.submit

        def counting_submit(task, source, config=None, **kwargs):
            submitted.append(kwargs.get("run_id"))
            return original(task, source, config, **kwargs)

        pool.submit = counting_submit
        with ScriptedOpenAIServer([answer("fast"), PROSE]) as server:
            result = optimize(cpu_task(), _config(server, tmp_path, rounds=1, samples=2), store=store, pool=pool)
    assert submitted == [result.run_id]  # the prose never reaches the evaluator
    assert result.history[0].statuses == {"correct": 1, "unparseable": 1}
    assert result.best_result.status is Status.CORRECT


def test_time_budget_stops_before_asking(tmp_path, store):
    with ScriptedOpenAIServer([answer("fast")]) as server:
        result = optimize(cpu_task(), _config(server, tmp_path, time_budget_s=1e-9), store=store)
        assert server.request_count == 0
    assert result.stopped == "time budget" and result.history == [] and result.best_result is None
    assert result.out_path is None


# ----------------------------------------------------------------------------------------------------
# The kernel-only form
# ----------------------------------------------------------------------------------------------------

def test_config_takes_the_kernel_form():
    config = OptimizeConfig(llm="openai:m@http://127.0.0.1:1/v1", form="kernel")
    assert config.form == "kernel"
    assert OptimizeConfig(llm="openai:m@http://127.0.0.1:1/v1").form == "auto"  # never kernel unless asked


def test_optimize_form_kernel_from_the_command_line(monkeypatch, capsys, tmp_path):
    import importlib

    import cudal1.llm
    from cudal1.cli.main import main

    loop = importlib.import_module("cudal1.loops.optimize")  # the package's `optimize` name is the function

    seen = {}

    def fake_optimize(task, config, **kwargs):
        seen["config"] = config
        raise loop.LLMUnavailableError("stopped by the test")

    monkeypatch.setattr(loop, "optimize", fake_optimize)
    monkeypatch.setattr(cudal1.llm, "make_backend", lambda config: None)
    argv = ["optimize", "builtin/level1/softmax_manual_lastdim", "--llm", "openai:m@http://127.0.0.1:1/v1",
            "--device", "cpu", "--store", str(tmp_path / "results.sqlite")]
    main([*argv, "--form", "kernel"])
    assert seen["config"].form == "kernel"
    assert main([*argv, "--form", "kernels"]) == 2
    assert "kernel" in capsys.readouterr().err


def test_asking_for_the_kernel_form_prompts_for_a_spec_and_evaluates_the_json_answer(tmp_path, store):
    """On the CPU a spec that builds is infra_error (needs a GPU): the loop asks, extracts, builds and scans."""
    from cudal1.kernel_form.examples import RELU_SPEC
    from cudal1.llm.prompts import KERNEL_FORM

    reply = f"## Performance Analysis\nfused\n## Algorithm Design\none pass\n## Code\n```json\n{json.dumps(RELU_SPEC)}\n```"
    with ScriptedOpenAIServer(lambda index, body: reply) as server:
        result = optimize(cpu_task(), _config(server, tmp_path, rounds=1, samples=1, form="kernel",
                                              run_name="kernel-form"), store=store)
        (prompt,) = [_user_text(r) for r in server.requests]
    assert KERNEL_FORM in prompt and "```python code block" not in prompt
    (summary,) = result.history
    assert summary.statuses == {"infra_error": 1} and result.best_result is None


def test_the_best_kernel_form_candidate_is_written_unchanged_with_its_header_in_the_sidecar(tmp_path):
    from cudal1.core.types import KernelClass
    from cudal1.kernel_form.examples import RELU_SPEC
    from cudal1.loops.output import write_candidate

    spec = json.dumps(RELU_SPEC, indent=2)
    result = EvalResult(status=Status.CORRECT, speedup=1.5, kernel_class=KernelClass.CUSTOM_CUDA)
    path, sidecar = write_candidate(tmp_path / "relu_best.json", cpu_task(), spec, result)
    assert json.loads(path.read_text()) == RELU_SPEC  # `cudal1 eval -c` takes it as is
    data = json.loads(sidecar.read_text())
    assert data["header"][0].startswith("cudal1 optimize: best verified candidate") and "kernel class: custom_cuda" \
        in data["header"]
