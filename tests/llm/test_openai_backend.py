"""OpenAIBackend against a real local HTTP server speaking the chat-completions protocol."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("openai")

from cudal1.llm.backends import LLMConfig  # noqa: E402
from cudal1.llm.openai_backend import OpenAIBackend, parse_retry_after_s  # noqa: E402
from tests.helpers.scripted_server import Reply, ScriptedOpenAIServer  # noqa: E402


def make(srv: ScriptedOpenAIServer, **overrides) -> OpenAIBackend:
    fields = {"spec": f"openai:tiny-model@{srv.base_url}", "backoff_base_s": 0.01, "backoff_max_s": 0.05,
              "timeout_s": 5.0, "max_retries": 3}
    fields.update(overrides)
    return OpenAIBackend(LLMConfig(**fields))


def test_sampling_params_and_messages_reach_the_server():
    with ScriptedOpenAIServer(["answer one"]) as srv:
        backend = make(srv, temperature=0.3, top_p=0.9, max_tokens=123, seed=7)
        out = backend.generate([[{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]])
    assert [[c.text for c in group] for group in out] == [["answer one"]]
    body = srv.requests[0].body
    assert body["model"] == "tiny-model"
    assert body["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (0.3, 0.9, 123, 7)
    assert out[0][0].finish_reason == "stop" and out[0][0].error is None


def test_per_call_overrides_and_n_as_separate_requests_with_distinct_seeds():
    with ScriptedOpenAIServer(lambda i, body: f"reply {body['seed']}") as srv:
        backend = make(srv, seed=100)
        out = backend.generate(["p0", "p1"], n=3, temperature=0.0, max_tokens=5)
        again = backend.generate(["p0"], n=2)  # the config seed continues: fresh samples
        explicit = backend.generate(["p0"], n=2, seed=7)  # a per-call seed restarts at that seed
    assert len(out) == 2 and all(len(group) == 3 for group in out)
    assert [c.text for c in out[0]] == ["reply 100", "reply 101", "reply 102"]
    assert [c.text for c in out[1]] == ["reply 103", "reply 104", "reply 105"]
    assert [c.text for c in again[0]] == ["reply 106", "reply 107"]
    assert [c.text for c in explicit[0]] == ["reply 7", "reply 8"]
    assert len(srv.requests) == 10
    first_call = [r for r in srv.requests if 100 <= r.body["seed"] <= 105]
    assert {r.body["temperature"] for r in first_call} == {0.0}
    assert {r.body["max_tokens"] for r in first_call} == {5}
    assert {r.body["temperature"] for r in srv.requests if r.body["seed"] > 105} == {1.0}  # config default
    prompts = sorted(r.body["messages"][0]["content"] for r in first_call)
    assert prompts == ["p0"] * 3 + ["p1"] * 3


def test_n_param_mode_sends_one_request():
    with ScriptedOpenAIServer(["x"]) as srv:
        out = make(srv, use_n_param=True).generate(["p"], n=4)
    assert len(srv.requests) == 1 and srv.requests[0].body["n"] == 4
    assert [c.text for c in out[0]] == ["x"] * 4


def test_retries_on_429_and_500_then_succeeds_and_honours_retry_after():
    script = [Reply.error(429, retry_after_s=0.3), Reply.error(500), "finally"]
    with ScriptedOpenAIServer(script) as srv:
        backend = make(srv, backoff_base_s=0.01, backoff_max_s=1.0)
        out = backend.generate(["p"])
    assert out[0][0].text == "finally" and out[0][0].error is None
    assert len(srv.requests) == 3
    # the Retry-After of 0.3 s was honoured (the computed first backoff is at most 0.015 s here)
    assert srv.requests[1].received_s - srv.requests[0].received_s >= 0.28
    assert backend.usage.retries == 2 and backend.usage.attempts == 3 and backend.usage.errors == 0


def test_retry_after_is_capped_by_backoff_max():
    with ScriptedOpenAIServer([Reply.error(429, retry_after_s=30), "ok"]) as srv:
        t0 = time.monotonic()
        out = make(srv, backoff_max_s=0.05).generate(["p"])
    assert out[0][0].text == "ok" and time.monotonic() - t0 < 20  # the uncapped Retry-After: 30 s


def test_permanent_failure_gives_error_completion_after_max_retries():
    with ScriptedOpenAIServer(lambda i, body: Reply.error(503)) as srv:
        backend = make(srv, max_retries=2)
        out = backend.generate(["p"], n=1)
    completion = out[0][0]
    assert completion.error is not None and "503" in completion.error and completion.text == ""
    assert len(srv.requests) == 3  # first attempt + 2 retries
    assert backend.usage.to_dict()["errors"] == 1 and backend.usage.attempts == 3


def test_client_errors_are_not_retried():
    with ScriptedOpenAIServer(lambda i, body: Reply.error(400)) as srv:
        backend = make(srv, max_retries=3)
        out = backend.generate(["p"])
    assert len(srv.requests) == 1 and "400" in out[0][0].error


def test_malformed_reply_is_retried():
    with ScriptedOpenAIServer([Reply.malformed(), "good"]) as srv:
        out = make(srv).generate(["p"])
    assert out[0][0].text == "good" and len(srv.requests) == 2


def test_timeout_fires_and_is_retried():
    with ScriptedOpenAIServer([Reply.delayed(3.0), "fast"]) as srv:
        backend = make(srv, timeout_s=0.4)
        t0 = time.monotonic()
        out = backend.generate(["p"])
        elapsed_s = time.monotonic() - t0
    # The timeout's cause, not a wall time a loaded machine stretches: the late reply ("late", at 3 s) was not
    # waited for, the retry answered, and at least the 0.4 s timeout went by first.
    assert out[0][0].text == "fast" and elapsed_s >= 0.35
    assert backend.usage.retries == 1


def test_one_failing_request_does_not_lose_the_batch():
    def script(i, body):
        return Reply.error(400) if body["messages"][0]["content"] == "bad" else "fine"

    with ScriptedOpenAIServer(script) as srv:
        out = make(srv).generate(["ok1", "bad", "ok2"])
    assert [g[0].text for g in out] == ["fine", "", "fine"]
    assert out[1][0].error is not None and out[0][0].error is None


def test_concurrency_limit_is_respected():
    with ScriptedOpenAIServer(lambda i, body: Reply.delayed(0.15, "done")) as srv:
        out = make(srv, concurrency=2).generate([f"p{i}" for i in range(6)])
    assert all(g[0].text == "done" for g in out)
    assert srv.max_in_flight == 2


def test_usage_accounting_sums_over_requests():
    with ScriptedOpenAIServer(["abc", "defgh"]) as srv:
        backend = make(srv, concurrency=1)
        out = backend.generate(["12345", "1234567"])
    # the scripted server reports prompt tokens = prompt chars and completion tokens = reply chars
    assert [g[0].prompt_tokens for g in out] == [5, 7]
    assert sorted(g[0].completion_tokens for g in out) == [3, 5]
    usage = backend.usage.to_dict()
    assert usage["prompt_tokens"] == 12 and usage["completion_tokens"] == 8 and usage["requests"] == 2


def test_generate_works_inside_a_running_event_loop_and_agenerate_directly():
    with ScriptedOpenAIServer(lambda i, body: "hi") as srv:
        backend = make(srv)

        async def caller():
            sync_result = backend.generate(["a"])  # sync wrapper called from inside a loop
            async_result = await backend.agenerate(["b"], n=2)
            return sync_result, async_result

        sync_result, async_result = asyncio.run(caller())
    assert sync_result[0][0].text == "hi" and [c.text for c in async_result[0]] == ["hi", "hi"]


def test_api_key_comes_from_the_named_env_var(monkeypatch):
    monkeypatch.setenv("MY_TEST_KEY", "sk-test-123")
    with ScriptedOpenAIServer(["x"]) as srv:
        make(srv, api_key_env="MY_TEST_KEY").generate(["p"])
    assert srv.requests[0].headers["authorization"] == "Bearer sk-test-123"


def test_parse_retry_after_variants():
    assert parse_retry_after_s({"retry-after": "2"}) == 2.0
    assert parse_retry_after_s({"retry-after-ms": "250"}) == 0.25
    assert parse_retry_after_s({}) is None
    assert parse_retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # a date in the past


def test_spec_without_url_uses_openai_base_url(monkeypatch):
    with ScriptedOpenAIServer(["from env url"]) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        out = OpenAIBackend(LLMConfig(spec="openai:m", max_retries=0)).generate(["p"])
    assert out[0][0].text == "from env url" and srv.requests[0].body["model"] == "m"
