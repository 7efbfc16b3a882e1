"""The candidate's runner: the smallest harness around the candidate, alone in its sandboxed process.

It starts as the reference's *twin*: the task's reference model, timed against the reference's runner before
any candidate code exists in this process, so that the parent learns what this process's harness costs per
call (`timing.Calibration`). Then it imports the candidate (its builds included), constructs `ModelNew` with
the reference's init inputs and serves the same calls: inputs that appear in its arena when the trusted side
rings, outputs committed to the arena. Everything it reports is data the parent checks: outputs are compared
outside it, its times are bounded by the parent's clock, guard flags only name what the candidate did. The
candidate can rewrite all of this module; it can only make its own reports wrong, which the parent sees.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from cudal1.core import flags as F
from cudal1.eval.inside import guards
from cudal1.eval.inside.build_hooks import BuildRecord, BuildRecorder, install_build_hooks
from cudal1.eval.inside.harness import ModelSide, first_line, oom_message, seed_everything, wall_clock
from cudal1.eval.inside.reference import configure, jsonable, jsonable_constants, load_model
from cudal1.eval.shared.arena import TensorArena, describe_value
from cudal1.eval.shared.channel import Channel
from cudal1.eval.shared.doorbell import Doorbell
from cudal1.eval.shared.protocol import (
    MAX_ITEMS,
    Attached,
    BuildOutcome,
    Call,
    CandidateReady,
    Done,
    FlagRecord,
    FlagsReply,
    FlushCpu,
    Guards,
    ImportCandidate,
    KernelRecord,
    Message,
    Profile,
    Profiled,
    ProfileRecord,
    SetupTwin,
    TwinReady,
)
from cudal1.tasks.task import module_constants


def profile_record(prof: Any) -> ProfileRecord:
    """A profile as the protocol carries it (names cut to its limits; at most `MAX_ITEMS` of them)."""
    return ProfileRecord(kernels=[KernelRecord(name=k.name[:4096], calls=int(k.calls), total_us=max(0.0, float(k.total_us)),
                                               kind=k.kind[:40]) for k in prof.kernels[:MAX_ITEMS]],
                         device=prof.device[:40], available=prof.available, note=prof.note[:2000],
                         wall_ms=prof.wall_ms)


#: Builds listed in the set-up's reply (a candidate may call load_inline in a loop).
MAX_BUILDS_REPORTED = 16


class CandidateFailed(Exception):
    """The candidate failed before it could be called: the reply names the kind."""

    def __init__(self, kind: str, message: str, compile_log: str = ""):
        super().__init__(message)
        self.kind, self.message, self.compile_log = kind, message, compile_log


def _build_failure(log_text: str) -> CandidateFailed:
    from cudal1.eval.shared.compile_log import build_failure_message, trim_compiler_log

    log = trim_compiler_log(log_text)
    return CandidateFailed("build", build_failure_message(log), compile_log=log)


def _as_build_failure(exc: BaseException, failed: list[BuildRecord]) -> CandidateFailed | None:
    """The `build` failure behind an exception the candidate's set-up raised, known by its type: a build the
    hooks recorded as failed (torch's load_inline/load), a compiler process that failed, or the raw-CUDA
    layer's compile error; None when the exception is not a build's."""
    refused = [r for r in failed if r.variant == "no_gpu"]
    if refused:  # the machine's lack, not the candidate's error: the parent decides what it means
        return CandidateFailed("no_gpu", refused[0].log)
    if failed:
        return _build_failure(failed[0].log)
    raw = sys.modules.get("cudal1.raw_cuda.errors")
    if isinstance(exc, subprocess.CalledProcessError) or (
            raw is not None and isinstance(exc, raw.RawCudaCompileError)):
        return _build_failure(str(exc))
    return None


def import_candidate(source: str, workdir: Path, recorder: BuildRecorder | None = None) -> Any:
    """Import the candidate module from source; failures become `CandidateFailed` (a `build` failure when
    the import failed while one of its recorded builds had failed)."""
    path = workdir / "candidate.py"
    path.write_text(source)
    name = f"cudal1_candidate_{abs(hash(source)) % 10**12}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    first = len(recorder.records) if recorder is not None else 0
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise CandidateFailed("syntax", f"syntax error at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:  # noqa: BLE001 - anything raised at import is the candidate's failure
        failed = [r for r in recorder.records[first:] if not r.ok] if recorder is not None else []
        build = _as_build_failure(exc, failed)
        if build is not None:
            raise build from None
        raise CandidateFailed("import", f"import failed: {first_line(exc)}") from None
    if not isinstance(getattr(module, "ModelNew", None), type):
        raise CandidateFailed("no_modelnew", "the candidate defines no class ModelNew")
    return module


class CandidateRole:
    """The twin first (`SetupTwin`), the candidate after `ImportCandidate` (module docstring)."""

    def __init__(self, request: SetupTwin, channel: Channel | None = None):
        os.environ.update({str(k): str(v) for k, v in request.env.items()})
        self.device = configure(request.model)  # the GPU memory cap included, as the reference's
        t0 = wall_clock()
        self.reference, twin = load_model(request.model)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.setup_ms = (wall_clock() - t0) * 1e3
        self.side = ModelSide(self.device, self.reference, twin)
        self.channel = channel
        self.module: Any = None
        self.flags: list[FlagRecord] = []
        self.snapshot: guards.GuardSnapshot | None = None
        self.shadowed: set[str] = set()  # changes to the harness's instances already reported
        self.harness_classes: dict[str, type] = {}  # their classes before the candidate's import
        self.import_ms = self.construct_ms = 0.0

    def ready(self) -> TwinReady:
        return TwinReady(setup_ms=self.setup_ms)

    def attach(self, arena: TensorArena, doorbell: Doorbell | None) -> Attached:
        return self.side.attach(arena, doorbell)

    def handle(self, request: Message) -> Message:
        if isinstance(request, Call):
            return self.side.call(request)  # a `CallFailed` is the reply, with its kind
        if isinstance(request, ImportCandidate):
            return self._import(request)
        if isinstance(request, FlushCpu):
            self.side.flush_cpu_cache()
            return Done()
        if isinstance(request, Guards):
            self._guard(request.phase)
            flags, self.flags = self.flags, []
            return FlagsReply(flags=flags)
        if isinstance(request, Profile):
            return self._profile(request.seed)
        raise ValueError(f"the candidate's runner does not serve {request.OP}")

    # ------------------------------------------------------------------ the candidate

    def _import(self, request: ImportCandidate) -> CandidateReady:
        """Drop the twin, import the candidate and construct `ModelNew`; failures are `CandidateFailed`."""
        self.side.model = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        self.snapshot = guards.take_snapshot()
        self.harness_classes = {name: type(obj) for name, obj in self._harness().items()}
        self._listen_for_builds()
        workdir = Path(os.environ.get("TMPDIR", "/tmp")) / "work"
        workdir.mkdir(parents=True, exist_ok=True)
        # The levers of the build that prepared this candidate, from its environment; the recorder tells which
        # of its builds failed, also those its own code caught (it then runs what it falls back to).
        recorder = install_build_hooks(cuda_usable=torch.cuda.is_available())
        t0 = wall_clock()
        self.module = import_candidate(request.cand_source, workdir, recorder)
        self.import_ms = (wall_clock() - t0) * 1e3
        self._guard("import")
        t1 = wall_clock()
        init_inputs = list(self.reference.get_init_inputs())
        torch.manual_seed(request.seed)
        try:
            model = self.module.ModelNew(*init_inputs)
            if isinstance(model, torch.nn.Module):
                model = model.to(self.device)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except torch.cuda.OutOfMemoryError as exc:
            raise CandidateFailed("oom", f"ModelNew(...) ran {oom_message(exc, self.device)}") from None
        except Exception as exc:  # noqa: BLE001
            build = _as_build_failure(exc, [r for r in recorder.records if not r.ok])
            if build is not None:
                raise build from None
            raise CandidateFailed("construct", f"ModelNew(...) raised {first_line(exc)}") from None
        self.construct_ms = (wall_clock() - t1) * 1e3
        self._guard("construction")
        self.side.model = model
        flags, self.flags = self.flags, []  # each flag reported once
        return CandidateReady(flags=flags, import_ms=self.import_ms, construct_ms=self.construct_ms,
                              builds=[BuildOutcome(name=str(r.name)[:200], ok=r.ok, log=r.log[:8000])
                                      for r in recorder.records[:MAX_BUILDS_REPORTED]],
                              constants=jsonable_constants(module_constants(vars(self.module))),
                              own_inputs=self._own_inputs())

    def _listen_for_builds(self) -> None:
        """Tell the parent when a real build starts, so that it waits for the build's own time limit (the
        parent honours such notes only while the candidate is imported and constructed)."""
        if self.channel is None:
            return
        from cudal1.eval.inside import build_hooks

        channel = self.channel
        build_hooks.BUILD_LISTENERS.append(lambda name: channel.send({"op": "progress", "what": "building",
                                                                       "name": str(name)[:100]}))

    def _guard(self, phase: str) -> None:
        if self.snapshot is None:
            return
        found = guards.compare(self.snapshot, phase)
        shadowing = guards.shadowing_flag(self._harness(), self.harness_classes, phase, self.shadowed)
        if shadowing is not None:
            found.append(shadowing)
        self.flags.extend(FlagRecord(rule=f.rule, severity=f.severity.value, message=f.message[:2000], line=f.line,
                                     source=f.source) for f in found)
        if found:
            self.snapshot = guards.take_snapshot()  # report each change once

    def _harness(self) -> dict[str, Any]:
        """The harness's own objects in this process, by name (the instance-level guards watch them)."""
        return {"ModelSide": self.side, "TensorArena": self.side.arena, "Doorbell": self.side.doorbell,
                "Channel": self.channel}

    def _own_inputs(self) -> dict[str, Any]:
        """What the candidate's own `get_inputs` and `get_init_inputs` give, if it defines them (the parent
        compares them with the reference's: equal boilerplate is no hyperparameter change)."""
        out: dict[str, Any] = {}
        for name in ("get_inputs", "get_init_inputs"):
            fn = getattr(self.module, name, None)
            if not callable(fn) or fn is getattr(self.reference, name, None):
                continue
            try:
                seed_everything(1234)
                with torch.device(self.device):
                    value = list(fn())
                out[name] = describe_value(value) if name == "get_inputs" else jsonable(value)
            except Exception as exc:  # noqa: BLE001
                out[name] = {"raised": first_line(exc, 120)}
        torch.seed()
        return out

    def _profile(self, seed: int) -> Profiled:
        """One profiled forward (after timing: the profiler slows later launches): which kernels ran."""
        from cudal1.eval.inside.profiling import profile_call

        inputs = self.side.make_inputs(seed)
        prof = profile_call(lambda: self.side.untimed(inputs), self.device)
        raw_names: list[str] = []
        if "cudal1.raw_cuda" in sys.modules:
            raw_names = list(sys.modules["cudal1.raw_cuda"].launch_log().defined_kernels)
        self._guard("profiling")
        # The profiler leaves a native helper thread behind: not the candidate's doing.
        self.flags = [f for f in self.flags if f.rule != F.NATIVE_THREADS]
        return Profiled(profile=profile_record(prof), raw_kernels=[name[:4096] for name in raw_names[:MAX_ITEMS]])

