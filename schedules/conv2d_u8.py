"""uint8 conv2d / dense with asymmetric weights (legacy uint8 TFLite models): the row sums.

Read ``conv2d_gemm.py`` first: the GEMM, its packing and its epilogue are the int8 ones
with ``in_dtype="uint8"``. What is new is the weight zero point. TFLite computes, per
output pixel m and output channel n of a group (K = kh * kw * in_c / groups),

    acc = sum_k (a[m, k] - zp_a) * (w[k, n] - zp_w) + bias[n]
        = sum_k a*w  -  zp_w * sum_k a[m, k]  -  zp_a * sum_k (w[k, n] - zp_w)  +  bias[n]
          ---------     -------------------     --------------------------------------
          the GEMM,     per pixel: row_sum,     per channel, a constant of the layer:
          raw u8 x u8   one small PrimFunc      ``gemm_layout.fold_bias(.., w_zp=zp_w)``

(padded pixels hold zp_a, in the GEMM's A and in the row sums alike, so they add nothing).
The GEMM runs raw uint8 x uint8 on the ``gemm_u8u8s32_*`` kernels (ummla at i8mm, udot at
dotprod, umull + uadalp at neon: ``kernels.select(target, "uint8", "uint8")``) and its
epilogue subtracts ``zp_w * row_sum[m, g]`` before the requantization
(``gemm_compute.conv2d_gemm_func(plan, in_dtype="uint8", out_dtype="uint8", w_zp=zp_w)``,
whose last input is ``row_sum``). With zp_w = 0 there is no row sum and no extra input.

Row sums, computed per inference by ``row_sums_func`` (a box sum, not a GEMM):

    channel_sum[b, h, w, g] = sum_{c in group g} data[b, h, w, c]       once per input pixel
    row_sum[m, g] = sum_{ky, kx} channel_sum[b, ih, iw, g]   (in_c/groups * zp_a if padded)

with (b, ih, iw) the input pixel tap (ky, kx) of output pixel m reads. The layout
[batch * out_h * out_w, groups] int32 matches the GEMM output's [M, groups, N/groups].

Integer ranges: the GEMM's int32 sum of raw products is exact while K * 255 * 255 < 2**31
(K <= 33025); the epilogue then adds the terms in the order acc - zp_w * row_sum (=
sum_k a * (w - zp_w)) + folded bias, each partial sum bounded by the same K * 255 * 255
plus the bias, so nothing wraps.
"""

from __future__ import annotations

from .gemm_layout import Conv2DShape

OP = "conv2d_u8"
ACC_DTYPE = "int32"


def row_sums_te(shape: Conv2DShape, *, in_zp: int, in_dtype: str = "uint8"):
    """TE tensors (data, row_sum): data NHWC ``in_dtype``, row_sum [batch * out_h * out_w,
    groups] int32, each output pixel's im2col row summed per group, padding as ``in_zp``.
    Stages, by name: ``channel_sum``, ``row_sum``."""
    from tvm import te, tirx

    s, G, cg = shape, shape.groups, shape.group_in_c
    pt, pl, _, _ = s.padding
    (sh, sw), (dh, dw) = s.strides, s.dilation
    ohw = s.out_h * s.out_w
    data = te.placeholder((s.batch, s.in_h, s.in_w, s.in_c), in_dtype, "data")
    rc = te.reduce_axis((0, cg), "rc")
    channel_sum = te.compute(
        (s.batch, s.in_h, s.in_w, G),
        lambda b, h, w, g: te.sum(data[b, h, w, g * cg + rc].astype(ACC_DTYPE), axis=rc),
        name="channel_sum")
    ry, rx = te.reduce_axis((0, s.kh), "ry"), te.reduce_axis((0, s.kw), "rx")
    padded = tirx.const(cg * in_zp, ACC_DTYPE)  # a padded pixel's channels, all zp_a

    def row(m, g):
        b, oh, ow = m // ohw, (m % ohw) // s.out_w, m % s.out_w
        ih, iw = oh * sh - pt + ry * dh, ow * sw - pl + rx * dw
        inside = tirx.all(ih >= 0, ih < s.in_h, iw >= 0, iw < s.in_w)
        return te.sum(tirx.if_then_else(inside, channel_sum[b, ih, iw, g], padded),
                      axis=[ry, rx])

    row_sum = te.compute((s.gemm_m, G), row, name="row_sum")
    return data, row_sum


def row_sums_func(shape: Conv2DShape, *, in_zp: int, in_dtype: str = "uint8"):
    """The row sums as one TIR PrimFunc ``(data, row_sum)``, unscheduled: the extra input
    of ``gemm_compute.conv2d_gemm_func(plan, w_zp=...)`` for the same shape and input."""
    from tvm import te

    return te.create_prim_func(list(row_sums_te(shape, in_zp=in_zp, in_dtype=in_dtype)))


def schedule_row_sums(func, *, parallel: bool = True):
    """Schedule ``row_sums_func``: channel sums over rows of input pixels, then the window
    sums over output pixels, each in parallel (memory-bound and tiny next to the GEMM).

        for b, h (parallel):  for w, g:  channel_sum = sum over the group's channels
        for m (parallel):     for g:     row_sum = sum over the kh x kw taps (unrolled)
    """
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    channel_sum, row_sum = sch.get_sblock("channel_sum"), sch.get_sblock("row_sum")
    b, h, _, _, _ = sch.get_loops(channel_sum)
    rows = sch.fuse(b, h)
    m, _, ry, rx = sch.get_loops(row_sum)
    if parallel:
        sch.parallel(rows)
        sch.parallel(m)
    sch.unroll(ry)
    sch.unroll(rx)
    return sch.mod["main"]
