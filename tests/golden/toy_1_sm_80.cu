#line 1 "toy/toy.cu"
// toy.cu — exercises the template syntax.
#include "common/toy_helpers.cuh"
constexpr int D = 16;
constexpr float SCALE = 0.5;
constexpr bool DECAY = false;
#line 7 "toy/toy.cu"
extern "C" __global__ void toy_kernel(float *x)
{
#line 10 "toy/toy.cu"
    x[0] = 0 * SCALE;   // unrolled 1 of 2
#line 10 "toy/toy.cu"
    x[1] = 1 * SCALE;   // unrolled 2 of 2
#line 16 "toy/toy.cu"
    x[0] *= 3.0f; // no decay
#line 18 "toy/toy.cu"
    x[1] = 1; // literal ${ stays
}
