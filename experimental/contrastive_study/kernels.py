"""Recipe -> CUDA: the kernel templates of the study, their launch configuration, and the candidate module.

One template per kind (`ew`, `row`, `tr`); the recipe's fields become `#define`s at the top of the source,
the family's math is spliced in, so the kernel a recipe stands for is plain to read (`kernel_source`). The
launch configuration (grid, block, dynamic shared memory, arguments) is Python source too
(`launch_source`): the GPU micro-benchmark executes it, and the candidate module the evaluator runs embeds
the same text (`candidate_source`), so the table and the spot-check launch exactly the same kernels.

Scalar kernel arguments are `int` (every size here is below 2^31), so any launcher that passes Python ints as
C ints can launch them (cudal1's raw_cuda converts by the declared type; torch's own NVRTC kernels take C ints).

Limits that make some recipes fail, as they would for a hand-written kernel: a static shared tile above
48 KB does not compile (ptxas); a row staged in dynamic shared memory above the block's opt-in limit
(`MAX_DYNAMIC_SHARED_BYTES`, 227 KB on Hopper) cannot launch (`launch_config` says so before any launch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from experimental.contrastive_study.ops import StudyTask
from experimental.contrastive_study.recipes import Recipe

#: Hopper's opt-in shared memory per block (227 KB), less the row kernel's static reduction scratch.
MAX_DYNAMIC_SHARED_BYTES = 227 * 1024 - 128
KERNEL_NAME = {"ew": "ew_kernel", "row": "row_kernel", "tr": "tr_kernel"}
_VEC = {1: "float", 2: "float2", 4: "float4"}

_PRELUDE = """// recipe: {recipe} ({family}, {kind})
#define T {threads}
#define VW {vec}
#define IPT {items}
#define GRID_STRIDE {stride}
#define STAGE {stage}
#define MAP {mapping}
#define TWO_INPUTS {two}
typedef {vec_t} vec;  // VW floats per global load

__device__ __forceinline__ float op(float a, float b) {{ return {expr}; }}
"""

_EW = """
__device__ __forceinline__ vec apply(vec a, vec b) {
    vec r;
    const float* fa = reinterpret_cast<const float*>(&a);
    const float* fb = reinterpret_cast<const float*>(&b);
    float* fr = reinterpret_cast<float*>(&r);
#pragma unroll
    for (int e = 0; e < VW; ++e) fr[e] = op(fa[e], fb[e]);
    return r;
}

// y = op(x, z) over nvec vectors; a block takes chunks of T * IPT vectors (one chunk, or every
// gridDim.x-th with GRID_STRIDE); MAP 0: thread t takes vectors k * T + t of a chunk, MAP 1: t * IPT + k.
extern "C" __global__ void __launch_bounds__(T) ew_kernel(const float* __restrict__ x, const float* __restrict__ z,
                                                          float* __restrict__ y, int nvec) {
    const vec* xv = reinterpret_cast<const vec*>(x);
    const vec* zv = reinterpret_cast<const vec*>(z);
    vec* yv = reinterpret_cast<vec*>(y);
    const long long chunk = (long long)T * IPT;
    const long long step = GRID_STRIDE ? (long long)gridDim.x * chunk : (long long)nvec;
#if STAGE
    __shared__ vec tile[T * IPT];  // the chunk, loaded and stored coalesced
#endif
    for (long long base = (long long)blockIdx.x * chunk; base < nvec; base += step) {
#if STAGE
#pragma unroll
        for (int k = 0; k < IPT; ++k) {
            const int j = k * T + threadIdx.x;
            if (base + j < nvec) tile[j] = xv[base + j];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < IPT; ++k) {
            const int j = MAP ? threadIdx.x * IPT + k : k * T + threadIdx.x;
            if (base + j < nvec) tile[j] = apply(tile[j], TWO_INPUTS ? zv[base + j] : tile[j]);
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < IPT; ++k) {
            const int j = k * T + threadIdx.x;
            if (base + j < nvec) yv[base + j] = tile[j];
        }
        __syncthreads();  // the next chunk overwrites the tile
#else
        vec a[IPT], b[IPT];
#pragma unroll
        for (int k = 0; k < IPT; ++k) {
            const long long g = base + (MAP ? threadIdx.x * IPT + k : k * T + threadIdx.x);
            if (g < nvec) {
                a[k] = xv[g];
                b[k] = TWO_INPUTS ? zv[g] : a[k];
            }
        }
#pragma unroll
        for (int k = 0; k < IPT; ++k) {
            const long long g = base + (MAP ? threadIdx.x * IPT + k : k * T + threadIdx.x);
            if (g < nvec) yv[g] = apply(a[k], b[k]);
        }
#endif
    }
}
"""

_ROW_HEAD = """
#define WSIZE (MAP ? T : 32)        // threads per row: a block (MAP 1) or a warp (MAP 0)
#define WORKERS (MAP ? 1 : T / 32)  // rows a block works on at once
#define LOWEST (-3.402823466e+38f)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The row's sum (max) in every thread of its worker: a warp's shuffles, or a block's through `red`.
__device__ __forceinline__ float row_sum_of(float v, float* red) {
    v = warp_sum(v);
#if MAP
    __syncthreads();  // red may still be read by the previous reduction
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = 0.0f;
#pragma unroll
    for (int w = 0; w < T / 32; ++w) v += red[w];
#endif
    return v;
}

__device__ __forceinline__ float row_max_of(float v, float* red) {
    v = warp_max(v);
#if MAP
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = LOWEST;
#pragma unroll
    for (int w = 0; w < T / 32; ++w) v = fmaxf(v, red[w]);
#endif
    return v;
}

// One row per worker (rows [blockIdx.x * WORKERS + worker], then every gridDim.x * WORKERS-th with
// GRID_STRIDE); a pass over a row loads IPT vectors per thread before using them; STAGE keeps the row in
// shared memory for the later passes (each thread reads back what it stored: no barrier needed).
extern "C" __global__ void __launch_bounds__(T) row_kernel(const float* __restrict__ x, float* __restrict__ y,
                                                           int rows, int cols) {
    extern __shared__ float4 dynamic_smem[];
    __shared__ float red[32];
    const int wt = MAP ? threadIdx.x : (threadIdx.x & 31);
    const int worker = MAP ? 0 : (threadIdx.x >> 5);
    const int nv = cols / VW;
    const long long step = GRID_STRIDE ? (long long)gridDim.x * WORKERS : (long long)rows;
    for (long long r = (long long)blockIdx.x * WORKERS + worker; r < rows; r += step) {
        const vec* src = reinterpret_cast<const vec*>(x + r * cols);
#if STAGE
        vec* stage = reinterpret_cast<vec*>(reinterpret_cast<float*>(dynamic_smem) + (long long)worker * cols);
#define AGAIN stage  // a later pass reads the staged row
#else
#define AGAIN src
#endif
"""

_ROW_TAIL = """    }
}
"""

_TR = """
#define TW (32 * VW)       // a staged tile: 32 rows x TW columns of x
#define PAD (MAP ? 0 : 1)  // MAP 1: no padding column (bank conflicts on the transposed read)

// y (C x R) = op(x^T, z) for x (R x C) and z (C x R). Without STAGE, one vector of consecutive elements per
// item: MAP 0 walks x (coalesced reads, strided writes), MAP 1 walks y (strided reads, coalesced writes).
// With STAGE, a block takes IPT tiles at a time through shared memory (both sides coalesced).
extern "C" __global__ void __launch_bounds__(T) tr_kernel(const float* __restrict__ x, const float* __restrict__ z,
                                                          float* __restrict__ y, int R, int C) {
#if STAGE
    const vec* xv = reinterpret_cast<const vec*>(x);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __shared__ float tile[IPT][32][TW + PAD];
    const int tiles_c = (C + TW - 1) / TW;
    const long long ntiles = (long long)((R + 31) / 32) * tiles_c;
    const long long step = GRID_STRIDE ? (long long)gridDim.x * IPT : ntiles;
    for (long long t0 = (long long)blockIdx.x * IPT; t0 < ntiles; t0 += step) {
#pragma unroll
        for (int k = 0; k < IPT; ++k) {
            const long long t = t0 + k;
            if (t >= ntiles) break;
            const int i0 = (int)(t / tiles_c) * 32, j0 = (int)(t % tiles_c) * TW;
            for (int rr = warp; rr < 32; rr += T / 32) {
                const int i = i0 + rr, j = j0 + lane * VW;
                if (i < R && j < C) {
                    const vec a = xv[((long long)i * C + j) / VW];
                    const float* fa = reinterpret_cast<const float*>(&a);
#pragma unroll
                    for (int e = 0; e < VW; ++e) tile[k][rr][lane * VW + e] = fa[e];
                }
            }
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < IPT; ++k) {
            const long long t = t0 + k;
            if (t >= ntiles) break;
            const int i0 = (int)(t / tiles_c) * 32, j0 = (int)(t % tiles_c) * TW;
            for (int cc = warp; cc < TW; cc += T / 32) {
                const int j = j0 + cc, i = i0 + lane;
                if (j < C && i < R) {
                    const long long o = (long long)j * R + i;
                    y[o] = op(tile[k][lane][cc], TWO_INPUTS ? z[o] : 0.0f);
                }
            }
        }
        __syncthreads();  // the next tiles overwrite these
    }
#else
    const long long nvec = (long long)R * C / VW;
    const long long chunk = (long long)T * IPT;
    const long long step = GRID_STRIDE ? (long long)gridDim.x * chunk : nvec;
    for (long long base = (long long)blockIdx.x * chunk; base < nvec; base += step) {
#pragma unroll
        for (int k = 0; k < IPT; ++k) {
            const long long g = base + (long long)k * T + threadIdx.x;
            if (g >= nvec) continue;
            const long long e0 = g * VW;
#if MAP == 0
            const long long i = e0 / C, j = e0 % C;  // x[i, j .. j + VW)
            const vec a = reinterpret_cast<const vec*>(x)[g];
            const float* fa = reinterpret_cast<const float*>(&a);
#pragma unroll
            for (int e = 0; e < VW; ++e) {
                const long long o = (j + e) * R + i;
                y[o] = op(fa[e], TWO_INPUTS ? z[o] : 0.0f);
            }
#else
            const long long j = e0 / R, i = e0 % R;  // y[j, i .. i + VW)
            vec r;
            float* fr = reinterpret_cast<float*>(&r);
#pragma unroll
            for (int e = 0; e < VW; ++e) fr[e] = op(x[(i + e) * C + j], TWO_INPUTS ? z[e0 + e] : 0.0f);
            reinterpret_cast<vec*>(y)[g] = r;
#endif
        }
    }
#endif
}
"""


def _visit(src: str, stmt: str, *, store: bool = False, write: str = "") -> str:
    """CUDA for one pass over the worker's row: load IPT vectors from `src`, then for each float `v` run
    `stmt`; `store` also keeps the vectors in the stage (STAGE); `write` is the output expression of `v`."""
    lines = ["        for (int base = 0; base < nv; base += WSIZE * IPT) {",
             "            vec buf[IPT];",
             "#pragma unroll",
             "            for (int k = 0; k < IPT; ++k) {",
             "                const int i = base + k * WSIZE + wt;",
             f"                if (i < nv) buf[k] = {src}[i];",
             "            }",
             "#pragma unroll",
             "            for (int k = 0; k < IPT; ++k) {",
             "                const int i = base + k * WSIZE + wt;",
             "                if (i < nv) {"]
    if store:
        lines.append("#if STAGE\n                    stage[i] = buf[k];\n#endif")
    lines.append("                    const float* f = reinterpret_cast<const float*>(&buf[k]);")
    if write:
        lines.append("                    vec o;\n                    float* g = reinterpret_cast<float*>(&o);")
    lines.append("#pragma unroll")
    body = f"{stmt} g[e] = {write};" if write else stmt
    lines.append(f"                    for (int e = 0; e < VW; ++e) {{ const float v = f[e]; {body} }}")
    if write:
        lines.append("                    out[i] = o;")
    lines += ["                }", "            }", "        }"]
    return "\n".join(lines) + "\n"


_AGAIN = "AGAIN"  # the staged row when there is one, else the row in global memory
_OUT = "        vec* out = reinterpret_cast<vec*>(y + r * cols);\n"


def _row_body(name: str) -> str:
    """The body of the row kernel's loop for a row family (`r`: the row; `src`: its vectors)."""
    v = _visit
    if name in ("row_sum", "row_l2norm"):
        square = "acc += v * v;" if name == "row_l2norm" else "acc += v;"
        result = "sqrtf(acc)" if name == "row_l2norm" else "acc"
        return ("        float acc = 0.0f;\n" + v("src", square, store=True) +
                f"        acc = row_sum_of(acc, red);\n        if (wt == 0) y[r] = {result};\n")
    if name in ("logsumexp", "softmax"):
        text = ("        float m = LOWEST;\n" + v("src", "m = fmaxf(m, v);", store=True) +
                "        m = row_max_of(m, red);\n        float s = 0.0f;\n" + v(_AGAIN, "s += expf(v - m);") +
                "        s = row_sum_of(s, red);\n")
        if name == "logsumexp":
            return text + "        if (wt == 0) y[r] = m + logf(s);\n"
        return text + _OUT + v(_AGAIN, "", write="expf(v - m) / s")
    if name == "rmsnorm":
        return ("        float acc = 0.0f;\n" + v("src", "acc += v * v;", store=True) +
                "        const float inv = rsqrtf(row_sum_of(acc, red) / cols + 1e-5f);\n" + _OUT +
                v(_AGAIN, "", write="v * inv"))
    if name == "layernorm":
        return ("        float acc = 0.0f;\n" + v("src", "acc += v;", store=True) +
                "        const float mean = row_sum_of(acc, red) / cols;\n        float dev = 0.0f;\n" +
                v(_AGAIN, "dev += (v - mean) * (v - mean);") +
                "        const float rstd = 1.0f / sqrtf(row_sum_of(dev, red) / cols + 1e-5f);\n" + _OUT +
                v(_AGAIN, "", write="(v - mean) * rstd"))
    raise ValueError(f"no row body for {name!r}")


def kernel_source(task: StudyTask, recipe: Recipe) -> str:
    """The CUDA source a recipe stands for on a task's family (the same for every size of the family)."""
    f = task.family
    prelude = _PRELUDE.format(recipe=recipe.text, family=f.name, kind=f.kind, threads=recipe.threads,
                              vec=recipe.vec, items=recipe.items, stride=int(recipe.grid_stride), stage=recipe.stage,
                              mapping=recipe.mapping, two=int(f.inputs == 2), vec_t=_VEC[recipe.vec],
                              expr=f.cuda_op if f.kind != "row" else "a")
    if f.kind == "ew":
        return prelude + _EW
    if f.kind == "tr":
        return prelude + _TR
    return prelude + _ROW_HEAD + _row_body(f.cuda_op) + _ROW_TAIL


@dataclass(frozen=True)
class Launch:
    """How one (task, recipe) launches: grid, block, dynamic shared memory; `error` when it cannot."""

    grid: int
    block: int
    shared_bytes: int
    error: str = ""


_LAUNCH = '''def launch_config(kind, rows, cols, sm_count):
    """(grid, block, dynamic shared bytes) of recipe {recipe} for a {{kind}} task of rows x cols floats."""
    threads, vec, items, grid_stride, stage, mapping = {threads}, {vec}, {items}, {stride}, {stage}, {mapping}
    resident = sm_count * max(1, 2048 // threads)  # blocks that fit on the GPU at once
    shared = 0
    if kind == "ew":
        needed = -(-(cols // vec) // (threads * items))
    elif kind == "row":
        workers = 1 if mapping else threads // 32
        needed = -(-rows // workers)
        shared = workers * cols * 4 if stage else 0
    else:
        if stage:
            tiles = -(-rows // 32) * -(-cols // (32 * vec))
            needed = -(-tiles // items)
        else:
            needed = -(-(rows * cols // vec) // (threads * items))
    grid = min(needed, resident) if grid_stride else needed
    return max(1, grid), threads, shared
'''


def launch_source(recipe: Recipe) -> str:
    """Python source of `launch_config(kind, rows, cols, sm_count)` for a recipe (see the module docstring)."""
    return _LAUNCH.format(recipe=recipe.text, threads=recipe.threads, vec=recipe.vec, items=recipe.items,
                          stride=int(recipe.grid_stride), stage=recipe.stage, mapping=recipe.mapping)


def launch_config(task: StudyTask, recipe: Recipe, sm_count: int) -> Launch:
    """The launch of a recipe on a task (from `launch_source`, the text the candidate runs too)."""
    scope: dict[str, Any] = {}
    exec(launch_source(recipe), scope)  # noqa: S102 - our own template, the same text the candidate embeds
    grid, block, shared = scope["launch_config"](task.family.kind, task.rows, task.cols, sm_count)
    error = ""
    if shared > MAX_DYNAMIC_SHARED_BYTES:
        error = f"the staged rows need {shared} bytes of shared memory per block (at most {MAX_DYNAMIC_SHARED_BYTES})"
    return Launch(grid, block, shared, error)


def kernel_args(task: StudyTask, x: Any, z: Any, y: Any, recipe: Recipe) -> tuple:
    """The kernel's arguments (tensors and C ints) for inputs x[, z] and output y."""
    kind = task.family.kind
    if kind == "ew":
        return (x, z if z is not None else x, y, task.cols // recipe.vec)
    if kind == "row":
        return (x, y, task.rows, task.cols)
    return (x, z if z is not None else x, y, task.rows, task.cols)


def output_shape(task: StudyTask) -> tuple[int, ...]:
    kind = task.family.kind
    if kind == "ew":
        return (task.cols,)
    if kind == "tr":
        return (task.cols, task.rows)
    return (task.rows,) if task.family.row_out else (task.rows, task.cols)


_CANDIDATE = '''"""Study candidate: recipe {recipe} for {family} (a template of experimental.contrastive_study.kernels)."""
import torch
import torch.nn as nn

from cudal1.raw_cuda import load_kernels

SOURCE = r"""
{source}"""
kernels = load_kernels(SOURCE)

{launch}

_SMS = {{}}


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {args}):
        x = x.contiguous()
{prepare}        if x.device not in _SMS:
            _SMS[x.device] = torch.cuda.get_device_properties(x.device).multi_processor_count
        grid, block, shared = launch_config("{kind}", {rows}, {cols}, _SMS[x.device])
        kernels.{kernel}(grid=(grid,), block=(block,), args=({call_args}), shared_mem_bytes=shared)
        return y
'''


def candidate_source(task: StudyTask, recipe: Recipe) -> str:
    """The raw-CUDA `ModelNew` module of a recipe on a task, for the evaluator (sizes from the inputs)."""
    kind = task.family.kind
    two = task.family.inputs == 2
    if kind == "ew":
        rows, cols = "1", "x.numel()"
        prepare = "        z = z.contiguous()\n" if two else ""
        prepare += "        y = torch.empty_like(x)\n"
        call_args = f"x, {'z' if two else 'x'}, y, x.numel() // {recipe.vec}"
    elif kind == "row":
        rows, cols = "x.shape[0]", "x.shape[1]"
        prepare = ("        y = x.new_empty(x.shape[0])\n" if task.family.row_out else
                   "        y = torch.empty_like(x)\n")
        call_args = "x, y, x.shape[0], x.shape[1]"
    else:
        rows, cols = "x.shape[0]", "x.shape[1]"
        prepare = "        z = z.contiguous()\n" if two else ""
        prepare += "        y = x.new_empty(x.shape[1], x.shape[0])\n"
        call_args = f"x, {'z' if two else 'x'}, y, x.shape[0], x.shape[1]"
    return _CANDIDATE.format(recipe=recipe.text, family=task.family.name, source=kernel_source(task, recipe),
                             launch=launch_source(recipe).rstrip(), args="x, z" if two else "x", prepare=prepare,
                             kind=kind, rows=rows, cols=cols, kernel=KERNEL_NAME[kind], call_args=call_args)
