"""mock_backend.py — a stand-in for liblajit's op entry points (forward, backward, decode, state
scan), computing the reference recurrence in float64 on CPU tensors, so the package's Python
side (layouts, varlen and pool plumbing, autograd wiring, return conventions, the context-parallel
exchange) and the GPU test files themselves can be exercised on a machine with no GPU. It
replaces the ctypes function pointers of the loaded Library and reads the argument structs the
package fills, mapping each DLTensor back to the tensor that filled it (fwd, bwd, state scan) or,
for decode, rebuilding the tensor from what the DLTensor says (pointer, shape, strides, dtype):
the lean decode caches its views' descriptions, so a stale one shows here.

Not a test of the kernels: the C library is not called. install() patches; nothing else does."""
import ctypes
import threading
import warnings

import torch

from lajit import _native, _torch

_by_view = {}


def _tensor(ptr):
    return None if not ptr else _by_view[ptr]


_BY_CODE = {v: k for k, v in _torch._DTYPES.items()}


def _from_dl(ptr):
    """The CPU tensor a DLTensor describes, sharing its memory (None for a null pointer)."""
    if not ptr:
        return None
    dl = _native.DLTensor.from_address(ptr)
    assert dl.device.device_type == _native.K_DL_CPU, "mock decode: not a host tensor"
    dtype = _BY_CODE[(dl.dtype.code, dl.dtype.bits)]
    shape = [dl.shape[i] for i in range(dl.ndim)]
    strides = [dl.strides[i] for i in range(dl.ndim)]
    if 0 in shape:
        return torch.empty(shape, dtype=dtype)
    item = dl.dtype.bits // 8
    extent = (1 + sum((n - 1) * st for n, st in zip(shape, strides))) * item
    buf = (ctypes.c_char * extent).from_address(dl.data + dl.byte_offset)
    flat = torch.frombuffer(buf, dtype=torch.uint8).view(dtype)
    return flat.as_strided(shape, strides)


def _recur(q, k, v, s, scale, h0, vk):
    """One sequence, [H, N, D] float64: (o [H, N, E], S_N [H, D, E]); o is None when q is (the
    forward's state-only call)."""
    H, N, D = k.shape
    E = v.shape[-1]
    lam = torch.exp(-s).view(H, 1, 1) if s is not None else k.new_ones(H, 1, 1)
    S = k.new_zeros(H, D, E) if h0 is None else (h0.transpose(-1, -2) if vk else h0)
    out = []
    for t in range(N):
        S = lam * S + k[:, t, :, None] * v[:, t, None, :]
        if q is not None:
            out.append(scale * torch.einsum("hd,hde->he", q[:, t], S))
    o = None if q is None else (torch.stack(out, 1) if out else q.new_zeros(H, 0, E))
    return o, (S.transpose(-1, -2) if vk else S)


def _sequences(q, cu):
    """[(batch or None, start, end)] and whether q is packed."""
    if cu is None:
        return [(b, None, None) for b in range(q.shape[0])]
    c = cu.tolist()
    return [(i, c[i], c[i + 1]) for i in range(len(c) - 1)]


def _seq(t, b, a, e, packed):
    """The [H, N, *] float64 slice of sequence b."""
    if t is None:
        return None
    x = t[a:e].transpose(0, 1) if packed else t[b]
    return x.double()


def _put(dst, b, a, e, packed, val):
    if packed:
        dst[a:e].copy_(val.transpose(0, 1))
    else:
        dst[b].copy_(val)


def _state_index(b, slots):
    if slots is None:
        return b
    sl = int(slots[b])
    return None if sl < 0 else sl


def fwd(ctx, argp):
    a = _native.FwdArgs.from_address(argp)
    q, k, v, o = (_tensor(a.q), _tensor(a.k), _tensor(a.v), _tensor(a.o))
    s, h0, hn = _tensor(a.s), _tensor(a.initial_state), _tensor(a.final_state)
    cu, slots = _tensor(a.cu_seqlens), _tensor(a.state_slots)
    packed = cu is not None
    vk = bool(a.flags & _native.STATE_VK)
    s64 = s.double() if s is not None else None
    finals = []
    for b, st, en in _sequences(k, cu):
        i = _state_index(b, slots)
        init = h0[i].double() if (h0 is not None and i is not None) else None
        ob, Sb = _recur(_seq(q if o is not None else None, b, st, en, packed),
                        _seq(k, b, st, en, packed), _seq(v, b, st, en, packed), s64, a.scale,
                        init, vk)
        if o is not None:
            _put(o, b, st, en, packed, ob.to(o.dtype))
        finals.append((i, Sb))
    if hn is not None:  # written after every read: final_state may alias initial_state
        for i, Sb in finals:
            if i is not None:
                hn[i].copy_(Sb)
    return 0


def bwd(ctx, argp):
    # A custom op's kernel runs below the autograd dispatch key (thread-local state): the
    # reference's own autograd runs on a fresh thread.
    result = []

    def work():
        with torch.enable_grad():
            result.append(_bwd(argp))
    th = threading.Thread(target=work)
    th.start()
    th.join()
    if not result:
        raise RuntimeError("mock bwd failed (see the thread's traceback above)")
    return result[0]


def _bwd(argp):
    a = _native.BwdArgs.from_address(argp)
    q, k, v, do = (_tensor(a.q), _tensor(a.k), _tensor(a.v), _tensor(a.dout))
    dq, dk, dv = _tensor(a.dq), _tensor(a.dk), _tensor(a.dv)
    s, ds = _tensor(a.s), _tensor(a.ds)
    h0, dh0, dhn = (_tensor(a.initial_state), _tensor(a.d_initial_state),
                    _tensor(a.d_final_state))
    cu, slots = _tensor(a.cu_seqlens), _tensor(a.state_slots)
    packed = cu is not None
    vk = bool(a.flags & _native.STATE_VK)
    s64 = s.double().requires_grad_() if s is not None else None
    for b, st, en in _sequences(q, cu):
        i = _state_index(b, slots)
        if k is None:  # the dS_0-only call (dq, dk, dv NULL): dS_0 depends on neither k nor v
            qs, dos = _seq(q, b, st, en, packed), _seq(do, b, st, en, packed)
            xs = [qs.clone().requires_grad_(), torch.zeros_like(qs).requires_grad_(),
                  torch.zeros_like(dos).requires_grad_()]
        else:
            xs = [_seq(t, b, st, en, packed).requires_grad_() for t in (q, k, v)]
        init = (h0[i].double().requires_grad_() if (h0 is not None and i is not None) else None)
        if init is None and h0 is None and dh0 is not None and i is not None:
            init = dh0[i].double().zero_().requires_grad_()  # dS_0 does not depend on S_0
        ob, Sb = _recur(*xs, s64, a.scale, init, vk)
        loss = (ob * _seq(do, b, st, en, packed)).sum()
        if dhn is not None and i is not None:
            loss = loss + (Sb * dhn[i].double()).sum()
        wrt = xs + ([init] if init is not None else [])
        grads = torch.autograd.grad(loss, wrt, retain_graph=s64 is not None, allow_unused=True)
        for dst, g in zip((dq, dk, dv), grads[:3]):
            if dst is not None:  # all three NULL: the d_initial_state-only call
                _put(dst, b, st, en, packed, g.to(dst.dtype))
        if init is not None and dh0 is not None:
            dh0[i].copy_(grads[3])
        if s64 is not None:
            (g_s,) = torch.autograd.grad(loss, [s64], allow_unused=True)
            if g_s is not None and ds is not None:
                ds.add_(g_s.float()) if b != 0 else ds.copy_(g_s.float())
    return 0


def decode(ctx, argp):
    a = _native.DecodeArgs.from_address(argp)
    with warnings.catch_warnings():  # frombuffer on a ctypes buffer warns about writability
        warnings.simplefilter("ignore")
        q, k, v, o = (_from_dl(a.q), _from_dl(a.k), _from_dl(a.v), _from_dl(a.o))
        s, pool, slots = _from_dl(a.s), _from_dl(a.state), _from_dl(a.state_slots)
    vk = bool(a.flags & _native.STATE_VK)
    steps = q.dim() == 4
    for b in range(q.shape[0]):
        i = _state_index(b, slots)
        if i is None:
            continue
        qb, kb, vb = (x[b].double() for x in (q, k, v))
        if not steps:
            qb, kb, vb = qb[:, None], kb[:, None], vb[:, None]
        else:
            qb, kb, vb = qb.transpose(0, 1), kb.transpose(0, 1), vb.transpose(0, 1)
        ob, Sb = _recur(qb, kb, vb, s.double() if s is not None else None, a.scale,
                        pool[i].double(), vk)
        o[b].copy_((ob.transpose(0, 1) if steps else ob[:, 0]).to(o.dtype))
        pool[i].copy_(Sb)
    return 0


def state_scan(ctx, argp):
    """lajit_attn_state_scan: X = initial_state (or 0); for each span j, from the first (reverse:
    from the last), incoming[j] = X, X = λ^{n_j} X + local[j]; final = X. Float64 here."""
    a = _native.StateScanArgs.from_address(argp)
    local, lengths, s = _tensor(a.local_states), _tensor(a.lengths), _tensor(a.s)
    h0, incoming, final = (_tensor(a.initial_state), _tensor(a.incoming_states),
                           _tensor(a.final_state))
    P, B, H = local.shape[:3]
    X = (h0.double().clone() if h0 is not None
         else torch.zeros(local.shape[1:], dtype=torch.float64))
    order = range(P - 1, -1, -1) if a.flags & _native.SCAN_REVERSE else range(P)
    for j in order:
        incoming[j].copy_(X)
        if s is not None:  # lengths [P] or [P, B]: n is [1, 1] or [B, 1]
            n = lengths[j].double().reshape(-1, 1)
            X = X * torch.exp(-s.double().view(1, H) * n)[:, :, None, None]
        X = X + local[j].double()
    if final is not None:
        final.copy_(X)
    return 0


def install():
    """Routes the package's C calls to the reference above (CPU tensors only)."""
    real_fill = _torch.fill

    def fill(view, t):
        ptr = real_fill(view, t)
        _by_view[ptr] = t
        return ptr

    _torch.fill = fill
    lib = _native.library()
    lib.fwd = fwd
    lib.bwd = bwd
    lib.decode = decode
    lib.state_scan = state_scan
    return lib
