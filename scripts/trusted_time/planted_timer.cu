// A planted kernel-only candidate that reads the GPU's clocks (%globaltimer, clock64), which serve only to
// tell calls apart; the scan of the launcher must flag it.

extern "C" __global__ void timed(unsigned long long* out)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    out[threadIdx.x] = t + (unsigned long long)clock64();
}
