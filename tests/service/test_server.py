"""The reward server on loopback: load from a second process, auth, size limits, back-pressure, killed
workers (cudal1.service.server)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time

import _service_fakes as fakes
import httpx
import pytest
from _server_utils import TOKEN, running_server
from _service_fakes import FAST_CONFIG, TINY_CANDIDATE, TINY_REF, fake_evaluate, fake_source

from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Status
from cudal1.service.pool import LocalPool, LocalPoolConfig
from cudal1.service.server import ServerConfig

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def fake_server():
    fakes.reset_counters()
    fakes.GATE.clear()
    pool = LocalPool(FAST_CONFIG, LocalPoolConfig(cpu_slots=4, max_queue=8), evaluate_fn=fake_evaluate)
    with running_server(pool, max_queue=64, max_body_bytes=64 * 1024) as (url, app):
        yield url
    fakes.GATE.set()
    pool.close()


def _item(**directives) -> dict:
    return {"task_id": "test/add", "source": fake_source(**directives), "reference_source": TINY_REF}


def test_concurrent_load_from_a_second_process_is_all_answered(fake_server, tmp_path):
    out = tmp_path / "load.json"
    proc = multiprocessing.get_context("spawn").Process(
        target=fakes.load_generator, args=(fake_server, TOKEN, 40, str(out)))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    answers = json.loads(out.read_text())
    assert len(answers) == 40 and all(code == 200 for code, _, _ in answers)
    for _, source, body in answers:  # every answer is the result of the request's own candidate
        result = EvalResult.from_dict(body)
        assert result.status is Status.CORRECT
        assert result.speedup == float(fakes.parse_directives(source)["speedup"])
    metrics = httpx.get(f"{fake_server}/metrics", headers=AUTH).text
    assert 'cudal1_evaluations_total{status="correct"} 40' in metrics
    assert 'cudal1_requests_total{path="/v1/evaluate",code="200"} 40' in metrics
    assert "cudal1_evaluation_seconds_count 40" in metrics and "cudal1_queue_depth 0" in metrics


def test_bad_or_missing_token_is_401(fake_server):
    body = _item()
    assert httpx.post(f"{fake_server}/v1/evaluate", json=body).status_code == 401
    wrong = httpx.post(f"{fake_server}/v1/evaluate", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{fake_server}/metrics").status_code == 401
    assert httpx.get(f"{fake_server}/healthz").json()["status"] == "ok"  # health is open
    assert fakes.CALLS == []


def test_oversize_body_is_413_by_header_and_by_counting(fake_server):
    big = {"task_id": "test/add", "source": "x" * 100_000}
    r = httpx.post(f"{fake_server}/v1/evaluate", json=big, headers=AUTH)
    assert r.status_code == 413

    def chunks():  # no Content-Length: the server must count while reading
        for _ in range(20):
            yield b"y" * 8192

    r = httpx.post(f"{fake_server}/v1/evaluate", content=chunks(), headers=AUTH)
    assert r.status_code == 413
    assert fakes.CALLS == []


def test_full_queue_is_429_with_retry_after():
    fakes.reset_counters()
    fakes.GATE.clear()
    pool = LocalPool(FAST_CONFIG, LocalPoolConfig(cpu_slots=2), evaluate_fn=fake_evaluate)
    with running_server(pool, max_queue=2, retry_after_s=7) as (url, _):
        codes = []
        threads = [threading.Thread(target=lambda: codes.append(
            httpx.post(f"{url}/v1/evaluate", json=_item(gate=1), headers=AUTH, timeout=60).status_code))
            for _ in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while httpx.get(f"{url}/healthz").json()["admitted"] < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        r = httpx.post(f"{url}/v1/evaluate", json=_item(), headers=AUTH)
        assert r.status_code == 429 and r.headers["retry-after"] == "7"
        batch = httpx.post(f"{url}/v1/evaluate_batch", json={"items": [_item()]}, headers=AUTH)
        assert batch.status_code == 429
        fakes.GATE.set()
        for t in threads:
            t.join(30)
        assert codes == [200, 200]
    pool.close()


def test_batch_and_request_errors(fake_server):
    items = [_item(speedup=2), _item(status="incorrect")]
    r = httpx.post(f"{fake_server}/v1/evaluate_batch", json={"items": items}, headers=AUTH)
    assert r.status_code == 200
    assert [d["status"] for d in r.json()["results"]] == ["correct", "incorrect"]
    unknown = httpx.post(f"{fake_server}/v1/evaluate", json={"task_id": "nope/none", "source": "x"}, headers=AUTH)
    assert unknown.status_code == 404
    builtin = httpx.post(f"{fake_server}/v1/evaluate", headers=AUTH, json={
        "task_id": "builtin/level1/softmax_lastdim", "source": fake_source()})
    assert builtin.status_code == 200 and builtin.json()["task_id"] == "builtin/level1/softmax_lastdim"
    assert httpx.post(f"{fake_server}/v1/evaluate", json={"source": "x"}, headers=AUTH).status_code == 422
    assert httpx.post(f"{fake_server}/v1/evaluate", content=b"{not json", headers=AUTH).status_code == 400
    bad_ref = dict(_item(), reference_source="def broken(:")
    assert httpx.post(f"{fake_server}/v1/evaluate", json=bad_ref, headers=AUTH).status_code == 400
    empty = httpx.post(f"{fake_server}/v1/evaluate_batch", json={"items": []}, headers=AUTH)
    assert empty.status_code == 422


def test_a_source_over_the_size_limit_is_413_before_any_work_and_every_answer_keeps_its_schema():
    """It was a 200 with runtime_error (the runner channel refused the message), a penalty charged to the
    candidate; the CLI refused it as a bug. One limit, the CLI's and the loaders': 413 naming it. Every answer
    body conforms to cudal1/schemas/server_answers.schema.json."""
    from cudal1.core.schemas import schema_problems
    from cudal1.tasks.task import MAX_SOURCE_BYTES

    fakes.reset_counters()
    pool = LocalPool(FAST_CONFIG, LocalPoolConfig(cpu_slots=1, max_queue=8), evaluate_fn=fake_evaluate)
    answers = []
    with running_server(pool, max_body_bytes=8 * 2**20) as (url, _):
        def post(path, body):
            r = httpx.post(f"{url}{path}", json=body, headers=AUTH, timeout=60)
            answers.append((r.status_code, path, r.json()))
            return r

        over = "#" * (MAX_SOURCE_BYTES + 1)
        for body in (dict(_item(), source=over), dict(_item(), reference_source=TINY_REF + over)):
            r = post("/v1/evaluate", body)
            assert r.status_code == 413 and "over the limit of 524288 bytes" in r.json()["detail"], r.json()
        assert post("/v1/evaluate_batch", {"items": [_item(), dict(_item(), source=over)]}).status_code == 413
        assert fakes.CALLS == []  # nothing was evaluated
        assert post("/v1/evaluate", _item(speedup=2)).status_code == 200
        assert post("/v1/evaluate_batch", {"items": [_item(), _item(status="incorrect")]}).status_code == 200
        for bad in ({"source": "x"}, {"task_id": "nope/none", "source": "x"}, {"items": []}):
            assert post("/v1/evaluate" if "items" not in bad else "/v1/evaluate_batch", bad).status_code >= 400
        health = httpx.get(f"{url}/healthz", timeout=10)
        answers.append((health.status_code, "/healthz", health.json()))
    pool.close()
    for code, path, body in answers:
        kind = "refusal" if code >= 400 else {"/v1/evaluate": "evaluate", "/v1/evaluate_batch": "batch",
                                              "/healthz": "health"}[path]
        assert schema_problems("server_answers", body, definition=kind) == [], (code, path, body)
        assert schema_problems("server_answers", body) == []
    assert schema_problems("server_answers", {"detail": 3}, definition="refusal") != []


def test_token_is_required_unless_explicitly_insecure(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDAL1_SERVER_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="token"):
        ServerConfig().resolve_token()
    assert ServerConfig(insecure_no_auth=True).resolve_token() is None
    (tmp_path / "tok").write_text("from-file\n")
    assert ServerConfig(token_file=str(tmp_path / "tok")).resolve_token() == "from-file"
    monkeypatch.setenv("CUDAL1_SERVER_TOKEN", "from-env")
    assert ServerConfig().resolve_token() == "from-env"
    assert ServerConfig().host == "127.0.0.1"


def _child_evaluating(marker: str, timeout_s: float = 90.0) -> int | None:
    """Pid of a candidate's runner whose working directory holds the file `marker`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmd = open(f"/proc/{entry}/cmdline", "rb").read()
                if b"cudal1.eval.inside.runner" in cmd and os.path.exists(f"/proc/{entry}/cwd/{marker}"):
                    return int(entry)
            except OSError:
                continue
        time.sleep(0.1)
    return None


def test_no_result_is_lost_when_workers_are_killed(tmp_path):
    """Real evaluations: one candidate SIGKILLs itself, one candidate's runner is killed once from outside while
    it runs, one is honest. The server answers all three: the self-killer is a runtime_error (killed at the
    same step twice), the one killed from outside is evaluated again on fresh runners and is correct."""
    suicide = TINY_CANDIDATE.replace(
        "return a + b", "import os, signal\n        os.kill(os.getpid(), signal.SIGKILL)\n        return a + b")
    victim = TINY_CANDIDATE.replace(
        "return a + b", "import os, time\n        if not os.path.exists('VICTIM-MARK'):\n"
        "            open('VICTIM-MARK', 'w').close()\n            time.sleep(3)\n        return a + b")
    pool = LocalPool(FAST_CONFIG, LocalPoolConfig(cpu_slots=3))
    answers: dict[str, httpx.Response] = {}
    with running_server(pool) as (url, _):
        def send(name, source):
            answers[name] = httpx.post(f"{url}/v1/evaluate", headers=AUTH, timeout=180, json={
                "task_id": "test/add", "source": source, "reference_source": TINY_REF})

        threads = [threading.Thread(target=send, args=a) for a in
                   (("suicide", suicide), ("victim", victim), ("honest", TINY_CANDIDATE))]
        for t in threads:
            t.start()
        pid = _child_evaluating("VICTIM-MARK")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # once: the retry's runner is a new one
        for t in threads:
            t.join(180)
    pool.close()
    results = {k: EvalResult.from_dict(r.json()) for k, r in answers.items() if r.status_code == 200}
    assert set(results) == {"suicide", "victim", "honest"}
    assert results["suicide"].status is Status.RUNTIME_ERROR and "killed" in results["suicide"].message
    assert results["victim"].status is Status.CORRECT, results["victim"].message
    assert results["honest"].status is Status.CORRECT
