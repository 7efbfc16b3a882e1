"""parse_kernel_signatures / parse_param: kernel discovery and C declarator parsing."""

from __future__ import annotations

import pytest

from cudal1.raw_cuda.signature import parse_kernel_signatures, parse_param


@pytest.mark.parametrize(
    ("decl", "name", "base", "depth", "is_const"),
    [
        ("float* x", "x", "float32", 1, False),
        ("float *x", "x", "float32", 1, False),
        ("const float* __restrict__ x", "x", "float32", 1, True),
        ("const float * const __restrict__ x", "x", "float32", 1, True),
        ("float* __restrict__ const out", "out", "float32", 1, False),
        ("float x[]", "x", "float32", 1, False),
        ("float** table", "table", "float32", 2, False),
        ("int n", "n", "int32", 0, False),
        ("const int n", "n", "int32", 0, True),
        ("unsigned n", "n", "uint32", 0, False),
        ("unsigned int n", "n", "uint32", 0, False),
        ("signed char c", "c", "int8", 0, False),
        ("unsigned char* mask", "mask", "uint8", 1, False),
        ("short s", "s", "int16", 0, False),
        ("unsigned short s", "s", "uint16", 0, False),
        ("long n", "n", "int64", 0, False),
        ("long long n", "n", "int64", 0, False),
        ("long long int n", "n", "int64", 0, False),
        ("unsigned long long int n", "n", "uint64", 0, False),
        ("int64_t n", "n", "int64", 0, False),
        ("std::int64_t n", "n", "int64", 0, False),
        ("uint32_t n", "n", "uint32", 0, False),
        ("size_t n", "n", "uint64", 0, False),
        ("std::size_t n", "n", "uint64", 0, False),
        ("float a", "a", "float32", 0, False),
        ("double a", "a", "float64", 0, False),
        ("bool flag", "flag", "bool", 0, False),
        ("half h", "h", "float16", 0, False),
        ("const __half* __restrict__ h", "h", "float16", 1, True),
        ("__nv_bfloat16* b", "b", "bfloat16", 1, False),
        ("const float4* __restrict__ v", "v", "float32", 1, True),
        ("__half2* h2", "h2", "float16", 1, False),
        ("void* p", "p", "void", 1, False),
        ("const void* p", "p", "void", 1, True),
        ("int", None, "int32", 0, False),
        ("const float*", None, "float32", 1, True),
        ("long long", None, "int64", 0, False),
        ("T* x", "x", "opaque", 1, False),
        ("__grid_constant__ const Params p", "p", "opaque", 0, True),
        ("long double x", "x", "opaque", 0, False),
        ("Foo<int, 2>* f", "f", "opaque", 1, False),
        ("volatile int* flag", "flag", "int32", 1, False),
    ],
)
def test_parse_param(decl, name, base, depth, is_const):
    p = parse_param(decl, 3)
    assert (p.name, p.base, p.pointer_depth, p.is_const, p.index) == (name, base, depth, is_const, 3)


SOURCE = r'''
#include <cuda_fp16.h>
#define BLOCK 256
// extern "C" __global__ void commented_out(int x) {}
/* extern "C" __global__ void also_commented(int x) {} */
extern "C" __global__ void __launch_bounds__(256) relu(const float* __restrict__ x, float* y, long long n) {
    if (n) y[0] = x[0];
}

extern "C" __global__ void proto(int a, float b);

extern "C" {
__global__ void in_block(unsigned n,
                         const __half2* h,
                         std::size_t s) {}
__global__ void no_args(void) {}
__global__ void __maxnreg__(64) empty() {}
}

template <typename T> __global__ void templated(T* x) {}
__global__ void cpp_linkage(int) {}
extern "C" __global__ void proto(int a, float b) {}
'''


def test_finds_kernels_and_linkage():
    sigs = parse_kernel_signatures(SOURCE)
    assert set(sigs) == {"relu", "proto", "in_block", "no_args", "empty", "templated", "cpp_linkage"}
    assert {n for n, s in sigs.items() if s.extern_c} == {"relu", "proto", "in_block", "no_args", "empty"}
    relu = sigs["relu"]
    assert [p.base for p in relu.params] == ["float32", "float32", "int64"]
    assert relu.line == 6
    assert [p.name for p in sigs["in_block"].params] == ["n", "h", "s"]
    assert sigs["no_args"].params == () and sigs["empty"].params == ()
    assert [p.base for p in sigs["proto"].params] == ["int32", "float32"]


def test_describe_is_readable():
    sig = parse_kernel_signatures(SOURCE)["relu"]
    assert sig.describe() == "relu(const float* __restrict__ x, float* y, long long n)"
    assert sig.params[2].describe() == '2 ("n", long long)'


def test_macro_declared_kernel_is_not_found():
    src = '#define KERNEL extern "C" __global__\nKERNEL void k(int n) {}\n'
    assert parse_kernel_signatures(src) == {}


def test_preprocessor_lines_are_ignored():
    src = '#if 0\n#define X __global__ void fake(int)\n#endif\nextern "C" __global__ void real(int n) {}\n'
    assert list(parse_kernel_signatures(src)) == ["real"]
