"""The learning demonstration's script: recipes, kernels, the table reward and one tiny run of every arm.

The GPU measurement itself is not run here (it needs a GPU); a table with a known landscape stands in for
it, and the kernels the recipes stand for are compiled (NVRTC, no GPU needed).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cudal1.core.types import Status
from cudal1.raw_cuda import compile_only
from tests.helpers.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "learning_demo.py"


@pytest.fixture(scope="module")
def demo():
    return load_script("learning_demo")


def synthetic_table(demo, fail: str = "T64 V1 U1 B") -> dict:
    """A table whose best recipe is known: coalesced, 4-wide, 4 vectors per thread, 256 threads."""
    tasks = {}
    train, held = demo.all_tasks()
    for task in train + held:
        recipes = {}
        for r in demo.SPACE:
            speed = 1.0 + (r.access == "C") + 0.5 * (r.vec == 4) + 0.3 * (r.unroll == 4) + 0.2 * (r.threads == 256)
            ok = r.text != fail
            recipes[r.text] = {"status": "correct" if ok else "incorrect", "speedup": speed if ok else None}
        tasks[task.id] = {"held_out": task in held, "source": task.source, "recipes": recipes}
    return {"protocol": {"profile": "synthetic", "space": [r.text for r in demo.SPACE]}, "tasks": tasks}


def test_recipes_parse_to_the_space_only(demo):
    assert len(demo.SPACE) == 36
    assert demo.parse_recipe(" T256 V4 U4 C\n") == "T256 V4 U4 C"
    assert demo.parse_recipe("T128 V4 U4 C") is None  # not in the space
    assert demo.parse_recipe("garbage") is None


def test_every_recipe_is_a_kernel_that_compiles(demo):
    train, held = demo.all_tasks()
    kernel = re.compile(r'SOURCE = r"""(.*?)"""', re.S)
    first = train[0]
    for task in train + held:  # every op once, every recipe on one op
        for r in demo.SPACE if task is first else demo.SPACE[:1]:
            source = demo.candidate_source(task, r.text)
            assert f"# recipe: {r.text}" in source and "class ModelNew" in source
            result = compile_only(kernel.search(source)[1], arch="sm_90")
            assert result.cubin_bytes, result.log


def test_the_table_pays_measured_speedups_and_zero_for_failures(demo):
    table = demo.Table(synthetic_table(demo))
    task = demo.all_tasks()[0][0]
    assert table.speedup(task.id, "T256 V4 U4 C") == pytest.approx(3.0) == table.best(task.id)
    assert table.speedup(task.id, "T64 V1 U1 B") == 0.0 and table.speedup(task.id, None) == 0.0
    assert table.result(task, "T64 V1 U1 B").status is Status.INCORRECT
    assert table.result(task, "T256 V4 U4 C").speedup == pytest.approx(3.0)
    metrics = demo.step_metrics(table, [(task.id, "T256 V4 U4 C"), (task.id, None)])
    assert metrics == {"raw_reward_mean": 1.5, "fraction_of_best": 0.5, "correct_rate": 0.5}


def test_contrastive_prompts_show_the_database_and_plain_ones_do_not(demo, tmp_path):
    db = demo.ExemplarDB(tmp_path / "ex.sqlite")
    task = demo.all_tasks()[0][0]
    db.add(task.id, "T64 V1 U1 C", 1.2, {})
    db.add(task.id, "T256 V4 U4 C", 3.5, {})
    contrastive = demo.RecipePromptBuilder(db, "bucket", 2, 0).build(task)[0]["content"]
    plain = demo.RecipePromptBuilder(db, None, 2, 0).build(task)[0]["content"]
    assert contrastive.startswith("task swish n=2^20\n") and contrastive.endswith("recipe:")
    assert contrastive.index("T64 V1 U1 C -> 1.20x") < contrastive.index("T256 V4 U4 C -> 3.50x")
    assert plain == "task swish n=2^20\nrecipe:"


def test_every_arm_runs_and_the_summary_has_the_published_shape(demo, tmp_path):
    table_path = tmp_path / "table.json"
    table_path.write_text(json.dumps(synthetic_table(demo)))
    args = demo.parse_args(["train", str(tmp_path), "--table", str(table_path), "--seeds", "1", "--steps", "2",
                            "--generations", "2", "--sft-records", "16", "--sft-epochs", "1",
                            "--held-out-samples", "4"])
    summary = demo.train_arms(table_path, tmp_path, args)
    assert set(summary["arms"]) == set(demo.ARMS)
    for entry in summary["arms"].values():
        assert entry["seeds"] == 1 and entry["steps"] == [1, 2] and len(entry["raw_reward_mean"]) == 2
        assert entry["best_possible"] == pytest.approx(3.0)
        assert all(0.0 <= f <= 1.0 for f in entry["fraction_of_best"])
    assert set(summary["held_out"]["best_possible"]) == {demo.task_id(*t) for t in demo.HELD_OUT_TASKS}
    assert summary["protocol"]["evaluations_per_arm_and_seed"] == 2 * 2 * len(demo.TRAIN_TASKS)
    assert (tmp_path / "learning_demo.json").is_file() and (tmp_path / "learning_demo.png").stat().st_size > 0


def test_a_partial_table_is_refused(demo, tmp_path):
    data = synthetic_table(demo)
    data["tasks"][demo.task_id(*demo.TRAIN_TASKS[0])]["recipes"].popitem()
    (tmp_path / "table.json").write_text(json.dumps(data))
    args = demo.parse_args(["train", str(tmp_path)])
    with pytest.raises(SystemExit, match="not every recipe was measured"):
        demo.train_arms(tmp_path / "table.json", tmp_path, args)


def test_a_rerun_is_placed_against_the_committed_seeds_spread(demo):
    """`--against`: each arm's last-15-step fraction of the best lies inside or outside the committed
    seeds' 95 % prediction interval; a committed seed is inside, a collapsed run is not."""
    committed = json.loads((SCRIPT.parents[1] / "docs/results/learning_demo_runs.json").read_text())
    one_seed = {arm: runs[1:2] for arm, runs in committed.items()}
    assert all(e["inside"] for e in demo.against(one_seed, committed).values())
    steps = [{"raw_reward_mean": 0.0, "fraction_of_best": 0.0, "correct_rate": 0.0}] * 20
    found = demo.against({"grpo-plain": [{"steps": steps}]}, committed)
    assert set(found) == {"grpo-plain"} and found["grpo-plain"]["inside"] is False
    assert found["grpo-plain"]["now"] == [0.0] and found["grpo-plain"]["committed_min"] > 0.5


def test_the_interval_is_wider_than_the_seeds_range_and_shrinks_with_more_seeds(demo):
    """A new seed falls outside the range of 3 earlier draws half of the time; the interval accounts for n."""
    lo, hi = demo.prediction_interval([0.84, 0.86, 0.88])
    # mean 0.86, s 0.02, t(2) 4.303, sqrt(1 + 1/3): half-width 0.0994
    assert lo == pytest.approx(0.86 - 0.0994, abs=1e-4) and hi == pytest.approx(0.86 + 0.0994, abs=1e-4)
    lo8, hi8 = demo.prediction_interval([0.84, 0.86, 0.88] * 2 + [0.85, 0.87])
    assert lo < lo8 < 0.84 and 0.88 < hi8 < hi
    assert demo.prediction_interval([0.5]) == (0.5, 0.5)


def test_spearman_ranks_with_ties(demo):
    assert demo.spearman([1, 2, 3, 4], [10, 20, 30, 45]) == pytest.approx(1.0)
    assert demo.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert demo.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254, rel=1e-6)


def test_the_demo_pays_raw_speedups_and_states_its_reward(demo):
    """the demo's reward was min(speedup, 1.5) (the smoothing's clip applied to raw speedups), so
    28 of gelu_2p24's 36 recipes earned the same; now it is the raw speedup, and the summary says so."""
    from cudal1.service.evaluator import as_evaluator
    from cudal1.train.rewards import KernelReward

    table = demo.Table(synthetic_table(demo))
    task = demo.all_tasks()[0][0]
    reward = KernelReward([task], as_evaluator(table.result), demo.demo_reward({}, 2), extract=demo.parse_recipe)
    completions = [[{"role": "assistant", "content": r}] for r in ("T256 V4 U4 C", "T64 V1 U1 C")]
    assert reward(completions, task_id=[task.id] * 2) == pytest.approx([3.0, 2.0])
    assert demo.demo_reward({}, 2).describe() == "raw speedup (failures: their failure reward), not normalized, not clipped"
