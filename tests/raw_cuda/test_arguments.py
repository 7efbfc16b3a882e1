"""marshal_args: Python values -> C arguments by declared type, on the CPU with fake device pointers."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from cudal1.raw_cuda.arguments import CArg, make_tensor_pointer, marshal_args, to_ctypes
from cudal1.raw_cuda.errors import RawCudaLaunchError
from cudal1.raw_cuda.signature import parse_kernel_signatures

SRC = r'''
extern "C" __global__ void k(const float* __restrict__ x, float* y, int n, long long m, float a, double b,
                             bool flag, unsigned u, __half h, __nv_bfloat16 bf, const int* idx,
                             void* any, unsigned char* mask) {}
'''
PARAMS = parse_kernel_signatures(SRC)["k"].params


def fake_pointer(t: torch.Tensor) -> int:
    return 0x7F0000000000 + t.numel()  # stands in for a device address


def good_args(**override):
    args = dict(x=torch.zeros(4), y=torch.zeros(8), n=5, m=2**40, a=1.5, b=0.25, flag=True, u=7, h=1.0,
                bf=-2.0, idx=torch.zeros(3, dtype=torch.int32), any=torch.zeros(2, dtype=torch.int64),
                mask=torch.zeros(6, dtype=torch.bool))
    args.update(override)
    return tuple(args.values())


def marshal(args, **kw):
    return marshal_args("k", PARAMS, args, tensor_pointer=fake_pointer, **kw)


def test_declared_types_drive_conversion():
    out = marshal(good_args())
    assert [a.ctype for a in out] == ["pointer", "pointer", "int32", "int64", "float32", "float64", "bool",
                                      "uint32", "float16", "bfloat16", "pointer", "pointer", "pointer"]
    assert out[0].value == 0x7F0000000000 + 4 and out[1].value == 0x7F0000000000 + 8
    assert out[2].value == 5 and out[3].value == 2**40 and out[6].value is True
    assert out[8].value == 0x3C00  # 1.0 in IEEE half
    assert out[9].value == 0xC000  # -2.0 in bfloat16
    values, types = to_ctypes(out)
    assert types[:4] == (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64)
    assert types[8] is ctypes.c_uint16 and values[2] == 5


def test_numpy_scalars_are_accepted():
    out = marshal(good_args(n=np.int64(9), a=np.float32(0.5), u=np.uint32(3)))
    assert (out[2].value, out[4].value, out[7].value) == (9, 0.5, 3)


def test_int_to_float_param_is_converted():
    assert marshal(good_args(a=3))[4] == CArg("float32", 3.0)


@pytest.mark.parametrize(
    ("override", "index", "fragment"),
    [
        ({"n": 2**31}, 2, "does not fit in int"),
        ({"u": -1}, 7, "does not fit in unsigned"),
        ({"n": 3.0}, 2, "expects an integer, got float"),
        ({"flag": 2}, 6, "does not fit in bool"),
        ({"a": "1.0"}, 4, "expects a number, got str"),
        ({"n": torch.tensor(3)}, 2, "got a tensor for a by-value parameter"),
        ({"x": torch.zeros(4, dtype=torch.float16)}, 0, "got a float16 tensor"),
        ({"x": torch.zeros(4, dtype=torch.int32)}, 0, "got a int32 tensor"),
        ({"y": torch.zeros(4, dtype=torch.float64)}, 1, "got a float64 tensor"),
        ({"idx": torch.zeros(3, dtype=torch.int64)}, 10, "got a int64 tensor"),
        ({"x": torch.zeros(4, 4).t()}, 0, "not contiguous"),
        ({"x": 0x7F0000001000}, 0, "not .data_ptr()"),
        ({"x": [1.0, 2.0]}, 0, "expects a tensor, got list"),
    ],
)
def test_bad_arguments_name_kernel_and_parameter(override, index, fragment):
    with pytest.raises(RawCudaLaunchError) as info:
        marshal(good_args(**override))
    msg = str(info.value)
    assert msg.startswith(f"k: argument {index} (") and fragment in msg
    assert info.value.kernel == "k" and info.value.param_index == index


def test_integer_pointers_accept_same_width_and_bool_masks():
    out = marshal(good_args(idx=torch.zeros(3, dtype=torch.uint32), mask=torch.zeros(6, dtype=torch.uint8)))
    assert out[10].ctype == "pointer" and out[12].ctype == "pointer"


def test_none_is_a_null_pointer_and_strided_may_be_allowed():
    out = marshal(good_args(any=None, x=torch.zeros(4, 4).t()), allow_strided=True)
    assert out[11] == CArg("pointer", 0) and out[0].ctype == "pointer"


def test_wrong_count_shows_the_signature():
    with pytest.raises(RawCudaLaunchError, match=r"k: expects 13 argument\(s\) \(const float\* __restrict__ x"):
        marshal(good_args()[:-1])


def test_struct_by_value_is_rejected():
    params = parse_kernel_signatures('extern "C" __global__ void s(Params p) {}')["s"].params
    with pytest.raises(RawCudaLaunchError, match="'Params' cannot be passed by value"):
        marshal_args("s", params, (1,), tensor_pointer=fake_pointer)


def test_untyped_defaults_int64_float32_pointer():
    out = marshal_args("u", None, (torch.zeros(2), 3, True, 0.5, None), tensor_pointer=fake_pointer)
    assert [a.ctype for a in out] == ["pointer", "int64", "int64", "float32", "pointer"]
    with pytest.raises(RawCudaLaunchError, match="unsupported argument type"):
        marshal_args("u", None, ("x",), tensor_pointer=fake_pointer)


def test_device_check_of_the_default_tensor_pointer():
    with pytest.raises(RawCudaLaunchError, match=r"argument 0 .*tensor is on cpu; kernels take CUDA tensors"):
        marshal_args("k", PARAMS, good_args(), tensor_pointer=make_tensor_pointer(0))
