"""In-memory headers that let NVRTC compile what nvcc accepts: <cstdint>, <cmath>, <cfloat>, <climits>.

NVRTC has no C/C++ standard library, so `#include <cstdint>` (which LLM-written kernels use all the time)
fails with 'cannot open source file'. These small headers are handed to NVRTC by name; they define only
what device code needs. The fixed-width types match libcu++'s NVRTC definitions (64-bit types are
`long long`), so a source that also includes `<cuda/std/cstdint>` still compiles.

Limits: no `std::` math functions (`std::max`, `std::sqrt`); use the CUDA builtins (`fmaxf`, `sqrtf`) or
`cuda::std::`. nvcc builds never see these headers: it has the real ones.
"""

from __future__ import annotations

_STDINT = """#pragma once
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef long long intptr_t;
typedef unsigned long long uintptr_t;
namespace std {
using ::int8_t; using ::int16_t; using ::int32_t; using ::int64_t;
using ::uint8_t; using ::uint16_t; using ::uint32_t; using ::uint64_t;
using ::intptr_t; using ::uintptr_t; using ::size_t; using ::ptrdiff_t;
}
"""

_MATH = """#pragma once
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif
#ifndef M_SQRT1_2
#define M_SQRT1_2 0.70710678118654752440
#endif
"""

_FLOAT = """#pragma once
#define FLT_MAX 3.402823466e+38F
#define FLT_MIN 1.175494351e-38F
#define FLT_EPSILON 1.192092896e-07F
#define DBL_MAX 1.7976931348623158e+308
#define DBL_MIN 2.2250738585072014e-308
#define DBL_EPSILON 2.2204460492503131e-016
"""

_LIMITS = """#pragma once
#define CHAR_BIT 8
#define SCHAR_MIN (-128)
#define SCHAR_MAX 127
#define UCHAR_MAX 255
#define SHRT_MIN (-32768)
#define SHRT_MAX 32767
#define USHRT_MAX 65535
#define INT_MIN (-2147483647 - 1)
#define INT_MAX 2147483647
#define UINT_MAX 4294967295U
#define LLONG_MIN (-9223372036854775807LL - 1)
#define LLONG_MAX 9223372036854775807LL
#define ULLONG_MAX 18446744073709551615ULL
"""

# Rationale: device printf is an NVRTC builtin; the header only has to exist.
_EMPTY = "#pragma once\n"

NVRTC_SHIM_HEADERS: dict[str, str] = {
    "stdint.h": _STDINT, "cstdint": _STDINT,
    "math.h": _MATH, "cmath": _MATH,
    "float.h": _FLOAT, "cfloat": _FLOAT,
    "limits.h": _LIMITS, "climits": _LIMITS,
    "stdio.h": _EMPTY, "cstdio": _EMPTY,
}

# Prepended to every NVRTC source so that `int64_t` & co. work without an include, as they do under nvcc;
# `#line` keeps the line numbers of diagnostics those of the user's source.
NVRTC_PRELUDE = '#include <stdint.h>\n#line 1 "{name}"\n'
