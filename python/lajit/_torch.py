"""_torch — lajit's ops registered with PyTorch (torch.library.custom_op), and the lean decode.

Ops (namespace lajit; torch.ops.lajit.*):
  fwd      (q, k, v, s?, scale, initial_state?, cu_seqlens?, state_slots?, output_final_state,
            head_first, state_vk) -> (o, final_state)       autograd through lajit::bwd
  bwd      the gradients of fwd's inputs (dq, dk, dv, ds, d_initial_state)
  prefill_ varlen prefill on a state pool, updated in place (serving)
  decode_  1..8 recurrent steps per row on a state pool, updated in place (serving)
Each has a fake implementation (shapes only) so torch.compile(fullgraph=True) traces through it,
and each runs on torch.cuda.current_stream() with zero copies: the C API gets DLTensor views of
the tensors' own memory (strided views with a unit last stride are passed as they are).
Outputs that an op may not produce are returned as empty tensors (custom ops cannot return
None); the public wrappers (api.py) turn them back into None.

Also here, as plain functions (not registered ops: their only caller, context parallelism in
cp.py, runs eagerly around torch.distributed collectives): the forward's state-only call, the
state scan, and the backward's gradient-state-only call, each writing into a tensor it is given
(a slot of an exchange buffer) on the current stream.

Layouts: head_first=True means lajit's own [B, H, N, D]; False means FLA's [B, N, H, D], which
the C API takes as a permuted view (no copy). Varlen inputs are packed [T, H, D]."""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _native as N

_DTYPES = {torch.float32: (N.DL_FLOAT, 32), torch.float16: (N.DL_FLOAT, 16),
           torch.bfloat16: (N.DL_BFLOAT, 16), torch.int32: (N.DL_INT, 32),
           torch.int64: (N.DL_INT, 64), torch.uint8: (N.DL_UINT, 8),
           torch.float64: (N.DL_FLOAT, 64)}

try:
    _raw_stream = torch._C._cuda_getCurrentRawStream  # the cheap form of current_stream()
except AttributeError:  # a CPU-only build of torch
    _raw_stream = None


def _stream(device_index):
    if device_index < 0 or _raw_stream is None:
        return None
    return _raw_stream(device_index)


def fill(view, t):
    """Points `view` at tensor t (zero copy). Rewrites shape and strides only when they changed
    since the view's last tensor, so a steady-state call costs a data pointer store."""
    key = (t.size(), t.stride(), t.dtype, t.get_device())  # size(): faster than .shape
    if view.key != key:
        try:
            code, bits = _DTYPES[t.dtype]
        except KeyError:
            raise TypeError(f"lajit does not take {t.dtype} tensors") from None
        dev = key[3]
        view.fill(0, key[0], key[1], code, bits, N.K_DL_CUDA if dev >= 0 else N.K_DL_CPU,
                  max(dev, 0))
        view.key = key
    view.dl.data = t.data_ptr()
    return view.ptr


class _Scratch:
    """Per-thread views and argument structs of fwd, bwd and prefill, reused by every call of
    that thread (a call is not re-entered on one thread, and the C API reads them only during
    the call). The lean decode has its own (_DecodeScratch)."""

    def __init__(self):
        self.views = [N.View() for _ in range(14)]
        self.fwd = N.FwdArgs()
        self.bwd = N.BwdArgs()
        self.scan = N.StateScanArgs()
        self.fwd_ptr = N.ctypes.addressof(self.fwd)
        self.bwd_ptr = N.ctypes.addressof(self.bwd)
        self.scan_ptr = N.ctypes.addressof(self.scan)


def _scratch(lib):
    s = getattr(lib.local, "scratch", None)
    if s is None:
        s = lib.local.scratch = _Scratch()
    return s


def _views(sc, *tensors):
    return [fill(sc.views[i], t) if t is not None else None for i, t in enumerate(tensors)]


def _bhnd(t, head_first):
    """FLA's [B, N, H, D] as lajit's [B, H, N, D] view; packed or head-first as is."""
    if t is None or head_first or t.dim() != 4:
        return t
    return t.transpose(1, 2)


def _unit_last(t):
    return t if t is None or t.stride(-1) == 1 or t.numel() <= 1 else t.contiguous()


def _device_index(t):
    d = t.get_device()
    return d if d >= 0 else 0


def _state_shape(nseq, H, D, E, state_vk):
    return (nseq, H, E, D) if state_vk else (nseq, H, D, E)


def _empty(like):
    return torch.empty(0, dtype=torch.float32, device=like.device)


def _fwd_shapes(q, v, head_first, cu_seqlens):
    """(output shape, nseq, H, D, E) of a forward call."""
    D, E = q.shape[-1], v.shape[-1]
    if cu_seqlens is not None:
        return tuple(v.shape), cu_seqlens.shape[0] - 1, q.shape[-2], D, E
    H = q.shape[1] if head_first else q.shape[2]
    return tuple(v.shape), q.shape[0], H, D, E


# ---- Forward ---------------------------------------------------------------------------------

def _state_dtype(initial_state):
    """The dtype of a forward's final state: initial_state's (float32, bfloat16 or float16 storage)
    or float32."""
    return torch.float32 if initial_state is None else initial_state.dtype


@torch.library.custom_op("lajit::fwd", mutates_args=())
def fwd(q: Tensor, k: Tensor, v: Tensor, s: Optional[Tensor], scale: float,
        initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor],
        state_slots: Optional[Tensor], output_final_state: bool, head_first: bool,
        state_vk: bool) -> Tuple[Tensor, Tensor]:
    lib = N.library()
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    oshape, nseq, H, D, E = _fwd_shapes(q, v, head_first, cu_seqlens)
    o = torch.empty(oshape, dtype=v.dtype, device=v.device)
    final = None
    slots = state_slots
    if output_final_state:
        if cu_seqlens is not None and initial_state is not None and state_slots is not None:
            final = initial_state.clone()  # a pool: slots not named keep their states
        else:
            # The states of one call share a dtype: float32, or the 16-bit storage of
            # initial_state (the C API accumulates in fp32 and rounds once on the write).
            final = torch.empty(_state_shape(nseq, H, D, E, state_vk),
                                dtype=_state_dtype(initial_state), device=v.device)
    if (cu_seqlens is not None and slots is None
            and (initial_state is not None or final is not None)):
        slots = torch.arange(nseq, dtype=torch.int32, device=v.device)
    dev = _device_index(q)
    sc = _scratch(lib)
    a = sc.fwd
    p = _views(sc, _bhnd(q, head_first), _bhnd(k, head_first), _bhnd(v, head_first),
               _bhnd(o, head_first), s, initial_state, final, cu_seqlens, slots)
    a.struct_size = N.ctypes.sizeof(N.FwdArgs)
    a.q, a.k, a.v, a.o, a.s, a.initial_state, a.final_state, a.cu_seqlens, a.state_slots = p
    a.scale = scale
    a.flags = N.STATE_VK if state_vk else 0
    a.family = None
    a.stream = _stream(q.get_device())
    ctx = lib.ctx(dev)
    lib.check("lajit_attn_fwd", ctx, lib.fwd(ctx, sc.fwd_ptr))
    return o, (final if final is not None else _empty(v))


@fwd.register_fake
def _(q, k, v, s, scale, initial_state, cu_seqlens, state_slots, output_final_state,
      head_first, state_vk):
    oshape, nseq, H, D, E = _fwd_shapes(q, v, head_first, cu_seqlens)
    o = v.new_empty(oshape)
    if not output_final_state:
        return o, v.new_empty(0, dtype=torch.float32)
    if cu_seqlens is not None and initial_state is not None and state_slots is not None:
        return o, torch.empty_like(initial_state)
    return o, v.new_empty(_state_shape(nseq, H, D, E, state_vk), dtype=_state_dtype(initial_state))


# ---- Backward --------------------------------------------------------------------------------

@torch.library.custom_op("lajit::bwd", mutates_args=())
def bwd(q: Tensor, k: Tensor, v: Tensor, dout: Tensor, s: Optional[Tensor], scale: float,
        initial_state: Optional[Tensor], d_final_state: Optional[Tensor],
        cu_seqlens: Optional[Tensor], state_slots: Optional[Tensor], want_ds: bool,
        want_d_initial: bool, head_first: bool, state_vk: bool
        ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    lib = N.library()
    q, k, v, dout = _unit_last(q), _unit_last(k), _unit_last(v), _unit_last(dout)
    # The C backward keeps the states' gradients in fp32 and takes float32 states only: a 16-bit
    # S_0 (or dS_N) is widened here, and dS_0 is returned in S_0's dtype.
    h0_dtype = None if initial_state is None else initial_state.dtype
    if initial_state is not None and initial_state.dtype != torch.float32:
        initial_state = initial_state.float()
    if d_final_state is not None and d_final_state.dtype != torch.float32:
        d_final_state = d_final_state.float()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    ds = torch.empty_like(s) if (want_ds and s is not None) else None
    dh0 = None
    if want_d_initial and initial_state is not None:
        # Slots of -1 leave their rows unwritten: start from zeros there.
        dh0 = (torch.zeros_like(initial_state) if state_slots is not None
               else torch.empty_like(initial_state))
    slots = state_slots
    if (cu_seqlens is not None and slots is None
            and (initial_state is not None or d_final_state is not None)):
        slots = torch.arange(cu_seqlens.shape[0] - 1, dtype=torch.int32, device=q.device)
    dev = _device_index(q)
    sc = _scratch(lib)
    a = sc.bwd
    hf = head_first
    p = _views(sc, _bhnd(q, hf), _bhnd(k, hf), _bhnd(v, hf), _bhnd(dout, hf), _bhnd(dq, hf),
               _bhnd(dk, hf), _bhnd(dv, hf), s, ds, initial_state, dh0, d_final_state,
               cu_seqlens, slots)
    a.struct_size = N.ctypes.sizeof(N.BwdArgs)
    (a.q, a.k, a.v, a.dout, a.dq, a.dk, a.dv, a.s, a.ds, a.initial_state, a.d_initial_state,
     a.d_final_state, a.cu_seqlens, a.state_slots) = p
    a.workspace = None
    a.scale = scale
    a.flags = N.STATE_VK if state_vk else 0
    a.family = None
    a.stream = _stream(q.get_device())
    ctx = lib.ctx(dev)
    lib.check("lajit_attn_bwd", ctx, lib.bwd(ctx, sc.bwd_ptr))
    if dh0 is not None and dh0.dtype != h0_dtype:
        dh0 = dh0.to(h0_dtype)
    return (dq, dk, dv, ds if ds is not None else _empty(q),
            dh0 if dh0 is not None else _empty(q))


@bwd.register_fake
def _(q, k, v, dout, s, scale, initial_state, d_final_state, cu_seqlens, state_slots, want_ds,
      want_d_initial, head_first, state_vk):
    ds = torch.empty_like(s) if (want_ds and s is not None) else q.new_empty(0, dtype=torch.float32)
    dh0 = (torch.empty_like(initial_state) if (want_d_initial and initial_state is not None)
           else q.new_empty(0, dtype=torch.float32))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), ds, dh0


def _fwd_setup(ctx, inputs, output):
    (q, k, v, s, scale, initial_state, cu_seqlens, state_slots, output_final_state,
     head_first, state_vk) = inputs
    ctx.save_for_backward(q, k, v, s, initial_state, cu_seqlens, state_slots)
    ctx.scale = scale
    ctx.head_first = head_first
    ctx.state_vk = state_vk
    ctx.output_final_state = output_final_state


def _fwd_backward(ctx, do, dfinal):
    q, k, v, s, initial_state, cu_seqlens, state_slots = ctx.saved_tensors
    want_ds = s is not None and ctx.needs_input_grad[3]
    want_dh0 = initial_state is not None and ctx.needs_input_grad[5]
    dht = dfinal if (ctx.output_final_state and dfinal is not None) else None
    dq, dk, dv, ds, dh0 = bwd(q, k, v, do, s, ctx.scale, initial_state, dht, cu_seqlens,
                              state_slots, want_ds, want_dh0, ctx.head_first, ctx.state_vk)
    return (dq, dk, dv, ds if want_ds else None, None, dh0 if want_dh0 else None, None, None,
            None, None, None)


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup)


# ---- Building blocks of context parallelism (cp.py) ------------------------------------------

def fwd_state_into(final, k, v, s, scale, initial_state, head_first, state_vk):
    """lajit_attn_fwd's state-only call (o and q NULL): writes final = λ^N S_0 +
    Σ_{t=1..N} λ^{N−t} k_tᵀ v_t, the span's local state M when initial_state is None. final:
    float32 [B, H, D, E] (or [.., E, D]), any view the C API takes (a slot of an exchange
    buffer); initial_state: float32 or None. k, v as for fwd (head_first as there). Returns
    final."""
    lib = N.library()
    k, v = _unit_last(k), _unit_last(v)
    sc = _scratch(lib)
    a = sc.fwd
    p = _views(sc, _bhnd(k, head_first), _bhnd(v, head_first), s, initial_state, final)
    a.struct_size = N.ctypes.sizeof(N.FwdArgs)
    a.q = a.o = a.cu_seqlens = a.state_slots = None
    a.k, a.v, a.s, a.initial_state, a.final_state = p
    a.scale = scale
    a.flags = N.STATE_VK if state_vk else 0
    a.family = None
    a.stream = _stream(k.get_device())
    ctx = lib.ctx(_device_index(k))
    lib.check("lajit_attn_fwd", ctx, lib.fwd(ctx, sc.fwd_ptr))
    return final


def state_scan_into(incoming, final, local_states, lengths, s, initial_state, reverse,
                    state_vk):
    """lajit_attn_state_scan: incoming[j] = the carry entering span j of the P spans whose local
    states (float32 [P, B, H, D, E], strided) and lengths (int32/int64 [P], strided) are given,
    walked from span 0 (reverse: from span P − 1) starting at initial_state (None: zero); final
    (or None) receives the carry after the last span walked. Returns incoming."""
    lib = N.library()
    sc = _scratch(lib)
    a = sc.scan
    p = _views(sc, local_states, lengths, s, initial_state, incoming, final)
    a.struct_size = N.ctypes.sizeof(N.StateScanArgs)
    (a.local_states, a.lengths, a.s, a.initial_state, a.incoming_states, a.final_state) = p
    a.flags = (N.STATE_VK if state_vk else 0) | (N.SCAN_REVERSE if reverse else 0)
    a.family = None
    a.stream = _stream(incoming.get_device())
    ctx = lib.ctx(_device_index(incoming))
    lib.check("lajit_attn_state_scan", ctx, lib.state_scan(ctx, sc.scan_ptr))
    return incoming


def bwd_d_initial_into(out, q, dout, s, scale, d_final_state, head_first, state_vk):
    """The gradient reaching the initial state of a span from its outputs' gradient dout (and
    from d_final_state when given, else none): lajit_attn_bwd's d_initial_state with no
    initial_state, written into out (float32 [B, H, D, E] or [.., E, D], e.g. a slot of an
    exchange buffer). It does not depend on S_0: σ Σ_{t=1..N} λ^t q_tᵀ dO_t (+ λ^N dS_N). Returns
    out."""
    lib = N.library()
    q, dout = _unit_last(q), _unit_last(dout)
    sc = _scratch(lib)
    a = sc.bwd
    hf = head_first
    # dq, dk and dv NULL: the C backward's dS_0-only call, the reversed walk over q and dout with
    # no outputs (k and v are not read, so not given).
    p = _views(sc, _bhnd(q, hf), _bhnd(dout, hf), s, out, d_final_state)
    a.struct_size = N.ctypes.sizeof(N.BwdArgs)
    (a.q, a.dout, a.s, a.d_initial_state, a.d_final_state) = p
    a.k = a.v = a.dq = a.dk = a.dv = a.ds = a.initial_state = a.cu_seqlens = None
    a.state_slots = a.workspace = None
    a.scale = scale
    a.flags = N.STATE_VK if state_vk else 0
    a.family = None
    a.stream = _stream(q.get_device())
    ctx = lib.ctx(_device_index(q))
    lib.check("lajit_attn_bwd", ctx, lib.bwd(ctx, sc.bwd_ptr))
    return out


# ---- Serving: varlen prefill and decode on a state pool ---------------------------------------

@torch.library.custom_op("lajit::prefill_", mutates_args=("state_pool",))
def prefill_(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, state_pool: Tensor,
             state_slots: Tensor, s: Optional[Tensor], scale: float, state_vk: bool) -> Tensor:
    lib = N.library()
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    sc = _scratch(lib)
    a = sc.fwd
    # The pool is both the initial and the final state (the C API allows the alias).
    p = _views(sc, q, k, v, o, s, state_pool, cu_seqlens, state_slots)
    a.struct_size = N.ctypes.sizeof(N.FwdArgs)
    a.q, a.k, a.v, a.o, a.s, a.initial_state, a.cu_seqlens, a.state_slots = p
    a.final_state = a.initial_state
    a.scale = scale
    a.flags = N.STATE_VK if state_vk else 0
    a.family = None
    a.stream = _stream(q.get_device())
    ctx = lib.ctx(_device_index(q))
    lib.check("lajit_attn_fwd", ctx, lib.fwd(ctx, sc.fwd_ptr))
    return o


@prefill_.register_fake
def _(q, k, v, cu_seqlens, state_pool, state_slots, s, scale, state_vk):
    return v.new_empty(v.shape)


@torch.library.custom_op("lajit::decode_", mutates_args=("state_pool",))
def decode_(q: Tensor, k: Tensor, v: Tensor, state_pool: Tensor, state_slots: Optional[Tensor],
            s: Optional[Tensor], scale: float, state_vk: bool) -> Tensor:
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    decode_into(o, q, k, v, state_pool, state_slots, s, scale, state_vk)
    return o


@decode_.register_fake
def _(q, k, v, state_pool, state_slots, s, scale, state_vk):
    return v.new_empty(v.shape)


class _DecodeScratch:
    """Per-thread state of the lean decode: the argument struct, seven DLTensor views of its own
    (q, k, v, o, s, state, state_slots; no other code writes them) whose addresses are stored in
    the struct once, a c_uint64 over each view's data field, and meta[i], what view i's other
    fields describe: (size, dtype, device, canonical, strides) as read from the tensor that
    last filled it, canonical meaning "every size >= 2 and the strides are the contiguous ones".

    Why this cannot serve a stale description. Every call reads each tensor's shape, dtype and
    get_device() afresh (never trusting id() or the object's identity: resize_, set_,
    as_strided_ and `t.data = ...` change them in place) and compares them with meta[i]; its
    strides are read afresh too, as stride(), or, when meta[i] is canonical, as is_contiguous()
    (torch's flag, recomputed whenever sizes or strides change): with the same sizes, all >= 2,
    contiguity leaves one stride per dimension possible, the one described (a size-1 dimension
    would leave its stride free, hence the ">= 2"). Only _describe writes view i's shape,
    stride, dtype and device fields, and it sets meta[i] after writing them (UNSET while it
    writes, so an exception midway leaves a view that matches nothing). The data pointer is
    read and stored on every call."""

    __slots__ = ("args", "argp", "views", "unset", "meta", "s_ptr", "slots_ptr", "ctxs")

    def __init__(self, lib):
        self.views = [N.View() for _ in range(7)]
        # meta[i] when view i describes nothing: matches no tensor (a shape is never None).
        self.unset = [(None, None, None, False, None,
                       N.ctypes.c_uint64.from_address(vw.ptr + N.DLTensor.data.offset))
                      for vw in self.views]
        self.meta = list(self.unset)
        a = self.args = N.DecodeArgs()
        a.struct_size = N.ctypes.sizeof(N.DecodeArgs)
        a.q, a.k, a.v, a.o = (vw.ptr for vw in self.views[:4])
        a.state = self.views[5].ptr
        a.step_states = None
        a.family = None
        self.s_ptr = self.views[4].ptr
        self.slots_ptr = self.views[6].ptr
        self.argp = N.ctypes.addressof(a)
        # This thread's context table (Library.ctx fills the same dict).
        self.ctxs = getattr(lib.local, "ctx", None)
        if self.ctxs is None:
            self.ctxs = lib.local.ctx = {}


def _canonical(size, stride):
    """True when every size is >= 2 and stride is size's contiguous strides."""
    expect = 1
    for n, st in zip(reversed(size), reversed(stride)):
        if n < 2 or st != expect:
            return False
        expect *= n
    return True


def _describe(sc, i, t):
    """Rewrites view i's shape, strides, dtype and device from t (the slow path: new shapes)."""
    unset = sc.meta[i] = sc.unset[i]
    size, stride, dtype, dev = t.shape, t.stride(), t.dtype, t.get_device()
    try:
        code, bits = _DTYPES[dtype]
    except KeyError:
        raise TypeError(f"lajit does not take {dtype} tensors") from None
    sc.views[i].fill(0, size, stride, code, bits, N.K_DL_CUDA if dev >= 0 else N.K_DL_CPU,
                     max(dev, 0))
    c = sc.meta[i] = (size, dtype, dev, _canonical(size, stride), stride, unset[5])
    return c


def _decode_scratch(lib):
    sc = lib.local.decode = _DecodeScratch(lib)
    return sc


def decode_into(o, q, k, v, state_pool, state_slots, s, scale, state_vk):
    """The lean decode: one lajit_attn_decode call on this thread's views, whose data pointers
    are stored afresh each call and whose shapes/strides/dtypes/devices are rewritten only when
    the fresh reads differ from what they describe (see _DecodeScratch), and the raw current
    stream. No dispatcher. Unrolled on purpose: this is the per-token host cost of serving."""
    lib = N._library or N.library()
    try:
        sc = lib.local.decode
    except AttributeError:
        sc = _decode_scratch(lib)
    m0, m1, m2, m3, m4, m5, m6 = sc.meta
    a = sc.args
    dev = q.get_device()
    c = m0
    if (q.shape != c[0] or q.dtype is not c[1] or dev != c[2]
            or not (q.is_contiguous() if c[3] else q.stride() == c[4])):
        c = _describe(sc, 0, q)
    c[5].value = q.data_ptr()
    c = m1
    if (k.shape != c[0] or k.dtype is not c[1] or k.get_device() != c[2]
            or not (k.is_contiguous() if c[3] else k.stride() == c[4])):
        c = _describe(sc, 1, k)
    c[5].value = k.data_ptr()
    c = m2
    if (v.shape != c[0] or v.dtype is not c[1] or v.get_device() != c[2]
            or not (v.is_contiguous() if c[3] else v.stride() == c[4])):
        c = _describe(sc, 2, v)
    c[5].value = v.data_ptr()
    c = m3
    if (o.shape != c[0] or o.dtype is not c[1] or o.get_device() != c[2]
            or not (o.is_contiguous() if c[3] else o.stride() == c[4])):
        c = _describe(sc, 3, o)
    c[5].value = o.data_ptr()
    if s is not None:
        c = m4
        if (s.shape != c[0] or s.dtype is not c[1] or s.get_device() != c[2]
                or not (s.is_contiguous() if c[3] else s.stride() == c[4])):
            c = _describe(sc, 4, s)
        c[5].value = s.data_ptr()
        a.s = sc.s_ptr
    else:
        a.s = None
    t = state_pool
    c = m5
    if (t.shape != c[0] or t.dtype is not c[1] or t.get_device() != c[2]
            or not (t.is_contiguous() if c[3] else t.stride() == c[4])):
        c = _describe(sc, 5, t)
    c[5].value = t.data_ptr()
    if state_slots is not None:
        t = state_slots
        c = m6
        if (t.shape != c[0] or t.dtype is not c[1] or t.get_device() != c[2]
                or not (t.is_contiguous() if c[3] else t.stride() == c[4])):
            c = _describe(sc, 6, t)
        c[5].value = t.data_ptr()
        a.state_slots = sc.slots_ptr
    else:
        a.state_slots = None
    a.scale = scale
    a.flags = 1 if state_vk else 0
    if dev >= 0:
        a.stream = _raw_stream(dev) if _raw_stream is not None else None
        ctx = sc.ctxs.get(dev) or lib.ctx(dev)
    else:
        a.stream = None
        ctx = sc.ctxs.get(0) or lib.ctx(0)
    st = lib.decode(ctx, sc.argp)
    if st:
        N.raise_status("lajit_attn_decode", st, lib.errmsg(ctx))
    return o


class DecodeBinding:
    """Decode on fixed buffers (a serving loop's persistent q/k/v/out, pool and slot buffers,
    as CUDA-graph serving keeps anyway): the DLTensor views and the argument struct are built
    once here, so a call costs the current-stream lookup and the C call. The buffers' contents
    may change between calls; their shapes and addresses must not (bind again if they do)."""

    def __init__(self, q, k, v, state_pool, state_slots=None, s=None, *, scale=1.0, out=None,
                 state_vk=False):
        self.lib = lib = N.library()
        if out is None:
            out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        self.out = out
        self._keep = (q, k, v, out, state_pool, state_slots, s)
        self._views = [N.View() for _ in range(7)]
        a = self._args = N.DecodeArgs()
        a.struct_size = N.ctypes.sizeof(N.DecodeArgs)
        vw = self._views
        a.q, a.k, a.v, a.o = fill(vw[0], q), fill(vw[1], k), fill(vw[2], v), fill(vw[3], out)
        a.state = fill(vw[4], state_pool)
        a.state_slots = fill(vw[5], state_slots) if state_slots is not None else None
        a.s = fill(vw[6], s) if s is not None else None
        a.step_states = None
        a.scale = scale
        a.flags = N.STATE_VK if state_vk else 0
        a.family = None
        self._argp = N.ctypes.addressof(a)
        self._dev = q.get_device()
        self._fn = lib.decode
        self._ctx_table = None
        self._ctx = None

    def __call__(self):
        dev = self._dev
        self._args.stream = _raw_stream(dev) if dev >= 0 and _raw_stream is not None else None
        # The context is per thread: re-resolve it when called from another thread.
        table = getattr(self.lib.local, "ctx", None)
        if table is not self._ctx_table or self._ctx is None:
            self._ctx = self.lib.ctx(max(dev, 0))
            self._ctx_table = self.lib.local.ctx
        st = self._fn(self._ctx, self._argp)
        if st:
            N.raise_status("lajit_attn_decode", st, self.lib.errmsg(self._ctx))
        return self.out
