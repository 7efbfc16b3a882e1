"""The evaluation pipeline: static checks -> store lookup -> build -> isolated run -> verdict -> store.

`evaluate_candidate` is the one function every caller uses (CLI, optimize loop, rewards, pools). This
process is the trusted side: it reads the candidate only as text (static analysis, hashing), has builds made
and the candidate run in sandboxed runners (`evaluation.run_candidate`), and alone writes the results store.
Batches go through `scheduler.evaluate_many`.

Two kinds of candidate text: a Python module (`ModelNew`), and a kernel-form launch spec (a JSON object,
`kernel_form.spec.is_kernel_form`), which this process parses, builds in the sandbox and scans
(`kernel_build.prepare_kernel_candidate`) before its runner imports cudal1's own module for it; from there on
both go through the same session.
"""

from __future__ import annotations

import ast
import dataclasses
import logging
import re
import time
from typing import Any

from cudal1.core.forms import is_kernel_form, launches_raw_cuda, uses_load_inline
from cudal1.core.machine import describe_machine
from cudal1.core.syntax import parse as parse_python
from cudal1.core.types import EvalResult, KernelClass, Status
from cudal1.eval.clock.runner_pairs import measured_in_pairs
from cudal1.eval.compile import CompileConfig, CompileService, json_init_inputs, local_arch
from cudal1.eval.config import EvalConfig, resolve_device
from cudal1.eval.decoys import reclassify
from cudal1.eval.evaluation import PreparedBuild, evaluation_protocol, run_candidate
from cudal1.eval.kernel_build import KernelCandidate, needs_a_gpu_result, prepare_kernel_candidate
from cudal1.eval.outcomes import NEEDS_A_GPU
from cudal1.eval.shared.compile_log import build_failure_message
from cudal1.eval.static_checks import static_rejection, static_report
from cudal1.eval.supply import RunnerSupply
from cudal1.policy import apply_policy
from cudal1.policy.decide import decide
from cudal1.tasks.task import Task, size_problem, source_hash, source_problem

logger = logging.getLogger(__name__)


_CUDA_BUILD = re.compile(r"cuda_sources\s*=|CUDAExtension\b|['\"][^'\"\n]*\.cu['\"]")


def needs_a_gpu(result: EvalResult, source: str, cfg: EvalConfig) -> bool:
    """Whether a failure on the CPU says only that the candidate's CUDA code cannot run there: it builds or
    launches CUDA and failed while running. Decided from where it ran, not from the error's text (the CPU
    and CUDA builds of torch fail differently on a machine without a GPU). Its set-up failures are decided by
    its runner's build hooks (`outcomes.setup_verdict`); its compile errors (syntax, a build certain to fail
    on any machine) stay its own."""
    if cfg.device.startswith("cuda") or not (launches_raw_cuda(source) or builds_cuda(source)):
        return False
    return result.status is Status.RUNTIME_ERROR


def builds_cuda(source: str) -> bool:
    """Whether the candidate compiles CUDA code (`load_inline(cuda_sources=...)`, `.cu` files): it cannot run
    without a GPU."""
    return uses_load_inline(source) and _CUDA_BUILD.search(source) is not None


def prepare_build(task: Task, source: str, cfg: EvalConfig) -> PreparedBuild:
    """Build a `load_inline` candidate in the compile service (cached) and return how to import it."""
    if not (cfg.device.startswith("cuda") and uses_load_inline(source)):
        return PreparedBuild()

    service = CompileService(CompileConfig(arch=local_arch(), timeout_s=cfg.build_timeout_s, device=cfg.device))
    init = json_init_inputs(task)
    key = service.key_for(source, init)
    if init is not None and service.cached_result(key) is None:
        # An import-only build made elsewhere (a Ray pool's CPU task) is reused; whatever the candidate
        # builds lazily in ModelNew.__init__ is then built by its runner while it constructs the model.
        bare = service.cached_result(service.key_for(source, None))
        if bare is not None and bare.builds:
            key = bare.key
            return PreparedBuild(service.environment(key), None, service.build_directory(key))
    built = service.build([source], init_inputs=[init])[0]
    prepared = PreparedBuild(service.environment(key), None, service.build_directory(key))
    if built.ok or built.fallback:  # a fallback runs: its runner reports the failed build beside the verdict
        return prepared
    status = Status.TIMEOUT if built.timed_out else Status.COMPILE_ERROR
    prepared.result = EvalResult(status=status, message=build_failure_message(built.log), compile_log=built.log,
                                 task_id=task.id)
    return prepared


def not_a_source_file(task: Task, source: str) -> EvalResult | None:
    """The `unparseable` verdict for a text that cannot be a Python file (a lone surrogate, a NUL) or is over
    `MAX_SOURCE_BYTES`, and `infra_error` for a task whose reference is over it (not the candidate's doing),
    else None; given before anything runs or is stored, by `evaluate_candidate` and by the pools."""
    reference = size_problem(task.source)
    if reference is not None:
        return EvalResult(status=Status.INFRA_ERROR, message=f"the reference of {task.id} cannot be evaluated: "
                          f"it is {reference} (the task's, not the candidate's)", task_id=task.id,
                          candidate_hash=source_hash(source))
    problem = source_problem(source)
    if problem is None:
        return None
    return EvalResult(status=Status.UNPARSEABLE, message=f"the candidate cannot be evaluated: {problem}",
                      task_id=task.id, candidate_hash=source_hash(source))


def evaluate_candidate(task: Task, source: str, config: EvalConfig | None = None, *, store: Any = None,
                       force: bool = False, label: str = "", run_id: str | None = None,
                       runners: RunnerSupply | None = None) -> EvalResult:
    """Evaluate one candidate source against a task; never raises for anything the candidate does.

    `runners` supplies pre-started runners (see `scheduler.evaluate_many`); without it two are started for
    this candidate. Raises `ConfigError` when the profile needs an OS sandbox this host lacks.
    """
    refused = not_a_source_file(task, source)
    if refused is not None:  # nothing to run or store (SQLite cannot hold it either)
        return refused
    started = time.monotonic()
    cfg = (config or EvalConfig()).resolved(resolve_device((config or EvalConfig()).device))
    protocol = evaluation_protocol(cfg)  # what it is measured under: the key's protocol and the sandbox level
    cand_hash = source_hash(source)
    env = describe_machine(cfg.device)
    key = None
    if store is not None:
        key, hit = store.lookup(task.hash, cand_hash, cfg.protocol(), env, force=force, limits=cfg.limits())
        if hit is not None:
            return hit
    result = _evaluate_uncached(task, source, cfg, runners, [str(store.path)] if store is not None else [])
    result = apply_policy(result, source, cfg.policy_obj, task_source=task.source)
    protocol["sizes_applied"] = sizes_applied(task, cfg.sizes)
    result = result.replace(protocol={**protocol, **cfg.limits(), **result.protocol},
                            environment={**env, **result.environment},
                            duration_s=time.monotonic() - started, task_id=task.id, candidate_hash=cand_hash)
    paid_cfg, result = keyed_by_the_clock_that_paid(cfg, result)
    if store is not None and paid_cfg is not cfg:
        key, _ = store.lookup(task.hash, cand_hash, paid_cfg.protocol(), env, force=True)
    log_phases(result)
    if store is not None and result.status.is_verdict:
        # The verdict only: baselines are attached where rows are read, hack cases taken by the judge.
        store.record_evaluation(task, source, result, key=key, label=label, run_id=run_id)
    return result


def keyed_by_the_clock_that_paid(cfg: EvalConfig, result: EvalResult) -> tuple[EvalConfig, EvalResult]:
    """The config and result as the clock that paid them: where the GPU clock was asked for but could not run
    (host arenas, no stream memory operations) the host clock timed the calls, and the result is recorded and
    keyed as the host clock's, so that it never answers a later lookup for the GPU clock's."""
    clock = (result.protocol.get("clock") or {}).get("clock")
    if not (cfg.uses_gpu_clock and clock == "host"):
        return cfg, result
    paid = dataclasses.replace(cfg, gpu_clock=False)
    kept = {k: v for k, v in result.protocol.items() if k not in ("gpu_clock", "gpu_clock_max_iters")}
    return paid, result.replace(protocol={**kept, **paid.protocol()})


def sizes_applied(task: Task, sizes: str) -> str:
    """The sizes the evaluation really used: `small` only when the task defines `SMALL_SIZES` (release and
    KernelBench tasks do not, so they run at full size whatever was asked)."""
    if sizes != "small":
        return sizes
    try:
        names = {t.id for node in parse_python(task.source).body if isinstance(node, ast.Assign)
                 for t in node.targets if isinstance(t, ast.Name)}
    except SyntaxError:
        names = set()
    return "small" if "SMALL_SIZES" in names else "full (the task defines no SMALL_SIZES)"


def log_phases(result: EvalResult) -> None:
    """One INFO line per evaluation (`cudal1 -v`): its verdict, speedup and where its time went."""
    if not logger.isEnabledFor(logging.INFO):
        return
    phases = result.protocol.get("phase_s", {})
    spent = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in phases.items() if isinstance(seconds, float))
    speedup = f" {result.speedup:.2f}x" if result.speedup is not None else ""
    logger.info("%s %s: %s%s in %.1f s (%s)", result.task_id, result.candidate_hash[:8], result.status.value,
                speedup, result.duration_s or 0.0, spent or "no phases")


def _evaluate_uncached(task: Task, source: str, cfg: EvalConfig, runners: RunnerSupply | None,
                       hidden_files: list[str]) -> EvalResult:
    phases: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        phases[name] = now - clock
        clock = now

    def with_phases(result: EvalResult) -> EvalResult:
        return result.replace(protocol={**result.protocol, "phase_s": {**phases, **result.protocol.get("phase_s", {})}})

    if is_kernel_form(source):
        return with_phases(_evaluate_kernel_form(task, source, cfg, runners, hidden_files, lap))
    preset = cfg.policy_obj.static_preset
    report = None if cfg.skip_static else static_report(source, task.source, preset)
    static_flags = list(report.flags) if report is not None else []
    kernel_class = KernelClass(report.kernel_class) if report is not None else None
    lap("static")
    if report is not None:
        message = static_rejection(report, preset)
        if message:
            return with_phases(EvalResult(status=Status.HACK_DETECTED, message=message, flags=static_flags,
                                          kernel_class=kernel_class))
    build = prepare_build(task, source, cfg)
    lap("build")
    if build.result is not None:
        return with_phases(build.result.replace(flags=static_flags, kernel_class=kernel_class))
    result = measured_in_pairs(lambda: run_candidate(task, source, cfg, static_report=report, build=build,
                                                     runners=runners, hidden_files=hidden_files),
                               cfg.runner_pairs)
    lap("run")
    if needs_a_gpu(result, source, cfg):  # not the candidate's fault: no verdict
        result = EvalResult(status=Status.INFRA_ERROR, message=f"{NEEDS_A_GPU} ({result.message[:120]})")
    flags = static_flags + list(result.flags)
    if kernel_class is not None:  # a decoy, or CUDA that never built, counts as what actually ran
        kernel_class = reclassify(kernel_class, flags, builds=result.protocol.get("builds", ()),
                                  own_launcher=launches_raw_cuda(source))
    return with_phases(result.replace(flags=flags, kernel_class=kernel_class))


def _evaluate_kernel_form(task: Task, text: str, cfg: EvalConfig, runners: RunnerSupply | None,
                          hidden_files: list[str], lap: Any) -> EvalResult:
    """A kernel-form candidate: spec, sandboxed build and scan here (`kernel_build`), then the same run as a
    module's, its runner importing cudal1's module for it. A flag of the scan the policy rejects ends it unrun."""
    prepared = prepare_kernel_candidate(task, text, cfg)
    lap("build")
    if not isinstance(prepared, KernelCandidate):
        return prepared
    decision = decide(prepared.flags, cfg.policy_obj)
    if decision.rejects:
        message = "; ".join(f"{f.rule}: {f.message}" for f in decision.rejected[:3])
        return EvalResult(status=Status.HACK_DETECTED, message=message, flags=list(prepared.flags),
                          kernel_class=KernelClass.CUSTOM_CUDA, protocol=prepared.facts())
    if not cfg.device.startswith("cuda"):
        return needs_a_gpu_result(prepared)
    result = measured_in_pairs(lambda: run_candidate(task, prepared.module_source, cfg, static_report=None,
                                                     build=PreparedBuild(), runners=runners,
                                                     hidden_files=hidden_files), cfg.runner_pairs)
    lap("run")
    return result.replace(flags=[*prepared.flags, *result.flags], kernel_class=KernelClass.CUSTOM_CUDA,
                          protocol={**result.protocol, **prepared.facts()})


__all__ = ["builds_cuda", "evaluate_candidate", "not_a_source_file", "prepare_build", "uses_load_inline"]
