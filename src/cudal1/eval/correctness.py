"""Correctness decisions of the trusted parent: reduced-precision evidence from the run.

The comparison itself (`shared.compare`) runs where the outputs lie; what its figures mean is decided here.
"""

from __future__ import annotations

from cudal1.core import flags as F
from cudal1.core.types import Flag

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
            return F.runtime_flag(F.REDUCED_PRECISION, f"output {i} is computed at reduced precision: relative error {cand_err:.2e} against the "
                        f"float32 reference, whose own error against float64 is {ref_err:.2e} (bound {bound:.2e}: "
                        "what fp16, bf16 or TF32 arithmetic, or a less accurate algorithm, gives)",
                        source="runtime")
    return None
