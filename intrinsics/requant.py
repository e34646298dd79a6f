"""TFLite's requantization arithmetic in NumPy: the reference that ``qmuls`` is held to.

A quantized TFLite kernel accumulates in int32 and then rescales the accumulator by a
real factor (for a convolution, ``in_scale * w_scale / out_scale`` per output channel).
TFLite never multiplies by that real number at run time. Ahead of time it splits it as

    real_scale  ~=  multiplier * 2**(shift - 31),   multiplier in [2**30, 2**31) or 0

(``quantize_multiplier``, TFLite's ``QuantizeMultiplier``), and at run time it computes
``MultiplyByQuantizedMultiplier(acc, multiplier, shift)`` in integers only
(``multiply_by_quantized_multiplier``). TFLite has two compile-time variants of that
function, and both are here:

``rounding="double"`` (TFLite built without ``TFLITE_SINGLE_ROUNDING``, gemmlowp's scheme)
    1. left shift: ``a = x * 2**max(shift, 0)`` in int32 (wraps on overflow, as TFLite's
       ``x * (1 << left_shift)`` does on every compiler it ships with);
    2. ``SaturatingRoundingDoublingHighMul(a, multiplier)``: the high 32 bits of ``2*a*m``,
       rounded half up, i.e. ``round(a * m / 2**31)``; the one overflowing case
       ``a == m == INT32_MIN`` saturates to ``INT32_MAX``;
    3. ``RoundingDivideByPOT(., max(-shift, 0))``: a right shift that rounds half away
       from zero.
    Two roundings happen (steps 2 and 3), so a value can land one step away from the
    correctly rounded ``x * real_scale``; that is the behaviour to reproduce, not to fix.

``rounding="single"`` (TFLite built with ``TFLITE_SINGLE_ROUNDING``)
    ``(x * m + 2**(30 - shift)) >> (31 - shift)`` in int64: one rounding, half up, then
    the int64 result is truncated to int32 (TFLite's ``static_cast<int32_t>``; the
    result fits whenever the scale is sane). TFLite only allows ``shift`` in [-31, 30]
    and ``m >= 0`` here; its ``QuantizeMultiplier`` saturates scales >= 2**30 to that.

Everything is exact: int64 NumPy arithmetic whose intermediate values provably fit
(``|x * m| <= 2**62``), no floating point after ``quantize_multiplier``.
"""

from __future__ import annotations

import math

import numpy as np

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
Q31_ONE = 1 << 31  # 1.0 in the Q0.31 format of the multiplier (not representable in int32)
ROUNDING_MODES = ("double", "single")

# Shifts the arithmetic is defined for. Right shifts stop at 31 because TFLite's
# RoundingDivideByPOT asserts exponent <= 31 (QuantizeMultiplier flushes smaller scales
# to zero instead). Left shifts stop at 31 in double rounding, where TFLite evaluates
# ``x * (1 << left_shift)`` in int32 (32 would be undefined), and at 30 in single rounding
# (TFLite's own DCHECK: the rounding term is 1 << (30 - shift)).
MIN_SHIFT = -31
MAX_SHIFT = {"double": 31, "single": 30}


def check_rounding(rounding: str) -> str:
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"rounding must be one of {ROUNDING_MODES}, got {rounding!r}")
    return rounding


def quantize_multiplier(real_scale: float, rounding: str = "double") -> tuple[int, int]:
    """TFLite's ``QuantizeMultiplier``: ``real_scale ~= multiplier * 2**(shift - 31)``.

    ``multiplier`` is a Q0.31 int32 in [2**30, 2**31) (negative for a negative scale, 0
    for 0), ``shift`` a power of two, positive for scales >= 1. The steps, as TFLite
    takes them:

    * ``frexp`` splits the scale into a fraction in [0.5, 1) and an exponent;
    * the fraction times 2**31 is rounded half away from zero (``TfLiteRound``); when
      that rounds up to 2**31 the multiplier is halved and the shift grows by one;
    * a shift below -31 (scale below about 2**-32) would shift every bit out, so such
      a scale becomes multiplier 0 and shift 0 ("flush to zero");
    * single rounding only: a shift above 30 (scale >= 2**30) saturates to the largest
      representable scale, multiplier 2**31 - 1 with shift 30.

    So double rounding yields shifts in [-31, 1025] (0 after a flush), single rounding
    in [-31, 30]; ``multiply_by_quantized_multiplier`` accepts [-31, 31] and [-31, 30].
    """
    check_rounding(rounding)
    real_scale = float(real_scale)
    if not math.isfinite(real_scale):
        raise ValueError(f"real_scale must be finite, got {real_scale}")
    if real_scale == 0.0:
        return 0, 0
    fraction, shift = math.frexp(real_scale)  # real_scale = fraction * 2**shift
    # fraction * 2**31 is exact (a power-of-two scaling of a double below 2**31), so
    # adding 0.5 before the floor rounds it half away from zero without error.
    scaled = fraction * Q31_ONE
    q_fixed = int(math.copysign(math.floor(abs(scaled) + 0.5), scaled))
    if q_fixed == Q31_ONE:  # the fraction rounded up to 1.0: renormalize
        q_fixed //= 2
        shift += 1
    if shift < MIN_SHIFT:  # every bit would be shifted out: flush to zero
        q_fixed, shift = 0, 0
    if rounding == "single" and shift > MAX_SHIFT["single"]:
        q_fixed, shift = INT32_MAX, MAX_SHIFT["single"]
    return int(q_fixed), int(shift)


def quantize_multipliers(real_scales, rounding: str = "double") -> tuple[np.ndarray, np.ndarray]:
    """``quantize_multiplier`` over an array (per-channel scales): (int32 array, int32 array)."""
    pairs = [quantize_multiplier(s, rounding) for s in np.asarray(real_scales, np.float64).ravel()]
    shape = np.shape(real_scales)
    mult = np.array([p[0] for p in pairs], np.int32).reshape(shape)
    shift = np.array([p[1] for p in pairs], np.int32).reshape(shape)
    return mult, shift


def _wrap_int32(v: np.ndarray) -> np.ndarray:
    """int64 values reduced modulo 2**32 into int32 range (two's complement wrap-around)."""
    return ((v - INT32_MIN) & 0xFFFFFFFF) + INT32_MIN


def saturating_rounding_doubling_high_mul(a, b) -> np.ndarray:
    """gemmlowp's ``SaturatingRoundingDoublingHighMul`` for int32 arrays, as int64.

    Written the way gemmlowp writes it (a nudge of +-2**30, then a division that truncates
    toward zero), deliberately not the way the TIR lowerings compute it, so that the
    tests compare two independent formulations.
    """
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    num = ab + nudge
    high = np.where(num >= 0, num >> 31, -((-num) >> 31))  # C++ '/' truncates toward 0
    overflow = (a == INT32_MIN) & (b == INT32_MIN)
    return np.where(overflow, INT32_MAX, high)


def rounding_divide_by_pot(x, exponent) -> np.ndarray:
    """gemmlowp's ``RoundingDivideByPOT``: ``x / 2**exponent`` rounded half away from zero."""
    x = np.asarray(x, np.int64)
    exponent = np.asarray(exponent, np.int64)
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def _check_shift(shift: np.ndarray, rounding: str) -> None:
    lo, hi = MIN_SHIFT, MAX_SHIFT[rounding]
    if shift.size and (shift.min() < lo or shift.max() > hi):
        raise ValueError(f"shift must be in [{lo}, {hi}] for {rounding} rounding, "
                         f"got values in [{shift.min()}, {shift.max()}]")


def multiply_by_quantized_multiplier(x, multiplier, shift, rounding: str = "double") -> np.ndarray:
    """TFLite's ``MultiplyByQuantizedMultiplier(x, multiplier, shift)``, elementwise, exact.

    ``x``, ``multiplier`` and ``shift`` broadcast against each other (int32 values; a
    per-channel multiplier is an array). Returns int32. See the module docstring for the
    two rounding modes.
    """
    check_rounding(rounding)
    x = np.asarray(x, np.int64)
    m = np.asarray(multiplier, np.int64)
    shift = np.asarray(shift, np.int64)
    _check_shift(shift, rounding)
    if rounding == "double":
        left = np.maximum(shift, 0)
        right = np.maximum(-shift, 0)
        shifted = _wrap_int32(x << left)  # |x| < 2**31 and left <= 31: fits int64
        out = rounding_divide_by_pot(saturating_rounding_doubling_high_mul(shifted, m), right)
    else:
        total_shift = 31 - shift  # in [1, 62]
        rounder = np.int64(1) << (total_shift - 1)
        out = _wrap_int32((x * m + rounder) >> total_shift)  # static_cast<int32_t>
    return out.astype(np.int32)
