"""verl adapter: reward functions over the reward client, and the parquet exporter (cudal1.integrations.verl)."""

from __future__ import annotations

import json

import httpx
import pytest

from cudal1.core.types import EvalResult, Status
from cudal1.integrations import verl
from cudal1.service.client import RewardClient
from cudal1.tasks import load_tasks

GOOD = "```python\nclass ModelNew:\n    pass\n```"


def _client(status_by_task: dict[str, Status], bodies: list) -> RewardClient:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        out = []
        for item in body["items"]:
            status = status_by_task[item["task_id"]]
            out.append(EvalResult(status=status, speedup=2.0 if status is Status.CORRECT else None).to_dict())
        return httpx.Response(200, json={"results": out})

    return RewardClient("http://x", transport=httpx.MockTransport(handler))


def test_compute_score_batch_scores_in_one_request():
    bodies: list = []
    client = _client({"a": Status.CORRECT, "b": Status.INCORRECT}, bodies)
    scores = verl.compute_score_batch(["cudal1"] * 3, [GOOD, GOOD, "no code"], ["a", "b", "a"],
                                      [None, {"reference_source": "REF"}, None], client=client)
    assert scores == [2.0, 0.0, 0.0]
    assert len(bodies) == 1 and len(bodies[0]["items"]) == 2  # the unparseable one is not sent
    assert bodies[0]["items"][1]["reference_source"] == "REF"


def test_a_non_finite_speedup_scores_zero():
    class Client:
        def evaluate_many(self, items):
            return [EvalResult(status=Status.CORRECT, speedup=s) for s in (float("inf"), float("nan"), 1.5)]

    assert verl.compute_score_batch(["cudal1"] * 3, [GOOD] * 3, ["a", "b", "c"], client=Client()) == [0.0, 0.0, 1.5]


def test_compute_score_uses_the_environment(monkeypatch):
    bodies: list = []
    monkeypatch.setattr(verl, "_client", _client({"builtin/level1/row_mean": Status.CORRECT}, bodies))
    assert verl.compute_score("cudal1", GOOD, "builtin/level1/row_mean", {"index": 0}) == 2.0
    with pytest.raises(ValueError, match="task id"):
        verl.compute_score("cudal1", GOOD, None, {})


def test_client_from_env_requires_the_url(monkeypatch):
    monkeypatch.setattr(verl, "_client", None)
    monkeypatch.delenv("CUDAL1_REWARD_URL", raising=False)
    with pytest.raises(Exception, match="CUDAL1_REWARD_URL"):
        verl.compute_score("cudal1", GOOD, "a")


def test_export_parquet_has_verls_columns(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    tasks = load_tasks("builtin")[:3]
    rows = verl.rows_from_tasks(tasks, lambda t: [{"role": "user", "content": f"make {t.name} faster"}])
    rows[1]["reference_source"] = "REF"
    path = verl.export_verl_parquet(rows, tmp_path / "train.parquet")
    table = pq.read_table(path).to_pylist()
    assert set(table[0]) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert table[0]["prompt"] == [{"role": "user", "content": f"make {tasks[0].name} faster"}]
    assert table[2]["reward_model"] == {"style": "rule", "ground_truth": tasks[2].id}
    assert table[2]["extra_info"]["task_id"] == tasks[2].id and table[2]["extra_info"]["index"] == 2
    assert table[1]["extra_info"]["reference_source"] == "REF" and table[0]["extra_info"]["reference_source"] is None
    with pytest.raises(ValueError):
        verl.export_verl_parquet([], tmp_path / "empty.parquet")


def test_default_prompt_is_cudal1s_plain_prompt():
    task = load_tasks("builtin")[0]
    rows = verl.rows_from_tasks([task])
    messages = verl.verl_record(rows[0])["prompt"]
    assert messages[-1]["role"] == "user" and "class Model" in messages[-1]["content"]
