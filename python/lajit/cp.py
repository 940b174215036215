"""cp — context parallelism in PyTorch: one sequence's tokens split over the ranks of a
torch.distributed process group, as an autograd function (cp_lightning_attn).

Rank r of a group of P holds the contiguous span of tokens a_r + 1 .. a_r + n_r of every sequence
of a [B, H, N, D] batch (a_0 = 0, a_{r+1} = a_r + n_r; n_r may differ per rank, even be 0), and
every rank makes the same call on its own span. The mathematics and the steps are those of the C
API's lajit_cp_attn_fwd / lajit_cp_attn_bwd (include/lajit.h), built here from the package's
ops and torch.distributed collectives, since torch does not hand out its ncclComm_t:

Forward, per rank:
  (a) the span's local state M_r (lajit_attn_fwd with no outputs; rank 0 with S_0 gives
      λ^{n_0} S_0 + M_0), written into a slot of an exchange buffer with n_r beside it;
  (b) one all_gather_into_tensor of the slots (states and lengths in one message);
  (c) lajit_attn_state_scan over the P gathered slots: S_in,r, the state entering span r (rank
      0: S_0), and S_N;
  (d) lajit_attn_fwd over the span from S_in,r: the span's exact outputs.
S_in,r (one fp32 state) is saved for the backward, which so needs no second forward exchange.

Backward, per rank:
  (a) the span's gradient state Mg_r = the d_initial_state of lajit_attn_bwd over the span with
      no d_final_state, computed alone (dq, dk, dv NULL: the reversed walk over q and dO); the
      last rank with dS_N exchanges its dS_0 of (dS_N, span) instead;
  (b) one all_gather of [Mg_r, n_r] and the reverse scan (LAJIT_SCAN_REVERSE): H_r, the
      gradient reaching the span's last state from every later token (the last rank: dS_N);
  (c) lajit_attn_bwd over the span from S_in,r with d_final_state H_r: dq, dk, dv, the span's
      part of ds and (rank 0) dS_0;
  (d) ds: the P parts all-gathered and summed in one fixed order on every rank, so every rank
      holds the same bits (an all_reduce would not promise that).

Every call runs on torch.cuda.current_stream() with no host synchronisation, except the optional
argument check (check_ranks, one small all-gather read on the host). Works on any backend with
all_gather_into_tensor: NCCL for ranks on their own GPUs; gloo (slower, through host memory)
where ranks share a GPU, as the tests do."""
import math

import torch
import torch.distributed as dist

from . import _torch as _ops

# A state slot is padded to 16 bytes (4 floats), then 4 floats hold n_r as an int64 (and 8 bytes
# of padding), so one all-gather of floats moves states and lengths together, the gathered
# states are a [P, B, H, D, E] view whose span stride is a multiple of 16 bytes (the scan's
# alignment rule), and the lengths an int64 [P] view beside them.
_LEN_FLOATS = 4


def _round4(n):
    return (n + 3) & ~3


def _gather(x, group, P):
    """Every rank's contiguous x, concatenated in rank order: a [P, *x.shape] tensor. (The
    concatenated form of all_gather_into_tensor: the stacked one is NCCL's only.)"""
    out = torch.empty((P * x.numel(),), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.reshape(-1), group=group)
    return out.view((P,) + tuple(x.shape))


def _slot(shape, device):
    """A fresh exchange slot (state, padding, length): (the slot, its float32 state of `shape`)."""
    numel = math.prod(shape)
    buf = torch.empty((_round4(numel) + _LEN_FLOATS,), dtype=torch.float32, device=device)
    return buf, buf[:numel].view(shape)


def _exchange(buf, shape, n, group, P):
    """(b): n written beside the state in slot `buf`, then every rank's slot gathered: returns
    the [P, *shape] float32 states and the int64 [P] lengths (strided views of one buffer)."""
    numel = math.prod(shape)
    off = _round4(numel)
    buf[off:].view(torch.int64).fill_(n)
    g = _gather(buf, group, P)
    return g[:, :numel].view((P,) + tuple(shape)), g[:, off:].view(torch.int64)[:, 0]


def _sum_fixed_order(parts):
    """parts [P, H] summed as a fixed tree (part j plus part j + ⌊P/2⌋, halving; an odd last
    part carried): ⌈log2 P⌉ launches, and the same bits on every rank that runs it on the same
    values."""
    while parts.shape[0] > 1:
        h = parts.shape[0] // 2
        head = parts[:h] + parts[h:2 * h]
        parts = torch.cat([head, parts[2 * h:]]) if parts.shape[0] % 2 else head
    return parts[0]


def _group_place(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("lajit.cp_lightning_attn: torch.distributed is not initialised; call "
                           "torch.distributed.init_process_group first (every rank of the group "
                           "makes the call on its own span)")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("lajit.cp_lightning_attn: this process is not a member of `group`")
    return rank, dist.get_world_size(group)


def _local_problem(q, k, v, s, initial_state, scale, head_first, state_vk):
    """(error text or None, (B, H, n, D, E)) of this rank's arguments, checked without touching
    the device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            what = f"{t.dim()}-D" if isinstance(t, torch.Tensor) else type(t).__name__
            layout = "[B, H, n, D]" if head_first else "[B, n, H, D]"
            return f"{name} is {what}; expected {layout} (this rank's span)", None
    qb, kb, vb = (_ops._bhnd(t, head_first) for t in (q, k, v))
    B, H, n, D = qb.shape
    E = vb.shape[-1]
    if tuple(kb.shape) != (B, H, n, D):
        return f"k {tuple(k.shape)} differs from q {tuple(q.shape)}", None
    if tuple(vb.shape[:3]) != (B, H, n):
        return f"v {tuple(v.shape)} disagrees with q {tuple(q.shape)} in B, H or n", None
    if min(B, H, D, E) < 1:
        return f"q {tuple(q.shape)}, v {tuple(v.shape)}: B, H, D and E must be at least 1", None
    if s is not None and tuple(s.shape) != (H,):
        return f"s is {tuple(s.shape)}; expected [H] = [{H}]", None
    want = (B, H, E, D) if state_vk else (B, H, D, E)
    if initial_state is not None and tuple(initial_state.shape) != want:
        return (f"initial_state is {tuple(initial_state.shape)}; expected {list(want)}"
                + (" (state_vk: [B, H, E, D])" if state_vk else "")), None
    if not math.isfinite(scale) or scale == 0:
        return f"scale is {scale}; it must be finite and nonzero", None
    return None, (B, H, n, D, E)


_AGREE = ("B", "H", "D", "E", "whether s is given", "whether s requires grad", "state_vk",
          "scale", "s (its sum)", "s (its weighted sum)")


def _agree(group, P, error, dims, s, scale, state_vk, device):
    """The optional check (check_ranks): one all-gather of a small float64 descriptor of every
    rank's call, read on the host, so that arguments refused on one rank, or sizes and options
    the ranks disagree about, raise the same ValueError on every rank instead of a hang or a
    silently wrong result."""
    B, H, _, D, E = dims if dims else (0, 0, 0, 0, 0)
    host = [0.0 if error else 1.0, B, H, D, E, s is not None,
            s is not None and s.requires_grad, bool(state_vk), float(scale)]
    meta = torch.tensor(host, dtype=torch.float64, device=device)
    if s is not None and not error:
        s64 = s.detach().double()
        w = torch.arange(1, s64.numel() + 1, dtype=torch.float64, device=s64.device)
        meta = torch.cat([meta, torch.stack([s64.sum(), (s64 * w).sum()]).to(device)])
    else:
        meta = torch.cat([meta, meta.new_zeros(2)])
    rows = _gather(meta, group, P).tolist()
    refused = [j for j, row in enumerate(rows) if row[0] != 1.0]
    if refused:
        mine = f": {error}" if error else ""
        raise ValueError(f"lajit.cp_lightning_attn: rank(s) {refused} of the group refused "
                         f"their arguments{mine}")
    for i, name in enumerate(_AGREE, start=1):
        vals = [row[i] for row in rows]
        same = all(x == vals[0] or (x != x and vals[0] != vals[0]) for x in vals)
        if not same:
            raise ValueError(f"lajit.cp_lightning_attn: the ranks disagree about {name}: "
                             f"{vals} (rank order); every rank must pass the same B, H, D, E, s, "
                             "scale and state_vk")


class _CPAttn(torch.autograd.Function):
    """The forward and backward above; inputs q, k, v (this rank's span), s (float32 or None),
    initial_state (float32 or None; read by rank 0 only)."""

    @staticmethod
    def forward(ctx, q, k, v, s, initial_state, scale, group, rank, P, dims,
                output_final_state, head_first, state_vk):
        B, H, n, D, E = dims
        shape = (B, H, E, D) if state_vk else (B, H, D, E)
        h0 = initial_state if rank == 0 else None
        # (a) the span's local state (rank 0 from S_0) into this rank's slot.
        slot, m = _slot(shape, v.device)
        if n > 0:
            _ops.fwd_state_into(m, k, v, s, scale, h0, head_first, state_vk)
        elif h0 is not None:
            m.copy_(h0)  # an empty span passes S_0 on
        else:
            m.zero_()
        # (b) the exchange, (c) the scan: the state entering this span, and S_N.
        states, lengths = _exchange(slot, shape, n, group, P)
        final = torch.empty(shape, dtype=torch.float32, device=v.device) \
            if output_final_state else None
        s_in = h0
        if rank > 0 or final is not None:
            incoming = torch.empty((P,) + shape, dtype=torch.float32, device=v.device)
            _ops.state_scan_into(incoming, final, states, lengths, s, None, False, state_vk)
            if rank > 0:
                s_in = incoming[rank].clone()  # saved: not the P states it is a view of
        # (d) the span's outputs.
        if n > 0:
            o, _ = _ops.fwd(q, k, v, s, scale, s_in, None, None, False, head_first, state_vk)
        else:
            o = v.new_empty(v.shape)
        ctx.save_for_backward(q, k, v, s, s_in)
        ctx.scale, ctx.group, ctx.rank, ctx.P, ctx.dims = scale, group, rank, P, dims
        ctx.head_first, ctx.state_vk = head_first, state_vk
        ctx.output_final_state = output_final_state
        ctx.h0_meta = None if initial_state is None else (initial_state.shape,
                                                          initial_state.dtype,
                                                          initial_state.device)
        ctx.set_materialize_grads(False)
        if final is None:
            final = v.new_empty(0, dtype=torch.float32)
            ctx.mark_non_differentiable(final)
        return o, final

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, dfinal):
        q, k, v, s, s_in = ctx.saved_tensors
        rank, P, group, scale = ctx.rank, ctx.P, ctx.group, ctx.scale
        B, H, n, D, E = ctx.dims
        hf, vk = ctx.head_first, ctx.state_vk
        shape = (B, H, E, D) if vk else (B, H, D, E)
        if do is None:
            do = torch.zeros_like(v)
        last = rank == P - 1
        # dS_N: the last rank's only (every rank holds the same S_N; see cp_lightning_attn).
        dsn = dfinal if (last and ctx.output_final_state and dfinal is not None) else None
        if dsn is not None and dsn.dtype != torch.float32:
            dsn = dsn.float()
        want_ds = s is not None and ctx.needs_input_grad[3]
        want_dh0 = rank == 0 and ctx.h0_meta is not None and ctx.needs_input_grad[4]
        # (a) the span's gradient state (the last rank: its dS_0 of (dS_N, span)).
        slot, mg = _slot(shape, v.device)
        if n > 0:
            _ops.bwd_d_initial_into(mg, q, do, s, scale, dsn, hf, vk)
        elif dsn is not None:
            mg.copy_(dsn)
        else:
            mg.zero_()
        # (b) the exchange and the reverse scan: the gradient reaching this span's last state.
        states, lengths = _exchange(slot, shape, n, group, P)
        if last:
            h_r = dsn
        else:
            incoming = torch.empty((P,) + shape, dtype=torch.float32, device=v.device)
            _ops.state_scan_into(incoming, None, states, lengths, s, None, True, vk)
            h_r = incoming[rank]
        # (c) the span's gradients from its incoming state and H_r.
        dh0 = None
        if n > 0:
            dq, dk, dv, ds_part, dh0 = _ops.bwd(q, k, v, do, s, scale, s_in, h_r, None, None,
                                                want_ds, want_dh0, hf, vk)
            if not want_ds:
                ds_part = None
        else:
            dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
            ds_part = torch.zeros_like(s) if want_ds else None
            if want_dh0:  # an empty span passes the gradient on: dS_0 = H_0
                dh0 = h_r.clone() if h_r is not None else torch.zeros(shape, device=v.device)
        # (d) ds over the whole sequence: every rank's part, summed in one fixed order.
        ds = _sum_fixed_order(_gather(ds_part.contiguous(), group, P)) if want_ds else None
        d_initial = None
        if ctx.needs_input_grad[4] and ctx.h0_meta is not None:
            shp, dtype, device = ctx.h0_meta
            # The other ranks' spans do not read S_0: their part of its gradient is zero.
            d_initial = dh0 if rank == 0 else torch.zeros(shp, dtype=dtype, device=device)
        return (dq, dk, dv, ds, d_initial, None, None, None, None, None, None, None, None)


def _cp_lightning_attn(q, k, v, s=None, *, group=None, scale=1.0, initial_state=None,
                       output_final_state=False, head_first=True, state_vk=False,
                       check_ranks=True):
    rank, P = _group_place(group)
    scale = float(scale)
    s = None if s is None else (s if s.dtype == torch.float32 else s.float())
    if initial_state is not None and initial_state.dtype != torch.float32:
        initial_state = initial_state.float()  # the exchange and the scan carry fp32 states
    error, dims = _local_problem(q, k, v, s, initial_state, scale, head_first, state_vk)
    if check_ranks:
        device = v.device if isinstance(v, torch.Tensor) else torch.device("cpu")
        _agree(group, P, error, dims, s, scale, state_vk, device)
    elif error:
        raise ValueError(f"lajit.cp_lightning_attn: {error}")
    o, final = _CPAttn.apply(q, k, v, s, initial_state, scale, group, rank, P, dims,
                             bool(output_final_state), bool(head_first), bool(state_vk))
    return (o, final) if output_final_state else o


def cp_lightning_attn(q, k, v, s=None, *, group=None, scale=1.0, initial_state=None,
                      output_final_state=False, head_first=True, state_vk=False,
                      check_ranks=True):
    """Lightning attention over a sequence split between the ranks of a torch.distributed
    process group (context parallelism); lightning_attn's conventions otherwise.

    Every rank of `group` (None: the default group) makes the same call, at the same point,
    with its own span: q, k [B, H, n_r, D] and v [B, H, n_r, E] (head_first=False: [B, n_r, H,
    D]) hold tokens a_r + 1 .. a_r + n_r of every sequence, rank order being the group's
    (dist.get_rank(group)); n_r may differ between ranks and may be 0. B, H, D, E, s, scale and
    state_vk must be the same on every rank. s: the decay rate [H] (>= 0; None: no decay),
    learnable. initial_state: S_0, [B, H, D, E] ([.., E, D] with state_vk), used as float32,
    read by rank 0 only (every rank may pass the same list of arguments). Float32, float16 or
    bfloat16 inputs on one CUDA device per rank, as lightning_attn takes them.

    Returns this rank's o (shaped like v), or (o, S_N) with output_final_state; S_N is the
    whole sequence's final state, the same on every rank.

    Gradients (autograd; the backward is collective too: every rank's output must reach the
    loss, and every rank runs backward): dq, dk, dv of this rank's span; ds of the whole
    sequence, identical bits on every rank (so summing it again over the group, as a gradient
    all-reduce over these ranks would, counts it P times); the gradient of initial_state, dS_0,
    on rank 0 and zero on the others (their spans do not read it); the gradient arriving at S_N
    is taken from the last rank only (the others' are ignored: make the last rank's loss the one
    that uses S_N, or give every rank the same).

    check_ranks=True (the default) first all-gathers a small descriptor of every rank's call
    and reads it on the host (one host synchronisation): arguments refused on one rank (shapes,
    scale), and B, H, D, E, s, scale or state_vk differing between ranks, then raise the same
    ValueError on every rank. Not checked: that every rank calls (a missing rank is a hang, as
    with any collective), dtypes (they may differ between ranks). With check_ranks=False
    nothing synchronises, a local refusal raises on its rank only (the others wait in the
    exchange: treat it as fatal to the group), and disagreeing ranks are undefined.

    Traffic: one all-gather in the forward (each rank sends its state and length, B·H·D·E·4 +
    16 bytes, and receives the P − 1 others'), two in the backward (the gradient states, and
    ds's P·H floats). Under torch.compile the call is a graph break, run eagerly (collectives
    and ctypes calls are not traced). Not twice differentiable."""
    global _eager
    if _eager is None:
        _eager = _not_traced(_cp_lightning_attn)
    return _eager(q, k, v, s, group=group, scale=scale, initial_state=initial_state,
                  output_final_state=output_final_state, head_first=head_first,
                  state_vk=state_vk, check_ranks=check_ranks)


_eager = None


def _not_traced(fn):
    """fn behind torch.compiler.disable: under torch.compile the call is a graph break, run
    eagerly (collectives and ctypes calls cannot be traced). Applied on the first call, not at
    import: it imports torch._dynamo (about a second), which lajit's import otherwise avoids."""
    try:
        return torch.compiler.disable(fn)
    except AttributeError:  # torch < 2.1
        return fn
