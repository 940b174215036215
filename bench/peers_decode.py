#!/usr/bin/env python3
"""peers_decode.py — FLA's decode step (fla.ops.simple_gla.fused_recurrent_simple_gla) timed the
way lajit_bench times lajit_attn_decode, at T = 1 and T = 4 tokens per call (peer_bench.py in
../shared/peers has T = 1 only), beside an in-place update of the same states (the ceiling).

Method: bf16 q, k, v of [B, T, H, D]; fp32 states of [B, H, D, D] in a rotating pool of at least
256 MiB (at most 64 states), so each step reads its state from memory as in a model whose other
layers evict it ("cold" L2). One CUDA graph holds `steps` calls, each on the next state of the
pool; the time per step is the median replay time (triton.testing.do_bench where Triton is
present, CUDA events otherwise) over `steps`. The ceiling graph multiplies the same states in
place (x *= c), one per step, likewise. Decay: lajit's slopes s_h = 2^(-8(h+1)/H), FLA's
g_gamma = -s; scale 1. TB/s counts the state read and written once per call (2 x B·H·D·D·4 bytes),
as lajit's decode rows do.

Rows print as JSON lines as they are measured (so a run cut short keeps what it measured) in
peer_bench.py's decode row format, with T added:
  {"kind": "decode", "name": "fla_fused_recurrent_graph", "B", "H", "K", "V", "T", "l2": "cold",
   "us", "TBps", "nbuf", "steps", "how"}     and     {"kind": "decode", "name": "inplace_ceiling", ...}
bench/report.py reads them (--peers FILE).

Usage: peers_decode.py [--B 1,2,...,256] [--T 1,4] [--H 64] [--D 128] [--pool-MiB 256] [--out F]"""
import argparse
import json
import statistics
import sys


def pool_plan(state_bytes, pool_mib=256, at_most=64, min_steps=20):
    """(states in the pool, steps in one graph): enough states to fill pool_mib, and a whole
    number of turns of the pool of at least min_steps steps."""
    want = pool_mib << 20
    nbuf = max(1, min(at_most, -(-want // state_bytes)))
    turns = max(1, -(-min_steps // nbuf))
    return nbuf, nbuf * turns


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--B", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--T", default="1,4")
    ap.add_argument("--H", type=int, default=64)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--pool-MiB", type=int, default=256)
    ap.add_argument("--out", default=None)
    ap.add_argument("--plan", action="store_true", help="print the pool plan per B and exit (no GPU)")
    a = ap.parse_args()
    Bs = [int(x) for x in a.B.split(",") if x]
    Ts = [int(x) for x in a.T.split(",") if x]
    H, D = a.H, a.D
    if a.plan:
        for B in Bs:
            print(json.dumps(dict(B=B, state_bytes=B * H * D * D * 4,
                                  **dict(zip(("nbuf", "steps"), pool_plan(B * H * D * D * 4, a.pool_MiB))))))
        return 0

    import torch
    from fla.ops.simple_gla import fused_recurrent_simple_gla
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    dev = torch.device("cuda")
    rows = []

    def emit(**r):
        rows.append(r)
        print(json.dumps(r), flush=True)

    def median_ms(fn):
        if do_bench is not None:
            return do_bench(fn, warmup=25, rep=100, return_mode="median")
        fn()
        torch.cuda.synchronize()
        t = []
        for _ in range(20):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); fn(); e.record(); e.synchronize()
            t.append(s.elapsed_time(e))
        return statistics.median(t)

    def per_step_us(body, steps):
        """body() issues `steps` steps; captured once, replayed, µs per step."""
        body(); body()  # compile / autotune, allocator warm-up outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body()
        g.replay()
        torch.cuda.synchronize()
        return 1e3 * median_ms(g.replay) / steps

    gamma = -torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)], device=dev, dtype=torch.float32)
    for B in Bs:
        state_bytes = B * H * D * D * 4
        nbuf, steps = pool_plan(state_bytes, a.pool_MiB)
        pool = [torch.randn(B, H, D, D, device=dev, dtype=torch.float32) for _ in range(nbuf)]
        moved = 2 * state_bytes
        with torch.no_grad():
            for T in Ts:
                q = torch.randn(B, T, H, D, device=dev, dtype=torch.bfloat16)
                k = torch.randn_like(q)
                v = torch.randn_like(q)

                def fla_steps():
                    for i in range(steps):
                        fused_recurrent_simple_gla(q, k, v, g_gamma=gamma, scale=1.0,
                                                   initial_state=pool[i % nbuf], output_final_state=True)
                try:
                    us = per_step_us(fla_steps, steps)
                    emit(kind="decode", name="fla_fused_recurrent_graph", B=B, H=H, K=D, V=D, T=T, l2="cold",
                         us=us, TBps=moved / (us * 1e-6) / 1e12, nbuf=nbuf, steps=steps,
                         how=f"CUDA graph of {steps} steps over {nbuf} rotating fp32 states (peers_decode.py)")
                except Exception as e:  # one shape failing leaves the others
                    emit(kind="decode", name="fla_fused_recurrent_graph", B=B, H=H, K=D, V=D, T=T,
                         error=repr(e)[:300])
                del q, k, v

            def scale_steps():
                for i in range(steps):
                    pool[i % nbuf].mul_(0.999)
            us = per_step_us(scale_steps, steps)
            emit(kind="decode", name="inplace_ceiling", B=B, H=H, K=D, V=D, l2="cold", us=us,
                 TBps=moved / (us * 1e-6) / 1e12, nbuf=nbuf, steps=steps,
                 how="x *= c on the same states, same graph shape (peers_decode.py)")
        del pool
        torch.cuda.empty_cache()
    if a.out:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                  open(a.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
