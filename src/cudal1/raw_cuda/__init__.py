"""cudal1's fast candidate form: plain CUDA C kernels compiled by NVRTC (or nvcc) in well under a second,
cached by content hash, and launched on torch's current CUDA stream with tensors as arguments.

    from cudal1.raw_cuda import load_kernels
    kernels = load_kernels(SOURCE)        # SOURCE: extern "C" __global__ kernels, CUDA headers only
    kernels.relu_kernel(grid=((n + 255) // 256,), block=(256,), args=(x, y, n))

`compile_only` builds without a GPU (the evaluator's compile stage, CPU tests); `launch_log` tells the
evaluator which kernels were launched on which streams. See docs/raw_cuda.md.
"""

from cudal1.raw_cuda.arguments import CArg, marshal_args
from cudal1.raw_cuda.compiler import CompileResult, compile_only, device_arch, normalize_arch
from cudal1.raw_cuda.errors import RawCudaCompileError, RawCudaError, RawCudaLaunchError, trim_compile_log
from cudal1.raw_cuda.launcher import (
    KernelSet,
    LaunchLog,
    RawKernel,
    launch_log,
    load_kernels,
    reset_launch_log,
)
from cudal1.raw_cuda.signature import CParam, KernelSignature, parse_kernel_signatures

__all__ = [
    "CArg", "CParam", "CompileResult", "KernelSet", "KernelSignature", "LaunchLog", "RawCudaCompileError",
    "RawCudaError", "RawCudaLaunchError", "RawKernel", "compile_only", "device_arch", "launch_log",
    "load_kernels", "marshal_args", "normalize_arch", "parse_kernel_signatures", "reset_launch_log",
    "trim_compile_log",
]
