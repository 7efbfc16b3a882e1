"""The trusted module a kernel-form candidate's runner imports (its `ModelNew` is `runtime.KernelFormModel`).

    source = module_source(spec_text, build.cubin, reference_source=task.source, task_id=task.id, sizes="full")

The evaluator's runner imports a candidate as a Python module with `class ModelNew`. For a kernel-form candidate
that module is cudal1's, not the candidate's: `module_source` writes the same code for every candidate
(`TEMPLATE`), and only five string constants differ: the spec's JSON text, the cubin in base64, the reference's
source, the task's id and the sizes. Each is written with `repr`, so nothing the candidate wrote can become
code (tests/kernel_form/test_module.py parses hostile specs' modules and compares their syntax trees with the
template's). The cubin thus travels as data inside the module's text (at most `MAX_CUBIN_BYTES`).

`ModelNew` is a `cudal1.kernel_form.runtime.KernelFormModel`:
- `__init__(*init_inputs)`: loads the task's reference (`tasks.task.load_reference`, at the evaluation's
  sizes) and constructs its `Model(*init_inputs)`. The runner seeds torch's generator just before it constructs
  `ModelNew`, with the seed the reference's runner sets before it constructs `Model`, and nothing draws from it
  in between, so the weights are the reference's; the spec's `{"weight": KEY}` buffers are entries of this
  model's `state_dict` (kept as a submodule, so the runner's `.to(device)` moves them). Then it loads the cubin
  with `TrustedLauncher` in torch's primary context of the current device.
- `forward(*inputs)`: allocates the outputs as the reference's for these inputs (shapes and dtypes learnt once
  per shape signature: from the reference run on meta tensors, or, for a model that cannot run there, from one
  run of the reference on copies of the inputs), binds the buffers, plans the steps (`launcher.plan_launches`:
  sizes, limits, argument types) and queues them on torch's current CUDA stream, so that the evaluator's clock
  times them as it times any candidate's work; returns the outputs as the reference returns them (a tensor, or a
  tuple or list of tensors).

What it trusts: the spec was parsed and checked against the kernels' signatures by the parent, which built and
scanned the cubin (`cudal1.eval.kernel_build`); here the spec is parsed again (the same checks) and every launch
is planned again per call. Not covered: what the kernels do on the device (docs/kernel_form.md, *Threat model*);
a reference whose outputs are not tensors (refused with a one-line error at the first call).
"""

from __future__ import annotations

import base64

from cudal1.kernel_form.errors import KernelLaunchError

#: The largest cubin the module carries (base64 makes it 4/3 larger; the runner's import message holds 4 MiB,
#: the reference's source and the spec included).
MAX_CUBIN_BYTES = 2 * 2**20

# The module every kernel-form candidate's runner imports: one template, five string constants.
TEMPLATE = '''"""A kernel-form candidate, as cudal1 runs it: the code is cudal1's, the candidate's spec and cubin are data."""

from cudal1.kernel_form.runtime import KernelFormModel

_SPEC_JSON = {spec}
_CUBIN_B64 = {cubin}
_REFERENCE_SOURCE = {reference}
_TASK_ID = {task_id}
_SIZES = {sizes}


class ModelNew(KernelFormModel):
    def __init__(self, *init_inputs):
        super().__init__(_SPEC_JSON, _CUBIN_B64, _REFERENCE_SOURCE, _TASK_ID, _SIZES, init_inputs)
'''


def module_source(spec_text: str, cubin: bytes, *, reference_source: str, task_id: str, sizes: str) -> str:
    """The module the runner imports for the kernel-form candidate `spec_text` built to `cubin` (module
    docstring); every value is a `repr`-written string constant of `TEMPLATE`."""
    if len(cubin) > MAX_CUBIN_BYTES:
        raise KernelLaunchError(f"the cubin is {len(cubin)} bytes; the kernel form takes at most {MAX_CUBIN_BYTES}")
    values = {"spec": spec_text, "cubin": base64.b64encode(cubin).decode("ascii"), "reference": reference_source,
              "task_id": task_id, "sizes": sizes}
    return TEMPLATE.format(**{k: repr(str(v)) for k, v in values.items()})


__all__ = ["MAX_CUBIN_BYTES", "TEMPLATE", "module_source"]
