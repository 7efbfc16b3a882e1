"""The kernel-only candidate form: CUDA C++ source plus a launch spec as data, no candidate host code.

- `spec`: the launch spec (dataclasses, JSON parsing, validation, checks against the task and the source);
- `expressions`: the safe evaluator of size expressions (`ceil_div(N, 256)`);
- `build`: NVRTC (the evaluator runs it in a sandboxed child: `cudal1.eval.kernel_build`), then `scan`: the
  cubin's ELF tables and the PTX (device-side launches rejected, timer reads flagged);
- `launcher`: the trusted launcher (cuModuleLoadData, cuLaunchKernel on its own stream or the caller's,
  CUDA-event timing);
- `module`, `runtime`: the module the evaluator's runner imports for a candidate (cudal1's code, the spec and
  the cubin as string constants) and its `ModelNew`;
- `examples`: complete candidates.
Accepted by `cudal1 eval` (`cudal1.eval.kernel_build`); docs/kernel_form.md is the reference.
"""
