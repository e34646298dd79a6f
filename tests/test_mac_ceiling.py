"""The multiply-accumulates the ceiling benchmark (scripts/mac_ceiling.py) counts per layer,
against a count made another way: every (output pixel, tap) pair of the layer enumerated in
2-D, its padding, strides and dilation read by ``tflite_layers.read_layer``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import mac_ceiling  # noqa: E402
from tvm_armq import tflite_layers, zoo  # noqa: E402
from tvm_armq.tflite_model import TFLiteModel  # noqa: E402


def enumerated_macs(layer: tflite_layers.QuantLayer) -> int:
    """Products of the layer's direct algorithm whose input is inside the tensor."""
    if layer.op == "FULLY_CONNECTED":  # [rows, N] = [rows, K] x [K, N]
        rows, n_out = layer.output_shape
        return rows * n_out * layer.weight.shape[-1]
    n, out_h, out_w, out_c = layer.output_shape
    in_h, in_w = layer.input_shape[1:3]
    kh, kw = layer.weight.shape[1:3]
    top, left = layer.padding[:2]
    (sh, sw), (dh, dw) = layer.strides, layer.dilation
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
    layer = tflite_layers.read_layer(model)
    expected = enumerated_macs(layer)
    assert mac_ceiling.model_macs(model) == expected
    if any(layer.padding):  # taps on the padding are left out of the count
        n, out_h, out_w, out_c = layer.output_shape
        kh, kw = layer.weight.shape[1:3]
        per_tap = layer.weight.shape[-1] if layer.op == "CONV_2D" else 1
        assert expected < n * out_h * out_w * out_c * kh * kw * per_tap


def test_a_net_counts_every_layer():
    """MobileNetV1 0.25's 28 convolutions and its dense layer, as published for the
    architecture at 128 x 128 (14 M multiply-accumulates), a few taps of padding fewer."""
    macs = mac_ceiling.model_macs(TFLiteModel.load(zoo.build("mobilenet_v1_0.25")))
    assert 13.0e6 < macs < 14.0e6
