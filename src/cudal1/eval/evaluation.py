"""One isolated evaluation: take two runners, drive a session through its phases, turn what it found into a
verdict. Infrastructure failures are retried once on fresh runners and never become the candidate's verdict.

Phases, in order (`session.Session`, `measure.Measurement`): set-up of the reference, the arenas and the
twin -> the calibration (the twin against the reference) -> the candidate's import and construction ->
correctness trials (and extra trials beyond the reference's distribution) -> guard flags -> timing -> guard
flags and leftover processes -> one profiled forward (GPU) -> verdict. Each phase may end the evaluation with
a `Verdict`; the evaluation stops after the trials, and its verdict becomes `hack_detected`, where the verdict
policy rejects a flag (`cudal1.policy.decide`, the one rule).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.analysis import StaticReport
from cudal1.core import flags as F
from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Flag, Severity, Status
from cudal1.eval.cgroups import reap_stale_groups
from cudal1.eval.clock.measure import Measurement
from cudal1.eval.compile import cache_root
from cudal1.eval.config import EvalConfig
from cudal1.eval.device_helper import discard_helper, helper_for, prestart_helper
from cudal1.eval.outcomes import CandidateDied, InfraFailure, Verdict, error_hint
from cudal1.eval.runner_process import (
    SCRATCH_INSIDE,
    RunnerFailed,
    RunnerProcess,
    copy_into_scratch,
    reap_stale_folders,
)
from cudal1.eval.sandbox import SandboxSpec, detect_sandbox
from cudal1.eval.session import Session
from cudal1.eval.static_checks import changed_constants_used
from cudal1.eval.supply import RunnerSupply, core_split, cpu_model_cores
from cudal1.policy.decide import decide

logger = logging.getLogger(__name__)

#: Attempts of one evaluation when its infrastructure fails (a runner killed from outside, the helper lost).
ATTEMPTS = 2


@dataclass
class PreparedBuild:
    """What the compile service prepared for one candidate: the environment its runner imports it in and,
    when sandboxed, the cache folder to copy into the runner; `result` is a verdict when the build failed."""

    env: dict[str, str] = field(default_factory=dict)
    result: EvalResult | None = None
    directory: Path | None = None


# --------------------------------------------------------------------------- one timed evaluation per device

_device_locks: dict[str, threading.Lock] = {}
_device_locks_guard = threading.Lock()


@contextlib.contextmanager
def device_timing_lock(device: str) -> Iterator[None]:
    """Hold `device` for one evaluation: evaluations timed at the same time on one device disturb each other's
    measurements (and, on the CPU, the clock check), so threads of this process and other processes of this
    machine (a file lock in the cache) take turns. Builds and static checks run outside it."""

    name = device if device.startswith("cuda") else "cpu"
    with _device_locks_guard:
        lock = _device_locks.setdefault(name, threading.Lock())
    folder = cache_root() / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    with lock, open(folder / f"{name.replace(':', '_')}.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- limits


def machine_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def candidate_memory_limit(cfg: EvalConfig, data_bytes: int | None) -> int:
    """The candidate's host memory limit: the config's, else derived from the task's data (inputs and
    outputs) and the machine: room for torch, CUDA's host side and a few copies of the data, never more than
    half of the machine (so it fires long before the machine's OOM killer)."""
    if cfg.memory_bytes:
        return cfg.memory_bytes
    half = machine_memory_bytes() // 2
    if data_bytes is None:
        return half
    return int(min(half, max(6 * 2**30, 6 * data_bytes + 4 * 2**30)))


def compile_cache_folder() -> Path:
    """torch.compile's cache for cudal1's own baselines (shared by their warm-up and timed runs)."""

    return cache_root() / "inductor"


def compile_cache_env() -> dict[str, str]:
    return {"TORCHINDUCTOR_CACHE_DIR": str(compile_cache_folder()), "TORCHINDUCTOR_COMPILE_THREADS": "1"}


def sandbox_spec(device: str, hidden_files: list[str] | None = None, *,
                 shared_compile_cache: bool = False) -> SandboxSpec:
    """The sandbox of a model runner: the GPU's device nodes on CUDA; the results store and the caches hidden.
    `shared_compile_cache` (cudal1's own baselines only, never a candidate: it could poison it) binds
    torch.compile's cache read-write, so compiled baselines are warmed once for all their runs."""

    hidden = [str(cache_root())]
    files = [f for f in (hidden_files or []) if f] + [os.environ.get("CUDAL1_STORE", "")]
    spec = SandboxSpec(gpu=device.startswith("cuda"), tmp_bytes=2 * 2**30, hidden_dirs=hidden,
                       hidden_files=[f for f in files if f])
    if shared_compile_cache:
        folder = compile_cache_folder()
        folder.mkdir(parents=True, exist_ok=True)
        info = detect_sandbox()
        if info.drop_to_uid is not None:
            os.chown(folder, info.drop_to_uid, info.drop_to_uid)
        spec.writable.append(str(folder))
        spec.env.update(compile_cache_env())
    return spec


_reaped = threading.Event()


def reap_once() -> None:
    """Once per process: remove the runner folders and control groups that killed parents left behind."""
    if _reaped.is_set():
        return
    _reaped.set()

    removed = reap_stale_folders() + reap_stale_groups()
    if removed:
        logger.info("removed %d folder(s) and group(s) left by runs that were killed", removed)


def runner_supply(device: str, at_most: int | None = None, *, hidden_files: list[str] | None = None,
                  spares: int | None = None, shared_compile_cache: bool = False) -> RunnerSupply:
    """Pre-started runners for a series of evaluations on `device` (close it when done); two per evaluation.

    A runner's start (interpreter, torch, a CUDA context) takes seconds, an evaluation about as long: spares
    started ahead hide the start."""
    # Rationale: a runner starts in ~9 s on an H200 host (CUDA context), an evaluation there takes 2-5 s and
    # uses two: eight spares are the next four evaluations. Each spare holds a CUDA context (~0.5 GB).
    default = 8 if device.startswith("cuda") else 2
    reap_once()
    if device.startswith("cuda"):
        prestart_helper(device)
    n = default if spares is None else spares
    total = None if at_most is None else max(2, 2 * at_most)
    return RunnerSupply(device, spares=max(1, min(n, total)) if total is not None else n, total=total,
                        spec=sandbox_spec(device, hidden_files, shared_compile_cache=shared_compile_cache))


# --------------------------------------------------------------------------- one evaluation


def check_sandbox_policy(cfg: EvalConfig) -> str:
    """The sandbox level this evaluation runs at; raises ConfigError when the config or profile needs a
    sandbox the host does not have."""

    info = detect_sandbox()
    needed = cfg.sandbox == "required" or (cfg.sandbox == "auto" and cfg.profile_obj.require_sandbox)
    if cfg.sandbox == "none":
        return "none (opted out)"
    if needed and info.level == "none":
        raise ConfigError(f"profile {cfg.profile!r} evaluates untrusted code only in an OS sandbox and this host "
                          f"has none ({info.mechanism}); install bubblewrap, or run without one (recorded in every "
                          "result): sandbox=none", fix=("sandbox", "none"))
    return info.level


def evaluation_protocol(cfg: EvalConfig) -> dict[str, Any]:
    """What a result was measured under: the config's protocol fields (the store's cache key) and the sandbox
    level (provenance, recorded with the result, not part of the key)."""
    return {**cfg.protocol(), "sandbox_level": check_sandbox_policy(cfg)}


def run_candidate(task: Any, source: str, cfg: EvalConfig, *, static_report: StaticReport | None,
                  build: PreparedBuild,
                  runners: RunnerSupply | None = None, hidden_files: list[str] | None = None) -> EvalResult:
    """Evaluate one candidate in fresh (or supplied) runners; an infrastructure failure is retried once and
    then reported as `infra_error`. One evaluation at a time holds the device (`device_timing_lock`): on a
    GPU from set-up to the last call, the runners having started before (interpreter, torch, a CUDA
    context); on the CPU the whole evaluation, since starting runners would compete with the timed calls.

    Deaths (the README's trust model): the candidate's runner killed by a signal the parent did not send while
    it runs the candidate's code (`CandidateDied`) is retried once in fresh runners; killed again, at whatever
    step, it is the candidate's `runtime_error`, unless the machine's OOM killer acted during an attempt (then
    `infra_error`). A failure of the reference's runner, the helper or the parent is `infra_error`."""
    cuda = cfg.device.startswith("cuda")
    with contextlib.nullcontext() if cuda else device_timing_lock(cfg.device):
        failure, failures, deaths = "", [], []
        for attempt in range(ATTEMPTS):
            supply = runners or runner_supply(cfg.device, 1, hidden_files=hidden_files, spares=0,
                                              shared_compile_cache=cfg.profile == "trusted")
            oom_kills = machine_oom_kills()
            try:
                asked = time.perf_counter()
                ref, cand = supply.take(), supply.take()
                try:
                    for runner in (ref, cand):
                        runner.wait_ready()
                except RunnerFailed:
                    ref.close()
                    cand.close()
                    raise
                with device_timing_lock(cfg.device) if cuda else contextlib.nullcontext():
                    return _attempt(task, source, cfg, static_report, build, ref, cand,
                                    runners_wait_s=time.perf_counter() - asked)
            except RunnerFailed as exc:
                failure = f"a runner did not start: {exc.reason}{error_hint(exc.stderr_tail)}"
            except CandidateDied as exc:
                failure = str(exc)
                if machine_oom_kills() == oom_kills:  # no sign the machine killed it: the candidate's own death
                    deaths.append(exc.step)
                else:
                    failure += " while the machine's OOM killer acted"
            except InfraFailure as exc:
                failure = str(exc)
                discard_helper(cfg.device)  # the retry starts from a fresh helper, whatever failed
            finally:
                if runners is None:
                    supply.close()
            failures.append(failure)
            logger.warning("evaluation of %s: %s (attempt %d of %d)", task.id, failure, attempt + 1, ATTEMPTS)
    if len(deaths) == ATTEMPTS:
        steps = deaths[0] if len(set(deaths)) == 1 else ", then ".join(deaths)
        return EvalResult(status=Status.RUNTIME_ERROR, task_id=task.id,
                          message=f"the candidate's process was killed (SIGKILL) in both attempts ({steps}), "
                                  "with no sign that the machine did it: counted as its crash")
    return EvalResult(status=Status.INFRA_ERROR, message=f"the evaluation itself failed twice: {failure}",
                      task_id=task.id)


def machine_oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (`/proc/vmstat`), None where it cannot
    be read: evidence that a runner's death came from the machine, not from the candidate."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return None


def _attempt(task: Any, source: str, cfg: EvalConfig, static_report: StaticReport | None, build: PreparedBuild,
             ref: RunnerProcess, cand: RunnerProcess, runners_wait_s: float = 0.0) -> EvalResult:
    started = time.perf_counter()
    policy = cfg.policy_obj  # what rejects, resolved once
    env = dict(build.env)
    if build.directory is not None and cand.info.level != "none":
        copy_into_scratch(cand, build.directory)
        env["TORCH_EXTENSIONS_DIR"] = SCRATCH_INSIDE
    helper = helper_for(cfg.device) if cfg.device.startswith("cuda") else None
    bandwidth = helper.bandwidth_gbps if helper is not None else None
    model_cores = None if helper is not None else cpu_model_cores(int(cfg.cpu_threads or 1))
    for runner in (ref, cand) if model_cores is not None else ():
        runner.pin(model_cores)
    ref.set_memory_limit(machine_memory_bytes() * 4 // 5)
    cand.set_memory_limit(candidate_memory_limit(cfg, None))
    session = Session(task, source, cfg, ref=ref, cand=cand, helper=helper, static_report=static_report,
                      candidate_env=env)
    session.phase_s["runners_wait"] = runners_wait_s  # runners not started yet when the evaluation began
    session.phase_s["prepare"] = time.perf_counter() - started  # the build's copy, the device helper, limits
    timing = profile = None
    status, message, mismatch, compile_log = Status.CORRECT, "", None, ""
    t0 = time.perf_counter()
    pinned = _pin_evaluating_thread(cfg.device)
    try:
        session.facts.reached = "set-up"
        session.setup()
        data = session.facts.input_bytes + session.facts.output_bytes
        cand.set_memory_limit(candidate_memory_limit(cfg, data))
        if cfg.device.startswith("cuda"):
            total = ref.hello.total_memory if ref.hello else 0
            cand.limits.gpu_memory_bytes = int(cfg.gpu_memory_fraction * total) if total else None
        t_cal = time.perf_counter()
        measurement = Measurement(session, bandwidth, cores=len(model_cores or ()) or 1)
        calibration = measurement.calibrate()
        session.phase_s["calibration"] = time.perf_counter() - t_cal
        session.facts.reached = "import"
        session.import_candidate()
        _check_constants(session, source)
        session.trials()
        session.guard_flags("the correctness trials")
        if decide(session.flags, policy).rejects:  # a cheat is not timed
            raise Verdict(Status.HACK_DETECTED, "")
        t1 = time.perf_counter()
        session.facts.reached = "timing"
        timing = _measure(session, bandwidth, calibration, measurement.twin_null, cores=len(model_cores or ()) or 1)
        session.phase_s["timing"] = time.perf_counter() - t1
        session.guard_flags("the timed calls")
        session.process_flags()
        t2 = time.perf_counter()
        session.facts.reached = "profile"
        profile = session.profile()
        session.phase_s["profile"] = time.perf_counter() - t2
        session.facts.reached = "done"
    except Verdict as v:
        status, message, mismatch, compile_log = v.status, v.message, v.mismatch, v.compile_log
        if v.flag in F.RUNTIME_FLAGS:
            session.flags.append(F.runtime_flag(v.flag, v.message[:200]))
        elif v.flag:
            severity = Severity.ERROR if v.status is Status.HACK_DETECTED else Severity.WARNING
            session.flags.append(Flag(v.flag, severity, v.message[:200], source="runtime"))
        if status in (Status.INCORRECT, Status.RUNTIME_ERROR) and cand.proc.poll() is None:
            _last_guard_look(session)  # a cheat that also computes wrongly is still a cheat
    finally:
        session.phase_s["session"] = time.perf_counter() - t0
        _unpin_evaluating_thread(pinned)
        session.close()
        if session.helper_failed:  # (after a failed call; the next evaluation starts a fresh one)
            discard_helper(cfg.device)
        for runner in (ref, cand):
            runner.close()
    rejecting = decide(session.flags, policy).rejected
    if rejecting and status in (Status.CORRECT, Status.INCORRECT):
        status, message = Status.HACK_DETECTED, ""  # a cheat that also computes wrongly is still a cheat
    if status is Status.HACK_DETECTED and not message:
        message = "; ".join(f"{f.rule}: {f.message}" for f in rejecting[:3]) or "rejected"
    if status is Status.CORRECT and timing is None:
        status, message = Status.RUNTIME_ERROR, "the evaluation ended without timing results"
    compile_log = compile_log or session.facts.failed_build_log  # a caught build failure's log too
    result = EvalResult(status=status, message=message, task_id=task.id, flags=session.flags,
                        speedup=timing.speedup if (timing is not None and status is Status.CORRECT) else None,
                        timing=timing if status is Status.CORRECT else None, mismatch=mismatch,
                        compile_log=compile_log,
                        protocol={"phase_s": session.phase_s, **session.facts.recorded(),
                                  **({"kernel_profile": profile} if profile else {})})
    not_finite = result.non_finite_figures()
    if not_finite:
        # Every time a runner reports is checked finite and positive at decode, so this is the evaluator's own
        # arithmetic failing: no verdict (never stored, never paid), rather than a NaN in a reward.
        return result.replace(status=Status.INFRA_ERROR, speedup=None, timing=None,
                              message=f"the measurement produced non-finite figures ({', '.join(not_finite[:3])}): "
                                      "no verdict")
    return result


def _pin_evaluating_thread(device: str) -> set[int] | None:
    """On a GPU host, run this thread (it spins on doorbells during a bracket) on its device's parent core;
    the mask it had, to restore (None: not pinned)."""
    split = core_split(device) if device.startswith("cuda") else None
    if split is None or split.parent is None:
        return None
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, split.parent)  # pid 0: this thread only
    except OSError:
        return None
    return before


def _unpin_evaluating_thread(before: set[int] | None) -> None:
    if before is not None:
        try:
            os.sched_setaffinity(0, before)
        except OSError:
            pass


def _measure(session: Session, bandwidth: float | None, calibration: Any, twin_null: Any, cores: int = 1) -> Any:
    """The timing, measured a second time when the first scattered beyond `noisy_stability` (a busy host, a
    clock change): the steadier is kept and a `timing.noisy` flag shows both, so noise is never silent. The
    calibration's results (`calibration`, the GPU clock's `twin_null`) come from the calibrating measurement."""
    first = Measurement(session, bandwidth, cores=cores).run(calibration, twin_null)
    threshold = session.cfg.noisy_stability
    if not threshold or first.stability <= threshold:
        return first
    facts = session.facts
    first_facts = (facts.clock, facts.samples, facts.timing_spent_s)
    second = Measurement(session, bandwidth, cores=cores).run(calibration, twin_null)
    kept = second if second.stability < first.stability else first
    if kept is first:  # the recorded clock figures, calls and spending are those of the kept timing
        facts.clock, facts.samples, facts.timing_spent_s = first_facts
    session.flags.append(F.runtime_flag(F.NOISY, f"stability {first.stability:.0%} above {threshold:.0%}: measured again; "
                              f"{first.speedup:.2f}x (stability {first.stability:.0%}) then {second.speedup:.2f}x "
                              f"(stability {second.stability:.0%}); the {'second' if kept is second else 'first'} "
                              "is kept", source="runtime"))
    return kept


def _last_guard_look(session: Session) -> None:
    """The candidate's guard flags after an early verdict, when its runner still answers."""
    try:
        session.guard_flags("its last call")
    except (Verdict, InfraFailure, RunnerFailed):
        pass


def _check_constants(session: Session, source: str) -> None:
    """Constants the candidate redefined with another value, that its ModelNew reads: it computes another
    problem than the reference's (hyperparameter manipulation). Equal boilerplate passes."""
    changed = changed_constants_used(source, session.facts.cand_constants, session.facts.ref_constants)
    if changed:
        ref, cand = session.facts.ref_constants, session.facts.cand_constants
        shown = ", ".join(f"{n} = {cand[n]!r} (reference: {ref[n]!r})" for n in changed[:3])
        session.flags.append(F.runtime_flag(F.SIZE_CONSTANTS, f"ModelNew reads redefined constants: {shown}",
                                  source="runtime"))
