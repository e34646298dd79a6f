"""Host-only tests of the model zoo (tvm_armq/zoo/): no device, no TVM.

Every single-op model is built (into a temp dir, never the user's cache), loaded
in TFLite, and checked for int8 inputs/outputs and for the operator and the
attributes its name promises.  Plus: determinism, cache reuse/invalidation, and
``resnet_block`` (the only net cheap enough here, ~2-4 s).  About 20-30 s total,
most of it TensorFlow's import and the first conversion.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tvm_armq import zoo

OP_MODELS = [s.name for s in zoo.specs() if s.kind == "op"]


# --------------------------------------------------------------------------
# Helpers: read ops straight from the flatbuffer with the ``tflite`` package
# --------------------------------------------------------------------------


def _parse(path):
    import tflite

    model = tflite.Model.GetRootAsModel(path.read_bytes(), 0)
    assert model.SubgraphsLength() == 1
    return model, model.Subgraphs(0)


def _op_name(model, op) -> str:
    import tflite

    code = model.OperatorCodes(op.OpcodeIndex())
    # Opcodes < 127 are duplicated in the deprecated int8 field; take the larger.
    return tflite.opcode2name(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()))


def _ops(path) -> list[str]:
    model, sg = _parse(path)
    return [_op_name(model, sg.Operators(i)) for i in range(sg.OperatorsLength())]


def _the_op(path, op_name):
    """(model, subgraph, operator) of the only ``op_name`` operator in the model."""
    model, sg = _parse(path)
    found = [
        sg.Operators(i)
        for i in range(sg.OperatorsLength())
        if _op_name(model, sg.Operators(i)) == op_name
    ]
    assert len(found) == 1, f"{path.name}: expected one {op_name}, found {len(found)}"
    return model, sg, found[0]


def _options(op, options_cls):
    opts = options_cls()
    table = op.BuiltinOptions()
    assert table is not None
    opts.Init(table.Bytes, table.Pos)
    return opts


def _interpreter(path):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    # Plain builtin kernels: the XNNPACK delegate would replace the ops we check.
    it = Interpreter(
        model_path=str(path),
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    it.allocate_tensors()
    return it


# --------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> path of every single-op model, built fresh into a temp dir."""
    out = tmp_path_factory.mktemp("zoo")
    return {name: zoo.build(name, out_dir=out) for name in OP_MODELS}


# --------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------


def test_registry_order_and_names():
    names = zoo.names()
    assert len(names) == len(set(names))
    kinds = [zoo.spec(n).kind for n in names]
    # Single-op models first, then nets.
    assert kinds == sorted(kinds, key=lambda k: k != "op")
    for required in ("conv2d_grouped", "mobilenet_v1_0.25", "mobilenet_v2_1.0",
                     "resnet_block"):
        assert required in names


def test_unknown_name_lists_valid_names():
    with pytest.raises(KeyError) as info:
        zoo.spec("no_such_model")
    assert "conv2d_3x3" in str(info.value) and "resnet_block" in str(info.value)
    with pytest.raises(KeyError):
        zoo.build("no_such_model")


def test_import_does_not_load_tensorflow():
    code = "import sys, tvm_armq.zoo; sys.exit('tensorflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TVM_ARMQ_HOME", str(tmp_path))
    assert zoo.cache_dir() == tmp_path / "models"
    assert zoo.model_dir().parent == tmp_path / "models"
    assert str(zoo.ZOO_VERSION) in zoo.model_dir().name
    monkeypatch.delenv("TVM_ARMQ_HOME")
    assert zoo.cache_dir() == pathlib.Path.home() / ".cache" / "tvm_armq" / "models"


# --------------------------------------------------------------------------
# Single-op models
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", OP_MODELS)
def test_single_op_model(built, name):
    s = zoo.spec(name)
    path = built[name]
    assert path.name == f"{name}.tflite"

    # The promised op, and nothing else but (possibly) requantizing QUANTIZEs.
    ops = _ops(path)
    assert s.op in ops, f"{name}: {s.op} not in {ops}"
    assert set(ops) <= {s.op, "QUANTIZE"}, f"{name}: unexpected ops {ops}"

    # Loads and runs in TFLite, with int8 on both ends and the spec's shapes.
    it = _interpreter(path)
    ins, outs = it.get_input_details(), it.get_output_details()
    assert [tuple(d["shape"]) for d in ins] == [tuple(x) for x in s.input_shapes]
    assert all(d["dtype"] == np.int8 for d in ins + outs)
    assert all(d["quantization"][0] > 0 for d in ins + outs)  # really quantized
    rng = np.random.RandomState(0)
    for d in ins:
        it.set_tensor(d["index"], rng.randint(-128, 128, d["shape"]).astype(np.int8))
    it.invoke()
    y = it.get_tensor(outs[0]["index"])
    assert len(np.unique(y)) > 1, f"{name}: constant output {y.flat[0]}"


# Attributes promised by the names (options read from the flatbuffer).
def _conv(path):
    import tflite

    model, sg, op = _the_op(path, "CONV_2D")
    return sg, op, _options(op, tflite.Conv2DOptions)


def _tensor_shape(sg, index):
    return tuple(sg.Tensors(index).ShapeAsNumpy())


@pytest.mark.parametrize(
    "name, kernel, stride, dilation",
    [
        ("conv2d_1x1", 1, 1, 1),
        ("conv2d_3x3", 3, 1, 1),
        ("conv2d_3x3_s2", 3, 2, 1),
        ("conv2d_3x3_d2", 3, 1, 2),
        ("conv2d_grouped", 3, 1, 1),
    ],
)
def test_conv2d_attributes(built, name, kernel, stride, dilation):
    import tflite

    sg, op, o = _conv(built[name])
    assert (o.StrideH(), o.StrideW()) == (stride, stride)
    assert (o.DilationHFactor(), o.DilationWFactor()) == (dilation, dilation)
    data, weight, bias = (op.Inputs(i) for i in range(3))
    out_c, kh, kw, in_c = _tensor_shape(sg, weight)
    assert (kh, kw) == (kernel, kernel)
    # Bias present, int32 (full-integer quantization).
    assert bias >= 0 and sg.Tensors(bias).Type() == tflite.TensorType.INT32
    groups = _tensor_shape(sg, data)[3] // in_c
    assert groups == (2 if name == "conv2d_grouped" else 1)


@pytest.mark.parametrize("name, stride", [("depthwise_3x3", 1),
                                          ("depthwise_3x3_s2", 2)])
def test_depthwise_attributes(built, name, stride):
    import tflite

    model, sg, op = _the_op(built[name], "DEPTHWISE_CONV_2D")
    o = _options(op, tflite.DepthwiseConv2DOptions)
    assert (o.StrideH(), o.StrideW()) == (stride, stride)
    assert o.DepthMultiplier() in (0, 1)  # 0: unset, the runtime infers 1
    assert _tensor_shape(sg, op.Inputs(1))[1:3] == (3, 3)
    assert op.Inputs(2) >= 0  # bias


def test_some_single_op_models_fuse_relu(built):
    """Fused activations are exercised (the brief asks for ReLU on some)."""
    import tflite

    fused = set()
    for name, cls in [("conv2d_3x3", tflite.Conv2DOptions),
                      ("conv2d_3x3_d2", tflite.Conv2DOptions),
                      ("depthwise_3x3", tflite.DepthwiseConv2DOptions),
                      ("fully_connected", tflite.FullyConnectedOptions),
                      ("add", tflite.AddOptions)]:
        op_name = zoo.spec(name).op
        _, _, op = _the_op(built[name], op_name)
        fused.add(_options(op, cls).FusedActivationFunction())
    A = tflite.ActivationFunctionType
    assert {A.RELU, A.RELU6} <= fused


def test_add_inputs_have_different_scales(built):
    it = _interpreter(built["add"])
    scales = [d["quantization"][0] for d in it.get_input_details()]
    assert len(scales) == 2 and scales[0] != scales[1]


# --------------------------------------------------------------------------
# Determinism and cache
# --------------------------------------------------------------------------


def test_build_is_deterministic(built, tmp_path):
    a = zoo.build("conv2d_3x3", force=True, out_dir=tmp_path / "a")
    b = zoo.build("conv2d_3x3", force=True, out_dir=tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()
    # ... and equal to the build done earlier in this process, after other models.
    assert a.read_bytes() == built["conv2d_3x3"].read_bytes()


def test_cache_reuses_and_invalidates(monkeypatch, tmp_path):
    monkeypatch.setenv("TVM_ARMQ_HOME", str(tmp_path))
    path = zoo.build("pad")
    assert path == zoo.model_dir() / "pad.tflite"
    assert path.is_relative_to(tmp_path)
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["zoo_version"] == zoo.ZOO_VERSION and meta["name"] == "pad"
    stamp = path.stat().st_mtime_ns

    # Second call: same path, and no conversion at all.
    calls = []
    real_convert = zoo.convert
    monkeypatch.setattr(zoo, "convert", lambda s: calls.append(s) or real_convert(s))
    assert zoo.build("pad") == path
    assert calls == [] and path.stat().st_mtime_ns == stamp

    # force=True rebuilds.
    zoo.build("pad", force=True)
    assert len(calls) == 1

    # A sidecar from another generator version invalidates the file.
    meta["zoo_version"] = zoo.ZOO_VERSION - 1
    path.with_suffix(".json").write_text(json.dumps(meta))
    zoo.build("pad")
    assert len(calls) == 2
    # So does a model file that does not match its sidecar's hash.
    path.write_bytes(path.read_bytes()[:-1])
    zoo.build("pad")
    assert len(calls) == 3

    # No temp files left behind.
    assert sorted(p.name for p in path.parent.iterdir()) == ["pad.json", "pad.tflite"]


# --------------------------------------------------------------------------
# The one net cheap enough for the host tests
# --------------------------------------------------------------------------


def test_resnet_block(tmp_path):
    path = zoo.build("resnet_block", out_dir=tmp_path)
    ops = _ops(path)
    assert ops.count("ADD") == 3
    assert {"CONV_2D", "MEAN", "FULLY_CONNECTED"} <= set(ops)
    assert "SOFTMAX" not in ops
    it = _interpreter(path)
    (inp,), (out,) = it.get_input_details(), it.get_output_details()
    assert tuple(inp["shape"]) == (1, 32, 32, 3) and tuple(out["shape"]) == (1, 10)
    assert inp["dtype"] == np.int8 and out["dtype"] == np.int8
    it.set_tensor(inp["index"],
                  np.random.RandomState(0).randint(-128, 128, (1, 32, 32, 3),
                                                   dtype=np.int8))
    it.invoke()
    y = it.get_tensor(out["index"])
    # Non-degenerate logits: not all equal, not all saturated.
    assert len(np.unique(y)) > 1
    assert np.mean((y == -128) | (y == 127)) < 0.5


# --------------------------------------------------------------------------
# The small nets of several outputs or inputs (each builds in a few seconds)
# --------------------------------------------------------------------------


def _run_int8(path, seed=0):
    """Inputs and outputs details, and the outputs for seeded random int8 inputs."""
    it = _interpreter(path)
    ins, outs = it.get_input_details(), it.get_output_details()
    rng = np.random.RandomState(seed)
    for d in ins:
        it.set_tensor(d["index"], rng.randint(-128, 128, d["shape"]).astype(np.int8))
    it.invoke()
    return ins, outs, [it.get_tensor(d["index"]) for d in outs]


def test_ds_cnn(tmp_path):
    path = zoo.build("ds_cnn", out_dir=tmp_path)
    ops = _ops(path)
    assert ops.count("DEPTHWISE_CONV_2D") == 4 and ops.count("CONV_2D") == 5
    assert {"MEAN", "FULLY_CONNECTED"} <= set(ops)
    ins, outs, (y,) = _run_int8(path)
    assert tuple(ins[0]["shape"]) == (1, 49, 10, 1) and tuple(outs[0]["shape"]) == (1, 12)
    assert len(np.unique(y)) > 1


def test_ssd_head_two_outputs(tmp_path):
    """Box and class convs per scale, RESHAPEd, CONCATENATEd; scores through LOGISTIC.
    Both outputs vary (the scores are not all saturated at 0 or 1)."""
    path = zoo.build("ssd_head", out_dir=tmp_path)
    ops = _ops(path)
    assert ops.count("RESHAPE") == 6 and ops.count("CONCATENATION") == 2
    assert ops.count("LOGISTIC") == 1
    _, outs, (scores, boxes) = _run_int8(path)
    assert tuple(scores.shape) == (1, 567, 6) and tuple(boxes.shape) == (1, 567, 4)
    for y in (scores, boxes):
        assert len(np.unique(y)) > 64
        assert np.mean((y == -128) | (y == 127)) < 0.5


def test_two_in_two_out_input_order(tmp_path):
    """The spec lists the inputs in TFLite's order (the vector, then the image), so the
    calibration data fed each input its own shape and range: the two input scales differ."""
    path = zoo.build("two_in_two_out", out_dir=tmp_path)
    assert {"CONV_2D", "FULLY_CONNECTED", "ADD", "CONCATENATION"} <= set(_ops(path))
    ins, outs, ys = _run_int8(path)
    assert [tuple(d["shape"]) for d in ins] == list(zoo.spec("two_in_two_out").input_shapes)
    assert ins[0]["quantization"][0] != ins[1]["quantization"][0]
    assert [tuple(y.shape) for y in ys] == [(1, 6, 6, 8), (1, 10)]
    assert all(len(np.unique(y)) > 1 for y in ys)
