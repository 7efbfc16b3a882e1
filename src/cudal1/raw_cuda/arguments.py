"""Convert Python launch arguments to C kernel arguments, following the kernel's declared parameter types.

Pure functions (no GPU needed): the device pointer of a tensor comes from an injected `tensor_pointer`
callable, so the rules can be tested on the CPU with fake pointers.

The rules, per parameter:
- pointer (`T*`, `T x[]`): a torch.Tensor, or None for a null pointer. The tensor must be contiguous
  (unless `allow_strided=True`) and its dtype must match `T`: exactly for floating types
  (a `float*` rejects a float16 or an int32 tensor), by size for integer types (`unsigned*` takes an
  int32 tensor), and `void*` or an unknown `T` takes any tensor. Plain ints (`x.data_ptr()`) are rejected:
  pass the tensor so that its device and dtype can be checked.
- integer or bool by value: a Python/NumPy integer (or bool) that fits the declared type; floats and
  tensors are rejected rather than truncated.
- floating by value: any real number, converted to the declared `float`, `double`, `half` or
  `__nv_bfloat16`.
- a struct by value: rejected (pass pointers and scalars only).
When the kernel's signature is unknown, a tensor becomes a pointer, an int (or bool) an int64 (`long
long`) and a float a float32.
"""

from __future__ import annotations

import ctypes
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from cudal1.raw_cuda.errors import RawCudaLaunchError
from cudal1.raw_cuda.signature import SCALAR_TYPES, CParam

_INT_RANGES: dict[str, tuple[int, int]] = {
    "int8": (-(2**7), 2**7 - 1), "uint8": (0, 2**8 - 1), "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1), "int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1), "uint64": (0, 2**64 - 1), "bool": (0, 1),
}
_INT_SIZES = {"int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
              "uint64": 8}
_FLOAT_TYPES = {"float16", "bfloat16", "float32", "float64"}

CTYPES: dict[str, type] = {
    "pointer": ctypes.c_void_p, "bool": ctypes.c_bool,
    "int8": ctypes.c_int8, "uint8": ctypes.c_uint8, "int16": ctypes.c_int16, "uint16": ctypes.c_uint16,
    "int32": ctypes.c_int32, "uint32": ctypes.c_uint32, "int64": ctypes.c_int64, "uint64": ctypes.c_uint64,
    # Rationale: ctypes has no 16-bit float; the bit pattern is passed in a 16-bit integer slot, which the
    # driver copies byte for byte into the `half` / `__nv_bfloat16` parameter.
    "float16": ctypes.c_uint16, "bfloat16": ctypes.c_uint16,
    "float32": ctypes.c_float, "float64": ctypes.c_double,
}

TensorPointer = Callable[[torch.Tensor], int]


@dataclass(frozen=True)
class CArg:
    """One C argument: its C type ("pointer" or a SCALAR_TYPES name) and its value.

    For float16/bfloat16 the value is the raw 16-bit pattern.
    """

    ctype: str
    value: int | float | bool


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32: the names used by `CParam.base`."""
    return str(dtype).removeprefix("torch.")


def make_tensor_pointer(device_index: int) -> TensorPointer:
    """A `tensor_pointer` that accepts only CUDA tensors on `device_index` and returns their data pointer."""

    def tensor_pointer(t: torch.Tensor) -> int:
        if t.device.type != "cuda":
            raise ValueError(f"tensor is on {t.device}; kernels take CUDA tensors (move it with .cuda())")
        if t.device.index != device_index:
            raise ValueError(f"tensor is on {t.device} but the current device is cuda:{device_index}")
        return t.data_ptr()

    return tensor_pointer


def pointer_accepts(param: CParam, dtype: str) -> bool:
    """Whether a tensor of `dtype` may be passed to pointer parameter `param`."""
    want = param.base
    if param.pointer_depth > 1 or want in ("void", "opaque") or want == dtype:
        return True  # `T**` (a table of pointers), `void*` and unknown `T` are not checked
    if want in _INT_SIZES and dtype in _INT_SIZES:
        return _INT_SIZES[want] == _INT_SIZES[dtype]  # signedness may differ, width may not
    if want in ("int8", "uint8") and dtype == "bool":
        return True
    return want == "bool" and dtype in ("int8", "uint8")


def _fail(kernel: str, param: CParam | None, index: int, problem: str) -> RawCudaLaunchError:
    where = f"argument {param.describe()}" if param is not None else f"argument {index}"
    return RawCudaLaunchError(f"{kernel}: {where}: {problem}", kernel=kernel, param_index=index)


def _half_bits(value: float, ctype: str) -> int:
    dtype = torch.float16 if ctype == "float16" else torch.bfloat16
    return int(torch.tensor(float(value), dtype=dtype).view(torch.int16).item()) & 0xFFFF


def _pointer_arg(kernel: str, param: CParam | None, index: int, value: object,
                 tensor_pointer: TensorPointer, allow_strided: bool) -> CArg:
    if value is None:
        return CArg("pointer", 0)
    if not isinstance(value, torch.Tensor):
        hint = " (pass the tensor itself, not .data_ptr())" if isinstance(value, numbers.Integral) else ""
        raise _fail(kernel, param, index, f"expects a tensor, got {type(value).__name__}{hint}")
    if not allow_strided and not value.is_contiguous():
        raise _fail(kernel, param, index, f"tensor is not contiguous (shape {tuple(value.shape)}, stride "
                    f"{tuple(value.stride())}); call .contiguous() or pass allow_strided=True")
    if param is not None and not pointer_accepts(param, dtype_name(value.dtype)):
        raise _fail(kernel, param, index, f"got a {dtype_name(value.dtype)} tensor; the kernel reads "
                    f"{param.base_text} elements (convert with .to(...) or change the parameter type)")
    try:
        return CArg("pointer", int(tensor_pointer(value)))
    except ValueError as exc:
        raise _fail(kernel, param, index, str(exc)) from None


def _scalar_arg(kernel: str, param: CParam, index: int, value: object) -> CArg:
    ctype = param.base
    if isinstance(value, torch.Tensor):
        raise _fail(kernel, param, index, "got a tensor for a by-value parameter; pass a Python number "
                    "(e.g. t.item()) or declare the parameter as a pointer")
    if ctype not in SCALAR_TYPES:
        raise _fail(kernel, param, index, f"type '{param.base_text}' cannot be passed by value from Python; "
                    "pass pointers and scalars only")
    if ctype in _FLOAT_TYPES:
        if not isinstance(value, numbers.Real):
            raise _fail(kernel, param, index, f"expects a number, got {type(value).__name__}")
        if ctype in ("float16", "bfloat16"):
            return CArg(ctype, _half_bits(float(value), ctype))
        return CArg(ctype, float(value))
    if not isinstance(value, numbers.Integral):
        raise _fail(kernel, param, index, f"expects an integer, got {type(value).__name__} {value!r} "
                    "(convert explicitly with int(...))")
    lo, hi = _INT_RANGES[ctype]
    as_int = int(value)
    if not lo <= as_int <= hi:
        raise _fail(kernel, param, index, f"value {as_int} does not fit in {param.base_text} "
                    f"[{lo}, {hi}]")
    return CArg(ctype, bool(as_int) if ctype == "bool" else as_int)


def _untyped_arg(kernel: str, index: int, value: object, tensor_pointer: TensorPointer,
                 allow_strided: bool) -> CArg:
    if value is None or isinstance(value, torch.Tensor):
        return _pointer_arg(kernel, None, index, value, tensor_pointer, allow_strided)
    if isinstance(value, numbers.Integral):
        lo, hi = _INT_RANGES["int64"]
        if not lo <= int(value) <= hi:
            raise _fail(kernel, None, index, f"value {int(value)} does not fit in long long")
        return CArg("int64", int(value))
    if isinstance(value, numbers.Real):
        return CArg("float32", float(value))
    raise _fail(kernel, None, index, f"unsupported argument type {type(value).__name__}; pass tensors, "
                "ints, floats or None")


def marshal_args(kernel: str, params: Sequence[CParam] | None, args: Sequence[object], *,
                 tensor_pointer: TensorPointer, allow_strided: bool = False) -> list[CArg]:
    """Convert `args` to C arguments for `kernel`, checking them against `params` (None: unknown).

    Raises RawCudaLaunchError naming the kernel and the parameter index on the first bad argument.
    """
    if params is not None and len(args) != len(params):
        decl = ", ".join(p.decl for p in params)
        raise RawCudaLaunchError(f"{kernel}: expects {len(params)} argument(s) ({decl}), got {len(args)}",
                                 kernel=kernel)
    out: list[CArg] = []
    for i, value in enumerate(args):
        if params is None:
            out.append(_untyped_arg(kernel, i, value, tensor_pointer, allow_strided))
        elif params[i].is_pointer:
            out.append(_pointer_arg(kernel, params[i], i, value, tensor_pointer, allow_strided))
        else:
            out.append(_scalar_arg(kernel, params[i], i, value))
    return out


def to_ctypes(cargs: Sequence[CArg]) -> tuple[tuple[object, ...], tuple[type, ...]]:
    """The (values, ctypes types) pair that `cuda.bindings.driver.cuLaunchKernel` takes as kernelParams."""
    return tuple(a.value for a in cargs), tuple(CTYPES[a.ctype] for a in cargs)
