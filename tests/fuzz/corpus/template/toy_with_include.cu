// toy.cu — exercises the template syntax.
#include "common/toy_helpers.cuh"
constexpr int D = ${problem.D};
constexpr float SCALE = ${SCALE};
constexpr bool DECAY = ${problem.decay};
//% local total = 0
extern "C" __global__ void ${NAME}(float *x)
{
//% for i = 0, UNROLL - 1 do
    x[${i}] = ${i} * SCALE;   // unrolled ${i + 1} of ${UNROLL}
//%   total = total + i
//% end
//% if problem.decay then
    x[0] *= 2.0f; // decay
//% else
    x[0] *= 3.0f; // no decay
//% end
    x[1] = ${total}; // literal $${ stays
}
