"""_native — liblajit through ctypes: loading, the C structs, DLTensor views, contexts, errors.

Nothing here imports torch: the module describes tensors to the C API from plain numbers
(pointer, shape, strides, dtype, device), so the package's C-side plumbing can be exercised on a
machine with no GPU. The torch layer (_torch.py) turns tensors into those numbers.

Zero copy without DLPack capsules: a DLTensor is a plain C struct (pointer, device, ndim, dtype,
shape, strides, offset); we fill one directly from the tensor's data_ptr/sizes/strides instead of
asking torch for a capsule and unwrapping it, which costs an allocation and a deleter per call.
The tensors stay owned by the caller for the duration of the (asynchronous) call, as with any
CUDA op on the current stream."""
import ctypes
import importlib.util
import os
import sys
import threading

_HERE = os.path.dirname(os.path.abspath(__file__))

# ---- DLPack (dlpack.h, v0.8+ layout of DLTensor, unchanged since) --------------------------

K_DL_CUDA = 2
K_DL_CPU = 1
DL_INT, DL_UINT, DL_FLOAT, DL_BFLOAT = 0, 1, 2, 4

MAX_DIMS = 6


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class View:
    """One DLTensor with its own shape/stride storage, refillable in place (no allocation)."""

    __slots__ = ("dl", "shape", "strides", "ptr", "key")

    def __init__(self):
        self.dl = DLTensor()
        self.shape = (ctypes.c_int64 * MAX_DIMS)()
        self.strides = (ctypes.c_int64 * MAX_DIMS)()
        self.dl.shape = self.shape
        self.dl.strides = self.strides
        self.dl.dtype.lanes = 1
        self.ptr = ctypes.addressof(self.dl)
        self.key = None  # what the shape/stride/dtype/device fields describe (fast refill)

    def fill(self, data, shape, strides, code, bits, device_type=K_DL_CUDA, device_id=0):
        n = len(shape)
        if n > MAX_DIMS:
            raise ValueError(f"tensor of {n} dimensions: lajit takes at most {MAX_DIMS}")
        dl = self.dl
        dl.data = data
        dl.device.device_type = device_type
        dl.device.device_id = device_id
        dl.ndim = n
        dl.dtype.code = code
        dl.dtype.bits = bits
        for i in range(n):
            self.shape[i] = shape[i]
            self.strides[i] = strides[i]
        self.key = None
        return self.ptr


# ---- Argument structs (include/lajit.h; struct_size lets the library check the layout) -------

_P = ctypes.c_void_p


class FwdArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("q", _P), ("k", _P), ("v", _P), ("o", _P),
                ("s", _P), ("scale", ctypes.c_float), ("initial_state", _P),
                ("final_state", _P), ("cu_seqlens", _P), ("state_slots", _P),
                ("flags", ctypes.c_uint32), ("family", ctypes.c_char_p), ("stream", _P)]


class BwdArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("q", _P), ("k", _P), ("v", _P), ("dout", _P),
                ("dq", _P), ("dk", _P), ("dv", _P), ("s", _P), ("ds", _P),
                ("scale", ctypes.c_float), ("initial_state", _P), ("d_initial_state", _P),
                ("d_final_state", _P), ("cu_seqlens", _P), ("state_slots", _P),
                ("workspace", _P), ("flags", ctypes.c_uint32), ("family", ctypes.c_char_p),
                ("stream", _P)]


class DecodeArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("q", _P), ("k", _P), ("v", _P), ("o", _P),
                ("s", _P), ("scale", ctypes.c_float), ("state", _P), ("state_slots", _P),
                ("step_states", _P), ("flags", ctypes.c_uint32), ("family", ctypes.c_char_p),
                ("stream", _P)]


class StateScanArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("local_states", _P), ("lengths", _P),
                ("s", _P), ("initial_state", _P), ("incoming_states", _P), ("final_state", _P),
                ("flags", ctypes.c_uint32), ("family", ctypes.c_char_p), ("stream", _P)]


class TensorArg(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("tensor", _P)]


class ScalarArg(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_double)]


class IntArg(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_int64)]


class LaunchArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("family", ctypes.c_char_p),
                ("tensors", _P), ("n_tensors", ctypes.c_size_t),
                ("scalars", _P), ("n_scalars", ctypes.c_size_t),
                ("problem", _P), ("n_problem", ctypes.c_size_t),
                ("dtype", ctypes.c_char_p), ("stream", _P)]


class CtxDesc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("device", ctypes.c_int), ("alloc", _P),
                ("alloc_user", _P), ("log", _P), ("log_user", _P), ("log_level", ctypes.c_int),
                ("cache_dir", ctypes.c_char_p), ("flags", ctypes.c_uint32),
                ("autotune", ctypes.c_uint32), ("bundle", ctypes.c_char_p)]


STATE_VK = 0x1
SCAN_REVERSE = 0x2  # lajit_attn_state_scan: walk the spans from the last (gradient states)
CTX_NO_DISK_CACHE, CTX_CHECKED, CTX_NO_DEVICE = 0x1, 0x2, 0x4

STATUS_NAMES = {
    0: "ok", 1: "invalid argument", 2: "out of memory", 3: "no driver", 4: "no device",
    5: "driver", 6: "no compiler", 7: "compile", 8: "template", 9: "limit", 10: "unsupported",
    11: "io", 12: "cache", 13: "database", 14: "struct size", 15: "check failed",
    16: "not found", 17: "internal"}

# Names the C API gives its tensors in messages ("k is ...", "state_slots: ...").
_ARG_NAMES = ("q", "k", "v", "o", "s", "ds", "dout", "dq", "dk", "dv", "initial_state",
              "final_state", "d_initial_state", "d_final_state", "cu_seqlens", "state_slots",
              "state", "step_states", "workspace", "scale", "family", "flags",
              "local_states", "lengths", "incoming_states")


class LajitError(RuntimeError):
    """A lajit call failed. status: the lajit_status value; status_name: its text; detail:
    lajit_errmsg; argument: the argument the message names, when it names one."""

    def __init__(self, function, status, detail):
        self.function = function
        self.status = status
        self.status_name = STATUS_NAMES.get(status, f"status {status}")
        self.detail = detail
        self.argument = _named_argument(detail)
        where = f" (argument '{self.argument}')" if self.argument else ""
        super().__init__(f"{function}: {self.status_name}{where}: {detail}")


class LajitArgumentError(LajitError, ValueError):
    """LAJIT_ERR_INVALID_ARGUMENT: a tensor or option the C API refused (also a ValueError)."""


def _named_argument(detail):
    head = detail.lstrip()
    for sep in (" ", ":", ",", "["):
        head = head.split(sep, 1)[0]
    return head if head in _ARG_NAMES else None


def raise_status(function, status, detail):
    cls = LajitArgumentError if status == 1 else LajitError
    raise cls(function, status, detail)


# ---- Finding the library and NVRTC ----------------------------------------------------------

def library_path():
    """LAJIT_LIBRARY when set, else the copy inside the package (the wheel's _lib/)."""
    env = os.environ.get("LAJIT_LIBRARY")
    if env:
        return env
    return os.path.join(_HERE, "_lib", "liblajit.so.0")


def cli_path():
    """LAJIT_CLI when set, else the `lajit` program inside the package (the wheel's _bin/)."""
    return os.environ.get("LAJIT_CLI") or os.path.join(_HERE, "_bin", "lajit")


# Where the NVIDIA wheels put NVRTC (site-packages/nvidia/...): CUDA 13's nvidia-cuda-nvrtc,
# then CUDA 12's nvidia-cuda-nvrtc-cu12.
_NVRTC_IN_WHEELS = ("cu13/lib/libnvrtc.so.13", "cuda_nvrtc/lib/libnvrtc.so.13",
                    "cuda_nvrtc/lib/libnvrtc.so.12")


def find_wheel_nvrtc():
    """The path of libnvrtc from an installed nvidia-cuda-nvrtc wheel, or None. Looks in every
    sys.path entry's nvidia/ (in path order), then wherever the `nvidia` package resolves: some
    NVIDIA wheels make `nvidia` a namespace package, older ones a regular one."""
    bases = [os.path.join(p, "nvidia") for p in sys.path if isinstance(p, str) and p]
    try:
        spec = importlib.util.find_spec("nvidia")
        bases += list(spec.submodule_search_locations or []) if spec else []
    except (ImportError, ValueError):
        pass
    for base in bases:
        for rel in _NVRTC_IN_WHEELS:
            path = os.path.join(base, rel)
            if os.path.isfile(path):
                return os.path.abspath(path)
    return None


def configure_nvrtc():
    """liblajit reads LAJIT_NVRTC_PATH at its first compile: point it at the wheel's NVRTC unless
    the user set it (theirs wins) or no wheel is installed (then the library's own search of the
    usual sonames applies). Returns the path in effect, or None."""
    if os.environ.get("LAJIT_NVRTC_PATH"):
        return os.environ["LAJIT_NVRTC_PATH"]
    path = find_wheel_nvrtc()
    if path:
        os.environ["LAJIT_NVRTC_PATH"] = path
    return path


# ---- The library ------------------------------------------------------------------------------

class Library:
    """liblajit with its prototypes declared, and one context per (thread, device): a context is
    used by one thread at a time, and PyTorch runs backward passes on its own threads."""

    def __init__(self, path=None):
        self.path = path or library_path()
        lib = ctypes.CDLL(self.path)
        self.lib = lib
        lib.lajit_version.restype = ctypes.c_uint
        lib.lajit_version.argtypes = []
        lib.lajit_version_string.restype = ctypes.c_char_p
        lib.lajit_version_string.argtypes = []
        lib.lajit_status_string.restype = ctypes.c_char_p
        lib.lajit_status_string.argtypes = [ctypes.c_int]
        lib.lajit_errmsg.restype = ctypes.c_char_p
        lib.lajit_errmsg.argtypes = [_P]
        lib.lajit_ctx_desc_init.restype = None
        lib.lajit_ctx_desc_init.argtypes = [_P]
        lib.lajit_ctx_create.restype = ctypes.c_int
        lib.lajit_ctx_create.argtypes = [_P, ctypes.POINTER(_P)]
        lib.lajit_ctx_destroy.restype = None
        lib.lajit_ctx_destroy.argtypes = [_P]
        lib.lajit_family_names.restype = ctypes.POINTER(ctypes.c_char_p)
        lib.lajit_family_names.argtypes = []
        lib.lajit_ctx_add_families.restype = ctypes.c_int
        lib.lajit_ctx_add_families.argtypes = [_P, ctypes.c_char_p]
        lib.lajit_family_list.restype = ctypes.c_int
        lib.lajit_family_list.argtypes = [_P, ctypes.POINTER(ctypes.POINTER(ctypes.c_char_p)),
                                          ctypes.POINTER(ctypes.c_size_t)]
        lib.lajit_expand.restype = ctypes.c_int
        lib.lajit_expand.argtypes = [_P, ctypes.c_char_p, ctypes.c_char_p,
                                     ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t,
                                     ctypes.POINTER(_P)]
        lib.lajit_free.restype = None
        lib.lajit_free.argtypes = [_P, _P]
        for name in ("lajit_attn_fwd", "lajit_attn_bwd", "lajit_attn_decode", "lajit_launch",
                     "lajit_attn_state_scan"):
            fn = getattr(lib, name)
            fn.restype = ctypes.c_int
            fn.argtypes = [_P, _P]
        lib.lajit_attn_bwd_workspace_size.restype = ctypes.c_size_t
        lib.lajit_attn_bwd_workspace_size.argtypes = [ctypes.c_int64] * 3
        for name in ("lajit_decay_alibi", "lajit_decay_tnl"):
            fn = getattr(lib, name)
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int,
                           ctypes.POINTER(ctypes.c_float)]
        lib.lajit_decay_from_log.restype = ctypes.c_int
        lib.lajit_decay_from_log.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_int,
                                             ctypes.POINTER(ctypes.c_float)]
        # The hot path calls these through the bare function pointers.
        self.fwd = lib.lajit_attn_fwd
        self.bwd = lib.lajit_attn_bwd
        self.decode = lib.lajit_attn_decode
        self.state_scan = lib.lajit_attn_state_scan
        self.local = threading.local()
        self.ctx_flags = 0
        self.ctx_bundle = None
        self.ctx_cache_dir = None
        self.ctx_families = None

    def version(self):
        return self.lib.lajit_version_string().decode()

    def errmsg(self, ctx):
        text = self.lib.lajit_errmsg(ctx)
        return text.decode(errors="replace") if text else ""

    def create_ctx(self, device, flags=None, bundle=None, cache_dir=None):
        desc = CtxDesc()
        # The library fills the defaults; our struct is the 0.1 layout, and struct_size says so.
        self.lib.lajit_ctx_desc_init(ctypes.byref(desc))
        desc.struct_size = ctypes.sizeof(CtxDesc)
        desc.device = device
        desc.flags = self.ctx_flags if flags is None else flags
        bundle = bundle if bundle is not None else self.ctx_bundle
        cache_dir = cache_dir if cache_dir is not None else self.ctx_cache_dir
        if bundle:
            desc.bundle = os.fsencode(bundle)
        if cache_dir:
            desc.cache_dir = os.fsencode(cache_dir)
        ctx = _P()
        st = self.lib.lajit_ctx_create(ctypes.byref(desc), ctypes.byref(ctx))
        if st != 0:
            # No context, so no lajit_errmsg: say what was asked for instead.
            detail = self.lib.lajit_status_string(st).decode()
            detail += f" (device {device}, bundle {bundle!r}, cache_dir {cache_dir!r})"
            raise_status("lajit_ctx_create", st, detail)
        if self.ctx_families:
            st = self.lib.lajit_ctx_add_families(ctx, os.fsencode(self.ctx_families))
            if st != 0:
                detail = self.errmsg(ctx)
                self.lib.lajit_ctx_destroy(ctx)
                raise_status("lajit_ctx_add_families", st, detail)
        return ctx.value

    def ctx(self, device):
        """This thread's context on CUDA device `device` (created on first use)."""
        table = getattr(self.local, "ctx", None)
        if table is None:
            table = self.local.ctx = {}
        c = table.get(device)
        if c is None:
            c = table[device] = self.create_ctx(device)
        return c

    def check(self, function, ctx, status):
        if status != 0:
            raise_status(function, status, self.errmsg(ctx))

    def family_names(self):
        """Every family a context sees: the built-in ones, then LAJIT_FAMILY_PATH's."""
        ctx = self.ctx_nodevice()
        arr = ctypes.POINTER(ctypes.c_char_p)()
        n = ctypes.c_size_t()
        self.check("lajit_family_list", ctx,
                   self.lib.lajit_family_list(ctx, ctypes.byref(arr), ctypes.byref(n)))
        return [arr[i].decode() for i in range(n.value)]

    def expand(self, family, assignments=(), arch=None):
        """lajit_expand on a device-less context: the CUDA source of one kernel."""
        ctx = self.ctx_nodevice()
        items = [f"{k}={v}".encode() for k, v in dict(assignments).items()]
        arr = (ctypes.c_char_p * max(1, len(items)))(*items)
        src = _P()
        st = self.lib.lajit_expand(ctx, family.encode(), arch.encode() if arch else None,
                                   arr, len(items), ctypes.byref(src))
        self.check("lajit_expand", ctx, st)
        try:
            return ctypes.string_at(src.value).decode()
        finally:
            self.lib.lajit_free(ctx, src)

    def ctx_nodevice(self):
        c = getattr(self.local, "nodevice", None)
        if c is None:
            c = self.local.nodevice = self.create_ctx(0, flags=CTX_NO_DEVICE | self.ctx_flags)
        return c

    def decay(self, kind, n_heads, layer, n_layers):
        out = (ctypes.c_float * n_heads)()
        fn = self.lib.lajit_decay_alibi if kind == "alibi" else self.lib.lajit_decay_tnl
        st = fn(n_heads, layer, n_layers, out)
        if st != 0:
            raise_status(f"lajit_decay_{kind}", st,
                         f"n_heads {n_heads}, layer {layer}, n_layers {n_layers} refused")
        return list(out)

    def decay_from_log(self, log_lambda):
        n = len(log_lambda)
        src = (ctypes.c_float * max(1, n))(*log_lambda)
        out = (ctypes.c_float * max(1, n))()
        st = self.lib.lajit_decay_from_log(src, n, out)
        if st != 0:
            raise_status("lajit_decay_from_log", st, "log_lambda: values must be <= 0")
        return list(out)[:n]


_library = None
_lock = threading.Lock()


def library():
    """The process's Library (loaded on first use, after pointing it at NVRTC)."""
    global _library
    if _library is None:
        with _lock:
            if _library is None:
                configure_nvrtc()
                _library = Library()
    return _library
