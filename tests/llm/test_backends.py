"""Spec parsing, config validation, usage stats and the sync runner."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from cudal1.core.errors import ConfigError
from cudal1.llm import BACKENDS, make_backend, parse_spec
from cudal1.llm.backends import BackendSpec, Completion, LLMConfig, UsageStats, run_sync, split_spec
from cudal1.llm.hf_backend import HFBackend
from cudal1.llm.openai_backend import OpenAIBackend


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


def test_unknown_kind_lists_every_form_of_the_table():
    with pytest.raises(ConfigError) as info:
        make_backend("vllm:model")
    for backend_cls in BACKENDS.values():
        assert backend_cls.SPEC_FORM in str(info.value)


def test_config_checks_only_the_generic_form():
    # The table is above backends.py: LLMConfig sees 'KIND:TARGET', parse_spec the rest.
    assert LLMConfig(spec="vllm:model").spec == "vllm:model"
    assert split_spec(" openai : m@http://h/v1 ") == ("openai", "m@http://h/v1")
    for spec in ("gpt-4o", ":m", "openai:", "hf:  "):
        with pytest.raises(ConfigError):
            LLMConfig(spec=spec)


def test_table_kinds_match_their_spec_forms():
    for kind, backend_cls in BACKENDS.items():
        assert backend_cls.SPEC_FORM.startswith(kind + ":")


class _ToyBackend:
    """A backend defined outside the package: its grammar is 'toy:NAME*COPIES'."""

    SPEC_FORM = "toy:NAME*COPIES"

    @classmethod
    def parse_target(cls, spec, target):
        name, star, copies = target.partition("*")
        if not star or not copies.isdigit():
            raise ConfigError(f"bad LLM spec {spec!r}: expected {cls.SPEC_FORM!r}")
        return BackendSpec("toy", name)

    def __init__(self, config, **kwargs):
        self.config, self.kwargs = config, kwargs
        self.model = parse_spec(config.spec).model
        self.copies = int(config.spec.rpartition("*")[2])
        self.usage = UsageStats()

    def generate(self, prompts, n=1, **sampling):
        return [[Completion(text=str(p) * self.copies, model=self.model)] * n for p in prompts]


def test_a_registered_backend_parses_and_builds(monkeypatch):
    monkeypatch.setitem(BACKENDS, "toy", _ToyBackend)
    assert parse_spec("toy:echo*2") == BackendSpec("toy", "echo")
    backend = make_backend("toy:echo*2", extra=1)
    assert isinstance(backend, _ToyBackend) and backend.kwargs == {"extra": 1}
    assert backend.generate(["ab"])[0][0].text == "abab"
    with pytest.raises(ConfigError, match="toy:NAME"):
        make_backend("toy:echo")
    with pytest.raises(ConfigError, match="toy:NAME"):
        make_backend("nope:x")  # the new form is listed among the known ones


def test_bad_specs_fail_before_any_network_or_model_work(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("touched the network or a model")

    monkeypatch.setattr("cudal1.llm.openai_backend._import_openai", forbidden)
    monkeypatch.setattr("cudal1.llm.hf_backend._load", forbidden)
    for spec in ("openai:m@ftp://x", "vllm:m", "openai:m@localhost:8000"):
        with pytest.raises(ConfigError):
            make_backend(spec)
    # Built directly, without the table: each backend still parses its own spec first.
    with pytest.raises(ConfigError, match="openai:MODEL"):
        OpenAIBackend(LLMConfig(spec="hf:/models/tiny"))
    with pytest.raises(ConfigError, match="base URL"):
        OpenAIBackend(LLMConfig(spec="openai:m@ftp://x"), client_factory=forbidden)
    with pytest.raises(ConfigError, match="hf:PATH_OR_ID"):
        HFBackend(LLMConfig(spec="openai:m"))


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
