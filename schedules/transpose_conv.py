"""Quantized TRANSPOSE_CONV as a zero-insertion kernel followed by the GEMM convolution.

Read this first. TFLite's reference TRANSPOSE_CONV scatters: every input pixel
``(iy, ix)`` adds ``(x - zp_in) * w[oc, ky, kx, ic]`` into the int32 output accumulator
at ``(iy * s - pad_top + ky, ix * s - pad_left + kx)``, for every kernel tap that lands
inside the output; then it adds the bias and requantizes each output channel as CONV_2D
does (``MultiplyByQuantizedMultiplier``, double rounding, per-channel multipliers).

The same sums, read from the output's side, are a stride-1 convolution (a gather):

    P  = the input with s - 1 pixels of zero point inserted between neighbours (rows and
         columns), ``kh - 1 - pad_top`` rows of zero point before it and enough after it
         for the output's size (same for columns)
    out[oy, ox] = sum over taps of (P[oy + t, ox + u] - zp_in) * w[kh-1-t, kw-1-u]

A zero-point pixel contributes nothing after the zero point is subtracted, so the
integer accumulators are TFLite's exactly, whatever the order of the additions (int32
sums do not round). The kernel is flipped in H and W and laid out HWIO at compile time
(``flipped_hwio``); ``zero_insert_func`` builds P; ``schedules.conv2d_gemm`` then runs
the VALID stride-1 convolution on the target's GEMM micro-kernel, with the requantization
fused in its epilogue, as for any CONV_2D.

Rows TFLite's output has beyond the scatter's reach (an ``output_shape`` up to one stride
past it) get the bias only; here they are rows of zero point in P, so the same.

Cost: for stride s, all but 1/s**2 of P's pixels are zero points, and the GEMM multiplies
them anyway; a sub-pixel split (one convolution per output phase) would skip them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .window import transpose_conv_padding


@dataclasses.dataclass(frozen=True)
class TransposeConvGeometry:
    """Where the input lands in the zero-inserted, padded input P (NHWC)."""

    in_h: int
    in_w: int
    out_h: int      # TFLite's output_shape
    out_w: int
    kh: int
    kw: int
    strides: tuple[int, int]
    pad_top: int    # TFLite's padding before the first output row / column
    pad_left: int

    @classmethod
    def tflite(cls, in_hw, out_hw, kernel_hw, strides, same: bool) -> "TransposeConvGeometry":
        """The geometry of a TFLite TRANSPOSE_CONV with SAME or VALID padding."""
        pads = [transpose_conv_padding(o, k, s, same)
                for o, k, s in zip(out_hw, kernel_hw, strides)]
        return cls(*in_hw, *out_hw, *kernel_hw, tuple(strides), *pads)

    @property
    def offset(self) -> tuple[int, int]:
        """P's row and column of the input's first pixel (``k - 1 - pad``; never negative:
        TFLite's padding is below half the kernel)."""
        off = (self.kh - 1 - self.pad_top, self.kw - 1 - self.pad_left)
        if min(off) < 0:
            raise ValueError(f"TRANSPOSE_CONV: padding ({self.pad_top}, {self.pad_left}) "
                             f"reaches past a {self.kh}x{self.kw} kernel")
        return off

    @property
    def padded_hw(self) -> tuple[int, int]:
        """P's height and width: the VALID stride-1 convolution of P gives the output."""
        return self.out_h + self.kh - 1, self.out_w + self.kw - 1


def flipped_hwio(w_ohwi: np.ndarray) -> np.ndarray:
    """TFLite's TRANSPOSE_CONV weights [out_c, kh, kw, in_c] as the HWIO weights of the
    equivalent convolution: taps flipped in H and W."""
    return np.ascontiguousarray(w_ohwi.transpose(1, 2, 3, 0)[::-1, ::-1])


def zero_insert(x: np.ndarray, geom: TransposeConvGeometry, zp: int) -> np.ndarray:
    """P in NumPy (the reference for ``zero_insert_func``)."""
    n, _, _, c = x.shape
    (oy, ox), (ph, pw) = geom.offset, geom.padded_hw
    sh, sw = geom.strides
    p = np.full((n, ph, pw, c), zp, x.dtype)
    rows = oy + sh * np.arange(geom.in_h)
    cols = ox + sw * np.arange(geom.in_w)
    keep_r, keep_c = rows < ph, cols < pw  # input pixels whose taps all fall past the output
    p[:, rows[keep_r][:, None], cols[keep_c][None, :], :] = x[:, keep_r][:, :, keep_c]
    return p


def zero_insert_func(in_shape, geom: TransposeConvGeometry, zp: int, dtype: str = "int8", *,
                     schedule: bool = True):
    """P as a PrimFunc ``(x, p)``: each pixel of P is an input pixel or the zero point,
    decided by its row and column alone; the channel axis is the vector axis."""
    from tvm import te, tirx

    from .int8_ops import finish_func, elementwise_schedule

    n, h, w, c = in_shape
    (oy, ox), (ph, pw) = geom.offset, geom.padded_hw
    sh, sw = geom.strides
    x = te.placeholder((n, h, w, c), dtype, "x")

    def on_grid(i, offset, stride, size):
        d = i - offset
        return tirx.all(d >= 0, tirx.floormod(d, stride) == 0,
                        tirx.floordiv(d, stride) < size)

    def pixel(b, i, j, ch):
        inside = tirx.all(on_grid(i, oy, sh, h), on_grid(j, ox, sw, w))
        src = x[b, tirx.min(tirx.floordiv(tirx.max(i - oy, 0), sh), h - 1),
                tirx.min(tirx.floordiv(tirx.max(j - ox, 0), sw), w - 1), ch]
        return tirx.Select(inside, src, tirx.const(zp, dtype))

    p = te.compute((n, ph, pw, c), pixel, name="zero_insert")
    return finish_func((x, p), schedule, elementwise_schedule)
