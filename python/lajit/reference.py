"""reference — the lightning-attention recurrence in plain PyTorch, for checking the kernels:
run on float64 tensors it is the reference DESIGN.md's tolerances are measured against (the GPU
tests, examples/pytorch/train_tiny.py). Autograd through it gives the reference gradients.

Needs only torch: it imports nothing from the rest of the package and never loads liblajit, so
the example can load this one file from a source tree where the package is not installed."""
import torch


def recurrence(q, k, v, s, scale, h0=None):
    """[B, H, N, D] q, k and [B, H, N, E] v, in their own dtype (float64 for a reference):
    o_t = σ q_t S_t, S_t = λ S_{t−1} + k_tᵀ v_t with λ = exp(−s) per head (1 when s is None)
    and S_0 = h0 (zeros when None). Returns (o [B, H, N, E], S_N [B, H, D, E])."""
    B, H, N, D = q.shape
    lam = torch.exp(-s).view(1, H, 1, 1) if s is not None else q.new_ones(1, H, 1, 1)
    S = h0.clone() if h0 is not None else q.new_zeros(B, H, D, v.shape[-1])
    out = []
    for t in range(N):
        S = lam * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        out.append(scale * torch.einsum("bhd,bhde->bhe", q[:, :, t], S))
    return torch.stack(out, 2), S


def ds_bound(q, k, v, do, s, scale):
    """λ Σ_t ‖G_t‖·‖S_{t−1}‖ per head, summed over the batch, for output gradient do: the scale
    of DESIGN.md's ds tolerance (|Δds_h| <= tol · bound_h), since ds sums that many products."""
    B, H, N, D = q.shape
    lam = torch.exp(-s).view(1, H, 1, 1)
    states = [q.new_zeros(B, H, D, v.shape[-1])]
    for t in range(N):
        states.append(lam * states[-1] + k[:, :, t, :, None] * v[:, :, t, None, :])
    G = torch.zeros_like(states[0])
    bound = torch.zeros(H, dtype=q.dtype, device=q.device)
    for t in range(N - 1, -1, -1):
        G = (lam * G if t < N - 1 else G) + scale * q[:, :, t, :, None] * do[:, :, t, None, :]
        bound += (G.flatten(2).norm(dim=2) * states[t].flatten(2).norm(dim=2)).sum(0)
    return torch.exp(-s) * bound
