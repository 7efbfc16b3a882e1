"""The kernel-only candidate form in the evaluator: parse the spec, build it in the sandbox, scan it, and make
the trusted module the candidate's runner imports.

    build = build_kernel_form(spec, arch="sm_90")          # NVRTC in a sandboxed child; KernelBuildError, ...
    prepared = prepare_kernel_candidate(task, text, cfg)   # a KernelCandidate, or the verdict that ends it

A candidate whose text is a launch spec (`cudal1.kernel_form.spec.is_kernel_form`) is evaluated by the same
session as a PyTorch module (`pipeline.evaluate_candidate`): same trials, inputs, timing and clock. Only what its
runner imports differs: not the candidate's text, which is data, but `cudal1.kernel_form.module.module_source`,
cudal1's own module holding the spec and the cubin as string constants. Before any runner starts, this parent:

- parses the spec and checks it against the kernels' signatures and the task's names: a mistake is
  `compile_error` with the field's one-line message (`steps[0].grid: ...`);
- builds it with NVRTC in a sandboxed child (`run_isolated`: a compiler crash, hang or memory bomb ends the
  child): a compile error is `compile_error` with the trimmed log, a child that failed is `compile_error` too
  (the candidate's source did it); a build that passed is kept by content hash and reused (its cubin scanned
  again; `kernel_build.cached`);
- scans the cubin and the PTX (`kernel_form.scan`): a forbidden construct (a device-side launch, the device
  runtime) is `hack_detected` with `kernel.scan_rejected`, rejected under every policy; a read of %globaltimer
  or %clock is the flag `kernel.timer_read`, judged by the policy (`guarded` rejects it before any run).
On a CPU the build and the scan still give their verdicts; a candidate that passes them gets `infra_error` ("needs
a GPU"), as a raw-CUDA candidate does there: no verdict.

Not covered here: the watchdog for a kernel that spins (the step's time limit ends its runner, `timeout`) and
what device code can reach in its context (docs/kernel_form.md, *Threat model*).
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.core import flags as F
from cudal1.core.files import write_atomically
from cudal1.core.forms import KERNEL
from cudal1.core.types import EvalResult, Flag, KernelClass, Status
from cudal1.eval.config import EvalConfig
from cudal1.eval.isolated import Limits, run_isolated
from cudal1.eval.outcomes import NEEDS_A_GPU
from cudal1.eval.shared.channel import MAX_MESSAGE_BYTES
from cudal1.eval.shared.schema import MAX_SOURCE_CHARS
from cudal1.kernel_form.build import (
    BUILD_ENTRY,
    DEFAULT_ARCH,
    KernelBuild,
    build_here,
    build_payload,
    check_arch,
    finish_build,
)
from cudal1.kernel_form.errors import KernelBuildError, KernelRejectedError, SpecError
from cudal1.kernel_form.expressions import parse_expression
from cudal1.kernel_form.module import MAX_CUBIN_BYTES, module_source
from cudal1.kernel_form.spec import KernelFormSpec, check_against_source, parse_spec
from cudal1.raw_cuda.compiler import cache_key, nvrtc_version, resolve_cache_dir
from cudal1.tasks.task import Task

logger = logging.getLogger(__name__)

BUILD_LIMITS = Limits(timeout_s=120.0, memory_bytes=4 * 2**30)

# Rationale: the generated module crosses to the runner in one message (`ImportCandidate`), JSON-encoded, of at
# most MAX_MESSAGE_BYTES; 4 KiB are left to the message's other fields.
MAX_MODULE_MESSAGE_BYTES = MAX_MESSAGE_BYTES - 4096

#: What a result records of the form (`EvalResult.protocol["form"]`); a PyTorch module's result has no such key.
FORM = KERNEL


def build_kernel_form(spec: KernelFormSpec, *, arch: str = DEFAULT_ARCH, limits: Limits = BUILD_LIMITS,
                      isolate: bool = True, device: str = "cpu") -> KernelBuild:
    """Build `spec.source` for `arch` in a sandboxed child (the evaluator's sandbox and `limits`) and scan it.
    `isolate=False` compiles in this process (trusted sources only, e.g. tests). Raises KernelBuildError (a
    compile error, a child that failed, a step naming a kernel the cubin lacks) or KernelRejectedError (scan)."""
    if not isolate:
        return build_here(spec, arch=arch)
    check_arch(arch)
    started = time.perf_counter()
    payload = build_payload(spec, arch)
    path = _cache_path(payload)
    cached = _cached_reply(path)
    if cached is not None:
        return finish_build(spec, cached, arch, started, cached=True)
    outcome = run_isolated(BUILD_ENTRY, payload, limits=limits, device=device)
    if not outcome.ok:
        raise KernelBuildError(f"the build child {outcome.describe_failure()}", log=outcome.stderr_tail,
                               timed_out=outcome.timed_out)
    value = outcome.value or {}
    build = finish_build(spec, value, arch, started)
    _cache_reply(path, value)  # (only a build that passed the scan)
    return build


def _cache_path(payload: dict[str, Any]) -> Path | None:
    """Where a successful build child's reply for `payload` is kept: keyed by the source, options, arch and
    this machine's NVRTC version (`raw_cuda.compiler.cache_key`), beside the raw-CUDA cubins; None without
    NVRTC here. Many candidates repeat (a policy's samples, a release's kernels)."""
    version = nvrtc_version()
    if version is None:
        return None
    key = cache_key(payload["source"], payload["options"], payload["arch"], "nvrtc-kernel-form", version)
    return resolve_cache_dir().parent / "kernel_form" / f"{key}.json"


def _cached_reply(path: Path | None) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text()) if path is not None and path.is_file() else None
    except (OSError, ValueError):
        return None  # an unreadable entry is built again
    return value if isinstance(value, dict) and value.get("ok") and isinstance(value.get("cubin_b64"), str) else None


def _cache_reply(path: Path | None, value: dict[str, Any]) -> None:
    if path is None or not value.get("ok"):
        return
    try:
        write_atomically(path, json.dumps(value))  # concurrent evaluations share the folder
    except OSError as exc:
        logger.debug("kernel_form: build cache not written (%s)", exc)


@dataclass
class KernelCandidate:
    """A kernel-form candidate ready for its runner: the module it imports instead of the candidate's text, the
    scan's flags, and what the result records."""

    spec: KernelFormSpec
    build: KernelBuild
    module_source: str
    flags: list[Flag] = field(default_factory=list)

    def facts(self) -> dict[str, Any]:
        """The result's record of the form and its build (`EvalResult.protocol`)."""
        return {"form": FORM, "kernel_build": {
            "arch": self.build.arch, "compiler": self.build.compiler, "compile_s": round(self.build.compile_s, 4),
            "wall_s": round(self.build.wall_s, 4), "cached": self.build.cached, "cubin_bytes": len(self.build.cubin),
            "kernels": list(self.build.scan.kernels), "steps": len(self.spec.steps),
            "scan": self.build.scan.to_dict()}}


@functools.cache
def target_arch(device: str) -> str:
    """The cubin's target: the GPU's own arch where candidates run on one, else `DEFAULT_ARCH` (a CPU evaluation
    builds and scans, and runs nothing)."""
    if not device.startswith("cuda"):
        return DEFAULT_ARCH
    import torch

    major, minor = torch.cuda.get_device_capability(torch.device(device))
    return f"sm_{major}{minor}"


def task_constants(task_source: str) -> list[str]:
    """The task module's top-level assigned names: its constants (which of them are integers is known only where
    it runs, so the launcher checks the values)."""
    try:
        tree = ast.parse(task_source)
    except SyntaxError:
        return []
    names: dict[str, None] = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        names.update((t.id, None) for t in targets if isinstance(t, ast.Name))
    return list(names)


def check_task_names(spec: KernelFormSpec, task_source: str) -> None:
    """Every size expression reads only the task's constants and its buffers' `b_numel`, `b_dim0`, `b_dim1`, ...
    (`spec.task_dims`); SpecError naming the field and the unknown name otherwise."""
    constants = task_constants(task_source)
    buffers = "|".join(re.escape(b.name) for b in spec.buffers)
    per_buffer = re.compile(rf"(?:{buffers})_(?:numel|dim\d)")
    for where, text in spec.expressions():
        unknown = sorted(n for n in parse_expression(text).names if n not in constants and not per_buffer.fullmatch(n))
        if unknown:
            raise SpecError(where, f"{text!r}: unknown name {unknown[0]!r} (the task's constants: "
                            f"{', '.join(constants[:20]) or 'none'}; per buffer b: b_numel, b_dim0, b_dim1, ...)")


def _failed(status: Status, message: str, *, log: str = "", flags: list[Flag] | None = None) -> EvalResult:
    return EvalResult(status=status, message=message, compile_log=log, flags=list(flags or []),
                      kernel_class=KernelClass.CUSTOM_CUDA, protocol={"form": FORM})


def prepare_kernel_candidate(task: Task, text: str, cfg: EvalConfig) -> KernelCandidate | EvalResult:
    """The kernel-form candidate `text` parsed, checked, built in the sandbox and scanned, with its trusted module;
    or the verdict that ends its evaluation here (module docstring). Never raises for what the candidate wrote."""
    try:
        spec = parse_spec(text)
        check_against_source(spec)
        check_task_names(spec, task.source)
    except SpecError as exc:
        return _failed(Status.COMPILE_ERROR, f"kernel-form spec: {exc}")
    try:
        build = build_kernel_form(spec, arch=target_arch(cfg.device), limits=Limits(
            timeout_s=min(BUILD_LIMITS.timeout_s, cfg.build_timeout_s), memory_bytes=BUILD_LIMITS.memory_bytes))
    except KernelRejectedError as exc:
        flag = F.runtime_flag(F.KERNEL_SCAN_REJECTED, str(exc)[:300], source="build")
        return _failed(Status.HACK_DETECTED, f"{F.KERNEL_SCAN_REJECTED}: {exc}", flags=[flag])
    except KernelBuildError as exc:
        return _failed(Status.TIMEOUT if exc.timed_out else Status.COMPILE_ERROR, str(exc), log=exc.log or str(exc))
    if len(build.cubin) > MAX_CUBIN_BYTES:
        return _failed(Status.COMPILE_ERROR, f"the cubin is {len(build.cubin)} bytes; the kernel form takes at most "
                       f"{MAX_CUBIN_BYTES}")
    flags = [F.runtime_flag(F.KERNEL_TIMER_READ, finding, source="build") for finding in build.scan.flags]
    source = module_source(text, build.cubin, reference_source=task.source, task_id=task.id,
                           sizes=cfg.sizes)
    size = len(json.dumps(source))  # what the module takes in the runner's import message
    if size > MAX_MODULE_MESSAGE_BYTES or len(source) > MAX_SOURCE_CHARS:
        return _failed(Status.COMPILE_ERROR, f"the module for this candidate (its spec, its cubin of "
                       f"{len(build.cubin)} bytes and the task's reference) takes {size} bytes, over the "
                       f"{MAX_MODULE_MESSAGE_BYTES} of a runner's message: a smaller source or cubin")
    return KernelCandidate(spec, build, source, flags)


def needs_a_gpu_result(candidate: KernelCandidate) -> EvalResult:
    """The `infra_error` of a kernel-form candidate evaluated on a CPU, after its build and scan passed."""
    return EvalResult(status=Status.INFRA_ERROR, flags=list(candidate.flags), kernel_class=KernelClass.CUSTOM_CUDA,
                      message=f"{NEEDS_A_GPU} (kernel form: its spec, build for {candidate.build.arch} and scan "
                              "passed; its kernels run only on a GPU)", protocol=candidate.facts())


__all__ = ["BUILD_LIMITS", "FORM", "KernelCandidate", "build_kernel_form", "needs_a_gpu_result", "prepare_kernel_candidate",
           "check_task_names", "target_arch", "task_constants"]
