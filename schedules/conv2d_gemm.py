"""Quantized NHWC conv2d as a GEMM over packed operands, requantized in the epilogue.

Read this first. A convolution with output pixels M = batch * out_h * out_w,
reduction K = kh * kw * in_c and output channels N is the product of two matrices:

    A[M, K]  the im2col of the input: row m = one output pixel's receptive field,
             in (ky, kx, c) order; padded pixels hold the input zero point
    B[K, N]  the weights, HWIO flattened (symmetric int8: zero point 0)

The micro-kernel (a record of ``tvm_armq.intrinsics.kernels``) multiplies an
``mr x kr`` block of A by a ``kr x nr`` block of B, so both are *packed* so that
each block is contiguous:

    A_packed[M/mr, K/kr, mr, kr]    built per inference (im2col fused with packing)
    B_packed[N/nr, K/kr, nr, kr]    built once, at compile time (``pack_weights``)

M and K are padded up to the block with zeros; zeros in the K padding of both
operands add nothing, and the extra M rows are computed and never stored.

Zero points: TFLite computes sum_k (a - zp_a) * w + bias. With w symmetric this
is sum_k a * w - zp_a * sum_k w + bias, and the last two terms are constants of
the layer: ``fold_bias`` merges them into one int32 vector at compile time, so
the GEMM runs on raw int8 input. Padding with zp_a keeps the identity exact.

Epilogue, per output element (n = output channel):

    out = clamp(qmuls(acc + folded_bias[n], multiplier[n], 31, shift[n]) + zp_out, lo, hi)

with ``lo``/``hi`` the activation range (covers fused ReLU/ReLU6).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Conv2DShape:
    """A quantized NHWC conv2d's geometry (weights HWIO). Padding is (top, left, bottom, right)."""

    batch: int
    in_h: int
    in_w: int
    in_c: int
    out_c: int
    kh: int
    kw: int
    strides: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)

    @property
    def out_h(self) -> int:
        pt, _, pb, _ = self.padding
        return (self.in_h + pt + pb - self.dilation[0] * (self.kh - 1) - 1) // self.strides[0] + 1

    @property
    def out_w(self) -> int:
        _, pl, _, pr = self.padding
        return (self.in_w + pl + pr - self.dilation[1] * (self.kw - 1) - 1) // self.strides[1] + 1

    @property
    def gemm_m(self) -> int:
        return self.batch * self.out_h * self.out_w

    @property
    def gemm_k(self) -> int:
        return self.kh * self.kw * self.in_c

    @property
    def is_pointwise(self) -> bool:
        """1x1, stride 1, no padding: A is the input itself, no im2col needed."""
        return (self.kh, self.kw, self.strides, self.padding) == (1, 1, (1, 1), (0, 0, 0, 0))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def pack_weights(weight_hwio: np.ndarray, mr_nr_kr) -> np.ndarray:
    """HWIO weights -> B_packed[N/nr, K/kr, nr, kr] (zero padded). Runs once, at compile time."""
    _, nr, kr = mr_nr_kr
    kh, kw, c, n = weight_hwio.shape
    k = kh * kw * c
    b = np.zeros((_ceil_div(n, nr) * nr, _ceil_div(k, kr) * kr), weight_hwio.dtype)
    b[:n, :k] = weight_hwio.reshape(k, n).T
    return np.ascontiguousarray(
        b.reshape(-1, nr, b.shape[1] // kr, kr).transpose(0, 2, 1, 3))


def fold_bias(weight_hwio: np.ndarray, bias: np.ndarray, in_zp: int) -> np.ndarray:
    """bias - zp_a * sum_k W[k, n]: the layer's constant terms, one int32 per output channel."""
    wsum = weight_hwio.astype(np.int64).reshape(-1, weight_hwio.shape[-1]).sum(axis=0)
    folded = np.asarray(bias, np.int64) - in_zp * wsum
    assert np.abs(folded).max(initial=0) < 2 ** 31
    return folded.astype(np.int32)


def conv2d_gemm_te(shape: Conv2DShape, mr_nr_kr, *, in_dtype="int8", out_dtype="int8",
                   in_zp: int, out_zp: int, act_range: tuple[int, int]):
    """TE tensors of the conv2d GEMM: (inputs..., output) for ``te.create_prim_func``.

    Inputs: data NHWC, B_packed, folded bias [N], multiplier [N], shift [N]. Output: the
    NHWC result as [batch * out_h * out_w, out_c] (a reshape away from NHWC, no copy).
    Stages, by name: ``A_packed`` (im2col + pack), ``gemm`` (int32 blocks), ``output``.
    """
    from tvm import te, tirx

    from tvm_armq.intrinsics.qmuls import qmuls

    mr, nr, kr = mr_nr_kr
    s = shape
    m_total, k_total, n_total = s.gemm_m, s.gemm_k, s.out_c
    mb, kb, nb = _ceil_div(m_total, mr), _ceil_div(k_total, kr), _ceil_div(n_total, nr)
    pt, pl, _, _ = s.padding
    (sh, sw), (dh, dw) = s.strides, s.dilation
    ohw = s.out_h * s.out_w

    data = te.placeholder((s.batch, s.in_h, s.in_w, s.in_c), in_dtype, "data")
    b_packed = te.placeholder((nb, kb, nr, kr), in_dtype, "B_packed")
    bias = te.placeholder((n_total,), "int32", "bias_folded")
    mult = te.placeholder((n_total,), "int32", "multiplier")
    shift = te.placeholder((n_total,), "int32", "shift")

    def a_element(bm, bk, i, j):
        m, k = bm * mr + i, bk * kr + j
        b, oh, ow = m // ohw, (m % ohw) // s.out_w, m % s.out_w
        ky, kx, c = k // (s.kw * s.in_c), (k // s.in_c) % s.kw, k % s.in_c
        ih, iw = oh * sh - pt + ky * dh, ow * sw - pl + kx * dw
        inside = tirx.all(ih >= 0, ih < s.in_h, iw >= 0, iw < s.in_w)
        pixel = tirx.if_then_else(inside, data[b, ih, iw, c], tirx.const(in_zp, in_dtype))
        return tirx.if_then_else(tirx.all(m < m_total, k < k_total), pixel,
                                 tirx.const(0, in_dtype))

    a_packed = te.compute((mb, kb, mr, kr), a_element, name="A_packed")
    rb, rk = te.reduce_axis((0, kb), "kb"), te.reduce_axis((0, kr), "kk")
    acc = te.compute(
        (mb, nb, mr, nr),
        lambda bm, bn, i, j: te.sum(a_packed[bm, rb, i, rk].astype("int32")
                                    * b_packed[bn, rb, j, rk].astype("int32"), axis=[rb, rk]),
        name="gemm")

    lo, hi = act_range

    def out_element(m, n):
        x = acc[m // mr, n // nr, m % mr, n % nr] + bias[n]
        r = qmuls(x, mult[n].asobject(), 31, shift[n].asobject()) + out_zp
        return tirx.max(tirx.min(r, hi), lo).astype(out_dtype)

    # NHWC output viewed as [batch * out_h * out_w, out_c]: the same bytes, and a flat
    # pixel index keeps the tile arithmetic (m // mr, m % mr) simple for the scheduler.
    out = te.compute((m_total, n_total), out_element, name="output")
    return data, b_packed, bias, mult, shift, out


def conv2d_gemm_func(shape: Conv2DShape, mr_nr_kr, **quant):
    """The conv2d as one TIR PrimFunc, unscheduled (stages as in ``conv2d_gemm_te``)."""
    from tvm import te

    return te.create_prim_func(list(conv2d_gemm_te(shape, mr_nr_kr, **quant)))


def schedule_conv2d_gemm(func, mr_nr_kr, *, intrin: str | None = None, parallel: bool = True):
    """Schedule ``conv2d_gemm_func``: GEMM tiles computed where the epilogue consumes them.

    Loop nest of the result, for each (mr x nr) output tile (mo, no):

        for mo in M/mr (parallel):            A_packed is built up front, rows in parallel
          for no in N/nr:
            acc[mr, nr] = 0                   a local tile: no int32 tensor in memory
            for kb in K/kr:
              acc += A_packed[mo, kb] . B_packed[no, kb]^T     <- ``intrin`` (micro-kernel)
            for mi, ni: output[m, n] = epilogue(acc[mi, ni])

    ``intrin`` names a registered TensorIntrin whose desc is one (mr, nr, kr) block
    update; None keeps the scalar loops (the reference path).
    """
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    out, gemm, a_packed = (sch.get_sblock(n) for n in ("output", "gemm", "A_packed"))

    # The GEMM's own loops are (mo, no, i, j, kb, kk): put the K blocks outside the
    # micro-tile, then bring the epilogue into each tile. The accumulator's live range
    # shrinks to one (mr x nr) tile, which ``local`` scope keeps out of memory.
    mo, no, i, j, kb, kk = sch.get_loops(gemm)
    sch.reorder(kb, i, j, kk)
    sch.reverse_compute_at(out, no)
    sch.set_scope(gemm, 0, "local")
    if parallel:  # before the reduction is split in init + update, which parallel rejects
        sch.parallel(mo)
        sch.parallel(sch.get_loops(a_packed)[0])
    sch.decompose_reduction(gemm, kb)
    if intrin is not None:
        sch.tensorize(i, intrin)
    return sch.mod["main"]
