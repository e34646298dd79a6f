"""The multiply-accumulates the ceiling benchmark (scripts/mac_ceiling.py) counts per layer,
against a count made another way: every (output pixel, tap) pair of the layer enumerated in
2-D, with its strides, dilation and padding read from the flatbuffer's options and TF's
SAME padding computed here from its definition (not by the helper the benchmark shares
with the compiler); and TRANSPOSE_CONV's count against the products TFLite's scatter
does inside the output, enumerated one by one."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import mac_ceiling  # noqa: E402
from test_transpose_conv import GEOMETRIES, _draw, _id, transpose_conv_model  # noqa: E402
from tvm_armq import zoo  # noqa: E402
from tvm_armq.frontend.layers import QuantLayer, read_layer  # noqa: E402
from tvm_armq.frontend.model import TFLiteModel  # noqa: E402


def tf_same_before(in_size: int, k: int, stride: int, dilation: int) -> int:
    """TF's SAME padding before the data on one axis: the output has ceil(in / stride)
    positions, the padding the window needs to reach them all is split with the odd one
    after."""
    out = math.ceil(in_size / stride)
    total = max((out - 1) * stride + (k - 1) * dilation + 1 - in_size, 0)
    return total // 2


def window_options(model: TFLiteModel):
    """(strides, dilation, same) of the model's one CONV_2D or DEPTHWISE_CONV_2D, read
    from its flatbuffer."""
    import tflite

    m = model.flatbuffer()
    g = m.Subgraphs(0)
    for i in range(g.OperatorsLength()):
        op = g.Operators(i)
        code = m.OperatorCodes(op.OpcodeIndex())
        kind = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        cls = {tflite.BuiltinOperator.CONV_2D: tflite.Conv2DOptions,
               tflite.BuiltinOperator.DEPTHWISE_CONV_2D: tflite.DepthwiseConv2DOptions}.get(kind)
        if cls is not None:
            o = cls()
            o.Init(op.BuiltinOptions().Bytes, op.BuiltinOptions().Pos)
            return ((o.StrideH(), o.StrideW()), (o.DilationHFactor(), o.DilationWFactor()),
                    o.Padding() == tflite.Padding.SAME)
    raise AssertionError("no convolution in the model")


def enumerated_macs(model: TFLiteModel, layer: QuantLayer) -> int:
    """Products of the layer's direct algorithm whose input is inside the tensor."""
    if layer.op == "FULLY_CONNECTED":  # [rows, N] = [rows, K] x [K, N]
        rows, n_out = layer.output_shape
        return rows * n_out * layer.weight.shape[-1]
    n, out_h, out_w, out_c = layer.output_shape
    in_h, in_w = layer.input_shape[1:3]
    kh, kw = layer.weight.shape[1:3]
    (sh, sw), (dh, dw), same = window_options(model)
    top = tf_same_before(in_h, kh, sh, dh) if same else 0
    left = tf_same_before(in_w, kw, sw, dw) if same else 0
    taps = 0
    for oh in range(out_h):
        for ow in range(out_w):
            for i in range(kh):
                for j in range(kw):
                    y, x = oh * sh - top + i * dh, ow * sw - left + j * dw
                    taps += 0 <= y < in_h and 0 <= x < in_w
    per_tap = layer.weight.shape[-1] if layer.op == "CONV_2D" else 1  # in_c / groups
    return n * out_c * per_tap * taps


@pytest.mark.parametrize("name", ["conv2d_3x3", "conv2d_3x3_s2", "conv2d_3x3_d2",
                                  "conv2d_grouped", "conv2d_1x1", "depthwise_3x3",
                                  "depthwise_3x3_s2", "fully_connected"])
def test_macs_of_a_layer_are_its_in_bounds_products(name):
    model = TFLiteModel.load(zoo.build(name))
    layer = read_layer(model)
    expected = enumerated_macs(model, layer)
    assert mac_ceiling.model_macs(model) == expected
    if layer.op != "FULLY_CONNECTED" and window_options(model)[2]:
        # taps on the padding are left out of the count
        n, out_h, out_w, out_c = layer.output_shape
        kh, kw = layer.weight.shape[1:3]
        per_tap = layer.weight.shape[-1] if layer.op == "CONV_2D" else 1
        if kh > 1:
            assert expected < n * out_h * out_w * out_c * kh * kw * per_tap


def scattered_products(in_hw, k, s, out_hw, same: bool) -> int:
    """Per output channel and input channel: the (input pixel, tap) pairs TFLite's
    TRANSPOSE_CONV scatters inside the output, enumerated one by one. Its padding is the
    convolution's that would take the output back to the input."""
    per_axis = []
    for n, kk, ss, out in zip(in_hw, k, s, out_hw):
        before = max((n - 1) * ss + kk - out, 0) // 2 if same else 0
        per_axis.append(sum(0 <= i * ss + t - before < out for i in range(n) for t in range(kk)))
    return per_axis[0] * per_axis[1]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=[_id(g) for g in GEOMETRIES])
def test_transpose_conv_counts_the_products_that_land(geometry):
    """Over every geometry of the phase-split sweep: the count is the products TFLite's
    scatter does inside the output, no more (taps on the padding, the rows past a SAME
    output) and no fewer."""
    in_hw, k, s, same, extra = geometry
    x, w, bias, out_hw, x_q, w_scales = _draw(np.random.default_rng(5), geometry)
    oc, ic = w.shape[0], w.shape[-1]
    model = TFLiteModel.load(transpose_conv_model(
        x.shape, w, bias, (1, *out_hw, oc), x_q, w_scales, (0.05, 0), s, same, 0))
    assert mac_ceiling.model_macs(model) == oc * ic * scattered_products(in_hw, k, s, out_hw,
                                                                          same)


def test_unet_counts_its_transpose_conv():
    """The zoo's U-Net: its TRANSPOSE_CONV's products are part of the net's count."""
    model = TFLiteModel.load(zoo.build("unet"))
    per_op = mac_ceiling.macs_by_op(model)
    assert per_op.get("TRANSPOSE_CONV", 0) > 0, per_op


def test_a_net_counts_every_layer():
    """MobileNetV1 0.25's 28 convolutions and its dense layer, as published for the
    architecture at 128 x 128 (14 M multiply-accumulates), a few taps of padding fewer."""
    macs = mac_ceiling.model_macs(TFLiteModel.load(zoo.build("mobilenet_v1_0.25")))
    assert 13.0e6 < macs < 14.0e6


@pytest.mark.parametrize("name, expected", [
    ("batch_matmul", 1 * 2 * 16 * 20 * 24),  # (1, 2, 16, 24) x (1, 2, 24, 20)
    ("batch_matmul_adj", 1 * 2 * 17 * 20 * 24),  # (1, 2, 17, 24) x (1, 1, 20, 24)^T
])
def test_batch_matmul_counts_output_times_depth(name, expected):
    """A BATCH_MATMUL's products: every output element sums depth of them, the depth read
    from the side adj_x / adj_y put it on (the right operand's one head broadcast)."""
    assert mac_ceiling.macs_by_op(TFLiteModel.load(zoo.build(name))) == {"BATCH_MATMUL": expected}


# (blocks, heads, sequence, head width) of the zoo's attention nets (tvm_armq/zoo/__init__.py):
# ViT's 64 patches and class token, width 64 in 4 heads; BERT's 32 tokens, width 64 in 4 heads
ATTENTION = {"vit": (2, 4, 65, 16), "bert_encoder": (2, 4, 32, 16)}


@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_attention_nets_count_their_batch_matmuls(name):
    """The attention nets' Q.K^T and P.V are part of their count: per block and head,
    sequence x sequence scores of head-width products each, and sequence x head-width
    outputs of sequence products each."""
    blocks, heads, seq, width = ATTENTION[name]
    per_op = mac_ceiling.macs_by_op(TFLiteModel.load(zoo.build(name)))
    assert per_op["BATCH_MATMUL"] == blocks * heads * 2 * seq * seq * width, per_op
    assert per_op["FULLY_CONNECTED"] > 0, per_op


def test_mobilevit_counts_its_batch_matmuls():
    per_op = mac_ceiling.macs_by_op(TFLiteModel.load(zoo.build("mobilevit")))
    assert per_op.get("BATCH_MATMUL", 0) > 0, per_op
