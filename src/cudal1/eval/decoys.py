"""The decoy-kernel guard: did a custom candidate's own kernels really run in its profiled forward?

The candidate's runner profiles one forward (`inside.profiling.profile_call`): per kernel name the calls and
the GPU time, plus copies and memsets. `own_kernel_share(profile, own_names)` is the fraction of that GPU
time spent in the candidate's own kernels (the `__global__` kernels static analysis found, its Triton
kernels, the raw-CUDA kernels it loaded). `decoy_flags(profile, static_report)` turns that into guard flags for a candidate classified as
custom CUDA or Triton:

- `guard.decoy_kernel` (WARNING): GPU kernels ran, but none of the candidate's own; the work was done by
  PyTorch/cuBLAS/cuDNN. Policy: reclassify as not custom (`reclassify`), do not reject.
- `guard.low_custom_share` (INFO): its kernels ran but took less than `min_share` of the GPU time.
- `guard.kernels_not_run` (INFO): some defined kernels never ran (alternatives, dead code, decoys).
- `guard.no_gpu_work` (INFO): the profiled forward ran no GPU work at all (cached results, or a profiler
  that recorded nothing; the two cannot be told apart here, so it only informs).

Limits: on a CPU device, or when the profiler cannot start (another profiler active, no Kineto), the
profile is empty and marked unavailable, and no flag is raised. GPU time is the sum of kernel durations,
so kernels overlapping on several streams can sum to more than the wall time; shares stay meaningful.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from cudal1.core import flags as F
from cudal1.core.types import CUSTOM_CLASSES, Flag, KernelClass
from cudal1.eval.shared.kernel_profile import KernelProfile, KernelStat, kernel_matches, short_name

#: Findings that say the candidate sets global backend flags (static rules, the runtime guard).
GLOBAL_FLAG_RULES = ("global_backend_flags", "algorithm_flags", F.GLOBAL_STATE, F.ALGORITHM_FLAGS)

# Rationale: an honest custom kernel usually does most of the work; below 10% of the GPU time the speedup
# comes from something else (cuBLAS, a PyTorch rewrite), which is worth noting but is no proof of cheating.
DEFAULT_MIN_OWN_SHARE = 0.10


def own_kernel_names(static_report: Any = None, raw_kernel_names: Iterable[str] = ()) -> list[str]:
    """The candidate's own kernel names: static `kernels_defined`, Triton kernels, raw-CUDA kernels."""
    names: dict[str, None] = {}
    if static_report is not None:
        for attr in ("kernels_defined", "triton_kernels_defined"):
            names.update(dict.fromkeys(getattr(static_report, attr, None) or []))
    names.update(dict.fromkeys(raw_kernel_names))
    return [n for n in names if n]


def _own_stats(profile: KernelProfile, own_names: Sequence[str]) -> list[KernelStat]:
    return [k for k in profile.kernels
            if k.kind == "kernel" and any(kernel_matches(k.name, o) for o in own_names)]


def own_kernel_share(profile: KernelProfile, own_names: Iterable[str]) -> float:
    """Fraction of the profile's GPU time spent in kernels matching `own_names` (0.0 when nothing ran)."""
    total = profile.total_us
    if total <= 0:
        return 0.0
    own = _own_stats(profile, list(own_names))
    return min(1.0, sum(k.total_us for k in own) / total)


def never_ran(profile: KernelProfile, own_names: Iterable[str]) -> list[str]:
    """The names in `own_names` that match no kernel of the profile."""
    return [o for o in own_names if not any(kernel_matches(k.name, o) for k in profile.kernels)]


# ----------------------------------------------------------------------------------------------------

def _names(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def decoy_flags(profile: KernelProfile, static_report: Any, kernel_class: KernelClass | str | None = None, *,
                raw_kernel_names: Iterable[str] = (), min_share: float = DEFAULT_MIN_OWN_SHARE) -> list[Flag]:
    """Runtime flags for a custom CUDA/Triton candidate whose own kernels did not (really) run.

    `static_report` is the candidate's `StaticReport` (or anything with `kernels_defined` and
    `triton_kernels_defined`); `kernel_class` defaults to its class; `raw_kernel_names` adds the kernels of
    the raw-CUDA launch log (`launch_log().defined_kernels`). Candidates of other classes, unavailable
    profiles and CPU profiles give no flags.
    """
    if not 0.0 <= min_share <= 1.0:
        raise ValueError(f"min_share must be in [0, 1], got {min_share}")
    cls = kernel_class if kernel_class is not None else getattr(static_report, "kernel_class", None)
    if cls is None or KernelClass(cls) not in CUSTOM_CLASSES:
        return []
    if not profile.available or profile.device != "cuda":
        return []
    if not profile.kernels:
        return [F.runtime_flag(F.NO_GPU_WORK, "the profiled forward ran no GPU kernels",
                     source="runtime")]
    own = own_kernel_names(static_report, raw_kernel_names)
    if not own:
        return []  # nothing named to look for (e.g. inline PTX only): cannot tell
    missing = never_ran(profile, own)
    ran = [o for o in own if o not in missing]
    top = short_name(profile.kernels[0].name)
    if not ran:
        return [F.runtime_flag(F.DECOY_KERNEL, f"none of the candidate's kernels ({_names(own)}) ran in the forward; "
                     f"the GPU time went to {top} and {len(profile.kernels) - 1} other kernel(s)",
                     source="runtime")]
    flags = []
    share = own_kernel_share(profile, own)
    if share < min_share:
        flags.append(F.runtime_flag(F.LOW_CUSTOM_SHARE, f"the candidate's kernels took {100 * share:.1f}% of the forward's GPU time "
                          f"(below {100 * min_share:.0f}%); most went to {top}", source="runtime"))
    if missing:
        flags.append(F.runtime_flag(F.KERNELS_NOT_RUN, f"defined but not run in the forward: {_names(missing)}", source="runtime"))
    return flags


def reclassify(kernel_class: KernelClass | str | None, flags: Iterable[Flag], *,
               builds: Iterable[dict] = (), own_launcher: bool = False) -> KernelClass | None:
    """The class after the runtime guards: what ran, not what the source promises. A decoy custom candidate
    is PyTorch-only (not rejected); so is a CUDA candidate none of whose extension builds succeeded (its own
    code caught the failure and fell back), unless it also launches kernels through the raw-CUDA layer
    (`own_launcher`). Either is `flags_only` instead when the candidate sets global backend flags."""
    if kernel_class is None:
        return None
    cls = KernelClass(kernel_class)
    flags = list(flags)
    builds = list(builds)
    decoy = cls in CUSTOM_CLASSES and any(f.rule == F.DECOY_KERNEL for f in flags)
    never_built = (cls is KernelClass.CUSTOM_CUDA and builds and not any(b.get("ok") for b in builds)
                   and not own_launcher)
    if decoy or never_built:
        sets_flags = any(f.rule in GLOBAL_FLAG_RULES for f in flags)
        return KernelClass.FLAGS_ONLY if sets_flags else KernelClass.PYTORCH_ONLY
    return cls
