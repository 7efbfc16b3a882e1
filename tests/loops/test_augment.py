"""`cudal1.loops.augment`: two scripted models, the keep rules, both export formats, and a release import."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Status, TimingStats
from cudal1.llm import extract_completion
from cudal1.llm.extract import SECTION_NAMES
from cudal1.llm.prompts import TORCH_FORM
from cudal1.loops.augment import AugmentConfig, augment, is_executable, select_kept, strip_reasoning
from cudal1.loops.common import SampleRecord
from tests.helpers.scripted_server import Reply, ScriptedOpenAIServer
from tests.loops._scripted import CPU_EVAL, PROSE, answer, code, cpu_task


def _spec(server, model):
    return f"openai:{model}@{server.base_url}"


def test_two_models_keep_at_most_m_per_task_and_export_both_formats(tmp_path, store):
    task = cpu_task()
    a_script = [answer("fast"), answer("fast_where"), answer("slow"), answer("wrong")]
    b_script = [answer("fast"), "<think>hmm</think>\n" + answer("fast"), PROSE, Reply.error(500)]
    with ScriptedOpenAIServer(a_script) as a, ScriptedOpenAIServer(b_script) as b:
        config = AugmentConfig(llms=[_spec(a, "model-a"), _spec(b, "model-b")], samples=4, keep=2, eval=CPU_EVAL,
                               out_dir=str(tmp_path / "out"), max_retries=0, exemplar_db=str(tmp_path / "ex.sqlite"))
        result = augment(config, tasks=[task], store=store)
        b_prompts = [r.body["messages"][-1]["content"] for r in b.requests]

    stats = {s["model"].split(":")[1].split("@")[0]: s for s in result.stats}
    verdicts = [(row["status"], row["result"].get("message", "")[:200], row["result"].get("flags"))
                for row in store.query_evaluations(task_id=task.id)]
    assert stats["model-a"]["correct"] == 3, verdicts  # fast, fast_where and slow; the verdicts say why not
    assert stats["model-a"] == {**stats["model-a"], "generated": 4, "correct": 3, "kept": 2, "generation_errors": 0}
    assert stats["model-b"] == {**stats["model-b"], "generated": 4, "correct": 2, "kept": 1, "generation_errors": 1}
    kept_a = [r for r in result.examples if r["model"] == "model-a"]
    assert [r["score"] for r in kept_a] == sorted((r["score"] for r in kept_a), reverse=True)
    kept_codes = {extract_completion(r["completion"][0]["content"]).code for r in kept_a}
    assert kept_codes == {code("fast"), code("fast_where")}  # the slow one is correct but not among the best 2
    # model-b's duplicates count once; its reasoning is not part of the SFT target
    (kept_b,) = [r for r in result.examples if r["model"] == "model-b"]
    assert "<think>" not in kept_b["completion"][0]["content"]
    # model-b was asked after model-a's correct candidates entered the exemplar database
    assert all("Previous implementations" in p for p in b_prompts)
    # on the CPU the prompts ask for a form that can run there, not raw CUDA
    assert all(TORCH_FORM in p and "load_kernels" not in p for p in b_prompts)

    lines = [json.loads(line) for line in result.jsonl_path.read_text().splitlines()]
    assert len(lines) == 3
    for row in lines:
        assert row["prompt"][0]["role"] == "system" and row["prompt"][-1]["role"] == "user"
        assert row["completion"][0]["role"] == "assistant" and row["task_id"] == task.id
        assert row["form"] == "torch" and row["score"] > 1.0  # evaluated on the CPU: PyTorch-only asked for
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_from_disk(str(result.dataset_path))
    assert loaded.num_rows == 3 and {"prompt", "completion", "task_id", "score", "model", "form"} <= set(loaded.column_names)
    sft = pytest.importorskip("cudal1.train.sft")
    records = sft.load_sft_records(result.jsonl_path)
    assert len(records) == 3 and records[0]["completion"][0]["role"] == "assistant"


def test_a_release_import_honours_the_task_filters(tmp_path, store):
    """--task, --level and --max-tasks used to be ignored with --from-release: every row was evaluated."""
    task = cpu_task()
    rows = [{"level_id": level, "task_id": n, "ref_code": task.source, "custom_code": code("wrong")}
            for level, n in ((1, 1), (1, 2), (2, 3))]
    release = tmp_path / "rel.jsonl"
    release.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def stats(**filters):
        config = AugmentConfig(from_release=[str(release)], eval=CPU_EVAL, out_dir=str(tmp_path / "out"),
                               hf_dataset=False, **filters)
        return sorted(s["task_id"] for s in augment(config, store=store).stats)

    assert stats(levels=[2]) == ["rel/level2/3"]
    assert stats(task_ids=["rel/level1/2"]) == ["rel/level1/2"]
    assert stats(max_tasks=1) == ["rel/level1/1"]


def test_imports_the_correct_candidates_of_a_release(tmp_path, store):
    task = cpu_task()
    rows = [{"level_id": 1, "task_id": 1, "ref_code": task.source, "custom_code": code("fast"), "score_default": 30.0},
            {"level_id": 1, "task_id": 2, "ref_code": task.source, "custom_code": code("wrong")},
            {"level_id": 1, "task_id": 3, "ref_code": task.source, "custom_code": None}]
    release = tmp_path / "tiny-release.jsonl"
    release.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = AugmentConfig(from_release=[str(release)], eval=CPU_EVAL, out_dir=str(tmp_path / "out"),
                           hf_dataset=False)
    result = augment(config, store=store)

    assert result.dataset_path is None
    (example,) = result.examples
    assert example["task_id"] == "tiny-release/level1/1" and example["model"] == "tiny-release"
    text = example["completion"][0]["content"]
    extraction = extract_completion(text)
    assert extraction.code == code("fast") and set(extraction.sections) == set(SECTION_NAMES)
    assert "the reference's speed" in extraction.sections["Performance Analysis"]
    assert "## Reference implementation" in example["prompt"][-1]["content"]
    assert {s["task_id"]: s["correct"] for s in result.stats} == {"tiny-release/level1/1": 1,
                                                                  "tiny-release/level1/2": 0}


def test_imports_the_builtin_examples_that_run_here(tmp_path, store):
    """Stage-1 data without an LLM or a release (the README's laptop recipe starts from it)."""
    config = AugmentConfig(from_examples=True, task_ids=["builtin/level1/softmax_manual_lastdim"],
                           eval=dataclasses.replace(CPU_EVAL, sizes="small"), out_dir=str(tmp_path / "out"),
                           hf_dataset=False)
    result = augment(config, store=store)
    (example,) = result.examples
    assert example["task_id"] == "builtin/level1/softmax_manual_lastdim" and example["form"] == "torch"
    assert example["model"] == "cudal1-examples" and example["origin"] == "release:builtin example (torch)"
    assert TORCH_FORM in example["prompt"][-1]["content"]


def _timed(speedup: float, ref_ms: float = 1.0) -> EvalResult:
    timing = TimingStats(ref_ms=ref_ms, candidate_ms=ref_ms / speedup, speedup=speedup, stability=0.0,
                         bucket_speedups=[speedup])
    return EvalResult(status=Status.CORRECT, speedup=speedup, timing=timing)


def test_executable_rule_and_selection():
    assert is_executable(_timed(0.002)) and not is_executable(_timed(0.0009))  # 500x vs 1100x slower
    assert not is_executable(EvalResult(status=Status.CORRECT, speedup=1.0))  # untimed
    records = [SampleRecord(key=f"k{i}", task_id="t", code=src, status="correct", result=_timed(s).to_dict())
               for i, (src, s) in enumerate([("a = 1\n", 1.5), ("a = 1  # same\n", 3.0), ("b = 2\n", 2.0),
                                              ("c = 3\n", 0.5)])]
    records.append(SampleRecord(key="bad", task_id="t", code="d = 4\n", status="incorrect",
                                result=EvalResult(status=Status.INCORRECT).to_dict()))
    assert [r.key for r in select_kept(records, 2, 1000.0)] == ["k1", "k2"]  # k0 duplicates k1
    assert [r.key for r in select_kept(records, 5, 1.0)] == ["k1", "k2"]  # k3 is 2x slower than the reference
    assert strip_reasoning("<think>plan</think>\n## Code\nx") == "## Code\nx"


def test_config_needs_a_model_or_a_release():
    with pytest.raises(ConfigError):
        AugmentConfig()
    with pytest.raises(ConfigError):
        AugmentConfig(llms=["openai:m@http://127.0.0.1:1/v1"], keep=0)
    with pytest.raises(ConfigError, match="unknown LLM spec"):
        AugmentConfig(llms=["vllm:m"])  # the backends table is asked, not only the 'KIND:TARGET' form
    assert AugmentConfig(from_release=["x.jsonl"]).keep == 2
    assert AugmentConfig(from_examples=True).from_examples


def test_a_split_file_keeps_held_out_tasks_out_of_stage_1(tmp_path):
    """`augment` generated for every task, held-out ones included, whatever split training used."""
    from cudal1.loops.augment import select_tasks
    from cudal1.tasks import load_tasks
    from cudal1.tasks.splits import make_split

    tasks = load_tasks("builtin")
    split = make_split(tasks, test_fraction=0.3, seed=1)
    path = split.save(tmp_path / "splits.json")
    config = AugmentConfig(llms=["openai:m@http://127.0.0.1:1/v1"], splits_file=str(path))
    chosen = {t.id for t in select_tasks(config, tasks)}
    assert chosen == split.ids("train") and not chosen & split.ids("test")
    with pytest.raises(ConfigError):
        select_tasks(AugmentConfig(llms=["openai:m@http://127.0.0.1:1/v1"], splits_file=str(tmp_path / "no.json")),
                     tasks)
