"""TRANSPOSE_CONV on the host: TFLite's scatter (``reference.transpose_conv_nhwc``) against
TFLite's own kernel, and the gather the tvm_armq kernel computes (zero insertion, then a
stride-1 convolution with the flipped kernel: ``schedules.transpose_conv``) against the
scatter, bit for bit, over a sweep of kernels, strides, paddings and output sizes.
The compiled kernel runs on the device in ``tests/test_op_coverage.py``."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_armq.intrinsics import requant
from tvm_armq.schedules import reference as ref
from tvm_armq.schedules import transpose_conv as tc
from tvm_armq.tflite_layers import ACT_NONE, ACT_RELU, activation_range
from tvm_armq.tflite_model import TFLiteModel
from tvm_armq.tflite_writer import single_op_model

# (in_hw, kernel, stride, same, extra): ``extra`` output rows and columns past the size of
# TRANSPOSE_CONV's usual output (TFLite takes an output_shape whose conv back to the input
# gives the input's size: for SAME one stride less one row, for VALID up to stride - 1 more)
GEOMETRIES = [((4, 5), (3, 3), (2, 2), True, 0), ((4, 5), (3, 3), (2, 2), False, 0),
              ((3, 3), (2, 2), (2, 2), True, 0), ((5, 4), (1, 1), (2, 2), True, 0),
              ((3, 4), (4, 4), (2, 2), True, 0), ((3, 3), (3, 3), (1, 1), True, 0),
              ((3, 3), (3, 3), (3, 3), False, 0), ((4, 3), (3, 2), (2, 2), False, 1),
              ((2, 3), (5, 5), (2, 2), True, -1), ((3, 3), (2, 3), (3, 3), False, 2),
              ((4, 4), (3, 3), (2, 1), True, 0)]


def _out_size(n, k, s, same, extra):
    return (n * s if same else (n - 1) * s + k) + extra


def transpose_conv_model(x_shape, w, bias, out_shape, x_q, w_scales, out_q, strides,
                         same: bool, act: int) -> bytes:
    """A one-op TRANSPOSE_CONV model: int8 input, per-channel int8 weights, int32 bias."""
    import tflite

    def options(b):
        tflite.TransposeConvOptionsStart(b)
        tflite.TransposeConvOptionsAddPadding(b, tflite.Padding.SAME if same
                                              else tflite.Padding.VALID)
        tflite.TransposeConvOptionsAddStrideH(b, strides[0])
        tflite.TransposeConvOptionsAddStrideW(b, strides[1])
        tflite.TransposeConvOptionsAddFusedActivationFunction(b, act)
        return tflite.TransposeConvOptionsEnd(b)

    oc = w.shape[0]
    b_scales = np.float32(x_q[0]) * np.asarray(w_scales, np.float32)
    tensors = [
        dict(shape=(4,), dtype="int32", data=np.asarray(out_shape, np.int32)),
        dict(shape=w.shape, dtype="int8", q=(w_scales, np.zeros(oc, np.int64), 0), data=w),
        dict(shape=x_shape, dtype="int8", q=x_q),
        dict(shape=(oc,), dtype="int32", q=(b_scales, np.zeros(oc, np.int64), 0), data=bias),
        dict(shape=out_shape, dtype="int8", q=out_q),
    ]
    return single_op_model(tflite.BuiltinOperator.TRANSPOSE_CONV, tensors, [0, 1, 2, 3], [4],
                           (tflite.BuiltinOptions.TransposeConvOptions, options), version=4)


def _draw(rng, geometry):
    in_hw, k, s, same, extra = geometry
    ic, oc = int(rng.integers(3, 12)), int(rng.integers(2, 9))
    out_hw = tuple(_out_size(n, kk, ss, same, extra) for n, kk, ss in zip(in_hw, k, s))
    x = rng.integers(-128, 128, (1, *in_hw, ic)).astype(np.int8)
    w = rng.integers(-127, 128, (oc, *k, ic)).astype(np.int8)
    bias = rng.integers(-300, 300, oc).astype(np.int32)
    x_q = (float(np.float32(10 ** rng.uniform(-2, -1))), int(rng.integers(-128, 128)))
    w_scales = (10 ** rng.uniform(-3, -2, oc)).astype(np.float32)
    return x, w, bias, out_hw, x_q, w_scales


def _fitted_out_q(rng, acc, x_q, w_scales):
    """An output quantization that spreads the real outputs over the 8-bit range."""
    real = acc * (x_q[0] * w_scales.astype(np.float64))
    return float(np.float32(max(real.std(), 1e-6) / 40)), int(rng.integers(-20, 20))


def _id(g):
    return f"in{g[0]}_k{g[1]}_s{g[2]}_{'same' if g[3] else 'valid'}{g[4]:+d}".replace(" ", "")


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=[_id(g) for g in GEOMETRIES])
def test_scatter_matches_tflite_and_gather_matches_scatter(geometry):
    rng = np.random.default_rng(GEOMETRIES.index(geometry))
    in_hw, k, s, same, _ = geometry
    x, w, bias, out_hw, x_q, w_scales = _draw(rng, geometry)
    geom = tc.TransposeConvGeometry.tflite(in_hw, out_hw, k, s, same)
    acc = ref.transpose_conv_nhwc(x, w, bias, out_hw, in_zp=x_q[1], strides=s,
                                  pad_top=geom.pad_top, pad_left=geom.pad_left)
    gathered = ref.conv2d_nhwc(tc.zero_insert(x, geom, x_q[1]), tc.flipped_hwio(w), bias,
                               in_zp=x_q[1])
    np.testing.assert_array_equal(gathered, acc)
    out_q = _fitted_out_q(rng, acc, x_q, w_scales)
    for act in (ACT_NONE, ACT_RELU):
        mult, shift = requant.quantize_multipliers(
            np.float64(x_q[0]) * w_scales.astype(np.float64) / np.float64(out_q[0]))
        expected = ref.requantize(acc, mult, shift, out_q[1],
                                  *activation_range(act, *out_q, "int8"), "int8")
        model = transpose_conv_model(x.shape, w, bias, (1, *out_hw, w.shape[0]), x_q, w_scales,
                                     out_q, s, same, act)
        got = TFLiteModel.load(model).reference_outputs([x])[0]
        np.testing.assert_array_equal(expected, got)
        assert len(np.unique(got)) > min(16, got.size // 4), "outputs must vary"
