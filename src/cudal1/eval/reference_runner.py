"""The reference's runner: loads the task, builds its inputs and outputs, times it like the candidate.

It never sees candidate code: its process imports the task's reference and cudal1's harness only. What it
reports (inputs, outputs, times, the reference's own float32 rounding noise) is what the parent compares the
candidate against.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

from cudal1.eval.calls import CallFailed, ModelSide, first_line, gpu_memory, use_device, use_exact_fp32
from cudal1.eval.channel import Arena, describe_value
from cudal1.eval.correctness import mostly_not_finite
from cudal1.tasks.task import load_reference


class ReferenceFailed(Exception):
    """The reference itself failed (loading, its inputs, its construction or its forward)."""

    kind = "reference"

    def __init__(self, what: str, exc: BaseException):
        super().__init__(f"the reference failed ({what}): {first_line(exc)}")


def jsonable(value: Any) -> Any:
    """A constant as JSON carries it (tuples become lists), anything else as its repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    return repr(value)


def configure(message: dict[str, Any]) -> torch.device:
    """Device, CPU threads and numerics of a model runner, the same for both models."""
    device = use_device(str(message["device"]))
    threads = int(message.get("threads") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    if message.get("exact_fp32"):
        use_exact_fp32()
    fraction = message.get("gpu_memory_fraction")
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


class ReferenceRole:
    def __init__(self, message: dict[str, Any]):
        self.device = configure(message)
        t0 = time.perf_counter()
        try:
            self.reference = load_reference(message["ref_source"], message["task_id"], sizes=message.get("sizes", "full"))
        except Exception as exc:  # noqa: BLE001 - TaskError or anything the module raised
            raise ReferenceFailed("loading its module", exc) from None
        try:
            init_inputs = list(self.reference.get_init_inputs())
            torch.manual_seed(int(message.get("seed", 42)))
            model = self.reference.Model(*init_inputs)
            if isinstance(model, torch.nn.Module):
                model = model.to(self.device)
        except Exception as exc:  # noqa: BLE001
            raise ReferenceFailed("get_init_inputs and Model(...)", exc) from None
        self.side = ModelSide(self.device, self.reference, model)
        self.setup_ms = (time.perf_counter() - t0) * 1e3
        self._model64: Any = None

    def setup_reply(self) -> dict[str, Any]:
        return {"ok": True, "constants": {k: jsonable(v) for k, v in self.reference.constants.items()},
                "setup_ms": self.setup_ms}

    def attach(self, arena: Arena) -> dict[str, Any]:
        return self.side.attach(arena)

    def handle(self, op: str, message: dict[str, Any]) -> dict[str, Any]:
        try:
            if op == "describe":
                return self._describe(message)
            if op == "trial":
                return self._trial(message)
            if op == "prepare":
                self._drop_float64()
                return self.side.prepare(message)
            if op == "inputs":
                return self.side.inputs_request(message)
            if op == "call":
                self._drop_float64()
                return self.side.timed_request(message)
            if op == "flush":
                self.side.flush_cpu_cache()
                return {"ok": True}
        except CallFailed as exc:
            raise ReferenceFailed("forward", RuntimeError(exc.message)) from None
        return {"ok": False, "error": "unknown_op", "message": op}

    def _describe(self, message: dict[str, Any]) -> dict[str, Any]:
        """Shapes and sizes of the inputs and outputs for one seed (the parent sizes the arenas from them),
        and the time of one untimed call (the first: it also warms the reference up)."""
        try:
            inputs = self.side.make_inputs(int(message["seed"]))
        except Exception as exc:  # noqa: BLE001
            raise ReferenceFailed("get_inputs", exc) from None
        t0 = time.perf_counter()
        out = self.side.call([x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
        call_ms = (time.perf_counter() - t0) * 1e3
        return {"ok": True, "inputs": describe_value(inputs), "outputs": describe_value(out), "call_ms": call_ms,
                "memory": gpu_memory(self.device)}

    def _trial(self, message: dict[str, Any]) -> dict[str, Any]:
        """A correctness trial: inputs (committed to `in`), outputs and inputs after the call (to `out`), and
        with `noise_atol` the reference's own rounding noise (see `_noise`)."""
        assert self.side.arena is not None, "no arena attached"
        try:
            inputs = self.side.inputs_from(message)
        except Exception as exc:  # noqa: BLE001
            raise ReferenceFailed("get_inputs", exc) from None
        in_tree = self.side.arena.pack(inputs, "in")
        working = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        out = self.side.call(working)
        reply = {"ok": True, "in": in_tree, "out": self.side.commit((out, working))}
        if message.get("distribution") == "heavy":
            reply["not_finite"] = mostly_not_finite(out)
        outs64: list[Any] | None = None
        if message.get("precision"):
            outs64, why = self._float64_outputs(inputs)
            reply.update(self._precision(out, outs64, why))
        if message.get("noise_atol") is not None:
            reply["noise"] = self._noise(inputs, out, float(message["noise_atol"]), outs64)
        reply["memory"] = gpu_memory(self.device)
        return reply

    def _float64_outputs(self, inputs: list[Any]) -> tuple[list[Any] | None, str]:
        """The flat outputs of a float64 copy of the model on float64 copies of `inputs`, or (None, why not)."""
        from cudal1.eval.correctness import flatten

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

    def _precision(self, out: Any, outs64: list[Any] | None, why: str) -> dict[str, Any]:
        """`ref_errors`: per output, the float32 reference's relative error against its float64 run (None for
        outputs that are not float32), for the parent's reduced-precision evidence; or `precision_skipped`."""
        from cudal1.eval.correctness import flatten, relative_error

        outs = flatten(out, strict=False)
        fp32 = [isinstance(o, torch.Tensor) and o.dtype == torch.float32 for o in outs]
        if not any(fp32):
            return {"precision_skipped": "no float32 output"}
        if outs64 is None:
            return {"precision_skipped": why}
        return {"ref_errors": [relative_error(o64, o) if is32 else None
                               for o, o64, is32 in zip(outs, outs64, fp32, strict=False)]}

    def _noise(self, inputs: list[Any], out: Any, atol: float, outs64: list[Any] | None = None) -> list[float | None]:
        """The reference's own rounding error per output, max |float32 run - float64 run|, for the outputs
        small enough that the comparison falls back to their own scale (None elsewhere or when the model
        cannot run in float64)."""
        from cudal1.eval.correctness import flatten

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
