// A planted kernel-only candidate that launches a kernel from the device (dynamic parallelism).
// Built with -rdc=true; the launcher must refuse it (cuobjdump shows the device-runtime calls).

extern "C" __global__ void child(float* p) { p[threadIdx.x] = 1.f; }

extern "C" __global__ void parent(float* p)
{
    if (threadIdx.x == 0) child<<<1, 32>>>(p);
}
