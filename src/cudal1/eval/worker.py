"""The evaluation worker: runs inside an isolated child (see `isolation.py`), one candidate per process.

Phases: load the reference -> import the candidate (its CUDA builds, or hits the build cache) ->
construct both models with the same seed -> correctness trials -> paired timing with re-verified outputs.
Runtime guards are checked after every phase that runs candidate code, and the global state is restored
before the reference runs again. The worker returns a plain dict; the parent turns it into an EvalResult.

Memory hygiene (design section 4): in each correctness trial the candidate runs *before* the reference,
on its own clones of the inputs; every reference output is overwritten with NaN before it is released,
and on CUDA the reference allocates from a private memory pool when PyTorch offers one, so the candidate
can never receive memory that still holds a reference result.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import platform
import random
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

# Rationale: importing torch._dynamo rebinds torch.manual_seed (a wrapper that disables tracing). Importing
# it before any guard snapshot keeps a candidate that merely triggers that import (through a library or
# torch.compile) from looking as if it patched torch. Pre-started workers pay this before their payload.
import torch._dynamo  # noqa: F401

from cudal1.core.types import Flag, Severity, Status
from cudal1.eval import guards, timing
from cudal1.eval.config import EvalConfig
from cudal1.eval.correctness import OutputHackError, changed_inputs, compare_outputs, flatten, snapshot_inputs

logger = logging.getLogger(__name__)

# Rationale: above this many output elements, re-verify only the first and last call of each bucket so
# that verification does not dominate the timing run of very large problems.
FULL_VERIFY_MAX_ELEMENTS = 16 * 2**20
STREAM_ESCAPE_MIN_MS = 0.05


class Verdict(Exception):
    """Ends the evaluation early with a status (raised by phases, caught by `evaluate_in_worker`)."""

    def __init__(self, status: Status, message: str, **extra: Any):
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


def environment_info(device: torch.device) -> dict[str, Any]:
    env = {"device_type": device.type, "torch_version": torch.__version__, "cuda_version": torch.version.cuda,
           "python": platform.python_version(), "host": platform.node()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu_name=props.name, capability=f"{props.major}.{props.minor}",
                   sm_count=props.multi_processor_count,
                   l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0))
    else:
        env.update(gpu_name="cpu", cpu=platform.processor() or platform.machine())
    return env


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    msg = f"{type(exc).__name__}: {text[0] if text else ''}"
    return msg[:limit]


def _build_failure(exc: BaseException) -> Verdict:
    """COMPILE_ERROR with the first compiler error as message and the trimmed log beside it."""
    from cudal1.eval.compile import build_failure_message, trim_compiler_log

    log = trim_compiler_log(str(exc))
    return Verdict(Status.COMPILE_ERROR, build_failure_message(log), compile_log=log)


def import_candidate(source: str, workdir: Path) -> Any:
    """Import the candidate module from source; build failures become COMPILE_ERROR verdicts."""
    path = workdir / "candidate.py"
    path.write_text(source)
    # The compile service's load_inline hooks and levers (from its environment, so its cached build is
    # reused; the default levers where no build was prepared, e.g. C++ extensions on cpu).
    from cudal1.eval.build_worker import install_build_hooks

    install_build_hooks()
    name = f"cudal1_candidate_{abs(hash(source)) % 10**12}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise Verdict(Status.COMPILE_ERROR, f"syntax error at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:  # noqa: BLE001 - anything raised at import is the candidate's build/import failure
        text = str(exc)
        if "Error building extension" in text or type(exc).__name__ in ("RawCudaCompileError", "CalledProcessError"):
            raise _build_failure(exc) from None
        raise Verdict(Status.COMPILE_ERROR, f"import failed: {_first_line(exc)}") from None
    if not isinstance(getattr(module, "ModelNew", None), type):
        raise Verdict(Status.COMPILE_ERROR, "the candidate defines no class ModelNew")
    return module


@contextlib.contextmanager
def reference_phase(what: str, before_candidate: bool = False) -> Iterator[None]:
    """Code of the reference (its module, inputs, construction, forward): what it raises is reported as the
    reference's failure, so that neither a user nor a policy's feedback reads it as the candidate's bug.
    Only a failure before any candidate code ran is certainly not the candidate's; later ones are named as
    the reference's without that claim. Out-of-memory and CUDA errors pass through: the candidate's
    asynchronous work can surface in the reference's calls. The verdict stays a failure either way."""
    try:
        yield
    except (Verdict, torch.cuda.OutOfMemoryError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - reported in one line with where it happened
        if "CUDA error" in str(exc) or type(exc).__name__ == "AcceleratorError":
            raise
        whose = ", not the candidate" if before_candidate else ""
        raise Verdict(Status.RUNTIME_ERROR, f"the reference failed ({what}){whose}: {_first_line(exc)}",
                      flag="reference_error") from None


def make_inputs(ref: Any, device: torch.device, seed: int) -> list[Any]:
    """The reference's inputs for one seed, created directly on the device.

    The global generator is re-seeded from OS entropy afterwards, so the candidate cannot read or
    predict the seed the inputs came from.
    """
    torch.manual_seed(seed)
    with torch.device(device):
        inputs = list(ref.get_inputs())
    torch.seed()
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]


def clone_inputs(inputs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def poison(out: Any) -> None:
    """Overwrite floating outputs with NaN before releasing them (no stale results for the candidate)."""
    for t in flatten(out, strict=False):
        if not isinstance(t, torch.Tensor) or t.dtype == torch.bool:
            continue
        t.detach().fill_(float("nan") if (t.is_floating_point() or t.is_complex()) else -12345)


def use_device(name: str) -> torch.device:
    """`name` as a device with an index, made the current CUDA device ('cuda' -> the current one:
    `torch.cuda.set_device` rejects a CUDA device without an index)."""
    device = torch.device(name)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    return device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RefPool:
    """Runs the reference in a private CUDA memory pool when this PyTorch has one."""

    def __init__(self, device: torch.device):
        self.pool = None
        if device.type == "cuda" and hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool"):
            try:
                self.pool = torch.cuda.MemPool()
            except Exception:  # noqa: BLE001 - an allocator configuration without pools: fall back
                self.pool = None

    def __call__(self):
        return torch.cuda.use_mem_pool(self.pool) if self.pool is not None else contextlib.nullcontext()


class Evaluation:
    """State of one candidate's evaluation inside the worker."""

    def __init__(self, payload: dict[str, Any]):
        self.cfg = EvalConfig.from_dict(payload["config"])
        self.device = use_device(payload["device"])
        self.payload = payload
        self.flags: list[Flag] = []
        self.phase_s: dict[str, float] = {}
        # Input seeds are salted per evaluation so a candidate cannot precompute or recognise inputs.
        self.salt = secrets.randbits(31)
        self.rng = random.Random(self.cfg.seed ^ self.salt)
        self.ref_pool = RefPool(self.device)
        self.kernel_profile: dict[str, Any] | None = None

    def guard(self, snapshot: guards.GuardSnapshot, phase: str) -> None:
        """Check the guards after `phase` and restore the global state for the reference."""
        self.flags.extend(guards.compare(snapshot, phase))
        guards.restore(snapshot)

    def call_candidate(self, model: Any, inputs: list[Any], wait: bool = True) -> Any:
        """Run the candidate; anything it raises (a forged `Verdict` too) is its RUNTIME_ERROR."""
        try:
            with torch.no_grad():
                out = model(*inputs)
            if wait:
                sync(self.device)
        except torch.cuda.OutOfMemoryError as exc:
            raise Verdict(Status.RUNTIME_ERROR, f"out of GPU memory: {_first_line(exc, 200)}") from None
        except Exception as exc:  # noqa: BLE001 - the candidate's failure, reported in one line
            raise Verdict(Status.RUNTIME_ERROR, f"forward raised {_first_line(exc)}") from None
        return out

    def call_reference(self, model: Any, inputs: list[Any], wait: bool = True, pool: bool = True) -> Any:
        """Run the reference, in its private memory pool unless the caller has entered it (`pool=False`:
        then the call does exactly what `call_candidate` does, for timing)."""
        if pool:
            with self.ref_pool():
                return self.call_reference(model, inputs, wait=wait, pool=False)
        with torch.no_grad():
            out = model(*inputs)
        if wait:
            sync(self.device)
        return out

    def construct(self, ref: Any, cand_module: Any, snapshot: guards.GuardSnapshot) -> tuple[Any, Any]:
        with reference_phase("get_init_inputs and Model(...)"):
            init_inputs = list(ref.get_init_inputs())
            torch.manual_seed(self.cfg.seed)
            ref_model = ref.Model(*init_inputs).to(self.device)
        torch.manual_seed(self.cfg.seed)
        try:
            cand_model = cand_module.ModelNew(*init_inputs)
            if isinstance(cand_model, torch.nn.Module):
                cand_model = cand_model.to(self.device)
            sync(self.device)
        except Exception as exc:  # noqa: BLE001
            text = str(exc)
            if "Error building extension" in text or type(exc).__name__ == "RawCudaCompileError":
                raise _build_failure(exc) from None
            raise Verdict(Status.RUNTIME_ERROR, f"ModelNew(...) raised {_first_line(exc)}") from None
        self.guard(snapshot, "construction")
        return ref_model, cand_model

    def check_trial(self, ref: Any, ref_model: Any, cand_model: Any, trial: int,
                    snapshot: guards.GuardSnapshot) -> None:
        with reference_phase("get_inputs"):
            inputs = make_inputs(ref, self.device, self.salt + 1000 * (trial + 1))
        cand_in = clone_inputs(inputs)
        before = snapshot_inputs(cand_in)
        cand_out = self.call_candidate(cand_model, cand_in)
        self.guard(snapshot, f"forward (trial {trial})")
        changed = changed_inputs(before, cand_in)
        ref_in = clone_inputs(inputs)
        ref_before = snapshot_inputs(ref_in)
        with reference_phase("forward"):
            ref_out = self.call_reference(ref_model, ref_in)
        ref_changes = changed_inputs(ref_before, ref_in)
        if changed and not ref_changes:
            raise Verdict(Status.INCORRECT, f"the candidate modified its input(s) {changed} in place; "
                          "the reference leaves them unchanged", flag="runtime.input_mutation")
        try:
            with self.ref_pool():  # its copies of the reference's values stay out of the candidate's reach
                result = compare_outputs(ref_out, cand_out, self.cfg.profile_obj, trial)
        except OutputHackError as exc:
            raise Verdict(Status.HACK_DETECTED, f"guard.output_type: {exc}", flag="guard.output_type") from None
        poison(ref_out)
        if not result.ok:
            raise Verdict(Status.INCORRECT, result.message, mismatch=result.mismatch)

    def input_sets(self, ref: Any, first: list[Any]) -> list[list[Any]]:
        """Input sets rotated during timing, within the memory budget."""
        per_set = sum(x.numel() * x.element_size() for x in first if isinstance(x, torch.Tensor))
        n = max(1, min(self.cfg.input_sets, self.cfg.input_sets_max_bytes // max(per_set, 1)))
        return [first] + [make_inputs(ref, self.device, self.salt + 7919 * (i + 1)) for i in range(n - 1)]

    def refresher(self, ref: Any, sets: list[list[Any]]):
        """`refresh(step, k)`: new values (same buffers) in input set k before every timed pair, so no
        result can be reused across calls, whether keyed by address, by shape or by sampled values."""
        counter = {"n": 0}

        def refresh(step: int, k: int) -> None:
            if not self.cfg.refresh_inputs:
                return
            counter["n"] += 1
            fresh = make_inputs(ref, self.device, self.salt + 104729 * counter["n"])
            for dst, src in zip(sets[k], fresh, strict=True):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
        return refresh

    def verifier(self, ref_model: Any, sets: list[list[Any]], snapshot: guards.GuardSnapshot, iters: int):
        """`on_pair` for the timed runs: re-verify outputs (all, or first/last per bucket when huge)."""
        state = {"i": 0}
        profile = self.cfg.profile_obj

        def on_pair(k: int, ref_out: Any, cand_out: Any) -> None:
            i = state["i"]
            state["i"] += 1
            big = sum(t.numel() for t in flatten(ref_out) if isinstance(t, torch.Tensor)) > FULL_VERIFY_MAX_ELEMENTS
            # Large outputs: verify an unpredictable quarter of the calls (plus the first).
            if not big or i == 0 or self.rng.random() < 0.25:
                try:
                    with self.ref_pool():
                        result = compare_outputs(ref_out, cand_out, profile, trial=-1)
                except OutputHackError as exc:
                    raise Verdict(Status.HACK_DETECTED, f"guard.output_type: {exc}",
                                  flag="guard.output_type") from None
                if not result.ok:
                    raise Verdict(Status.INCORRECT, "wrong output in a timed run (correct in the trials): "
                                  + result.message, mismatch=result.mismatch, flag="runtime.timed_output")
            poison(ref_out)
        return on_pair

    def measure(self, ref: Any, ref_model: Any, cand_model: Any, snapshot: guards.GuardSnapshot) -> dict:
        first = make_inputs(ref, self.device, self.salt + 31337)
        sets = self.input_sets(ref, first)
        flush = timing.make_flusher(self.device) if self.cfg.flush_l2 else None
        # Timed calls of both models go through the same path: no wait inside the call (time_call waits for
        # the device) and the reference's memory-pool switch outside the timed span. Before protocol 3 the
        # reference paid both inside it, ~20-50 us per call on an H200 in the candidate's favour.
        run_ref = lambda k: self.call_reference(ref_model, sets[k], wait=False, pool=False)  # noqa: E731
        run_cand = lambda k: self.call_candidate(cand_model, sets[k], wait=False)  # noqa: E731
        warm_ms = {"ref": [], "cand": []}
        with torch.no_grad():
            # Every input set is seen at least twice before timing, so per-buffer set-up (a CUDA graph
            # bound to the buffers, lazy allocations) happens here and not inside a timed call.
            for i in range(max(self.cfg.warmup_iters, 2 * len(sets))):
                k = i % len(sets)
                for who, fn in (("ref", run_ref), ("cand", run_cand)):
                    t0 = time.perf_counter()
                    out, _ = timing.time_call(lambda: fn(k), self.device, flush,  # noqa: B023 - called now
                                              self.ref_pool if who == "ref" else None)
                    if who == "ref":
                        poison(out)
                    del out
                    warm_ms[who].append((time.perf_counter() - t0) * 1e3)
            self.guard(snapshot, "warm-up")
            iters = timing.iterations_per_bucket(min(warm_ms["ref"]), min(warm_ms["cand"]),
                                                 self.cfg.target_bucket_ms, self.cfg.min_iters_per_bucket,
                                                 self.cfg.max_iters_per_bucket)
            common = dict(n_sets=len(sets), iters=iters, device=self.device, rng=self.rng,
                          ref_context=self.ref_pool, on_pair=self.verifier(ref_model, sets, snapshot, iters),
                          refresh=self.refresher(ref, sets))
            cold = timing.run_series(run_ref, run_cand, buckets=self.cfg.buckets, flush=flush, **common)
            warm = (timing.run_series(run_ref, run_cand, buckets=self.cfg.warm_buckets, flush=None, **common)
                    if self.cfg.warm_buckets and flush is not None else None)
        self.guard(snapshot, "timing")
        self.check_stream_escape(cold)
        method = "cuda_events+device_sync" if self.device.type == "cuda" else "host_timer"
        stats = timing.build_stats(cold, warm, method=method, iters=iters, round_to_one=self.cfg.round_toward_one)
        return {"ref_ms": stats.ref_ms, "candidate_ms": stats.candidate_ms, "speedup": stats.speedup,
                "stability": stats.stability, "bucket_speedups": stats.bucket_speedups,
                "speedup_warm": stats.speedup_warm, "ref_ms_warm": stats.ref_ms_warm,
                "candidate_ms_warm": stats.candidate_ms_warm, "method": stats.method,
                "iterations": stats.iterations}

    def check_stream_escape(self, cold: timing.PairedSeries) -> None:
        if self.device.type != "cuda":
            return
        ref_gap, cand_gap = timing.stream_escape_ms(cold)
        cand_ms = timing.summarize_series(cold)[1]
        if cand_gap > ref_gap + max(STREAM_ESCAPE_MIN_MS, 0.1 * cand_ms):
            self.flags.append(Flag("guard.stream_escape", Severity.ERROR,
                                   f"{cand_gap:.3f} ms of the candidate's work ran outside the current "
                                   f"stream (reference: {ref_gap:.3f} ms)", source="runtime"))

    def run(self) -> dict[str, Any]:
        from cudal1.tasks.task import load_reference

        t0 = time.perf_counter()
        with reference_phase("loading its module", before_candidate=True):
            ref = load_reference(self.payload["ref_source"], self.payload["task_id"], sizes=self.cfg.sizes)
        if self.device.type == "cuda":
            torch.zeros(1, device=self.device)  # create the context before the snapshot
        if self.cfg.uses_exact_fp32:
            guards.use_exact_fp32()  # before the snapshot: a candidate that turns TF32 back on is flagged
        snapshot = guards.take_snapshot()
        cand_module = import_candidate(self.payload["cand_source"], Path.cwd())
        self.guard(snapshot, "import")
        if any(f.rule == "guard.timer_patching" for f in self.flags):
            return {"status": Status.HACK_DETECTED.value}  # patched at import: nothing it does can be trusted
        self.phase_s["import"] = time.perf_counter() - t0
        t_construct = time.perf_counter()
        ref_model, cand_model = self.construct(ref, cand_module, snapshot)
        t1 = time.perf_counter()
        self.phase_s["construct"] = t1 - t_construct
        for trial in range(self.cfg.correctness_trials):
            self.check_trial(ref, ref_model, cand_model, trial, snapshot)
        self.phase_s["correctness"] = time.perf_counter() - t1
        if self.rejecting_flags():
            return {"status": Status.HACK_DETECTED.value}
        t2 = time.perf_counter()
        measured = self.measure(ref, ref_model, cand_model, snapshot)
        self.phase_s["timing"] = time.perf_counter() - t2
        t3 = time.perf_counter()
        self.check_decoy(ref, cand_model, snapshot)
        self.phase_s["profile"] = time.perf_counter() - t3
        status = Status.HACK_DETECTED if self.rejecting_flags() else Status.CORRECT
        return {"status": status.value, "timing": measured}

    def check_decoy(self, ref: Any, cand_model: Any, snapshot: guards.GuardSnapshot) -> None:
        """One profiled forward after timing (CUPTI would slow later launches): did its own kernels run?"""
        static = self.payload.get("static_report")
        if self.device.type != "cuda" or not static or not self.cfg.profile_kernels:
            return
        from cudal1.analysis import StaticReport
        from cudal1.eval.profiling import decoy_flags, profile_call

        raw_names: tuple[str, ...] = ()
        if "cudal1.raw_cuda" in sys.modules:
            raw_names = tuple(sys.modules["cudal1.raw_cuda"].launch_log().defined_kernels)
        inputs = make_inputs(ref, self.device, self.salt + 4242)
        prof = profile_call(lambda: self.call_candidate(cand_model, inputs), self.device)
        self.flags.extend(decoy_flags(prof, StaticReport.from_dict(static), raw_kernel_names=raw_names,
                                      min_share=self.cfg.decoy_min_share))
        # The profiler leaves a native helper thread behind: not the candidate's doing.
        self.flags.extend(f for f in guards.compare(snapshot, "profiling") if f.rule != "guard.native_threads")
        guards.restore(snapshot)
        self.kernel_profile = prof.to_dict()

    def rejecting_flags(self) -> list[Flag]:
        errors = [f for f in self.flags if f.severity is Severity.ERROR]
        if self.cfg.profile_obj.reject_runtime_guards:
            return errors
        # A patched timer, comparison or harness function makes every number meaningless: always rejects.
        return [f for f in errors if f.rule == "guard.timer_patching"]


def evaluate_in_worker(payload: dict[str, Any]) -> dict[str, Any]:
    """Isolated entry point: evaluate one candidate against one reference (see module docstring)."""
    ev = Evaluation(payload)
    env = environment_info(ev.device)
    try:
        out = ev.run()
    except Verdict as v:
        out = {"status": v.status.value, "message": v.message, "compile_log": v.extra.get("compile_log", ""),
               "mismatch": v.extra.get("mismatch").__dict__ if v.extra.get("mismatch") else None}
        if v.extra.get("flag"):
            # Evidence attached to a verdict; only a non-plain output is a cheat in itself (an in-place
            # input write or a wrong timed output can be an honest bug, and stays INCORRECT).
            severity = Severity.ERROR if v.status is Status.HACK_DETECTED else Severity.WARNING
            ev.flags.append(Flag(v.extra["flag"], severity, v.message[:200], source="runtime"))
    except torch.cuda.OutOfMemoryError as exc:
        out = {"status": Status.RUNTIME_ERROR.value, "message": f"out of GPU memory: {_first_line(exc, 200)}"}
    except Exception as exc:  # noqa: BLE001 - e.g. an illegal memory access surfacing at a later sync
        out = {"status": Status.RUNTIME_ERROR.value, "message": _first_line(exc)}
    if out["status"] == Status.CORRECT.value and not out.get("timing"):
        out = {"status": Status.RUNTIME_ERROR.value, "message": "the evaluation ended without timing results"}
    rejecting = ev.rejecting_flags()
    if rejecting and out["status"] in (Status.CORRECT.value, Status.INCORRECT.value):
        out["status"] = Status.HACK_DETECTED.value  # a cheat that also computes wrongly is still a cheat
        out["message"] = ""
    if out["status"] == Status.HACK_DETECTED.value and rejecting and not out.get("message"):
        out["message"] = "; ".join(f"{f.rule}: {f.message}" for f in rejecting[:3])
    out.update(flags=[f.to_dict() for f in ev.flags], environment=env, phase_s=ev.phase_s,
               kernel_profile=ev.kernel_profile)
    return out
