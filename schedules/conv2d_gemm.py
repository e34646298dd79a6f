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

Groups: a grouped convolution is ``groups`` independent GEMMs, each over its own
slice of input channels (K = kh * kw * in_c / groups) and output channels
(N = out_c / groups); every packed operand gets a leading group axis.

Epilogue, per output element (n = output channel):

    out = clamp(qmuls(acc + folded_bias[n], multiplier[n], 31, shift[n]) + zp_out, lo, hi)

with ``lo``/``hi`` the activation range (covers fused ReLU/ReLU6).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .window import Window2D

NEON_INT32_LANES = 4  # int32 lanes of one 128-bit NEON register


@dataclasses.dataclass(frozen=True)
class Conv2DShape(Window2D):
    """A quantized NHWC conv2d's geometry (weights HWIO with in_c / groups input channels).

    Padding is (top, left, bottom, right). A dense layer is the 1x1 case on a 1x1 image:
    ``Conv2DShape.dense(rows, k, n)``.
    """

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
    groups: int = 1

    def __post_init__(self):
        if self.in_c % self.groups or self.out_c % self.groups:
            raise ValueError(f"conv2d: {self.groups} groups do not divide in_c={self.in_c} "
                             f"and out_c={self.out_c}")
        if self.out_h < 1 or self.out_w < 1:
            raise ValueError(f"conv2d: {self} has an empty output")

    @classmethod
    def dense(cls, rows: int, k: int, n: int) -> "Conv2DShape":
        """A fully connected layer (batch matmul rows x k times k x n) as a 1x1 convolution."""
        return cls(rows, 1, 1, k, n, 1, 1)

    @property
    def gemm_m(self) -> int:
        return self.batch * self.out_h * self.out_w

    @property
    def group_in_c(self) -> int:
        return self.in_c // self.groups

    @property
    def gemm_k(self) -> int:
        """K of one group's GEMM."""
        return self.kh * self.kw * self.group_in_c

    @property
    def gemm_n(self) -> int:
        """N of one group's GEMM."""
        return self.out_c // self.groups

    @property
    def is_pointwise(self) -> bool:
        """1x1, stride 1, no padding: A is the input itself, no im2col gather needed."""
        return (self.kh, self.kw, self.strides, self.padding) == (1, 1, (1, 1), (0, 0, 0, 0))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def pack_weights(weight_hwio: np.ndarray, mr_nr_kr, groups: int = 1) -> np.ndarray:
    """HWIO weights -> B_packed[groups, N/nr, K/kr, nr, kr], zero padded.

    Runs once, at compile time (the weights are constants of the model).
    """
    _, nr, kr = mr_nr_kr
    kh, kw, cg, n = weight_hwio.shape
    k, ng = kh * kw * cg, n // groups
    b = np.zeros((groups, _ceil_div(ng, nr) * nr, _ceil_div(k, kr) * kr), weight_hwio.dtype)
    for g in range(groups):
        b[g, :ng, :k] = weight_hwio[..., g * ng:(g + 1) * ng].reshape(k, ng).T
    return np.ascontiguousarray(
        b.reshape(groups, -1, nr, b.shape[2] // kr, kr).transpose(0, 1, 3, 2, 4))


def fold_bias(weight_hwio: np.ndarray, bias: np.ndarray, in_zp: int) -> np.ndarray:
    """bias - zp_a * sum_k W[k, n]: the layer's constant terms, one int32 per output channel."""
    wsum = weight_hwio.astype(np.int64).reshape(-1, weight_hwio.shape[-1]).sum(axis=0)
    folded = np.asarray(bias, np.int64) - in_zp * wsum
    assert np.abs(folded).max(initial=0) < 2 ** 31
    return folded.astype(np.int32)


def conv2d_gemm_te(shape: Conv2DShape, mr_nr_kr, *, in_dtype="int8", out_dtype="int8",
                   in_zp: int, out_zp: int, act_range: tuple[int, int]):
    """TE tensors of the conv2d GEMM: (inputs..., output) for ``te.create_prim_func``.

    Inputs: data NHWC, B_packed (``pack_weights``), folded bias [out_c], multiplier
    [out_c], shift [out_c]. Output: the NHWC result viewed as
    [batch * out_h * out_w, groups, out_c / groups] (same bytes; the flat pixel index
    keeps the tile arithmetic m // mr, m % mr simple for the scheduler).
    Stages, by name: ``A_packed`` (im2col + pack), ``gemm`` (int32 blocks), ``output``.
    """
    from tvm import te, tirx

    from tvm_armq.intrinsics.qmuls import qmuls

    mr, nr, kr = mr_nr_kr
    s, G = shape, shape.groups
    m_total, k_total, n_group = s.gemm_m, s.gemm_k, s.gemm_n
    mb, kb, nb = _ceil_div(m_total, mr), _ceil_div(k_total, kr), _ceil_div(n_group, nr)
    pt, pl, _, _ = s.padding
    (sh, sw), (dh, dw) = s.strides, s.dilation
    ohw, cg = s.out_h * s.out_w, s.group_in_c

    data = te.placeholder((s.batch, s.in_h, s.in_w, s.in_c), in_dtype, "data")
    b_packed = te.placeholder((G, nb, kb, nr, kr), in_dtype, "B_packed")
    bias = te.placeholder((s.out_c,), "int32", "bias_folded")
    mult = te.placeholder((s.out_c,), "int32", "multiplier")
    shift = te.placeholder((s.out_c,), "int32", "shift")
    zero = tirx.const(0, in_dtype)

    def a_element(g, bm, bk, i, j):
        m, k = bm * mr + i, bk * kr + j
        in_range = tirx.all(m < m_total, k < k_total)
        if s.is_pointwise:  # the pixel is the output pixel: a plain interleaving copy
            return tirx.if_then_else(in_range, data[m // ohw, (m % ohw) // s.out_w,
                                                    m % s.out_w, g * cg + k], zero)
        b, oh, ow = m // ohw, (m % ohw) // s.out_w, m % s.out_w
        ky, kx, c = k // (s.kw * cg), (k // cg) % s.kw, k % cg
        ih, iw = oh * sh - pt + ky * dh, ow * sw - pl + kx * dw
        inside = tirx.all(ih >= 0, ih < s.in_h, iw >= 0, iw < s.in_w)
        pixel = tirx.if_then_else(inside, data[b, ih, iw, g * cg + c],
                                  tirx.const(in_zp, in_dtype))
        return tirx.if_then_else(in_range, pixel, zero)

    a_packed = te.compute((G, mb, kb, mr, kr), a_element, name="A_packed")
    rb, rk = te.reduce_axis((0, kb), "kb"), te.reduce_axis((0, kr), "kk")
    acc = te.compute(
        (G, mb, nb, mr, nr),
        lambda g, bm, bn, i, j: te.sum(a_packed[g, bm, rb, i, rk].astype("int32")
                                       * b_packed[g, bn, rb, j, rk].astype("int32"),
                                       axis=[rb, rk]),
        name="gemm")
    lo, hi = act_range

    def out_element(m, g, n):
        c = g * n_group + n
        x = acc[g, m // mr, n // nr, m % mr, n % nr] + bias[c]
        r = qmuls(x, mult[c].asobject(), 31, shift[c].asobject()) + out_zp
        return tirx.max(tirx.min(r, hi), lo).astype(out_dtype)

    out = te.compute((m_total, G, n_group), out_element, name="output")
    return data, b_packed, bias, mult, shift, out


def conv2d_gemm_func(shape: Conv2DShape, mr_nr_kr, **quant):
    """The conv2d as one TIR PrimFunc, unscheduled (stages as in ``conv2d_gemm_te``)."""
    from tvm import te

    return te.create_prim_func(list(conv2d_gemm_te(shape, mr_nr_kr, **quant)))


@dataclasses.dataclass(frozen=True)
class GemmKnobs:
    """Tunable choices of ``schedule_conv2d_gemm`` (the autotuner's design space).

    ``m_tiles`` x ``n_tiles`` micro-tiles form one macro tile, whose accumulators stay live
    across the whole K loop (more tiles: more reuse of each loaded A and B block, more
    registers); ``k_unroll`` unrolls that many K blocks; ``parallel`` runs macro-tile rows
    on threads; ``vector_epilogue`` vectorizes the requantization over ``epilogue_lanes``
    output channels.
    """

    m_tiles: int = 1
    n_tiles: int = 1
    k_unroll: int = 1
    parallel: bool = True
    vector_epilogue: bool = True
    epilogue_lanes: int = NEON_INT32_LANES


def schedule_conv2d_gemm(func, kernel, target=None, knobs: GemmKnobs = GemmKnobs()):
    """Schedule ``conv2d_gemm_func``: GEMM tiles computed where the epilogue consumes them.

    Loop nest of the result, per group g and macro tile (mo, no) of
    (m_tiles * mr) x (n_tiles * nr) outputs:

        for mo (parallel):                    A_packed is built up front, rows in parallel
          for no:
            acc[m_tiles, n_tiles, mr, nr] = 0      one macro tile, never a layer-sized tensor
            for kb in K/kr (unrolled by k_unroll):
              for ti < m_tiles, tj < n_tiles (unrolled):
                acc[ti, tj] += A_packed[mo, ti, kb] . B_packed[no, tj, kb]^T   <- micro-kernel
            for each output of the tile: output = epilogue(acc)   (vectorized over nr)

    ``kernel`` is a record of ``tvm_armq.intrinsics.kernels`` whose (mr, nr, kr) the func
    was built with; a reference kernel keeps scalar loops, any other is tensorized for
    ``target`` (``MissingTargetFeature`` if the target lacks its instruction).
    """
    from tvm import s_tir

    from tvm_armq.intrinsics import kernels

    sch = s_tir.Schedule(func)
    out, gemm, a_packed = (sch.get_sblock(n) for n in ("output", "gemm", "A_packed"))

    g, mo, no, i, j, kb, kk = sch.get_loops(gemm)
    # Knobs must divide the block counts: a ragged split puts a predicate on the block,
    # which the micro-kernel's pattern does not match. Each is cut to the largest
    # divisor not above it (the autotuner samples perfect tiles in the first place).
    m_tiles, n_tiles, k_unroll = (_largest_divisor(sch.get(loop).extent.value, want)
                                  for loop, want in ((mo, knobs.m_tiles), (no, knobs.n_tiles),
                                                     (kb, knobs.k_unroll)))
    mo, ti = sch.split(mo, [None, m_tiles])
    no, tj = sch.split(no, [None, n_tiles])
    kb_o, kb_i = sch.split(kb, [None, k_unroll])
    sch.reorder(mo, no, kb_o, kb_i, ti, tj, i, j, kk)
    # The epilogue of a macro tile runs right after its K loop, so its accumulators are
    # dead afterwards and buffer compaction shrinks them to one macro tile.
    sch.reverse_compute_at(out, no)
    if kernel.intrin is None:
        sch.set_scope(gemm, 0, "local")  # the scalar tile can live in registers outright
    if knobs.parallel:  # before the reduction is split in init + update (parallel rejects it)
        sch.parallel(mo)
        sch.parallel(sch.get_loops(a_packed)[1])
    sch.decompose_reduction(gemm, kb_o)
    for loop, factor in ((kb_i, k_unroll), (ti, m_tiles), (tj, n_tiles)):
        if factor > 1:
            sch.unroll(loop)
    own = _loops_below(sch, out, no)  # the epilogue's own loops inside the macro tile
    if knobs.vector_epilogue and own and sch.get(own[-1]).extent.value > 1:
        # One int32 NEON register of channels at a time. Within a micro-tile row the
        # accumulators are contiguous; a vector wider than nr gathers across tiles, which
        # still beats half-empty registers when nr = 2 (mmla).
        lanes = _largest_divisor(sch.get(own[-1]).extent.value, knobs.epilogue_lanes)
        _, inner = sch.split(own[-1], [None, lanes])
        sch.vectorize(inner)
    if kernel.intrin is not None:
        # The micro-kernels take C as a plain (global-scope) window; the compacted
        # tile is a few dozen bytes on the stack, which LLVM keeps in registers.
        kernels.tensorize(sch, i, kernel, target)
    return sch.mod["main"]


def _loops_below(sch, block, loop) -> list:
    """The loops around ``block`` that are nested inside ``loop``."""
    loops = sch.get_loops(block)
    anchor = sch.get(loop)
    for idx, rv in enumerate(loops):
        if sch.get(rv).same_as(anchor):
            return loops[idx + 1:]
    raise ValueError("block is not under the given loop")


def _largest_divisor(extent: int, want: int) -> int:
    return max(d for d in range(1, max(1, min(want, extent)) + 1) if extent % d == 0)
