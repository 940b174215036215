"""test_cpu_mock.py — test_gpu_ops.py's tests on CPU tensors, with the C library's op entry
points replaced by mock_backend.py's float64 reference: checks the package's Python side (FLA
layouts, varlen and pool plumbing, autograd through lajit::bwd, the lean and bound decode) and
the GPU test file itself, on a machine with no GPU. The kernels are not exercised here."""
import os
import sys

os.environ["LAJIT_TEST_DEVICE"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mock_backend  # noqa: E402

mock_backend.install()

from test_gpu_ops import *  # noqa: E402,F401,F403


# ---- The lean decode's cached views (CPU only: the mock reads back what each DLTensor says) ---

import threading  # noqa: E402

import torch  # noqa: E402

import lajit  # noqa: E402
from lajit import _torch as _ops  # noqa: E402


def _expected(q, k, v, pool, slots, s, scale):
    """(o, pool after) of one decode step in float64."""
    pool = pool.double().clone()
    lam = torch.exp(-s.double()).view(-1, 1, 1) if s is not None else 1.0
    o = torch.zeros(v.shape, dtype=torch.float64)
    for b in range(q.shape[0]):
        sl = b if slots is None else int(slots[b])
        if sl < 0:
            continue
        pool[sl] = lam * pool[sl] + k[b].double()[:, :, None] * v[b].double()[:, None, :]
        o[b] = scale * torch.einsum("hd,hde->he", q[b].double(), pool[sl])
    return o, pool


def _step(q, k, v, pool, slots, s, scale=0.5, out=None):
    want_o, want_pool = _expected(q, k, v, pool, slots, s, scale)
    o = lajit.decode(q, k, v, pool, slots, s, scale=scale, out=out)
    rows = [b for b in range(q.shape[0]) if slots is None or int(slots[b]) >= 0]  # others: unset
    assert torch.allclose(o[rows].double(), want_o[rows], atol=2e-2, rtol=2e-2), (o, want_o)
    assert torch.allclose(pool.double(), want_pool, atol=1e-5), "pool"
    return o


def _view_of(i):
    """(shape, strides, dtype code/bits) that this thread's decode view i describes."""
    dl = _ops.N.library().local.decode.views[i].dl
    n = dl.ndim
    return ([dl.shape[j] for j in range(n)], [dl.strides[j] for j in range(n)],
            (dl.dtype.code, dl.dtype.bits))


def test_lean_decode_follows_in_place_changes():
    g = torch.Generator().manual_seed(11)
    B, H, D, P = 3, 2, 4, 5
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    q, k, v = r(B, H, D), r(B, H, D), r(B, H, D)
    pool = r(P, H, D, D) * 0.1
    slots = torch.tensor([4, -1, 0], dtype=torch.int32)
    s = torch.rand(H, generator=g)
    _step(q, k, v, pool, slots, s)
    # New tensors of the same shapes (new data pointers).
    _step(r(B, H, D), r(B, H, D), r(B, H, D), pool, slots, s)
    # The same q object re-strided in place, same shape (stride changes, the sizes do not).
    big = r(B, H, 2 * D)
    q.set_(big.untyped_storage(), 0, (B, H, D), (H * 2 * D, 2 * D, 1))
    assert q.shape == (B, H, D) and not q.is_contiguous()
    _step(q, k, v, pool, slots, s)
    assert _view_of(0)[1] == [H * 2 * D, 2 * D, 1], _view_of(0)
    # Back to contiguous in place (as_strided_ keeps the storage).
    q.as_strided_((B, H, D), (H * D, D, 1))
    _step(q, k, v, pool, slots, s)
    # The same out object given another dtype through .data (dtype changes, shape does not).
    out = torch.empty(B, H, D)
    _step(q, k, v, pool, slots, s, out=out)
    out.data = torch.empty(B, H, D, dtype=torch.float16)
    o = _step(q, k, v, pool, slots, s, out=out)
    assert o.dtype == torch.float16 and _view_of(3)[2] == (2, 16), _view_of(3)
    # s dropped, slots dropped (row b uses slot b), then both back.
    _step(q, k, v, pool, slots, None)
    _step(q, k, v, pool, None, s)
    _step(q, k, v, pool, slots, s)
    # A pool resized in place to more slots (same object, new shape and maybe new storage).
    pool.resize_(P + 2, H, D, D).zero_()
    _step(q, k, v, pool, torch.tensor([6, 5, -1], dtype=torch.int32), s)


def test_lean_decode_size_one_dims_keep_their_strides():
    # B = 1: the batch stride is free for torch's contiguity, so a cached contiguous view must
    # not stand for a tensor whose size-1 dimension has another stride.
    H, D = 2, 4
    k, v = torch.randn(1, H, D), torch.randn(1, H, D)
    pool = torch.zeros(2, H, D, D)
    slots = torch.tensor([1], dtype=torch.int32)
    q = torch.randn(1, H, D)
    _step(q, k, v, pool, slots, None)
    q2 = torch.randn(H * D + 5).as_strided((1, H, D), (999, D, 1))
    assert q2.is_contiguous()
    _step(q2, k, v, pool, slots, None)
    assert _view_of(0)[1] == [999, D, 1], _view_of(0)


def test_lean_decode_recovers_after_a_refused_dtype():
    H, D = 2, 4
    q, k, v = torch.randn(2, H, D), torch.randn(2, H, D), torch.randn(2, H, D)
    pool = torch.zeros(2, H, D, D)
    _step(q, k, v, pool, None, None)
    try:
        lajit.decode(q, k.to(torch.int16), v, pool)
    except TypeError as e:
        assert "int16" in str(e), e
    else:
        raise AssertionError("an int16 k was accepted")
    _step(q, k, v, pool, None, None)


def test_lean_decode_threads_keep_their_own_views():
    # Two threads, different shapes, interleaved: each thread's views are its own.
    errors = []
    barrier = threading.Barrier(2)

    def work(B, H, D, seed):
        try:
            g = torch.Generator().manual_seed(seed)
            pool = torch.zeros(B, H, D, D)
            for _ in range(20):
                barrier.wait()
                q, k, v = (torch.randn(B, H, D, generator=g) for _ in range(3))
                _step(q, k, v, pool, None, None)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=work, args=a) for a in ((2, 2, 4, 1), (3, 1, 8, 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ---- Context parallelism (lajit.cp_lightning_attn) ------------------------------------------
# cp_check.py's multi-process runs (gloo, P = 2 and 3, ragged and empty spans) on CPU tensors,
# each spawned rank with the mock backend, and the argument handling in this process.

from cp_check import test_p2 as test_cp_p2, test_p3 as test_cp_p3  # noqa: E402,F401

import tempfile  # noqa: E402

import torch.distributed as dist  # noqa: E402


def test_cp_needs_a_process_group():
    q = torch.randn(1, 2, 5, 4)
    try:
        lajit.cp_lightning_attn(q, q, q)
    except RuntimeError as e:
        assert "init_process_group" in str(e), e
    else:
        raise AssertionError("cp_lightning_attn ran without a process group")


def _refused(call, want):
    for check_ranks in (True, False):
        try:
            call(check_ranks)
        except ValueError as e:
            assert want in str(e), (want, str(e))
        else:
            raise AssertionError(f"not refused (check_ranks={check_ranks}): {want}")


def test_cp_one_rank_matches_lightning_attn_and_refuses_bad_arguments():
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "rdv"),
                                rank=0, world_size=1)
        try:
            g = torch.Generator().manual_seed(7)
            B, H, N, D, E = 2, 3, 9, 4, 6
            r = lambda *sh: torch.randn(*sh, generator=g)  # noqa: E731
            q, k, v, do = r(B, N, H, D), r(B, N, H, D), r(B, N, H, E), r(B, N, H, E)
            s, h0, dsn = torch.rand(H, generator=g), r(B, H, E, D) * 0.1, r(B, H, E, D)
            res = []
            for fn in (lajit.lightning_attn, lajit.cp_lightning_attn):
                xs = [t.clone().requires_grad_() for t in (q, k, v, s, h0)]
                o, hn = fn(*xs[:4], scale=0.5, initial_state=xs[4], output_final_state=True,
                           head_first=False, state_vk=True)
                ((o * do).sum() + (hn * dsn).sum()).backward()
                res.append([o, hn] + [t.grad for t in xs])
            for name, a, b in zip(("o", "S_N", "dq", "dk", "dv", "ds", "dS_0"), *res):
                assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (name, a, b)

            cp = lajit.cp_lightning_attn
            qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
            _refused(lambda c: cp(qh[0], kh, vh, check_ranks=c), "q is 3-D")
            _refused(lambda c: cp(qh, kh[:, :, :4], vh, check_ranks=c), "k (2, 3, 4, 4)")
            _refused(lambda c: cp(qh, kh, vh[:1], check_ranks=c), "v (1, 3, 9, 6) disagrees")
            _refused(lambda c: cp(qh, kh, vh, s[:2], check_ranks=c), "s is (2,)")
            _refused(lambda c: cp(qh, kh, vh, initial_state=h0, check_ranks=c),
                     "initial_state is (2, 3, 6, 4); expected [2, 3, 4, 6]")
            _refused(lambda c: cp(qh, kh, vh, scale=0.0, check_ranks=c), "scale is 0.0")
            _refused(lambda c: cp(qh, kh, vh, scale=float("nan"), check_ranks=c), "finite")
            # Only the checked form says which rank refused.
            try:
                cp(qh[0], kh, vh)
            except ValueError as e:
                assert "rank(s) [0]" in str(e), e
            # An empty span on the only rank: zero outputs, S_N = λ^0 S_0 = S_0.
            e0 = [t[:, :, :0].clone().requires_grad_() for t in (qh, kh, vh)]
            h0k = h0.transpose(-1, -2).contiguous().requires_grad_()
            o, hn = cp(*e0, s, initial_state=h0k, output_final_state=True)
            assert o.shape == (B, H, 0, E) and torch.equal(hn, h0k.detach()), (o.shape, hn)
            (hn * dsn.transpose(-1, -2)).sum().backward()
            assert torch.equal(h0k.grad, dsn.transpose(-1, -2)), "dS_0 = dS_N through no tokens"
            # Under torch.compile: a graph break around the call, the same values and gradients.
            torch._dynamo.reset()

            def layer(x, s):
                return (cp(x.sin(), x, x, s) * 2).sum()
            res = []
            for fn in (layer, torch.compile(layer, backend="aot_eager")):
                x, sx = qh.clone().requires_grad_(), s.clone().requires_grad_()
                fn(x, sx).backward()
                res.append((x.grad, sx.grad))
            assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*res)), res
        finally:
            dist.destroy_process_group()
