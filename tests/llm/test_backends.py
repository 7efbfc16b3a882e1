"""Spec parsing, config validation, usage stats and the sync runner."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from cudal1.core.errors import ConfigError
from cudal1.llm import make_backend
from cudal1.llm.backends import BackendSpec, LLMConfig, UsageStats, parse_spec, run_sync


@pytest.mark.parametrize(("spec", "expected"), [
    ("openai:Qwen/Qwen2.5-7B@http://127.0.0.1:8000/v1", BackendSpec("openai", "Qwen/Qwen2.5-7B",
                                                                   "http://127.0.0.1:8000/v1")),
    ("openai:gpt-4o", BackendSpec("openai", "gpt-4o", None)),
    ("openai:m@https://api.example.com/v1/", BackendSpec("openai", "m", "https://api.example.com/v1")),
    ("hf:/models/tiny", BackendSpec("hf", "/models/tiny")),
    ("hf:org/name", BackendSpec("hf", "org/name")),
])
def test_parse_spec(spec, expected):
    assert parse_spec(spec) == expected


@pytest.mark.parametrize("spec", ["vllm:model", "openai:", "openai:m@ftp://x", "openai:m@localhost:8000",
                                  "hf:", "gpt-4o", ""])
def test_bad_specs_raise_config_error(spec):
    with pytest.raises(ConfigError):
        parse_spec(spec) if spec else LLMConfig(spec=spec)


def test_config_validation_and_help_metadata():
    with pytest.raises(ConfigError, match="top_p"):
        LLMConfig(spec="openai:m", top_p=0.0)
    with pytest.raises(ConfigError, match="concurrency"):
        LLMConfig(spec="openai:m", concurrency=0)
    for f in dataclasses.fields(LLMConfig):
        assert f.metadata.get("help"), f"field {f.name} lacks help"
    assert LLMConfig(spec="openai:m").api_key_env == "OPENAI_API_KEY"


def test_make_backend_dispatch_and_unknown_sampling_key():
    pytest.importorskip("openai")
    backend = make_backend("openai:m@http://127.0.0.1:9/v1")
    assert type(backend).__name__ == "OpenAIBackend" and backend.model == "m"
    with pytest.raises(ConfigError, match="unknown sampling"):
        backend.generate(["p"], temprature=0.5)
    with pytest.raises(ConfigError):
        make_backend("nonsense")


def test_usage_stats_record():
    usage = UsageStats()
    usage.record(attempts=3, prompt_tokens=10, completion_tokens=5)
    usage.record(attempts=1, error=True)
    assert usage.to_dict() == {"requests": 2, "attempts": 4, "retries": 2, "errors": 1, "prompt_tokens": 10,
                               "completion_tokens": 5, "total_tokens": 15}


def test_run_sync_outside_and_inside_a_loop():
    async def value():
        await asyncio.sleep(0)
        return 42

    assert run_sync(value) == 42

    async def inside():
        return run_sync(value)

    assert asyncio.run(inside()) == 42
