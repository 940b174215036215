"""api — the functions users call: lajit's native lightning_attn, FLA 0.6's simple-GLA entry
points (drop-in: same signatures and return conventions), the serving prefill/decode on a
state pool, and the decay adapters.

Mathematics (DESIGN.md): S_t = λ_h S_{t−1} + k_tᵀ v_t, o_t = σ q_t S_t, λ_h = exp(−s_h), S in
fp32. FLA's g_gamma is log λ, so s = −g_gamma; FLA's default σ is 1/√D, lajit's is 1."""
import math
import re

import torch

from . import _native
from . import _torch as _ops


try:
    # Bound once: decode calls it per token (dynamo still folds it to True while tracing).
    _compiling = torch.compiler.is_compiling
except AttributeError:  # torch < 2.3
    def _compiling():
        return False


def _i32(t):
    return None if t is None else (t if t.dtype == torch.int32 else t.to(torch.int32))


def _decay(s):
    return None if s is None else (s if s.dtype == torch.float32 else s.float())


def lightning_attn(q, k, v, s=None, *, scale=1.0, initial_state=None, output_final_state=False,
                   cu_seqlens=None, state_slots=None, head_first=True, state_vk=False):
    """Lightning attention with lajit's conventions.

    q, k [B, H, N, D] and v [B, H, N, E] (head_first=False: [B, N, H, D], FLA's layout), or packed
    [T, H, D] with cu_seqlens (int32 or int64 [nseq+1]); float32, float16 or bfloat16 on one CUDA
    device. s: per-head decay rate [H] (>= 0, λ = exp(−s); None: no decay); learnable (its
    gradient comes from the kernel). scale: σ (1 by default). initial_state: float32, bfloat16
    or float16 (a storage format: accumulation is fp32; the final state takes its dtype)
    [B, H, D, E] ([.., E, D] with state_vk), or with cu_seqlens a pool addressed by state_slots
    (int32 [nseq], −1: none; LAJIT_SLOT_FRESH(s) = −2 − s: start from zero, write slot s).
    Differentiable in q, k, v, s and initial_state.

    Returns o (shaped like v), or (o, final_state) when output_final_state."""
    o, final = _ops.fwd(q, k, v, _decay(s), float(scale), initial_state, _i32(cu_seqlens),
                        _i32(state_slots), bool(output_final_state), bool(head_first),
                        bool(state_vk))
    return (o, final) if output_final_state else o


def _fla_common(name, q, k, v, g, g_gamma, scale, initial_state, cu_seqlens, kwargs):
    if g is not None:
        raise NotImplementedError(
            f"lajit.{name}: data-dependent gates g are not supported (lajit implements a "
            "per-head constant decay); pass g_gamma [H] instead, or use FLA for g")
    if "head_first" in kwargs:
        raise DeprecationWarning(
            "head_first has been removed. Inputs must be in `[B, T, H, ...]` format.")
    chunk_size = kwargs.pop("chunk_size", None)
    if chunk_size is not None and chunk_size != 2 ** (chunk_size.bit_length() - 1):
        raise ValueError(f"`chunk_size` must be a power of 2, got {chunk_size}.")
    kwargs.pop("cu_seqlens_cpu", None)
    kwargs.pop("chunk_indices", None)
    if kwargs:
        raise TypeError(f"lajit.{name}: unexpected arguments {sorted(kwargs)}")
    if cu_seqlens is not None:
        if q.shape[0] != 1:
            raise ValueError(f"The batch size is expected to be 1 rather than {q.shape[0]} "
                             "when using `cu_seqlens`.")
        if initial_state is not None and initial_state.shape[0] != len(cu_seqlens) - 1:
            raise ValueError(
                "The number of initial states is expected to be equal to the number of input "
                f"sequences, i.e., {len(cu_seqlens) - 1} rather than {initial_state.shape[0]}.")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    s = None if g_gamma is None else -g_gamma.float()
    return s, float(scale)


def _fla_call(q, k, v, s, scale, initial_state, output_final_state, state_v_first, cu_seqlens):
    h0 = initial_state
    if h0 is not None and h0.dtype != torch.float32:
        h0 = h0.float()
    if cu_seqlens is not None:
        o, final = _ops.fwd(q[0], k[0], v[0], s, scale, h0, _i32(cu_seqlens), None,
                            bool(output_final_state), False, bool(state_v_first))
        o = o.unsqueeze(0)
    else:
        o, final = _ops.fwd(q, k, v, s, scale, h0, None, None, bool(output_final_state), False,
                            bool(state_v_first))
    return o, (final if output_final_state else None)


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                     output_final_state=False, state_v_first=False, cu_seqlens=None,
                     cu_seqlens_cpu=None, **kwargs):
    """FLA 0.6's fla.ops.simple_gla.chunk_simple_gla on lajit's kernels: q, k [B, T, H, K],
    v [B, T, H, V]; g_gamma [H] (log decay, <= 0); scale default 1/√K; initial_state [N, H, K, V]
    (float32 used); cu_seqlens [N+1] with B = 1. Returns (o [B, T, H, V], final_state or None).
    Data-dependent g raises NotImplementedError."""
    s, scale = _fla_common("chunk_simple_gla", q, k, v, g, g_gamma, scale, initial_state,
                           cu_seqlens, dict(kwargs, cu_seqlens_cpu=cu_seqlens_cpu))
    return _fla_call(q, k, v, s, scale, initial_state, output_final_state, state_v_first,
                     cu_seqlens)


def fused_recurrent_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                               output_final_state=False, reverse=False, state_v_first=False,
                               cu_seqlens=None, **kwargs):
    """FLA 0.6's fla.ops.simple_gla.fused_recurrent_simple_gla on lajit's kernels (same
    arguments and results as chunk_simple_gla; lajit picks its recurrent or chunked kernel by
    shape). reverse=True raises NotImplementedError."""
    if reverse:
        raise NotImplementedError("lajit.fused_recurrent_simple_gla: reverse=True is not "
                                  "supported")
    if "transpose_state_layout" in kwargs:
        state_v_first = bool(kwargs.pop("transpose_state_layout")) or state_v_first
    s, scale = _fla_common("fused_recurrent_simple_gla", q, k, v, g, g_gamma, scale,
                           initial_state, cu_seqlens, kwargs)
    return _fla_call(q, k, v, s, scale, initial_state, output_final_state, state_v_first,
                     cu_seqlens)


# ---- Serving -----------------------------------------------------------------------------------

def fresh_slot(slot):
    """The slot index (LAJIT_SLOT_FRESH of lajit.h, −2 − slot) that starts a sequence from a
    zero state without reading its slot and writes its final state there: a new request's slot
    needs no zeroing. Works on ints and on int tensors."""
    return -2 - slot


def prefill(q, k, v, cu_seqlens, state_pool, state_slots, s=None, *, scale=1.0, state_vk=False):
    """Varlen prefill for serving: q, k [T, H, D], v [T, H, E] packed, cu_seqlens [nseq+1];
    state_pool [P, H, D, E] (float32, bfloat16 or float16 storage, fp32 accumulation) read as each
    sequence's initial state and overwritten with its final state, at state_slots[i] (int32
    [nseq]; −1: the sequence has no state; fresh_slot(s): a new request, started from zero and
    written to slot s with no memset). Returns o [T, H, E]."""
    return _ops.prefill_(q, k, v, _i32(cu_seqlens), state_pool, _i32(state_slots), _decay(s),
                         float(scale), bool(state_vk))


def decode(q, k, v, state_pool, state_slots=None, s=None, *, scale=1.0, out=None,
           state_vk=False):
    """One (q [B, H, D]) or T <= 8 (q [B, T, H, D]) decode steps per row, the state pool
    [P, H, D, E] (float32, bfloat16 or float16 storage, fp32 accumulation) updated in place at
    state_slots (int32 [B]; −1: row skipped, its output left as it was; fresh_slot(s): start from
    zero, write slot s; None: row b uses slot b). v [B, (T,) H, E]. Returns o (out when given,
    which may be 16-bit with float32 inputs or float32 with 16-bit inputs), shaped like v.
    Under torch.compile this is the custom op lajit::decode_; in eager mode it calls the
    C API directly (the lean path: no dispatcher, views refilled in place), which is what a
    serving loop or a CUDA graph capture wants. s must be float32, state_slots int32."""
    if _compiling():
        o = _ops.decode_(q, k, v, state_pool, state_slots, s, float(scale), bool(state_vk))
        if out is not None:
            out.copy_(o)
            return out
        return o
    if out is None:
        out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    return _ops.decode_into(out, q, k, v, state_pool, state_slots, s, scale, state_vk)


def bind_decode(q, k, v, state_pool, state_slots=None, s=None, *, scale=1.0, out=None,
                state_vk=False):
    """decode() bound to fixed buffers: returns a callable that runs one decode step on the
    buffers' current contents (writing out, updating the pool) and returns out. Everything but
    the C call is done once here, so this is the cheapest way to call lajit from Python in a
    serving loop; refill the buffers in place (q.copy_(...), slots.copy_(...)) between calls,
    and bind again if a buffer's shape or address changes. Eager mode and CUDA graph capture."""
    return _ops.DecodeBinding(q, k, v, state_pool, state_slots, s, scale=scale, out=out,
                              state_vk=state_vk)


# ---- Decay adapters ------------------------------------------------------------------------

def _as_tensor(values, device):
    return torch.tensor(values, dtype=torch.float32, device=device)


def decay_alibi(n_heads, layer=0, n_layers=1, device=None):
    """The ALiBi-style slopes of the MiniMax / TransNormerLLM code (lajit_decay_alibi), as a
    float32 [n_heads] tensor of s. With tensor parallelism pass the model's total head count and
    slice: a GPU holding heads h0 .. h0 + n - 1 uses decay_alibi(H, l, L)[h0:h0 + n] (called with
    its own n the slopes differ). MiniMax-Text-01: decay_alibi(64, l, 80) for layer l."""
    return _as_tensor(_native.library().decay("alibi", n_heads, layer, n_layers), device)


def decay_tnl(n_heads, layer=0, n_layers=1, device=None):
    """The TransNormerLLM paper's rates (lajit_decay_tnl; FLA's chunk_lightning_attn)."""
    return _as_tensor(_native.library().decay("tnl", n_heads, layer, n_layers), device)


def decay_from_log(log_lambda):
    """s = −log λ from a raw log-decay (FLA's g_gamma), through lajit_decay_from_log."""
    t = torch.as_tensor(log_lambda, dtype=torch.float32)
    out = _native.library().decay_from_log(t.detach().cpu().flatten().tolist())
    return torch.tensor(out, dtype=torch.float32, device=t.device).reshape(t.shape)


def g_gamma_from_decay(s):
    """FLA's g_gamma for lajit's s (g_gamma = −s)."""
    return -s


def launch(family, tensors, scalars=None, problem=None, dtype=None):
    """Launches a family that declares its own arguments (op "custom": an application's family
    on LAJIT_FAMILY_PATH, templates/README.md) on the current CUDA stream, through the C API's
    lajit_launch.

    tensors: {name: tensor or None} (None or absent: an optional tensor left out); outputs are
    written in place. scalars: {name: number}. problem: {symbol: int}, values of shape symbols
    (the others are taken from the tensors). dtype: "f32", "f16", "bf16" or a torch dtype (None:
    from the tensors). Eager only: not a registered torch op (its arguments are the family's), so
    torch.compile graph-breaks on it. A refused argument raises LajitArgumentError whose
    `argument` is the declared name the C message names."""
    from ._torch import _stream, fill
    lib = _native.library()
    N = _native
    items = [(k, t) for k, t in dict(tensors).items()]
    views = [N.View() for _ in items]
    targs = (N.TensorArg * max(1, len(items)))()
    device = -1  # a CUDA tensor's device (none: the C API refuses the host tensors)
    for i, (name, t) in enumerate(items):
        targs[i].name = name.encode()
        if t is not None:
            targs[i].tensor = fill(views[i], t)
            if t.is_cuda and device < 0:
                device = t.get_device()
    sitems = list(dict(scalars or {}).items())
    sargs = (N.ScalarArg * max(1, len(sitems)))()
    for i, (name, x) in enumerate(sitems):
        sargs[i].name = name.encode()
        sargs[i].value = float(x)
    pitems = list(dict(problem or {}).items())
    pargs = (N.IntArg * max(1, len(pitems)))()
    for i, (name, x) in enumerate(pitems):
        pargs[i].name = name.encode()
        pargs[i].value = int(x)
    if isinstance(dtype, torch.dtype):
        dtype = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}.get(dtype)
        if dtype is None:
            raise TypeError("lajit.launch: dtype must be float32, float16 or bfloat16")
    a = N.LaunchArgs(struct_size=N.ctypes.sizeof(N.LaunchArgs), family=family.encode(),
                     tensors=N.ctypes.addressof(targs), n_tensors=len(items),
                     scalars=N.ctypes.addressof(sargs), n_scalars=len(sitems),
                     problem=N.ctypes.addressof(pargs), n_problem=len(pitems),
                     dtype=dtype.encode() if dtype else None, stream=_stream(device))
    ctx = lib.ctx(max(device, 0))
    st = lib.lib.lajit_launch(ctx, N.ctypes.addressof(a))
    if st != 0:
        detail = lib.errmsg(ctx)
        try:
            lib.check("lajit_launch", ctx, st)
        except N.LajitError as e:
            # "<family>: <name> ..." or "...tensor <name> ...": the declared name it is about.
            words = re.split(r"[\s:'\",()]+", detail)
            given = set(dict(items)) | set(dict(sitems))
            named = [w for w in words[1:] if w in given]
            if named:
                e.argument = named[0]
            raise
