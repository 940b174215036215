"""bench_fla.py — simple_gla_fwd (lajit, through lajit_launch) beside FLA's chunk_simple_gla with
`g`, on the same inputs, on the GPU machine.

Both read the same memory: q, k, v [B, N, H, D|E] and g [B, N, H] as FLA takes them; lajit gets
them as [B, H, N, .] views (permuted strides, no copy), and writes its output into a [B, N, H, E]
buffer through such a view too, so the two outputs compare element for element. Times are CUDA
events around each call on the current stream (warm-up first, then the median of --iters), the
whole FLA call included (its gate cumsum, state and output kernels: what a user pays), and the
whole lajit_launch (host lookup of the cached plan and the one kernel).

Usage (from the source tree, after a build):
    pip install fla-core einops      # or a local wheel
    python3 examples/families/simple_gla_fwd/bench_fla.py [--lib build/liblajit.so]

lajit is reached through ctypes on liblajit.so's lajit_launch (issue 21's API), the family
through LAJIT_FAMILY_PATH (set here to this file's parent folder unless already set). The last
column is lajit's own constant-decay forward (la_fwd_sm90, the family's speed goal: no slower
than it by more than g's extra bytes) on the same q, k, v with one decay per head, through the
lajit package in python/ on the same library (its torch op adds a few µs of Python per call);
"n/a" when the package cannot be loaded."""
import argparse
import ctypes
import os
import statistics
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

# ---- lajit through ctypes (include/lajit.h; DLPack's DLTensor) ------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class TensorArg(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("tensor", ctypes.POINTER(DLTensor))]


class ScalarArg(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_double)]


class IntArg(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_int64)]


class LaunchArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("family", ctypes.c_char_p),
                ("tensors", ctypes.POINTER(TensorArg)), ("n_tensors", ctypes.c_size_t),
                ("scalars", ctypes.POINTER(ScalarArg)), ("n_scalars", ctypes.c_size_t),
                ("problem", ctypes.POINTER(IntArg)), ("n_problem", ctypes.c_size_t),
                ("dtype", ctypes.c_char_p), ("stream", ctypes.c_void_p)]


DL_CODES = {torch.float32: (2, 32), torch.float16: (2, 16), torch.bfloat16: (4, 16)}


def dl_view(t, keep):
    """A DLTensor describing torch tensor t as it is (sizes, strides in elements); the shape and
    stride arrays are appended to keep so they outlive the call."""
    shape = (ctypes.c_int64 * t.dim())(*t.shape)
    strides = (ctypes.c_int64 * t.dim())(*t.stride())
    code, bits = DL_CODES[t.dtype]
    d = DLTensor(ctypes.c_void_p(t.data_ptr()), DLDevice(2, t.device.index or 0), t.dim(),
                 DLDataType(code, bits, 1), shape, strides, 0)
    keep += [shape, strides, d]
    return ctypes.pointer(d)


class Lajit:
    """One lajit context and a prepared lajit_launch of simple_gla_fwd on fixed tensors: the
    argument structs are built once, so a timed call is the C call alone."""

    def __init__(self, lib_path):
        os.environ.setdefault("LAJIT_FAMILY_PATH", os.path.dirname(HERE))
        self.lib = ctypes.CDLL(lib_path)
        self.lib.lajit_ctx_create.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        self.lib.lajit_ctx_create.restype = ctypes.c_int
        self.lib.lajit_launch.argtypes = [ctypes.c_void_p, ctypes.POINTER(LaunchArgs)]
        self.lib.lajit_launch.restype = ctypes.c_int
        self.lib.lajit_errmsg.argtypes = [ctypes.c_void_p]
        self.lib.lajit_errmsg.restype = ctypes.c_char_p
        self.ctx = ctypes.c_void_p()
        st = self.lib.lajit_ctx_create(None, ctypes.byref(self.ctx))
        if st != 0:
            raise RuntimeError(f"lajit_ctx_create: status {st}")

    def prepare(self, q, k, v, g, o, scale):
        """q, k, v, o [B, H, N, .] views, g [B, H, N]."""
        keep = []
        names = [b"q", b"k", b"v", b"g", b"o"]
        ts = (TensorArg * 5)(*[TensorArg(n, dl_view(t, keep)) for n, t in
                                zip(names, (q, k, v, g, o))])
        sc = (ScalarArg * 1)(ScalarArg(b"scale", scale))
        a = LaunchArgs(ctypes.sizeof(LaunchArgs), b"simple_gla_fwd", ts, 5, sc, 1, None, 0, None,
                       ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        keep += [ts, sc, a]

        def call():
            st = self.lib.lajit_launch(self.ctx, ctypes.byref(a))
            if st != 0:
                raise RuntimeError(f"lajit_launch: status {st}: "
                                   f"{self.lib.lajit_errmsg(self.ctx).decode()}")
        call.keep = keep
        return call


# ---- timing and the comparison ---------------------------------------------------------------


def time_ms(fn, warmup=10, iters=50):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def inputs(B, H, N, D, E, dtype, seed=0):
    """FLA's layout: q, k [B, N, H, D], v [B, N, H, E], g [B, N, H] float32 log-gates."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, N, H, D, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(B, N, H, D, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(B, N, H, E, device="cuda", dtype=dtype, generator=gen)
    g = F.logsigmoid(torch.randn(B, N, H, device="cuda", dtype=torch.float32, generator=gen))
    return q, k, v, g


def bhn(t):
    """[B, N, H, ...] as a [B, H, N, ...] view of the same memory."""
    return t.transpose(1, 2)


def const_decay_runner(lib_path):
    """lajit.chunk_simple_gla with g_gamma (constant decay per head), or None."""
    try:
        os.environ.setdefault("LAJIT_LIBRARY", lib_path)
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import lajit
        return lajit.chunk_simple_gla
    except Exception as e:  # the comparison is optional: say why it is missing
        print(f"(constant-decay column: lajit package not loaded: {e})")
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "liblajit.so"))
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--shapes", default="4,32,8192,128,128;2,16,16384,128,128;1,8,65536,128,128",
                    help="B,H,N,D,E;... (bf16)")
    args = ap.parse_args()
    from fla.ops.simple_gla import chunk_simple_gla

    lj = Lajit(args.lib)
    const = const_decay_runner(args.lib)
    shapes = [tuple(int(x) for x in sh.split(",")) for sh in args.shapes.split(";") if sh]
    print(f"{'shape':34} {'dtype':5} {'fla ms':>8} {'lajit ms':>9} {'lajit/fla':>9} "
          f"{'max rel err':>11} {'const-decay ms':>14}")
    for B, H, N, D, E in shapes:
        dtype = torch.bfloat16
        q, k, v, g = inputs(B, H, N, D, E, dtype)
        scale = D ** -0.5
        o_lj = torch.empty(B, N, H, E, device="cuda", dtype=dtype)
        run_lj = lj.prepare(bhn(q), bhn(k), bhn(v), g.transpose(1, 2), bhn(o_lj), scale)

        def run_fla():
            return chunk_simple_gla(q, k, v, g=g, scale=scale, output_final_state=False)

        o_fla, _ = run_fla()
        run_lj()
        torch.cuda.synchronize()
        diff = (o_lj.float() - o_fla.float()).abs().max().item()
        rel = diff / o_fla.float().abs().max().item()  # max |difference| / max |o_fla|
        t_fla = time_ms(run_fla, iters=args.iters)
        t_lj = time_ms(run_lj, iters=args.iters)
        t_const = "n/a"
        if const is not None:
            g_gamma = g.mean(dim=(0, 1))  # [H]: one log-decay per head
            t_const = f"{time_ms(lambda: const(q, k, v, g_gamma=g_gamma, scale=scale), iters=args.iters):.3f}"
        name = f"B={B} H={H} N={N} D={D} E={E}"
        print(f"{name:34} {'bf16':5} {t_fla:8.3f} {t_lj:9.3f} {t_lj / t_fla:9.2f} {rel:11.2e} "
              f"{t_const:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
