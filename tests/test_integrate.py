"""The compile API around the Relax pass: hook, strictness, other targets, inspect."""

from __future__ import annotations


import numpy as np
import pytest
from armq_checks import llvm_source

import tvm_armq
from tvm_armq import build, cli, export, targets
from tvm_armq.frontend import importer
from tvm_armq.passes import gemm
from tvm_armq.report import Lowered


@pytest.fixture
def float_layer_model(tmp_path):
    """A .tflite file of one int8 LOG_SOFTMAX, an op tvm_armq has no integer kernel for:
    the pass leaves it float (dequantize, log_softmax, quantize)."""
    import tflite

    from tvm_armq.frontend.writer import single_op_model

    tensors = [dict(shape=(1, 4, 4, 16), dtype="int8", q=(0.05, 3)),
               dict(shape=(1, 4, 4, 16), dtype="int8", q=(16 / 256, 127))]  # TFLite's fixed q
    path = tmp_path / "log_softmax.tflite"
    path.write_bytes(single_op_model(tflite.BuiltinOperator.LOG_SOFTMAX, tensors, [0], [1],
                                     version=2))
    return path


@pytest.mark.device
def test_plain_tvm_compile_runs_tvm_armq_kernels_for_aarch64(devices, zoo_model, tmp_path):
    """After ``import tvm_armq``, plain ``tvm.compile`` of the imported model for an aarch64
    target contains the tvm_armq kernel (by name and instruction) and is bit-exact."""
    import tvm

    from tvm_armq.frontend.model import TFLiteModel

    model = TFLiteModel.load(zoo_model("conv2d_3x3"))
    target = tvm.target.Target(tvm_armq.target("dotprod"))
    exe = tvm.compile(importer.import_tflite(model), target=target)
    asm = exe.mod.imports[0].inspect_source("asm") if exe.mod.imports else ""
    assert "tvm_armq_conv2d" in asm and "sdot" in asm
    lib = export.export_aarch64(exe, tmp_path / "model.so")
    x = model.random_inputs(seed=5)
    got = build.run_on_device(devices.session("dotprod"), lib, x)
    np.testing.assert_array_equal(got[0], model.reference_outputs(x)[0])


@pytest.mark.device
def test_compile_tflite_builds_main_as_code(zoo_model, tmp_path, devices):
    """compile_tflite builds the VM program as a function of the library
    (``build.EXEC_MODE``), which runs bit-exact; plain ``tvm.compile`` and
    ``exec_mode="bytecode"`` keep TVM's bytecode; another mode is refused."""
    import tvm

    from tvm_armq.frontend.model import TFLiteModel

    assert build.EXEC_MODE == "compiled"
    model = TFLiteModel.load(zoo_model("conv2d_3x3"))
    exe = build.compile_tflite(model, "dotprod")
    assert "@__vmtir__main_compute_(" in llvm_source(exe)
    plain = tvm.compile(importer.import_tflite(model),
                        target=tvm.target.Target(tvm_armq.target("dotprod")))
    assert "__vmtir__main" not in llvm_source(plain)
    interpreted = build.compile_tflite(model, "dotprod", exec_mode="bytecode")
    assert "__vmtir__main" not in llvm_source(interpreted)
    with pytest.raises(ValueError, match="exec_mode 'aot': expected one of compiled, bytecode"):
        build.compile_tflite(model, "dotprod", exec_mode="aot")
    lib = export.export_aarch64(exe, tmp_path / "model.so")
    x = model.random_inputs(seed=3)
    got = build.run_on_device(devices.session("dotprod"), lib, x)
    np.testing.assert_array_equal(got[0], model.reference_outputs(x)[0])


def test_x86_target_compiles_with_stock_tvm(zoo_model):
    """compile_tflite for a non-aarch64 target is stock TVM, and says so when asked for a
    tvm_armq-only option."""
    import tvm
    from tvm import relax

    from tvm_armq.frontend.model import TFLiteModel

    model = TFLiteModel.load(zoo_model("conv2d_1x1"))
    vm = relax.VirtualMachine(build.compile_tflite(model, "llvm"), tvm.cpu())
    x = model.random_inputs(seed=1)
    got = vm["main"](tvm.runtime.tensor(x[0])).numpy()
    assert np.abs(got.astype(int) - model.reference_outputs(x)[0]).max() <= 1
    with pytest.raises(build.UnsupportedTarget, match="aarch64 LLVM target"):
        build.compile_tflite(model, "llvm", precision="bf16")
    with pytest.raises(build.UnsupportedTarget, match="not an aarch64 LLVM target"):
        build.inspect(model, "llvm")


def test_strict_names_the_layers_that_stay_float(zoo_model, float_layer_model):
    import tvm

    with pytest.raises(tvm.error.OpNotImplemented,
                       match=r"(?s)1 quantized layer.*LOG_SOFTMAX \(TFLite operator 0\)"):
        build.compile_tflite(float_layer_model, "neon", strict=True)
    report: list = []
    build.compile_tflite(zoo_model("conv2d_3x3"), "neon", strict=True, report=report)
    assert [type(r) for r in report] == [Lowered]


@pytest.mark.parametrize("level, kernel, one_row", [
    ("neon", "gemm_s8s8s32_4x4x16_neon", "gemm_s8s8s32_1x4x16_neon"),
    ("dotprod", "gemm_s8s8s32_4x4x4_dotprod", "gemm_s8s8s32_1x4x4_dotprod"),
    ("i8mm", "gemm_s8s8s32_2x2x8_i8mm", "gemm_s8s8s32_1x4x4_dotprod")])
def test_inspect_names_the_kernel_of_every_layer(zoo_model, level, kernel, one_row):
    """resnet_block's convolutions take the level's kernel, its dense layer on one pooled
    vector the one-row kernel."""
    report = tvm_armq.inspect(zoo_model("resnet_block"), level)
    by_op = {}
    for r in report:
        by_op.setdefault(r.op, set()).add(r.kernel)
    assert by_op == {"conv2d": {kernel}, "dense": {one_row}, "add": {"add_s8_neon"},
                     "mean": {"mean_s8_neon"}}


# Nets whose layers between them run every kind of integer kernel the pass makes.
GRAMMAR_MODELS = ("mobilenet_v3_small", "unet", "ssd_head", "ds_cnn", "densenet121",
                  "concat_requant", "softmax", "avg_pool", "mean", "resize_bilinear")


@pytest.mark.parametrize("level", ["neon", "i8mm"])
def test_every_record_names_its_kernels_in_the_grammar(zoo_model, level):
    """Every kernel a compile report names (a ``Lowered`` record may chain several: a
    TRANSPOSE_CONV's GEMMs and its pixel shuffle, a copy and a requantization) is spelt in
    the naming grammar (``intrinsics/names.py``), and a GEMM's is a row of the selection
    table."""
    from tvm_armq.intrinsics import kernels, names

    seen = set()
    for name in GRAMMAR_MODELS:
        for r in build.inspect(zoo_model(name), level):
            if not isinstance(r, Lowered):
                continue
            for kernel in r.kernel.split("+") + ([r.tail] if r.tail else []):
                m = names.NAME_RE.match(kernel)
                assert m, f"{name}: {kernel!r} breaks the naming grammar"
                if m["op"] == "gemm":
                    assert kernel in kernels.KERNELS, kernel
                seen.add(m["op"])
    assert {"gemm", "depthwise", "lut", "add", "multiply", "concat", "mean", "softmax",
            "avg_pool", "resize_bilinear", "requantize", "pixel_shuffle"} <= seen, seen


def test_kernels_take_and_give_the_model_shapes(zoo_model):
    """A GEMM returns the model's shape (NHWC, [1, N] for a dense layer) and a dense layer
    takes its [1, K] row as it is, each a view inside the kernel
    (``tir_util.view_params``), so no Relax reshape runs between two kernel calls:
    two_in_two_out's lowered main keeps one reshape, the model's own RESHAPE op."""
    from tvm_armq.frontend.model import TFLiteModel

    model = TFLiteModel.load(zoo_model("two_in_two_out"))
    mod = build.lower(importer.import_tflite(model), targets.resolve("dotprod"))
    text = mod["main"].script()
    assert text.count("R.reshape(") == 1, text
    assert 'op5_reshape: R.Tensor((32,), dtype="int8") = R.reshape(' in text
    assert "out_ty=R.Tensor((1, 12, 12, 16)" in text and "out_ty=R.Tensor((1, 10)" in text
    assert "tvm_armq_dense, (serving_default_input_b_0," in text


def test_inspect_names_row_tails(zoo_model):
    """MobileNetV1's 7x7 pointwise layers (M = 49) run their last row through the one-row
    twin at dotprod, and the log names it; no other layer has a row tail."""
    report = tvm_armq.inspect(zoo_model("mobilenet_v1_1.0"), "dotprod")
    tails = {r.in_shape: r.tail for r in report if r.op == "conv2d"}
    assert tails[(1, 7, 7, 512)] == tails[(1, 7, 7, 1024)] == "gemm_s8s8s32_1x4x4_dotprod"
    assert [s for s, t in tails.items() if t] == [(1, 7, 7, 512), (1, 7, 7, 1024)]
    line = next(r.line() for r in report if r.op == "conv2d" and r.tail)
    assert "gemm_s8s8s32_4x4x4_dotprod + gemm_s8s8s32_1x4x4_dotprod for the last rows" in line


def test_inspect_cli(float_layer_model, capsys, tmp_path):
    """inspect names the float layer and its TFLite operator; compile --strict refuses it
    with the exit status of an unsupported model, naming the operator."""
    assert cli.main(["inspect", str(float_layer_model), "--isa", "neon"]) == 0
    out = capsys.readouterr().out
    assert "LOG_SOFTMAX (TFLite operator 0)" in out and "stays float" in out and "0 of 1" in out
    unsupported = next(code for code, names in cli.EXIT_CODES
                       if "tvm.error:OpNotImplemented" in names)
    status = cli.main(["compile", str(float_layer_model), "--isa", "neon",
                       "--strict", "-o", str(tmp_path / "log_softmax.so")])
    assert status == unsupported
    assert "LOG_SOFTMAX (TFLite operator 0)" in capsys.readouterr().err
    assert not (tmp_path / "log_softmax.so").exists()


# ------------------------------------------------------------------ legacy uint8 models
def _u8_model(op: str, in_shape, out_c: int, *, k=3, stride=1, same=True, act=0, seed=0,
              q_in=(0.05, 120), q_w=(0.02, 131), q_out=(0.1, 100)) -> bytes:
    """A single uint8 CONV_2D or FULLY_CONNECTED with asymmetric weights (TFLite's legacy
    quantization, which today's converter no longer writes)."""
    import tflite

    from tvm_armq.frontend.writer import single_op_model

    rng = np.random.default_rng(seed)
    if op == "CONV_2D":
        n, h, w, c = in_shape
        weight = rng.integers(0, 255, (out_c, k, k, c), endpoint=True, dtype=np.uint8)
        size = (lambda d: -(-d // stride)) if same else (lambda d: (d - k) // stride + 1)
        out_shape = (n, size(h), size(w), out_c)
    else:
        weight = rng.integers(0, 255, (out_c, in_shape[1]), endpoint=True, dtype=np.uint8)
        out_shape = (in_shape[0], out_c)
    tensors = [dict(shape=in_shape, dtype="uint8", q=q_in),
               dict(shape=weight.shape, dtype="uint8", q=q_w, data=weight),
               dict(shape=(out_c,), dtype="int32", q=(q_in[0] * q_w[0], 0),
                    data=rng.integers(-3000, 3000, out_c).astype(np.int32)),
               dict(shape=out_shape, dtype="uint8", q=q_out)]

    def conv_options(b):
        tflite.Conv2DOptionsStart(b)
        tflite.Conv2DOptionsAddPadding(b, tflite.Padding.SAME if same else tflite.Padding.VALID)
        tflite.Conv2DOptionsAddStrideW(b, stride)
        tflite.Conv2DOptionsAddStrideH(b, stride)
        tflite.Conv2DOptionsAddDilationWFactor(b, 1)
        tflite.Conv2DOptionsAddDilationHFactor(b, 1)
        tflite.Conv2DOptionsAddFusedActivationFunction(b, act)
        return tflite.Conv2DOptionsEnd(b)

    def fc_options(b):
        tflite.FullyConnectedOptionsStart(b)
        tflite.FullyConnectedOptionsAddFusedActivationFunction(b, act)
        return tflite.FullyConnectedOptionsEnd(b)

    options = ((tflite.BuiltinOptions.Conv2DOptions, conv_options) if op == "CONV_2D" else
               (tflite.BuiltinOptions.FullyConnectedOptions, fc_options))
    return single_op_model(getattr(tflite.BuiltinOperator, op), tensors, [0, 1, 2], [3],
                           options, version=1)


# Scales with s_in * s_w / s_out = 1e-3: outputs spread over the range, not saturated.
U8_MODELS = {
    "conv_3x3_same_relu": dict(op="CONV_2D", in_shape=(1, 10, 9, 8), out_c=12, act=1,
                               q_out=(1.0, 100)),
    "conv_3x3_valid_s2": dict(op="CONV_2D", in_shape=(1, 11, 11, 5), out_c=7, stride=2,
                              same=False, q_in=(0.03, 0), q_w=(0.01, 140), q_out=(0.3, 128)),
    "fc": dict(op="FULLY_CONNECTED", in_shape=(2, 40), out_c=10, q_w=(0.01, 77),
               q_out=(0.5, 128)),
}


@pytest.mark.device
@pytest.mark.parametrize("level", ["neon", "dotprod", "i8mm"])
def test_legacy_uint8_models_are_bit_exact(devices, level, tmp_path, report):
    """uint8 CONV_2D / FULLY_CONNECTED with weight zero points run the u8 GEMM kernel of the
    level (plus the row sums the weight zero point needs) and equal TFLite's reference."""
    from tvm_armq.frontend.model import TFLiteModel

    from tvm_armq.intrinsics import kernels

    session, used = devices.session(level), set()
    isa = kernels.select(targets.resolve(level), "uint8", "uint8").isa
    for name, spec in U8_MODELS.items():
        path = tmp_path / f"{name}.tflite"
        path.write_bytes(_u8_model(**spec))
        model = TFLiteModel.load(path)
        layers: list = []
        lib = export.export_aarch64(build.compile_tflite(model, level, report=layers),
                                   tmp_path / f"{name}.so")
        assert [type(r) for r in layers] == [Lowered], layers
        kernel = kernels.get(layers[0].kernel)  # the level's u8 kernel for its rows and K
        assert kernel.name.startswith("gemm_u8u8") and kernel.isa == isa, kernel.name
        used.add(kernel.name)
        run = build.DeviceModel(session, lib)
        for seed in range(2):
            x = model.random_inputs(seed=seed)
            (want,), (got,) = model.reference_outputs(x), run(x)
            assert len(np.unique(want)) > 8
            np.testing.assert_array_equal(got, want, err_msg=f"{name} at {level}")
    report(f"tvm_armq   uint8 conv/fc models {level:8s} {' + '.join(sorted(used))} bit-exact")


# ------------------------------------------------------------------ requantization rounding
def _layer_accumulators(model, op_index: int, seeds):
    """(int32 accumulators, TFLite's int8 outputs, multipliers, shifts, output zero point)
    of the zoo model's CONV_2D (1x1) or FULLY_CONNECTED operator ``op_index``, from the
    tensors TFLite's reference kernels computed for each seed's input."""
    from tvm_armq.intrinsics.requant import quantize_multipliers

    op = model.flatbuffer().Subgraphs(0).Operators(op_index)
    x_i, w_i, b_i = (op.Inputs(i) for i in range(3))
    accs, outs = [], []
    for seed in seeds:
        it = model.reference_run(model.random_inputs(seed), keep_all_tensors=True)
        details = {d["index"]: d["quantization_parameters"] for d in it.get_tensor_details()}
        x_q, w_q, out_q = details[x_i], details[w_i], details[op.Outputs(0)]
        x = it.get_tensor(x_i).astype(np.int64) - int(x_q["zero_points"][0])
        w = it.get_tensor(w_i).astype(np.int64)
        w = w.reshape(w.shape[0], -1)  # FC [N, K]; a 1x1 conv's OHWI is [N, 1, 1, K]
        accs.append(x.reshape(-1, w.shape[1]) @ w.T + it.get_tensor(b_i).astype(np.int64))
        outs.append(it.get_tensor(op.Outputs(0)).reshape(accs[-1].shape))
    real = (np.float64(x_q["scales"][0]) * w_q["scales"].astype(np.float64)
            / np.float64(out_q["scales"][0]))
    mult, shift = quantize_multipliers(real)
    return np.concatenate(accs), np.concatenate(outs), mult, shift, int(out_q["zero_points"][0])


@pytest.mark.parametrize("name, rounding, seeds", [
    ("fully_connected", "single", range(300)),  # 4800 outputs
    ("conv2d_1x1", "double", range(4))])        # 4096 outputs
def test_tflite_rounds_fully_connected_once_and_conv2d_twice(zoo_model, name, rounding, seeds):
    """TFLite's reference FULLY_CONNECTED (int8, per-channel) requantizes with one rounding
    of the 64-bit product; its CONV_2D with gemmlowp's two. Each rule reproduces TFLite on
    every output and the other rule does not, so the pass must (and does: ``requant_rounding``)
    give each op its own."""
    from tvm_armq.intrinsics.requant import multiply_by_quantized_multiplier
    from tvm_armq.frontend.model import TFLiteModel

    model = TFLiteModel.load(zoo_model(name))
    acc, expected, mult, shift, zp = _layer_accumulators(model, 0, seeds)
    results = {mode: np.clip(multiply_by_quantized_multiplier(acc, mult, shift, mode) + zp,
                             -128, 127) for mode in ("single", "double")}
    other = "double" if rounding == "single" else "single"
    np.testing.assert_array_equal(results[rounding], expected)
    assert (results[other] != expected).any(), f"{other} rounding fits {name} as well"
    layer = gemm.Layer("dense" if name == "fully_connected" else "conv2d", None, (1.0, 0),
                             None, None, None, (1.0, 0), "int8", (-128, 127))
    assert gemm.requant_rounding(layer) == rounding
