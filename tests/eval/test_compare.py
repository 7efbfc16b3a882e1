"""Output comparison (cudal1.eval.shared.compare, CPU): tolerances per profile, the small-reference rule, NaN/Inf, and what a mismatch says."""

from __future__ import annotations

import pytest
import torch

from cudal1.eval.config import PROFILES
from cudal1.eval.shared.compare import OutputHackError, compare_outputs

STRICT, LOOSE = PROFILES["strict"].tolerances, PROFILES["loose"].tolerances


def test_within_atol_plus_rtol_passes_and_beyond_fails_with_where_and_how_much():
    ref = torch.ones(4, 8)
    assert compare_outputs(ref, ref + 1.5e-4, STRICT, trial=0).ok  # 1e-4 + 1e-4 * 1
    new = ref.clone()
    new[2, 5] += 1e-3
    result = compare_outputs(ref, new, STRICT, trial=3)
    assert not result.ok
    m = result.mismatch
    assert (m.bad_elements, m.total_elements, m.first_bad_index, m.trial) == (1, 32, [2, 5], 3)
    assert m.max_abs_error == pytest.approx(1e-3, rel=1e-3) and (m.atol, m.rtol, m.scale) == (1e-4, 1e-4, None)
    assert result.message.startswith("output 0 (trial 3): 1/32 elements off")
    assert result.message.endswith("(allowed: 0.0001 + 0.0001 x |expected|)")
    assert compare_outputs(ref, new, LOOSE, trial=0).ok  # KernelBench's published 1e-2


def test_a_zero_answer_to_a_tiny_reference_fails_and_the_message_says_why():
    # Every value is below atol: on atol alone zeros would pass; relative to the reference's scale they fail.
    ref = torch.linspace(-5e-5, 5e-5, 64)
    result = compare_outputs(ref, torch.zeros_like(ref), STRICT, trial=0)
    assert not result.ok and result.mismatch.scale == pytest.approx(5e-5)
    assert result.mismatch.atol == pytest.approx(5e-9)
    assert "the reference's largest magnitude, 5e-05, is below 10x the profile's atol" in result.message
    assert compare_outputs(ref, ref * (1 + 1e-6), STRICT, trial=0).ok  # a faithful answer still passes


def test_nan_and_inf_must_sit_where_the_reference_has_them():
    ref = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    assert compare_outputs(ref, ref.clone(), STRICT, trial=0).ok
    for bad in ([1.0, 0.0, float("inf"), -float("inf")], [1.0, float("nan"), float("inf"), float("inf")]):
        assert not compare_outputs(ref, torch.tensor(bad), STRICT, trial=0).ok
    nan_where_a_number = compare_outputs(torch.ones(3), torch.tensor([1.0, float("nan"), 1.0]), STRICT, trial=0)
    assert "1/3 elements off, max abs err nan" in nan_where_a_number.message  # never "max abs err 0"
    assert "got nan" in nan_where_a_number.message


def test_integers_compare_exactly_and_structure_shape_dtype_must_match():
    ref = torch.arange(6)
    off = compare_outputs(ref, ref + torch.tensor([0, 0, 0, 0, 0, 1]), STRICT, trial=0)
    assert not off.ok and off.mismatch.atol is None and "allowed" not in off.message
    assert "dtype" in compare_outputs(ref, ref.float(), STRICT, trial=0).message
    assert "shape" in compare_outputs(ref, ref.view(2, 3), STRICT, trial=0).message
    assert "returned 1 outputs" in compare_outputs((ref, ref), ref, STRICT, trial=0).message


def test_a_tensor_subclass_output_is_a_hack():
    class Lazy(torch.Tensor):
        pass

    with pytest.raises(OutputHackError):
        compare_outputs(torch.ones(2), torch.ones(2).as_subclass(Lazy), STRICT, trial=0)


def test_a_stored_mismatch_reads_back_across_versions():
    from cudal1.core.types import Mismatch

    old = {"output_index": 0, "trial": 1, "max_abs_error": 0.5, "max_rel_error": 0.1, "bad_elements": 2,
           "total_elements": 8, "first_bad_index": [3], "expected": 1.0, "got": 1.5}
    assert Mismatch.from_dict(old).atol is None  # written before tolerances were recorded
    newer = Mismatch.from_dict({**old, "atol": 1e-4, "rtol": 1e-4, "a_later_field": True})
    assert newer.describe().endswith("(allowed: 0.0001 + 0.0001 x |expected|)")


def _cases() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(5, 37, generator=g)
    far = ref.clone()
    far[4, 30] += 0.5  # the largest error, in the last chunk
    far[0, 1] += 0.01
    nan = ref.clone()
    nan[3, 3] = float("nan")
    inf_ref = ref.clone()
    inf_ref[1, 2] = float("inf")
    tiny = torch.rand(70, generator=g) * 1e-8
    ints = torch.arange(100, dtype=torch.int64)
    ints_bad = ints.clone()
    ints_bad[77] = -5
    cplx = torch.randn(40, dtype=torch.complex64, generator=g)
    half = ref.half()
    return [(ref, ref + 1e-5), (ref, far), (ref, nan), (inf_ref, ref), (inf_ref, inf_ref.clone()), (tiny, 0 * tiny),
            (ints, ints_bad), (ints, ints.clone()), (cplx, cplx * (1 + 1e-3)), (half, half + 0.1),
            (torch.tensor(2.0), torch.tensor(2.5)), (torch.empty(0), torch.empty(0))]


def test_a_comparison_in_chunks_finds_what_one_pass_finds(monkeypatch):
    """Outputs are compared a bounded number of elements at a time; the verdict and every figure of a
    mismatch (count, worst place, worst values, largest errors) do not depend on the chunk size."""
    import cudal1.eval.shared.compare as correctness

    def run() -> list:
        out = []
        for ref, new in _cases():
            r = compare_outputs(ref, new, STRICT, trial=1)
            out.append((r.ok, r.message, repr(r.mismatch)))  # repr: NaN figures compare equal
        return out

    whole = run()
    assert [ok for ok, _, _ in whole] == [True, False, False, False, True, False, False, True, False, False, False,
                                          True]
    assert "at (4, 30)" in whole[1][1] and "2/185 elements off" in whole[1][1], whole[1][1]
    for size in (1, 7, 64):
        monkeypatch.setattr(correctness, "CHUNK_ELEMENTS", size)
        assert run() == whole, size


def test_relative_error_in_chunks_matches_one_pass(monkeypatch):
    import cudal1.eval.shared.compare as correctness

    ref = torch.randn(1000, dtype=torch.float64)
    new = (ref + 1e-4 * torch.randn(1000, dtype=torch.float64)).float()
    new[10] = float("nan")  # left out of both norms
    whole = correctness.relative_error(ref, new)
    monkeypatch.setattr(correctness, "CHUNK_ELEMENTS", 33)
    assert correctness.relative_error(ref, new) == pytest.approx(whole, rel=1e-12)
    finite = torch.isfinite(new)
    expected = float(torch.linalg.vector_norm((ref - new.double())[finite]) / torch.linalg.vector_norm(ref[finite]))
    assert whole == pytest.approx(expected, rel=1e-6)
