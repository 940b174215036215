// rowsum.cu (toy_rowsum) — y[b] = Σ_n x[b, n] by PARTS CTAs per row meeting in the workspace
// (family.lua says how): per row b, WS_ROW bytes at ws + b·WS_ROW: an unsigned ticket, then
// PARTS float partial sums from byte 16.
#include "common/args.cuh"

constexpr long long N = ${problem.N};
constexpr int THREADS = ${THREADS}, PARTS = ${PARTS};
constexpr long long WS_ROW = ${WS_ROW};

extern "C" __global__ void __launch_bounds__(THREADS) toy_rowsum(lj_arg<1> ws, lj_arg<2> x, lj_arg<1> y)
{
    __shared__ float red[THREADS];
    __shared__ bool last;
    const long long b = blockIdx.y;
    const float *xr = static_cast<const float *>(x.ptr) + b * x.stride[0];
    const long long per = (N + PARTS - 1) / PARTS, n0 = blockIdx.x * per;
    const long long n1 = n0 + per < N ? n0 + per : N;
    float s = 0.f;
    for (long long n = n0 + threadIdx.x; n < n1; n += THREADS) s += xr[n];
    red[threadIdx.x] = s;
    __syncthreads();
    for (int w = THREADS / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
        __syncthreads();
    }
    float *out = static_cast<float *>(y.ptr) + b * y.stride[0];
    if (PARTS == 1) {
        if (threadIdx.x == 0) *out = red[0];
        return;
    }
    unsigned char *row = static_cast<unsigned char *>(ws.ptr) + b * WS_ROW;
    unsigned *ticket = reinterpret_cast<unsigned *>(row);
    float *part = reinterpret_cast<float *>(row + 16);
    if (threadIdx.x == 0) {
        part[blockIdx.x] = red[0];
        __threadfence();
        last = atomicAdd(ticket, 1u) == PARTS - 1;
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        __threadfence();
        float t = 0.f;
        for (int i = 0; i < PARTS; i++) t += reinterpret_cast<volatile float *>(part)[i];
        *out = t;
        *ticket = 0u; // the workspace as it was found
    }
}
