"""train_tiny.py — lajit inside a PyTorch training loop.

1. Gradients of lightning_attention (bf16) against float64 autograd of the recurrence itself
   (DESIGN.md's tolerances: relative L2 <= 6e-3 for dq, dk, dv; ds within
   6e-3 * λ Σ_t ||G_t|| ||S_{t-1}||).
2. The same gradients against FLA's chunk_simple_gla (g_gamma = -s), when FLA is installed.
3. A tiny linear-attention layer with a learnable decay trained for a few hundred steps to
   imitate a fixed teacher; the loss must fall and stay finite.
Exits 1 when a check fails. Needs the lajit package (pip install . from the checkout; see the
README's "Python package"): python3 train_tiny.py"""
import math
import sys

import torch

import lajit
from lajit.reference import ds_bound, recurrence


def lightning_attention(q, k, v, s=None, scale=1.0):
    return lajit.lightning_attn(q, k, v, s, scale=scale)


print(f"lajit package {lajit.version()} from {lajit.__file__}")
torch.manual_seed(0)
dev = torch.device("cuda")
failures = []


def rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# ---- 1 and 2: gradients ------------------------------------------------------------------
B, H, N, D = 2, 4, 200, 64
scale = 1 / math.sqrt(D)
q, k, v, do = [(torch.randn(B, H, N, D, device=dev) * 0.5).bfloat16() for _ in range(4)]
s = torch.tensor([0.0, 0.05, 0.3, 1.0], device=dev)

leaves = [x.clone().requires_grad_() for x in (q, k, v)]
s_l = s.clone().requires_grad_()
o = lightning_attention(*leaves, s_l, scale)
o.backward(do)
got = [x.grad for x in leaves] + [s_l.grad]

ref_leaves = [x.double().requires_grad_() for x in (q, k, v)]
s_r = s.double().requires_grad_()
o_ref, _ = recurrence(*ref_leaves, s_r, scale)
o_ref.backward(do.double())
ref = [x.grad for x in ref_leaves] + [s_r.grad]
bound = ds_bound(q.double(), k.double(), v.double(), do.double(), s.double(), scale)

print(f"o   rel L2 vs float64 {rel_l2(o, o_ref):.2e}")
for name, g, r in zip(("dq", "dk", "dv"), got, ref):
    e = rel_l2(g, r)
    print(f"{name}  rel L2 vs float64 {e:.2e}")
    if not (e <= 6e-3) or not torch.isfinite(g).all():
        failures.append(f"{name} rel L2 {e:.2e} > 6e-3")
err_ds = (got[3].double() - ref[3]).abs()
print("ds  lajit", [f"{x:.6g}" for x in got[3].tolist()], "float64", [f"{x:.6g}" for x in ref[3].tolist()],
      f"max |err|/bound {(err_ds / bound).max().item():.2e}")
if not torch.all(err_ds <= 6e-3 * bound) or not torch.isfinite(got[3]).all():
    failures.append("ds outside 6e-3 x its normwise bound")

try:
    from fla.ops.simple_gla import chunk_simple_gla
    fl = [x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)]
    o_fla, _ = chunk_simple_gla(*fl, g_gamma=-s, scale=scale)
    o_fla.backward(do.transpose(1, 2).contiguous())
    for name, g, f in zip(("dq", "dk", "dv"), got, fl):
        e = rel_l2(g, f.grad.transpose(1, 2))
        print(f"{name}  rel L2 vs FLA {e:.2e}")
        if not (e <= 1e-2):
            failures.append(f"{name} differs from FLA by {e:.2e}")
except ImportError as exc:
    print(f"FLA not installed ({exc}): comparison skipped")


# ---- 3: training --------------------------------------------------------------------------
class Layer(torch.nn.Module):
    def __init__(self, C, H, D, s_init):
        super().__init__()
        self.H, self.D = H, D
        self.qkv = torch.nn.Linear(C, 3 * H * D, bias=False)
        self.out = torch.nn.Linear(H * D, C, bias=False)
        self.raw_s = torch.nn.Parameter(torch.log(torch.expm1(s_init)))  # s = softplus(raw) >= 0

    def forward(self, x):
        Bx, Nx, _ = x.shape
        q, k, v = self.qkv(x).view(Bx, Nx, 3, self.H, self.D).permute(2, 0, 3, 1, 4).bfloat16()
        s = torch.nn.functional.softplus(self.raw_s)
        o = lightning_attention(q, k, v, s, 1 / math.sqrt(self.D))
        return self.out(o.float().transpose(1, 2).reshape(Bx, Nx, self.H * self.D))


C, Ht, Dt = 64, 4, 16
teacher = Layer(C, Ht, Dt, torch.tensor([0.02, 0.1, 0.4, 1.5])).to(dev)
student = Layer(C, Ht, Dt, torch.tensor([0.5, 0.5, 0.5, 0.5])).to(dev)
opt = torch.optim.Adam(student.parameters(), lr=1e-2)
losses = []
for step in range(300):
    x = torch.randn(8, 256, C, device=dev)
    with torch.no_grad():
        y = teacher(x)
    loss = torch.nn.functional.mse_loss(student(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
print(f"training: loss {losses[0]:.4f} -> {losses[-1]:.4f} after {len(losses)} steps; learned s "
      f"{[round(x, 3) for x in torch.nn.functional.softplus(student.raw_s).tolist()]}")
if not all(math.isfinite(l) for l in losses) or not losses[-1] < 0.5 * losses[0]:
    failures.append(f"training did not converge: {losses[0]:.4f} -> {losses[-1]:.4f}")

print("FAILED: " + "; ".join(failures) if failures else "OK")
sys.exit(1 if failures else 0)
