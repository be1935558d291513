"""Shared helpers for the attn Python tests.

No test may skip silently: a skipped test is reported as a failure here, so pytest's exit code
is 0 only when every collected test ran and passed. Optional dependencies (torch, entmax,
onnxruntime, ml_dtypes, matplotlib) are imported plainly: a missing one fails collection.
"""

import numpy as np
import pytest
import torch


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and not hasattr(rep, "wasxfail"):
        rep.outcome = "failed"
        rep.longrepr = f"skipped, which this suite does not allow: {rep.longrepr}"


# Tolerances against a float64 oracle, by the dtype attn computed in.
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
GRAD_TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}


def assert_close(got, want, tol, what=""):
    got = torch.as_tensor(got).detach().double()
    want = torch.as_tensor(want).detach().double()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    scale = max(1.0, float(want.abs().max()) if want.numel() else 1.0)
    err = float((got - want).abs().max()) if want.numel() else 0.0
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:.1g} x {scale:.3g}"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
