"""Task loaders: builtin, KernelBench folders, HF dataset files, JSONL releases, single files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudal1.core.errors import SourceError, TaskError
from cudal1.tasks import find_task, load_release, load_tasks
from cudal1.tasks.inspect import inspect_task
from cudal1.tasks.sources import load_file

FIXTURES = Path(__file__).parent.parent / "fixtures"
TINY = (FIXTURES / "tasks" / "tiny_scale_add.py").read_text()
RELEASE = Path(__file__).resolve().parents[3] / "shared" / "data" / "cuda-l1" / "h100.jsonl"


def test_builtin_suite_has_three_levels():
    tasks = load_tasks("builtin")
    assert len(tasks) >= 24
    assert {t.level for t in tasks} == {1, 2, 3}
    assert all(t.id.startswith(f"builtin/level{t.level}/") for t in tasks)
    assert len({t.id for t in tasks}) == len(tasks)


def test_kernelbench_checkout_layout(tmp_path):
    for level in (1, 2):
        d = tmp_path / "KernelBench" / f"level{level}"
        d.mkdir(parents=True)
        (d / "10_Tiny.py").write_text(TINY)
        (d / "2_Other.py").write_text(TINY)
    tasks = load_tasks(str(tmp_path))
    assert [t.id for t in tasks] == ["kernelbench/level1/2_Other", "kernelbench/level1/10_Tiny",
                                     "kernelbench/level2/2_Other", "kernelbench/level2/10_Tiny"]
    assert tasks[0].level == 1 and tasks[0].source == TINY


def test_hf_dataset_from_local_file(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "kb.parquet"
    datasets.Dataset.from_dict({"code": [TINY, TINY], "level": [1, 2], "name": ["19_ReLU", "3_Gemm.py"],
                                "problem_id": [19, 3]}).to_parquet(str(path))
    tasks = load_tasks(f"hf:{path}")
    assert [t.id for t in tasks] == ["kernelbench/level1/19_ReLU", "kernelbench/level2/3_Gemm"]


def test_hf_without_network_is_one_clear_error():
    """In a fresh process: the hub reads its offline switch when first imported (an earlier import in this
    process would make the load wait for network timeouts instead)."""
    pytest.importorskip("datasets")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "cudal1.cli.main", "tasks", "list", "--source",
                           "hf:ScalingIntelligence/KernelBench-does-not-exist"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "without network, pass a local file" in done.stderr and "Traceback" not in done.stderr


def test_jsonl_release_tasks_and_candidates(tmp_path):
    rows = [
        {"level_id": 1, "task_id": 1, "ref_code": TINY, "custom_code": "class ModelNew: pass",
         "cuda_graph_code": None, "cudnn_code": "None", "score_default": 2.5, "score_cuda_graph": "None"},
        {"level_id": 1, "task_id": 2, "ref_code": TINY, "custom_code": "None", "score_default": None},
        {"level_id": 2, "task_id": 7, "ref_code": TINY, "custom_code": None},
    ]
    path = tmp_path / "rel.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pairs = load_release(path)
    assert [t.id for t, _ in pairs] == ["rel/level1/1", "rel/level1/2", "rel/level2/7"]
    cand = pairs[0][1]
    assert cand is not None and cand.published == {"score_default": 2.5, "score_cuda_graph": None}
    assert pairs[1][1] is None and pairs[2][1] is None
    assert len(load_tasks(f"jsonl:{path}")) == 3


def test_jsonl_bad_line_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"level_id": 1, "task_id": 1, "ref_code": "x"}\n{not json\n')
    with pytest.raises(SourceError, match=r"bad.jsonl:2"):
        load_release(path)


@pytest.mark.skipif(not RELEASE.is_file(), reason="CUDA-L1 release not present")
def test_cuda_l1_release_counts():
    pairs = load_release(RELEASE)
    assert len(pairs) == 250
    assert sum(c is not None for _, c in pairs) == 210


@pytest.mark.parametrize("source, message", [
    ("import torch\ndef get_inputs(:\n", "syntax error at line 2"),
    ("import torch\ndef get_inputs(): return []\n", "missing Model, get_init_inputs"),
])
def test_single_file_errors_name_the_task(tmp_path, source, message):
    path = tmp_path / "mine.py"
    path.write_text(source)
    with pytest.raises(TaskError, match=message) as info:
        load_file(path)
    assert str(info.value).startswith("file/mine: ")
    assert "\n" not in str(info.value)


def test_get_inputs_raising_is_a_task_error(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text(TINY.replace("return [torch.randn(BATCH, DIM)]", "raise RuntimeError('no data')"))
    task = load_file(path)
    with pytest.raises(TaskError, match="file/broken: get_inputs\\(\\) raised RuntimeError: no data"):
        inspect_task(task)


def test_inspect_full_sizes_on_meta_without_memory():
    task = find_task("builtin/level1/matmul_square")
    info = inspect_task(task)
    assert info.shapes_known and info.inputs and info.outputs
    assert all(s.dtype == "float32" for s in info.inputs)


def test_small_sizes_override_constants():
    task = load_tasks("builtin")[0]
    small = task.load(sizes="small")
    full = task.load(sizes="full")
    overrides = full.module.SMALL_SIZES
    assert overrides and all(small.constants[k] == v for k, v in overrides.items())


def test_loading_never_executes_candidate_code(tmp_path):
    rows = [{"level_id": 1, "task_id": 1, "ref_code": TINY,
             "custom_code": "raise SystemExit('candidate code ran in the parent')"}]
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(rows[0]))
    (task, cand), = load_release(path)
    assert "SystemExit" in cand.source


_ROW = {"level_id": 1, "task_id": 1, "ref_code": TINY, "custom_code": "class ModelNew: pass"}


@pytest.mark.parametrize("rows, words", [
    ([{**_ROW, "score_default": "fast"}], ['score_default is "fast", not a published speedup']),
    ([{**_ROW, "score_default": -2.0}], ["score_default is -2.0"]),
    ([{**_ROW, "task_id": None}], ["task_id is null, not an integer"]),
    ([{**_ROW, "task_id": "a/b"}], ['task_id is "a/b"']),
    ([{**_ROW, "level_id": "one"}], ['level_id is "one", not an integer']),
    ([{**_ROW, "ref_code": 5}], ["ref_code is 5, not the reference module's source"]),
    ([{**_ROW, "custom_code": ["x"]}], ['custom_code is ["x"], not the published candidate']),
    ([{k: v for k, v in _ROW.items() if k != "ref_code"}], ["ref_code is missing"]),
    ([["level_id", 1]], ["not a release row: it is"]),
    ([_ROW, {**_ROW, "custom_code": None}], [":2: level_id 1, task_id 1 repeats line 1: one row per task"]),
    ([{**_ROW, "ref_code": TINY + "#" * 2**20}], ["ref_code cannot be evaluated: it is", "over the limit of 524288"]),
    ([{**_ROW, "custom_code": "#" * 2**20}], ["custom_code cannot be evaluated: it is 1048576 bytes, over the limit"]),
    ([{**_ROW, "cudnn_code": "#" * 2**20}], ["cudnn_code cannot be evaluated"]),
], ids=["score-string", "score-negative", "task-id-null", "task-id-slash", "level-string", "ref-not-string",
        "custom-not-string", "ref-missing", "not-an-object", "duplicate", "ref-too-large", "custom-too-large",
        "cudnn-too-large"])
def test_a_bad_release_row_is_one_line_naming_the_row_the_field_and_what_was_expected(tmp_path, rows, words):
    """Each used to pass silently (null task ids, duplicates), or fail later as a bug of ours: `could not
    convert string to float: 'fast'`, `message of 5243551 bytes exceeds 4194304` (from a runner)."""
    path = tmp_path / "rel.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SourceError) as info:
        load_release(path)
    message = str(info.value)
    assert "\n" not in message and f"rel.jsonl:{len(rows)}" in message, message
    assert all(w in message for w in words), message


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_score_json_does_not_allow_is_refused(tmp_path, constant):
    path = tmp_path / "rel.jsonl"
    path.write_text(json.dumps(_ROW)[:-1] + f', "score_default": {constant}}}\n')
    with pytest.raises(SourceError, match=f"rel.jsonl:1: not a release row \\(not JSON: {constant} is not a number"):
        load_release(path)


def test_a_task_file_over_the_size_limit_is_refused_before_anything_runs(tmp_path):
    big = tmp_path / "big.py"
    big.write_text(TINY + "#" * 2**20)
    with pytest.raises(TaskError, match="file/big: the reference cannot be evaluated: it is .* bytes, over the "
                                        "limit of 524288 bytes"):
        load_file(big)
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "big.py").write_text(big.read_text())
    with pytest.raises(SourceError, match="task file .*big.py cannot be evaluated"):
        load_tasks(str(folder))
