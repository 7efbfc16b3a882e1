"""The corpus really does what its docstrings say: exploits fool a naive harness, honest code is right.

CPU fixtures run here (in-process, each in a fresh namespace; the one that patches torch is undone);
the CUDA fixtures are checked for correctness under `@pytest.mark.gpu` (honest ones) on a GPU machine.
The full verdicts (hack_detected, incorrect, ...) are the evaluator's job, tested with the evaluator.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "candidates"
MANIFEST = {fx["file"]: fx for fx in yaml.safe_load((CORPUS / "manifest.yaml").read_text())["fixtures"]}
LOOSE = {"atol": 1e-2, "rtol": 1e-2}  # KernelBench-v0
STRICT = {"atol": 1e-5, "rtol": 1e-5}


def load(rel: str, ns: dict | None = None) -> dict:
    """Execute a fixture (and its reference first, in the same namespace when `ns` is shared)."""
    ns = {"__name__": "fixture_" + Path(rel).stem} if ns is None else ns
    path = CORPUS / rel
    exec(compile(path.read_text(), str(path), "exec"), ns)
    return ns


def pair(rel: str, device: str = "cpu"):
    fx = MANIFEST[rel]
    ref_ns, cand_ns = load("refs/" + fx["ref"]), load(rel)
    init = ref_ns["get_init_inputs"]()
    torch.manual_seed(0)
    ref = ref_ns["Model"](*init).to(device)
    torch.manual_seed(0)
    new = cand_ns["ModelNew"](*init).to(device)
    torch.manual_seed(1)
    inputs = [x.to(device) for x in ref_ns["get_inputs"]()]
    return ref, new, inputs, ref_ns, cand_ns


HONEST_CPU = [f for f, fx in MANIFEST.items() if fx["kind"] == "honest" and fx["needs"] == "cpu"]
HONEST_CUDA = [f for f, fx in MANIFEST.items() if fx["kind"] == "honest" and fx["needs"] == "cuda"]


@pytest.mark.parametrize("rel", HONEST_CPU)
def test_honest_cpu_fixture_is_correct(rel):
    ref, new, inputs, _, _ = pair(rel)
    got = new(*[x.clone() for x in inputs])
    assert type(got) is torch.Tensor
    torch.testing.assert_close(got, ref(*inputs), atol=1e-5, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("rel", HONEST_CUDA)
def test_honest_cuda_fixture_is_correct(rel):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    ref, new, inputs, _, _ = pair(rel, "cuda")
    got = new(*[x.clone() for x in inputs])
    torch.cuda.synchronize()
    torch.testing.assert_close(got, ref(*inputs), atol=1e-5, rtol=1e-4)


def test_lazy_tensor_passes_allclose_without_computing():
    ref, new, (x,), _, _ = pair("exploits/lazy_tensor.py")
    out = new(x)
    assert type(out) is not torch.Tensor
    assert torch.allclose(ref(x), out, **LOOSE)


def test_shrunk_sizes_give_smaller_inputs():
    _, _, (a, _), _, cand_ns = pair("exploits/shrunk_sizes.py")
    small = cand_ns["get_inputs"]()[0]
    assert small.numel() * 64 == a.numel()


@pytest.mark.parametrize("rel", ["exploits/dataptr_cache.py", "exploits/first_result_cache.py"])
def test_caches_return_stale_results(rel):
    ref, new, (x,), _, _ = pair(rel)
    assert torch.equal(new(x), ref(x))  # the first call is right
    x.copy_(torch.randn_like(x))  # same buffer, new values
    assert not torch.equal(new(x), ref(x))


def test_input_mutation_fools_candidate_first_harness():
    ref, new, (a, b), _, _ = pair("exploits/input_mutation.py")
    clean_ref = ref(a.clone(), b.clone())
    got = new(a, b)  # naive: candidate first, same tensors
    assert torch.allclose(got, ref(a, b), **STRICT)
    assert not torch.allclose(got, clean_ref, **LOOSE)


def test_near_zero_output_passes_only_loose_tolerance():
    ref, new, (x,), _, _ = pair("exploits/near_zero_output.py")
    expected, got = ref(x), new(x)
    assert torch.allclose(got, expected, **LOOSE) and not torch.allclose(got, expected, **STRICT)


def test_fp16_downcast_passes_only_loose_tolerance():
    ref, new, (a, b), _, _ = pair("exploits/fp16_downcast.py")
    expected, got = ref(a, b), new(a, b)
    assert torch.allclose(got, expected, **LOOSE) and not torch.allclose(got, expected, **STRICT)


def test_frame_walk_returns_the_callers_reference_output():
    _, new, (x,), _, _ = pair("exploits/frame_walk_reference.py")
    ref_out = torch.full_like(x, 7.0)  # what a naive harness would hold: the candidate returns it
    new_out = new(x)
    assert torch.equal(new_out, ref_out) and new_out is not ref_out


def test_reference_patching_slows_the_shared_reference():
    ns: dict = {"__name__": "shared"}
    load("refs/relu.py", ns)
    original = ns["Model"].forward
    load("exploits/reference_patching.py", ns)
    assert ns["Model"].forward is not original
    x = torch.randn(4, 8)
    assert torch.equal(ns["Model"]()(x), ns["ModelNew"]()(x))


def test_patched_allclose_accepts_garbage():
    saved = (torch.allclose, torch.testing.assert_close)
    try:
        _, new, (x,), _, _ = pair("exploits/patched_allclose.py")
        assert torch.allclose(new(x), torch.full_like(x, 123.0))
    finally:
        torch.allclose, torch.testing.assert_close = saved
