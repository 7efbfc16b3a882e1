"""Policy evaluation: unbiased pass@k, the report in the paper's format, a scripted policy end to end."""

from __future__ import annotations

import json
from math import comb

import pytest

from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Status
from cudal1.llm.backends import Completion
from cudal1.tasks.splits import make_split
from cudal1.train.policy_eval import PolicyEvalConfig, evaluate_policy, ks_for, pass_at_k
from tests.train.helpers import FIXTURE_TASKS, correct_code, wrong_code


@pytest.mark.parametrize("n, c, k", [(10, 3, 1), (10, 3, 5), (8, 0, 4), (8, 8, 1), (5, 2, 4)])
def test_pass_at_k_matches_the_combinatorial_definition(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    assert ks_for(8) == [1, 2, 4, 8] and ks_for(6) == [1, 2, 4, 6] and ks_for(1) == [1]


class ScriptedBackend:
    """Per task: the first sample correct for tasks of level 1, every sample wrong otherwise."""

    def __init__(self, tasks):
        self.tasks = tasks

    def generate(self, prompts, n=1, **kw):
        out = []
        for prompt in prompts:
            task = next(t for t in self.tasks if t.source.strip() in prompt[-1]["content"])
            good = f"```python\n{correct_code(task)}\n```"
            bad = f"```python\n{wrong_code(task)}\n```"
            texts = [good if (task.level == 1 and j == 0) else bad for j in range(n)]
            out.append([Completion(text=t) for t in texts])
        return out


def test_scripted_policy_report(tmp_path, tiny_tasks):
    def evaluator(task, source):
        if "1.0 + " in source:
            return EvalResult(status=Status.INCORRECT, task_id=task.id)
        return EvalResult(status=Status.CORRECT, speedup=2.0, task_id=task.id)

    split_path = make_split(tiny_tasks, test_fraction=0.5, seed=3).save(tmp_path / "splits.json")
    cfg = PolicyEvalConfig(checkpoint="scripted", source=str(FIXTURE_TASKS), split="all", samples=4,
                           splits_file=str(split_path), output=str(tmp_path / "report.json"))
    report = evaluate_policy(cfg, backend=ScriptedBackend(tiny_tasks), evaluator=evaluator)
    level1 = sum(t.level == 1 for t in tiny_tasks)
    assert len(report.tasks) == len(tiny_tasks)
    assert report.success_rate == pytest.approx(level1 / (4 * len(tiny_tasks)))
    assert report.task_success_rate == pytest.approx(level1 / len(tiny_tasks))
    assert report.pass_at[1] == pytest.approx(0.25 * level1 / len(tiny_tasks))
    assert report.pass_at[4] == pytest.approx(level1 / len(tiny_tasks))
    # Failures count as 1.0x (the paper's convention): half the tasks at 2x, half at 1x.
    assert report.speedup["mean"] == pytest.approx(1.5) and report.speedup["success"] == level1
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["pass_at"]["pass@4"] == pytest.approx(report.pass_at[4])
    assert ("pass@4", f"{report.pass_at[4]:.3f}") in report.table_rows()
    test_only = evaluate_policy(PolicyEvalConfig(**{**cfg.__dict__, "split": "test", "output": ""}),
                                backend=ScriptedBackend(tiny_tasks), evaluator=evaluator)
    assert {t.task_id for t in test_only.tasks} == set(json.loads(split_path.read_text())["test"])


def test_config_needs_a_policy():
    with pytest.raises(ConfigError, match="checkpoint"):
        PolicyEvalConfig()


def test_a_contrastive_policy_is_evaluated_on_contrastive_prompts(tmp_path, tiny_tasks):
    """evaluate-policy only prompted plainly: a contrastively trained policy was tested off its distribution."""
    from cudal1.exemplars import ExemplarDB

    db_path = tmp_path / "exemplars.sqlite"
    db = ExemplarDB(db_path)
    for task in tiny_tasks:
        db.add(task.id, correct_code(task) + "\n# exemplar kernel\n", 1.7)
    seen = []

    class Recording(ScriptedBackend):
        def generate(self, prompts, n=1, **kw):
            seen.extend(p[-1]["content"] for p in prompts)
            return super().generate(prompts, n, **kw)

    def evaluator(task, source):
        return EvalResult(status=Status.CORRECT, speedup=2.0, task_id=task.id)

    cfg = PolicyEvalConfig(checkpoint="scripted", source=str(FIXTURE_TASKS), split="all", samples=1,
                           exemplar_db=str(db_path))
    evaluate_policy(cfg, backend=Recording(tiny_tasks), evaluator=evaluator)
    assert len(seen) == len(tiny_tasks) and all("# exemplar kernel" in text and "1.7" in text for text in seen)
    with pytest.raises(ConfigError, match="does not exist"):
        PolicyEvalConfig(checkpoint="x", exemplar_db=str(tmp_path / "none.sqlite"))
