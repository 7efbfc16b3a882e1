"""The call harness both model runners share, so that reference and candidate are timed alike.

One `ModelSide` lives in each model runner (the reference's, and the candidate's, which first holds the
reference's model as its calibration twin). A bracket (`call`) holds one or more calls, each on inputs of its
own (a small model is called several times per bracket, so that the harness's cost per bracket, and the
scatter of that cost, is shared by several calls):

1. the request names the input slot; the runner makes views of it (nothing is there yet), arms its doorbell
   and spins;
2. the trusted side copies the calls' inputs into the slot (the device's helper, or the parent on the CPU)
   and rings `go`: the inputs exist in this process only from then on;
3. the model is called on each set of inputs in turn between device events with a device-wide wait after the
   last (a host timer on the CPU), the outputs are committed to the arena's `out` region, and the runner
   rings `done`.

What the runner reports (its times, where the output lies) is data: the parent's own clock around the
bracket bounds the time that counts (`timing.py`), the helper's end probe waits for whatever the call left
on the device, and outputs and inputs are checked where they lie. Nothing here decides anything.
"""

from __future__ import annotations

import gc
import random
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from cudal1.eval.shared.arena import TensorArena
from cudal1.eval.shared.doorbell import ARMED, DONE, GO, Doorbell, DoorbellTimeout
from cudal1.eval.shared.protocol import Attached, Call, Called

#: The harness's clocks, bound when the runner starts (before any candidate code): a candidate that replaces
#: `time.perf_counter` is named by the guards, and the harness's own figures stay figures of the real clocks.
wall_clock = time.perf_counter
cpu_clock_ns = time.process_time_ns

#: Bytes written to flush a CPU's last-level cache before a timed call on the CPU (in the runner itself).
CPU_FLUSH_BYTES = 32 * 2**20
#: How long an armed runner waits for its go before it gives up (the parent rings within milliseconds).
GO_TIMEOUT_S = 120.0


class CallFailed(Exception):
    """The model raised (or ran out of memory) in a call: the reply names the kind and the first line."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


def first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:limit]


GIB = 2**30


def gpu_memory(device: torch.device) -> dict[str, int] | None:
    """This process's use of `device`'s memory through PyTorch's allocator, in bytes (None off the GPU):
    what is allocated now, what the allocator holds, and the peaks of both since the process started."""
    if device.type != "cuda":
        return None
    # One read of the allocator's nested statistics: the flat `memory_stats` behind `memory_allocated` and
    # its siblings rebuilds ~150 keys recursively on each read (0.4 ms of every timed call for the four).
    stats = torch.cuda.memory_stats_as_nested_dict(device)
    allocated, reserved = stats.get("allocated_bytes", {}).get("all", {}), stats.get("reserved_bytes", {}).get("all", {})
    return {"allocated": int(allocated.get("current", 0)), "reserved": int(reserved.get("current", 0)),
            "peak_allocated": int(allocated.get("peak", 0)), "peak_reserved": int(reserved.get("peak", 0))}


def oom_message(exc: BaseException, device: torch.device) -> str:
    """An out-of-memory error in one line with the numbers that say whose memory ran out: the request, this
    process's allocated and reserved memory, and what the device had free (PyTorch's own message puts them
    on lines a first-line summary cuts off)."""
    found = re.search(r"Tried to allocate ([0-9.]+ [KMGT]?i?B)", str(exc))
    parts = [f"tried to allocate {found.group(1)}" if found else first_line(exc, 120)]
    if device.type == "cuda":
        try:
            free, total = torch.cuda.mem_get_info(device)
            parts.append(f"this process {torch.cuda.memory_allocated(device) / GIB:.2f} GiB allocated, "
                         f"{torch.cuda.memory_reserved(device) / GIB:.2f} GiB reserved")
            parts.append(f"the device {free / GIB:.2f} of {total / GIB:.1f} GiB free")
        except Exception:  # noqa: BLE001 - a broken context: the request alone
            pass
    return "out of GPU memory (" + "; ".join(parts) + ")"


@contextmanager
def model_failures(device: torch.device) -> Iterator[None]:
    """The model's failures inside as `CallFailed`, in one line: out of device or host memory (`oom`, with the
    numbers that say whose), anything else it raised (`raised`)."""
    try:
        yield
    except torch.cuda.OutOfMemoryError as exc:
        raise CallFailed("oom", oom_message(exc, device)) from None
    except MemoryError as exc:
        raise CallFailed("oom", f"out of host memory: {first_line(exc, 200)}") from None
    except Exception as exc:  # noqa: BLE001 - the model's failure, reported in one line
        raise CallFailed("raised", f"forward raised {first_line(exc)}") from None


def use_device(name: str) -> torch.device:
    """`name` as a device with an index, made the current CUDA device."""
    device = torch.device(name)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    return device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seed_everything(seed: int) -> None:
    """Seed every generator a task's `get_inputs` may use (torch's CPU and CUDA generators, Python's
    `random`, NumPy). As `torch.manual_seed` does for these two devices, without its queued seeding of the
    backends this process never uses (XPU, MTIA: a stack trace recorded per call, 0.2 ms of each timed call)."""
    torch.default_generator.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass


def heavy_tailed(inputs: list[Any], seed: int) -> list[Any]:
    """Floating inputs with random signs and heavy-tailed magnitudes, same shapes and dtypes.

    Each element is multiplied by +-(1 + P) with P Pareto-distributed (shape 3: finite variance, values up
    to ~10x the median now and then), which breaks analytical shortcuts fitted to the reference's own
    distribution while staying in the range float32 arithmetic handles.
    """
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel():
            gen = torch.Generator(device=x.device).manual_seed(seed)
            u = torch.rand(x.shape, generator=gen, device=x.device)
            sign = torch.where(torch.rand(x.shape, generator=gen, device=x.device) < 0.5, -1.0, 1.0)
            out.append(x * (sign * (1.0 - u).clamp_min(1e-6).pow(-1.0 / 3.0)).to(x.dtype))
        else:
            out.append(x)
    return out


def reseed_from_os() -> None:
    """torch's CPU and CUDA generators re-seeded from OS entropy (`torch.seed` for the devices in use)."""
    torch.cuda.manual_seed_all(torch.default_generator.seed())


def make_inputs(reference: Any, device: torch.device, seed: int, distribution: str = "reference") -> list[Any]:
    """The reference's inputs for `seed`, created on `device`; the generators re-seeded from OS entropy after.
    Two processes on the same kind of device make the same inputs from the same seed."""
    seed_everything(seed)
    with torch.device(device):
        inputs = list(reference.get_inputs())
    reseed_from_os()
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    if distribution == "heavy":
        inputs = heavy_tailed(inputs, seed)
    return inputs


class ModelSide:
    """A model and the means to feed it and time it, inside one runner (module docstring)."""

    def __init__(self, device: torch.device, reference_module: Any, model: Any = None):
        self.device = device
        self.ref = reference_module  # a `tasks.task.Reference` (its get_inputs feeds both models)
        self.model = model
        self.arena: TensorArena | None = None
        self.doorbell: Doorbell | None = None
        self._cpu_flush = torch.empty(CPU_FLUSH_BYTES // 4, dtype=torch.float32) if device.type == "cpu" else None

    def make_inputs(self, seed: int, distribution: str = "reference") -> list[Any]:
        return make_inputs(self.ref, self.device, seed, distribution)

    def attach(self, arena: TensorArena, doorbell: Doorbell | None) -> Attached:
        """Take the arena (and doorbell) the parent sent: whether host memory got pinned for the GPU, and
        whether calls can be gated (a device arena and stream memory operations that work here)."""
        self.arena, self.doorbell = arena, doorbell
        if self.device.type != "cuda":
            return Attached()
        gated = hasattr(arena, "gate_usable") and arena.gate_usable()
        self._null_work = torch.zeros(1, device=self.device)
        return Attached(pinned=arena.register_with_cuda(), gate=gated)

    def stage(self, seed: int, distribution: str, count: int = 1) -> dict[str, Any]:
        """Make the inputs of `count` calls into the arena's staging region (the reference's runner), one set
        per seed from `seed` on; their tree (a list, one item per call)."""
        assert self.arena is not None, "no arena attached"
        return self.arena.pack([self.make_inputs(seed + i, distribution) for i in range(count)], "stage")

    def read(self, tree: dict[str, Any], *, copy: bool = True) -> Any:
        assert self.arena is not None, "no arena attached"
        return self.arena.unpack(tree, device=self.device, copy=copy)

    def flush_cpu_cache(self) -> None:
        if self._cpu_flush is not None:
            self._cpu_flush.fill_(1.0)

    def untimed(self, inputs: list[Any]) -> Any:
        """One call of the model outside any bracket (a reference's first call, a profiled call)."""
        with model_failures(self.device), torch.no_grad():
            out = self.model(*inputs)
            sync(self.device)
        return out

    def call(self, request: Call) -> Called:
        """One bracket's calls (module docstring). The doorbell is rung `done` whatever happens, so the parent
        never waits past the bracket; a failure is then the reply."""
        assert self.arena is not None and self.doorbell is not None, "no arena attached"
        bell = self.doorbell
        where = self.arena.bytes_tensor().device
        group = self.arena.unpack(request.inputs, device=where, copy=False)
        group = [list(v) if isinstance(v, (list, tuple)) else [v] for v in group]
        if request.gate:
            return self._gated(request, group)
        host_to_device = self.device.type == "cuda" and where.type != "cuda"
        gc.disable()  # a collection inside the bracket would be harness time the reference need not pay
        try:
            bell.ring(ARMED, request.seq)
            try:
                bell.wait(GO, request.seq, GO_TIMEOUT_S)
            except DoorbellTimeout:
                raise CallFailed("no_go", "the parent never started the call") from None
            staged = group  # views of the shared slot (host memory here where the inputs cross to the GPU)
            if host_to_device:
                group = [[x.to(self.device) if isinstance(x, torch.Tensor) else x for x in views] for views in group]
            outs, total_ms, stream_ms, cpu_ms = self._timed(group)
            tree = self.arena.pack(outs, "out")
        finally:
            bell.ring(DONE, request.seq)
            gc.enable()
        if host_to_device:  # after the bracket: what the call did to its inputs, back where the parent checks them
            self._write_back(staged, group)
        return Called(ms=total_ms, stream_ms=stream_ms, out=tree, memory=gpu_memory(self.device), cpu_ms=cpu_ms)

    def _gated(self, request: Call, group: list[list[Any]]) -> Called:
        """The calls enqueued behind the gate (`gate` module docstring): wait for the gate, the model once per
        set of inputs (views of the slot, whose inputs the helper writes before it opens the gate), the
        outputs' commit, the done word; then `armed`, and a wait for the device. A `forward` that waits for
        the device itself (`.item()`, a data-dependent shape) blocks until the helper opens the gate, which
        the parent has it do without the arm; its host work after that wait is then inside the bracket. The
        done word is enqueued whatever happens (the helper's stream waits for it). `null`: no model call."""
        from cudal1.eval.shared import gate

        assert self.arena is not None and self.doorbell is not None
        bell, arena = self.doorbell, self.arena
        gate_ptr, done_ptr = arena.gate_words()  # type: ignore[attr-defined]
        # The commit and the done word go on the stream the gate holds, whatever stream `forward` leaves current.
        current = torch.cuda.current_stream(self.device)
        stream = int(current.cuda_stream)
        t0 = wall_clock()
        gc.disable()
        done_queued = False
        try:
            gate.wait_value(stream, gate_ptr, request.gate)
            outs: list[Any] = []
            if request.null:  # one tiny kernel: the device switches to this context and back, as for a call
                self._null_work.add_(1.0)
            else:
                with model_failures(self.device), torch.no_grad():
                    outs = [self.model(*inputs) for inputs in group]
            with torch.cuda.stream(current):
                tree = arena.pack(outs, "out", sync=False) if not request.null else \
                    {"t": "seq", "type": "list", "items": []}
            gate.write_value(stream, done_ptr, request.gate)
            done_queued = True
            bell.ring(ARMED, request.seq)
            with model_failures(self.device):  # (the model's asynchronous failures surface here)
                torch.cuda.synchronize(self.device)
        finally:
            if not done_queued:  # the helper's stream waits for the done word: never leave it waiting
                try:
                    gate.write_value(stream, done_ptr, request.gate)
                except gate.GateError:
                    pass  # a broken context: the helper's rescue ends its wait
            bell.ring(DONE, request.seq)
            gc.enable()
        ms = max((wall_clock() - t0) * 1e3, 1e-6)  # the runner's own wall time, for the record only
        return Called(ms=ms, stream_ms=ms, out=tree, memory=gpu_memory(self.device))

    def _write_back(self, staged: list[list[Any]], used: list[list[Any]]) -> None:
        """Copy the device copies of a call's inputs back over the slot's host views, so that a model that
        wrote into its inputs is seen doing so by the input check (else its writes die with the copies)."""
        for views, copies in zip(staged, used, strict=True):
            for view, copy in zip(views, copies, strict=True):
                if isinstance(view, torch.Tensor) and copy is not view:
                    view.copy_(copy)
        sync(self.device)

    def _timed(self, group: list[list[Any]]) -> tuple[list[Any], float, float, float | None]:
        """(outputs, total_ms, stream_ms, cpu_ms) of the model called once per set of inputs: device events
        around all the calls with a device-wide wait after the last, so that work on any stream of this process
        is counted; stream_ms stops at the current stream's end. No wait between the calls: each is launched
        while the previous one runs, as in a model's own loop. On a CPU, cpu_ms is the process's CPU time over
        the same window as the wall clock's (a GPU call's CPU time bounds nothing: None): read any wider, it
        held the harness's own code on caches the flush left cold, about 47 us a call on a 2-core development
        machine, which the parent's CPU bound then counted as the model's."""
        with model_failures(self.device), torch.no_grad():
            if self.device.type == "cuda":
                start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                start.record()
                outs = [self.model(*inputs) for inputs in group]
                mid.record()
                torch.cuda.synchronize(self.device)
                end.record()
                end.synchronize()
                return outs, start.elapsed_time(end), start.elapsed_time(mid), None
            cpu0 = cpu_clock_ns()
            t0 = wall_clock()
            outs = [self.model(*inputs) for inputs in group]
            t1 = wall_clock()
            cpu_ms = (cpu_clock_ns() - cpu0) / 1e6
            return outs, (t1 - t0) * 1e3, (t1 - t0) * 1e3, cpu_ms


def use_exact_fp32() -> None:
    """True fp32 for this process: TF32 off for cuDNN (PyTorch's default is on) and for matmuls."""
    b = torch.backends
    b.cudnn.allow_tf32 = False
    b.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
