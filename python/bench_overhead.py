"""bench_overhead.py — host time per decode call from Python, beside a bare ctypes call of the C
API (the floor any Python binding pays), on the GPU machine.

Rows (µs per call, host side only: batches of calls are timed before their synchronisation, so
the GPU's own time is not counted unless the launch queue fills, which the batch size avoids):
  c_api_ctypes   lajit_attn_decode through ctypes with prebuilt arguments (the C API's host
                 cost: validation, plan lookup, cuLaunchKernel; plus ~0.3 µs of ctypes)
  bind_decode    lajit.bind_decode(...)(): decode bound to fixed buffers (views built once)
  lajit.decode   the package's eager decode (lean path: per-thread views; each call reads every
                 tensor's shape, dtype, device, strides and data pointer and rewrites a view
                 only where they changed)
  torch.ops      torch.ops.lajit.decode_ (the custom op, through the dispatcher)
  fla_eager      FLA's fused_recurrent_simple_gla for one step, when FLA is importable
The goal is <= 5 µs above c_api_ctypes (reported for bind_decode and for lajit.decode).
bench_decode_host.py measures the Python side alone on a machine with no GPU.

    python bench_overhead.py [--B 8] [--H 8] [--D 128] [--calls 200] [--reps 50] [--out FILE]"""
import argparse
import ctypes
import json
import statistics
import time

import torch

import lajit
from lajit import _native, _torch


def host_us(fn, calls, reps):
    """Median over reps of the host time of `calls` back-to-back calls, per call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per), min(per)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out")
    a = ap.parse_args()
    dev = torch.device("cuda")
    B, H, D = a.B, a.H, a.D
    dt = torch.bfloat16
    q, k, v = [torch.randn(B, H, D, device=dev, dtype=dt) * 0.1 for _ in range(3)]
    out = torch.empty(B, H, D, device=dev, dtype=dt)
    pool = torch.zeros(2 * B, H, D, D, device=dev)
    slots = torch.arange(B, dtype=torch.int32, device=dev)
    s = lajit.decay_alibi(H, device=dev)
    lajit.decode(q, k, v, pool, slots, s, out=out)  # builds the kernel
    torch.cuda.synchronize()

    # The bare C call: arguments built once, the same pointers every call.
    lib = _native.library()
    views = [_native.View() for _ in range(7)]
    args = _native.DecodeArgs(struct_size=ctypes.sizeof(_native.DecodeArgs), scale=1.0)
    for name, view, t in zip(("q", "k", "v", "o", "s", "state", "state_slots"), views,
                             (q, k, v, out, s, pool, slots)):
        setattr(args, name, _torch.fill(view, t))
    args.stream = torch.cuda.current_stream().cuda_stream
    ctx = lib.ctx(torch.cuda.current_device())
    argp = ctypes.addressof(args)
    cfn = lib.decode

    def bare():
        cfn(ctx, argp)

    bound = lajit.bind_decode(q, k, v, pool, slots, s, out=out)

    def lean():
        lajit.decode(q, k, v, pool, slots, s, out=out)

    def op():
        torch.ops.lajit.decode_(q, k, v, pool, slots, s, 1.0, False)

    rows = {}
    for name, fn in (("c_api_ctypes", bare), ("bind_decode", bound), ("lajit.decode", lean),
                     ("torch.ops", op)):
        med, best = host_us(fn, a.calls, a.reps)
        rows[name] = {"median_us": round(med, 2), "min_us": round(best, 2)}
    try:
        from fla.ops.simple_gla import fused_recurrent_simple_gla
        q4, k4, v4 = (x[:, None] for x in (q, k, v))
        h0 = pool[:B].clone()

        def fla():
            fused_recurrent_simple_gla(q4, k4, v4, g_gamma=-s, initial_state=h0,
                                       output_final_state=True)
        med, best = host_us(fla, 20, 10)
        rows["fla_eager"] = {"median_us": round(med, 2), "min_us": round(best, 2)}
    except ImportError:
        pass
    c = rows["c_api_ctypes"]["median_us"]
    over_bound = rows["bind_decode"]["median_us"] - c
    over_lean = rows["lajit.decode"]["median_us"] - c
    result = {"bench": "python_overhead_decode", "device": torch.cuda.get_device_name(),
              "B": B, "H": H, "D": D, "dtype": "bf16", "rows": rows,
              "bind_decode_minus_c_us": round(over_bound, 2),
              "decode_minus_c_us": round(over_lean, 2), "goal_us": 5.0,
              "bind_decode_meets_goal": over_bound <= 5.0, "decode_meets_goal": over_lean <= 5.0}
    print(json.dumps(result, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
