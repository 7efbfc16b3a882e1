"""The TRL reward adapter over a pool, a client and a callable (cudal1.integrations.trl)."""

from __future__ import annotations

import httpx
import pytest

from cudal1.core.types import EvalResult, Status, TimingStats
from cudal1.eval.config import EvalConfig
from cudal1.integrations.trl import make_trl_reward
from cudal1.service.client import RewardClient
from cudal1.service.pool import LocalPool, LocalPoolConfig

CODE = "class ModelNew:\n    SPEED = {speed}\n"


def completion(speed: float) -> str:
    return f"## Code\n```python\n{CODE.format(speed=speed)}```\n"


def scripted(task, source, config) -> EvalResult:
    speed = float(source.split("SPEED = ")[1].split()[0])
    if speed < 0:
        return EvalResult(status=Status.HACK_DETECTED, message="guard fired")
    return EvalResult(status=Status.CORRECT, speedup=speed)


def test_pool_evaluator_with_strings_and_chat_messages():
    seen = []
    with LocalPool(EvalConfig(device="cpu"), LocalPoolConfig(cpu_slots=2), evaluate_fn=scripted) as pool:
        reward = make_trl_reward(pool, on_result=lambda tid, src, r: seen.append((tid, r.status)))
        completions = [completion(2.5), [{"role": "assistant", "content": completion(-1)}], "no code at all"]
        out = reward(completions, task_id=["softmax_lastdim", "builtin/level1/row_mean", "row_mean"],
                     prompts=["p"] * 3)
    assert out == [2.5, 0.0, 0.0]
    assert reward.__name__ == "cudal1_speedup"
    assert seen == [("softmax_lastdim", Status.CORRECT), ("builtin/level1/row_mean", Status.HACK_DETECTED)]


def test_failure_rewards_and_reference_column():
    calls = []

    def evaluator(task_id, source):
        calls.append(task_id)
        return scripted(None, source, None)

    reward = make_trl_reward(evaluator, failure_rewards={Status.HACK_DETECTED: -1.0, Status.UNPARSEABLE: None},
                             name="speed")
    assert reward([completion(-1), "nothing", completion(3)], task_id=["a", "b", "c"]) == [-1.0, None, 3.0]
    assert calls == ["a", "c"] and reward.__name__ == "speed"
    with pytest.raises(ValueError, match="task_id"):
        reward([completion(1)], other=["x"])


def test_a_non_finite_speedup_is_no_reward():
    speedups = iter([float("inf"), float("nan"), 2.0])
    reward = make_trl_reward(lambda task_id, source: EvalResult(status=Status.CORRECT, speedup=next(speedups)))
    assert reward([completion(1)] * 3, task_id=["a", "b", "c"]) == [0.0, 0.0, 2.0]


def test_the_low_end_of_the_interval_can_be_the_reward():
    timing = TimingStats(ref_ms=2.0, candidate_ms=1.0, speedup=2.0, stability=0.1, bucket_speedups=[2.0],
                         speedup_ci=[1.1, 2.4])
    result = EvalResult(status=Status.CORRECT, speedup=2.0, timing=timing)
    assert make_trl_reward(lambda task_id, source: result)([completion(1)], task_id=["a"]) == [2.0]
    lower = make_trl_reward(lambda task_id, source: result, speedup_estimate="lower")
    assert lower([completion(1)], task_id=["a"]) == [1.1]
    with pytest.raises(ValueError, match="point, lower"):
        make_trl_reward(lambda task_id, source: result, speedup_estimate="median")


def test_unknown_task_id_raises_for_a_pool():
    with LocalPool(EvalConfig(device="cpu"), evaluate_fn=scripted) as pool:
        reward = make_trl_reward(pool)
        with pytest.raises(Exception, match="no task"):
            reward([completion(1)], task_id=["missing/task"])


def test_client_evaluator_sends_one_batch_with_references():
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        import json

        body = json.loads(request.content)
        bodies.append(body)
        return httpx.Response(200, json={"results": [
            EvalResult(status=Status.CORRECT, speedup=1.25, task_id=i["task_id"]).to_dict() for i in body["items"]]})

    client = RewardClient("http://x", transport=httpx.MockTransport(handler))
    reward = make_trl_reward(client, reference_column="ref")
    assert reward([completion(1), completion(2)], task_id=["t1", "t2"], ref=["REF1", "REF2"]) == [1.25, 1.25]
    assert len(bodies) == 1
    assert [(i["task_id"], i["reference_source"]) for i in bodies[0]["items"]] == [("t1", "REF1"), ("t2", "REF2")]
