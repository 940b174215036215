"""bench_decode_host.py — the Python host cost of the eager decode (lajit.decode and its lean path
_torch.decode_into) on a machine with no GPU: CPU tensors, and the C entry point replaced by a
stub that returns 0 (compiled here with cc, so it is a ctypes call like the real one). What is
left is exactly the package's own per-call work: reading the tensors, refilling the DLTensor
views and the argument struct, the context lookup, the ctypes call. The GPU machine's figure
(bench_overhead.py) adds the current-stream lookup and the C library's own cost.

    python bench_decode_host.py [--B 8] [--H 8] [--D 128] [--calls 20000] [--reps 15]
Run it with the package importable (installed, or PYTHONPATH=python); no liblajit is loaded."""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time

import torch

import lajit
from lajit import _native, _torch


def stub_function(tmp):
    src = os.path.join(tmp, "stub.c")
    so = os.path.join(tmp, "libstub.so")
    with open(src, "w") as f:
        f.write("int stub(void *ctx, void *args) { (void)ctx; (void)args; return 0; }\n")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", so, src], check=True)
    fn = ctypes.CDLL(so).stub
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return fn


def per_call_us(fn, calls, reps):
    for _ in range(1000):
        fn()
    per = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stub = stub_function(tmp)
        # A Library that loads nothing: the stub as its decode, a fake context handle.
        lib = object.__new__(_native.Library)
        lib.local = threading.local()
        lib.decode = stub
        lib.create_ctx = lambda device, *args, **kw: 0x1000
        _native._library = lib
        B, H, D = a.B, a.H, a.D
        q, k, v = (torch.randn(B, H, D, dtype=torch.bfloat16) for _ in range(3))
        out = torch.empty(B, H, D, dtype=torch.bfloat16)
        pool = torch.zeros(2 * B, H, D, D)
        slots = torch.arange(B, dtype=torch.int32)
        s = torch.rand(H)
        into = _torch.decode_into
        rows = {
            "stub_ctypes": per_call_us(lambda: stub(0x1000, 0), a.calls, a.reps),
            "decode_into": per_call_us(
                lambda: into(out, q, k, v, pool, slots, s, 1.0, False), a.calls, a.reps),
            "lajit.decode": per_call_us(
                lambda: lajit.decode(q, k, v, pool, slots, s, out=out), a.calls, a.reps),
        }
    c = rows["stub_ctypes"]
    print(json.dumps({"bench": "python_host_decode_stub", "B": B, "H": H, "D": D,
                      "rows_us": {n: round(x, 3) for n, x in rows.items()},
                      "decode_into_minus_stub_us": round(rows["decode_into"] - c, 3),
                      "decode_minus_stub_us": round(rows["lajit.decode"] - c, 3)}, indent=1))


if __name__ == "__main__":
    main()
