"""test_gpu_ops.py — every op of the installed lajit package on a GPU, against a float64
recurrence (DESIGN.md's tolerances: relative L2 over each output and gradient, bf16 6e-3,
fp16 and fp32 1e-3; ds by |Δds_h| <= tol·λ·Σ_t ‖G_t‖‖S_{t−1}‖), plus
torch.compile(fullgraph=True) of a small model, decode captured in a CUDA graph, and a tiny
training run whose loss falls.
Skipped without CUDA. Run with pytest or run.py.

LAJIT_TEST_DEVICE=cpu (test_cpu_mock.py) runs these tests on CPU tensors against
mock_backend.py's float64 stand-in for the C library, to check the package's Python side and
this file; the tests that need a GPU (CUDA graphs, FLA, training) skip there."""
import math
import os
import unittest

import torch

DEV = torch.device(os.environ.get("LAJIT_TEST_DEVICE", "cuda"))
MOCK = DEV.type == "cpu"
if not MOCK and not torch.cuda.is_available():
    raise unittest.SkipTest("no CUDA device")

import lajit  # noqa: E402
from lajit.reference import ds_bound, recurrence  # noqa: E402


def needs_gpu():
    if MOCK:
        raise unittest.SkipTest("needs a GPU")
TOL = {torch.bfloat16: 6e-3, torch.float16: 1e-3, torch.float32: 1e-3}


def rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def check(name, got, ref, tol):
    assert torch.isfinite(got).all(), f"{name}: NaN or Inf"
    e = rel_l2(got, ref)
    assert e <= tol, f"{name}: relative L2 {e:.2e} > {tol:.0e}"


def inputs(B, H, N, D, E, dtype, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    mk = lambda *sh: (torch.randn(*sh, generator=g) * 0.5).to(DEV, dtype)  # noqa: E731
    return mk(B, H, N, D), mk(B, H, N, D), mk(B, H, N, E), mk(B, H, N, E)


S4 = torch.tensor([0.0, 0.05, 0.3, 1.0], device=DEV)


def test_forward_and_backward_vs_float64():
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        B, H, N, D = 2, 4, 200, 64
        scale = 1 / math.sqrt(D)
        q, k, v, do = inputs(B, H, N, D, D, dtype)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        s = S4.clone().requires_grad_()
        h0 = (torch.randn(B, H, D, D, device=DEV) * 0.1).requires_grad_()
        o, hn = lajit.lightning_attn(*leaves, s, scale=scale, initial_state=h0,
                                     output_final_state=True)
        (o.float() * do.float()).sum().backward()
        ref_leaves = [x.double().requires_grad_() for x in (q, k, v)]
        s_r = S4.double().requires_grad_()
        h0_r = h0.detach().double().requires_grad_()
        o_r, hn_r = recurrence(*ref_leaves, s_r, scale, h0_r)
        (o_r * do.double()).sum().backward()
        tol = TOL[dtype]
        check(f"{dtype} o", o, o_r, tol)
        check(f"{dtype} S_N", hn, hn_r, tol)
        for name, x, r in zip(("dq", "dk", "dv"), leaves, ref_leaves):
            check(f"{dtype} {name}", x.grad, r.grad, tol)
        check(f"{dtype} dS_0", h0.grad, h0_r.grad, tol)
        # ds bound is for S_0 = 0: recheck it on that problem
        s2 = S4.clone().requires_grad_()
        o2 = lajit.lightning_attn(q, k, v, s2, scale=scale)
        (o2.float() * do.float()).sum().backward()
        s2r = S4.double().requires_grad_()
        o2r, _ = recurrence(q.double(), k.double(), v.double(), s2r, scale)
        (o2r * do.double()).sum().backward()
        bound = ds_bound(q.double(), k.double(), v.double(), do.double(), S4.double(), scale)
        err = (s2.grad.double() - s2r.grad).abs()
        assert (err <= tol * bound + 1e-12).all(), f"{dtype} ds: {err} vs bound {tol * bound}"


def test_fla_layout_varlen_and_states():
    dtype = torch.bfloat16
    H, D = 4, 64
    lens = [37, 128, 5]
    T = sum(lens)
    g = torch.Generator().manual_seed(1)
    q, k, v = [(torch.randn(1, T, H, D, generator=g) * 0.5).to(DEV, dtype) for _ in range(3)]
    cu = torch.tensor([0, 37, 165, 170], device=DEV, dtype=torch.long)
    h0 = torch.randn(3, H, D, D, device=DEV) * 0.1
    g_gamma = -S4
    o, ht = lajit.chunk_simple_gla(q, k, v, g_gamma=g_gamma, initial_state=h0,
                                   output_final_state=True, cu_seqlens=cu)
    for i in range(3):
        a, b = cu[i].item(), cu[i + 1].item()
        tr = lambda x: x[:, a:b].transpose(1, 2).double()  # noqa: E731
        o_r, h_r = recurrence(tr(q), tr(k), tr(v), S4.double(), D ** -0.5, h0[i:i + 1].double())
        check(f"varlen o[{i}]", o[:, a:b].transpose(1, 2), o_r, 6e-3)
        check(f"varlen ht[{i}]", ht[i:i + 1], h_r, 6e-3)
    # state_v_first: the same states transposed
    o2, ht2 = lajit.fused_recurrent_simple_gla(q, k, v, g_gamma=g_gamma,
                                               initial_state=h0.transpose(-1, -2).contiguous(),
                                               output_final_state=True, cu_seqlens=cu,
                                               state_v_first=True)
    check("state_v_first o", o2, o, 6e-3)
    check("state_v_first ht", ht2.transpose(-1, -2), ht, 6e-3)


def test_fla_entry_points_match_fla():
    needs_gpu()
    try:
        from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
    except Exception as e:  # FLA is a peer, installed beside the wheel on the GPU machine
        raise unittest.SkipTest(f"FLA not importable: {e}")
    B, T, H, D = 2, 256, 4, 64
    for dtype in (torch.bfloat16, torch.float16):
        g = torch.Generator().manual_seed(2)
        q, k, v, do = [(torch.randn(B, T, H, D, generator=g) * 0.5).to(DEV, dtype)
                       for _ in range(4)]
        h0 = torch.randn(B, H, D, D, device=DEV) * 0.1
        gg = -S4
        for ours, theirs in ((lajit.chunk_simple_gla, chunk_simple_gla),
                             (lajit.fused_recurrent_simple_gla, fused_recurrent_simple_gla)):
            res = []
            for fn in (ours, theirs):
                xs = [x.clone().requires_grad_() for x in (q, k, v)]
                o, ht = fn(*xs, g_gamma=gg, initial_state=h0, output_final_state=True)
                (o.float() * do.float()).sum().backward()
                res.append([o, ht] + [x.grad for x in xs])
            # Both are within tol of float64, so within 2·tol of each other.
            for name, a, b in zip(("o", "ht", "dq", "dk", "dv"), *res):
                check(f"{ours.__name__} {dtype} {name} vs FLA", a, b, 2 * TOL[dtype])


def test_decode_and_prefill_on_a_pool():
    dtype = torch.bfloat16
    B, H, D, P = 5, 4, 64, 9
    g = torch.Generator().manual_seed(3)
    pool = torch.randn(P, H, D, D, generator=g).to(DEV) * 0.1
    slots = torch.tensor([7, -1, 0, 3, 8], dtype=torch.int32, device=DEV)
    q, k, v = [(torch.randn(B, H, D, generator=g) * 0.5).to(DEV, dtype) for _ in range(3)]
    ref_pool = pool.double().clone()
    out = torch.full((B, H, D), 7.0, device=DEV, dtype=dtype)
    lajit.decode(q, k, v, pool, slots, S4, scale=0.125, out=out)
    lam = torch.exp(-S4.double()).view(H, 1, 1)
    for b, sl in enumerate(slots.tolist()):
        if sl < 0:
            assert (out[b] == 7.0).all(), "a skipped row's output was written"
            continue
        S = lam * ref_pool[sl] + k[b].double()[:, :, None] * v[b].double()[:, None, :]
        ref_pool[sl] = S
        check(f"decode o[{b}]", out[b], 0.125 * torch.einsum("hd,hde->he", q[b].double(), S),
              6e-3)
    check("decode pool", pool, ref_pool, 1e-5)
    # prefill on the same pool: sequences of lengths 3, 11 into slots 2 and 5 (slot 2 zeroed)
    T = 14
    qp, kp, vp = [(torch.randn(T, H, D, generator=g) * 0.5).to(DEV, dtype) for _ in range(3)]
    cu = torch.tensor([0, 3, 14], dtype=torch.int32, device=DEV)
    pslots = torch.tensor([2, 5], dtype=torch.int32, device=DEV)
    pool[2].zero_()
    before = pool.double().clone()
    o = lajit.prefill(qp, kp, vp, cu, pool, pslots, S4)
    for i, (a, b) in enumerate(((0, 3), (3, 14))):
        sl = pslots[i].item()
        tr = lambda x: x[a:b].transpose(0, 1)[None].double()  # noqa: E731
        o_r, h_r = recurrence(tr(qp), tr(kp), tr(vp), S4.double(), 1.0, before[sl][None])
        check(f"prefill o[{i}]", o[a:b].transpose(0, 1)[None], o_r, 6e-3)
        check(f"prefill pool[{sl}]", pool[sl][None], h_r, 6e-3)


def test_decode_in_a_cuda_graph():
    needs_gpu()
    dtype = torch.bfloat16
    B, H, D, P = 8, 4, 64, 16
    pool = torch.zeros(P, H, D, D, device=DEV)
    slots = torch.arange(B, dtype=torch.int32, device=DEV)
    q, k, v = [torch.zeros(B, H, D, device=DEV, dtype=dtype) for _ in range(3)]
    out = torch.empty(B, H, D, device=DEV, dtype=dtype)
    lajit.decode(q, k, v, pool, slots, S4, out=out)  # builds the kernel before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lajit.decode(q, k, v, pool, slots, S4, out=out)
    pool.zero_()
    ref = torch.zeros(B, H, D, D, dtype=torch.float64, device=DEV)
    lam = torch.exp(-S4.double()).view(1, H, 1, 1)
    g = torch.Generator().manual_seed(4)
    for step in range(5):
        for x in (q, k, v):
            x.copy_(torch.randn(B, H, D, generator=g) * 0.5)
        graph.replay()
        ref = lam * ref + k.double()[..., None] * v.double()[..., None, :]
        check(f"graph step {step} o", out, torch.einsum("bhd,bhde->bhe", q.double(), ref), 6e-3)
    check("graph pool", pool[:B], ref, 6e-3)


def test_bind_decode_eager_and_in_a_cuda_graph():
    dtype = torch.float16
    B, H, D, P = 4, 4, 64, 6
    pool = torch.zeros(P, H, D, D, device=DEV)
    slots = torch.tensor([5, -1, 1, 2], dtype=torch.int32, device=DEV)
    q, k, v = [torch.zeros(B, H, D, device=DEV, dtype=dtype) for _ in range(3)]
    step = lajit.bind_decode(q, k, v, pool, slots, S4, scale=0.5)
    ref = torch.zeros(P, H, D, D, dtype=torch.float64, device=DEV)
    lam = torch.exp(-S4.double()).view(H, 1, 1)
    g = torch.Generator().manual_seed(5)
    graph = None
    for i in range(6):
        for x in (q, k, v):
            x.copy_(torch.randn(B, H, D, generator=g) * 0.5)
        if i < 3 or MOCK:
            out = step()                       # eager
        else:
            if graph is None:
                graph = torch.cuda.CUDAGraph()
                saved = pool.clone()
                with torch.cuda.graph(graph):
                    step()
                pool.copy_(saved)              # capture does not run the kernel; be sure
            graph.replay()
            out = step.out
        for b, sl in enumerate(slots.tolist()):
            if sl < 0:
                continue
            ref[sl] = lam * ref[sl] + k[b].double()[:, :, None] * v[b].double()[:, None, :]
            check(f"bound step {i} o[{b}]", out[b],
                  0.5 * torch.einsum("hd,hde->he", q[b].double(), ref[sl]), 1e-3)
    check("bound pool", pool, ref, 1e-3)


def test_tune_and_bundle_from_python():
    """lajit.tune on one small decode bucket (a private cache, so the shared tuning database
    is untouched), then a bundle of that family written with the tuned database and used."""
    needs_gpu()
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        old = os.environ.get("LAJIT_CACHE_DIR")
        os.environ["LAJIT_CACHE_DIR"] = tmp
        try:
            summary = lajit.tune("la_decode", dtype="bf16", B=[4], H=[4], D=64, runs=5,
                                 warmup=1, jobs=8)
        finally:
            if old is None:
                del os.environ["LAJIT_CACHE_DIR"]
            else:
                os.environ["LAJIT_CACHE_DIR"] = old
        assert summary["rows"], summary
        assert os.path.exists(os.path.join(tmp, "tune.db"))
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}" + ("a" if (major, minor) in ((9, 0), (10, 0)) else "")
        bundle = lajit.gen_bundle(os.path.join(tmp, "k.bundle"), arch=arch,
                                  families="la_decode", db=os.path.join(tmp, "tune.db"))
        assert os.path.getsize(bundle) > 0


class TinyLA(torch.nn.Module):
    """x -> silu(q), silu(k), v (bf16) -> chunk_simple_gla with a learnable decay -> out."""

    def __init__(self, d=128, H=2, D=64, s0=0.05):
        super().__init__()
        self.H, self.D = H, D
        self.qkv = torch.nn.Linear(d, 3 * H * D, bias=False)
        self.out = torch.nn.Linear(H * D, d, bias=False)
        self.log_s = torch.nn.Parameter(torch.full((H,), math.log(s0)))

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.H, self.D).unbind(2)
        act = torch.nn.functional.silu
        o, _ = lajit.chunk_simple_gla(act(q).bfloat16(), act(k).bfloat16(), v.bfloat16(),
                                      g_gamma=-self.log_s.float().exp())
        return self.out(o.to(x.dtype).reshape(B, T, -1))


def test_compile_fullgraph_model_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyLA().to(DEV)
    x = torch.randn(2, 192, 128, device=DEV)
    eager = model(x)
    backend = "aot_eager" if MOCK else "inductor"
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    got = compiled(x)
    check("compiled vs eager", got, eager, 1e-2)
    got.square().mean().backward()
    assert model.log_s.grad is not None and torch.isfinite(model.log_s.grad).all()


def test_tiny_training_loss_falls():
    """The layer of examples/pytorch/train_tiny.py's size: a student imitates a teacher."""
    needs_gpu()
    torch.manual_seed(0)
    teacher = TinyLA(d=64, H=4, D=16, s0=0.3).to(DEV)
    student = TinyLA(d=64, H=4, D=16, s0=0.05).to(DEV)
    opt = torch.optim.Adam(student.parameters(), lr=1e-2)
    losses = []
    for step in range(300):
        x = torch.randn(8, 256, 64, device=DEV)
        with torch.no_grad():
            y = teacher(x)
        loss = torch.nn.functional.mse_loss(student(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        assert math.isfinite(losses[-1]), f"loss {losses[-1]} at step {step}"
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    print(f"tiny training: loss {first:.4g} -> {last:.4g}, s {student.log_s.exp().tolist()}")
    assert last < 0.5 * first, (first, last)
    assert student.log_s.grad is not None
