#line 1 "toy/toy.cu"
// toy.cu — exercises the template syntax.
#include "common/toy_helpers.cuh"
constexpr int D = 32;
constexpr float SCALE = 0.5;
constexpr bool DECAY = true;
#line 7 "toy/toy.cu"
extern "C" __global__ void toy_kernel(float *x)
{
#line 10 "toy/toy.cu"
    x[0] = 0 * SCALE;   // unrolled 1 of 4
#line 10 "toy/toy.cu"
    x[1] = 1 * SCALE;   // unrolled 2 of 4
#line 10 "toy/toy.cu"
    x[2] = 2 * SCALE;   // unrolled 3 of 4
#line 10 "toy/toy.cu"
    x[3] = 3 * SCALE;   // unrolled 4 of 4
#line 14 "toy/toy.cu"
    x[0] *= 2.0f; // decay
#line 18 "toy/toy.cu"
    x[1] = 6; // literal ${ stays
}
