"""test_cpu_package.py — the installed lajit package on a machine with no GPU: it imports from
site-packages (not the source tree), its C library loads, the torch ops are registered with the
pinned schemas, their fake implementations give the right shapes under FakeTensorMode and under
torch.compile(fullgraph=True) on meta tensors (forward and backward), and bad arguments come back
as Python exceptions naming the argument. Run by cpu_package.sh inside a throwaway venv, or with
pytest / run.py against any install."""
import os
import shutil
import subprocess
import sys
import unittest

import torch

import lajit
from lajit import _native

SCHEMAS = {
    "fwd": "lajit::fwd(Tensor q, Tensor k, Tensor v, Tensor? s, float scale, "
           "Tensor? initial_state, Tensor? cu_seqlens, Tensor? state_slots, "
           "bool output_final_state, bool head_first, bool state_vk) -> (Tensor, Tensor)",
    "bwd": "lajit::bwd(Tensor q, Tensor k, Tensor v, Tensor dout, Tensor? s, float scale, "
           "Tensor? initial_state, Tensor? d_final_state, Tensor? cu_seqlens, "
           "Tensor? state_slots, bool want_ds, bool want_d_initial, bool head_first, "
           "bool state_vk) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    "prefill_": "lajit::prefill_(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, "
                "Tensor(a4!) state_pool, Tensor state_slots, Tensor? s, float scale, "
                "bool state_vk) -> Tensor",
    "decode_": "lajit::decode_(Tensor q, Tensor k, Tensor v, Tensor(a3!) state_pool, "
               "Tensor? state_slots, Tensor? s, float scale, bool state_vk) -> Tensor",
}


def test_imported_from_an_install():
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.abspath(os.path.join(here, "..", "lajit"))
    pkg = os.path.dirname(os.path.abspath(lajit.__file__))
    assert pkg != src, f"lajit was imported from the source tree {src}, not an install"
    assert _native.library().path.startswith(pkg), _native.library().path
    assert lajit.version() == lajit.__version__, (lajit.version(), lajit.__version__)


def test_families_and_expand_need_no_gpu():
    fams = lajit.families()
    assert "la_fwd" in fams and "la_decode" in fams, fams
    src = lajit.expand("la_fwd", dtype="bf16", D=64, E=64)
    assert "__global__" in src


def test_schemas():
    for name, want in SCHEMAS.items():
        got = str(getattr(torch.ops.lajit, name).default._schema)
        assert got == want, f"{name}:\n got  {got}\n want {want}"


def _fake_inputs(mode, B=2, T=48, H=4, D=32, E=16, dtype=torch.bfloat16):
    with mode:
        q = torch.empty(B, T, H, D, dtype=dtype, device="cuda")
        k = torch.empty(B, T, H, D, dtype=dtype, device="cuda")
        v = torch.empty(B, T, H, E, dtype=dtype, device="cuda")
    return q, k, v


def test_fake_shapes_under_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    q, k, v = _fake_inputs(mode)
    with mode:
        g_gamma = -torch.rand(4, device="cuda")
        h0 = torch.empty(2, 4, 32, 16, device="cuda")
        o, ht = lajit.chunk_simple_gla(q, k, v, g_gamma=g_gamma, initial_state=h0,
                                       output_final_state=True)
        assert o.shape == (2, 48, 4, 16) and o.dtype == torch.bfloat16, (o.shape, o.dtype)
        assert ht.shape == (2, 4, 32, 16) and ht.dtype == torch.float32
        o2, ht2 = lajit.fused_recurrent_simple_gla(q, k, v, g_gamma=g_gamma, state_v_first=True,
                                                   output_final_state=True)
        assert ht2.shape == (2, 4, 16, 32)
        o3, none = lajit.chunk_simple_gla(q, k, v)
        assert none is None and o3.shape == (2, 48, 4, 16)
        # varlen: [1, T, H, D] with cu_seqlens, N = 3 sequences
        cu = torch.tensor([0, 10, 30, 48], device="cuda")
        o4, ht4 = lajit.chunk_simple_gla(q[:1], k[:1], v[:1], g_gamma=g_gamma,
                                         output_final_state=True, cu_seqlens=cu)
        assert o4.shape == (1, 48, 4, 16) and ht4.shape == (3, 4, 32, 16)
        # native layout, serving ops
        qn = q.transpose(1, 2)
        on = lajit.lightning_attn(qn, k.transpose(1, 2), v.transpose(1, 2))
        assert on.shape == (2, 4, 48, 16)
        pool = torch.zeros(8, 4, 32, 16, device="cuda")
        slots = torch.tensor([3, -1], dtype=torch.int32, device="cuda")
        od = torch.ops.lajit.decode_(q[:, 0], k[:, 0], v[:, 0], pool, slots, None, 1.0, False)
        assert od.shape == (2, 4, 16) and od.dtype == torch.bfloat16
        op = lajit.prefill(q[0], k[0], v[0], cu, pool, torch.tensor([0, 1, 2], device="cuda"))
        assert op.shape == (48, 4, 16)


class _Layer(torch.nn.Module):
    """A linear-attention layer with a learnable decay, as a model would hold it."""

    def __init__(self, H=4, D=32):
        super().__init__()
        self.H, self.D = H, D
        self.qkv = torch.nn.Linear(H * D, 3 * H * D, bias=False)
        self.log_s = torch.nn.Parameter(torch.full((H,), -2.0))

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.H, self.D).unbind(2)
        o, _ = lajit.chunk_simple_gla(q, k, v, g_gamma=-self.log_s.exp())
        return o.reshape(B, T, -1)


def test_compile_fullgraph_forward_and_backward_on_meta():
    torch._dynamo.reset()
    layer = _Layer().to("meta")
    x = torch.empty(2, 64, 128, device="meta", requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    y = compiled(x)
    assert y.shape == (2, 64, 128) and y.device.type == "meta"
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    assert layer.log_s.grad is not None and layer.log_s.grad.shape == (4,)


def test_compile_fullgraph_no_graph_break_explain():
    torch._dynamo.reset()
    layer = _Layer().to("meta")
    x = torch.empty(2, 64, 128, device="meta")
    exp = torch._dynamo.explain(layer)(x)
    assert exp.graph_break_count == 0, exp.break_reasons
    assert exp.graph_count == 1


def test_compile_decode_on_meta():
    torch._dynamo.reset()

    def step(q, k, v, pool, slots):
        return lajit.decode(q, k, v, pool, slots, scale=0.5)

    f = torch.compile(step, fullgraph=True, backend="aot_eager")
    q = torch.empty(4, 2, 32, dtype=torch.float16, device="meta")
    v = torch.empty(4, 2, 16, dtype=torch.float16, device="meta")
    pool = torch.empty(6, 2, 32, 16, device="meta")
    slots = torch.empty(4, dtype=torch.int32, device="meta")
    o = f(q, q, v, pool, slots)
    assert o.shape == (4, 2, 16) and o.dtype == torch.float16


def test_host_tensor_is_refused_naming_the_argument():
    q = torch.zeros(1, 2, 8, 16)
    try:
        lajit.lightning_attn(q, q, q)
    except lajit.LajitArgumentError as e:
        assert e.argument == "q" and e.status == 1, (e.argument, e)
        assert "lajit_attn_fwd" in str(e) and "not CUDA device memory" in str(e), str(e)
        assert isinstance(e, ValueError)
    else:
        raise AssertionError("a host tensor was accepted")
    try:
        lajit.decode(q[:, 0], q[:, 0], q[:, 0], torch.zeros(1, 8, 16, 16))
    except lajit.LajitArgumentError as e:
        assert e.argument == "q" and "lajit_attn_decode" in str(e), str(e)
    else:
        raise AssertionError("decode accepted a host tensor")


def test_c_shape_error_names_the_argument():
    """The C API's own validation (before any driver call): k with a different head width."""
    lib = _native.library()
    views = [_native.View() for _ in range(4)]
    fake = 1 << 20  # never dereferenced: validation fails first
    shapes = [(1, 2, 8, 16), (1, 2, 8, 32), (1, 2, 8, 16), (1, 2, 8, 16)]
    ptrs = []
    for view, shape in zip(views, shapes):
        strides = (shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1)
        ptrs.append(view.fill(fake, shape, strides, _native.DL_FLOAT, 32))
    a = _native.FwdArgs(struct_size=_native.ctypes.sizeof(_native.FwdArgs), q=ptrs[0],
                        k=ptrs[1], v=ptrs[2], o=ptrs[3], scale=1.0)
    ctx = lib.ctx(0)
    st = lib.fwd(ctx, _native.ctypes.addressof(a))
    try:
        lib.check("lajit_attn_fwd", ctx, st)
    except lajit.LajitArgumentError as e:
        assert e.argument == "k", str(e)
    else:
        raise AssertionError("k [1,2,8,32] beside q [1,2,8,16] was accepted")


def test_state_scan_binding_reaches_the_c_checks():
    """lajit_attn_state_scan's struct as the library reads it: lengths of the wrong size are
    refused with the sizes the C check read from local_states (before any device access)."""
    from lajit import _torch as ops
    states = torch.zeros(2, 1, 2, 4, 4)
    try:
        ops.state_scan_into(torch.zeros_like(states), None, states,
                            torch.zeros(3, dtype=torch.int64), None, None, True, False)
    except lajit.LajitArgumentError as e:
        assert "lajit_attn_state_scan" in str(e), str(e)
        assert "lengths is [3]; expected [P] = [2]" in str(e), str(e)
    else:
        raise AssertionError("lengths [3] beside 2 local states were accepted")


def test_d_initial_state_only_backward_passes_the_null_checks():
    """bwd_d_initial_into's call (dq, dk, dv, k, v NULL; d_initial_state given) is one the C
    library takes: refused here only because the tensors are in host memory."""
    from lajit import _torch as ops
    q = torch.zeros(1, 2, 5, 4)
    try:
        ops.bwd_d_initial_into(torch.zeros(1, 2, 4, 4), q, q, None, 1.0, None, True, False)
    except lajit.LajitArgumentError as e:
        assert e.argument == "q" and "host memory" in str(e), str(e)
    else:
        raise AssertionError("host tensors were accepted")


def test_cp_reaches_the_c_library_in_a_one_rank_group():
    """cp_lightning_attn on host tensors in a one-rank gloo group: its argument check and
    exchange run, and the C library refuses the span's tensors by name (the real library,
    not the mock)."""
    import tempfile
    import torch.distributed as dist
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "rdv"),
                                rank=0, world_size=1)
        try:
            q = torch.zeros(1, 2, 8, 16)
            lajit.cp_lightning_attn(q, q, q, torch.zeros(2))
        except lajit.LajitArgumentError as e:
            assert e.argument == "k" and "lajit_attn_fwd" in str(e), str(e)
        else:
            raise AssertionError("host tensors were accepted")
        finally:
            dist.destroy_process_group()


def test_launch_a_custom_family_checks_its_arguments():
    """lajit.launch reaches lajit_launch: the family path's toy family is listed, and host
    tensors, an unknown name and a missing scalar are refused naming the argument."""
    fams = lajit.families()
    assert "toy_axpy" in fams, fams
    x = torch.zeros(3, 64)
    y = torch.zeros(3, 64)
    for kwargs, arg, says in (
            (dict(tensors={"x": x, "y": y}, scalars={"alpha": 1.0}), "x", "not CUDA memory"),
            (dict(tensors={"x": x, "z": y}, scalars={"alpha": 1.0}), "z", "does not declare"),
            (dict(tensors={"x": x, "y": y}), None, "scalar alpha is required")):
        try:
            lajit.launch("toy_axpy", **kwargs)
        except lajit.LajitArgumentError as e:
            assert says in str(e), str(e)
            if arg:
                assert e.argument == arg, (e.argument, str(e))
        else:
            raise AssertionError(f"{kwargs} was accepted")


def test_fla_unsupported_features_raise():
    q = torch.zeros(1, 4, 2, 8)
    for call, exc in ((lambda: lajit.chunk_simple_gla(q, q, q, g=torch.zeros(1, 4, 2)),
                       NotImplementedError),
                      (lambda: lajit.fused_recurrent_simple_gla(q, q, q, reverse=True),
                       NotImplementedError),
                      (lambda: lajit.chunk_simple_gla(q, q, q, head_first=True),
                       DeprecationWarning),
                      (lambda: lajit.chunk_simple_gla(q, q, q, chunk_size=48), ValueError),
                      (lambda: lajit.chunk_simple_gla(torch.zeros(2, 4, 2, 8), q, q,
                                                      cu_seqlens=torch.tensor([0, 4])),
                       ValueError)):
        try:
            call()
        except exc:
            pass
        else:
            raise AssertionError(f"{exc.__name__} not raised")


def test_decay_adapters():
    s = lajit.decay_alibi(8)
    want = torch.tensor([2 ** (-8 * (h + 1) / 8) * (1 + 1e-5) for h in range(8)])
    assert torch.allclose(s, want, rtol=1e-6), (s, want)
    t = lajit.decay_tnl(4, layer=1, n_layers=4)
    assert torch.allclose(t, torch.tensor([8 * h / 4 * (1 - 1 / 4) for h in range(4)]))
    g = torch.tensor([-0.5, -0.25, 0.0])
    assert torch.equal(lajit.decay_from_log(g), -g)
    try:
        lajit.decay_alibi(0)
    except lajit.LajitError as e:
        assert e.status == 1
    else:
        raise AssertionError("n_heads 0 accepted")


def test_nvrtc_from_the_wheel_and_override():
    """A fake nvidia/cu13/lib/libnvrtc.so.13 on sys.path is found at import; a set
    LAJIT_NVRTC_PATH wins over it."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        lib = os.path.join(tmp, "nvidia", "cu13", "lib")
        os.makedirs(lib)
        open(os.path.join(lib, "libnvrtc.so.13"), "w").close()
        code = ("import os, lajit; lajit.library(); "
                "print(os.environ.get('LAJIT_NVRTC_PATH'))")
        env = {k: v for k, v in os.environ.items() if k != "LAJIT_NVRTC_PATH"}
        # Prepended: lajit itself may be importable only through PYTHONPATH (an install with
        # pip --target, as on the GPU machine).
        env["PYTHONPATH"] = os.pathsep.join(
            [tmp] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
        assert out == os.path.join(lib, "libnvrtc.so.13"), out
        env["LAJIT_NVRTC_PATH"] = "/opt/mine/libnvrtc.so"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
        assert out == "/opt/mine/libnvrtc.so", out


def test_cli_console_script():
    # Beside the interpreter in a virtual environment; on PATH for other installs (pip --target
    # puts it in TARGET/bin).
    exe = os.path.join(os.path.dirname(sys.executable), "lajit")
    if not os.path.exists(exe):
        exe = shutil.which("lajit") or exe
    out = subprocess.run([exe, "version"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"lajit {lajit.__version__}", out
    p = lajit.tools.run("families", capture=True)
    assert "la_decode" in p.stdout
    # The console script points the program at the wheel's NVRTC when one is installed (the
    # torch this test runs with brings nvidia-cuda-nvrtc along).
    info = subprocess.run([exe, "info"], capture_output=True, text=True).stdout
    nvrtc = lajit.find_wheel_nvrtc()
    if nvrtc and "LAJIT_NVRTC_PATH" not in os.environ:
        major = nvrtc.rsplit(".so.", 1)[1]
        assert f"NVRTC     {major}." in info, info
    try:
        lajit.tools.run("no-such-command", capture=True)
    except lajit.LajitCliError as e:
        assert e.returncode == 2
    else:
        raise AssertionError("a bad command succeeded")


def test_gen_bundle_and_open_it():
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "decode.bundle")
        try:
            lajit.gen_bundle(path, arch="sm_90a", families="la_decode")
        except lajit.LajitCliError as e:
            if "NVRTC" in e.stderr or "compiler" in e.stderr:
                raise unittest.SkipTest(f"no NVRTC here: {e.stderr.strip()}")
            raise
        assert os.path.getsize(path) > 0
        lib = _native.library()
        lib.lib.lajit_ctx_destroy(lib.create_ctx(0, bundle=path))
        try:
            lib.create_ctx(0, bundle=os.path.join(tmp, "missing.bundle"))
        except lajit.LajitError as e:
            assert e.status == 13 and "missing.bundle" in str(e), str(e)
        else:
            raise AssertionError("a missing bundle was accepted")


def test_tune_without_gpu_fails_cleanly():
    if torch.cuda.is_available():
        raise unittest.SkipTest("this machine has a GPU (tuning would run)")
    try:
        lajit.tune("la_decode", B=[1], H=[2], D=64)
    except lajit.LajitCliError as e:
        assert e.returncode == 1, e
    else:
        raise AssertionError("tuning succeeded with no GPU")
