"""lajit_torch — Lightning Attention for PyTorch from liblajit, with no build step.

(The minimal example. The lajit package — `pip install .`, README "Python package" — is the
supported way: torch.compile, CUDA graphs, FLA's entry points, serving decode.)

The library is loaded with ctypes (LAJIT_LIBRARY, else liblajit.so on the loader's path);
tensors go to it zero-copy as DLPack views (torch.utils.dlpack.to_dlpack gives a capsule
whose DLManagedTensor starts with the DLTensor the C API takes); calls run on PyTorch's
current stream, so they order with the surrounding PyTorch work and can be captured in CUDA
graphs once their kernels are built.

    from lajit_torch import lightning_attention
    o = lightning_attention(q, k, v, s, scale=1.0)   # q, k [B,H,N,D]; v [B,H,N,E]; s [H] or None
    o.sum().backward()                                # dq, dk, dv and ds (when s requires grad)

Conventions are DESIGN.md's: o_t = σ q_t S_t with S_t = exp(−s_h) S_{t−1} + k_tᵀ v_t."""
import ctypes
import os

import torch
from torch.utils.dlpack import to_dlpack

_P = ctypes.c_void_p


class _FwdArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("q", _P), ("k", _P), ("v", _P), ("o", _P),
                ("s", _P), ("scale", ctypes.c_float), ("initial_state", _P), ("final_state", _P),
                ("cu_seqlens", _P), ("state_slots", _P), ("flags", ctypes.c_uint32),
                ("family", ctypes.c_char_p), ("stream", _P)]


class _BwdArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("q", _P), ("k", _P), ("v", _P), ("dout", _P),
                ("dq", _P), ("dk", _P), ("dv", _P), ("s", _P), ("ds", _P),
                ("scale", ctypes.c_float), ("initial_state", _P), ("d_initial_state", _P),
                ("d_final_state", _P), ("cu_seqlens", _P), ("state_slots", _P),
                ("workspace", _P), ("flags", ctypes.c_uint32), ("family", ctypes.c_char_p),
                ("stream", _P)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class _Lib:
    """liblajit and one context per CUDA device (contexts are used from one thread at a time)."""

    def __init__(self):
        self.lib = ctypes.CDLL(os.environ.get("LAJIT_LIBRARY", "liblajit.so"))
        self.lib.lajit_ctx_create.argtypes = [_P, ctypes.POINTER(_P)]
        self.lib.lajit_errmsg.restype = ctypes.c_char_p
        self.lib.lajit_errmsg.argtypes = [_P]
        self.lib.lajit_status_string.restype = ctypes.c_char_p
        self.lib.lajit_attn_fwd.argtypes = [_P, ctypes.POINTER(_FwdArgs)]
        self.lib.lajit_attn_bwd.argtypes = [_P, ctypes.POINTER(_BwdArgs)]
        self.contexts = {}

    def ctx(self, device):
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self.contexts:
            # The descriptor may grow in later versions: let the library size and fill it,
            # then set the device ordinal (the int after struct_size).
            desc = ctypes.create_string_buffer(1024)
            self.lib.lajit_ctx_desc_init(desc)
            ctypes.c_int.from_buffer(desc, ctypes.sizeof(ctypes.c_size_t)).value = index
            ctx = _P()
            self.check(None, self.lib.lajit_ctx_create(desc, ctypes.byref(ctx)), "lajit_ctx_create")
            self.contexts[index] = ctx
        return self.contexts[index]

    def check(self, ctx, status, what):
        if status != 0:
            detail = self.lib.lajit_errmsg(ctx).decode() if ctx else ""
            raise RuntimeError(f"{what}: {self.lib.lajit_status_string(status).decode()}: {detail}")


_lib = None


def _library():
    global _lib
    if _lib is None:
        _lib = _Lib()
    return _lib


class _View:
    """A DLPack view of a tensor, kept alive (with its capsule) for the duration of a call."""

    def __init__(self, t):
        self.tensor = t
        self.capsule = to_dlpack(t)
        self.ptr = _capsule_pointer(self.capsule, b"dltensor")


def _views(**tensors):
    return {k: (_View(t) if t is not None else None) for k, t in tensors.items()}


def _ptr(view):
    return view.ptr if view is not None else None


def _stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream


def attn_fwd(q, k, v, s=None, scale=1.0):
    lib = _library()
    o = torch.empty_like(v)
    vw = _views(q=q, k=k, v=v, o=o, s=s)
    a = _FwdArgs(struct_size=ctypes.sizeof(_FwdArgs), q=_ptr(vw["q"]), k=_ptr(vw["k"]),
                 v=_ptr(vw["v"]), o=_ptr(vw["o"]), s=_ptr(vw["s"]), scale=scale,
                 stream=_stream(q))
    ctx = lib.ctx(q.device)
    lib.check(ctx, lib.lib.lajit_attn_fwd(ctx, ctypes.byref(a)), "lajit_attn_fwd")
    return o


def attn_bwd(q, k, v, do, s=None, scale=1.0, want_ds=False):
    lib = _library()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    ds = torch.empty_like(s) if (want_ds and s is not None) else None
    vw = _views(q=q, k=k, v=v, do=do, dq=dq, dk=dk, dv=dv, s=s, ds=ds)
    a = _BwdArgs(struct_size=ctypes.sizeof(_BwdArgs), q=_ptr(vw["q"]), k=_ptr(vw["k"]),
                 v=_ptr(vw["v"]), dout=_ptr(vw["do"]), dq=_ptr(vw["dq"]), dk=_ptr(vw["dk"]),
                 dv=_ptr(vw["dv"]), s=_ptr(vw["s"]), ds=_ptr(vw["ds"]), scale=scale,
                 stream=_stream(q))
    ctx = lib.ctx(q.device)
    lib.check(ctx, lib.lib.lajit_attn_bwd(ctx, ctypes.byref(a)), "lajit_attn_bwd")
    return dq, dk, dv, ds


class LightningAttention(torch.autograd.Function):
    """o = lightning attention of (q, k, v) with per-head decay rates s (learnable or not)."""

    @staticmethod
    def forward(ctx, q, k, v, s, scale):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        s_in = s.detach().float().contiguous() if s is not None else None
        o = attn_fwd(q, k, v, s_in, scale)
        ctx.save_for_backward(q, k, v, s_in)
        ctx.scale = scale
        ctx.want_ds = s is not None and s.requires_grad
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, s = ctx.saved_tensors
        dq, dk, dv, ds = attn_bwd(q, k, v, do.contiguous(), s, ctx.scale, ctx.want_ds)
        return dq, dk, dv, ds, None


def lightning_attention(q, k, v, s=None, scale=1.0):
    """q, k [B,H,N,D], v [B,H,N,E] (float32, float16 or bfloat16, on one CUDA device); s [H]
    float32 >= 0 or None (no decay)."""
    return LightningAttention.apply(q, k, v, s, scale)
