"""Quantized RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR (NHWC, 8-bit) as TIR.

Read this first. Neither op rescales: TFLite interpolates (or picks) the raw 8-bit values,
whatever the input and output quantization (its converter gives them one). What varies
along the output is only where each output row and column reads from, so that is
computed once, at compile time, in NumPy, exactly as TFLite's reference kernels compute
it, and passed to the PrimFunc as small int32 tables; the PrimFunc is integer arithmetic
on the channel axis, in 16-lane vectors.

RESIZE_BILINEAR (``reference_ops::ResizeBilinearInteger``, 10-bit fixed point)
    Per axis: ``scale = (1024 * in + out / 2) / out`` (align_corners:
    ``(1024 * (in - 1) + (out - 1) / 2) / (out - 1)``), C integer division. Output
    position ``i`` reads at ``p = i * scale`` (half_pixel_centers:
    ``i * scale + scale / 2 - 512``); ``lo = max(p / 1024, 0)`` (C division, toward
    zero), ``hi = min((p + 1023) / 1024, in - 1)``, and the far pixel's weight is
    ``w = p - 1024 * lo`` (the near one's ``1024 - w``; ``w`` is negative where p is,
    and then ``lo == hi``). These are ``bilinear_table``'s three columns.
    Eval: ``s = x[lo_y, lo_x] (1024 - w_y)(1024 - w_x) + x[hi_y, lo_x] w_y (1024 - w_x)
    + x[lo_y, hi_x] (1024 - w_y) w_x + x[hi_y, hi_x] w_y w_x``, a number with 20
    fractional bits, rounded half away from zero: ``(s +- 2**19) / 2**20``, C division
    (TFLite's build without TFLITE_SINGLE_ROUNDING; ``tests/test_resize.py`` checks it
    against the installed TFLite). Every term is below 2**31 in magnitude (|x| <= 255,
    each weight factor <= 1024 + 512), so int32 arithmetic is exact.
RESIZE_NEAREST_NEIGHBOR (``reference_ops::ResizeNearestNeighbor``)
    Per axis, in float32: ``scale = in / out`` (align_corners: ``(in - 1) / (out - 1)``),
    output ``i`` reads at ``floor((i + offset) * scale)`` (align_corners: rounded half
    away from zero), offset 0.5 for half_pixel_centers else 0, clamped to ``[0, in - 1]``
    (``nearest_table``). Eval: a copy.
"""

from __future__ import annotations

import numpy as np

from .reference import round_half_away

FRACTION_BITS = 10            # TFLite's bilinear positions have 10 fractional bits
ONE = 1 << FRACTION_BITS      # 1.0 in those positions
HALF = ONE // 2
SUM_BITS = 2 * FRACTION_BITS  # two weights multiplied: 20 fractional bits
LO, HI, WEIGHT = range(3)     # the columns of a bilinear table


def _c_div(a, b):
    """C's integer division (truncates toward zero), on NumPy int64 arrays."""
    a = np.asarray(a, np.int64)
    q = np.abs(a) // b
    return np.where(a < 0, -q, q)


def bilinear_table(in_size: int, out_size: int, align_corners: bool,
                   half_pixel: bool) -> np.ndarray:
    """[out_size, 3] int32: (lo, hi, weight of hi) per output position, TFLite's way."""
    if half_pixel and align_corners:
        raise ValueError("RESIZE_BILINEAR: half_pixel_centers and align_corners together "
                         "(TFLite refuses them)")
    if align_corners and out_size > 1:
        scale = (ONE * (in_size - 1) + (out_size - 1) // 2) // (out_size - 1)
    else:
        scale = (ONE * in_size + out_size // 2) // out_size
    i = np.arange(out_size, dtype=np.int64)
    p = i * scale + (scale // 2 - HALF if half_pixel else 0)
    lo = np.maximum(_c_div(p, ONE), 0)
    hi = np.minimum(_c_div(p + ONE - 1, ONE), in_size - 1)
    # TFLite does not clamp lo: where the 10-bit scale rounds up (2 -> 83 rows, asymmetric)
    # its last rows read past the input, memory the output cannot be checked against; here
    # they read the last row
    lo = np.minimum(lo, in_size - 1)
    return np.stack([lo, hi, p - ONE * lo], axis=1).astype(np.int32)


def nearest_table(in_size: int, out_size: int, align_corners: bool,
                  half_pixel: bool) -> np.ndarray:
    """[out_size] int32: the input position each output position copies, TFLite's way."""
    f = np.float32
    if align_corners and out_size > 1:
        scale = f(in_size - 1) / f(out_size - 1)
    else:
        scale = f(in_size) / f(out_size)
    at = (np.arange(out_size, dtype=np.float32) + f(0.5 if half_pixel else 0.0)) * scale
    if align_corners:
        pos = round_half_away(at)
    else:
        pos = np.floor(at)
    pos = np.minimum(pos.astype(np.int64), in_size - 1)
    if half_pixel:
        pos = np.maximum(pos, 0)
    return pos.astype(np.int32)


def resize_bilinear(x: np.ndarray, table_y: np.ndarray, table_x: np.ndarray) -> np.ndarray:
    """The NumPy reference of ``resize_bilinear_func`` (int64 arithmetic)."""
    v = x.astype(np.int64)
    ly, hy, wy = table_y.T.astype(np.int64)
    lx, hx, wx = table_x.T.astype(np.int64)
    wy, wx = wy[None, :, None, None], wx[None, None, :, None]

    def at(rows, cols):
        return v[:, rows][:, :, cols]

    total = (at(ly, lx) * (ONE - wy) * (ONE - wx) + at(hy, lx) * wy * (ONE - wx)
             + at(ly, hx) * (ONE - wy) * wx + at(hy, hx) * wy * wx)
    half = 1 << (SUM_BITS - 1)
    return _c_div(np.where(total > 0, total + half, total - half), 1 << SUM_BITS).astype(x.dtype)


def resize_nearest(x: np.ndarray, table_y: np.ndarray, table_x: np.ndarray) -> np.ndarray:
    """The NumPy reference of ``resize_nearest_func``."""
    return x[:, table_y][:, :, table_x]


def resize_bilinear_func(in_shape, out_hw, dtype: str = "int8", *, schedule: bool = True):
    """RESIZE_BILINEAR as a PrimFunc ``(x, table_y, table_x, out)``; the tables are
    ``bilinear_table`` for the output's rows and columns."""
    from tvm import te, tirx

    from .int8_ops import finish_func, elementwise_schedule

    n, _, _, c = in_shape
    out_h, out_w = out_hw
    x = te.placeholder(tuple(in_shape), dtype, "x")
    ty = te.placeholder((out_h, 3), "int32", "table_y")
    tx = te.placeholder((out_w, 3), "int32", "table_x")
    half = tirx.const(1 << (SUM_BITS - 1), "int32")

    def element(b, i, j, ch):
        wy, wx = ty[i, WEIGHT], tx[j, WEIGHT]

        def at(r, q):
            return x[b, r, q, ch].astype("int32")

        total = (at(ty[i, LO], tx[j, LO]) * ((ONE - wy) * (ONE - wx))
                 + at(ty[i, HI], tx[j, LO]) * (wy * (ONE - wx))
                 + at(ty[i, LO], tx[j, HI]) * ((ONE - wy) * wx)
                 + at(ty[i, HI], tx[j, HI]) * (wy * wx))
        # half away from zero: floor((t + 2**19 - 1) / 2**20) for a negative t is C's
        # (t - 2**19) / 2**20, so the sign (t >> 31, -1 or 0) is the whole fixup, and the
        # division an arithmetic shift (ssra + srshr where a test, a select and a
        # truncating division were six instructions per int32x4)
        rounded = (total + (total >> 31) + half) >> SUM_BITS
        return rounded.astype(dtype)

    out = te.compute((n, out_h, out_w, c), element, name="resize_bilinear")
    return finish_func((x, ty, tx, out), schedule, elementwise_schedule)


def resize_nearest_func(in_shape, out_hw, dtype: str = "int8", *, schedule: bool = True):
    """RESIZE_NEAREST_NEIGHBOR as a PrimFunc ``(x, table_y, table_x, out)``; the tables are
    ``nearest_table`` for the output's rows and columns."""
    from tvm import te

    from .int8_ops import finish_func, elementwise_schedule

    n, _, _, c = in_shape
    out_h, out_w = out_hw
    x = te.placeholder(tuple(in_shape), dtype, "x")
    ty = te.placeholder((out_h,), "int32", "table_y")
    tx = te.placeholder((out_w,), "int32", "table_x")
    out = te.compute((n, out_h, out_w, c), lambda b, i, j, ch: x[b, ty[i], tx[j], ch],
                     name="resize_nearest")
    return finish_func((x, ty, tx, out), schedule, elementwise_schedule)
