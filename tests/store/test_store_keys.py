"""Tests of `cudal1.store.keys`: which inputs change the evaluation key and which do not."""

from __future__ import annotations

import enum
from pathlib import Path

import pytest
from _store_workers import ENVIRONMENT, PROTOCOL

from cudal1.store import EVAL_KEY_ENV_FIELDS, environment_key, eval_key, source_hash
from cudal1.store.keys import canonical_json


def test_source_hash_is_sha256():
    assert source_hash("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert source_hash("a") != source_hash("a ")


def test_eval_key_stable_under_dict_order():
    base = eval_key("t", "c", PROTOCOL, ENVIRONMENT)
    assert len(base) == 64
    shuffled_protocol = dict(reversed(list(PROTOCOL.items())))
    assert eval_key("t", "c", shuffled_protocol, dict(reversed(list(ENVIRONMENT.items())))) == base


@pytest.mark.parametrize("field", EVAL_KEY_ENV_FIELDS)
def test_each_key_environment_field_matters(field):
    base = eval_key("t", "c", PROTOCOL, ENVIRONMENT)
    assert eval_key("t", "c", PROTOCOL, {**ENVIRONMENT, field: "changed"}) != base
    assert environment_key({**ENVIRONMENT, field: "changed"}) != environment_key(ENVIRONMENT)


def test_other_environment_fields_do_not_matter():
    base = eval_key("t", "c", PROTOCOL, ENVIRONMENT)
    assert eval_key("t", "c", PROTOCOL, {**ENVIRONMENT, "hostname": "other", "driver": "580"}) == base
    assert environment_key({**ENVIRONMENT, "hostname": "x"}) == environment_key(ENVIRONMENT)


def test_task_candidate_and_protocol_matter():
    base = eval_key("t", "c", PROTOCOL, ENVIRONMENT)
    assert eval_key("t2", "c", PROTOCOL, ENVIRONMENT) != base
    assert eval_key("t", "c2", PROTOCOL, ENVIRONMENT) != base
    assert eval_key("t", "c", {**PROTOCOL, "nested": {"a": 1}}, ENVIRONMENT) != base
    assert eval_key("c", "t", PROTOCOL, ENVIRONMENT) != base  # fields are not interchangeable


def test_canonical_json_converts_common_types():
    class Mode(enum.Enum):
        STRICT = "strict"

    text = canonical_json({"b": Mode.STRICT, "a": Path("/x"), "s": {3, 1}})
    assert text == '{"a":"/x","b":"strict","s":[1,3]}'
    with pytest.raises(TypeError):
        canonical_json({"f": object()})


def test_the_speedup_estimator_is_part_of_the_protocol_and_checked():
    """A speedup pooled over all calls and one from bucket ratios are different results: different keys."""
    from cudal1.core.errors import ConfigError
    from cudal1.eval import EvalConfig

    pooled, buckets = EvalConfig(device="cpu").protocol(), EvalConfig(device="cpu", estimator="buckets").protocol()
    assert pooled["estimator"] == "pooled" and buckets["estimator"] == "buckets"
    assert eval_key("t", "c", pooled, ENVIRONMENT) != eval_key("t", "c", buckets, ENVIRONMENT)
    with pytest.raises(ConfigError, match="estimator"):
        EvalConfig(device="cpu", estimator="mean")
