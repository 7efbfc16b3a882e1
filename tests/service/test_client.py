"""The reward client: results, retries honouring Retry-After, refusals (cudal1.service.client)."""

from __future__ import annotations

import time

import _service_fakes as fakes
import httpx
import pytest
from _server_utils import TOKEN, running_server
from _service_fakes import FAST_CONFIG, TINY_REF, fake_evaluate, fake_source

from cudal1.core.types import EvalResult, Status
from cudal1.service.client import RewardClient, RewardServerError
from cudal1.service.pool import LocalPool, LocalPoolConfig

OK = EvalResult(status=Status.CORRECT, speedup=2.0, task_id="t").to_dict()


def _scripted(responses: list[httpx.Response], seen: list[httpx.Request]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return responses.pop(0)

    return httpx.MockTransport(handler)


def test_retries_429_and_5xx_honouring_retry_after():
    seen: list[httpx.Request] = []
    responses = [httpx.Response(429, headers={"Retry-After": "0.2"}, json={"detail": "busy"}),
                 httpx.Response(503, json={"detail": "down"}), httpx.Response(200, json=OK)]
    client = RewardClient("http://x", token="tok", transport=_scripted(responses, seen), backoff_s=0.01)
    started = time.monotonic()
    result = client.evaluate("t", "src")
    assert result.status is Status.CORRECT and result.speedup == 2.0
    assert len(seen) == 3 and time.monotonic() - started >= 0.2
    assert seen[0].headers["authorization"] == "Bearer tok"


def test_refusals_are_not_retried_and_give_up_after_max_retries():
    seen: list[httpx.Request] = []
    client = RewardClient("http://x", transport=_scripted([httpx.Response(413, json={"detail": "too big"})], seen))
    with pytest.raises(RewardServerError, match="too big") as info:
        client.evaluate("t", "src")
    assert info.value.status == 413 and len(seen) == 1
    seen.clear()
    client = RewardClient("http://x", max_retries=2, backoff_s=0.0,
                          transport=_scripted([httpx.Response(500, text="oops")] * 3, seen))
    with pytest.raises(RewardServerError, match="gave up after 3 attempts"):
        client.evaluate("t", "src")
    assert len(seen) == 3


def test_from_env_needs_the_url(monkeypatch):
    monkeypatch.delenv("CUDAL1_REWARD_URL", raising=False)
    with pytest.raises(RewardServerError, match="CUDAL1_REWARD_URL"):
        RewardClient.from_env()
    monkeypatch.setenv("CUDAL1_REWARD_URL", "http://h:1/")
    assert RewardClient.from_env().base_url == "http://h:1"


def test_against_a_live_server():
    fakes.reset_counters()
    pool = LocalPool(FAST_CONFIG, LocalPoolConfig(cpu_slots=2), evaluate_fn=fake_evaluate)
    with running_server(pool, max_batch_items=3) as (url, _):
        with RewardClient(url, token=TOKEN, batch_size=3) as client:
            one = client.evaluate("test/add", fake_source(speedup=3), reference_source=TINY_REF)
            items = [{"task_id": "test/add", "source": fake_source(speedup=s), "reference_source": TINY_REF}
                     for s in (1, 2, 3, 4, 5)]
            many = client.evaluate_many(items)  # split into batches of <= 3
            assert client.health()["n_devices"] == 1
            assert "cudal1_evaluations_total" in client.metrics_text()
        assert one.speedup == 3.0 and [r.speedup for r in many] == [1, 2, 3, 4, 5]
        with RewardClient(url, token="wrong") as bad, pytest.raises(RewardServerError) as info:
            bad.evaluate("test/add", "x")
        assert info.value.status == 401
        with RewardClient(url, token=TOKEN, batch_size=10) as client, pytest.raises(RewardServerError) as info:
            client.evaluate_many(items)
        assert info.value.status == 413
    pool.close()
