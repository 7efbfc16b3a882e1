"""Fixtures of the training tests: tiny PyTorch-only tasks, a fast CPU evaluator."""

from __future__ import annotations

import pytest

from tests.train.helpers import FIXTURE_TASKS

pytest.importorskip("trl")
pytest.importorskip("datasets")


@pytest.fixture(scope="session")
def tiny_tasks():
    from cudal1.tasks import load_tasks

    return load_tasks(str(FIXTURE_TASKS))


@pytest.fixture(scope="session")
def fast_eval_config():
    """The real evaluator's protocol, shrunk for CPU tests (one trial, tiny timing)."""
    from cudal1.eval import EvalConfig

    return EvalConfig(device="cpu", correctness_trials=1, buckets=1, target_bucket_ms=2.0, warm_buckets=0,
                      warmup_iters=1, min_iters_per_bucket=1, max_iters_per_bucket=2, timeout_s=120)


@pytest.fixture(scope="session")
def real_evaluator(fast_eval_config):
    from cudal1.eval import evaluate_candidate

    def evaluate(task, source):
        return evaluate_candidate(task, source, fast_eval_config)

    return evaluate
