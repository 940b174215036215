/* overlap.h — whether two strided tensor views can reach a common byte, decided element by
 * element rather than by address range, so that interleaved slices of one packed buffer (dq,
 * dk, dv as the three column slices of a fused [B, N, H, 2D+E] gradient) count as disjoint
 * while views that really share an element never do.
 *
 * The test is exact for the layouts applications use (slices along the last, contiguous
 * dimensions of one buffer; separate buffers) and conservative otherwise: it may report a
 * shared byte that no index reaches, never the reverse. Pure arithmetic on the DLTensor
 * fields: no allocation, thread-safe, cheap enough for every call of an op. */
#ifndef LAJIT_OVERLAP_H
#define LAJIT_OVERLAP_H

#include <dlpack/dlpack.h>

/* 1 when some byte of an element of a may be a byte of an element of b (on the same device);
 * 0 when no element of one touches an element of the other. Either may be NULL (0). Strides
 * must be non-negative (every tensor lj_tensor_view accepted); with a negative one the answer
 * is 1 when the address ranges are not proven apart. */
int lj_tensors_may_share(const DLTensor *a, const DLTensor *b);

#endif
