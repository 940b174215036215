"""test_cpu_mock.py — test_gpu_ops.py's tests on CPU tensors, with the C library's op entry
points replaced by mock_backend.py's float64 reference: checks the package's Python side (FLA
layouts, varlen and pool plumbing, autograd through lajit::bwd, the lean and bound decode) and
the GPU test file itself, on a machine with no GPU. The kernels are not exercised here."""
import os
import sys

os.environ["LAJIT_TEST_DEVICE"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mock_backend  # noqa: E402

mock_backend.install()

from test_gpu_ops import *  # noqa: E402,F401,F403
