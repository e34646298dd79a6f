"""TRANSPOSE_CONV on the host: TFLite's scatter (``reference.transpose_conv_nhwc``) against
TFLite's own kernel, and the phase split the tvm_armq kernels compute (one stride-1
convolution per output phase, shuffled into place: ``schedules.transpose_conv``) against
the scatter, bit for bit, over a sweep of kernels, strides, paddings and output sizes.
The compiled kernels run on the device in ``tests/test_op_coverage.py``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tvm_armq.intrinsics import requant
from tvm_armq.schedules import reference as ref
from tvm_armq.schedules import transpose_conv as tc
from tvm_armq.frontend.layers import ACT_NONE, ACT_RELU, activation_range
from tvm_armq.frontend.model import TFLiteModel
from tvm_armq.frontend.writer import single_op_model

# (in_hw, kernel, stride, same, extra): ``extra`` output rows and columns past the size of
# TRANSPOSE_CONV's usual output (TFLite takes an output_shape whose conv back to the input
# gives the input's size: for SAME one stride less one row, for VALID up to stride - 1 more)
GEOMETRIES = [((4, 5), (3, 3), (2, 2), True, 0), ((4, 5), (3, 3), (2, 2), False, 0),
              ((3, 3), (2, 2), (2, 2), True, 0), ((5, 4), (1, 1), (2, 2), True, 0),
              ((3, 4), (4, 4), (2, 2), True, 0), ((3, 3), (3, 3), (1, 1), True, 0),
              ((3, 3), (3, 3), (3, 3), False, 0), ((4, 3), (3, 2), (2, 2), False, 1),
              ((2, 3), (5, 5), (2, 2), True, -1), ((3, 3), (2, 3), (3, 3), False, 2),
              ((4, 4), (3, 3), (2, 1), True, 0), ((3, 4), (2, 2), (3, 3), False, 1),
              ((2, 3), (3, 3), (3, 3), True, -2)]


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
def test_scatter_matches_tflite_and_phases_match_scatter(geometry):
    rng = np.random.default_rng(GEOMETRIES.index(geometry))
    in_hw, k, s, same, _ = geometry
    x, w, bias, out_hw, x_q, w_scales = _draw(rng, geometry)
    geom = tc.TransposeConvGeometry.tflite(in_hw, out_hw, k, s, same)
    acc = ref.transpose_conv_nhwc(x, w, bias, out_hw, in_zp=x_q[1], strides=s,
                                  pad_top=geom.pad_top, pad_left=geom.pad_left)
    np.testing.assert_array_equal(tc.phase_accumulators(x, w, bias, geom, x_q[1]), acc)
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


def _axis_sweep():
    """Every (input size, output size, kernel, stride, padding) of one axis that TFLite's
    Prepare accepts for these sizes: an output size whose SAME or VALID convolution back
    gives the input's size."""
    from tvm_armq.schedules.window import transpose_conv_padding

    for n, k, s, same in itertools.product(range(1, 7), range(1, 6), range(1, 5), (True, False)):
        outs = range((n - 1) * s + 1, n * s + 1) if same else range((n - 1) * s + k, n * s + k)
        for out in outs:
            yield n, out, k, s, transpose_conv_padding(out, k, s, same)


def test_phases_partition_the_taps_and_cover_the_output():
    """Per axis, the phases' taps are the kernel's rows each once (so the convolutions do
    kernel / stride tap products per output row, not kernel), their rows are the output's
    each once, and every tap of a phase reads an input row or the padding it declares."""
    n_axes = 0
    for n, out, k, s, pad in _axis_sweep():
        phases = tc.axis_phases(n, out, k, s, pad)
        rows = sorted(p.phase + s * q for p in phases for q in range(p.count))
        assert rows == list(range(out)), (n, out, k, s, pad)
        taps = sorted(t for p in phases for t in p.taps)
        if out >= s:
            assert taps == list(range(k)), (n, out, k, s, pad)
        for p in phases:
            if not p.taps:
                assert (p.phase + pad) % s >= k  # the phase's first tap is past the kernel
                continue
            assert min(p.pad_before, p.pad_after, p.skip) >= 0
            assert p.conv_size == n + p.pad_before + p.pad_after - len(p.taps) + 1
            assert p.skip + p.count <= p.conv_size
        n_axes += 1
    assert n_axes > 500


def test_phase_split_matches_scatter_over_the_sweep():
    """The phase split's accumulators equal TFLite's scatter for every axis geometry of
    the sweep (square layers, 3 -> 4 channels), bias-only phases included."""
    rng = np.random.default_rng(7)
    for n, out, k, s, pad in _axis_sweep():
        geom = tc.TransposeConvGeometry(n, n, out, out, k, k, (s, s), pad, pad)
        x = rng.integers(-128, 128, (1, n, n, 3)).astype(np.int8)
        w = rng.integers(-127, 128, (4, k, k, 3)).astype(np.int8)
        bias = rng.integers(-300, 300, 4).astype(np.int32)
        acc = ref.transpose_conv_nhwc(x, w, bias, (out, out), in_zp=5, strides=(s, s),
                                      pad_top=pad, pad_left=pad)
        np.testing.assert_array_equal(tc.phase_accumulators(x, w, bias, geom, 5), acc,
                                      err_msg=str((n, out, k, s, pad)))
