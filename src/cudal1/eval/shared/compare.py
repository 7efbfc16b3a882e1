"""Output comparison: exact type, structure, shape, dtype and device, then dtype-aware closeness.

Covered: plain `torch.Tensor` only (subclasses and lazy wrappers are rejected as hacks); NaN/Inf must
appear exactly where the reference has them; closeness `|out - ref| <= atol + rtol * |ref|` per element;
"weak" references (near-constant or all-zero outputs, where an absolute tolerance alone would pass a
constant answer) are compared relative to the reference's own scale, never tighter than twice the
reference's own float32 rounding error where it was measured (protocol 4: a float64 run of the reference);
mismatch reports say where and how big. Not covered: bit-exactness (tolerances are the contract) and
nondeterministic references (a reference that differs from itself run to run will fail candidates).

Used where outputs lie: by the trusted parent on the CPU and by the device's helper on a GPU, which gets the
tolerance table with each request (`tolerances_to_wire`), never a profile name to look up.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from cudal1.core.types import Mismatch


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


def tolerance_for(table: Mapping[str, Tolerance], dtype_name: str) -> Tolerance:
    """The table's tolerance for a dtype name ("default" for any other)."""
    return table.get(dtype_name, table["default"])


def tolerances_to_wire(table: Mapping[str, Tolerance]) -> dict[str, list[float]]:
    return {k: [t.atol, t.rtol] for k, t in table.items()}


def tolerances_from_wire(data: Mapping[str, list[float]]) -> dict[str, Tolerance]:
    if "default" not in data:
        raise ValueError("a tolerance table needs a default")
    return {str(k): Tolerance(float(v[0]), float(v[1])) for k, v in data.items()}


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


#: Elements compared at a time: the comparison's temporaries (a few float32 copies and masks) are then bounded
#: by ~0.4 GB whatever the output's size. Rationale: unchunked, a 1 GB output needed 10 GiB of temporaries in
#: the device's helper, beside two runners each allowed nearly half the device.
CHUNK_ELEMENTS = 1 << 24


def _chunks(*tensors: torch.Tensor) -> Iterator[list[torch.Tensor]]:
    """Aligned flat slices of same-shaped tensors, CHUNK_ELEMENTS at a time."""
    flats = [t.detach().reshape(-1) for t in tensors]
    total = flats[0].numel()
    for start in range(0, total, CHUNK_ELEMENTS):
        yield [f[start:start + CHUNK_ELEMENTS] for f in flats]


def relative_error(ref: torch.Tensor, new: torch.Tensor) -> float | None:
    """||new - ref|| / ||ref|| (2-norms, in float64) over the entries where both are finite; None for
    non-floating tensors, a shape mismatch, or a reference of norm zero."""
    if not isinstance(ref, torch.Tensor) or not isinstance(new, torch.Tensor) or ref.shape != new.shape:
        return None
    if not (ref.is_floating_point() and new.is_floating_point()):
        return None
    # In float32 or the wider of the two dtypes, the norms accumulated in float64: no float64 copy of a large
    # output (timed outputs are checked too), and the difference of two close float32 numbers is exact.
    work = torch.float64 if torch.float64 in (ref.dtype, new.dtype) else torch.float32
    ref_sq = diff_sq = None
    for r, n in _chunks(ref, new):
        r, n = r.to(work), n.to(work)
        finite = torch.isfinite(r) & torch.isfinite(n)
        r_part = torch.linalg.vector_norm(torch.where(finite, r, 0), dtype=torch.float64) ** 2
        d_part = torch.linalg.vector_norm(torch.where(finite, r - n, 0), dtype=torch.float64) ** 2
        ref_sq = r_part if ref_sq is None else ref_sq + r_part
        diff_sq = d_part if diff_sq is None else diff_sq + d_part
    norm = float(ref_sq) ** 0.5 if ref_sq is not None else 0.0
    if norm == 0.0:
        return None
    return float(diff_sq) ** 0.5 / norm


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


def compare_outputs(ref_out: Any, new_out: Any, tolerances: Mapping[str, Tolerance], trial: int,
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
        result = compare_tensor(r, n, tolerances, i, trial, noise[i] if noise and i < len(noise) else None)
        if not result.ok:
            return result
    if not errors:
        return Comparison(True)
    return Comparison(True, errors=tuple(relative_error(r, n) for r, n in zip(refs, news, strict=True)))


#: The tolerance never goes below this multiple of the reference's own float32 error.
NOISE_FACTOR = 2.0


def compare_tensor(ref: torch.Tensor, new: torch.Tensor, tolerances: Mapping[str, Tolerance], index: int, trial: int,
                   noise: float | None = None) -> Comparison:
    """Element-wise closeness with the profile's tolerance for this dtype, CHUNK_ELEMENTS at a time."""
    if ref.dtype == torch.bool or not (ref.is_floating_point() or ref.is_complex()):
        return _verdict(ref, new, lambda r, n: r != n, index, trial, exact=True)
    tol = tolerance_for(tolerances, str(ref.dtype).removeprefix("torch."))
    if ref.is_complex():  # compare real and imaginary parts, never a cast that drops one
        ref, new = torch.view_as_real(ref.resolve_conj()), torch.view_as_real(new.resolve_conj())
    # float32 math is exact enough for tolerances >= 1e-6 and halves the temporaries of float64.
    work = torch.float64 if ref.dtype == torch.float64 else torch.float32
    largest = []
    for (r,) in _chunks(ref):
        r = r.to(work)  # first: fp8 dtypes implement almost no ops, isfinite included
        largest.append(torch.where(torch.isfinite(r), r.abs(), 0).max())
    scale = float(torch.stack(largest).max()) if largest else 0.0
    atol = tol.atol
    # Rationale: when the reference's largest magnitude is within 10x the absolute tolerance, an all-zero
    # or constant answer would pass on atol alone; compare relative to the reference's own scale instead.
    scaled = scale < 10 * tol.atol
    if scaled:
        # Rationale (protocol 4): an output that small is often its own rounding noise (level2/41 of the
        # CUDA-L1 release: every value below 2.3e-8); no kernel can match it closer than the reference
        # matches itself in float64, so the reference's measured error bounds the tolerance from below.
        atol = max(scale * tol.rtol, NOISE_FACTOR * noise if noise is not None else 0.0, 1e-30)

    def bad_of(r: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        finite = torch.isfinite(r)
        ref_nan = torch.isnan(r)
        bad = ((r - n).abs() > atol + tol.rtol * r.abs()) & finite
        bad |= ref_nan != torch.isnan(n)
        bad |= (~finite & ~ref_nan) & (r != n)  # +-inf must match exactly
        return bad

    return _verdict(ref, new, bad_of, index, trial, exact=False, work=work, atol=atol, rtol=tol.rtol,
                    scale=scale if scaled else None, noise=noise if scaled else None)


def _verdict(ref: torch.Tensor, new: torch.Tensor, bad_of: Any, index: int, trial: int, exact: bool,
             work: torch.dtype | None = None, atol: float | None = None, rtol: float | None = None,
             scale: float | None = None, noise: float | None = None) -> Comparison:
    """Count the elements `bad_of(ref_chunk, new_chunk)` marks, chunk by chunk; for a mismatch, where the
    largest error is and how large the errors are (the mismatch report)."""
    counts = []
    for r, n in _chunks(ref, new):
        if work is not None:
            r, n = r.to(work), n.to(work)
        counts.append(bad_of(r, n).sum())
    n_bad = int(torch.stack(counts).sum()) if counts else 0
    if n_bad == 0:
        return Comparison(True)
    worst = (-1.0, 0, 0.0, 0.0)  # (largest error among the bad, its flat index, expected, got)
    max_abs, max_rel, start = float("nan"), 0.0, 0
    for r, n in _chunks(ref, new):
        if work is not None:
            r, n = r.to(work), n.to(work)
        bad = bad_of(r, n)
        if exact:  # the errors of integers and booleans, in float64
            r, n = r.to(torch.float64), n.to(torch.float64)
        if bool(bad.any()):
            err = (r - n).abs()
            diff = torch.where(bad, err.nan_to_num(nan=float("inf")), 0)
            at = int(diff.argmax())
            if float(diff[at]) > worst[0]:
                worst = (float(diff[at]), start + at, float(r[at]), float(n[at]))
            errors = err[bad]
            finite_errors = errors[torch.isfinite(errors)]
            if finite_errors.numel():  # NaN/Inf placed where the reference has a number: no finite error
                max_abs = max(float(finite_errors.max()), 0.0 if max_abs != max_abs else max_abs)
            rel = (err / r.abs().clamp_min(1e-12))[bad].nan_to_num(nan=float("inf"))
            max_rel = max(max_rel, float(rel.max()))
        start += r.numel()
    flat = worst[1]
    where = [int(i) for i in torch.unravel_index(torch.tensor(flat), ref.shape)] if ref.dim() else []
    mismatch = Mismatch(output_index=index, trial=trial, max_abs_error=max_abs, max_rel_error=max_rel,
                        bad_elements=n_bad, total_elements=ref.numel(), first_bad_index=where,
                        expected=worst[2], got=worst[3], atol=atol, rtol=rtol, scale=scale, noise=noise)
    return Comparison(False, mismatch.describe(), mismatch)


def mostly_not_finite(value: Any) -> bool:
    """Whether most floating-point elements of an output are inf or NaN (an extra trial whose inputs the
    reference itself cannot handle, which is then skipped)."""
    tensors = [t for t in flatten(value, strict=False) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    total = sum(t.numel() for t in tensors)
    # Upcast first: fp8 dtypes implement almost no ops (isfinite included); every float fits in float32.
    bad = sum(int((~torch.isfinite(t.float())).sum()) for t in tensors)
    return total > 0 and bad * 2 > total
