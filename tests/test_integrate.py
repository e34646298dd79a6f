"""The compile API around the Relax pass: hook, strictness, other targets, inspect."""

from __future__ import annotations

import numpy as np
import pytest

import tvm_armq
from tvm_armq import build, cli, integrate


def test_plain_tvm_compile_runs_tvm_armq_kernels_for_aarch64(devices, zoo_model, tmp_path):
    """After ``import tvm_armq``, plain ``tvm.compile`` of the imported model for an aarch64
    target contains the tvm_armq kernel (by name and instruction) and is bit-exact."""
    import tvm

    from tvm_armq.tflite_model import TFLiteModel

    model = TFLiteModel.load(zoo_model("conv2d_3x3"))
    target = tvm.target.Target(tvm_armq.target("dotprod"))
    exe = tvm.compile(build.import_tflite(model), target=target)
    asm = exe.mod.imports[0].inspect_source("asm") if exe.mod.imports else ""
    assert "tvm_armq_conv2d" in asm and "sdot" in asm
    lib = build.export_aarch64(exe, tmp_path / "model.so")
    x = model.random_inputs(seed=5)
    got = build.run_on_device(devices.session("dotprod"), lib, x)
    np.testing.assert_array_equal(got[0], model.reference_outputs(x)[0])


def test_x86_target_compiles_with_stock_tvm(zoo_model):
    """compile_tflite for a non-aarch64 target is stock TVM, and says so when asked for a
    tvm_armq-only option."""
    import tvm
    from tvm import relax

    from tvm_armq.tflite_model import TFLiteModel

    model = TFLiteModel.load(zoo_model("conv2d_1x1"))
    vm = relax.VirtualMachine(build.compile_tflite(model, "llvm"), tvm.cpu())
    x = model.random_inputs(seed=1)
    got = vm["main"](tvm.runtime.tensor(x[0])).numpy()
    assert np.abs(got.astype(int) - model.reference_outputs(x)[0]).max() <= 1
    with pytest.raises(build.UnsupportedTarget, match="aarch64 LLVM target"):
        build.compile_tflite(model, "llvm", precision="bf16")
    with pytest.raises(build.UnsupportedTarget, match="not an aarch64 LLVM target"):
        build.inspect(model, "llvm")


def test_strict_names_the_layers_that_stay_float(zoo_model):
    import tvm

    with pytest.raises(tvm.error.OpNotImplemented, match=r"(?s)1 quantized layer.*sigmoid"):
        build.compile_tflite(zoo_model("logistic"), "neon", strict=True)
    report: list = []
    build.compile_tflite(zoo_model("conv2d_3x3"), "neon", strict=True, report=report)
    assert [type(r) for r in report] == [integrate.Lowered]


@pytest.mark.parametrize("level, kernel", [("neon", "gemm_s8s8s32_4x4x16_neon"),
                                           ("dotprod", "gemm_s8s8s32_4x4x4_dotprod"),
                                           ("i8mm", "gemm_s8s8s32_2x2x8_i8mm")])
def test_inspect_names_the_kernel_of_every_layer(zoo_model, level, kernel):
    report = tvm_armq.inspect(zoo_model("resnet_block"), level)
    by_op = {}
    for r in report:
        by_op.setdefault(r.op, set()).add(r.kernel)
    assert by_op == {"conv2d": {kernel}, "dense": {kernel}, "add": {"add_s8_tflite"},
                     "mean": {"mean_s8_tflite"}}


def test_inspect_cli(zoo_model, capsys):
    assert cli.main(["inspect", str(zoo_model("logistic")), "--isa", "neon"]) == 0
    out = capsys.readouterr().out
    assert "sigmoid" in out and "stays float" in out and "0 of 1" in out
    with pytest.raises(SystemExit) as e:
        cli.main(["compile", str(zoo_model("logistic")), "--isa", "neon", "--strict"])
    assert e.value.code == 2
