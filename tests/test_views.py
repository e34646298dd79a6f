"""Flat views read and written through the buffers they view (``tvm_armq.passes.views``).

The case that showed the need: a TRANSPOSE_CONV at stride 1 is one direct-form GEMM that
writes the padded input and reads it back through the A operand's view. Built serially
(padding and GEMM in one function), LLVM took the view's accesses for another buffer's and
the outputs were wrong at dotprod (652 of 840)."""

from __future__ import annotations

import pytest

import tvm_armq  # noqa: F401  (installs the hooks)
from armq_checks import assert_exact
from tvm_armq.intrinsics.indirect import walk
from tvm_armq.passes import views

CASE = "transpose_conv_3x3_s1_same"  # of test_op_coverage.CASES
SEEDS = (0, 1)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from test_op_coverage import CASES

    from tvm_armq.frontend.model import TFLiteModel

    path = tmp_path_factory.mktemp("views") / f"{CASE}.tflite"
    path.write_bytes(next(c for c in CASES if c.name == CASE).written)
    return TFLiteModel.load(path)


def _view_accesses(func) -> int:
    """How many loads and stores of ``func`` go through a flat view."""
    from tvm import ir, tirx

    found = views._flat_views(func.body)
    loads = walk(func.body, ir.expr.TensorLoad)
    stores = walk(func.body, tirx.BufferStore)
    return sum(n.source in found for n in loads) + sum(n.buffer in found for n in stores)


def test_no_access_is_left_on_a_view(model):
    """The kernel's lowered TIR reads the padded input through views before the pass and
    through the padded input itself after it."""
    import tvm
    from tvm import tirx

    from tvm_armq import build

    seen = {}

    @tvm.instrument.pass_instrument
    class Record:
        def run_before_pass(self, mod, info):
            if info.name == "tvm_armq.ThroughViewedBuffers":
                seen["before"] = mod

        def run_after_pass(self, mod, info):
            if info.name == "tvm_armq.ThroughViewedBuffers":
                seen["after"] = mod

    with tvm.transform.PassContext(opt_level=3, instruments=[Record()]):
        build.compile_tflite(model, "dotprod", threads=1)
    kernels = {name: [f for gv, f in seen[name].functions.items()
                      if isinstance(f, tirx.PrimFunc) and "conv2d" in gv.name_hint]
               for name in ("before", "after")}
    assert len(kernels["before"]) == len(kernels["after"]) == 1, kernels
    assert _view_accesses(kernels["before"][0]) > 0
    assert _view_accesses(kernels["after"][0]) == 0


@pytest.mark.device
def test_serial_direct_gemm_on_device(level, model, compiled_models, tmp_path):
    """Built for one thread (serial loops: ``--threads 1``, the C library, the serial twins),
    bit-exact with TFLite at every level."""
    from tvm_armq import build, export

    lib = export.export_aarch64(build.compile_tflite(model, level, threads=1),
                                tmp_path / f"{CASE}_one_thread.so")
    run = build.DeviceModel(compiled_models.session(level), lib)
    for seed in SEEDS:
        x = model.random_inputs(seed=seed)
        got = run(x)
        assert len(got) == 1 and len(set(got[0].ravel().tolist())) > 16, "outputs not alive"
        assert_exact(got, model.reference_outputs(x), f"{CASE} at {level}, seed {seed}")
