"""lajit — Lightning Attention kernels generated at run time, for PyTorch.

    import lajit
    o = lajit.lightning_attn(q, k, v, s)                  # [B, H, N, D], s [H] >= 0, σ = 1
    o, ht = lajit.chunk_simple_gla(q, k, v, g_gamma=-s)   # FLA 0.6's signature, [B, T, H, D]
    o = lajit.cp_lightning_attn(q_r, k_r, v_r, s)         # this rank's span of a sequence split
                                                          # over a torch.distributed group

The package is pure Python over ctypes: the C library (liblajit, with copies of the Lua and
SQLite libraries it links) and the `lajit` program travel inside it, and NVRTC comes from the
nvidia-cuda-nvrtc wheel (LAJIT_NVRTC_PATH overrides). Importing it registers the torch ops
torch.ops.lajit.{fwd, bwd, prefill_, decode_}; nothing touches the GPU before the first call."""
from ._native import LajitArgumentError, LajitError, find_wheel_nvrtc, library
from .api import (bind_decode, chunk_simple_gla, decay_alibi, decay_from_log, decay_tnl, decode,
                  fresh_slot, fused_recurrent_simple_gla, g_gamma_from_decay, launch,
                  lightning_attn, prefill)
from .cp import cp_lightning_attn
from .tools import LajitCliError, gen_bundle, tune
from . import _torch as ops  # noqa: F401  (registers the custom ops)

__version__ = "0.1.0"

__all__ = ["lightning_attn", "cp_lightning_attn", "chunk_simple_gla", "fused_recurrent_simple_gla",
           "prefill", "decode", "bind_decode", "fresh_slot", "decay_alibi", "decay_tnl", "decay_from_log",
           "g_gamma_from_decay", "launch", "tune", "gen_bundle", "LajitError", "LajitArgumentError",
           "LajitCliError",
           "version", "families", "expand", "set_bundle", "configure", "find_wheel_nvrtc"]


def version():
    """The loaded C library's version string (equal to __version__ in a consistent install)."""
    return library().version()


def families():
    """The names of the kernel families: the built-in ones, then those of LAJIT_FAMILY_PATH."""
    return library().family_names()


def expand(family, arch=None, **assignments):
    """The CUDA source lajit generates for `family` with the given KEY=VALUE assignments (no
    GPU needed): lajit.expand("la_fwd", dtype="bf16", D=128)."""
    return library().expand(family, assignments, arch)


def configure(*, checked=None, no_disk_cache=None, cache_dir=None, bundle=None, families=None):
    """Options of the contexts created from now on (per thread and device, on first use):
    checked mode (validates device-side values, synchronises), memory-only cache, the cache
    directory, an offline bundle, folders of families of your own (':'-separated, as
    LAJIT_FAMILY_PATH; see lajit.launch). Contexts already created keep their options."""
    lib = library()
    from . import _native as N
    if checked is not None:
        lib.ctx_flags = ((lib.ctx_flags | N.CTX_CHECKED) if checked
                         else (lib.ctx_flags & ~N.CTX_CHECKED))
    if no_disk_cache is not None:
        lib.ctx_flags = ((lib.ctx_flags | N.CTX_NO_DISK_CACHE) if no_disk_cache
                         else (lib.ctx_flags & ~N.CTX_NO_DISK_CACHE))
    if cache_dir is not None:
        lib.ctx_cache_dir = cache_dir
    if bundle is not None:
        lib.ctx_bundle = bundle
    if families is not None:
        lib.ctx_families = families


def set_bundle(path):
    """Contexts created from now on take kernels from the bundle at `path` (see gen_bundle)."""
    configure(bundle=path)
