"""The kernel-only candidate form: CUDA C++ source plus a launch spec as data, no candidate host code.

- `spec`: the launch spec (dataclasses, JSON parsing, validation, checks against the task and the source);
- `expressions`: the safe evaluator of size expressions (`ceil_div(N, 256)`);
- `build`: NVRTC in a sandboxed child, then `scan`: the cubin's ELF tables and the PTX (device-side launches
  rejected, timer reads flagged);
- `launcher`: the trusted launcher (cuModuleLoadData, cuLaunchKernel on its own stream, CUDA-event timing);
- `examples`: complete candidates.
Not yet accepted by `cudal1 eval`; docs/kernel_form.md is the reference.
"""
