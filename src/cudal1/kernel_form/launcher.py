"""The trusted launcher: no candidate code runs on the host, only the steps of the spec, on the launcher's stream.

    launcher = TrustedLauncher(build, spec, device_index=0)
    call = launcher.prepare(bind_buffers(spec, inputs=[x], outputs=[y]), dims)   # plans every launch
    launcher.run(call)                                   # enqueue the steps once and wait
    timing = launcher.time(call, reps=100, warmup=10)    # CUDA events around the steps, per rep
    launcher.enqueue(call, stream=handle)                # or: queue them on another stream (the evaluator's
                                                         # module: torch's current one), nothing waited for

The cubin is loaded with `cuModuleLoadData` in the device's primary context (torch's, so tensors allocated by
torch are valid pointers); the steps go through `cuLaunchKernel` onto a non-blocking stream the launcher created
(`cuStreamCreate`, on first use); timing records a driver event before the first step and after the last on that stream, each
rep: the same brackets as `triton.testing.do_bench`, with an optional L2 flush (a memset of `l2_flush_bytes`)
before each rep, outside the brackets. Workspaces marked `zero` are cleared by `cuMemsetD8Async` inside the
brackets (work of the call).

Planning (`plan_launches`) is pure and runs on the CPU: sizes evaluated from the task's dimensions, grid and
block checked against CUDA's limits, every argument converted to the C type the kernel declares (pointer: the
tensor's or workspace's address, checked against the parameter's element type; scalars range-checked), in the
kernel's parameter order. The device half (`FormBackend`) needs a CUDA driver; tests give a fake one.
"""

from __future__ import annotations

import ctypes
import logging
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cudal1.kernel_form.errors import ExpressionError, KernelLaunchError
from cudal1.kernel_form.expressions import evaluate
from cudal1.kernel_form.spec import INTEGER_TYPES, KernelFormSpec, Size, task_dims
from cudal1.raw_cuda.arguments import CTYPES, CArg, dtype_name, pointer_accepts
from cudal1.raw_cuda.signature import KernelSignature, parse_kernel_signatures

logger = logging.getLogger(__name__)

MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIMS = (1024, 1024, 64)
MAX_GRID_DIMS = (2**31 - 1, 65535, 65535)
DYNAMIC_SHARED_DEFAULT_BYTES = 48 * 1024
MAX_DYNAMIC_SHARED_BYTES = 227 * 1024  # H100/H200 opt-in maximum per block
INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1), "int64": (-(2**63), 2**63 - 1),
              "uint64": (0, 2**64 - 1)}

TensorPointer = Callable[[Any], int]
MAX_PLANS = 64  # shape signatures whose plans a launcher keeps


@dataclass(frozen=True)
class PlannedLaunch:
    """One step, every size evaluated and every argument in C form."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dyn_smem: int
    cargs: tuple[CArg, ...]

    @property
    def empty(self) -> bool:
        """A grid with a zero extent launches nothing (an empty input)."""
        return 0 in self.grid

    def arg_layout(self) -> list[tuple[str, int]]:
        """(C type, bytes the driver copies) per argument, in order."""
        return [(a.ctype, ctypes.sizeof(CTYPES[a.ctype])) for a in self.cargs]


@dataclass
class PreparedCall:
    """Everything one call needs: the planned launches, the workspaces (kept alive here) to clear."""

    launches: list[PlannedLaunch]
    workspaces: dict[str, Any]  # name -> uint8 tensor
    zeroed: list[tuple[int, int]] = field(default_factory=list)  # (address, bytes) cleared before the steps


@dataclass(frozen=True)
class Timing:
    """Per-rep event times of the steps, in milliseconds."""

    times_ms: list[float]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.times_ms)


def _size(value: Size, dims: Mapping[str, int], field_name: str) -> int:
    try:
        return evaluate(value, dims)
    except ExpressionError as exc:
        raise KernelLaunchError(f"{field_name}: {exc}") from None


def _extents(values: Sequence[Size], dims: Mapping[str, int], what: str, where: str) -> tuple[int, int, int]:
    xyz = [_size(v, dims, f"{where}.{what}[{i}]") for i, v in enumerate(values)] + [1] * (3 - len(values))
    limits = MAX_GRID_DIMS if what == "grid" else MAX_BLOCK_DIMS
    low = 0 if what == "grid" else 1
    for i, (n, hi) in enumerate(zip(xyz, limits, strict=True)):
        if not low <= n <= hi:
            raise KernelLaunchError(f"{where}.{what}[{i}] is {n}; CUDA allows {low} to {hi}")
    if what == "block" and xyz[0] * xyz[1] * xyz[2] > MAX_THREADS_PER_BLOCK:
        raise KernelLaunchError(f"{where}.block {tuple(xyz)} has {xyz[0] * xyz[1] * xyz[2]} threads; the limit is "
                                f"{MAX_THREADS_PER_BLOCK}")
    return xyz[0], xyz[1], xyz[2]


def workspace_sizes(spec: KernelFormSpec, dims: Mapping[str, int], max_bytes: int) -> dict[str, int]:
    """Bytes of each workspace for `dims` (KernelLaunchError when one is < 1 or above `max_bytes`)."""
    out = {}
    for w in spec.workspaces:
        n = _size(w.bytes, dims, f"workspaces.{w.name}.bytes")
        if not 1 <= n <= max_bytes:
            raise KernelLaunchError(f"workspaces.{w.name}.bytes is {n}; allowed 1 to {max_bytes}")
        out[w.name] = n
    return out


def plan_launches(spec: KernelFormSpec, dims: Mapping[str, int], pointers: Mapping[str, int],
                  dtypes: Mapping[str, str], signatures: Mapping[str, KernelSignature] | None = None
                  ) -> list[PlannedLaunch]:
    """The launches of one call. `pointers`: device address of every buffer and workspace by name; `dtypes`: the
    torch dtype name ("float32") of every buffer (workspaces are bytes, any pointer type takes them)."""
    signatures = signatures if signatures is not None else parse_kernel_signatures(spec.source)
    planned = []
    for i, step in enumerate(spec.steps):
        where = f"steps[{i}]"
        sig = signatures.get(step.kernel)
        if sig is None or len(sig.params) != len(step.args):
            raise KernelLaunchError(f"{where}: the source has no matching kernel {step.kernel!r} (check the spec "
                                    "with check_against_source)")
        grid = _extents(step.grid, dims, "grid", where)
        block = _extents(step.block, dims, "block", where)
        smem = _size(step.dyn_smem, dims, f"{where}.dyn_smem")
        if not 0 <= smem <= MAX_DYNAMIC_SHARED_BYTES:
            raise KernelLaunchError(f"{where}.dyn_smem is {smem}; allowed 0 to {MAX_DYNAMIC_SHARED_BYTES}")
        cargs = []
        for j, (arg, param) in enumerate(zip(step.args, sig.params, strict=True)):
            at = f"{where}.args[{j}]"
            if arg.kind in ("buf", "workspace"):
                if arg.name not in pointers:
                    raise KernelLaunchError(f"{at}: no {arg.kind} {arg.name!r} was given")
                if arg.kind == "buf" and not pointer_accepts(param, dtypes[arg.name]):
                    raise KernelLaunchError(f"{at}: buffer {arg.name!r} holds {dtypes[arg.name]} but the kernel "
                                            f"reads {param.base_text} ({param.describe()})")
                cargs.append(CArg("pointer", int(pointers[arg.name])))
                continue
            if arg.type in INTEGER_TYPES:
                value = _size(arg.value, dims, f"{at}.scalar")
                lo, hi = INT_RANGES[arg.type]
                if not lo <= value <= hi:
                    raise KernelLaunchError(f"{at}.scalar is {value}, outside {arg.type} [{lo}, {hi}]")
                cargs.append(CArg(arg.type, value))
            else:
                value = arg.value if not isinstance(arg.value, str) else _size(arg.value, dims, f"{at}.scalar")
                cargs.append(CArg(arg.type, float(value)))
        planned.append(PlannedLaunch(step.kernel, grid, block, smem, tuple(cargs)))
    return planned


def bind_buffers(spec: KernelFormSpec, inputs: Sequence[Any], outputs: Sequence[Any],
                 weights: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The spec's buffer names mapped to the task's tensors (inputs and outputs of forward, the model's
    state_dict); KernelLaunchError names a binding the task does not have."""
    weights = weights or {}
    out = {}
    for b in spec.buffers:
        pool: Sequence[Any] | Mapping[str, Any] = {"input": inputs, "output": outputs, "weight": weights}[b.role]
        if (isinstance(b.key, int) and b.key >= len(pool)) or (isinstance(b.key, str) and b.key not in pool):
            have = len(pool) if not isinstance(pool, Mapping) else ", ".join(sorted(pool)) or "none"
            raise KernelLaunchError(f"buffers.{b.name}: the task has no {b.role} {b.key!r} ({b.role}s: {have})")
        out[b.name] = pool[b.key]  # type: ignore[index]
    return out


class FormBackend:
    """The driver calls of the launcher, through `cuda.bindings.driver`, in the device's primary context."""

    def __init__(self, device_index: int = 0) -> None:
        from cudal1.raw_cuda.backend import DriverBackend

        self._raw = DriverBackend()
        self._drv = self._raw._drv
        self.device_index = device_index
        self._raw.ensure_context(device_index)
        self._streams: dict[int, object] = {}

    def _check(self, result, what: str):
        try:
            return self._raw._check(result, what)
        except Exception as exc:  # noqa: BLE001 - re-raised as the form's own error
            raise KernelLaunchError(str(exc)) from None

    def load(self, cubin: bytes, names: Sequence[str]) -> dict[str, object]:
        module = self._raw.load_module(cubin, self.device_index)
        functions = {}
        for name in names:
            func = self._raw.get_function(module, name)
            if func is None:
                raise KernelLaunchError(f"the cubin has no kernel {name!r}")
            functions[name] = func
        return functions

    def create_stream(self) -> int:
        stream = self._check(self._drv.cuStreamCreate(int(self._drv.CUstream_flags.CU_STREAM_NON_BLOCKING)),
                             "cuStreamCreate")
        self._streams[int(stream)] = stream
        return int(stream)

    def allow_dynamic_shared(self, func: object, nbytes: int, kernel: str) -> None:
        self._raw.allow_dynamic_shared(func, nbytes, kernel)

    def launch(self, func: object, launch: PlannedLaunch, stream: int) -> None:
        self._raw.launch(func, launch.kernel, launch.grid, launch.block, launch.dyn_smem, stream,
                         launch.cargs, self.device_index)

    def _stream(self, handle: int) -> object:
        """The stream object of a raw handle: one this backend created, or another's (torch's current stream)."""
        return self._streams.get(handle) or self._raw._stream(handle)

    def memset(self, address: int, nbytes: int, stream: int) -> None:
        self._check(self._drv.cuMemsetD8Async(self._drv.CUdeviceptr(address), 0, nbytes, self._stream(stream)),
                    "cuMemsetD8Async")

    def new_event(self) -> object:
        return self._check(self._drv.cuEventCreate(int(self._drv.CUevent_flags.CU_EVENT_DEFAULT)), "cuEventCreate")

    def record(self, event: object, stream: int) -> None:
        self._check(self._drv.cuEventRecord(event, self._stream(stream)), "cuEventRecord")

    def elapsed_ms(self, start: object, end: object) -> float:
        return float(self._check(self._drv.cuEventElapsedTime(start, end), "cuEventElapsedTime"))

    def synchronize(self) -> None:
        self._check(self._drv.cuCtxSynchronize(), "cuCtxSynchronize")


def _torch_pointer(device_index: int) -> TensorPointer:
    def pointer(t: Any) -> int:
        if t.device.type != "cuda" or t.device.index != device_index:
            raise KernelLaunchError(f"a buffer is on {t.device}; the launcher runs on cuda:{device_index}")
        if not t.is_contiguous():
            raise KernelLaunchError(f"a buffer of shape {tuple(t.shape)} is not contiguous")
        return int(t.data_ptr())

    return pointer


class TrustedLauncher:
    """Loads a built candidate and runs its steps on its own stream (created on first use), or on a stream the
    caller names (`enqueue(call, stream=...)`). `backend`, `tensor_pointer` and `allocate` (bytes -> a
    tensor-like with data_ptr()) default to the driver and torch on `device_index`."""

    def __init__(self, cubin: bytes, spec: KernelFormSpec, *, device_index: int = 0, backend: Any = None,
                 tensor_pointer: TensorPointer | None = None, allocate: Callable[[int], Any] | None = None,
                 max_workspace_bytes: int = 16 * 2**30):
        self.spec = spec
        self.backend = backend if backend is not None else FormBackend(device_index)
        self.signatures = parse_kernel_signatures(spec.source)
        names = list(dict.fromkeys(s.kernel for s in spec.steps))
        self.functions = self.backend.load(cubin, names)
        self._own_stream: int | None = None
        self.tensor_pointer = tensor_pointer or _torch_pointer(device_index)
        self.allocate = allocate or self._torch_allocate(device_index)
        self.max_workspace_bytes = max_workspace_bytes
        self._smem_allowed: dict[str, int] = {}
        self._plans: dict[tuple, list[PlannedLaunch]] = {}

    @property
    def stream(self) -> int:
        """The launcher's own stream (created on first use, so a launcher that only enqueues on another stream
        makes none)."""
        if self._own_stream is None:
            self._own_stream = self.backend.create_stream()
        return self._own_stream

    @staticmethod
    def _torch_allocate(device_index: int) -> Callable[[int], Any]:
        def allocate(nbytes: int) -> Any:
            import torch

            return torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device_index}")

        return allocate

    def dims_for(self, buffers: Mapping[str, Any], constants: Mapping[str, Any] | None = None) -> dict[str, int]:
        """`spec.task_dims` from the buffers' shapes and the task's constants."""
        return task_dims({name: tuple(t.shape) for name, t in buffers.items()}, constants)

    def prepare(self, buffers: Mapping[str, Any], dims: Mapping[str, int]) -> PreparedCall:
        """Plan one call on `buffers` (name -> tensor, see `bind_buffers`), allocating its workspaces."""
        missing = [b.name for b in self.spec.buffers if b.name not in buffers]
        if missing:
            raise KernelLaunchError(f"buffers.{missing[0]}: no tensor was given")
        pointers = {name: self.tensor_pointer(t) for name, t in buffers.items()}
        dtypes = {name: dtype_name(t.dtype) for name, t in buffers.items()}
        sizes = workspace_sizes(self.spec, dims, self.max_workspace_bytes)
        workspaces = {name: self.allocate(n) for name, n in sizes.items()}
        for name, t in workspaces.items():
            pointers[name] = int(t.data_ptr())
        launches = self._with_pointers(self._plan(dims, dtypes, list(pointers)), list(pointers.values()))
        zeroed = [(pointers[w.name], int(workspaces[w.name].numel())) for w in self.spec.workspaces if w.zero]
        return PreparedCall(launches, workspaces, zeroed)

    def _plan(self, dims: Mapping[str, int], dtypes: Mapping[str, str], names: list[str]) -> list[PlannedLaunch]:
        """The launches for these dimensions and dtypes with each pointer argument holding its buffer's index in
        `names` (`_with_pointers` fills the addresses): planned once per shape signature, since a call of the
        evaluator's module is timed with this host work in it."""
        key = (tuple(sorted(dims.items())), tuple(sorted(dtypes.items())), tuple(names))
        plan = self._plans.get(key)
        if plan is None:
            plan = plan_launches(self.spec, dims, {name: i for i, name in enumerate(names)}, dtypes, self.signatures)
            for launch in plan:
                if launch.dyn_smem > max(DYNAMIC_SHARED_DEFAULT_BYTES, self._smem_allowed.get(launch.kernel, 0)):
                    self.backend.allow_dynamic_shared(self.functions[launch.kernel], launch.dyn_smem, launch.kernel)
                    self._smem_allowed[launch.kernel] = launch.dyn_smem
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    @staticmethod
    def _with_pointers(plan: list[PlannedLaunch], addresses: list[int]) -> list[PlannedLaunch]:
        return [PlannedLaunch(p.kernel, p.grid, p.block, p.dyn_smem,
                              tuple(CArg("pointer", addresses[a.value]) if a.ctype == "pointer" else a for a in p.cargs))
                for p in plan]

    def enqueue(self, call: PreparedCall, *, stream: int | None = None) -> None:
        """Clear the zeroed workspaces, then launch every non-empty step, in order, on `stream` (a raw stream
        handle, e.g. `torch.cuda.current_stream().cuda_stream`; default the launcher's own). Nothing is waited
        for."""
        handle = self.stream if stream is None else int(stream)
        for address, nbytes in call.zeroed:
            self.backend.memset(address, nbytes, handle)
        for launch in call.launches:
            if not launch.empty:
                self.backend.launch(self.functions[launch.kernel], launch, handle)

    def run(self, call: PreparedCall) -> None:
        """One call, waited for (work queued on other streams before it is waited for first)."""
        self.backend.synchronize()
        self.enqueue(call)
        self.backend.synchronize()

    def time(self, call: PreparedCall, *, reps: int = 100, warmup: int = 10, l2_flush_bytes: int = 0) -> Timing:
        """Event time of the steps, per rep: [flush] E_start steps E_end, all queued, then read."""
        if reps < 1 or warmup < 0:
            raise KernelLaunchError(f"reps={reps}, warmup={warmup}: need reps >= 1 and warmup >= 0")
        flush = self.allocate(l2_flush_bytes) if l2_flush_bytes > 0 else None
        self.backend.synchronize()
        for _ in range(warmup):
            self.enqueue(call)
        events = [(self.backend.new_event(), self.backend.new_event()) for _ in range(reps)]
        for start, end in events:
            if flush is not None:
                self.backend.memset(int(flush.data_ptr()), l2_flush_bytes, self.stream)
            self.backend.record(start, self.stream)
            self.enqueue(call)
            self.backend.record(end, self.stream)
        self.backend.synchronize()
        return Timing([self.backend.elapsed_ms(s, e) for s, e in events])
