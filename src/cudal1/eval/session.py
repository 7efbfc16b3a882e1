"""The trusted side of one evaluation: runs in the parent, never imports candidate code.

A session drives two runners (`runner_process.RunnerProcess`), the reference's and the candidate's, and on a
GPU the device's trusted helper, through a tensor plane (`planes.py`: where tensors lie). It

1. sets both up: the reference's runner loads and constructs the task's model; the candidate's runner first
   does the same (the *twin*), so that its harness can be calibrated before any candidate code exists in its
   process (`measure.Measurement.calibrate`); then it imports the candidate and constructs `ModelNew`;
2. runs every call of either model, trial or timed, in a **bracket** (`call`) of one or more calls (`calls`:
   one, or for code one trusts as many as fill `EvalConfig.bracket_work_ms` of the reference's time, so that
   the harness's cost per bracket is shared; a candidate could read the later calls' inputs): the runner is
   thawed and armed; the parent's clock starts; the calls' inputs (made by the reference's runner from seeds
   drawn here from OS randomness, kept in its staging region) are copied into a slot of the model's arena
   drawn at random, and the L2 cache is flushed (the helper on a GPU); the model is rung to go, calls once
   per set of inputs, commits the outputs and rings done; the helper's end probe waits for whatever the
   calls left on the device and keeps a snapshot of the output region; the parent's clock stops. Trials and
   timed calls are the same request, so the candidate cannot tell them apart but by their data;
3. runs the correctness trials: every pair of calls on the same inputs is compared (`plane.compare`; every
   call of a trial's brackets) and the inputs checked for changes, byte for byte; extra trials on inputs beyond the reference's distribution
   where the profile asks for them;
4. gathers the candidate's guard flags and, on a GPU, one profiled forward (decoy kernels).

Everything the candidate's runner returns is data: a failure it reports can only be its own loss, a success
is never taken on its word. A `Verdict` ends the session early with a status; `InfraFailure` means the
evaluation itself broke (a runner killed from outside, the helper gone) and says nothing of the candidate.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import secrets
import select
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from cudal1.analysis import StaticReport
from cudal1.core import flags as F
from cudal1.core.flags import runtime_flag
from cudal1.core.types import Flag, Severity, Status
from cudal1.eval.config import EvalConfig
from cudal1.eval.correctness import precision_evidence
from cudal1.eval.decoys import decoy_flags
from cudal1.eval.device_helper import DeviceHelper
from cudal1.eval.outcomes import (
    CandidateDied,
    InfraFailure,
    Verdict,
    call_verdict,
    error_hint,
    reference_failure,
    setup_verdict,
)
from cudal1.eval.planes import Runners, TensorPlane, make_plane, max_calls
from cudal1.eval.runner_process import RunnerFailed, RunnerProcess
from cudal1.eval.shared.arena import tree_classes, tree_nbytes
from cudal1.eval.shared.channel import MAX_MESSAGE_BYTES
from cudal1.eval.shared.compare import Comparison
from cudal1.eval.shared.doorbell import ARMED, DONE, GO, DoorbellTimeout
from cudal1.eval.shared.kernel_profile import KernelProfile, KernelStat
from cudal1.eval.shared.protocol import (
    Analysis,
    Analyze,
    BuildOutcome,
    Call,
    Called,
    CandidateReady,
    Describe,
    Described,
    ErrorReply,
    FlagRecord,
    FlagsReply,
    FlushCpu,
    Guards,
    ImportCandidate,
    MakeInputs,
    Message,
    ModelSettings,
    Profile,
    Profiled,
    ReferenceReady,
    SetupReference,
    SetupTwin,
    Side,
    Staged,
    TwinReady,
)

logger = logging.getLogger(__name__)

#: A gated call's runner may take this long to enqueue its calls and arm before the helper opens the gate
#: anyway (its `forward` then waits for the device itself); once it was seen not to arm twice, this many times
#: the median time its armed calls took to arm, at least `ARM_WAIT_SHORT_S` (`Session._arm_wait_s`).
ARM_WAIT_S = 0.5
ARM_WAIT_SHORT_S = 0.005
ARM_WAIT_MARGIN = 4.0
#: The candidate's reply to a call may be this many times the reference's largest (they describe the same
#: outputs; an honest reply is a few hundred bytes): beyond it, the candidate's `protocol.malformed`.
CALL_REPLY_MARGIN = 10
PLAIN_TENSOR_CLASSES = frozenset({"Tensor", "Parameter"})
PLAIN_SEQUENCES = frozenset({"tuple", "list", "return_types"})


def flags_of(records: list[FlagRecord]) -> list[Flag]:
    """The findings a runner reported (checked at decode), as flags."""
    return [Flag(rule=r.rule, severity=Severity(r.severity), message=r.message, line=r.line, source=r.source)
            for r in records]


@dataclass
class SessionFacts:
    """What a session found that decided something, and what a result records (`recorded`)."""

    ref_constants: dict[str, Any] = field(default_factory=dict)
    cand_constants: dict[str, Any] = field(default_factory=dict)
    own_inputs: dict[str, Any] = field(default_factory=dict)
    input_bytes: int = 0
    output_bytes: int = 0
    tensors: str = ""  # "device" or "host" (the plane)
    gpu_memory_gib: dict[str, dict[str, float]] = field(default_factory=dict)
    precision: dict[str, Any] | None = None
    clock: dict[str, Any] | None = None
    calibration: dict[str, Any] | None = None
    samples: dict[str, Any] | None = None
    timing_spent_s: dict[str, float] = field(default_factory=dict)
    beyond_distribution_trials: int | None = None
    builds: list[dict[str, Any]] = field(default_factory=list)  # the candidate's set-up builds: name, ok
    failed_build_log: str = ""  # the first failed build's compiler log (the result's compile_log)
    # Where a stricter profile would have stopped: per rule (`evidence.stricter_tolerance`,
    # `runtime.beyond_distribution`) its first occurrence, where (trial index, -1 for a timed call), the mismatch
    # and the rules of the flags raised before it; what `cudal1.audit.views` derives other verdicts from.
    stops: list[dict[str, Any]] = field(default_factory=list)
    # The step the evaluation was in when it ended ("done" when it ran to the end): a failure during the extra
    # trials is not a failure under a profile that runs none.
    reached: str = ""

    RECORDED = ("clock", "calibration", "gpu_memory_gib", "precision", "samples", "tensors", "timing_spent_s",
                "beyond_distribution_trials", "builds", "stops", "reached")

    def recorded(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.RECORDED if getattr(self, k) not in (None, "", {}, [])}


@dataclass
class CallRecord:
    """One bracketed call: what its runner reported and what the trusted side saw."""

    who: str
    reply: Called
    slot_tree: dict[str, Any]
    bracket_ms: float  # the parent's clock from the start of staging to the end probe's completion
    model_ms: float  # the parent's clock from the go to the model's done
    after: str  # whose bracket came right before, with nothing else on the device between ("" otherwise)
    helper: Any = None  # the helper's `Bracketed` (GPU)
    cpu_ms: float | None = None  # CPU time of the runner's sandbox over the whole request (its cgroup)
    flush_ms: float | None = None  # the parent's clock around a CPU runner's own cache flush
    calls: int = 1  # the model's calls in the bracket (the times above are for all of them)
    stage_ms: float | None = None  # the parent's clock from the bracket's start to the go
    gpu_ms: float | None = None  # the GPU clock (a gated bracket): the helper's events, gate to snapshot
    armed: bool = True  # a gated call: whether the runner had enqueued it all before the gate opened


def new_seed() -> int:
    """A seed from OS randomness: nothing in any runner can predict it (no state of theirs reveals it)."""
    return secrets.randbits(62)


class Deadlines:
    """Per-request time limits: the candidate gets max(floor, factor x the reference's time for the same
    step), never more than what is left of the evaluation's overall limit."""

    def __init__(self, cfg: EvalConfig):
        self.start = time.monotonic()
        self.total_s, self.floor_s, self.factor = cfg.timeout_s, cfg.phase_floor_s, cfg.phase_factor
        # Builds the candidate starts itself (at import, in its first call) share one allowance, which the
        # overall limit leaves out: an evaluation takes at most `timeout_s` + `build_timeout_s`.
        self.build_left_s = cfg.build_timeout_s

    def left(self) -> float:
        return self.total_s - (time.monotonic() - self.start)

    def exclude_build(self, seconds: float) -> None:
        """Leave `seconds` of a build out of the overall limit, taken from the build allowance (beyond it, they
        count)."""
        taken = min(max(0.0, seconds), self.build_left_s)
        self.start += taken
        self.build_left_s -= taken

    def candidate(self, reference_s: float) -> float:
        left = self.left()
        if left <= 0:
            raise Verdict(Status.TIMEOUT, f"the evaluation exceeded its limit of {self.total_s:.0f} s")
        return min(left, max(self.floor_s, self.factor * reference_s))

    def reference(self) -> float:
        return max(self.left(), self.floor_s)


class Session:
    """One evaluation's trusted orchestration (module docstring)."""

    def __init__(self, task: Any, source: str, cfg: EvalConfig, *, ref: RunnerProcess, cand: RunnerProcess,
                 helper: DeviceHelper | None = None, static_report: StaticReport | None = None,
                 candidate_env: dict[str, str] | None = None):
        self.task, self.source, self.cfg = task, source, cfg
        self.runners = Runners(ref=ref, cand=cand)
        self.ref, self.cand, self.helper = ref, cand, helper
        self.static_report = static_report
        self.candidate_env = candidate_env or {}
        self.deadlines = Deadlines(cfg)
        self.flags: list[Flag] = []
        self.phase_s: dict[str, float] = {}
        self.facts = SessionFacts()
        self.plane: TensorPlane | None = None
        self.ref_times: dict[str, float] = {}
        self.device_type = "cuda" if cfg.device.startswith("cuda") else "cpu"
        self.reference_errors: list[float | None] | None = None  # the float32 reference's own (first trial)
        self.rng = random.SystemRandom()  # slots and orders no runner can predict
        self.seq = 0
        self.last = ""
        self.calls = 1  # calls per bracket (`set_calls`)
        self.candidate_imported = False
        # Each call's waits share one deadline, its limit from its start. Real builds the candidate starts in
        # its first forward (a lazy `load_inline`, in the first correctness trial) may take what is left of the
        # build allowance, as those started at import may: that call's seq and when its first note came.
        self.call_deadline = 0.0
        self.build_call: int | None = None
        self.build_started = 0.0
        self.ref_reply_bytes = 0  # the reference's largest reply to a call (the candidate's limit is its multiple)
        # The GPU clock (`EvalConfig.gpu_clock`): set once both runners can gate their calls (`setup`). A model
        # whose calls keep waiting for the device before they arm gets a short arm wait from then on.
        self.gated = False
        self.unarmed = {Side.REF: 0, Side.CAND: 0}
        self.arm_times: dict[str, list[float]] = {Side.REF: [], Side.CAND: []}  # seconds, of the armed calls
        self.helper_failed = False  # the device helper failed after a call that had failed (`call`)

    # ------------------------------------------------------------------ requests

    def ask_reference(self, request: Message, what: str) -> tuple[Message, float]:
        """A request to the reference's runner: (reply, seconds). Its failures are the reference's. It is
        thawed and frozen around each request as the candidate's runner is."""
        t0 = time.perf_counter()
        self.ref.thaw()
        try:
            reply = self.ref.ask(request, timeout_s=self.deadlines.reference())
        except RunnerFailed as failure:
            raise self._reference_failed(failure, what) from None
        finally:
            self.ref.freeze()
        seconds = time.perf_counter() - t0
        if isinstance(reply, ErrorReply):
            if reply.kind == "reference":
                raise reference_failure(reply.message)
            raise InfraFailure(f"the reference's runner failed ({what}): {reply.message or reply.kind}")
        self.note_memory("reference", getattr(reply, "memory", None))
        return reply, seconds

    def _reference_failed(self, failure: RunnerFailed, what: str) -> Exception:
        if failure.killed_from_outside or failure.malformed:
            return InfraFailure(f"the reference's runner failed ({what}): {failure.reason}")
        return reference_failure(f"the reference's runner {failure.reason} ({what})")

    def ask_candidate(self, request: Message, what: str, reference_s: float, *, builds: bool = False) -> Message:
        """A request to the candidate's runner, thawed for it and frozen again after; its failures are its own.
        With `builds`, a real build the candidate starts (its runner says so) may take the build time limit
        (a lie only buys it that limit, once)."""
        timeout = self.deadlines.candidate(reference_s)
        self.cand.thaw()
        try:
            reply = self.cand.ask(request, timeout_s=timeout,
                                  progress_s=self.deadlines.build_left_s if builds else None)
            self.deadlines.exclude_build(self.cand.last_build_s)
        except RunnerFailed as failure:
            raise self._candidate_failed(failure, what, timeout) from None
        finally:
            self.cand.freeze()
        self.note_memory("candidate", getattr(reply, "memory", None))
        return reply

    def _candidate_failed(self, failure: RunnerFailed, what: str, timeout: float) -> Exception:
        if not self.candidate_imported:  # the twin only, no candidate code yet: not the candidate's doing
            return InfraFailure(f"the candidate's runner failed before the candidate's import ({what}): "
                                f"{failure.reason[:200]}")
        if failure.timed_out:
            return Verdict(Status.TIMEOUT, f"{what} did not finish within {timeout:.0f} s")
        if failure.memory:
            return Verdict(Status.RUNTIME_ERROR, f"{what}: {failure.reason}")
        if failure.malformed:
            return Verdict(Status.RUNTIME_ERROR, f"{what}: the candidate's process broke the protocol "
                           f"({failure.reason[:300]})", flag=F.PROTOCOL_MALFORMED)
        if failure.killed_from_outside:
            return CandidateDied(what)
        hint = error_hint(failure.stderr_tail)
        return Verdict(Status.RUNTIME_ERROR, f"{what}: the candidate's process {failure.reason}{hint}")

    def note_memory(self, who: str, memory: Any) -> None:
        """Keep the GPU memory a runner last reported (`harness.gpu_memory`), in GiB, as a fact of the result:
        the peaks say what each model needed. The candidate's figures are its own word, for information."""
        if isinstance(memory, dict):
            noted = {str(k): round(float(v) / 2**30, 3) for k, v in memory.items() if isinstance(v, (int, float))}
            self.facts.gpu_memory_gib[who] = noted

    # ------------------------------------------------------------------ set-up

    def model_settings(self) -> ModelSettings:
        return ModelSettings(device=self.cfg.device, task_id=self.task.id, ref_source=self.task.source,
                             sizes=self.cfg.sizes, seed=self.cfg.seed, threads=int(self.cfg.cpu_threads or 0),
                             exact_fp32=self.cfg.uses_exact_fp32, gpu_memory_fraction=self.cfg.gpu_memory_fraction)

    def setup(self) -> None:
        """Both models ready to be called: the reference, its arenas, and the twin in the candidate's runner."""
        t0 = time.perf_counter()
        reply, seconds = self.ask_reference(SetupReference(model=self.model_settings()), "loading its module")
        assert isinstance(reply, ReferenceReady)
        self.ref_times["setup"] = seconds
        self.facts.ref_constants = reply.constants
        self.phase_s["reference_setup"] = time.perf_counter() - t0
        described, seconds = self.ask_reference(Describe(seed=new_seed()), "its first forward")
        assert isinstance(described, Described)
        self.ref_times["call"] = seconds
        in_bytes, out_bytes = tree_nbytes(described.inputs), tree_nbytes(described.outputs)
        self.facts.input_bytes, self.facts.output_bytes = in_bytes, out_bytes
        t1 = time.perf_counter()
        twin = self._twin()
        self.plane = make_plane(self.runners, self.helper, self.cfg.profile_obj.tolerances)
        self.plane.give_arenas(in_bytes, out_bytes, max_calls(in_bytes, out_bytes, self.cfg.max_calls_per_bracket))
        self.facts.tensors = self.plane.kind
        if self.cfg.uses_gpu_clock:
            self.gated = self.plane.kind == "device" and all(self.plane.gates.get(who) for who in (Side.REF, Side.CAND))
            if not self.gated:
                logger.warning("the GPU clock needs device arenas and stream memory operations in both runners "
                               "(%s): the host clock times this evaluation", self.plane.kind)
        self.phase_s["twin_setup"] = time.perf_counter() - t1
        logger.debug("twin ready in %.1f ms", twin.setup_ms)

    def _twin(self) -> TwinReady:
        reply = self.ask_candidate(SetupTwin(model=self.model_settings(), env=self.candidate_env),
                                   "loading the reference in the candidate's runner", self.ref_times["setup"])
        if isinstance(reply, ErrorReply):
            if reply.kind == "reference":  # the reference's own module failed in the second process
                raise InfraFailure(f"the reference failed in the candidate's runner: {reply.message}")
            raise InfraFailure(f"the candidate's runner failed to start: {reply.message or reply.kind}")
        assert isinstance(reply, TwinReady)
        return reply

    def import_candidate(self) -> None:
        """The candidate's code in its runner (the twin dropped); its set-up failures are its verdicts."""
        t0 = time.perf_counter()
        self.candidate_imported = True  # from here on, what its runner does is the candidate's
        # How the twin armed in this runner is not the candidate's: its arm wait and record start afresh.
        self.unarmed[Side.CAND], self.arm_times[Side.CAND] = 0, []
        reply = self.ask_candidate(ImportCandidate(cand_source=self.source, seed=self.cfg.seed),
                                   "importing and constructing the candidate", self.ref_times["setup"], builds=True)
        if isinstance(reply, ErrorReply):
            raise setup_verdict(reply, self.cfg.device)
        assert isinstance(reply, CandidateReady)
        self.flags += flags_of(reply.flags)
        self._note_builds(reply.builds)
        self.facts.cand_constants, self.facts.own_inputs = reply.constants, reply.own_inputs
        self.phase_s["import"] = reply.import_ms / 1e3
        self.phase_s["construct"] = reply.construct_ms / 1e3
        self.phase_s["candidate_setup"] = time.perf_counter() - t0

    def _note_builds(self, builds: list[BuildOutcome]) -> None:
        """A build that failed while the candidate's set-up went on: its own code caught the failure and runs
        without that extension (a fallback). Reported beside the verdict, which is for what runs."""
        self.facts.builds = [{"name": b.name, "ok": b.ok} for b in builds]
        failed = [b for b in builds if not b.ok]
        if not failed:
            return
        self.facts.failed_build_log = failed[0].log
        names = ", ".join(b.name for b in failed[:3])
        built = sum(b.ok for b in builds)
        self.flags.append(runtime_flag(F.CUSTOM_BUILD_FAILED, (
            f"{len(failed)} of {len(builds)} extension builds failed ({names}); the candidate caught the failure "
            f"and runs {'its other extensions and ' if built else ''}the code it falls back to: the verdict and "
            f"time are for that")[:300]))

    # ------------------------------------------------------------------ calls

    def set_calls(self, reference_ms: float) -> int:
        """Calls per bracket from the reference's time per call: as many as fill `bracket_work_ms`, at most
        what the arenas hold. Set before the candidate exists, so that all its brackets hold as many."""
        assert self.plane is not None
        self.calls = self.plane.calls = calls_per_bracket(reference_ms, self.cfg.bracket_work_ms, self.plane.max_calls)
        return self.calls

    def make_inputs(self, distribution: str = "reference") -> dict[str, Any]:
        """Fresh seeds' inputs (one set per call of a bracket) into the reference's staging region; their tree
        there."""
        self.last = ""  # the reference's runner uses the device in between: the next bracket follows no call
        reply, _ = self.ask_reference(MakeInputs(seed=new_seed(), distribution=distribution, count=self.calls),
                                      "making inputs")
        assert isinstance(reply, Staged)
        return reply.tree

    def call(self, who: str, stage_tree: dict[str, Any], *, flush: bool, what: str,
             builds: bool = False, null: bool = False) -> CallRecord:
        """One bracket of `who`'s calls on the staged inputs (module docstring, step 2). With `builds` (the
        first trial), the candidate's call may start real builds (`_note_build`). Gated (`self.gated`), the
        runner enqueues its calls behind the gate and arms; the helper stages, opens the gate and times the
        calls on the device (`gate` module docstring). `null` (gated): the bracket with no model call, whose
        time is the GPU clock's constant."""
        assert self.plane is not None
        plane, runner, bell = self.plane, self.runners[who], self.plane.doorbells[who]
        self.seq += 1
        seq, slot = self.seq, self.rng.randrange(plane.layouts[who].slots)
        slot_tree = plane.place(who, stage_tree, slot)
        reference_s = max(self.ref_times.get("call", 0.001), 1e-4) * self.calls
        timeout = self.deadlines.reference() if who == Side.REF else self.deadlines.candidate(reference_s)
        gate = seq if self.gated else 0
        assert not null or gate, "a null call is gated"
        request = Call(seq=seq, slot=slot, inputs=slot_tree, gate=gate, null=null)
        plane.open_bracket(who, slot, stage_tree, flush, timeout, gate=gate)
        armed = True
        bracket_done = answered = False
        builds = builds and who == Side.CAND and self.build_call is None
        started = time.monotonic()
        self.call_deadline = started + timeout
        runner.thaw()
        try:
            flush_ms = self._cpu_flush(who, runner) if flush and self.helper is None else None
            cpu0 = runner.cpu_ns()  # the CPU clock of the call's request alone (the flush before it excluded)
            sent = time.perf_counter()
            runner.send(request)
            armed = self._wait_runner(who, runner, bell, ARMED, seq, request, what, builds,
                                      arm_s=self._arm_wait_s(who) if gate else None) is not None
            if gate and armed and not null:  # (a null's arming says nothing of the model's enqueue)
                self.arm_times[who].append(time.perf_counter() - sent)
            t0 = time.perf_counter()
            plane.stage(who, slot, stage_tree, timeout)  # gated: staged, and the gate opened on the device
            t_go = time.perf_counter()
            if not gate:
                bell.ring(GO, seq)
            t_done = self._wait_runner(who, runner, bell, DONE, seq, request, what, builds)
            plane.end(who, timeout)
            t1 = time.perf_counter()
            bracket_done = True
            while (reply := runner.receive(request, self._wait_limit(), notes=builds,
                                           max_bytes=self._call_reply_limit(who))) is None:
                self._note_build(seq)  # a note read after the done word: the build ended
            answered = True
        except RunnerFailed as failure:
            if who == Side.REF:
                raise self._reference_failed(failure, what) from None
            raise self._candidate_failed(failure, what, self.call_deadline - started) from None
        finally:
            if self.build_call == seq:  # the build's time is not the evaluation's (as a build before it is not)
                self.deadlines.exclude_build(time.monotonic() - self.build_started)
            cpu1 = runner.cpu_ns()
            runner.freeze()
            try:
                helper_figures = plane.close_bracket(timeout)
            except InfraFailure:
                if answered:
                    raise
                # The call had already failed, and that failure (the candidate's verdict, most often) is the
                # one on its way: a helper failing after it (a device left hung by the call) does not replace
                # it; the helper is replaced after this evaluation (`helper_failed`).
                logger.warning("the device helper failed after a failed call (%s)", what, exc_info=True)
                self.helper_failed, helper_figures = True, None
            if not bracket_done:
                self.last = ""
        if isinstance(reply, ErrorReply):
            raise self._call_failed(who, reply, what)
        assert isinstance(reply, Called)
        if gate:
            self._check_gated(who, helper_figures, armed, what)
        if who == Side.REF:
            self.ref_reply_bytes = max(self.ref_reply_bytes, runner.channel.last_bytes)
        elif reply.ms > (limit := self.call_deadline - started) * 1e3:
            raise self._candidate_failed(RunnerFailed(f"Called.ms is {reply.ms:g}, beyond the call's "
                                                      f"limit of {limit * 1e3:g} ms", malformed=True), what, limit)
        self.note_memory("reference" if who == Side.REF else "candidate", reply.memory)
        record = CallRecord(who=who, reply=reply, slot_tree=slot_tree, bracket_ms=(t1 - t0) * 1e3,
                            model_ms=(t_done - t_go) * 1e3, after=self.last, helper=helper_figures,
                            cpu_ms=(cpu1 - cpu0) / 1e6 if cpu0 is not None and cpu1 is not None else None,
                            flush_ms=flush_ms, calls=self.calls, stage_ms=(t_go - t0) * 1e3,
                            gpu_ms=helper_figures.gpu_ms if gate and helper_figures is not None else None,
                            armed=armed)
        self.last = who
        return record

    def _arm_wait_s(self, who: str) -> float:
        """How long a gated call may take to arm before the helper opens its gate anyway: a `forward` that
        waits for the device (behind the closed gate) never arms. Short for a model seen doing so twice: a few
        times what its armed calls took (a large eager model may take milliseconds to enqueue, and a wait
        shorter than that would open the gate mid-enqueue and count its host work), or `ARM_WAIT_SHORT_S`
        for one that never armed. A model that slows its arming lengthens only its own evaluation."""
        if self.unarmed[who] < 2:
            return ARM_WAIT_S
        times = self.arm_times[who]
        typical = statistics.median(times) if times else 0.0
        return min(ARM_WAIT_S, max(ARM_WAIT_SHORT_S, ARM_WAIT_MARGIN * typical))

    def _check_gated(self, who: str, figures: Any, armed: bool, what: str) -> None:
        """A gated call's figures: the helper had to write a done word the model's stream never wrote (the
        candidate's runtime error; the reference's, an infrastructure failure)."""
        if not armed:
            self.unarmed[who] += 1
        if figures is None or figures.gpu_ms is None:
            raise InfraFailure(f"the device helper returned no GPU time for a gated call ({what})")
        if figures.rescued:
            if who == Side.REF:
                raise InfraFailure(f"the reference's call never wrote its done word ({what})")
            raise Verdict(Status.RUNTIME_ERROR, f"{what}: the candidate's process rang done before its call's done "
                          "word was written on the device", flag=F.PROTOCOL_MALFORMED)

    def _call_reply_limit(self, who: str) -> int:
        """The largest reply to a call the parent reads: the reference's may be as large as the channel allows
        (a model with many outputs); the candidate's, ten times the reference's largest (the same outputs),
        and never less than a call reply's own limit."""
        if who == Side.REF:
            return MAX_MESSAGE_BYTES
        return max(Called.MAX_BYTES, CALL_REPLY_MARGIN * self.ref_reply_bytes)

    def _cpu_flush(self, who: str, runner: RunnerProcess) -> float:
        """On the CPU each runner evicts its caches itself before a cold call (a flush from another process
        would not reach its core's own caches); the parent's clock around it (`timing.flush_check`)."""
        t0 = time.perf_counter()
        reply = runner.ask(FlushCpu(), self._wait_limit())
        if isinstance(reply, ErrorReply):
            raise Verdict(Status.RUNTIME_ERROR, f"the cache flush failed: {reply.message}") if who == Side.CAND else \
                InfraFailure(f"the reference's cache flush failed: {reply.message}")
        return (time.perf_counter() - t0) * 1e3

    def _note_build(self, seq: int) -> None:
        """A progress note in call `seq` (a real build started): the first moves the call's one deadline to the
        later of its own and the end of the build allowance; later ones change nothing."""
        if self.build_call is None:
            self.build_call, self.build_started = seq, time.monotonic()
            self.call_deadline = max(self.call_deadline, self.build_started + self.deadlines.build_left_s)

    def _wait_limit(self) -> float:
        """How long the current call's next wait may take: what is left to its one deadline."""
        return max(0.0, self.call_deadline - time.monotonic())

    def _wait_runner(self, who: str, runner: RunnerProcess, bell: Any, word: int, seq: int, request: Call,
                     what: str, builds: bool = False, arm_s: float | None = None) -> float | None:
        """Spin until the runner rings `word` for `seq` (the clock when seen); a runner that answers on its
        socket instead (it failed before arming) or dies ends the wait with its failure. With `builds`, progress
        notes on the socket are taken (`_note_build`). With `arm_s`, a wait that lasts that long ends without
        the ring (None), the runner left as it is."""
        arm_deadline = time.monotonic() + arm_s if arm_s is not None else None
        def tick() -> None:
            runner.check_alive()
            # A reply on the socket before the ring (the runner rings first, then replies: re-read the bell).
            if select.select([runner.channel.sock], [], [], 0)[0] and bell.read(word) < seq:
                raise _EarlyReply()
        while True:
            limit = self._wait_limit()
            arm_left = None if arm_deadline is None else max(0.0, arm_deadline - time.monotonic())
            try:
                return bell.wait(word, seq, limit if arm_left is None else min(limit, arm_left), tick=tick)
            except DoorbellTimeout:
                if arm_left is not None and arm_left < limit:
                    return None
                runner.kill("timed out")
                raise RunnerFailed(f"no answer within {limit:.1f} s", timed_out=True) from None
            except _EarlyReply:
                reply = runner.receive(request, limit, notes=builds)
            if reply is None:
                self._note_build(seq)
                continue
            if isinstance(reply, ErrorReply):
                raise self._call_failed(who, reply, what) from None
            raise RunnerFailed("the runner answered before its call was rung", malformed=True) from None

    def _call_failed(self, who: str, reply: ErrorReply, what: str) -> Verdict:
        """The verdict for a call its runner says failed: the reference's own failure, or the candidate's."""
        if who == Side.REF:
            return reference_failure(f"the reference failed ({what}): {reply.message}")
        return call_verdict(reply, what)

    # ------------------------------------------------------------------ correctness

    def pair(self, stage_tree: dict[str, Any], *, flush: bool, what: str,
             builds: bool = False) -> tuple[CallRecord, CallRecord]:
        """Both models called on the same staged inputs, in an order drawn here."""
        order = (Side.REF, Side.CAND) if self.rng.random() < 0.5 else (Side.CAND, Side.REF)
        records = {who: self.call(who, stage_tree, flush=flush, what=what, builds=builds) for who in order}
        return records[Side.REF], records[Side.CAND]

    def trials(self) -> None:
        t0 = time.perf_counter()
        self.facts.reached = "trials"
        for trial in range(self.cfg.correctness_trials):
            self.trial(trial, "reference")
        self.phase_s["correctness"] = time.perf_counter() - t0
        extra = self.cfg.extra_trial_count
        if extra:
            self.facts.reached = "extra trials"
            t1 = time.perf_counter()
            ran = sum(self.trial(self.cfg.correctness_trials + i, "heavy") for i in range(extra))
            self.facts.beyond_distribution_trials = ran
            self.phase_s["beyond_distribution"] = time.perf_counter() - t1

    def trial(self, index: int, distribution: str) -> bool:
        """One trial: a pair of calls on fresh inputs, compared, inputs checked; False when the reference
        itself cannot run on these inputs (extra trials only: then the trial is skipped)."""
        tol = self.cfg.profile_obj.noise_atol()
        # The reference's own float32 error is measured on the first trial; every later trial of its
        # distribution and every verified timed call is held to it (`check_precision`), so a candidate that
        # computes in full precision only on its first call, or only when not timed, is still caught.
        measure_precision = index == 0 and distribution == "reference" and self.cfg.precision_evidence
        errors = measure_precision or (distribution == "reference" and self.reference_errors is not None)
        try:
            stage_tree = self.make_inputs(distribution)
            ref_rec, cand_rec = self.pair(stage_tree, flush=True, what=f"correctness trial {index}",
                                          builds=index == 0 and distribution == "reference")
            reply, _ = self.ask_reference(Analyze(inputs=stage_tree, out=ref_rec.reply.out, noise_atol=tol,
                                                  precision=measure_precision, heavy=distribution == "heavy"),
                                          "a correctness trial")
        except Verdict as verdict:
            if distribution == "heavy" and verdict.flag == F.REFERENCE_ERROR:
                return False
            raise
        assert isinstance(reply, Analysis)
        if distribution == "heavy" and reply.not_finite:
            return False
        every_call = [self.check_output(ref_rec, cand_rec, index, call, beyond=distribution == "heavy",
                                        noise=reply.noise, errors=errors) for call in range(self.calls)]
        self.check_inputs(stage_tree, ref_rec, cand_rec, "a correctness trial")
        if measure_precision:
            if reply.precision_skipped:
                self.facts.precision = {"skipped": reply.precision_skipped}
            else:  # measured on the bracket's first call
                self.reference_errors = list(reply.ref_errors or [])
                self.facts.precision = {"ref_errors": self.reference_errors, "cand_errors": list(every_call[0])}
        if errors:
            for call, cand_errors in enumerate(every_call):
                self.check_precision(cand_errors, f"correctness trial {index}" + (f", call {call}" if call else ""))
        return True

    def check_precision(self, cand_errors: tuple[float | None, ...], where: str) -> None:
        """Flag reduced precision (`correctness.precision_evidence`) once: the candidate's errors of one call
        against the float32 reference's own, measured on the first trial."""
        if self.reference_errors is None or any(f.rule == F.REDUCED_PRECISION for f in self.flags):
            return
        found = precision_evidence(self.reference_errors, list(cand_errors))
        if found is not None:
            self.flags.append(dataclasses.replace(found, message=f"{where}: {found.message}{self._switches_named()}"))

    def _switches_named(self) -> str:
        """The precision switches the candidate set (seen by its guards, else in its source), to name the cause
        of reduced precision; "" when it set none."""
        seen = [f.message for f in self.flags if f.rule == F.GLOBAL_STATE]
        if not seen and self.static_report is not None:
            seen = [f.message for f in self.static_report.flags if f.rule == "global_backend_flags"]
        return f"; the candidate's precision switches: {'; '.join(seen[:3])}" if seen else ""

    def compare(self, ref: CallRecord, cand: CallRecord, trial: int, call: int = 0,
                noise: list[float | None] | None = None, *, errors: bool = False) -> Comparison:
        """The candidate's output of one call of a bracket (as its bracket left it) against the reference's; a
        `Verdict` for outputs that are not plain tensors or cannot be read."""
        cand_tree = call_output(cand.reply.out, call, cand.calls)
        odd = output_classes(cand_tree)
        if odd:
            raise Verdict(Status.HACK_DETECTED, f"{F.OUTPUT_TYPE}: an output is a {odd[0]}, not a plain torch.Tensor",
                          flag=F.OUTPUT_TYPE)
        assert self.plane is not None
        ref_tree = call_output(ref.reply.out, call, ref.calls)
        stricter = self.cfg.profile_obj.stricter_tolerances
        if stricter is not None:
            first = self.plane.compare(ref_tree, cand_tree, trial, noise, errors=errors, tolerances=stricter)
            if first.ok:
                self.note_memory("helper", self.plane.helper_memory)
                return first
            self.note_stop(F.STRICTER_TOLERANCE, trial, first, f"outside the stricter tolerance: {first.message}")
        result = self.plane.compare(ref_tree, cand_tree, trial, noise, errors=errors)
        self.note_memory("helper", self.plane.helper_memory)
        return result

    def note_stop(self, rule: str, trial: int, missed: Comparison, message: str) -> None:
        """Where a stricter profile would have stopped (first time per rule): a flag, and in the facts the
        trial, the mismatch and the flags raised before it, so that its verdict is read from the record."""
        if any(stop["rule"] == rule for stop in self.facts.stops):
            return
        self.facts.stops.append({"rule": rule, "trial": trial, "flags_before": sorted({f.rule for f in self.flags}),
                                 "mismatch": dataclasses.asdict(missed.mismatch) if missed.mismatch else None})
        self.flags.append(runtime_flag(rule, message[:300]))

    def beyond_distribution_failed(self, result: Comparison, where: str, trial: int) -> None:
        """A wrong output on inputs beyond the reference's distribution: the `incorrect` verdict, or, where the
        profile only records it (`Profile.beyond_distribution_decides`), a stop noted and the evaluation goes on."""
        message = f"on inputs beyond the reference's distribution{where}: {result.message}"
        if self.cfg.profile_obj.beyond_distribution_decides:
            raise Verdict(Status.INCORRECT, message, flag=F.BEYOND_DISTRIBUTION, mismatch=result.mismatch)
        self.note_stop(F.BEYOND_DISTRIBUTION, trial, result, message)

    def check_output(self, ref: CallRecord, cand: CallRecord, trial: int, call: int = 0, *, beyond: bool = False,
                     noise: Any = None, errors: bool = False) -> tuple[float | None, ...]:
        """Raise a `Verdict` unless the outputs of the bracket's call `call` match; with `errors`, each output's
        relative difference."""
        result = self.compare(ref, cand, trial, call, noise, errors=errors)
        if result.ok:
            return result.errors
        if beyond:
            self.beyond_distribution_failed(result, " (heavy-tailed, sign-varied)", trial)
            return result.errors
        raise Verdict(Status.INCORRECT, result.message, mismatch=result.mismatch)

    def check_inputs(self, stage_tree: dict[str, Any], ref: CallRecord, cand: CallRecord, where: str) -> None:
        """Inputs changed in place by the candidate (byte for byte) where the reference leaves them unchanged."""
        assert self.plane is not None
        changed, ref_same = self.plane.inputs_changed(stage_tree, ref.slot_tree, cand.slot_tree)
        if changed and ref_same:
            raise Verdict(Status.INCORRECT, f"the candidate modified its input(s) {changed} in place in {where}; "
                          "the reference leaves them unchanged", flag=F.INPUT_MUTATION)

    # ------------------------------------------------------------------ guards and the profiled call

    def guard_flags(self, phase: str) -> None:
        reply = self.ask_candidate(Guards(phase=phase), "the guard check", 1.0)
        if isinstance(reply, FlagsReply):
            self.flags += flags_of(reply.flags)

    def process_flags(self) -> None:
        """Processes the candidate started that still live (seen from outside its sandbox)."""
        extra = len(self.cand.pids()) - self.cand.baseline_processes
        if extra > 0:
            self.flags.append(F.runtime_flag(F.PROCESSES, f"the candidate left {extra} process(es) running",
                                   source="runtime"))

    def profile(self) -> dict[str, Any] | None:
        if self.device_type != "cuda" or self.static_report is None or not self.cfg.profile_kernels:
            return None
        reply = self.ask_candidate(Profile(seed=new_seed()), "the profiled forward", self.ref_times.get("call", 1.0))
        if isinstance(reply, ErrorReply):
            raise call_verdict(reply, "the profiled forward")
        assert isinstance(reply, Profiled)
        record = reply.profile
        prof = KernelProfile(kernels=[KernelStat(k.name, k.calls, k.total_us, k.kind) for k in record.kernels],
                             device=record.device, available=record.available, note=record.note,
                             wall_ms=record.wall_ms)
        self.flags += decoy_flags(prof, self.static_report, min_share=self.cfg.decoy_min_share,
                                  raw_kernel_names=list(reply.raw_kernels))
        return prof.to_dict()

    def close(self) -> None:
        if self.plane is not None:
            self.plane.close()


class _EarlyReply(Exception):
    """The runner answered on its socket while the parent waited for its doorbell."""


def calls_per_bracket(reference_ms: float, work_ms: float, limit: int) -> int:
    """As many calls of `reference_ms` as fit `work_ms` (0: one), between 1 and `limit`."""
    wanted = int(work_ms / max(reference_ms, 1e-6)) if work_ms > 0 else 1
    return max(1, min(limit, wanted))


def call_output(tree: Any, call: int, calls: int) -> dict[str, Any]:
    """The outputs of call `call` in a bracket's output tree (a list with one item per call); a `Verdict`
    when the tree is not such a list (a runner that rewrote its reply)."""
    items = tree.get("items") if isinstance(tree, dict) and tree.get("t") == "seq" else None
    if not isinstance(items, list) or len(items) != calls or not isinstance(items[call], dict):
        raise Verdict(Status.INCORRECT, f"the candidate's outputs could not be read: not the outputs of {calls} "
                      "call(s)")
    return items[call]


def output_classes(tree: Any) -> list[str]:
    """Classes in an output's descriptor tree that are not plain tensors or plain sequences."""
    if not isinstance(tree, dict):
        return ["malformed output"]
    return [c for c in tree_classes(tree) if c not in PLAIN_TENSOR_CLASSES and c not in PLAIN_SEQUENCES]
