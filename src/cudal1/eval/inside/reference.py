"""The reference's runner: loads the task, makes every call's inputs, runs and times the reference like the
candidate.

It never sees candidate code: its process imports the task's reference and cudal1's harness only. What it
reports (inputs, outputs, times, the reference's own float32 rounding noise) is what the parent compares the
candidate against.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

from cudal1.eval.inside.harness import (
    CallFailed,
    ModelSide,
    first_line,
    gpu_memory,
    use_device,
    use_exact_fp32,
)
from cudal1.eval.shared.arena import TensorArena, describe_value, tree_nbytes
from cudal1.eval.shared.compare import flatten, mostly_not_finite, relative_error
from cudal1.eval.shared.doorbell import Doorbell
from cudal1.eval.shared.protocol import (
    Analysis,
    Analyze,
    Attached,
    Call,
    Describe,
    Described,
    Done,
    FlushCpu,
    MakeInputs,
    Message,
    ModelSettings,
    ReferenceReady,
    Staged,
)
from cudal1.tasks.task import load_reference


class ReferenceFailed(Exception):
    """The reference itself failed (loading, its inputs, its construction or its forward)."""

    kind = "reference"

    def __init__(self, what: str, exc: BaseException):
        super().__init__(f"the reference failed ({what}): {first_line(exc)}")


#: What a runner reports of a module's constants, within the protocol's limits: the sizes and hyperparameters
#: the parent compares are short numbers and tuples; a long string (a kernel's source kept in a constant) is
#: cut, a long sequence given as its length.
CONSTANT_TEXT_CHARS = 1000
CONSTANT_ITEMS = 256
CONSTANT_DEPTH = 8
MAX_CONSTANTS = 512


def jsonable(value: Any, depth: int = 0) -> Any:
    """A constant as JSON carries it (tuples become lists), anything else as its repr, within the limits above."""
    if value is None or isinstance(value, (bool, int, float)):
        return value if not isinstance(value, int) or -2**63 <= value < 2**63 else repr(value)[:CONSTANT_TEXT_CHARS]
    if isinstance(value, str):
        return value[:CONSTANT_TEXT_CHARS]
    if isinstance(value, (tuple, list)) and len(value) <= CONSTANT_ITEMS and depth < CONSTANT_DEPTH:
        return [jsonable(v, depth + 1) for v in value]
    if isinstance(value, (tuple, list)):
        return f"<{type(value).__name__} of {len(value)} items>"
    return repr(value)[:CONSTANT_TEXT_CHARS]


def jsonable_constants(constants: dict[str, Any]) -> dict[str, Any]:
    """A module's constants (`tasks.task.module_constants`) as a runner reports them (`jsonable`)."""
    return {str(k)[:200]: jsonable(v) for k, v in list(constants.items())[:MAX_CONSTANTS]}


def configure(settings: ModelSettings) -> torch.device:
    """Device, CPU threads and numerics of a model runner, the same for both models."""
    device = use_device(settings.device)
    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    if settings.exact_fp32:
        use_exact_fp32()
    fraction = settings.gpu_memory_fraction
    if fraction and device.type == "cuda":
        # The same cap for both runners: cuDNN sizes its workspace (and so picks its algorithms) from what the
        # allocator may still give, and an uncapped reference's cache beside a capped candidate filled an H200.
        torch.cuda.set_per_process_memory_fraction(float(fraction), device)
    _no_progress_monitor()
    return device


def _no_progress_monitor() -> None:
    """tqdm (torch imports it) starts a monitor thread with its first progress bar, which torch.compile
    draws; in a runner that thread would count as the candidate's."""
    try:
        from tqdm import std
    except ImportError:
        return
    std.tqdm.monitor_interval = 0


def load_model(settings: ModelSettings) -> tuple[Any, Any]:
    """(the task's reference module, its `Model` on the device), as both model runners make them: the same
    init inputs and parameter seed."""
    try:
        reference = load_reference(settings.ref_source, settings.task_id, sizes=settings.sizes)
    except Exception as exc:  # noqa: BLE001 - TaskError or anything the module raised
        raise ReferenceFailed("loading its module", exc) from None
    try:
        init_inputs = list(reference.get_init_inputs())
        torch.manual_seed(settings.seed)
        model = reference.Model(*init_inputs)
        if isinstance(model, torch.nn.Module):
            model = model.to(torch.device(settings.device))
    except Exception as exc:  # noqa: BLE001
        raise ReferenceFailed("get_init_inputs and Model(...)", exc) from None
    return reference, model


class ReferenceRole:
    def __init__(self, request: Any):
        self.device = configure(request.model)
        t0 = time.perf_counter()
        self.reference, model = load_model(request.model)
        self.side = ModelSide(self.device, self.reference, model)
        self.setup_ms = (time.perf_counter() - t0) * 1e3
        self._model64: Any = None

    def ready(self) -> ReferenceReady:
        return ReferenceReady(constants=jsonable_constants(self.reference.constants),
                              setup_ms=self.setup_ms)

    def attach(self, arena: TensorArena, doorbell: Doorbell | None) -> Attached:
        return self.side.attach(arena, doorbell)

    def handle(self, request: Message) -> Message:
        try:
            if isinstance(request, Call):
                self._drop_float64()
                return self.side.call(request)
            if isinstance(request, MakeInputs):
                try:
                    tree = self.side.stage(request.seed, request.distribution, request.count)
                except Exception as exc:  # noqa: BLE001
                    raise ReferenceFailed("get_inputs", exc) from None
                return Staged(tree=tree, nbytes=tree_nbytes(tree))
            if isinstance(request, Analyze):
                return self._analyze(request)
            if isinstance(request, Describe):
                return self._describe(request.seed)
            if isinstance(request, FlushCpu):
                self.side.flush_cpu_cache()
                return Done()
        except CallFailed as exc:
            raise ReferenceFailed("forward", RuntimeError(exc.message)) from None
        raise ValueError(f"the reference's runner does not serve {request.OP}")

    def _describe(self, seed: int) -> Described:
        """Shapes and sizes of the inputs and outputs for one seed (the parent sizes the arenas from them),
        and the time of one untimed call (the first: it also warms the reference up)."""
        try:
            inputs = self.side.make_inputs(seed)
        except Exception as exc:  # noqa: BLE001
            raise ReferenceFailed("get_inputs", exc) from None
        t0 = time.perf_counter()
        out = self.side.untimed([x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
        call_ms = (time.perf_counter() - t0) * 1e3
        return Described(inputs=describe_value(inputs), outputs=describe_value(out), call_ms=call_ms,
                         memory=gpu_memory(self.device))

    def _analyze(self, request: Analyze) -> Analysis:
        """After a trial's bracket: the reference's own float32 error against a float64 run (first trial, its
        first call), its rounding noise on small outputs (per output, the largest over the bracket's calls),
        and whether most of a call's outputs were not finite (heavy inputs)."""
        group = self.side.read(request.inputs)
        outs = self.side.read(request.out)
        calls = [(list(i) if isinstance(i, (list, tuple)) else [i], o) for i, o in zip(group, outs, strict=True)]
        not_finite = any(mostly_not_finite(out) for _, out in calls) if request.heavy else False
        outs64: list[Any] | None = None
        ref_errors, skipped = None, ""
        if request.precision:
            outs64, why = self._float64_outputs(calls[0][0])
            ref_errors, skipped = self._precision(calls[0][1], outs64, why)
        noise = [self._noise(inputs, out, request.noise_atol, outs64 if i == 0 else None)
                 for i, (inputs, out) in enumerate(calls)]
        return Analysis(ref_errors=ref_errors, precision_skipped=skipped, noise=largest_noise(noise),
                        not_finite=not_finite)

    def _float64_outputs(self, inputs: list[Any]) -> tuple[list[Any] | None, str]:
        """The flat outputs of a float64 copy of the model on float64 copies of `inputs`, or (None, why not)."""
        try:
            if self._model64 is None:
                self._model64 = copy.deepcopy(self.side.model).double()
            inputs64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
            with torch.no_grad():
                return flatten(self._model64(*inputs64), strict=False), ""
        except Exception as exc:  # noqa: BLE001 - a model that cannot run in float64 (an fp8 op, a cuDNN gap, OOM)
            self._model64 = None  # nor keep its memory from the float32 reference's calls
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return None, f"the reference cannot run in float64 ({type(exc).__name__}: {str(exc)[:120]})"

    def _drop_float64(self) -> None:
        """Before timing: free the float64 copy and what its run left in the allocator's cache, so that the
        reference is timed with the memory the candidate's runner has (its own model, its own trials)."""
        if self._model64 is None:
            return
        self._model64 = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @staticmethod
    def _precision(out: Any, outs64: list[Any] | None, why: str) -> tuple[list[float | None] | None, str]:
        """Per output, the float32 reference's relative error against its float64 run (None for outputs that
        are not float32), for the parent's reduced-precision evidence; or (None, why it was skipped)."""
        outs = flatten(out, strict=False)
        fp32 = [isinstance(o, torch.Tensor) and o.dtype == torch.float32 for o in outs]
        if not any(fp32):
            return None, "no float32 output"
        if outs64 is None:
            return None, why
        return [relative_error(o64, o) if is32 else None for o, o64, is32 in zip(outs, outs64, fp32, strict=False)], ""

    def _noise(self, inputs: list[Any], out: Any, atol: float, outs64: list[Any] | None = None) -> list[float | None]:
        """The reference's own rounding error per output, max |float32 run - float64 run|, for the outputs
        small enough that the comparison falls back to their own scale (None elsewhere or when the model
        cannot run in float64)."""
        outs = flatten(out, strict=False)
        small = [isinstance(o, torch.Tensor) and o.is_floating_point() and o.numel() > 0
                 and float(o.detach().float().nan_to_num(0, 0, 0).abs().max()) < 10 * atol for o in outs]
        if not any(small):
            return [None] * len(outs)
        if outs64 is None:
            outs64, _ = self._float64_outputs(inputs)
        if outs64 is None:  # a model that cannot run in float64 keeps the plain rule
            return [None] * len(outs)
        noise: list[float | None] = []
        for o, o64, is_small in zip(outs, outs64, small, strict=False):
            if not is_small or not isinstance(o64, torch.Tensor) or o64.shape != o.shape:
                noise.append(None)
                continue
            diff = (o.detach().double() - o64.detach().double()).abs()
            finite = diff[torch.isfinite(diff)]
            noise.append(float(finite.max()) if finite.numel() else None)
        return noise


def largest_noise(per_call: list[list[float | None]]) -> list[float | None]:
    """Per output, the largest noise over a bracket's calls (None where any call has none: the plain rule)."""
    out: list[float | None] = []
    for values in zip(*per_call, strict=True):
        out.append(None if any(v is None for v in values) else max(v for v in values if v is not None))
    return out
