"""Exact NumPy references for the quantized layers the schedules compute.

Each function is the arithmetic TFLite's reference kernels do, written plainly:
int32 accumulation of (input - input_zero_point) * weight, + bias, requantized
per output channel by ``multiply_by_quantized_multiplier``, + output zero point,
clamped to the activation range. The fast paths in this folder are held to them
bit for bit.
"""

from __future__ import annotations

import numpy as np

from tvm_armq.intrinsics.requant import multiply_by_quantized_multiplier


def requantize(acc, multiplier, shift, out_zp: int, lo: int, hi: int, out_dtype: str):
    """int32 accumulators (last axis = output channel) -> clamped ``out_dtype``."""
    r = multiply_by_quantized_multiplier(acc, multiplier, shift).astype(np.int64) + out_zp
    return np.clip(r, lo, hi).astype(out_dtype)


def conv2d_nhwc(data, weight_hwio, bias, *, in_zp: int, strides=(1, 1), dilation=(1, 1),
                padding=(0, 0, 0, 0), groups: int = 1):
    """int32 accumulators of a quantized NHWC conv2d (weights HWIO, symmetric: zero point 0).

    ``padding`` is (top, left, bottom, right); padded pixels hold ``in_zp``, i.e. zero
    after the zero point is subtracted, as in TFLite. ``weight_hwio`` has
    ``in_channels // groups`` input channels.
    """
    n, h, w, c = data.shape
    kh, kw, cg, o = weight_hwio.shape
    pt, pl, pb, pr = padding
    sh, sw = strides
    dh, dw = dilation
    x = np.pad(data.astype(np.int32) - in_zp, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    og = o // groups
    acc = np.zeros((n, oh, ow, o), np.int64)
    wt = weight_hwio.astype(np.int64)
    for ky in range(kh):
        for kx in range(kw):
            patch = x[:, ky * dh: ky * dh + sh * (oh - 1) + 1: sh,
                      kx * dw: kx * dw + sw * (ow - 1) + 1: sw, :].astype(np.int64)
            for g in range(groups):
                acc[..., g * og:(g + 1) * og] += (
                    patch[..., g * cg:(g + 1) * cg] @ wt[ky, kx, :, g * og:(g + 1) * og])
    acc += np.asarray(bias, np.int64)
    assert np.abs(acc).max(initial=0) < 2 ** 31, "int32 accumulator overflow in the reference"
    return acc.astype(np.int32)


def dense(data, weight_kn, bias, *, in_zp: int):
    """int32 accumulators of a quantized fully connected layer (weights [K, N], symmetric)."""
    acc = (data.astype(np.int64) - in_zp) @ weight_kn.astype(np.int64)
    return (acc + np.asarray(bias, np.int64)).astype(np.int32)


def depthwise_conv2d_nhwc(data, weight, bias, *, in_zp: int, multiplier: int = 1,
                          strides=(1, 1), dilation=(1, 1), padding=(0, 0, 0, 0)):
    """int32 accumulators of a quantized NHWC depthwise conv2d, as TFLite's DEPTHWISE_CONV_2D.

    ``weight`` as TFLite stores it, [1, kh, kw, C * multiplier] (or [kh, kw, C * multiplier]),
    symmetric (zero point 0); output channel ``c * multiplier + m`` reads input channel
    ``c``. ``padding`` is (top, left, bottom, right); padded pixels hold ``in_zp``, i.e.
    zero after the zero point is subtracted.
    """
    n, h, w, c = data.shape
    oc = c * multiplier
    wt = np.asarray(weight).astype(np.int64)
    kh, kw = wt.shape[-3], wt.shape[-2]
    wt = wt.reshape(kh, kw, oc)
    pt, pl, pb, pr = padding
    sh, sw = strides
    dh, dw = dilation
    x = np.pad(data.astype(np.int64) - in_zp, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    x = np.repeat(x, multiplier, axis=-1)  # channel c*M + m <- input channel c
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    acc = np.zeros((n, oh, ow, oc), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            acc += x[:, ky * dh: ky * dh + sh * (oh - 1) + 1: sh,
                     kx * dw: kx * dw + sw * (ow - 1) + 1: sw, :] * wt[ky, kx]
    acc += np.asarray(bias, np.int64)
    assert np.abs(acc).max(initial=0) < 2 ** 31, "int32 accumulator overflow in the reference"
    return acc.astype(np.int32)
