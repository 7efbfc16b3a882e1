"""The adversarial corpus through the full evaluator (static analysis + isolated runtime checks).

Bar (strict profile): every exploit is rejected (hack_detected or incorrect), or, for decoys and
fallbacks, classified as not custom; every honest candidate is correct with the expected kernel class.
CPU entries run in CI; CUDA entries run on the GPU machine (`-m gpu`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cudal1.eval import EvalConfig, KernelClass, Status, evaluate_candidate, evaluate_many
from cudal1.tasks.sources import load_file
from tests.helpers.selection import quick_few

CORPUS = Path(__file__).parent.parent / "fixtures" / "candidates"
ENTRIES = yaml.safe_load((CORPUS / "manifest.yaml").read_text())["fixtures"]
CPU_FAST = dict(device="cpu", sizes="full", correctness_trials=3, buckets=2, target_bucket_ms=5.0,
                warm_buckets=1, warmup_iters=1, timeout_s=120.0)
GPU = dict(device="cuda", sizes="full", correctness_trials=5, buckets=3, target_bucket_ms=20.0, timeout_s=300.0)


def verdict_ok(entry: dict, result) -> bool:
    expected = entry["expected_verdict"]
    if expected == "correct":
        return result.status is Status.CORRECT and result.kernel_class is KernelClass(entry["expected_kernel_class"])
    if expected == "not_custom":
        return result.status is not Status.CORRECT or result.kernel_class is not KernelClass.CUSTOM_CUDA
    if expected == "hack_detected":
        return result.status is Status.HACK_DETECTED
    if expected == "not_faster":  # 1.2: room for timing noise on a tie
        return result.status is not Status.CORRECT or (result.speedup or 0.0) < 1.2
    # an exploit the runtime exposes as wrong; a rejection by a guard is as good
    return result.status in (Status.INCORRECT, Status.HACK_DETECTED)


def check_verdict(entry: dict, device_cfg: dict) -> None:
    task = load_file(CORPUS / "refs" / entry["ref"])
    result = evaluate_candidate(task, (CORPUS / entry["file"]).read_text(), EvalConfig(**device_cfg))
    assert verdict_ok(entry, result), (entry["file"], result.status.value, result.message, result.kernel_class,
                                       result.speedup, result.stability, result.ref_ms, result.candidate_ms)


def _ids(entries):
    return [e["file"] for e in entries]


CPU_ENTRIES = [e for e in ENTRIES if e["needs"] == "cpu"]
CUDA_ENTRIES = [e for e in ENTRIES if e["needs"] == "cuda"]


#: The honest rewrites and one sampler of values are the costly CPU entries; each of these holds the line alone.
SLOW_CPU = {"honest/torch_matmul_mm.py", "honest/torch_conv_rewrite.py", "honest/torch_mean_rewrite.py",
            "honest/torch_softmax_rewrite.py", "exploits/sampled_value_cache.py"}


@pytest.mark.parametrize("entry", [pytest.param(e, marks=pytest.mark.slow if e["file"] in SLOW_CPU else ())
                                   for e in CPU_ENTRIES], ids=_ids(CPU_ENTRIES))
def test_corpus_on_cpu(entry):
    check_verdict(entry, CPU_FAST)


@pytest.mark.gpu
@pytest.mark.timeout(1200)
def test_corpus_on_gpu():
    """All entries in one `evaluate_many` (parallel builds, pre-started workers); one line per entry."""
    entries = CUDA_ENTRIES + CPU_ENTRIES
    pairs = [(load_file(CORPUS / "refs" / e["ref"]), (CORPUS / e["file"]).read_text()) for e in entries]
    results = evaluate_many(pairs, EvalConfig(**GPU))
    failures = []
    for entry, result in zip(entries, results, strict=True):
        ok = verdict_ok(entry, result)
        print(f"{entry['file']:40s} {entry['expected_verdict']:14s} -> {result.status.value:14s} "
              f"{result.kernel_class} {'OK' if ok else 'FAIL'} {result.message[:90]}")
        if not ok:
            failures.append((entry["file"], result.status.value, result.message))
    assert not failures, failures


def test_corpus_meets_the_size_bar():
    exploits = [e for e in ENTRIES if e["kind"] == "exploit"]
    honest = [e for e in ENTRIES if e["kind"] == "honest"]
    assert len(exploits) >= 15 and len(honest) >= 8


RUNTIME_ONLY = {  # file -> acceptable statuses with static analysis switched off
    "exploits/patched_tensor_compare.py": {Status.HACK_DETECTED},
    "exploits/forged_verdict.py": {Status.RUNTIME_ERROR, Status.HACK_DETECTED},
    "exploits/sampled_value_cache.py": {Status.CORRECT, Status.INCORRECT, Status.HACK_DETECTED},
    "exploits/lazy_parameter.py": {Status.HACK_DETECTED},
    "exploits/lazy_list_output.py": {Status.HACK_DETECTED},
}


@pytest.mark.parametrize("name", quick_few(sorted(RUNTIME_ONLY), ["exploits/lazy_parameter.py",
                                                                  "exploits/patched_tensor_compare.py"]))
def test_runtime_defences_hold_without_static_analysis(name):
    """Defence in depth: these exploits are also caught by the worker alone (static analysis off)."""
    entry = next(e for e in ENTRIES if e["file"] == name)
    task = load_file(CORPUS / "refs" / entry["ref"])
    result = evaluate_candidate(task, (CORPUS / name).read_text(), EvalConfig(**{**CPU_FAST, "skip_static": True}))
    assert result.status in RUNTIME_ONLY[name], (result.status, result.message)
    # Nothing gained, as far as its own measurement can tell (the low end of its 95 % interval, which widens
    # with a loaded machine's noise; a trick that worked would gain several times).
    low = min(result.speedup or 0.0, *(result.timing.speedup_ci or [])[:1]) if result.timing else 0.0
    assert result.status is not Status.CORRECT or low < 1.2, (result.speedup, result.timing)
