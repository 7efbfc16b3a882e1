"""Helpers of the scale-out tests: a tiny task, fast settings, a scripted evaluator and a load generator.

`fake_evaluate` reads directives from a `# fake: key=value ...` line of the candidate source:
`sleep=S` (seconds), `speedup=X`, `status=NAME`, `die=1` (SIGKILL its own process: only inside Ray actors),
`gate=1` (wait for `GATE` to be set: only in-process pools). Sources without the line are evaluated for
real by `evaluate_candidate`.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid

from cudal1.core.types import EvalResult, Status, TimingStats
from cudal1.eval.config import EvalConfig
from cudal1.tasks.task import Task

TINY_REF = '''"""Tiny elementwise sum."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


batch_size = 4
dim = 64


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''

TINY_CANDIDATE = TINY_REF.replace("class Model(", "class ModelNew(")

FAST_CONFIG = EvalConfig(device="cpu", sizes="full", buckets=2, target_bucket_ms=5, warm_buckets=0,
                         correctness_trials=2, timeout_s=120, build_timeout_s=60)

GATE = threading.Event()
CALLS: list[str] = []
_ACTIVE = [0, 0]  # (now, max) concurrent calls in this process
_LOCK = threading.Lock()


def tiny_task(task_id: str = "test/add") -> Task:
    return Task(id=task_id, source=TINY_REF, origin="tests")


def fake_source(**directives: object) -> str:
    """A candidate source for `fake_evaluate`, unique per call (so no two share a cache key)."""
    line = " ".join(f"{k}={v}" for k, v in {"fake": 1, **directives}.items())
    return f"# fake: {line}\n# nonce {uuid.uuid4().hex}\nclass ModelNew:\n    pass\n"


def parse_directives(source: str) -> dict[str, str]:
    for line in source.splitlines():
        if line.startswith("# fake:"):
            return dict(part.split("=", 1) for part in line[len("# fake:"):].split())
    return {}


def max_concurrency() -> int:
    return _ACTIVE[1]


def reset_counters() -> None:
    with _LOCK:
        _ACTIVE[0] = _ACTIVE[1] = 0
        CALLS.clear()


def fake_evaluate(task: Task, source: str, config: EvalConfig) -> EvalResult:
    """Scripted evaluator (see the module docstring)."""
    d = parse_directives(source)
    if not d:
        from cudal1.service.pool import default_evaluate

        return default_evaluate(task, source, config)
    with _LOCK:
        CALLS.append(source)
        _ACTIVE[0] += 1
        _ACTIVE[1] = max(_ACTIVE[0], _ACTIVE[1])
    try:
        if d.get("die"):
            os.kill(os.getpid(), signal.SIGKILL)
        if d.get("gate"):
            GATE.wait(30)
        time.sleep(float(d.get("sleep", 0)))
        status = Status(d.get("status", "correct"))
        speedup = float(d.get("speedup", 1.5)) if status is Status.CORRECT else None
        timing = TimingStats(ref_ms=1.0, candidate_ms=1.0 / speedup, speedup=speedup, stability=0.0,
                             bucket_speedups=[speedup]) if speedup else None
        return EvalResult(status=status, speedup=speedup, timing=timing,
                          message=f"pid {os.getpid()} cvd {os.environ.get('CUDA_VISIBLE_DEVICES')}")
    finally:
        with _LOCK:
            _ACTIVE[0] -= 1


def load_generator(url: str, token: str, n: int, out_path: str) -> None:
    """Send `n` concurrent evaluate requests (fake sources) and write [(status, sent source, body)] as JSON."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    def one(i: int) -> tuple[int, str, dict]:
        source = fake_source(sleep=0.05, speedup=1.0 + i / 10)
        with httpx.Client(timeout=120) as client:
            r = client.post(f"{url}/v1/evaluate", json={"task_id": "test/add", "source": source,
                                                         "reference_source": TINY_REF},
                            headers={"Authorization": f"Bearer {token}"})
        return r.status_code, source, r.json()

    with ThreadPoolExecutor(max_workers=n) as ex:
        out = list(ex.map(one, range(n)))
    with open(out_path, "w") as f:
        json.dump(out, f)
