"""`optimize` on two built-in tasks with a scripted server whose completions are real raw-CUDA kernels.

Round 1 answers with a kernel that does not compile, an off-by-one one and a correct but slow one (one
thread per row); round 2 with the fast fused one, the slow one again and the off-by-one one again. The loop
must end with the fast kernel verified as the best, faster than eager and than the slow kernel.
"""

from __future__ import annotations

import pytest

from cudal1.core.types import Status
from cudal1.eval.config import EvalConfig
from cudal1.llm import LLMConfig
from cudal1.loops.optimize import OptimizeConfig, optimize
from cudal1.tasks import find_task
from tests.helpers.scripted_server import ScriptedOpenAIServer
from tests.loops._scripted import GPU_DIR, answer, code

pytestmark = pytest.mark.gpu

GPU_EVAL = EvalConfig(device="cuda", sizes="full", correctness_trials=2, buckets=3, target_bucket_ms=20,
                      warm_buckets=0)


@pytest.mark.parametrize("name", ["swish_beta", "softmax_manual_lastdim"])
def test_optimize_ends_with_the_fast_kernel_verified(name, tmp_path, store):
    task = find_task(f"builtin/level1/{name}")
    raw = GPU_DIR / "raw_cuda"
    rounds = [[answer(f"{name}__compile_error", raw), answer(f"{name}__incorrect", raw), answer(f"{name}__slow", raw)],
              [answer(f"{name}__fast", raw), answer(f"{name}__slow", raw), answer(f"{name}__incorrect", raw)]]

    def script(index, body):
        return rounds[min(index // 3, 1)][index % 3]

    with ScriptedOpenAIServer(script) as server:
        config = OptimizeConfig(llm=LLMConfig(spec=f"openai:scripted@{server.base_url}", max_retries=0),
                                rounds=2, samples=3, eval=GPU_EVAL, out=str(tmp_path / f"{name}_best.py"),
                                baselines="none", seed_from_store=False, exemplar_db=str(tmp_path / "ex.sqlite"))
        result = optimize(task, config, store=store)

    first, second = result.history
    assert first.statuses == {"compile_error": 1, "incorrect": 1, "correct": 1}, first
    assert second.statuses == {"correct": 2, "incorrect": 1}, second
    slow_speedup = first.best_speedup
    assert result.best_result.status is Status.CORRECT
    assert result.best_source == code(f"{name}__fast", raw)
    assert result.best_speedup > 1.0 and result.best_speedup > 1.5 * slow_speedup
    assert result.best_result.kernel_class.value == "custom_cuda"
    assert "# verdict: correct" in result.out_path.read_text()


def test_cli_optimize_on_a_builtin_task(tmp_path, shared_store_path):
    """The same through `cudal1 optimize` (the store makes repeated kernels cache hits)."""
    import json

    from typer.testing import CliRunner

    from cudal1.cli.main import app

    raw = GPU_DIR / "raw_cuda"
    script = [answer("swish_beta__incorrect", raw), answer("swish_beta__fast", raw)]
    with ScriptedOpenAIServer(script) as server:
        argv = ["optimize", "builtin/level1/swish_beta", "--llm", f"openai:m@{server.base_url}", "--rounds", "1",
                "--samples", "2", "--device", "cuda", "--sizes", "full", "--trials", "2", "--buckets", "3",
                "--eval-set", "target_bucket_ms=20", "--eval-set", "warm_buckets=0", "--store", str(shared_store_path),
                "--out", str(tmp_path / "swish_best.py"), "--max-retries", "0", "--json"]
        outcome = CliRunner().invoke(app, argv)
    assert outcome.exit_code == 0, outcome.output
    summary = json.loads(outcome.output.strip().splitlines()[-1])
    assert summary["best_result"]["status"] == "correct" and summary["best_speedup"] > 1.0
    assert (tmp_path / "swish_best.py").read_text().endswith(code("swish_beta__fast", raw))
    header = (tmp_path / "swish_best.py").read_text()
    assert any(f"# speedup vs {kind}:" in header for kind in ("torch_compile", "cuda_graph"))  # baselines auto
