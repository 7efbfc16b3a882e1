"""`KernelFormModel`: what the generated module's `ModelNew` is (`module.py`), in the candidate's runner.

- `__init__(spec_json, cubin_b64, reference_source, task_id, sizes, init_inputs)`: parses the spec (the parent's
  checks again), loads the task's reference (`tasks.task.load_reference`, at the evaluation's sizes) and
  constructs its `Model(*init_inputs)`: the runner seeds torch's generator just before it constructs `ModelNew`,
  with the seed the reference's runner sets before constructing `Model`, and nothing draws from it in between,
  so the weights are the reference's. The spec's `{"weight": KEY}` buffers are entries of that model's
  `state_dict`; the model is a submodule, so the runner's `.to(device)` moves it. The cubin is loaded with
  `TrustedLauncher` in torch's primary context of the current device.
- `forward(*inputs)`: allocates the outputs as the reference's for these inputs (`output_meta`), binds the
  buffers, plans the steps (sizes, limits, argument types: `launcher.plan_launches`) and queues them on torch's
  current CUDA stream, so that the evaluator's clock times them as it times any candidate's work; returns the
  outputs as the reference returns them (a tensor, or a tuple or list of tensors).

Output shapes and dtypes are learnt once per shape signature of the inputs: from the reference run on meta
tensors (no device work), or, for a model that cannot run there (an op without a meta kernel, a value read), from
one run of the reference on copies of the inputs. Either way they are the reference's own, exactly.

Not covered: what the kernels do on the device (docs/kernel_form.md, *Threat model*); a reference whose outputs
are not tensors (a one-line error at the first call: the form cannot compute them).
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Sequence
from typing import Any

import torch

from cudal1.kernel_form.errors import KernelLaunchError
from cudal1.kernel_form.launcher import TrustedLauncher, bind_buffers
from cudal1.kernel_form.spec import parse_spec, task_dims

OutputMeta = tuple[str, list[tuple[tuple[int, ...], torch.dtype]]]  # ("tensor" | "tuple" | "list", (shape, dtype))


def flat_outputs(out: Any) -> tuple[str, list[torch.Tensor]]:
    """(how the reference returns its outputs: "tensor", "tuple" or "list"; the tensors), or KernelLaunchError."""
    if isinstance(out, torch.Tensor):
        return "tensor", [out]
    if type(out) in (tuple, list) and all(isinstance(o, torch.Tensor) for o in out):
        return type(out).__name__, list(out)
    raise KernelLaunchError(f"the reference returns {type(out).__name__}, not a tensor or a tuple or list of "
                            "tensors: the kernel form cannot compute it")


class KernelFormModel(torch.nn.Module):
    """The generated `ModelNew` (module docstring). `launcher` replaces the trusted launcher (tests: a fake
    driver backend); without one the cubin is loaded on the current CUDA device."""

    def __init__(self, spec_json: str, cubin_b64: str, reference_source: str, task_id: str, sizes: str,
                 init_inputs: Sequence[Any], *, launcher: Any = None):
        super().__init__()
        from cudal1.tasks.task import load_reference

        self.spec = parse_spec(spec_json)
        task = load_reference(reference_source, task_id, sizes=sizes)
        self.reference = task.Model(*init_inputs)  # after the runner's seed: the reference's weights
        self.constants = {k: v for k, v in task.constants.items() if type(v) is int}
        if launcher is None:
            if not torch.cuda.is_available():
                raise KernelLaunchError("the kernel form runs its kernels on a CUDA GPU; none is visible here")
            launcher = TrustedLauncher(base64.b64decode(cubin_b64), self.spec, device_index=torch.cuda.current_device())
        self.launcher = launcher
        self.n_outputs = sum(b.role == "output" for b in self.spec.buffers)
        self._weight_keys = [str(b.key) for b in self.spec.buffers if b.role == "weight"]
        self._weights: dict[str, torch.Tensor] | None = None
        self._outputs: dict[tuple, OutputMeta] = {}

    def output_meta(self, inputs: Sequence[Any]) -> OutputMeta:
        """How the reference returns its outputs, and each one's (shape, dtype), for inputs of these shapes and
        dtypes (module docstring)."""
        key = tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else ("value", repr(x)[:200])
                    for x in inputs)
        found = self._outputs.get(key)
        if found is None:
            kind, outs = flat_outputs(self._reference_outputs(inputs))
            found = self._outputs[key] = (kind, [(tuple(o.shape), o.dtype) for o in outs])
        return found

    def _reference_outputs(self, inputs: Sequence[Any]) -> Any:
        state = {name: torch.empty_like(t, device="meta") for name, t in
                 itertools.chain(self.reference.named_parameters(), self.reference.named_buffers())}
        meta = tuple(torch.empty_like(x, device="meta") if isinstance(x, torch.Tensor) else x for x in inputs)
        with torch.no_grad():
            try:
                return torch.func.functional_call(self.reference, state, meta)
            except Exception:  # noqa: BLE001 - an op without a meta kernel, a value read: run it once for real
                return self.reference(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])

    def weights(self) -> dict[str, torch.Tensor]:
        """The state_dict entries the spec binds, contiguous; taken at the first call (after the runner's `.to`).
        A key the model lacks is left out: `bind_buffers` names it."""
        if self._weights is None:
            state = self.reference.state_dict()
            self._weights = {k: state[k].contiguous() for k in self._weight_keys if k in state}
        return self._weights

    def forward(self, *inputs: Any) -> Any:
        kind, meta = self.output_meta(inputs)
        if len(meta) != self.n_outputs:
            raise KernelLaunchError(f"the spec binds {self.n_outputs} output(s) but the reference returns {len(meta)}")
        device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), None)
        outs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in meta]
        buffers = bind_buffers(self.spec, inputs, outs, self.weights())
        for name, value in buffers.items():
            if not isinstance(value, torch.Tensor):
                raise KernelLaunchError(f"buffers.{name}: a {type(value).__name__}, not a tensor (bind tensors only; "
                                        "an integer input's value is not a size name)")
        call = self.launcher.prepare(buffers, task_dims({n: tuple(t.shape) for n, t in buffers.items()},
                                                        self.constants))
        on_gpu = device is not None and device.type == "cuda"
        self.launcher.enqueue(call, stream=torch.cuda.current_stream(device).cuda_stream if on_gpu else None)
        return outs[0] if kind == "tensor" else tuple(outs) if kind == "tuple" else outs


__all__ = ["KernelFormModel", "flat_outputs"]
