"""The trusted side of one evaluation: runs in the parent, never imports candidate code.

A session drives two runners (`processes.RunnerProcess`), the reference's and the candidate's, and on a GPU
the device's trusted helper (cache flushes, comparisons on the GPU). It

1. sets both up (the reference loads and constructs its model; the candidate's runner imports the candidate
   and constructs `ModelNew`), under deadlines relative to the reference's own time;
2. runs the correctness trials: the reference's runner makes the inputs from a seed the parent drew from OS
   randomness and commits inputs and outputs to its arena; the parent copies the inputs into the candidate's
   arena, the candidate's runner calls its model on them and commits outputs and inputs after the call; the
   parent compares what it copied out (`correctness.compare_outputs`) and checks that the inputs are
   unchanged, byte for byte; extra trials on inputs beyond the reference's distribution where the profile
   asks for them;
3. times both (`measure.measure`): every timed call on fresh inputs, outputs of a secret sample of calls
   verified here, reported times cross-checked against the parent's own clock;
4. gathers the candidate's guard flags and, on a GPU, one profiled forward (decoy kernels).

Everything the candidate's runner returns is data: a failure it reports can only be its own loss, a success
is never taken on its word. A `Verdict` ends the session early with a status; `InfraFailure` means the
evaluation itself broke (a runner killed from outside, the helper gone) and says nothing of the candidate.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from cudal1.analysis import StaticReport
from cudal1.core import flags as F
from cudal1.core.types import Flag, Mismatch, Severity, Status, TimingStats
from cudal1.eval.channel import Arena, ArenaFull, UnsupportedValue, changed_inputs, tree_classes, tree_nbytes
from cudal1.eval.config import EvalConfig
from cudal1.eval.correctness import Comparison, OutputHackError, compare_outputs, precision_evidence
from cudal1.eval.processes import RunnerFailed, RunnerProcess
from cudal1.eval.profiling import KernelProfile, decoy_flags

logger = logging.getLogger(__name__)

#: Room in the candidate's `out` arena beyond the reference's outputs and inputs (alignment, small extras).
ARENA_SLACK_BYTES = 1 << 16
PLAIN_TENSOR_CLASSES = frozenset({"Tensor", "Parameter"})
PLAIN_SEQUENCES = frozenset({"tuple", "list", "return_types"})
#: Candidate errors at setup, by the kind its runner reports -> the status they mean.
SETUP_FAILURES = {"syntax": Status.COMPILE_ERROR, "import": Status.COMPILE_ERROR, "build": Status.COMPILE_ERROR,
                  "no_modelnew": Status.COMPILE_ERROR, "construct": Status.RUNTIME_ERROR, "oom": Status.RUNTIME_ERROR}


class Verdict(Exception):
    """Ends the session early with a status and its evidence."""

    def __init__(self, status: Status, message: str, *, flag: str | None = None, mismatch: Mismatch | None = None,
                 compile_log: str = ""):
        super().__init__(message)
        self.status, self.message, self.flag, self.mismatch, self.compile_log = status, message, flag, mismatch, compile_log


class InfraFailure(Exception):
    """The evaluation itself failed (not the candidate): retried, never stored."""


@dataclass
class SessionOutcome:
    """What a session found; `pipeline` turns it into an `EvalResult`."""

    status: Status
    message: str = ""
    flags: list[Flag] = field(default_factory=list)
    timing: TimingStats | None = None
    mismatch: Mismatch | None = None
    compile_log: str = ""
    kernel_profile: dict[str, Any] | None = None
    phase_s: dict[str, float] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)  # constants, own inputs, noise: what decided what


def new_seed() -> int:
    """A seed from OS randomness: nothing in any runner can predict it (no state of theirs reveals it)."""
    return secrets.randbits(62)


class Deadlines:
    """Per-request time limits: the candidate gets max(floor, factor x the reference's time for the same
    step), never more than what is left of the evaluation's overall limit."""

    def __init__(self, cfg: EvalConfig):
        self.start = time.monotonic()
        self.total_s, self.floor_s, self.factor = cfg.timeout_s, cfg.phase_floor_s, cfg.phase_factor

    def left(self) -> float:
        return self.total_s - (time.monotonic() - self.start)

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
                 helper: RunnerProcess | None = None, static_report: Any = None,
                 candidate_env: dict[str, str] | None = None):
        self.task, self.source, self.cfg = task, source, cfg
        self.ref, self.cand, self.helper = ref, cand, helper
        self.helper_arena: Arena | None = None
        self.static_report = static_report
        self.candidate_env = candidate_env or {}
        self.deadlines = Deadlines(cfg)
        self.flags: list[Flag] = []
        self.phase_s: dict[str, float] = {}
        self.facts: dict[str, Any] = {}
        self.ref_arena: Arena | None = None
        self.cand_arena: Arena | None = None
        self.ref_times: dict[str, float] = {}
        self.cpu_flush_ms: dict[str, list[float]] = {"ref": [], "cand": []}  # the parent's clock (`flush_check`)
        self.device_type = "cuda" if cfg.device.startswith("cuda") else "cpu"
        self.candidate_ran = False
        # Device arenas (`device_arena`): made by the helper, which alone maps both; the parent moves descriptors.
        self.device_arenas = False
        self.sid = secrets.token_hex(8)
        self.reference_errors: list[float | None] | None = None  # the float32 reference's own (`trial`)

    # ------------------------------------------------------------------ requests

    def ask_reference(self, message: dict[str, Any], what: str) -> tuple[dict[str, Any], float]:
        """A request to the reference's runner: (reply, seconds). Its failures are the reference's. It is
        thawed and frozen around each request as the candidate's runner is, so that both come to their calls
        alike (waking from the freezer costs a request ~0.1 ms of the parent's clock on a GPU host)."""
        t0 = time.perf_counter()
        self.ref.thaw()
        try:
            reply = self.ref.request(message, timeout_s=self.deadlines.reference())
        except RunnerFailed as failure:
            if failure.killed_from_outside:
                raise InfraFailure(f"the reference's runner was killed from outside ({what})") from None
            raise Verdict(Status.RUNTIME_ERROR, f"the reference's runner {failure.reason} ({what})"
                          + ("" if self.candidate_ran else ", not the candidate"), flag=F.REFERENCE_ERROR) from None
        finally:
            self.ref.freeze()
        seconds = time.perf_counter() - t0
        self.note_memory("reference", reply, message.get("op"))
        if not reply.get("ok"):
            text = str(reply.get("message", "failed"))
            if reply.get("error") == "reference":
                raise Verdict(Status.RUNTIME_ERROR, text + ("" if self.candidate_ran else ", not the candidate"),
                              flag=F.REFERENCE_ERROR)
            raise InfraFailure(f"the reference's runner failed ({what}): {text}")
        return reply, seconds

    def ask_candidate(self, message: dict[str, Any], what: str, reference_s: float) -> dict[str, Any]:
        """A request to the candidate's runner, thawed for it and frozen again after; its failures are its own."""
        timeout = self.deadlines.candidate(reference_s)
        self.cand.thaw()
        self.candidate_ran = True
        try:
            return self._candidate_reply(message, what, timeout)
        except RunnerFailed as failure:
            if failure.timed_out:
                raise Verdict(Status.TIMEOUT, f"{what} did not finish within {timeout:.0f} s") from None
            if failure.memory:
                raise Verdict(Status.RUNTIME_ERROR, f"{what}: {failure.reason}") from None
            if failure.killed_from_outside:
                raise InfraFailure(f"the candidate's runner was killed from outside ({what})") from None
            hint = error_hint(failure.stderr_tail)
            raise Verdict(Status.RUNTIME_ERROR, f"{what}: the candidate's process {failure.reason}{hint}") from None
        finally:
            self.cand.freeze()

    def _candidate_reply(self, message: dict[str, Any], what: str, timeout: float) -> dict[str, Any]:
        """The reply, waiting past progress notes: a real build started by the candidate extends the wait to
        the build time limit (its runner says so; a lie only buys it that limit)."""
        reply = self.cand.request(message, timeout_s=timeout)
        while reply.get("op") == "progress":
            reply = self.cand.wait_reply(timeout_s=max(timeout, self.cfg.build_timeout_s))
        self.note_memory("candidate", reply, message.get("op"))
        return reply

    def note_memory(self, who: str, reply: dict[str, Any], op: Any = None) -> None:
        """Keep the GPU memory a runner last reported (`calls.gpu_memory`), in GiB, as a fact of the result:
        the peaks say what each model needed. The candidate's figures are its own word, for information."""
        memory = reply.get("memory")
        if isinstance(memory, dict):
            noted = {str(k): round(float(v) / 2**30, 3) for k, v in memory.items() if isinstance(v, (int, float))}
            self.facts.setdefault("gpu_memory_gib", {})[who] = noted
            logger.debug("GPU memory of the %s after %s: %s", who, op or "a request", noted)

    def flush(self, who: str) -> float | None:
        """Evict caches before a cold timed call of `who`: from the helper's context on a GPU (the candidate
        cannot skip it), in the runner itself on the CPU. Returns the helper's own time for it (GPU)."""
        if self.helper is not None:
            try:
                reply = self.helper.request({"op": "flush"}, timeout_s=self.deadlines.reference())
            except RunnerFailed as failure:
                raise InfraFailure(f"the device helper failed: {failure.reason}") from None
            return float(reply.get("ms", 0.0)) if reply.get("ok") else None
        if who == "ref":
            self.ask_reference({"op": "flush"}, "flush")
        else:
            self.ask_candidate({"op": "flush"}, "the cache flush", self.ref_times.get("call", 1.0))
        self.cpu_flush_ms[who].append((self.ref if who == "ref" else self.cand).last_request_ms)
        return None

    # ------------------------------------------------------------------ phases

    def setup(self) -> None:
        common = {"device": self.cfg.device, "task_id": self.task.id, "ref_source": self.task.source,
                  "sizes": self.cfg.sizes, "seed": self.cfg.seed, "threads": self.cfg.cpu_threads,
                  "exact_fp32": self.cfg.uses_exact_fp32, "gpu_memory_fraction": self.cfg.gpu_memory_fraction}
        t0 = time.perf_counter()
        reply, seconds = self.ask_reference({"op": "setup", "role": "reference", **common}, "loading its module")
        self.ref_times["setup"] = seconds
        self.facts["ref_constants"] = reply.get("constants", {})
        self.phase_s["reference_setup"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        message = {"op": "setup", "role": "candidate", **common, "cand_source": self.source,
                   "env": self.candidate_env}
        reply = self.ask_candidate(message, "importing and constructing the candidate", seconds)
        if not reply.get("ok"):
            status = SETUP_FAILURES.get(str(reply.get("error")), Status.RUNTIME_ERROR)
            if reply.get("error") == "reference":
                status = Status.RUNTIME_ERROR
            raise Verdict(status, str(reply.get("message", "setup failed")), compile_log=str(reply.get("compile_log", "")))
        self.flags += [Flag.from_dict(f) for f in reply.get("flags", []) if isinstance(f, dict)]
        self.facts.update(cand_constants=reply.get("constants", {}), own_inputs=reply.get("own_inputs", {}))
        self.phase_s["import"] = float(reply.get("import_ms", 0.0)) / 1e3
        self.phase_s["construct"] = float(reply.get("construct_ms", 0.0)) / 1e3
        self.phase_s["candidate_setup"] = time.perf_counter() - t1

    def size_arenas(self) -> None:
        """Run the reference once to learn its input and output sizes, then give both runners their arenas:
        in device memory where the helper can share it (`device_arena`), else in host memory."""
        reply, seconds = self.ask_reference({"op": "describe", "seed": new_seed()}, "its first forward")
        self.ref_times["call"] = seconds
        in_bytes, out_bytes = tree_nbytes(reply["inputs"]), tree_nbytes(reply["outputs"])
        self.facts.update(input_bytes=in_bytes, output_bytes=out_bytes)
        if self._device_arenas(in_bytes, out_bytes + in_bytes + ARENA_SLACK_BYTES):
            self.facts["tensors"] = "device"
            return
        self.facts["tensors"] = "host"
        self.ref_arena = Arena.create(in_bytes, out_bytes + in_bytes + ARENA_SLACK_BYTES)
        self.cand_arena = Arena.create(in_bytes, out_bytes + in_bytes + ARENA_SLACK_BYTES)
        if self.helper is not None:  # room for one output of each model
            self.helper_arena = Arena.create(0, 2 * (out_bytes + ARENA_SLACK_BYTES))
            try:
                self.helper.request({"op": "arena", "in_bytes": 0}, timeout_s=60.0, fds=(self.helper_arena.fd,))
            except RunnerFailed as failure:
                raise InfraFailure(f"the device helper failed to map its arena: {failure.reason}") from None
        for runner, arena in ((self.ref, self.ref_arena), (self.cand, self.cand_arena)):
            self._give_arena(runner, {"in_bytes": arena.in_bytes}, arena.fd)

    def _device_arenas(self, in_bytes: int, out_bytes: int) -> bool:
        """Ask the helper for the two runners' device arenas and hand each runner its own; False (host
        arenas then) where the helper cannot make them."""
        if self.helper is None or not self.helper.device_arenas:
            return False
        size = [in_bytes, out_bytes]
        try:
            reply, fds = self.helper.request_descriptors({"op": "device_arenas", "sid": self.sid, "ref": size,
                                                          "cand": size}, timeout_s=60.0, count=2)
        except RunnerFailed as failure:
            raise InfraFailure(f"the device helper failed to make device arenas: {failure.reason}") from None
        try:
            if not reply.get("ok") or len(fds) != 2:
                logger.warning("device arenas unavailable, host arenas instead: %s", reply.get("message"))
                return False
            self.device_arenas = True
            for runner, fd, who in ((self.ref, fds[0], "ref"), (self.cand, fds[1], "cand")):
                self._give_arena(runner, {**reply[who], "device": True}, fd)
        finally:
            for fd in fds:
                os.close(fd)
        return True

    def _give_arena(self, runner: RunnerProcess, spec: dict[str, Any], fd: int) -> None:
        runner.thaw()
        try:
            reply = runner.request({"op": "arena", **spec}, timeout_s=60.0, fds=(fd,))
        except RunnerFailed as failure:
            if runner is self.cand:
                raise Verdict(Status.RUNTIME_ERROR, f"the candidate's process {failure.reason}") from None
            raise InfraFailure(f"the reference's runner failed to map its arena: {failure.reason}") from None
        finally:
            runner.freeze()
        if not reply.get("ok"):
            if runner is self.cand:
                raise Verdict(Status.RUNTIME_ERROR, f"the candidate's process failed to map its arena: "
                              f"{reply.get('message')}")
            raise InfraFailure(f"mapping an arena failed: {reply.get('message')}")

    def helper_request(self, message: dict[str, Any], what: str) -> dict[str, Any]:
        """A request to the device's helper (naming this session's device arenas where it has them); its
        failures are the infrastructure's."""
        assert self.helper is not None
        if self.device_arenas:
            message = {**message, "sid": self.sid}
        try:
            reply = self.helper.request(message, timeout_s=self.deadlines.reference())
        except RunnerFailed as failure:
            raise InfraFailure(f"the device helper failed ({what}): {failure.reason}") from None
        if not reply.get("ok"):
            raise InfraFailure(f"the device helper failed ({what}): {reply.get('message')}")
        self.note_memory("helper", reply, message.get("op"))
        return reply

    def close(self) -> None:
        for arena in (self.ref_arena, self.cand_arena, self.helper_arena):
            if arena is not None:
                arena.close()
        if self.helper is not None:  # its device arenas, and what its comparisons cached
            try:
                self.helper.request({"op": "drop_arenas", "sid": self.sid}, timeout_s=30.0)
            except RunnerFailed:
                pass  # a helper that is gone took the arenas with it

    def trials(self) -> None:
        t0 = time.perf_counter()
        for trial in range(self.cfg.correctness_trials):
            self.trial(trial, "reference")
        self.phase_s["correctness"] = time.perf_counter() - t0
        extra = self.cfg.extra_trial_count
        if extra:
            t1 = time.perf_counter()
            ran = sum(self.trial(self.cfg.correctness_trials + i, "heavy") for i in range(extra))
            self.facts["beyond_distribution_trials"] = ran
            self.phase_s["beyond_distribution"] = time.perf_counter() - t1

    def trial(self, index: int, distribution: str) -> bool:
        """One trial (module docstring, step 2); False when the reference itself cannot run on these inputs
        (extra trials only: then the trial is skipped)."""
        tol = self.cfg.profile_obj.tolerance("float32").atol
        # The reference's own float32 error is measured on the first trial; every later trial of its
        # distribution and every verified timed call is held to it (`check_precision`), so a candidate that
        # computes in full precision only on its first call, or only when not timed, is still caught.
        measure_precision = index == 0 and distribution == "reference" and self.cfg.precision_evidence
        errors = measure_precision or (distribution == "reference" and self.reference_errors is not None)
        message = {"op": "trial", "seed": new_seed(), "distribution": distribution, "noise_atol": tol,
                   "precision": measure_precision}
        try:
            reply, seconds = self.ask_reference(message, "a correctness trial")
        except Verdict:
            if distribution == "heavy":
                return False
            raise
        self.ref_times["trial"] = max(self.ref_times.get("trial", 0.0), seconds)
        ref_out, ref_after = _halves(reply["out"])
        if distribution == "heavy" and reply.get("not_finite"):
            return False
        in_tree = self._cross_inputs(reply["in"])
        cand = self.ask_candidate({"op": "trial", "inputs": in_tree}, f"correctness trial {index}", seconds)
        if not cand.get("ok"):
            raise call_verdict(cand, f"trial {index}")
        try:
            cand_out, cand_after = _halves(cand["out"])
        except (KeyError, TypeError, ValueError):
            raise Verdict(Status.INCORRECT, "the candidate's outputs could not be read") from None
        cand_errors = self.check_output(ref_out, cand_out, index, beyond=distribution == "heavy",
                                        noise=reply.get("noise"), errors=errors)
        self._check_inputs(reply["in"], ref_after, cand_after, "a correctness trial")
        if measure_precision:
            if reply.get("precision_skipped"):
                self.facts["precision"] = {"skipped": reply["precision_skipped"]}
            else:
                self.reference_errors = list(reply.get("ref_errors") or [])
                self.facts["precision"] = {"ref_errors": self.reference_errors, "cand_errors": list(cand_errors)}
        if errors:
            self.check_precision(cand_errors, f"correctness trial {index}")
        return True

    def check_precision(self, cand_errors: tuple[float | None, ...], where: str) -> None:
        """Flag reduced precision (`correctness.precision_evidence`) once: the candidate's errors of one call
        against the float32 reference's own, measured on the first trial."""
        if self.reference_errors is None or any(f.rule == F.REDUCED_PRECISION for f in self.flags):
            return
        found = precision_evidence(self.reference_errors, list(cand_errors))
        if found is not None:
            self.flags.append(dataclasses.replace(found, message=f"{where}: {found.message}"))

    def _cross_inputs(self, tree: dict[str, Any]) -> dict[str, Any]:
        """Copy a trial's inputs from the reference's arena into the candidate's; their tree there."""
        if self.device_arenas:
            return self.helper_request({"op": "copy", "tree": tree, "src": "ref", "dst": "cand", "region": "in"},
                                       "copying a trial's inputs")["tree"]
        assert self.ref_arena is not None and self.cand_arena is not None
        try:
            return self.cand_arena.copy_from(self.ref_arena, tree, "in")[0]
        except Exception as exc:  # noqa: BLE001 - inputs the arena cannot carry are the task's problem
            raise InfraFailure(f"the reference's inputs cannot cross to the candidate: {exc}") from None

    def compare(self, ref_tree: dict[str, Any], cand_tree: dict[str, Any], trial: int,
                noise: list[float | None] | None = None, *, errors: bool = False) -> Comparison:
        """The candidate's output against the reference's (`correctness.Comparison`), as they lie in the two
        arenas (the candidate's runner is frozen: nothing changes them meanwhile). On a GPU the helper compares,
        where they lie (device arenas) or from copies of both in its own arena; on the CPU this process does.
        With `errors`, a match carries each output's relative difference. Raises a `Verdict` for outputs that
        are not plain tensors or cannot be read."""
        odd = output_classes(cand_tree)
        if odd:
            raise Verdict(Status.HACK_DETECTED, f"{F.OUTPUT_TYPE}: an output is a {odd[0]}, not a plain torch.Tensor",
                          flag=F.OUTPUT_TYPE)
        ref_at, cand_at = ref_tree, cand_tree  # where the helper reads them: device arenas as they lie
        if not self.device_arenas:
            assert self.ref_arena is not None and self.cand_arena is not None
            try:
                if self.helper is None or self.helper_arena is None:
                    return compare_outputs(self.ref_arena.unpack(ref_tree), self.cand_arena.unpack(cand_tree),
                                           self.cfg.profile_obj, trial, noise=noise, errors=errors)
                ref_at, offset = self.helper_arena.copy_from(self.ref_arena, ref_tree, "out")
                cand_at, _ = self.helper_arena.copy_from(self.cand_arena, cand_tree, "out", offset)
            except OutputHackError as exc:
                raise Verdict(Status.HACK_DETECTED, f"{F.OUTPUT_TYPE}: {exc}", flag=F.OUTPUT_TYPE) from None
            except (UnsupportedValue, ArenaFull, ValueError, TypeError, KeyError) as exc:
                raise Verdict(Status.INCORRECT, f"the candidate's outputs could not be read: {exc}") from None
        return self._compared(self.helper_request({"op": "compare", "ref": ref_at, "cand": cand_at, "trial": trial,
                                                   "profile": self.cfg.profile, "noise": noise, "errors": errors},
                                                  "comparing outputs"))

    @staticmethod
    def _compared(reply: dict[str, Any]) -> Comparison:
        if reply.get("unreadable"):
            raise Verdict(Status.INCORRECT, f"the candidate's outputs could not be read: {reply['unreadable']}")
        if reply.get("hack"):
            raise Verdict(Status.HACK_DETECTED, f"{F.OUTPUT_TYPE}: {reply['hack']}", flag=F.OUTPUT_TYPE)
        mismatch = Mismatch.from_dict(reply["mismatch"]) if reply.get("mismatch") else None
        return Comparison(bool(reply.get("match")), str(reply.get("message", "")), mismatch,
                          tuple(reply.get("errors") or ()))

    def check_output(self, ref_tree: dict[str, Any], cand_tree: dict[str, Any], trial: int, *, beyond: bool = False,
                     noise: Any = None, errors: bool = False) -> tuple[float | None, ...]:
        """Raise a `Verdict` unless the outputs match; with `errors`, each output's relative difference."""
        result = self.compare(ref_tree, cand_tree, trial, noise, errors=errors)
        if result.ok:
            return result.errors
        if beyond:
            raise Verdict(Status.INCORRECT, "on inputs beyond the reference's distribution (heavy-tailed, "
                          f"sign-varied): {result.message}", flag=F.BEYOND_DISTRIBUTION, mismatch=result.mismatch)
        raise Verdict(Status.INCORRECT, result.message, mismatch=result.mismatch)

    def _check_inputs(self, inputs: dict[str, Any], ref_after: dict[str, Any], cand_after: dict[str, Any],
                      where: str) -> None:
        """Inputs changed in place by the candidate (byte for byte) where the reference leaves them unchanged."""
        if self.device_arenas:
            reply = self.helper_request({"op": "inputs_changed", "given": inputs, "ref_after": ref_after,
                                         "cand_after": cand_after}, "checking a trial's inputs")
            if reply.get("unreadable"):
                raise Verdict(Status.INCORRECT, "the candidate's inputs after the call could not be read: "
                              + str(reply["unreadable"]))
            changed, ref_same = [int(i) for i in reply.get("changed", [])], bool(reply.get("ref_same"))
        else:
            assert self.ref_arena is not None and self.cand_arena is not None
            try:
                changed, ref_same = changed_inputs((self.ref_arena, inputs), (self.ref_arena, ref_after),
                                                   (self.cand_arena, cand_after))
            except (UnsupportedValue, ValueError, TypeError, KeyError) as exc:
                raise Verdict(Status.INCORRECT, f"the candidate's inputs after the call could not be read: {exc}") from None
        if changed and ref_same:
            raise Verdict(Status.INCORRECT, f"the candidate modified its input(s) {changed} in place in {where}; "
                          "the reference leaves them unchanged", flag=F.INPUT_MUTATION)

    def guard_flags(self, phase: str) -> None:
        reply = self.ask_candidate({"op": "guards", "phase": phase}, "the guard check", 1.0)
        if reply.get("ok"):
            self.flags += [Flag.from_dict(f) for f in reply.get("flags", []) if isinstance(f, dict)]

    def process_flags(self) -> None:
        """Processes the candidate started that still live (seen from outside its sandbox)."""
        extra = len(self.cand.pids()) - self.cand.baseline_processes
        if extra > 0:
            self.flags.append(Flag(F.PROCESSES, Severity.ERROR, f"the candidate left {extra} process(es) running",
                                   source="runtime"))

    def profile(self) -> dict[str, Any] | None:
        if self.device_type != "cuda" or self.static_report is None or not self.cfg.profile_kernels:
            return None

        reply = self.ask_candidate({"op": "profile", "seed": new_seed()}, "the profiled forward",
                                   self.ref_times.get("call", 1.0))
        if not reply.get("ok"):
            raise call_verdict(reply, "the profiled forward")
        prof = KernelProfile.from_dict(reply.get("profile") or {})
        self.flags += decoy_flags(prof, StaticReport.from_dict(self.static_report), min_share=self.cfg.decoy_min_share,
                                  raw_kernel_names=[str(k) for k in reply.get("raw_kernels", [])])
        return prof.to_dict()

    def rejecting(self) -> list[Flag]:
        errors = [f for f in self.flags if f.severity is Severity.ERROR]
        if self.cfg.profile_obj.reject_runtime_guards:
            return errors
        return [f for f in errors if f.rule in ALWAYS_REJECT]


#: Findings that reject under every profile: each makes the measured speedup meaningless.
ALWAYS_REJECT = frozenset({F.TIMER_PATCHING, F.OUTSIDE_CLOCK, F.BELOW_FLOOR, F.INTERFERENCE, F.SIZE_CONSTANTS})


def _halves(tree: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(outputs, inputs after the call) of a trial's committed pair."""
    if not isinstance(tree, dict) or tree.get("t") != "seq" or len(tree.get("items", [])) != 2:
        raise ValueError("a trial's reply is an (outputs, inputs) pair")
    return tree["items"][0], tree["items"][1]


def output_classes(tree: Any) -> list[str]:
    """Classes in an output's descriptor tree that are not plain tensors or plain sequences."""
    if not isinstance(tree, dict):
        return ["malformed output"]
    return [c for c in tree_classes(tree) if c not in PLAIN_TENSOR_CLASSES and c not in PLAIN_SEQUENCES]


def call_verdict(reply: dict[str, Any], where: str) -> Verdict:
    """The verdict for a call the candidate's runner says failed."""
    text = str(reply.get("message", "failed"))
    if reply.get("error") in ("raised", "oom"):
        return Verdict(Status.RUNTIME_ERROR, text)
    if reply.get("error") in ("arena_full", "unsupported_output"):
        return Verdict(Status.INCORRECT, f"{where}: {text}")
    return Verdict(Status.RUNTIME_ERROR, f"{where}: {text}")


def error_hint(stderr_tail: str) -> str:
    """The last line of a runner's log that names an error, as a short parenthesised hint ('' if none)."""
    lines = [ln for ln in stderr_tail.splitlines() if "error" in ln.lower()][-1:]
    return f" ({lines[0].strip()[:200]})" if lines else ""
