"""Writes ref_small.txt: inputs and the outputs of ../shared/reference/la_reference.py (the
executable specification of DESIGN.md) for one small case, so tests/cpu/reference.c can check
the C reference against it without Python. Run from the repository root:
    python3 tests/data/make_ref_data.py ../shared/reference > tests/data/ref_small.txt"""
import sys

import numpy as np

sys.path.insert(0, sys.argv[1])
import la_reference as ref  # noqa: E402

rng = np.random.default_rng(0)
N, D, E, s, sigma = 9, 6, 4, 0.3, 0.7
q, k, v = rng.standard_normal((N, D)), rng.standard_normal((N, D)), rng.standard_normal((N, E))
S0, dO, dSN = rng.standard_normal((D, E)), rng.standard_normal((N, E)), rng.standard_normal((D, E))
o, SN, _ = ref.forward(q, k, v, s, sigma, S0)
dq, dk, dv, dS0, ds = ref.backward(q, k, v, dO, s, sigma, S0, dSN)
print(f"N {N} D {D} E {E} s {s!r} sigma {sigma!r}")
for name, a in [("q", q), ("k", k), ("v", v), ("S0", S0), ("dO", dO), ("dSN", dSN), ("o", o),
                ("SN", SN), ("dq", dq), ("dk", dk), ("dv", dv), ("dS0", dS0), ("ds", np.array([ds]))]:
    flat = np.asarray(a, dtype=np.float64).ravel()
    print(name, flat.size, " ".join(repr(float(x)) for x in flat))
