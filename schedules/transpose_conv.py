"""Quantized TRANSPOSE_CONV as one small convolution per output phase, then a pixel shuffle.

Read this first. TFLite's reference TRANSPOSE_CONV scatters: every input pixel
``(iy, ix)`` adds ``(x - zp_in) * w[oc, ky, kx, ic]`` into the int32 output accumulator
at ``(iy * s - pad_top + ky, ix * s - pad_left + kx)``, for every kernel tap that lands
inside the output; then it adds the bias and requantizes each output channel as CONV_2D
does (``MultiplyByQuantizedMultiplier``, double rounding, per-channel multipliers).

Read from the output's side, one axis at a time (rows here; columns alike, with their own
stride and padding): output row ``o`` receives tap ``k`` from input row ``(o + pad - k) / s``
when that is a whole number. So the rows of one *phase* ``c = o mod s`` share their taps:

    r = (c + pad) mod s, m = (c + pad) // s
    taps  k = r + s * j  (j = 0 .. J - 1, every k < kh)
    o = s * q + c reads input row q + m - j with tap r + s * j

which is an ordinary stride-1 convolution over the input with the phase's taps, last
first, as its kernel, ``J - 1 - m`` rows of zero point before the input and as many after
as the phase's output rows need (``AxisPhase``). A stride-(sh, sw) layer is sh * sw such
convolutions (``phases``), each run by ``schedules.conv2d_gemm`` on the target's GEMM with
the requantization in its epilogue, as for any CONV_2D; ``pixel_shuffle_func`` then copies
each phase's pixels to their rows and columns of the output. Every output pixel's int32
sum has exactly the terms of TFLite's scatter (a zero-point row contributes nothing once the
zero point is subtracted; int32 sums do not round, whatever their order), and its
requantization is the layer's own per output channel: the result is TFLite's to the bit.

Three edge cases keep the convolutions plain:
- Where ``J - 1 - m`` is negative (some SAME layers whose output is shorter than input x
  stride: a 3x3 stride-3 one into 3n - 2 rows from n, say), the phase's first output row
  reads input row ``m - J + 1``, not 0: its convolution pads nothing before, and the
  shuffle skips its first ``m - J + 1`` rows (``AxisPhase.skip``).
- Where the convolution gives more rows than the phase has (an ``output_shape`` that
  stops short of the scatter's reach), the shuffle leaves the rest unread.
- A phase no tap reaches (a kernel smaller than the stride: a 1x1 stride-2 layer) is the
  bias alone, requantized once at compile time (``bias_only``).

Cost: the convolutions multiply only taps that land. A 3x3 stride-2 layer does 9 / 4 tap
products per output pixel on average; the stride-1 convolution of a zero-inserted input,
which this replaces, did 9, three quarters of them on zero points.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .window import transpose_conv_padding


@dataclasses.dataclass(frozen=True)
class AxisPhase:
    """Output rows (or columns) ``phase + stride * q`` for ``q < count`` of one axis, as a
    stride-1 convolution over the input: kernel rows ``taps`` in the convolution's order
    (TFLite's kernel rows), the input padded by ``pad_before`` / ``pad_after`` rows of zero
    point, its output ``conv_size`` rows of which row ``skip + q`` is the phase's row q."""

    phase: int
    count: int
    taps: tuple[int, ...]
    pad_before: int
    pad_after: int
    skip: int
    conv_size: int


def axis_phases(in_size: int, out_size: int, kernel: int, stride: int,
                pad: int) -> list[AxisPhase]:
    """The phases of one axis of a TRANSPOSE_CONV (``pad``: TFLite's padding before the
    first output row); a phase with no output row is left out, one with no tap has
    ``taps == ()`` and no convolution (``conv_size`` 0)."""
    phases = []
    for c in range(stride):
        count = (out_size - c + stride - 1) // stride
        if count < 1:
            continue
        r, m = (c + pad) % stride, (c + pad) // stride
        n_taps = max(0, (kernel - r + stride - 1) // stride)
        if n_taps == 0:
            phases.append(AxisPhase(c, count, (), 0, 0, 0, 0))
            continue
        taps = tuple(r + stride * j for j in reversed(range(n_taps)))
        before = n_taps - 1 - m                     # may be negative: skip rows instead
        after = count + n_taps - 1 - before - in_size   # may be negative: rows left unread
        pb, pa = max(before, 0), max(after, 0)
        phases.append(AxisPhase(c, count, taps, pb, pa, max(-before, 0),
                                in_size + pb + pa - n_taps + 1))
    return phases


@dataclasses.dataclass(frozen=True)
class Phase:
    """One output phase of a TRANSPOSE_CONV: its rows and its columns."""

    rows: AxisPhase
    cols: AxisPhase

    @property
    def has_taps(self) -> bool:
        return bool(self.rows.taps and self.cols.taps)

    @property
    def padding(self) -> tuple[int, int, int, int]:
        """The convolution's padding, (top, left, bottom, right)."""
        return (self.rows.pad_before, self.cols.pad_before, self.rows.pad_after,
                self.cols.pad_after)

    @property
    def conv_hw(self) -> tuple[int, int]:
        """The convolution's output height and width."""
        return self.rows.conv_size, self.cols.conv_size

    def weights_hwio(self, w_ohwi: np.ndarray) -> np.ndarray:
        """The convolution's HWIO kernel out of TFLite's [out_c, kh, kw, in_c] weights."""
        taps = w_ohwi[:, list(self.rows.taps)][:, :, list(self.cols.taps)]
        return np.ascontiguousarray(taps.transpose(1, 2, 3, 0))


@dataclasses.dataclass(frozen=True)
class TransposeConvGeometry:
    """A TRANSPOSE_CONV's sizes, strides and TFLite's padding before the output (NHWC)."""

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

    def phases(self) -> list[Phase]:
        """Every output phase, row phase major (the order of ``pixel_shuffle_func``'s
        inputs)."""
        rows = axis_phases(self.in_h, self.out_h, self.kh, self.strides[0], self.pad_top)
        cols = axis_phases(self.in_w, self.out_w, self.kw, self.strides[1], self.pad_left)
        return [Phase(r, c) for r in rows for c in cols]


def phase_accumulators(x: np.ndarray, w_ohwi: np.ndarray, bias, geom: TransposeConvGeometry,
                       zp: int) -> np.ndarray:
    """The layer's int32 accumulators the way the kernels get them: each phase's
    convolution (``reference.conv2d_nhwc``), its rows and columns shuffled into place, and
    the bias alone where no tap lands. The reference for the phase split, held to TFLite's
    scatter (``reference.transpose_conv_nhwc``) in tests/test_transpose_conv.py."""
    from .reference import conv2d_nhwc

    sh, sw = geom.strides
    acc = np.empty((x.shape[0], geom.out_h, geom.out_w, w_ohwi.shape[0]), np.int32)
    for ph in geom.phases():
        r, c = ph.rows, ph.cols
        if ph.has_taps:
            conv = conv2d_nhwc(x, ph.weights_hwio(w_ohwi), bias, in_zp=zp, padding=ph.padding)
            part = conv[:, r.skip:r.skip + r.count, c.skip:c.skip + c.count]
        else:
            part = np.asarray(bias, np.int32)
        acc[:, r.phase::sh, c.phase::sw] = part
    return acc


def bias_only(bias, mult, shift, out_zp: int, act_range) -> np.ndarray:
    """The int8 output of a pixel no tap reaches: the bias requantized per channel (the
    kernels' double rounding, TFLite's CONV_2D requantization)."""
    from .reference import requantize

    return requantize(np.asarray(bias, np.int32)[None], mult, shift, out_zp, *act_range,
                      "int8")[0]


def pixel_shuffle_func(batch: int, phases, out_hw, channels: int, strides,
                       dtype: str = "int8"):
    """The phases' outputs in place, as a PrimFunc ``(p0, p1, ..., c0, c1, ..., out)``:
    one input [batch, *conv_hw, channels] per phase with taps (its convolution's output, in
    ``phases``' order), then one [channels] vector per phase without (``bias_only``), then
    the output [batch, *out_hw, channels]. Per phase, one loop over its rows (parallel)
    and columns copies each pixel's channels in 16-byte vectors and one narrower vector
    for the rest."""
    from tvm.script import tirx as T
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder.tirx import prim_func

    from .int8_ops import LANES

    vectors, rest = divmod(channels, LANES)
    with IRBuilder() as ib:
        with prim_func():
            T.func_name("pixel_shuffle")
            T.func_attr({"tirx.noalias": True})
            convs = [T.arg(f"p{i}", T.buffer((batch, *ph.conv_hw, channels), dtype))
                     for i, ph in enumerate(p for p in phases if p.has_taps)]
            consts = [T.arg(f"c{i}", T.buffer((channels,), dtype))
                      for i, _ in enumerate(p for p in phases if not p.has_taps)]
            out = T.arg("out", T.buffer((batch, *out_hw, channels), dtype))
            sources, fills = iter(convs), iter(consts)
            # one opaque root block around the loops: Relax's analyses of a call_tir's
            # func (its reshape pattern) read the body as a block
            with T.sblock("root"):
                for ph in phases:
                    _shuffle_phase(T, ph, next(sources) if ph.has_taps else next(fills), out,
                                   batch, strides, vectors, rest)
    return ib.get()


def _shuffle_phase(T, ph: Phase, src, out, batch: int, strides, vectors: int, rest: int):
    """The copy of one phase (inside ``pixel_shuffle_func``'s IRBuilder): its rows
    parallel, each pixel's channels in ``vectors`` 16-byte vectors and one of ``rest``."""
    from .int8_ops import LANES

    r, c = ph.rows, ph.cols
    sh, sw = strides
    loop = T.parallel if batch * r.count > 1 else T.serial
    with loop(batch * r.count) as bq:
        b, q = bq // r.count, bq % r.count
        with T.serial(c.count) as p:
            def copy(at):
                value = src[b, r.skip + q, c.skip + p, at] if ph.has_taps else src[at]
                T.buffer_store(out, value, [b, r.phase + sh * q, c.phase + sw * p, at])

            if vectors:
                with T.serial(vectors) as v:
                    with T.vectorized(LANES) as lane:
                        copy(v * LANES + lane)
            if rest:
                with T.vectorized(rest) as lane:
                    copy(vectors * LANES + lane)
