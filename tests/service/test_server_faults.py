"""The reward server under faults and hostile requests, on loopback (cudal1.service.server): every request
answered, nothing wedged, no client-made reference passing for a built-in task, bounded metrics, deadlines,
cancelled abandoned work, one evaluation for identical submissions. Each case is bounded in count and time."""

from __future__ import annotations

import threading
import time

import _service_fakes as fakes
import httpx
import pytest
from _server_utils import TOKEN, running_server
from _service_fakes import FAST_CONFIG, TINY_REF, fake_evaluate, fake_source

from cudal1.core.errors import ConfigError
from cudal1.service.pool import LocalPool, LocalPoolConfig
from cudal1.service.server import ServerConfig

AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


pytestmark = pytest.mark.usefixtures("fresh_fakes")


@pytest.fixture
def one_slot():
    pool = LocalPool(FAST_CONFIG, LocalPoolConfig(cpu_slots=1, max_queue=8), evaluate_fn=fake_evaluate)
    yield pool
    fakes.GATE.set()
    pool.close()


def _post(url, body, **kw):
    return httpx.post(f"{url}/v1/evaluate", json=body, headers=AUTH, timeout=kw.pop("timeout", 30), **kw)


def _item(**directives) -> dict:
    return {"task_id": "test/add", "source": fake_source(**directives), "reference_source": TINY_REF}


def test_an_unencodable_source_is_a_400_and_the_server_keeps_serving(one_slot):
    """A lone surrogate is valid JSON but not UTF-8: it used to kill the only slot for good."""
    lone = '{"task_id": "test/add", "source": "x = 1  # \\ud800", "reference_source": %s}'
    with running_server(one_slot) as (url, _):
        import json

        body = (lone % json.dumps(TINY_REF)).encode()
        r = httpx.post(f"{url}/v1/evaluate", content=body, headers=AUTH, timeout=30)
        assert r.status_code == 400 and "UTF-8" in r.json()["detail"]
        ref = httpx.post(f"{url}/v1/evaluate", headers=AUTH, timeout=30,
                         content=b'{"task_id": "t", "source": "x", "reference_source": "\\udfff"}')
        assert ref.status_code == 400
        nul = _post(url, {"task_id": "test/add", "source": "x\u0000y", "reference_source": TINY_REF})
        assert nul.status_code == 400 and "NUL" in nul.json()["detail"]
        for _ in range(3):  # still answering, on the same slot
            assert _post(url, _item()).status_code == 200
        health = httpx.get(f"{url}/healthz").json()
        assert health["status"] == "ok" and health["replaced_slots"] == 0


def test_reference_source_is_off_by_default_and_never_takes_a_builtin_id(one_slot):
    with running_server(one_slot, allow_reference_source=False) as (url, _):
        r = _post(url, {"task_id": "builtin/level1/softmax_lastdim", "source": fake_source(),
                        "reference_source": TINY_REF})
        assert r.status_code == 403 and "allow-reference-source" in r.json()["detail"]
    assert ServerConfig().allow_reference_source is False
    with running_server(one_slot, allow_reference_source=True) as (url, _):
        r = _post(url, {"task_id": "builtin/level1/softmax_lastdim", "source": fake_source(),
                        "reference_source": TINY_REF})
        assert r.status_code == 200 and r.json()["task_id"] == "request/builtin/level1/softmax_lastdim"
        again = _post(url, {"task_id": "request/x", "source": fake_source(), "reference_source": TINY_REF})
        assert again.json()["task_id"] == "request/x"  # not request/request/x


def test_metrics_labels_stay_bounded_and_bad_bodies_are_4xx(one_slot):
    with running_server(one_slot) as (url, _):
        with httpx.Client(headers=AUTH, timeout=10) as client:
            for i in range(200):
                client.get(f"{url}/made-up/{i}")
            deep = b"[" * 100_000 + b"]" * 100_000
            assert client.post(f"{url}/v1/evaluate", content=deep).status_code in (400, 413)
            nested = ("[" * 5000 + "]" * 5000).encode()
            assert client.post(f"{url}/v1/evaluate", content=nested).status_code == 400
            text = client.get(f"{url}/metrics").text
    lines = [ln for ln in text.splitlines() if ln.startswith("cudal1_requests_total")]
    assert 'path="other"' in text and not any("made-up" in ln for ln in lines)
    assert len(lines) < 10


def test_a_batch_larger_than_the_queue_is_refused_for_good_not_retried(one_slot):
    with running_server(one_slot, max_queue=4, max_batch_items=64) as (url, _):
        r = httpx.post(f"{url}/v1/evaluate_batch", json={"items": [_item() for _ in range(5)]}, headers=AUTH)
        assert r.status_code == 413 and "at most 4" in r.json()["detail"]


def test_a_request_past_its_deadline_is_a_504_and_its_queued_work_is_dropped(one_slot):
    with running_server(one_slot, request_timeout_s=1.0) as (url, _):
        blocker = threading.Thread(target=_post, args=(url, _item(gate=1)), kwargs={"timeout": 60})
        blocker.start()
        time.sleep(0.5)  # the slot is now held by the gated item
        started = time.monotonic()
        late = _item(marker="late")
        r = _post(url, late)
        # The deadline's answer (the gated slot would have answered 200 when released): no wall time asserted
        assert r.status_code == 504 and "request_timeout_s" in r.json()["detail"] and time.monotonic() > started
        fakes.GATE.set()
        blocker.join(30)
        time.sleep(0.5)
        assert not any("marker=late" in c for c in fakes.CALLS)  # cancelled before it started


def test_a_client_that_gives_up_cancels_its_queued_work(one_slot):
    with running_server(one_slot) as (url, _):
        blocker = threading.Thread(target=_post, args=(url, _item(gate=1)), kwargs={"timeout": 60})
        blocker.start()
        time.sleep(0.5)
        with pytest.raises(httpx.TimeoutException):
            _post(url, _item(marker="abandoned"), timeout=1.0)
        time.sleep(2.5)  # the server notices the disconnect within its poll interval
        fakes.GATE.set()
        blocker.join(30)
        time.sleep(0.5)
        assert not any("marker=abandoned" in c for c in fakes.CALLS)
        assert 'reason="client_gone"' in httpx.get(f"{url}/metrics", headers=AUTH).text


def test_identical_concurrent_submissions_are_evaluated_once(one_slot):
    item = _item(gate=1, speedup=1.7)
    with running_server(one_slot) as (url, _):
        answers = []
        threads = [threading.Thread(target=lambda: answers.append(_post(url, item, timeout=60))) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        fakes.GATE.set()
        for t in threads:
            t.join(60)
        metrics = httpx.get(f"{url}/metrics", headers=AUTH).text
    assert "cudal1_joined_duplicates_total 2" in metrics
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert {a.json()["speedup"] for a in answers} == {1.7}
    assert len(fakes.CALLS) == 1


@pytest.mark.parametrize(("settings", "message"), [
    ({"insecure_no_auth": True, "host": "0.0.0.0"}, "loopback"),
    ({"port": 99999}, "not a TCP port"),
    ({"request_timeout_s": 0}, "request_timeout_s"),
])
def test_unsafe_or_impossible_settings_are_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        ServerConfig(**settings)
    assert ServerConfig(insecure_no_auth=True, host="127.0.0.1").insecure_no_auth
