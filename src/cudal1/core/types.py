"""Wire types of the evaluator: the verdict of one candidate and the evidence behind it.

These types cross process boundaries (runner -> parent, reward server -> trainer) and land in the results
store, so they are plain frozen dataclasses that round-trip through JSON (`to_dict` / `from_dict`).
Numbers that may be missing are `None`, never `-1.0`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """One verdict per candidate. Order of checks: parse -> compile -> run -> correctness -> guards."""

    UNPARSEABLE = "unparseable"  # no candidate code could be extracted from an LLM completion
    COMPILE_ERROR = "compile_error"  # syntax error, import error, or a failed CUDA/C++ build
    RUNTIME_ERROR = "runtime_error"  # raised, crashed (segfault, illegal address) or ran out of memory
    TIMEOUT = "timeout"  # exceeded the wall-clock limit
    INCORRECT = "incorrect"  # outputs differ from the reference (or wrong type/shape/dtype/device)
    HACK_DETECTED = "hack_detected"  # a guard or a rejecting static rule fired
    CORRECT = "correct"
    # The evaluation itself failed (a runner killed from outside, twice): says nothing about the candidate,
    # is never stored, and earns no reward either way.
    INFRA_ERROR = "infra_error"

    @property
    def is_success(self) -> bool:
        return self is Status.CORRECT

    @property
    def is_verdict(self) -> bool:
        """A verdict on the candidate (stored, rewarded); False for an infrastructure failure."""
        return self is not Status.INFRA_ERROR


class Severity(str, enum.Enum):
    """How much a flag matters. Whether it rejects is decided by the policy profile, not here."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class KernelClass(str, enum.Enum):
    """What kind of optimization a candidate is (design section 4, *Guards*)."""

    CUSTOM_CUDA = "custom_cuda"
    TRITON = "triton"
    PYTORCH_ONLY = "pytorch_only"
    FLAGS_ONLY = "flags_only"


#: The classes whose output comes from the candidate's own kernels (CUDA or Triton).
CUSTOM_CLASSES = (KernelClass.CUSTOM_CUDA, KernelClass.TRITON)


@dataclass(frozen=True)
class Flag:
    """One finding of a static rule or a runtime guard."""

    rule: str  # e.g. "extra_cuda_stream", "guard.global_state"
    severity: Severity
    message: str  # one short line, fed back to the LLM
    line: int | None = None  # 1-based line in the candidate source, for static rules
    source: str = "static"  # "static" | "runtime" | "build" (a kernel-form scan) | "policy" | "judge"

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "severity": self.severity.value, "message": self.message,
                "line": self.line, "source": self.source}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Flag:
        return cls(rule=d["rule"], severity=Severity(d["severity"]), message=d.get("message", ""),
                   line=d.get("line"), source=d.get("source", "static"))


@dataclass(frozen=True)
class Mismatch:
    """Where and how badly a candidate's output differs from the reference."""

    output_index: int  # which output of the forward (0 for a single tensor)
    trial: int  # which correctness trial (or -1 for a timed-run re-check)
    max_abs_error: float
    max_rel_error: float
    bad_elements: int
    total_elements: int
    first_bad_index: list[int]  # multi-index of the worst element
    expected: float
    got: float
    atol: float | None = None  # the tolerance applied: |got - expected| <= atol + rtol * |expected| (None: exact)
    rtol: float | None = None
    scale: float | None = None  # set when atol was shrunk to scale * rtol: the reference's largest magnitude
    noise: float | None = None  # the reference's own float32 error there (|float32 - float64| run), when measured

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Mismatch:
        """Rebuild from `dataclasses.asdict` output; keys this version does not know are ignored. A measured
        figure that travelled as null (`json_ready`: it was NaN or infinite) comes back as NaN."""
        measured = ("max_abs_error", "max_rel_error", "expected", "got")
        return cls(**{f.name: float("nan") if f.name in measured and d[f.name] is None else d[f.name]
                      for f in dataclasses.fields(cls) if f.name in d})

    def describe(self) -> str:
        where = "timed run" if self.trial < 0 else f"trial {self.trial}"
        text = (f"output {self.output_index} ({where}): {self.bad_elements}/{self.total_elements} elements off, "
                f"max abs err {self.max_abs_error:.3g}, max rel err {self.max_rel_error:.3g}; "
                f"at {tuple(self.first_bad_index)} expected {self.expected:.6g} got {self.got:.6g}")
        if self.atol is None or self.rtol is None:
            return text
        text += f" (allowed: {self.atol:.3g} + {self.rtol:.3g} x |expected|"
        if self.scale is not None and self.noise is not None:
            text += (f"; atol = max(scale x rtol, 2 x the reference's own float32 error {self.noise:.3g}): its "
                     f"largest magnitude, {self.scale:.3g}, is below 10x the profile's atol")
        elif self.scale is not None:
            text += (f"; atol = {self.scale:.3g} x rtol: the reference's largest magnitude, {self.scale:.3g}, is "
                     "below 10x the profile's atol")
        return text + ")"


@dataclass(frozen=True)
class TimingStats:
    """Times of reference and candidate measured side by side by one protocol."""

    ref_ms: float  # median per-call time of the reference (cold cache when flushed)
    candidate_ms: float
    speedup: float  # the reference's time over the candidate's time that counts (eval/clock/timing.py)
    stability: float  # relative spread of bucket speedups: (p75 - p25) / median
    bucket_speedups: list[float]
    speedup_warm: float | None = None  # same protocol without the L2 flush (CUDA-L1's condition)
    ref_ms_warm: float | None = None
    candidate_ms_warm: float | None = None
    method: str = ""  # "cuda_events" | "host_timer"
    iterations: int = 0  # timed calls per model
    # The clock outside the candidate's process: median bracket per timed call as the trusted parent saw it
    # (staging, the call, the end probe), for each model. It bounds the candidate's time that counts.
    ref_outside_ms: float | None = None
    candidate_outside_ms: float | None = None
    floor_ms: float | None = None  # the task's physical floor (minimum bytes / measured bandwidth), when known
    verified_calls: int = 0  # timed calls whose outputs the parent compared with the reference's
    # 95 % interval of the speedup: the calls' bootstrap widened by the runner pair's null (eval/clock/timing.py)
    speedup_ci: list[float] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TimingStats:
        """Rebuild from `dataclasses.asdict` output; keys this version does not know are ignored."""
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


@dataclass(frozen=True)
class EvalResult:
    """The verdict on one candidate for one task, with its evidence."""

    status: Status
    message: str = ""  # one or a few short lines: what failed and where (LLM feedback)
    task_id: str = ""
    candidate_hash: str = ""
    speedup: float | None = None  # vs eager reference, cold cache; None unless CORRECT
    timing: TimingStats | None = None
    flags: list[Flag] = field(default_factory=list)
    kernel_class: KernelClass | None = None
    mismatch: Mismatch | None = None
    compile_log: str = ""  # trimmed compiler messages
    baselines: dict[str, float] = field(default_factory=dict)  # baseline name -> speedup vs that baseline
    protocol: dict[str, Any] = field(default_factory=dict)  # resolved protocol/config that produced this
    environment: dict[str, Any] = field(default_factory=dict)  # GPU name, torch/CUDA versions, host
    duration_s: float | None = None  # wall time spent evaluating (compile included)
    cached: bool = False  # True when served from the results store

    @property
    def ref_ms(self) -> float | None:
        return self.timing.ref_ms if self.timing else None

    @property
    def candidate_ms(self) -> float | None:
        return self.timing.candidate_ms if self.timing else None

    @property
    def stability(self) -> float | None:
        return self.timing.stability if self.timing else None

    @property
    def profile(self) -> str:
        """The correctness profile it was measured under (how to measure; `protocol.profile`)."""
        return str(self.protocol.get("profile") or "")

    @property
    def policy(self) -> str:
        """The verdict policy that judged it (what rejects; `protocol.policy`, its base rules in
        `protocol.policy_rules`)."""
        policy = self.protocol.get("policy")
        return str(policy.get("name", "")) if isinstance(policy, dict) else str(policy or "")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; the flat keys the CLI promises (`status`, `speedup`, `ref_ms`, ...) come first. Strict
        JSON: a figure that is NaN or infinite (evidence only, such as a mismatch's largest error where the
        candidate wrote NaN; never a paid figure) is null (`json_ready`)."""
        return json_ready({
            "status": self.status.value,
            "speedup": self.speedup,
            "ref_ms": self.ref_ms,
            "candidate_ms": self.candidate_ms,
            "stability": self.stability,
            "flags": [f.to_dict() for f in self.flags],
            "message": self.message,
            "task_id": self.task_id,
            "candidate_hash": self.candidate_hash,
            "kernel_class": self.kernel_class.value if self.kernel_class else None,
            "speedup_warm": self.timing.speedup_warm if self.timing else None,
            "timing": dataclasses.asdict(self.timing) if self.timing else None,
            "mismatch": dataclasses.asdict(self.mismatch) if self.mismatch else None,
            "compile_log": self.compile_log,
            "baselines": dict(self.baselines),
            "protocol": dict(self.protocol),
            "environment": dict(self.environment),
            "duration_s": self.duration_s,
            "cached": self.cached,
        })

    @classmethod
    def unparseable(cls, task_id: str, why: str | None = None, **evidence: Any) -> EvalResult:
        """The verdict for a completion without extractable code (the one maker of it)."""
        return cls(status=Status.UNPARSEABLE, message=why or "no code found in the completion", task_id=task_id,
                   **evidence)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvalResult:
        return cls(
            status=Status(d["status"]),
            message=d.get("message", ""),
            task_id=d.get("task_id", ""),
            candidate_hash=d.get("candidate_hash", ""),
            speedup=d.get("speedup"),
            timing=TimingStats.from_dict(d["timing"]) if d.get("timing") else None,
            flags=[Flag.from_dict(f) for f in d.get("flags", [])],
            kernel_class=KernelClass(d["kernel_class"]) if d.get("kernel_class") else None,
            mismatch=Mismatch.from_dict(d["mismatch"]) if d.get("mismatch") else None,
            compile_log=d.get("compile_log", ""),
            baselines=dict(d.get("baselines", {})),
            protocol=dict(d.get("protocol", {})),
            environment=dict(d.get("environment", {})),
            duration_s=d.get("duration_s"),
            cached=bool(d.get("cached", False)),
        )

    def replace(self, **changes: Any) -> EvalResult:
        return dataclasses.replace(self, **changes)

    def non_finite_figures(self) -> list[str]:
        """The figures a verdict pays or compares on that are numbers but not finite ones: a CORRECT verdict's
        speedup (not above zero counts too; a missing one is `correct_unmeasured` to a reward) and any number of
        its timing, every baseline's speedup. Empty for a sound result; the evaluator and the results store
        refuse anything else."""
        bad = [f"baselines.{name}" for name, v in self.baselines.items() if not _finite_number(v)]
        if self.status is not Status.CORRECT:
            return bad
        if self.speedup is not None and not (_finite_number(self.speedup) and self.speedup > 0):
            bad.insert(0, "speedup")
        for name, value in (dataclasses.asdict(self.timing) if self.timing else {}).items():
            values = value if isinstance(value, list) else [value]
            if any(isinstance(v, float) and not math.isfinite(v) for v in values):
                bad.append(f"timing.{name}")
        return bad


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def json_ready(value: Any) -> Any:
    """`value` (dicts, lists, scalars) with every non-finite float replaced by None: what JSON can carry (strict
    parsers, and the reward server's encoder, refuse NaN and Infinity). A measured error that overflowed, say
    a mismatch's largest error where the candidate wrote NaN, reads as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value
