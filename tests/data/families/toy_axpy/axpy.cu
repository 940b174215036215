// axpy.cu (toy_axpy) — y = alpha * w * x + y, UNROLL elements of a row per thread.
#include "common/args.cuh"
#include "common/types.cuh"

using T = ${ELEM};
constexpr long long N = ${problem.N};
constexpr bool HAS_W = ${problem.has_w};

extern "C" __global__ void __launch_bounds__(${THREADS}) toy_axpy(lj_arg<2> x, lj_arg<1> w, lj_arg<2> y, float alpha)
{
    const long long b = blockIdx.y;
    const T *xr = static_cast<const T *>(x.ptr) + b * x.stride[0];
    T *yr = static_cast<T *>(y.ptr) + b * y.stride[0];
//% for u = 0, UNROLL - 1 do
    {
        const long long n = ((long long)blockIdx.x * ${UNROLL} + ${u}) * ${THREADS} + threadIdx.x;
        if (n < N) {
            const float wn = HAS_W ? static_cast<const float *>(w.ptr)[n * w.stride[0]] : 1.f;
            yr[n] = lj_from_float<T>(alpha * wn * lj_to_float(xr[n]) + lj_to_float(yr[n]));
        }
    }
//% end
}
