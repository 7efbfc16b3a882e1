"""What a candidate's runner sends the parent is hostile input (tests/fixtures/channel): a time that is NaN,
zero or a string, a reply nested past the parser's recursion, bloated, or preceded by garbage, a number past
64 bits, a death at a step of the candidate's choosing, an output computed into the harness's own region.
Each ends as the candidate's own verdict (`runtime_error`, `protocol.malformed`), through the real CLI, the
reward server and a stage-3 reward call: no exception in the parent, no `infra_error`, no NaN anywhere."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cudal1.cli.main import main
from cudal1.core.types import EvalResult, Status
from cudal1.eval import EvalConfig, evaluate_candidate, runner_process
from cudal1.eval import evaluation as evaluation_module
from cudal1.eval.sandbox import detect_sandbox
from cudal1.tasks.sources import load_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CHANNEL = FIXTURES / "channel"
RELU = FIXTURES / "candidates" / "refs" / "relu.py"
FAST = ["--device", "cpu", "--trials", "2", "--buckets", "3", "--json", "--no-store"]
needs_sandbox = pytest.mark.skipif(detect_sandbox().level == "none", reason="no sandbox on this host")

#: fixture -> what the message must say (the candidate's runtime_error, by name).
MALFORMED = {
    "nan_time.py": "Called.ms is not finite",
    "zero_time.py": "Called.ms is 0, not above 0",
    "deep_json.py": "nested deeper than the parser takes",
    "deep_json_large.py": "exceeds its limit",
    "bloated_reply.py": "exceeds its limit",
    "wrong_types.py": "Called",
    "garbage_frame.py": "not JSON",
    "huge_number.py": "beyond 64 bits",
}
#: The ones every test run takes (the rest: `-m slow`).
QUICK = ("nan_time.py", "deep_json.py")


def evaluate_cli(name: str, capsys) -> dict:
    assert main(["eval", "--ref", str(RELU), "--candidate", str(CHANNEL / name), *FAST]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    return json.loads(out)  # strict JSON: a NaN would not parse with parse_constant below either


def no_nan(text: str) -> None:
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the output"))


@needs_sandbox
@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in QUICK else [pytest.mark.slow])
                                  for n in sorted(MALFORMED)])
def test_a_runner_that_breaks_the_schema_is_the_candidates_runtime_error(name, capsys):
    result = evaluate_cli(name, capsys)
    no_nan(json.dumps(result))
    assert result["status"] == "runtime_error", (name, result["status"], result["message"])
    assert "protocol.malformed: " in result["message"] and MALFORMED[name] in result["message"], result["message"]
    assert "protocol.malformed" in [f["rule"] for f in result["flags"]]


@needs_sandbox
@pytest.mark.parametrize("name", ["sigkill_varying.py", pytest.param("sigkill_import.py", marks=pytest.mark.slow)])
def test_a_runner_that_kills_itself_at_any_step_is_the_candidates_crash(name, capsys):
    """SIGKILL at a step drawn anew in each attempt used to be `infra_error` (no verdict, a free retry)."""
    result = evaluate_cli(name, capsys)
    assert result["status"] == "runtime_error", result["message"]
    assert "killed (SIGKILL) in both attempts" in result["message"]


@needs_sandbox
def test_a_death_while_the_machines_oom_killer_acts_is_no_verdict(monkeypatch):
    """The one outside cause a SIGKILL can be told by: the kernel's OOM killer acted during the attempt."""
    kills = iter(range(100))
    monkeypatch.setattr(evaluation_module, "machine_oom_kills", lambda: next(kills))
    result = evaluate_candidate(load_file(RELU), (CHANNEL / "sigkill_import.py").read_text(),
                                EvalConfig(device="cpu", correctness_trials=2, buckets=3))
    assert result.status is Status.INFRA_ERROR and "OOM killer" in result.message


@needs_sandbox
def test_a_runner_past_its_channel_budget_is_stopped(monkeypatch):
    monkeypatch.setattr(runner_process, "CHANNEL_BUDGET_BYTES", 20_000)  # an honest runner sends more than this
    result = evaluate_candidate(load_file(RELU), (CHANNEL / "honest_control.py").read_text(),
                                EvalConfig(device="cpu", correctness_trials=2, buckets=3))
    assert result.status in (Status.RUNTIME_ERROR, Status.INFRA_ERROR)
    assert "over the budget" in result.message


@needs_sandbox
def test_the_reward_server_answers_a_hostile_runner_with_the_candidates_verdict():
    import httpx

    from cudal1.service.pool import LocalPool, LocalPoolConfig
    from tests.service._server_utils import TOKEN, running_server

    pool = LocalPool(EvalConfig(device="cpu", correctness_trials=2, buckets=3), LocalPoolConfig(cpu_slots=1))
    try:
        with running_server(pool) as (url, _):
            body = {"task_id": "request/relu", "source": (CHANNEL / "nan_time.py").read_text(),
                    "reference_source": RELU.read_text()}
            answer = httpx.post(f"{url}/v1/evaluate", json=body, headers={"Authorization": f"Bearer {TOKEN}"},
                                timeout=300)
    finally:
        pool.close()
    assert answer.status_code == 200
    no_nan(answer.text)
    result = EvalResult.from_dict(answer.json())
    assert result.status is Status.RUNTIME_ERROR and "Called.ms is not finite" in result.message


@needs_sandbox
def test_a_stage3_reward_for_a_hostile_runner_is_a_finite_failure_reward():
    from cudal1.service.evaluator import InProcessEvaluator
    from cudal1.train.rewards import KernelReward, RewardConfig

    task = load_file(RELU)
    source = (CHANNEL / "nan_time.py").read_text()
    with InProcessEvaluator(EvalConfig(device="cpu", correctness_trials=2, buckets=3)) as evaluator:
        reward = KernelReward([task], evaluator, RewardConfig(normalize=False))
        values = reward([f"```python\n{source}\n```"], task_id=[task.id])
    assert values == [0.0] and all(math.isfinite(v) for v in values)
