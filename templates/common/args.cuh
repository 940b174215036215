/* args.cuh — the kernel arguments of a family that declares its own (`args` in its family.lua,
 * op "custom", reached through lajit_launch). Each declared tensor becomes one kernel parameter
 * lj_arg<R> (R its declared rank), each scalar its C type (f32: float, i32: int, i64: long
 * long), in the order of the declaration. The host (runtime/launch.c) fills the same layout:
 * 8-byte fields only, so there is no padding to disagree on, and it checks the kernel's
 * parameter sizes against the declaration when it loads the module.
 *
 * Sizes and strides count elements, in the declared order of the dimensions. An optional tensor
 * the caller left out arrives with ptr == nullptr and every size 0. The host guarantees that
 * every element offset computed from sizes and strides fits in 63 bits; whether it fits in 31 is
 * the kernel's business (lajit_launch refuses nothing on that account). */
#ifndef LJ_ARGS_CUH
#define LJ_ARGS_CUH

template <int R>
struct lj_arg {
    void *ptr;
    long long size[R];
    long long stride[R];
};

#endif
