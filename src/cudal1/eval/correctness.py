"""Output comparison: exact type, structure, shape, dtype and device, then dtype-aware closeness.

Covered: plain `torch.Tensor` only (subclasses and lazy wrappers are rejected as hacks); NaN/Inf must
appear exactly where the reference has them; closeness `|out - ref| <= atol + rtol * |ref|` per element;
"weak" references (near-constant or all-zero outputs, where an absolute tolerance alone would pass a
constant answer) are compared relative to the reference's own scale, never tighter than twice the
reference's own float32 rounding error where it was measured (protocol 4: a float64 run of the reference);
mismatch reports say where and how big. Input mutation is judged on the bytes (every dtype, fp8 included). Not covered: bit-exactness (tolerances are the contract) and nondeterministic references
(a reference that differs from itself run to run will fail candidates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cudal1.core import flags as F
from cudal1.core.types import Flag, Mismatch, Severity
from cudal1.eval.config import Profile


class OutputHackError(Exception):
    """The output is not a plain tensor (a subclass or lazy object that could compute on comparison)."""


@dataclass(frozen=True)
class Comparison:
    ok: bool
    message: str = ""
    mismatch: Mismatch | None = None
    # Per output, the normwise relative difference ||new - ref|| / ||ref|| over the reference's finite entries
    # (None: not a floating output, or a reference of norm zero): the evidence of reduced-precision compute
    # (`precision_evidence`), filled when every output matched.
    errors: tuple[float | None, ...] = ()


def relative_error(ref: torch.Tensor, new: torch.Tensor) -> float | None:
    """||new - ref|| / ||ref|| (2-norms, in float64) over the entries where `ref` is finite; None for
    non-floating tensors, a shape mismatch, or a reference of norm zero."""
    if not isinstance(ref, torch.Tensor) or not isinstance(new, torch.Tensor) or ref.shape != new.shape:
        return None
    if not (ref.is_floating_point() and new.is_floating_point()):
        return None
    # In float32 or the wider of the two dtypes, the norms accumulated in float64: no float64 copy of a large
    # output (timed outputs are checked too), and the difference of two close float32 numbers is exact.
    work = torch.float64 if torch.float64 in (ref.dtype, new.dtype) else torch.float32
    r, n = ref.detach().to(work), new.detach().to(work)
    finite = torch.isfinite(r) & torch.isfinite(n)
    norm = float(torch.linalg.vector_norm(r[finite], dtype=torch.float64)) if bool(finite.any()) else 0.0
    if norm == 0.0:
        return None
    return float(torch.linalg.vector_norm((r - n)[finite], dtype=torch.float64)) / norm


def _plain_sequence(out: Any) -> bool:
    kind = type(out)
    return kind in (tuple, list) or kind.__module__ == "torch.return_types"


def flatten(out: Any, strict: bool = True) -> list[Any]:
    """Outputs as a flat list (tuples/lists nested); anything else is a single output.

    With `strict`, a subclass of tuple or list (which could compute lazily when iterated) raises
    `OutputHackError`; PyTorch's own named tuples (`torch.return_types`) are accepted.
    """
    if isinstance(out, (tuple, list)):
        if strict and not _plain_sequence(out):
            raise OutputHackError(f"the output is a {type(out).__name__}, a tuple/list subclass")
        return [o for item in out for o in flatten(item, strict)]
    return [out]


def check_plain_tensor(x: Any, index: int) -> None:
    if isinstance(x, torch.Tensor) and type(x) not in (torch.Tensor, torch.nn.Parameter):
        raise OutputHackError(f"output {index} is a {type(x).__name__}, a torch.Tensor subclass")


def compare_outputs(ref_out: Any, new_out: Any, profile: Profile, trial: int,
                    noise: list[float | None] | None = None, *, errors: bool = False) -> Comparison:
    """Compare candidate outputs with the reference's. Raises `OutputHackError` for tensor subclasses.
    `noise[i]` is the reference's own float32 error on output i (None: not measured); with `errors` a match
    also carries each output's relative difference (`Comparison.errors`; float64 work, so asked for once)."""
    refs, news = flatten(ref_out, strict=False), flatten(new_out)
    for i, x in enumerate(news):
        check_plain_tensor(x, i)
    if len(refs) != len(news):
        return Comparison(False, f"returned {len(news)} outputs, the reference returns {len(refs)}")
    for i, (r, n) in enumerate(zip(refs, news, strict=True)):
        if not isinstance(r, torch.Tensor):
            if r != n:
                return Comparison(False, f"output {i}: expected {r!r}, got {n!r}")
            continue
        if not isinstance(n, torch.Tensor):
            return Comparison(False, f"output {i} is a {type(n).__name__}, expected a torch.Tensor")
        for what, a, b in (("shape", tuple(r.shape), tuple(n.shape)), ("dtype", r.dtype, n.dtype),
                           ("device", r.device, n.device)):
            if a != b:
                return Comparison(False, f"output {i}: {what} {b} differs from the reference's {a}")
        result = compare_tensor(r, n, profile, i, trial, noise[i] if noise and i < len(noise) else None)
        if not result.ok:
            return result
    if not errors:
        return Comparison(True)
    return Comparison(True, errors=tuple(relative_error(r, n) for r, n in zip(refs, news, strict=True)))


#: The tolerance never goes below this multiple of the reference's own float32 error.
NOISE_FACTOR = 2.0


def compare_tensor(ref: torch.Tensor, new: torch.Tensor, profile: Profile, index: int, trial: int,
                   noise: float | None = None) -> Comparison:
    """Element-wise closeness with the profile's tolerance for this dtype."""
    if ref.dtype == torch.bool or not (ref.is_floating_point() or ref.is_complex()):
        bad = ref != new
        return _report(ref, new, bad, index, trial, exact=True)
    tol = profile.tolerance(str(ref.dtype).removeprefix("torch."))
    if ref.is_complex():  # compare real and imaginary parts, never a cast that drops one
        ref, new = torch.view_as_real(ref.resolve_conj()), torch.view_as_real(new.resolve_conj())
    # float32 math is exact enough for tolerances >= 1e-6 and halves the temporaries of float64.
    work = torch.float64 if ref.dtype == torch.float64 else torch.float32
    r, n = ref.to(work), new.to(work)
    ref_nan, new_nan = torch.isnan(r), torch.isnan(n)
    finite = torch.isfinite(r)
    scale = float(r[finite].abs().max()) if bool(finite.any()) else 0.0
    atol = tol.atol
    # Rationale: when the reference's largest magnitude is within 10x the absolute tolerance, an all-zero
    # or constant answer would pass on atol alone; compare relative to the reference's own scale instead.
    scaled = scale < 10 * tol.atol
    if scaled:
        # Rationale (protocol 4): an output that small is often its own rounding noise (level2/41 of the
        # CUDA-L1 release: every value below 2.3e-8); no kernel can match it closer than the reference
        # matches itself in float64, so the reference's measured error bounds the tolerance from below.
        atol = max(scale * tol.rtol, NOISE_FACTOR * noise if noise is not None else 0.0, 1e-30)
    err = (r - n).abs()
    allowed = atol + tol.rtol * r.abs()
    bad = (err > allowed) & finite
    bad |= ref_nan != new_nan
    bad |= (~finite & ~ref_nan) & (r != n)  # +-inf must match exactly
    return _report(r, n, bad, index, trial, exact=False, atol=atol, rtol=tol.rtol, scale=scale if scaled else None,
                   noise=noise if scaled else None)


def _report(ref: torch.Tensor, new: torch.Tensor, bad: torch.Tensor, index: int, trial: int,
            exact: bool, atol: float | None = None, rtol: float | None = None,
            scale: float | None = None, noise: float | None = None) -> Comparison:
    n_bad = int(bad.sum())
    if n_bad == 0:
        return Comparison(True)
    r, n = ref.to(torch.float64) if exact else ref, new.to(torch.float64) if exact else new
    diff = torch.where(bad, (r - n).abs().nan_to_num(nan=float("inf")), torch.zeros_like(r))
    flat = int(diff.flatten().argmax())
    where = [int(i) for i in torch.unravel_index(torch.tensor(flat), ref.shape)] if ref.dim() else []
    errors = (r - n).abs()[bad]
    finite_errors = errors[torch.isfinite(errors)]
    # Only NaN/Inf placed where the reference has a number (or the reverse): no finite error to report.
    max_abs = float(finite_errors.max()) if finite_errors.numel() else float("nan")
    rel = ((r - n).abs() / r.abs().clamp_min(1e-12))[bad].nan_to_num(nan=float("inf"))
    mismatch = Mismatch(output_index=index, trial=trial, max_abs_error=max_abs,
                        max_rel_error=float(rel.max()), bad_elements=n_bad, total_elements=ref.numel(),
                        first_bad_index=where, expected=float(r.flatten()[flat]), got=float(n.flatten()[flat]),
                        atol=atol, rtol=rtol, scale=scale, noise=noise)
    return Comparison(False, mismatch.describe(), mismatch)


#: A float32 candidate is flagged for reduced precision when its relative error against the float32 reference
#: is above PRECISION_FACTOR x the reference's own error against float64 and above PRECISION_FLOOR. Rationale:
#: a float32 kernel that sums in another order stays within a few times the reference's error (1e-7 to 1e-6
#: in practice), while rounding inputs or products to 10- or 7-bit mantissas (fp16, TF32, bf16) costs about
#: 1e-4 to 1e-2 of the output's norm; the floor keeps outputs the reference computes exactly (relu, copies)
#: from flagging an honest kernel's last-bit differences.
PRECISION_FACTOR = 32.0
PRECISION_FLOOR = 5e-5


def precision_evidence(ref_errors: list[float | None], cand_errors: list[float | None]) -> Flag | None:
    """`guard.reduced_precision` when some output's candidate error (relative, against the float32 reference)
    is far above the float32 reference's own (relative, against its float64 run); None otherwise."""
    for i, (ref_err, cand_err) in enumerate(zip(ref_errors, cand_errors, strict=False)):
        if ref_err is None or cand_err is None:
            continue
        bound = max(PRECISION_FACTOR * ref_err, PRECISION_FLOOR)
        if cand_err > bound:
            return Flag(F.REDUCED_PRECISION, Severity.ERROR,
                        f"output {i} is computed at reduced precision: relative error {cand_err:.2e} against the "
                        f"float32 reference, whose own error against float64 is {ref_err:.2e} (bound {bound:.2e}: "
                        "what fp16, bf16 or TF32 arithmetic, or a less accurate algorithm, gives)",
                        source="runtime")
    return None


def snapshot_inputs(inputs: list[Any]) -> list[Any]:
    """Copies of the tensor inputs, to check afterwards that a model left them unchanged."""
    return [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def changed_inputs(before: list[Any], after: list[Any]) -> list[int]:
    """Indices of inputs whose values changed, bit for bit (NaNs equal themselves; every dtype, fp8 too)."""
    changed = []
    for i, (b, a) in enumerate(zip(before, after, strict=False)):
        if isinstance(b, torch.Tensor):
            if (not isinstance(a, torch.Tensor) or b.shape != a.shape or b.dtype != a.dtype
                    or (b.numel() and not torch.equal(b.reshape(-1).view(torch.uint8), a.reshape(-1).view(torch.uint8)))):
                changed.append(i)
        elif b != a:
            changed.append(i)
    return changed + list(range(min(len(before), len(after)), max(len(before), len(after))))


def mostly_not_finite(value: Any) -> bool:
    """Whether most floating-point elements of an output are inf or NaN (an extra trial whose inputs the
    reference itself cannot handle, which is then skipped)."""
    tensors = [t for t in flatten(value, strict=False) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    total = sum(t.numel() for t in tensors)
    # Upcast first: fp8 dtypes implement almost no ops (isfinite included); every float fits in float32.
    bad = sum(int((~torch.isfinite(t.float())).sum()) for t in tensors)
    return total > 0 and bad * 2 > total
