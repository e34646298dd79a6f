"""Exact NumPy references for the quantized layers the schedules compute.

Each function is the arithmetic TFLite's reference kernels do, written plainly:
int32 accumulation of (input - input_zero_point) * weight, + bias, requantized
per output channel by ``multiply_by_quantized_multiplier``, + output zero point,
clamped to the activation range. The fast paths in this folder are held to them
bit for bit.
"""

from __future__ import annotations

import numpy as np

from tvm_armq.intrinsics.requant import (INT32_MAX, INT32_MIN, multiply_by_quantized_multiplier,
                                         rounding_divide_by_pot,
                                         saturating_rounding_doubling_high_mul)


def round_half_away(v) -> np.ndarray:
    """C's ``round`` (TFLite's ``TfLiteRound``) of float32 values, exact: the + 0.5 is done
    in float64, where it cannot round (in float32, 0.49999997 + 0.5 would become 1.0)."""
    v = np.asarray(v, np.float64)
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def requantize(acc, multiplier, shift, out_zp: int, lo: int, hi: int, out_dtype: str):
    """int32 accumulators (last axis = output channel) -> clamped ``out_dtype``."""
    r = multiply_by_quantized_multiplier(acc, multiplier, shift).astype(np.int64) + out_zp
    return np.clip(r, lo, hi).astype(out_dtype)


def conv2d_nhwc(data, weight_hwio, bias, *, in_zp: int, strides=(1, 1), dilation=(1, 1),
                padding=(0, 0, 0, 0), groups: int = 1, w_zp: int = 0):
    """int32 accumulators of a quantized NHWC conv2d (weights HWIO, zero point ``w_zp``:
    0 for int8's symmetric weights; legacy uint8 models have any in 0..255).

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
    wt = weight_hwio.astype(np.int64) - w_zp
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


def transpose_conv_nhwc(data, weight_ohwi, bias, out_hw, *, in_zp: int, strides, pad_top: int,
                        pad_left: int):
    """int32 accumulators of TFLite's quantized TRANSPOSE_CONV, its own way: every input
    pixel scatters (x - zp) * w into the output pixels its taps land on (TFLite's weights
    are [out_c, kh, kw, in_c], symmetric), then the bias is added."""
    n, h, w, _ = data.shape
    oc, kh, kw, _ = weight_ohwi.shape
    out_h, out_w = out_hw
    acc = np.zeros((n, out_h + kh + strides[0] * h, out_w + kw + strides[1] * w, oc), np.int64)
    x = data.astype(np.int64) - in_zp
    wt = weight_ohwi.astype(np.int64)
    for ky in range(kh):
        for kx in range(kw):
            contrib = x @ wt[:, ky, kx, :].T  # [n, h, w, oc]
            rows = ky + strides[0] * np.arange(h)  # output row + pad_top
            cols = kx + strides[1] * np.arange(w)
            acc[:, rows[:, None], cols[None, :], :] += contrib
    acc = acc[:, pad_top:pad_top + out_h, pad_left:pad_left + out_w] + np.asarray(bias, np.int64)
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


# ----------------------------------------------------------------------------- bf16
# The opt-in bf16 path for float layers (``conv2d_bf16``) is not integer arithmetic, so its
# reference models the hardware's rounding exactly instead: operands rounded to bf16 as the
# compiled code rounds them, products and sums rounded as BFMMLA rounds them.
_F32_MIN_NORMAL = 2.0 ** -126


def _two_sum(a, b):
    """float64 s, e with s + e == a + b exactly (Knuth's TwoSum; no overflow assumed)."""
    s = a + b
    bv = s - a
    return s, (a - (s - bv)) + (b - bv)


def round_odd_f32(s, e=0.0) -> np.ndarray:
    """x = s + e (float64 arrays, exact; |e| at most half an ulp of s, as ``_two_sum`` gives)
    rounded to float32 as BFMMLA rounds (FPCR.EBF = 0): round to odd (an inexact result is
    the neighbour whose last mantissa bit is 1), results below 2**-126 flushed to zero."""
    s = np.asarray(s, np.float64)
    e = np.broadcast_to(np.asarray(e, np.float64), s.shape)
    f = s.astype(np.float32)
    assert np.isfinite(f).all(), "bf16 reference: float32 overflow"
    t = np.where(np.abs(f.astype(np.float64)) > np.abs(s), np.nextafter(f, np.float32(0)), f)
    exact = (t.astype(np.float64) == s) & (e == 0)
    odd = (t.view(np.uint32) & 1).astype(bool)
    # Inexact: x lies strictly between t (s truncated to float32) and the float32 next to
    # it on x's side: away from zero when s itself is not a float32, else e's side.
    side = np.where(t.astype(np.float64) == s, np.sign(e), np.sign(s))
    side = np.where(side == 0, 1.0, side)  # exact results keep t: any direction will do
    neighbour = np.nextafter(t, (side * np.inf).astype(np.float32))
    r = np.where(exact | odd, t, neighbour)
    return np.where(np.abs(r) < _F32_MIN_NORMAL, np.float32(0), r).astype(np.float32)


def bfmmla_matmul(a, b) -> np.ndarray:
    """C[M, N] = A[M, K] · B[N, K]^T (bf16 operands) exactly as the bfmmla GEMM computes it:
    C starts at 0 and takes the pairs (k, k+1) of K in ascending order (K zero-padded to
    even; the block padding of the packed operands adds pairs of zeros, which change
    nothing), ``C = R(C + R(R(a_k b_k) + R(a_k+1 b_k+1)))``, R = ``round_odd_f32``;
    denormal operands are flushed to zero first."""
    def operand(x):
        x = np.asarray(x).astype(np.float64)
        x = np.where(np.abs(x) < _F32_MIN_NORMAL, 0.0, x)
        return np.pad(x, ((0, 0), (0, x.shape[1] % 2)))

    fa, fb = operand(a), operand(b)
    acc = np.zeros((fa.shape[0], fb.shape[0]), np.float32)
    for k in range(0, fa.shape[1], 2):
        # a product of two bf16 (8-bit significands) is exact in float64
        p0 = round_odd_f32(fa[:, None, k] * fb[None, :, k])
        p1 = round_odd_f32(fa[:, None, k + 1] * fb[None, :, k + 1])
        pair = round_odd_f32(*_two_sum(p0.astype(np.float64), p1.astype(np.float64)))
        acc = round_odd_f32(*_two_sum(acc.astype(np.float64), pair.astype(np.float64)))
    return acc


def im2col_nhwc(x, kh: int, kw: int, *, strides=(1, 1), dilation=(1, 1),
                padding=(0, 0, 0, 0), pad_value=0) -> np.ndarray:
    """[n, h, w, c] -> [n, out_h, out_w, kh, kw, c]: each output pixel's receptive field,
    padded pixels = ``pad_value``; padding is (top, left, bottom, right)."""
    n, h, w, c = x.shape
    pt, pl, pb, pr = padding
    (sh, sw), (dh, dw) = strides, dilation
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=pad_value)
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    cols = np.empty((n, oh, ow, kh, kw, c), x.dtype)
    for ky in range(kh):
        for kx in range(kw):
            cols[:, :, :, ky, kx] = xp[:, ky * dh: ky * dh + sh * (oh - 1) + 1: sh,
                                       kx * dw: kx * dw + sw * (ow - 1) + 1: sw, :]
    return cols


def conv2d_bf16_nhwc(data, weight_hwio, bias, *, strides=(1, 1), dilation=(1, 1),
                     padding=(0, 0, 0, 0), groups: int = 1, act_range=None,
                     matmul=bfmmla_matmul) -> np.ndarray:
    """float32 [n, out_h, out_w, out_c] of the bf16 conv2d (``schedules.conv2d_bf16``):
    input and weights rounded to bf16 (nearest even), A · B^T per group by ``matmul``
    (default: the bfmmla arithmetic) over K in (ky, kx, c) order, then + bias and the clamp
    to ``act_range`` = (lo, hi) (either None: open) in IEEE float32."""
    from tvm_armq.schedules.conv2d_bf16 import to_bf16

    kh, kw, cg, o = weight_hwio.shape
    cols = im2col_nhwc(to_bf16(data), kh, kw, strides=strides, dilation=dilation,
                       padding=padding, pad_value=0)
    n, oh, ow = cols.shape[:3]
    w = to_bf16(weight_hwio)
    og = o // groups
    out = np.empty((n, oh, ow, o), np.float32)
    for g in range(groups):
        a = cols[..., g * cg:(g + 1) * cg].reshape(n * oh * ow, kh * kw * cg)
        b = w[..., g * og:(g + 1) * og].reshape(kh * kw * cg, og).T
        out[..., g * og:(g + 1) * og] = matmul(a, b).reshape(n, oh, ow, og)
    return clamp_f32(out + np.asarray(bias, np.float32), act_range)


def clamp_f32(y, act_range):
    """fp32 ``y`` clamped to ``act_range`` = (lo, hi), either side None for open."""
    lo, hi = act_range if act_range is not None else (None, None)
    if hi is not None:
        y = np.minimum(y, np.float32(hi))
    if lo is not None:
        y = np.maximum(y, np.float32(lo))
    return y


# ------------------------------------------------- int8 element-wise, pooling, mean, softmax
# TFLite's reference kernels for 8-bit ADD, MUL, PRELU, MEAN, AVERAGE_POOL_2D, QUANTIZE
# (8-bit input) and SOFTMAX, written plainly over int64 NumPy arrays. The integer parameters (multipliers,
# shifts) are TFLite's Prepare results: ``schedules.int8_ops.*_params`` computes them, and
# its dataclasses' fields are these functions' keyword arguments.
def _clip_to(values, lo: int, hi: int, out_dtype: str) -> np.ndarray:
    return np.clip(np.asarray(values, np.int64), lo, hi).astype(out_dtype)


def _full_range(out_dtype: str) -> tuple[int, int]:
    info = np.iinfo(out_dtype)
    return int(info.min), int(info.max)


def _mbqm(x, multiplier: int, shift: int) -> np.ndarray:
    return multiply_by_quantized_multiplier(x, multiplier, shift).astype(np.int64)


def rescale_add_input(x, *, zp: int, left_shift: int, multiplier: int, shift: int):
    """One input of TFLite's 8-bit ADD on the common scale: ``M((x - zp) << left_shift)``."""
    return _mbqm((np.asarray(x, np.int64) - zp) << left_shift, multiplier, shift)


def broadcast_add(a, b, *, a_zp: int, b_zp: int, out_zp: int, left_shift: int,
                  a_multiplier: int, a_shift: int, b_multiplier: int, b_shift: int,
                  out_multiplier: int, out_shift: int, act_range, out_dtype: str = "int8",
                  op: str = "ADD"):
    """TFLite's 8-bit ADD: each input minus its zero point, shifted left by ``left_shift``
    and rescaled to the common scale, the sum rescaled to the output; NumPy broadcasting.
    ``op`` "SUB" takes the difference, "SQUARED_DIFFERENCE" its square (int32 in TFLite:
    it fits)."""
    a = rescale_add_input(a, zp=a_zp, left_shift=left_shift, multiplier=a_multiplier,
                          shift=a_shift)
    b = rescale_add_input(b, zp=b_zp, left_shift=left_shift, multiplier=b_multiplier,
                          shift=b_shift)
    total = a + b if op == "ADD" else a - b
    if op == "SQUARED_DIFFERENCE":
        total = total * total
    return _clip_to(_mbqm(total, out_multiplier, out_shift) + out_zp, *act_range, out_dtype)


def broadcast_mul(a, b, *, a_zp: int, b_zp: int, out_zp: int, multiplier: int, shift: int,
                  act_range, out_dtype: str = "int8"):
    """TFLite's 8-bit MUL: (a - zp_a) * (b - zp_b) rescaled to the output; broadcasting."""
    product = (np.asarray(a, np.int64) - a_zp) * (np.asarray(b, np.int64) - b_zp)
    return _clip_to(_mbqm(product, multiplier, shift) + out_zp, *act_range, out_dtype)


def prelu(x, alpha, *, in_zp: int, alpha_zp: int, out_zp: int, identity_multiplier: int,
          identity_shift: int, alpha_multiplier: int, alpha_shift: int,
          out_dtype: str = "int8"):
    """TFLite's 8-bit PRELU: x - zp rescaled to the output where it is >= 0, else its
    product with alpha - zp_alpha rescaled by the other factor; alpha broadcasts."""
    v = np.asarray(x, np.int64) - in_zp
    a = np.broadcast_to(np.asarray(alpha, np.int64) - alpha_zp, v.shape)
    r = np.where(v >= 0, _mbqm(v, identity_multiplier, identity_shift),
                 _mbqm(v * a, alpha_multiplier, alpha_shift))
    return _clip_to(r + out_zp, *_full_range(out_dtype), out_dtype)


def mean(x, axes, keepdims: bool, *, in_zp: int, out_zp: int, multiplier: int, shift: int,
         out_dtype: str = "int8"):
    """TFLite's 8-bit MEAN (``QuantizedMeanOrSum``): the sum over ``axes`` minus
    zp_in * n, rescaled by the multiplier that already holds 1/n, clamped to the dtype."""
    x = np.asarray(x, np.int64)
    axes = tuple(sorted({int(a) % x.ndim for a in axes}))
    count = int(np.prod([x.shape[a] for a in axes]))
    shifted = x.sum(axis=axes, keepdims=keepdims) - in_zp * count
    return _clip_to(_mbqm(shifted, multiplier, shift) + out_zp, *_full_range(out_dtype),
                    out_dtype)


def average_pool(x, pool, strides, padding, act_range, out_dtype: str = "int8"):
    """TFLite's 8-bit AVERAGE_POOL_2D of NHWC ``x``: per window, the sum of the input pixels
    inside the image divided by their count, rounded half away from zero (C's truncating
    division of acc +- count/2), then clamped. ``padding`` = (top, left, bottom, right)."""
    x = np.asarray(x, np.int64)
    _, h, w, _ = x.shape
    (kh, kw), (sh, sw) = pool, strides
    pt, pl, pb, pr = padding
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    out = np.empty((x.shape[0], oh, ow, x.shape[3]), np.int64)
    for i in range(oh):
        y0 = i * sh - pt
        for j in range(ow):
            x0 = j * sw - pl
            window = x[:, max(y0, 0):min(y0 + kh, h), max(x0, 0):min(x0 + kw, w), :]
            count = window.shape[1] * window.shape[2]
            acc = window.sum(axis=(1, 2))
            rounded = (np.abs(acc) + count // 2) // count  # truncation of a positive value
            out[:, i, j, :] = np.where(acc > 0, rounded, -rounded)
    return _clip_to(out, *act_range, out_dtype)


def requantize_tensor(x, *, in_zp: int, out_zp: int, multiplier: int, shift: int,
                      out_dtype: str = "int8"):
    """TFLite's QUANTIZE of a quantized tensor (``reference_ops::Requantize``)."""
    rescaled = _mbqm(np.asarray(x, np.int64) - in_zp, multiplier, shift)
    return _clip_to(rescaled + out_zp, *_full_range(out_dtype), out_dtype)


# gemmlowp's fixed-point arithmetic on int32 values held in int64 arrays. A QM.N number is
# an int32 with N = 31 - M fractional bits; products are SaturatingRoundingDoublingHighMul.
def _wrap32(v) -> np.ndarray:
    """Two's complement wrap-around of int64 values to int32 (int32 additions in C++)."""
    return ((np.asarray(v, np.int64) - INT32_MIN) & 0xFFFFFFFF) + INT32_MIN


def _fx_mul(a, b) -> np.ndarray:
    return saturating_rounding_doubling_high_mul(a, b).astype(np.int64)


def _saturating_shl(v, k: int) -> np.ndarray:
    """SaturatingRoundingMultiplyByPOT<k>, k > 0: v * 2**k, saturated to int32."""
    v = np.asarray(v, np.int64)
    limit = (1 << (31 - k)) - 1
    return np.where(v > limit, INT32_MAX, np.where(v < -limit, INT32_MIN, v << k))


_EXP_MINUS_ONE_EIGHTH = 1895147668  # exp(-1/8), Q0.31
_ONE_THIRD = 715827883  # 1/3, Q0.31
# exp(-2**e) in Q0.31, for the bits of the input's magnitude of weight 2**e
_EXP_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308),
               (2, 39332535), (3, 720401), (4, 242))


def exp_on_negative_values(a, integer_bits: int = 5) -> np.ndarray:
    """gemmlowp's ``exp_on_negative_values``: exp(a) in Q0.31 for a <= 0 in Q``integer_bits``.

    a = (a mod 1/4) - 1/4 + (a multiple of 1/4): exp of the first part by a Taylor
    expansion around -1/8, then one multiplication by exp(-2**e) per set bit of the rest."""
    a = np.asarray(a, np.int64)
    frac_bits = 31 - integer_bits
    quarter = 1 << (frac_bits - 2)
    rem = (a & (quarter - 1)) - quarter  # in [-1/4, 0)
    x = _saturating_shl(rem, integer_bits) + (1 << 28)  # Q0.31, plus 1/8
    x2 = _fx_mul(x, x)
    x3 = _fx_mul(x2, x)
    x4 = _fx_mul(x2, x2)
    poly = rounding_divide_by_pot(
        _wrap32(_fx_mul(_wrap32(rounding_divide_by_pot(x4, 2) + x3), _ONE_THIRD) + x2), 1)
    result = _wrap32(_EXP_MINUS_ONE_EIGHTH
                     + _fx_mul(_EXP_MINUS_ONE_EIGHTH, _wrap32(x + poly)))
    multiple = _wrap32(rem - a)  # the multiple of 1/4 that was split off, >= 0
    for e, factor in _EXP_BARREL:
        if integer_bits > e:
            result = np.where(multiple & (1 << (frac_bits + e)), _fx_mul(result, factor),
                              result)
    return np.where(a == 0, INT32_MAX, result)


_48_OVER_17, _MINUS_32_OVER_17 = 1515870810, -1010580540  # Q2.29
_Q2_29_ONE = 1 << 29


def one_over_one_plus_x(a) -> np.ndarray:
    """gemmlowp's ``one_over_one_plus_x_for_x_in_0_1``: 1 / (1 + a) in Q0.31, a in [0, 1)
    Q0.31; Newton-Raphson on half the denominator, in Q2.29."""
    a = np.asarray(a, np.int64)
    total = a + INT32_MAX
    half = np.where(total >= 0, (total + 1) // 2, -((1 - total) // 2))  # RoundingHalfSum
    x = _wrap32(_48_OVER_17 + _fx_mul(half, _MINUS_32_OVER_17))  # first estimate, Q2.29
    for _ in range(3):
        x = _wrap32(x + _saturating_shl(_fx_mul(x, _wrap32(_Q2_29_ONE - _fx_mul(half, x))), 2))
    return _saturating_shl(x, 1)


def scale_softmax_diff(diff, multiplier: int, left_shift: int) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplierGreaterThanOne of the input differences:
    SRDHM(diff * 2**left_shift (int32), multiplier), Q5.26."""
    return _fx_mul(_wrap32(np.asarray(diff, np.int64) << left_shift), multiplier)


def softmax(x, *, input_multiplier: int, input_left_shift: int, diff_min: int,
            out_dtype: str = "int8"):
    """TFLite's reference SOFTMAX for 8-bit input and output, over the last axis."""
    x = np.asarray(x, np.int64)
    diff = x - x.max(axis=-1, keepdims=True)
    used = diff >= diff_min
    exps = np.where(used, exp_on_negative_values(
        scale_softmax_diff(diff, input_multiplier, input_left_shift)), 0)
    total = _wrap32(rounding_divide_by_pot(exps, 12).sum(axis=-1, keepdims=True))  # Q12.19
    zeros = 32 - np.frexp(total.astype(np.float64))[1]  # leading zeros of a positive int32
    recip = one_over_one_plus_x(_wrap32(((total << zeros) & 0xFFFFFFFF) - (1 << 31)))
    lo, hi = _full_range(out_dtype)
    exponent = (12 - zeros) + 31 - 8 * np.dtype(out_dtype).itemsize
    if exponent.max() > 31:
        raise ValueError("softmax: a row's sum of exponentials needs a shift past 31 bits, "
                         "where TFLite's reference kernel aborts")
    out = rounding_divide_by_pot(_fx_mul(recip, exps), exponent) + lo
    return _clip_to(np.where(used, out, lo), lo, hi, out_dtype)


# --------------------------------------------------------------- hybrid (dynamic range)
# TFLite's hybrid kernels (float32 activations, int8 weights): each quantization group of
# the input (a row of a FULLY_CONNECTED's [rows, K] input, a whole image of a CONV_2D) is
# quantized to int8 at run time, multiplied on integers, and the int32 sums scaled back to
# float32. Every float operation below is one IEEE float32 (or float64, where TFLite
# computes in double) operation in TFLite's order, none fused: measured on BUILTIN_REF
# (tests/test_hybrid.py).
HYBRID_SYMMETRIC_MAX = 127          # symmetric: q in [-127, 127], zero point 0
HYBRID_ASYMMETRIC_RANGE = (-128, 127)


def hybrid_quantize(x, symmetric: bool):
    """(q int32 [groups, n], scale float32 [groups], zero point int32 [groups]) of float32
    ``x`` [groups, n], as TFLite's ``SymmetricQuantizeFloats`` / ``AsymmetricQuantizeFloats``.

    Symmetric: range = max|x|; scale = range / 127 and its inverse 127 / range, in float32;
    q = round(x * inverse) clamped to +-127 (all zero: scale 1). Asymmetric: rmin = min(0,
    min x), rmax = max(0, max x) in float32, their difference in float32 (the installed
    TFLite subtracts before widening: measured), the scale that difference / 255 in double,
    the zero point the nearer of the two ends' in double, rounded and clamped to the int8
    range; q = round(x * (1 / scale)) + zp, the product in float32 and rounded before the
    zero point is added (measured on ties: x / scale = -2.5 with zp -28 gives -31), clamped
    (all zero: scale 1, zp 0). ``round`` is C's, half away from zero."""
    x = np.asarray(x, np.float32)
    groups = x.shape[0]
    q = np.zeros(x.shape, np.int32)
    scale = np.ones(groups, np.float32)
    zp = np.zeros(groups, np.int32)
    lo, hi = HYBRID_ASYMMETRIC_RANGE
    for g in range(groups):
        v = x[g]
        if symmetric:
            rng = np.float32(max(abs(v.min()), abs(v.max())))
            if rng == 0:
                continue
            scale[g] = rng / np.float32(HYBRID_SYMMETRIC_MAX)
            inv = np.float32(HYBRID_SYMMETRIC_MAX) / rng
            q[g] = np.clip(round_half_away(v * inv), -HYBRID_SYMMETRIC_MAX,
                           HYBRID_SYMMETRIC_MAX)
            continue
        rmin = min(np.float32(0), v.min())
        rmax = max(np.float32(0), v.max())
        if rmin == rmax:
            continue
        s = np.float64(np.float32(rmax - rmin)) / np.float64(hi - lo)
        from_min, from_max = lo - np.float64(rmin) / s, hi - np.float64(rmax) / s
        err_min = abs(lo) + abs(np.float64(rmin) / s)
        err_max = abs(hi) + abs(np.float64(rmax) / s)
        z = from_min if err_min < err_max else from_max
        zp[g] = lo if z <= lo else hi if z >= hi else int(round_half_away(z))
        scale[g] = np.float32(s)
        inv = np.float32(1) / scale[g]
        q[g] = np.clip(round_half_away(v * inv) + zp[g], lo, hi)
    return q, scale, zp


def hybrid_scale(acc, in_scale, w_scale, bias, *, channel_first: bool, act_range=None):
    """float32 outputs of a hybrid layer from its int32 accumulators ``acc`` [groups, rows,
    out_c] (sum of q * w, the zero point's term already subtracted), the input scale per
    group, the weight scale per output channel and the float32 bias.

    ``channel_first`` False (FULLY_CONNECTED; CONV_2D with one weight scale): bias +
    acc * (in_scale * w_scale); True (CONV_2D with per-channel scales): acc * w_scale *
    in_scale + bias, left to right. ``act_range``: the fused activation's clamp."""
    a = np.asarray(acc).astype(np.float32)
    s_in = np.asarray(in_scale, np.float32)[:, None, None]
    s_w = np.asarray(w_scale, np.float32)[None, None, :]
    b = np.asarray(bias, np.float32)[None, None, :]
    if channel_first:
        y = (a * s_w) * s_in + b
    else:
        y = b + a * (s_in * s_w)
    return clamp_f32(y, act_range)
