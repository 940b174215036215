// pdl.cuh — programmatic dependent launch (PDL), the device side. A kernel launched with
// programmatic stream serialization (a spec's launch `pdl = true`; runtime/plan_build.c,
// lj_plan_launch) may have its CTAs scheduled while the previous kernel on the stream is still
// running, so its launch latency and prologue hide behind that kernel's tail. Nothing the previous
// kernel wrote is guaranteed visible until lj_pdl_wait() returns (griddepcontrol.wait: every
// prerequisite grid has completed and its memory operations are performed and visible), and a
// previous decode step may have written this very pool slot. So lj_pdl_wait() must come before
// every global read or write of the kernel, the reads of la_params' pointers' targets included
// (slots, s); only the kernel parameter itself and registers may be touched before it. It also
// keeps the chain sound: no kernel launched this way can finish before the one it overlaps, so a
// later kernel launched the ordinary way still follows both.
// lj_pdl_launch_dependents() (griddepcontrol.launch_dependents) says this CTA no longer holds the
// next kernel back: once every CTA of the grid has said so or exited, the next PDL kernel's CTAs
// may be scheduled; they then block in their own lj_pdl_wait() until this grid has completed, so
// calling it early costs correctness nothing — it only lets those CTAs take SM resources sooner.
// Both instructions need PTX ISA 7.8 and sm_90 or later (sm_90a, sm_100a, sm_120 included); on
// older targets they compile to nothing, and on any target a kernel launched without the
// attribute finds no prerequisite grid in flight, so the wait returns at once.
#ifndef LAJIT_PDL_CUH
#define LAJIT_PDL_CUH

__device__ __forceinline__ void lj_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void lj_pdl_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#endif
