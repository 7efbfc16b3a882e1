"""The GRPO reward: exemplar DB, judge, metrics and the real evaluator (verdict -> reward and smoothing:
tests/core/test_rewards.py)."""

from __future__ import annotations

import pytest

from cudal1.core.types import EvalResult, Status, TimingStats
from cudal1.exemplars import ExemplarDB
from cudal1.train.rewards import KernelReward, RewardConfig
from tests.train.helpers import correct_code, wrong_code


def _completion(code: str) -> list[dict]:
    return [{"role": "assistant", "content": f"## Code\n```python\n{code}\n```"}]


def test_reward_adds_successes_to_db_and_logs_metrics(tmp_path, tiny_tasks):
    task = tiny_tasks[0]
    speedups = iter([2.0, 1.0])

    def evaluator(t, source):
        if "1.0 + " in source:
            return EvalResult(status=Status.INCORRECT, task_id=t.id)
        return EvalResult(status=Status.CORRECT, speedup=next(speedups), task_id=t.id)

    db = ExemplarDB(tmp_path / "ex.sqlite")
    metrics = {}
    reward = KernelReward(tiny_tasks, evaluator, RewardConfig(normalize=False, clip_k=5.0), exemplar_db=db)
    out = reward([_completion(correct_code(task)), _completion(wrong_code(task)), "no code here"],
                 task_id=[task.id] * 3, log_metric=lambda k, v: metrics.__setitem__(k, v))
    assert out == [2.0, 0.0, 0.0]
    assert db.count(task.id) == 1 and db.best(task.id).score == 2.0
    assert metrics["kernel/success_rate"] == pytest.approx(1 / 3)
    assert reward.history[-1]["statuses"] == {"correct": 1, "incorrect": 1, "unparseable": 1}


def test_judge_vetoes_a_suspicious_jump(tmp_path, tiny_tasks):
    task = tiny_tasks[0]
    db = ExemplarDB(tmp_path / "ex.sqlite")
    db.add(task.id, "class ModelNew: pass  # old", 1.2)
    asked = []

    class Judge:
        def check(self, t, source, result):
            asked.append(result.speedup)
            return result.speedup < 10

    def evaluator(t, source):
        return EvalResult(status=Status.CORRECT, speedup=50.0 if "# fast" in source else 2.0, task_id=t.id)

    cfg = RewardConfig(normalize=False, clip_k=100.0, judge_jump_factor=3.0,
                       failure_rewards={"hack_detected": -1.0})
    reward = KernelReward(tiny_tasks, evaluator, cfg, exemplar_db=db, judge=Judge())
    cheat = correct_code(task) + "\n# fast\n"  # the evaluator says 50x: a jump over 3 x 1.2
    legit = correct_code(task)
    out = reward([_completion(cheat), _completion(legit)], task_id=[task.id, task.id])
    assert asked == [50.0] and out == [-1.0, 2.0]
    assert db.best(task.id).score == 2.0  # the vetoed candidate stayed out
    assert reward.history[-1]["judge_vetoes"] == 1


def test_rewards_flow_from_the_real_evaluator(tiny_tasks, real_evaluator, tmp_path):
    """Real isolated evaluation on CPU: a correct candidate earns its speedup, a wrong one the failure value."""
    task = tiny_tasks[0]
    db = ExemplarDB(tmp_path / "ex.sqlite")
    reward = KernelReward(tiny_tasks, real_evaluator, RewardConfig(normalize=False, clip_k=1e6, eval_threads=2),
                          exemplar_db=db)
    out = reward([_completion(correct_code(task)), _completion(wrong_code(task))], task_id=[task.id, task.id])
    assert out[0] > 0 and out[1] == 0.0
    assert reward.history[-1]["statuses"] == {"correct": 1, "incorrect": 1}
    assert db.count(task.id) == 1


def test_the_project_s_llm_judge_plugs_in_and_sees_a_task_s_first_success(tmp_path, tiny_tasks):
    """The reward called `check()`, which `LLMJudge` lacked, and asked only about jumps over an earlier
    success, so a task's first (cheating) 50x was never judged."""
    from cudal1.judge import HackCaseDB
    from cudal1.judge.judge import JudgeConfig, make_judge
    from tests.helpers.scripted_server import ScriptedOpenAIServer

    task = tiny_tasks[0]
    cheats = '{"cheats": true, "rule": "result_caching", "explanation": "returns a stored output"}'

    def evaluator(t, source):
        return EvalResult(status=Status.CORRECT, speedup=50.0, task_id=t.id)

    with ScriptedOpenAIServer([cheats]) as srv:
        judge = make_judge(JudgeConfig(llm=f"openai:judge@{srv.base_url}", max_retries=0, timeout_s=10.0),
                           HackCaseDB(tmp_path / "cases.sqlite"))
        reward = KernelReward(tiny_tasks, evaluator, RewardConfig(normalize=False, clip_k=100.0,
                                                                   failure_rewards={"hack_detected": -1.0}),
                              exemplar_db=ExemplarDB(tmp_path / "ex.sqlite"), judge=judge)
        out = reward([_completion(correct_code(task))], task_id=[task.id])
    assert out == [-1.0] and len(srv.requests) == 1 and reward.history[-1]["judge_vetoes"] == 1


def test_an_unnormalized_reward_is_the_raw_speedup_never_clipped(tmp_path, tiny_tasks):
    """`RewardConfig(normalize=False)` paid min(speedup, 1.5): the default clip of the smoothing was
    applied to raw speedups, so a 3.7x candidate earned what a 1.5x one did."""
    task = tiny_tasks[0]
    speedups = iter([3.7, 1.6])

    def evaluator(t, source):
        return EvalResult(status=Status.CORRECT, speedup=next(speedups), task_id=t.id)

    reward = KernelReward(tiny_tasks, evaluator, RewardConfig(normalize=False))
    assert reward([_completion(correct_code(task)), _completion(correct_code(task) + "\n# b\n")],
                  task_id=[task.id] * 2) == [3.7, 1.6]
    assert "not normalized, not clipped" in RewardConfig(normalize=False).describe()


def test_group_scope_is_the_default_and_keeps_one_task_from_setting_another_s_scale(tiny_tasks):
    """batch-scoped normalization let one task's large speedups set sigma for every task."""
    a, b = tiny_tasks[0], tiny_tasks[1]
    table = {"a1": 1.0, "a2": 1.2, "b1": 20.0, "b2": 40.0}

    def evaluator(t, source):
        return EvalResult(status=Status.CORRECT, speedup=table[source.split("# ")[-1].strip()], task_id=t.id)

    config = RewardConfig(group_size=2)
    assert config.scope == "group"
    reward = KernelReward(tiny_tasks, evaluator, config)
    out = reward([_completion(correct_code(a) + f"\n# {k}\n") for k in table], task_id=[a.id, a.id, b.id, b.id])
    assert out == pytest.approx([-1.0, 1.0, -1.0, 1.0], abs=1e-4)  # a's small gap counts as much as b's
    with pytest.raises(ValueError, match="group_size >= 2"):
        RewardConfig(group_size=1)  # a group of one would normalize to nothing


@pytest.mark.parametrize(("transform", "expected"), [("log", [1.3083, -2.3026]), ("bounded", [3.0, 0.0])])
def test_log_and_bounded_rewards(tiny_tasks, transform, expected):
    task = tiny_tasks[0]

    def evaluator(t, source):
        if "# bad" in source:
            return EvalResult(status=Status.INCORRECT, task_id=t.id)
        return EvalResult(status=Status.CORRECT, speedup=3.7, task_id=t.id)

    reward = KernelReward(tiny_tasks, evaluator, RewardConfig(normalize=False, transform=transform))
    out = reward([_completion(correct_code(task)), _completion(correct_code(task) + "\n# bad\n")],
                 task_id=[task.id] * 2)
    assert out == pytest.approx(expected, abs=1e-4)
    assert reward.history[-1]["raw_reward_mean"] == pytest.approx(3.7 / 2)  # logged in speedup units


def test_the_trainer_can_pay_the_low_end_of_the_speedups_interval(tiny_tasks):
    """`RLConfig.reward_speedup: lower` reaches the reward: a 1.4x whose interval starts at 1.02x earns 1.02."""
    from cudal1.core.errors import ConfigError
    from cudal1.train.config import RLStageConfig
    from cudal1.train.rl import reward_config

    task = tiny_tasks[0]
    timing = TimingStats(ref_ms=1.4, candidate_ms=1.0, speedup=1.4, stability=0.05, bucket_speedups=[1.4],
                         speedup_ci=[1.02, 1.7])

    def evaluator(t, source):
        return EvalResult(status=Status.CORRECT, speedup=1.4, task_id=t.id, timing=timing)

    for choice, paid in (("point", 1.4), ("lower", 1.02)):
        cfg = reward_config(RLStageConfig(model="scratch", output_dir="runs/x", reward_speedup=choice, reward_normalize=False))
        out = KernelReward(tiny_tasks, evaluator, cfg)([_completion(correct_code(task))], task_id=[task.id])
        assert out == pytest.approx([paid])
    assert reward_config(RLStageConfig(model="scratch", output_dir="runs/x", reward_speedup="lower")).describe() \
        .startswith("raw speedup's 95 % low end")
    with pytest.raises(ConfigError, match="reward_speedup"):
        RLStageConfig(model="scratch", output_dir="runs/x", reward_speedup="upper")
    with pytest.raises(ValueError, match="speedup_estimate"):
        RewardConfig(speedup_estimate="upper")


class _RaisingJudge:
    def check(self, task, source, result):
        raise ImportError("No module named 'openai'")


def _fifty_x(t, source):
    return EvalResult(status=Status.CORRECT, speedup=50.0 if "# fast" in source else 2.0, task_id=t.id)


def test_a_judge_that_raises_does_not_keep_a_50x_reward(tmp_path, tiny_tasks):
    """any exception in the judge kept the evaluator's verdict (without `openai` installed a 50x
    candidate kept its reward of 50). Now the judge fails closed: the candidate pays at most the task's best
    verified speedup, is flagged and stays out of the exemplar database."""
    task = tiny_tasks[0]
    db = ExemplarDB(tmp_path / "ex.sqlite")
    db.add(task.id, "class ModelNew: pass  # verified earlier", 1.2)
    cfg = RewardConfig(normalize=False, judge_jump_factor=3.0)
    reward = KernelReward(tiny_tasks, _fifty_x, cfg, exemplar_db=db, judge=_RaisingJudge())
    out = reward([_completion(correct_code(task) + "\n# fast\n"), _completion(correct_code(task))],
                 task_id=[task.id, task.id])
    assert out == [1.2, 2.0]  # capped at the best verified speedup; the unsuspicious 2x is paid
    assert db.best(task.id).score == 2.0 and db.count(task.id) == 2  # the 50x stayed out
    assert reward.history[-1]["judge_errors"] == 1 and reward.history[-1]["judge_vetoes"] == 0


def test_a_judge_error_with_nothing_verified_is_an_infra_error(tiny_tasks):
    task = tiny_tasks[0]

    class FirstSuccessJudge(_RaisingJudge):
        def should_check(self, result, best):
            return True

    reward = KernelReward(tiny_tasks, _fifty_x, RewardConfig(normalize=False, failure_rewards={"infra_error": -0.5}),
                          judge=FirstSuccessJudge())
    assert reward([_completion(correct_code(task) + "\n# fast\n")], task_id=[task.id]) == [-0.5]
    assert reward.history[-1]["statuses"] == {"infra_error": 1}


def test_a_judge_may_fail_open_when_the_user_says_so(tmp_path, tiny_tasks):
    task = tiny_tasks[0]
    db = ExemplarDB(tmp_path / "ex.sqlite")
    db.add(task.id, "class ModelNew: pass  # verified earlier", 1.2)
    reward = KernelReward(tiny_tasks, _fifty_x, RewardConfig(normalize=False, judge_on_error="open"),
                          exemplar_db=db, judge=_RaisingJudge())
    assert reward([_completion(correct_code(task) + "\n# fast\n")], task_id=[task.id]) == [50.0]


def test_the_llm_judge_without_a_verdict_fails_closed(tmp_path, tiny_tasks):
    """An answer the judge's parser cannot read is no verdict: `LLMJudge.check` returns None, not True."""
    from cudal1.judge import HackCaseDB
    from cudal1.judge.judge import JudgeConfig, make_judge
    from tests.helpers.scripted_server import ScriptedOpenAIServer

    task = tiny_tasks[0]
    db = ExemplarDB(tmp_path / "ex.sqlite")
    db.add(task.id, "class ModelNew: pass  # verified earlier", 1.2)
    with ScriptedOpenAIServer(["I am not sure."]) as srv:
        judge = make_judge(JudgeConfig(llm=f"openai:judge@{srv.base_url}", max_retries=0, timeout_s=10.0),
                           HackCaseDB(tmp_path / "cases.sqlite"))
        reward = KernelReward(tiny_tasks, _fifty_x, RewardConfig(normalize=False), exemplar_db=db, judge=judge)
        out = reward([_completion(correct_code(task) + "\n# fast\n")], task_id=[task.id])
    assert out == [1.2] and reward.history[-1]["judge_errors"] == 1


@pytest.mark.parametrize("field", ["clip_k", "bound", "log_floor", "judge_jump_factor", "noise_floor", "copy_margin"])
def test_a_reward_config_with_a_nan_or_inf_is_refused_by_name(field):
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"{field} must be finite"):
            RewardConfig(**{field: bad})
    with pytest.raises(ValueError, match="failure reward of hack_detected must be finite"):
        RewardConfig(failure_rewards={"hack_detected": float("nan")})


@pytest.mark.parametrize(("mode", "paid"), [("margin", 2.0 * 0.9), ("zero", 0.0), ("full", 2.6)])
def test_a_copy_of_a_shown_exemplar_earns_what_the_configuration_says(tmp_path, tiny_tasks, mode, paid):
    """The exemplar its prompt showed, written again (comments and formatting aside: same norm_hash), is
    evaluated (its speedup joins the exemplar's evaluations) and flagged, but paid as copy_reward says; the
    same code with no exemplar shown is no copy."""
    from cudal1.exemplars import normalized_hash
    from cudal1.train.completions import CompletionLog

    task = tiny_tasks[0]
    exemplar = correct_code(task)
    db = ExemplarDB(tmp_path / "ex.sqlite")
    db.add(task.id, exemplar, 2.0)
    shown = [{"norm_hash": normalized_hash(exemplar), "score": 2.0}]
    metrics = {}
    log = CompletionLog(tmp_path / "completions.jsonl")

    def evaluator(t, source):
        return EvalResult(status=Status.CORRECT, speedup=2.6, task_id=t.id)

    cfg = RewardConfig(normalize=False, copy_reward=mode, copy_margin=0.1)
    reward = KernelReward(tiny_tasks, evaluator, cfg, exemplar_db=db, completion_log=log)
    copy = "# my own idea\n" + exemplar
    out = reward([_completion(copy), _completion(copy)], task_id=[task.id] * 2, shown_exemplars=[shown, []],
                 log_metric=lambda k, v: metrics.__setitem__(k, v))
    assert out == pytest.approx([paid, 2.6])
    assert metrics["kernel/exemplar_copies"] == 1.0 and reward.history[-1]["exemplar_copies"] == 1
    assert db.best(task.id).meta["scores"] == [2.0, 2.6, 2.6]  # evaluated again all the same
    import json

    lines = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert [line["exemplar_copy"] for line in lines] == [True, False] and lines[0]["reward"] == pytest.approx(paid)
    with pytest.raises(ValueError, match="copy_reward"):
        RewardConfig(copy_reward="half")


def test_a_vetoed_copy_keeps_the_judge_s_verdict(tmp_path, tiny_tasks):
    from cudal1.exemplars import normalized_hash

    task = tiny_tasks[0]
    code = correct_code(task)

    class Judge:
        def check(self, t, source, result):
            return False

    reward = KernelReward(tiny_tasks, lambda t, s: EvalResult(status=Status.CORRECT, speedup=50.0, task_id=t.id),
                          RewardConfig(normalize=False, judge_jump_factor=3.0, failure_rewards={"hack_detected": -1.0}),
                          exemplar_db=ExemplarDB(tmp_path / "ex.sqlite"), judge=Judge())
    reward._best[task.id] = 1.0
    out = reward([_completion(code)], task_id=[task.id], shown_exemplars=[[{"norm_hash": normalized_hash(code),
                                                                            "score": 1.0}]])
    assert out == [-1.0] and reward.history[-1]["exemplar_copies"] == 0
