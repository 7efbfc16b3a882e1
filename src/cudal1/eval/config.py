"""Configuration of one evaluation: device, correctness profile (how to measure), verdict policy (what
rejects), timing protocol and limits.

`resolve_judging` is the one place that turns the user's profile and policy options into a (Profile,
Policy) pair; old profile spellings (`core.names.RENAMED_PROFILES`) are accepted with a deprecation warning.

`EvalConfig.protocol()` is the part that changes measured numbers; it is recorded with every result and
is part of the store's cache key, together with `PROTOCOL_VERSION` (bump it whenever the measuring code
changes what it measures).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from cudal1.core.errors import ConfigError
from cudal1.core.names import RENAMED_PROFILES, describe_choices
from cudal1.core.ranges import check_ranges
from cudal1.eval.shared.compare import Tolerance, tolerance_for
from cudal1.policy import Policy, resolve_policy
from cudal1.policy.presets import policy_choices

logger = logging.getLogger(__name__)

#: How a series becomes one speedup: "pooled", the median of every reference call over the median of every
#: candidate call; "buckets", the median of per-bucket ratios (CUDA-L1's). On the H200 host, 24 null
#: evaluations of 8 small tasks gave a median round-to-round difference of 1.5 % pooled against 3.2 % by
#: buckets, from the same calls (docs/log.md, 2026-12-04).
ESTIMATORS = ("pooled", "buckets")

PROTOCOL_VERSION = "21"  # what each version changed: docs/protocol.md
#: Revisions of the host clock's CPU bound, part of a CPU result's key only (GPU results do not read it):
#: 2: the call's CPU time read over the wall clock's own window (docs/protocol.md).
CPU_CLOCK_REVISION = 2


def current_protocol(protocol: dict[str, Any]) -> bool:
    """Whether a stored result's protocol is this version's, so that a key made now can match it: its
    version, and on a CPU its CPU clock's revision."""
    if str(protocol.get("version")) != PROTOCOL_VERSION:
        return False
    return str(protocol.get("device", "")).startswith("cuda") or protocol.get("cpu_clock") == CPU_CLOCK_REVISION


@dataclass(frozen=True)
class Profile:
    """How to measure: tolerances per dtype, the numerics, the sandbox, the extra trials. What rejects is the
    verdict policy's (`cudal1.policy`): a profile holds nothing that only changes a verdict."""

    name: str
    tolerances: dict[str, Tolerance]  # dtype name -> tolerance; "default" for anything else
    # Run reference and candidate in true fp32 (TF32 off for cuDNN and matmuls). PyTorch's default lets
    # cuDNN use TF32 for convolutions, so a reference may itself be ~1e-3 off fp32, beyond a 1e-4 tolerance.
    exact_fp32: bool = False
    # Untrusted candidates need an OS sandbox under this profile (EvalConfig.sandbox="none" opts out).
    require_sandbox: bool = False
    # Extra correctness trials on heavy-tailed, sign-varied inputs (reported apart; 0: none).
    extra_trials: int = 0
    # Also compare every output against this stricter table: a miss is recorded (`evidence.stricter_tolerance`,
    # with its mismatch in the result's protocol) and `tolerances` decide. None: one table.
    stricter_tolerances: dict[str, Tolerance] | None = None
    # Whether a failure on the extra trials ends the evaluation (`incorrect`); False: it is recorded as a flag
    # (`runtime.beyond_distribution`) and the evaluation goes on (what is measured after it changes).
    beyond_distribution_decides: bool = True
    # One line for help texts (`profile_choices`); not part of what the profile decides.
    description: str = field(default="", compare=False)

    def tolerance(self, dtype_name: str) -> Tolerance:
        return tolerance_for(self.tolerances, dtype_name)

    def noise_atol(self) -> float:
        """The float32 atol below 10x which the reference's own rounding noise is measured: the larger of the
        two tables', so that both comparisons find it where they need it."""
        tables = [self.tolerances] + ([self.stricter_tolerances] if self.stricter_tolerances else [])
        return max(tolerance_for(t, "float32").atol for t in tables)


# Rationale: `strict` holds fp32 tasks to 1e-4 so that fp16/bf16/TF32 downcasts fail, and so runs both
# models in true fp32 (`exact_fp32`); half types get the tolerance their 8/11-bit mantissas allow.
# `loose` is the 1e-2 everywhere that CUDA-L1's harness and published KernelBench numbers used, with
# PyTorch's default numerics (formerly two profiles, `cuda-l1` and `kernelbench-v0`, which measured alike
# and differed only in what rejects: now the policies of those names).
PROFILES: dict[str, Profile] = {
    "strict": Profile("strict", {
        "float32": Tolerance(1e-4, 1e-4), "float64": Tolerance(1e-6, 1e-6),
        "float16": Tolerance(1e-2, 1e-2), "bfloat16": Tolerance(2e-2, 2e-2),
        "default": Tolerance(1e-4, 1e-4)}, exact_fp32=True, require_sandbox=True,
        extra_trials=2, description="fp32 1e-4 in true fp32, sandboxed, extra trials"),
    "loose": Profile("loose", {"default": Tolerance(1e-2, 1e-2)},
                     description="1e-2, PyTorch's numerics (CUDA-L1's, KernelBench's)"),
}
# Rationale: code cudal1 generates itself (baselines) is trusted, but torch.compile starts a helper
# thread on a cold cache, which the strict thread guard would reject; keep strict tolerances (its policy,
# `kernelbench-v0`, only records the guards).
PROFILES["trusted"] = Profile("trusted", PROFILES["strict"].tolerances, exact_fp32=True,
                              description="for cudal1's own baselines")
# Rationale: an audit evaluates each published candidate once and derives every view's verdict from the
# record (`cudal1.audit.views`), so this profile (under its policy `kernelbench-v0`: nothing static rejects,
# runtime guards are recorded) stops only for what rejects under every policy: outputs are held to the looser
# table (1e-2) with misses of strict's table recorded, failures beyond the reference's distribution recorded.
# It measures as strict does (true fp32, the sandbox, the extra trials), so strict's verdict is what strict
# would give.
PROFILES["evidence"] = Profile("evidence", PROFILES["loose"].tolerances, exact_fp32=True, require_sandbox=True,
                               extra_trials=PROFILES["strict"].extra_trials,
                               stricter_tolerances=PROFILES["strict"].tolerances, beyond_distribution_decides=False,
                               description="the audit's one pass: everything recorded, every view derived")

#: The policy a run under each profile gets when it names none (what rejected under the profile before the
#: split, so that a default run's verdict and cache key are unchanged).
PROFILE_POLICIES: dict[str, str] = {"strict": "guarded", "loose": "cuda-l1", "trusted": "kernelbench-v0",
                                    "evidence": "kernelbench-v0"}


def canonical_options(profile: str, policy: str | Policy | None = None) -> tuple[str, str | Policy]:
    """The profile's name and the policy a user's options stand for: an old profile spelling
    (`core.names.RENAMED_PROFILES`) becomes its profile and, where no policy is named, its policy (one line
    of deprecation warning); no policy ("" or None) becomes the profile's (`PROFILE_POLICIES`). ConfigError
    for an unknown profile."""
    name = profile.strip()
    if name in RENAMED_PROFILES:
        new_profile, implied = RENAMED_PROFILES[name]
        policy = policy or implied
        logger.warning("profile %r is deprecated: it is now profile %r (how to measure) with policy %r (what "
                       "rejects)", name, new_profile, implied)
        name = new_profile
    if name not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r}: choose one of {', '.join(PROFILES)} (or the old "
                          f"spellings {', '.join(RENAMED_PROFILES)})")
    return name, policy or PROFILE_POLICIES[name]


def resolve_judging(profile: str, policy: str | Policy | None = None) -> tuple[Profile, Policy]:
    """The one place that turns a profile option and a policy option into (how to measure, what rejects)."""
    name, spec = canonical_options(profile, policy)
    return PROFILES[name], resolve_policy(spec)


def profile_choices(*, typed: bool = False) -> str:
    """The profiles with their descriptions and their default policies, for help texts. `typed`: also the
    old spellings the command line still accepts (`core.names.RENAMED_PROFILES`)."""
    text = describe_choices(((name, f"{p.description}; policy {PROFILE_POLICIES[name]}")
                             for name, p in PROFILES.items()))
    return text + (f" (deprecated: {', '.join(RENAMED_PROFILES)})" if typed else "")

SANDBOX_MODES = ("auto", "required", "none")


def _f(default: Any, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help}, **kw)


@dataclass(frozen=True)
class EvalConfig:
    """Everything that decides how one candidate is evaluated."""

    device: str = _f("auto", "auto (cuda if available, else cpu), cuda, cuda:N or cpu.")
    profile: str = _f("strict", f"Correctness profile, how to measure: {profile_choices()}.")
    correctness_trials: int = _f(5, "Correctness trials, each with fresh random inputs and a new seed.")
    seed: int = _f(42, "Seed of the models' parameters (both get the same). Input seeds are salted per "
                       "evaluation so a candidate cannot predict them.")
    sizes: str = _f("auto", "Problem sizes: full, small (the task's SMALL_SIZES) or auto (small on cpu).")
    buckets: int = _f(7, "Timing buckets (CUDA-L1: 7); their spread is the measurement's stability.")
    estimator: str = _f("pooled", "How the timed calls become a speedup: pooled (median of all reference calls "
                                  "over median of all candidate calls) or buckets (median of the buckets' "
                                  "ratios, CUDA-L1's; about twice the run-to-run scatter on small kernels).")
    target_bucket_ms: float = _f(100.0, "Time each model should spend per bucket; sets iterations.")
    min_iters_per_bucket: int = _f(3, "Lower bound on timed calls per model per bucket.")
    max_iters_per_bucket: int = _f(100, "Upper bound on timed calls per model per bucket.")
    warmup_iters: int = _f(3, "Untimed calls of each model before timing (absorbs JIT/autotuning); at least "
                               "two per timing input set.")
    flush_l2: bool = _f(True, "Flush the L2 cache before every timed bracket (cold-cache timing, primary): each "
                              "call's inputs are cold; a bracket's later calls find what the earlier left.")
    bracket_work_ms: float = _f(0.0, "Calls of each model per bracket of the parent's clock: as many as fill about "
                                     "this much of the reference's time (a small model's calls share the "
                                     "harness's cost, so the slack per call shrinks); 0: one call per bracket. "
                                     "Only for code you trust: a candidate can read the later calls' inputs "
                                     "and answer them all in one batch.")
    max_calls_per_bracket: int = _f(16, "At most this many calls per bracket (and what the inputs' memory allows).")
    gpu_clock: bool = _f(True, "On a GPU, time each call by the trusted helper's events on the GPU's own timeline, "
                               "the call enqueued behind a gate: no host work of the candidate inside "
                               "(docs/sandbox.md, The GPU clock); off: the parent's clock around each bracket, "
                               "bounded against the calibrated harness (forgeries keep tens of microseconds "
                               "per call below 0.2 ms). A CPU has the host's clock only.")
    gpu_clock_max_iters: int = _f(20, "Under the GPU clock, at most this many timed calls per model per bucket (its "
                                      "calls scatter by about 1 us: in one H100 run's recorded calls, 20 per bucket "
                                      "kept the speedup within 0.1 % of 100 per bucket from 0.1 ms up, "
                                      "docs/log.md).")
    warm_buckets: int = _f(3, "Extra buckets timed without the flush (CUDA-L1's warm condition); 0: skip.")
    round_toward_one: bool = _f(False, "CUDA-L1's conservative rounding of speedups toward 1 (2 decimals).")
    noisy_stability: float = _f(0.25, "A measurement whose stability (IQR of bucket speedups / median) exceeds "
                                      "this is flagged timing.noisy and measured once more; the steadier of the "
                                      "two is kept, both are in the flag (0: never re-measure).")
    runner_pairs: int = _f(1, "Independent measurements, each in a fresh pair of runners (a new process, a new "
                              "context, new memory): the speedup is their median and its interval spans every "
                              "pair's, so what changes between processes is in the interval; costs that many "
                              "times the time.")
    timeout_s: float = _f(600.0, "Wall-clock limit of one whole evaluation (build time excluded).")
    phase_floor_s: float = _f(30.0, "Each step of the candidate (import, a trial, a timed call) may take at least "
                                    "this long...")
    phase_factor: float = _f(50.0, "...or this many times the reference's time for the same step, whichever is "
                                   "longer (a hung candidate ends within about max(30 s, 50x the reference)).")
    build_timeout_s: float = _f(900.0, "Wall-clock limit of a candidate's CUDA build.")
    memory_bytes: int | None = _f(None, "Host memory limit of the candidate's sandbox, its whole process tree. "
                                        "None: derived from the task's data and the machine's memory.")
    gpu_memory_fraction: float = _f(0.45, "Share of the GPU's memory each model's runner may use, the reference's "
                                          "too (both are timed under the same cap); the candidate's is also "
                                          "watched from outside through NVML where installed.")
    cpu_threads: int | None = _f(None, "CPU threads of both models (torch intra-op). None: half the usable "
                                       "cores, 1 to 4.")
    policy: str = _f("", f"Verdict policy, what rejects (static preset, runtime guards, a harness's rules): "
                         f"{policy_choices()} (cudal1.policy.presets); empty: the profile's.")
    sandbox: str = _f("auto", "auto: the best OS sandbox this host allows (strict refuses to run untrusted "
                              "candidates without one); required: refuse without one; none: run unsandboxed "
                              "(opt-out, recorded).")
    extra_trials: int | None = _f(None, "Extra correctness trials on heavy-tailed, sign-varied inputs, reported "
                                        "apart. None: the profile's choice (strict: 2).")
    exact_fp32: bool | None = _f(None, "Run both models in true fp32, TF32 off for cuDNN and matmuls (PyTorch "
                                       "lets cuDNN use TF32 by default). None: the profile's choice (strict: on).")
    skip_static: bool = _f(False, "Skip static analysis (not recommended; for debugging).")
    profile_kernels: bool = _f(True, "CUDA: one profiled forward after timing to detect decoy kernels.")
    precision_evidence: bool = _f(True, "float32 tasks: run the reference once in float64 and flag a candidate "
                                        "whose error is far above the float32 reference's (guard.reduced_precision; "
                                        "rejects under strict and under policies with reject_reduced_precision).")
    record_samples: bool = _f(False, "Keep every timed call's figures (both models' reported and outside times, "
                                     "per bucket) in the result's protocol, for studying the timing statistics.")
    decoy_min_share: float = _f(0.10, "Below this share of GPU time in its own kernels, a custom candidate "
                                      "is reported as mostly library work.")

    def __post_init__(self) -> None:
        check_ranges(self, {})  # every float finite (a NaN passes every comparison below)
        object.__setattr__(self, "profile", self.profile.strip())
        if self.profile in RENAMED_PROFILES:  # an old spelling: its profile and (if none named) policy
            profile, policy = canonical_options(self.profile, self.policy)
            object.__setattr__(self, "profile", profile)
            object.__setattr__(self, "policy", policy)
        elif self.policy == "cuda-l1" and self.profile != "loose":
            # Before policies held the static preset and the guards, `cuda-l1` was the default and added nothing
            # to the profile's rules: a config written then meant its profile's policy by it.
            logger.warning("policy 'cuda-l1' under profile %r is CUDA-L1's rules (its static preset, guards "
                           "recorded); before 2026-12-07 it meant the profile's own (%s): leave the policy empty "
                           "for those", self.profile, PROFILE_POLICIES.get(self.profile, "?"))
        canonical_options(self.profile, self.policy)  # a clear error for an unknown profile
        if self.sizes not in ("auto", "full", "small"):
            raise ConfigError(f"sizes must be auto, full or small, not {self.sizes!r}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, not {self.device!r}")
        if self.correctness_trials < 1:
            raise ConfigError("correctness_trials must be >= 1")
        if self.buckets < 1 or self.min_iters_per_bucket < 1 or self.max_iters_per_bucket < self.min_iters_per_bucket:
            raise ConfigError("need buckets >= 1 and 1 <= min_iters_per_bucket <= max_iters_per_bucket")
        if self.bracket_work_ms < 0 or self.max_calls_per_bracket < 1:
            raise ConfigError("need bracket_work_ms >= 0 and max_calls_per_bracket >= 1")
        if self.warmup_iters < 1:
            raise ConfigError("warmup_iters must be >= 1 (warm-up also sizes the timing buckets)")
        if self.runner_pairs < 1:
            raise ConfigError(f"runner_pairs must be >= 1, not {self.runner_pairs!r}")
        if self.noisy_stability < 0:
            raise ConfigError(f"noisy_stability must be >= 0, not {self.noisy_stability!r}")
        for name in ("timeout_s", "build_timeout_s", "target_bucket_ms"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, not {getattr(self, name)!r}")
        if self.estimator not in ESTIMATORS:
            raise ConfigError(f"estimator must be one of {', '.join(ESTIMATORS)}, not {self.estimator!r}")
        if self.warm_buckets < 0:
            raise ConfigError("warm_buckets must be >= 0")
        if self.uses_gpu_clock and self.gpu_clock_max_iters < self.min_iters_per_bucket:
            raise ConfigError("gpu_clock_max_iters must be >= min_iters_per_bucket")
        if self.memory_bytes is not None and self.memory_bytes <= 0:
            raise ConfigError("memory_bytes must be > 0 (or None: derived)")
        if self.sandbox not in SANDBOX_MODES:
            raise ConfigError(f"sandbox must be one of {', '.join(SANDBOX_MODES)}, not {self.sandbox!r}")
        if not 0 < self.gpu_memory_fraction <= 1:
            raise ConfigError("gpu_memory_fraction must be in (0, 1]")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ConfigError("cpu_threads must be >= 1 (or None: derived)")
        if self.extra_trials is not None and self.extra_trials < 0:
            raise ConfigError("extra_trials must be >= 0")
        for name in ("phase_floor_s", "phase_factor"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, not {getattr(self, name)!r}")
        resolve_judging(self.profile, self.policy)  # a clear error for an unknown policy name or a bad file

    @property
    def judging(self) -> tuple[Profile, Policy]:
        """(how to measure, what rejects): `resolve_judging` of this config's options."""
        return resolve_judging(self.profile, self.policy)

    @property
    def profile_obj(self) -> Profile:
        return PROFILES[self.profile]

    @property
    def policy_obj(self) -> Policy:
        return self.judging[1]

    @property
    def extra_trial_count(self) -> int:
        """Extra trials beyond the reference's distribution (this config's choice, else its profile's)."""
        return self.profile_obj.extra_trials if self.extra_trials is None else self.extra_trials

    @property
    def uses_gpu_clock(self) -> bool:
        """Whether the GPU clock is asked for where it can be: on, and on a GPU (a CPU has the host clock only)."""
        return self.gpu_clock and self.device.startswith("cuda")

    @property
    def uses_exact_fp32(self) -> bool:
        """Whether both models run in true fp32 (this config's choice, else its profile's)."""
        return self.profile_obj.exact_fp32 if self.exact_fp32 is None else self.exact_fp32

    def resolved(self, device: str) -> EvalConfig:
        """The config with `device` and `sizes` made concrete for the machine it runs on."""
        sizes = self.sizes if self.sizes != "auto" else ("small" if device == "cpu" else "full")
        threads = self.cpu_threads or default_cpu_threads()
        return dataclasses.replace(self, device=device, sizes=sizes, cpu_threads=threads)

    def protocol(self) -> dict[str, Any]:
        """The fields that change what is measured, plus the protocol version (cache key, provenance)."""
        keep = ("profile", "correctness_trials", "seed", "sizes", "buckets", "estimator", "target_bucket_ms",
                "min_iters_per_bucket", "max_iters_per_bucket", "warmup_iters", "flush_l2", "bracket_work_ms",
                "max_calls_per_bracket", "warm_buckets", "runner_pairs",
                "round_toward_one", "device", "cpu_threads", "precision_evidence")
        out = {k: getattr(self, k) for k in keep}
        out["exact_fp32"] = self.uses_exact_fp32
        out["extra_trials"] = self.extra_trial_count
        out["version"] = PROTOCOL_VERSION
        if self.device.startswith("cuda"):  # another clock, another measurement
            out["gpu_clock"] = self.gpu_clock
            if self.uses_gpu_clock:
                out["gpu_clock_max_iters"] = self.gpu_clock_max_iters
        else:
            out["cpu_clock"] = CPU_CLOCK_REVISION
        policy = self.policy_obj
        if policy != resolve_policy(PROFILE_POLICIES[self.profile]):  # the verdict under other rules: another result
            out["policy"] = {k: v for k, v in policy.to_dict().items() if k != "notes"}
        return out

    def limits(self) -> dict[str, float]:
        """The wall-clock limits a result was obtained under: recorded with it, not part of its key, so that
        a stored timeout is not reused for a request that allows more time (`ResultsStore.lookup`)."""
        return {"time_limit_s": self.timeout_s, "build_time_limit_s": self.build_timeout_s}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvalConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ConfigError(f"unknown evaluation settings: {', '.join(sorted(unknown))}")
        return cls(**d)


def default_cpu_threads() -> int:
    """Half the cores this process may use, between 1 and 4: the same count for both models."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(4, cores // 2))


def resolve_device(requested: str) -> str:
    """`auto` -> `cuda` when a GPU is visible, else `cpu`; errors clearly when cuda is asked but absent."""
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {requested!r} requested but no CUDA GPU is visible; use device=cpu",
                          fix=("device", "cpu"))
    return requested
