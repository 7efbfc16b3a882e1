// Device code of the trusted-time experiments (built with `nvcc -cubin -arch=sm_90`; no includes, so NVRTC
// can build it too). Every kernel is extern "C" so the host side finds it by name with cuModuleGetFunction.
//
// The rig (E2, E3, E4): per call a *slot* of 16 u64 words in the runner's shared page:
//   0 B1 start (min over blocks)   1 B1 all resident (max)   2 B1 end (max)
//   3 K start (min)                4 K end (max)             5 B2 start (min)
//   6 B2 all resident (max)        7 B2 end (max)            8 output words equal to the call's number at B2
//   9 K blocks finished            10 B1 barrier counter     11 B2 barrier counter
//   12 K blocks finished when B2's first block started      13-15 spare
// Times are %globaltimer readings (ns). B1 and B2 are "exclusive" kernels: one block of 1024 threads per SM
// with all the opt-in shared memory, launched cooperatively; a grid barrier at their start means no other
// context's block is resident anywhere once they pass it.

#define SLOT_WORDS 16

__device__ __forceinline__ unsigned long long gtime()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned int smid()
{
    unsigned int s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}

// All blocks of a cooperative launch meet here (co-residency is guaranteed by the launch).
__device__ void grid_barrier(unsigned long long* counter)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(counter, 1ull);
        while (*((volatile unsigned long long*)counter) < gridDim.x) {
            __nanosleep(20);
        }
    }
    __syncthreads();
}

extern "C" __global__ void rig_init(unsigned long long* slots, unsigned int nslots)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nslots * SLOT_WORDS) return;
    unsigned int w = i % SLOT_WORDS;
    slots[i] = (w == 0 || w == 3 || w == 5) ? ~0ull : 0ull;
}

extern "C" __global__ void __launch_bounds__(1024, 1)
excl_b1(unsigned long long* slot, unsigned int* b1flag, unsigned int seq, uint4* flush,
        unsigned long long flush_vec, unsigned int* out, unsigned int out_words)
{
    extern __shared__ unsigned int smem[];
    if (threadIdx.x == 0) {
        atomicMin(&slot[0], gtime());
        if (blockIdx.x == 0 && b1flag) atomicExch(b1flag, seq);
    }
    smem[threadIdx.x] = seq;
    grid_barrier(&slot[10]);
    if (threadIdx.x == 0) atomicMax(&slot[1], gtime());
    unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = tid; i < out_words; i += stride) out[i] = 0xFFFFFFFFu;  // poison
    for (unsigned long long i = tid; i < flush_vec; i += stride) flush[i] = make_uint4(seq, (unsigned int)i, smem[threadIdx.x], 0u);
    __syncthreads();
    __threadfence();
    if (threadIdx.x == 0) atomicMax(&slot[2], gtime());
}

extern "C" __global__ void __launch_bounds__(1024, 1)
excl_b2(unsigned long long* slot, const unsigned int* out, unsigned int out_words, unsigned int seq,
        unsigned int* snap)
{
    extern __shared__ unsigned int smem[];
    if (threadIdx.x == 0) {
        atomicMin(&slot[5], gtime());
        if (blockIdx.x == 0) slot[12] = *((volatile unsigned long long*)&slot[9]);
        smem[0] = 0;
    }
    grid_barrier(&slot[11]);
    if (threadIdx.x == 0) atomicMax(&slot[6], gtime());
    unsigned int match = 0;
    unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = tid; i < out_words; i += stride) {
        unsigned int v = ((volatile const unsigned int*)out)[i];
        match += (v == seq);
        if (snap) snap[i] = v;
    }
    if (match) atomicAdd(&smem[0], match);
    __syncthreads();
    if (threadIdx.x == 0) {
        if (smem[0]) atomicAdd(&slot[8], (unsigned long long)smem[0]);
        __threadfence();
        atomicMax(&slot[7], gtime());
    }
}

// The runner's call in the rig: every block spins `ns` from its own start, writes its part of the output
// (the call's number) and counts itself done.
extern "C" __global__ void k_spin(unsigned long long* slot, unsigned long long ns, unsigned int* out, unsigned int seq)
{
    unsigned long long t0 = gtime();
    if (threadIdx.x == 0 && slot) atomicMin(&slot[3], t0);
    if (ns) {
        while (gtime() - t0 < ns) {
        }
    }
    if (out) out[blockIdx.x * blockDim.x + threadIdx.x] = seq;
    __syncthreads();
    __threadfence();
    if (threadIdx.x == 0 && slot) {
        atomicMax(&slot[4], gtime());
        atomicAdd(&slot[9], 1ull);
    }
}

// E1: each block's thread 0 spins `ns` and records [start, end, reads, largest gap between two reads,
// gaps > 20 us, their total ns, SM id, 0] at res[8 * block]. A time-sliced context shows gaps of a slice.
extern "C" __global__ void spin_blocks(unsigned long long* res, unsigned long long ns, unsigned int* started)
{
    if (threadIdx.x != 0) return;
    unsigned long long t0 = gtime(), last = t0, t = t0, maxgap = 0, holes = 0, hole_ns = 0, reads = 0;
    if (started && blockIdx.x == 0) atomicExch(started, 1u);
    do {
        t = gtime();
        unsigned long long g = t - last;
        if (g > maxgap) maxgap = g;
        if (g > 20000ull) {
            holes++;
            hole_ns += g;
        }
        last = t;
        reads++;
    } while (t - t0 < ns);
    unsigned long long* r = res + 8ull * blockIdx.x;
    r[0] = t0;
    r[1] = t;
    r[2] = reads;
    r[3] = maxgap;
    r[4] = holes;
    r[5] = hole_ns;
    r[6] = smid();
    r[7] = 0;
}

// E1: an exclusive kernel on its own: res = [first block start (min), all resident (max), end (max),
// barrier counter]; it holds its SMs `hold_ns` after the barrier.
extern "C" __global__ void __launch_bounds__(1024, 1)
excl_probe(unsigned long long* res, unsigned long long hold_ns, unsigned int* started)
{
    extern __shared__ unsigned int smem[];
    if (threadIdx.x == 0) atomicMin(&res[0], gtime());
    smem[threadIdx.x] = threadIdx.x;
    grid_barrier(&res[3]);
    if (threadIdx.x == 0) {
        atomicMax(&res[1], gtime());
        if (started && blockIdx.x == 0) atomicExch(started, 1u);
    }
    unsigned long long t0 = gtime();
    while (gtime() - t0 < hold_ns) {
    }
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(&res[2], gtime() + (smem[threadIdx.x] & 0));
}

// E2: the %globaltimer's step: [smallest change, largest change, changes seen, span] over n reads.
extern "C" __global__ void gt_tick(unsigned long long* res, unsigned int n)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    unsigned long long first = gtime(), last = first, mind = ~0ull, maxd = 0, changes = 0;
    for (unsigned int k = 0; k < n; ++k) {
        unsigned long long t = gtime();
        if (t != last) {
            unsigned long long d = t - last;
            if (d < mind) mind = d;
            if (d > maxd) maxd = d;
            changes++;
            last = t;
        }
    }
    res[0] = mind;
    res[1] = maxd;
    res[2] = changes;
    res[3] = last - first;
}

__device__ __forceinline__ unsigned int mix(unsigned long long i, unsigned int seed)
{
    unsigned long long x = i * 0x9E3779B97F4A7C15ull + seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (unsigned int)x;
}

extern "C" __global__ void fill_pattern(unsigned int* p, unsigned long long n, unsigned int seed)
{
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        p[i] = mix(i, seed);
}

extern "C" __global__ void check_pattern(const unsigned int* p, unsigned long long n, unsigned int seed,
                                         unsigned long long* bad)
{
    unsigned long long local = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        local += (p[i] != mix(i, seed));
    if (local) atomicAdd(bad, local);
}

extern "C" __global__ void write_word(unsigned int* p, unsigned int v)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicExch(p, v);
}

extern "C" __global__ void noop() {}

// E1's fault: a store through a pointer the caller makes invalid.
extern "C" __global__ void fault_kernel(unsigned long long address)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) *((volatile unsigned int*)address) = 1u;
}

// E7: read a buffer once (float4), summing into out.
extern "C" __global__ void read_sum(const float4* w, unsigned long long n4, float* out)
{
    float s = 0.f;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float4 v = w[i];
        s += v.x + v.y + v.z + v.w;
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0 && s != 0.f) atomicAdd(out, s);
}

// E4: y = a * x + b (float4).
extern "C" __global__ void axpb(float4* y, const float4* x, unsigned long long n4, float a, float b)
{
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float4 v = x[i];
        y[i] = make_float4(a * v.x + b, a * v.y + b, a * v.z + b, a * v.w + b);
    }
}
