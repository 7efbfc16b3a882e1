"""GPU check of the built-in example candidates at FULL task sizes (the only place they are validated).

For every example in src/cudal1/tasks/builtin/examples: build the reference Model and the candidate ModelNew
under the same seed, run both on 2 fresh input sets, require allclose(atol=rtol=1e-4), and print one line with
eager and candidate times (CUDA events, median of 20 after 3 warm-ups; informative, not asserted). CUDA
candidates compile through load_inline at import (about a minute each, cached in TORCH_EXTENSIONS_DIR).
Run with: PYTHONPATH=src python -m pytest tests/tasks/test_builtin_suite_gpu.py -m gpu -s
"""

from __future__ import annotations

import gc
import importlib.util
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from cudal1.tasks.builtin import BUILTIN_DIR

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,  # builds every extension one after another; tests/eval/test_examples_gpu.py is the fast path
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

EXAMPLE_FILES = sorted((BUILTIN_DIR / "examples").glob("*.py"))
TOL = 1e-4
WARMUP = 3
REPS = 20
TRIAL_SEEDS = (1234, 5678)


def _set_arch_list() -> None:
    """Compile only for the GPU at hand (load_inline otherwise builds for every arch torch knows)."""
    major, minor = torch.cuda.get_device_capability()
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"


def _load_reference(example: Path) -> dict[str, Any]:
    task_name = example.stem.removesuffix("__torch")
    matches = sorted(BUILTIN_DIR.glob(f"level[123]/{task_name}.py"))
    assert len(matches) == 1, f"no unique task for {example.name}"
    ns: dict[str, Any] = {"__name__": f"cudal1_gpu_ref_{task_name}", "__file__": str(matches[0])}
    exec(compile(matches[0].read_text(), str(matches[0]), "exec"), ns)
    return ns


def _load_candidate(example: Path) -> Any:
    name = f"cudal1_gpu_cand_{example.stem}"
    spec = importlib.util.spec_from_file_location(name, example)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _as_tuple(out: Any) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _time_ms(fn: Callable[[], Any]) -> float:
    """Median of REPS CUDA-event timings after WARMUP calls; the device is synchronized around each one."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    times_ms = []
    for _ in range(REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times_ms.append(start.elapsed_time(end))
    return statistics.median(times_ms)


def _free() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_example_correct_and_timed_at_full_size(example: Path):
    _set_arch_list()
    device = torch.device("cuda")
    ref_ns = _load_reference(example)
    cand = _load_candidate(example)
    init_inputs = ref_ns["get_init_inputs"]()
    try:
        torch.manual_seed(0)
        ref_model = ref_ns["Model"](*init_inputs).to(device)
        torch.manual_seed(0)
        new_model = cand.ModelNew(*init_inputs).to(device)
        inputs: list[torch.Tensor] = []
        with torch.no_grad():
            for seed in TRIAL_SEEDS:
                torch.manual_seed(seed)
                with torch.device(device):
                    inputs = ref_ns["get_inputs"]()
                # Candidate first, so it cannot find the reference's result in freed memory.
                got = _as_tuple(new_model(*[t.clone() for t in inputs]))
                torch.cuda.synchronize()
                expected = _as_tuple(ref_model(*[t.clone() for t in inputs]))
                assert len(got) == len(expected)
                for g, e in zip(got, expected, strict=True):
                    assert type(g) is torch.Tensor and g.shape == e.shape and g.dtype == e.dtype
                    assert g.device == e.device
                    torch.testing.assert_close(g, e, atol=TOL, rtol=TOL)
                del got, expected
            eager_ms = _time_ms(lambda: ref_model(*inputs))
            cand_ms = _time_ms(lambda: new_model(*inputs))
        print(f"\n{example.stem:40s} eager {eager_ms:8.3f} ms  candidate {cand_ms:8.3f} ms  "
              f"speedup {eager_ms / cand_ms:5.2f}x")
    finally:
        ref_model = new_model = inputs = None  # noqa: F841 (drop references before freeing)
        _free()
